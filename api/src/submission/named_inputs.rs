//! The check of a data set of named inputs, for uploaded models: tensors `x.NAME` (each [N, ...], any of
//! the dtypes a model may take: floats, integers, booleans for masks), labels `y` that are class indices
//! (integers, [N]) or values (floats, [N] or [N, M], finite), and optionally the same of `x_test.NAME` and
//! `y_test`, shaped like the training ones.

use ringtrain_core::FieldError;
use ringtrain_store::DatasetInput;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::routes::datasets::{Contents, MAX_CLASSES};

/// Whether an upload is a data set of named inputs (it has `x.NAME` tensors and no plain `x`).
pub fn is_named(tensors: &SafeTensors) -> bool {
    tensors.tensor("x").is_err() && tensors.names().iter().any(|n| n.starts_with("x."))
}

/// The dtypes an input may have.
const INPUT_DTYPES: &[Dtype] = &[
    Dtype::F32,
    Dtype::F64,
    Dtype::F16,
    Dtype::BF16,
    Dtype::I64,
    Dtype::I32,
    Dtype::I16,
    Dtype::I8,
    Dtype::U8,
    Dtype::BOOL,
];

/// Checks every named input and the labels of both splits; every problem is reported, each at its tensor.
pub fn check_named(tensors: &SafeTensors) -> Result<Contents, Vec<FieldError>> {
    let mut errors = Vec::new();
    let mut names: Vec<String> =
        tensors.names().iter().filter_map(|n| n.strip_prefix("x.").map(str::to_string)).collect();
    names.sort();
    let train_labels = labels(tensors, "y", &mut errors);
    let n = train_labels.as_ref().map(|l| l.samples);
    let mut inputs = Vec::new();
    for name in &names {
        if let Some(input) = input(tensors, &format!("x.{name}"), name, n, &mut errors) {
            inputs.push(input);
        }
    }
    for name in tensors.names() {
        let stray = name.starts_with("x_test.") && !names.iter().any(|n| format!("x_test.{n}") == *name);
        if stray {
            errors.push(FieldError::new(name, "a test input without its training input x.NAME"));
        }
    }
    let test = match tensors.tensor("y_test") {
        Err(_) => None,
        Ok(_) => {
            let test_labels = labels(tensors, "y_test", &mut errors);
            let m = test_labels.as_ref().map(|l| l.samples);
            for train in &inputs {
                let key = format!("x_test.{}", train.name);
                match input(tensors, &key, &train.name, m, &mut errors) {
                    Some(test) if test.shape != train.shape || test.dtype != train.dtype => {
                        errors.push(FieldError::new(
                            key,
                            format!(
                                "samples of {} {:?} where x.{}'s are {} {:?}",
                                test.dtype, test.shape, train.name, train.dtype, train.shape
                            ),
                        ))
                    }
                    Some(_) => {}
                    None if tensors.tensor(&key).is_err() => errors
                        .push(FieldError::new(key, "missing: y_test is given, so every input needs its test split")),
                    None => {}
                }
            }
            test_labels
        }
    };
    let (Some(train), true) = (train_labels, errors.is_empty()) else { return Err(errors) };
    if let Some(test) = &test {
        if test.values != train.values || test.width != train.width {
            errors.push(FieldError::new("y_test", "must be labels of the same kind and width as y"));
            return Err(errors);
        }
    }
    let samples = match &test {
        Some(_) => train.samples,
        None => {
            let held_out = ringtrain_core::dataset::held_out_test_samples(train.samples.max(0) as u64) as i64;
            if train.samples <= held_out {
                errors.push(FieldError::new("y", "too few samples to hold out a test split (give y_test)"));
                return Err(errors);
            }
            train.samples - held_out
        }
    };
    let max_label = test.as_ref().map_or(train.max_label, |t| t.max_label.max(train.max_label));
    Ok(Contents {
        samples,
        sample_shape: inputs.first().map(|i| i.shape.clone()).unwrap_or_default(),
        num_classes: if train.values { 0 } else { (max_label + 1) as i32 },
        labels: if train.values { "values" } else { "classes" }.to_string(),
        inputs,
    })
}

/// One input tensor `key` with `n` samples (when the labels' count is known).
fn input(
    tensors: &SafeTensors,
    key: &str,
    name: &str,
    n: Option<i64>,
    errors: &mut Vec<FieldError>,
) -> Option<DatasetInput> {
    let t = tensors.tensor(key).ok()?;
    let before = errors.len();
    if name.is_empty() || name.len() > 100 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        errors.push(FieldError::new(key, "input names are 1 to 100 letters, digits or underscores"));
    }
    if !INPUT_DTYPES.contains(&t.dtype()) {
        errors.push(FieldError::new(
            key,
            format!("dtype {:?} is not one a model takes (floats, integers, BOOL)", t.dtype()),
        ));
    }
    if t.shape().is_empty() {
        errors.push(FieldError::new(key, "must be [N, ...] (got a scalar)"));
    } else if let Some(n) = n.filter(|&n| n != t.shape()[0] as i64) {
        errors.push(FieldError::new(key, format!("has {} samples where the labels have {n}", t.shape()[0])));
    }
    (errors.len() == before).then(|| DatasetInput {
        name: name.to_string(),
        dtype: format!("{:?}", t.dtype()),
        shape: t.shape()[1..].iter().map(|&d| d as i64).collect(),
    })
}

/// What a labels tensor holds.
struct LabelContents {
    samples: i64,
    values: bool,
    /// Values per sample (1 for classes and [N] values).
    width: i64,
    max_label: i64,
}

fn labels(tensors: &SafeTensors, key: &str, errors: &mut Vec<FieldError>) -> Option<LabelContents> {
    let Ok(y) = tensors.tensor(key) else {
        errors.push(FieldError::new(key, "missing: the labels tensor"));
        return None;
    };
    let shape = y.shape();
    let samples = shape.first().copied().unwrap_or(0) as i64;
    match y.dtype() {
        Dtype::F32 | Dtype::F64 => {
            if !(1..=2).contains(&shape.len()) || samples == 0 {
                errors.push(FieldError::new(key, format!("values must be [N] or [N, M] with N >= 1 (got {shape:?})")));
                return None;
            }
            if let Some(i) = first_non_finite(&y) {
                errors.push(FieldError::new(key, format!("value at flat index {i} is not finite")));
                return None;
            }
            Some(LabelContents {
                samples,
                values: true,
                width: shape.get(1).copied().unwrap_or(1) as i64,
                max_label: 0,
            })
        }
        Dtype::I64 | Dtype::I32 | Dtype::U8 => {
            if shape.len() != 1 || samples == 0 {
                errors.push(FieldError::new(key, format!("class labels must be [N] with N >= 1 (got {shape:?})")));
                return None;
            }
            let labels = integers(&y);
            if let Some((i, bad)) = labels.iter().enumerate().find(|(_, l)| !(0..MAX_CLASSES).contains(*l)) {
                errors.push(FieldError::new(key, format!("label {bad} at index {i} is outside 0..{MAX_CLASSES}")));
                return None;
            }
            let max_label = labels.iter().copied().max().unwrap_or(0);
            Some(LabelContents { samples, values: false, width: 1, max_label })
        }
        other => {
            errors.push(FieldError::new(
                key,
                format!("dtype must be I64, I32 or U8 (classes) or F32, F64 (values) (got {other:?})"),
            ));
            None
        }
    }
}

fn integers(y: &TensorView) -> Vec<i64> {
    match y.dtype() {
        Dtype::I64 => y.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect(),
        Dtype::I32 => {
            y.data().chunks_exact(4).map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap_or([0; 4])))).collect()
        }
        _ => y.data().iter().map(|&b| i64::from(b)).collect(),
    }
}

fn first_non_finite(y: &TensorView) -> Option<usize> {
    match y.dtype() {
        Dtype::F64 => {
            y.data().chunks_exact(8).position(|c| !f64::from_le_bytes(c.try_into().unwrap_or([0; 8])).is_finite())
        }
        _ => y.data().chunks_exact(4).position(|c| !f32::from_le_bytes(c.try_into().unwrap_or([0; 4])).is_finite()),
    }
}

#[cfg(test)]
mod tests {
    use safetensors::tensor::{Dtype, TensorView};

    use crate::routes::datasets::check_safetensors;

    /// A file of `tensors`, each (name, dtype, shape, little-endian bytes).
    fn file(tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
        let views: Vec<(&str, TensorView)> =
            tensors.iter().map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap())).collect();
        safetensors::serialize(views, &None).unwrap()
    }

    fn f32s(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn i64s(values: &[i64]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn errors(bytes: &[u8]) -> Vec<(String, String)> {
        check_safetensors(bytes).unwrap_err().into_iter().map(|e| (e.path.clone(), e.reason.clone())).collect()
    }

    #[test]
    fn named_inputs_with_class_or_value_labels_are_listed() {
        let ok = file(&[
            ("x.tokens", Dtype::I64, vec![4, 3], i64s(&[1; 12])),
            ("x.mask", Dtype::BOOL, vec![4, 3], vec![1; 12]),
            ("y", Dtype::I64, vec![4], i64s(&[0, 2, 1, 2])),
            ("x_test.tokens", Dtype::I64, vec![2, 3], i64s(&[1; 6])),
            ("x_test.mask", Dtype::BOOL, vec![2, 3], vec![0; 6]),
            ("y_test", Dtype::I64, vec![2], i64s(&[0, 1])),
        ]);
        let contents = check_safetensors(&ok).unwrap();
        let names: Vec<&str> = contents.inputs.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(
            (names, contents.labels.as_str(), contents.num_classes, contents.samples),
            (vec!["mask", "tokens"], "classes", 3, 4)
        );
        assert_eq!((contents.inputs[0].dtype.as_str(), contents.inputs[0].shape.as_slice()), ("BOOL", &[3][..]));

        let values = file(&[
            ("x.v", Dtype::F32, vec![20, 2], f32s(&[0.5; 40])),
            ("y", Dtype::F32, vec![20, 3], f32s(&[1.0; 60])),
        ]);
        let contents = check_safetensors(&values).unwrap();
        assert_eq!((contents.labels.as_str(), contents.num_classes, contents.samples), ("values", 0, 18));
    }

    #[test]
    fn every_problem_of_a_named_upload_is_reported_at_its_tensor() {
        let bad = file(&[
            ("x.a", Dtype::F32, vec![3, 2], f32s(&[0.0; 6])),
            ("x.b c", Dtype::F32, vec![4], f32s(&[0.0; 4])),
            ("x.c", Dtype::F32, vec![4, 1], f32s(&[0.0; 4])),
            ("y", Dtype::I64, vec![4], i64s(&[0, 1, 1, 0])),
            ("x_test.a", Dtype::F32, vec![2, 3], f32s(&[0.0; 6])),
            ("x_test.z", Dtype::F32, vec![2, 3], f32s(&[0.0; 6])),
            ("y_test", Dtype::I64, vec![2], i64s(&[0, 1])),
        ]);
        let found = errors(&bad);
        for (path, reason) in [
            ("x.a", "has 3 samples where the labels have 4"),
            ("x.b c", "letters, digits or underscores"),
            ("x_test.z", "without its training input"),
            ("x_test.c", "missing"),
        ] {
            assert!(found.iter().any(|(p, r)| p == path && r.contains(reason)), "{path}: {found:?}");
        }
        let not_finite = file(&[
            ("x.a", Dtype::F32, vec![4, 1], f32s(&[0.0; 4])),
            ("y", Dtype::F32, vec![4], f32s(&[0.0, f32::NAN, 1.0, 2.0])),
        ]);
        assert_eq!(errors(&not_finite), vec![("y".to_string(), "value at flat index 1 is not finite".to_string())]);
        let shape = file(&[
            ("x.a", Dtype::F32, vec![4, 2], f32s(&[0.0; 8])),
            ("y", Dtype::I64, vec![4], i64s(&[0, 1, 1, 0])),
            ("x_test.a", Dtype::F32, vec![2, 3], f32s(&[0.0; 6])),
            ("y_test", Dtype::I64, vec![2], i64s(&[0, 1])),
        ]);
        assert!(errors(&shape)[0].1.contains("samples of F32 [3] where x.a's are F32 [2]"), "{:?}", errors(&shape));
    }
}
