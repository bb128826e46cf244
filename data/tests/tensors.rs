//! Shards of named tensors: a safetensors data set (an upload's layout) packed by `pack_tensors` and read
//! back by the loader holds every training sample exactly once, each row as it was; value labels become
//! f32; a file that cannot be packed is refused saying why, and a member that lies fails the read naming
//! its shard and sample.

use std::path::Path;
use std::sync::Arc;

use ringtrain_data::index::{DatasetIndex, SampleKind};
use ringtrain_data::loader::{Batches, CropMode, SplitReader, Transform};
use ringtrain_data::npy::Dtype;
use ringtrain_data::pack::PackOptions;
use ringtrain_data::pack_tensors::pack_tensors;
use ringtrain_data::safetensors::Named;
use ringtrain_data::shard::Layout;

/// One tensor of a safetensors file: name, dtype, shape, little-endian bytes.
type Stored<'a> = (&'a str, &'a str, Vec<u64>, Vec<u8>);

/// Writes a safetensors file of `tensors`.
fn write_safetensors(path: &Path, tensors: &[Stored]) {
    let named: Vec<Named> =
        tensors.iter().map(|(name, dtype, shape, bytes)| Named { name, dtype, shape, bytes }).collect();
    ringtrain_data::safetensors::write(path, &named).unwrap();
}

fn f32s(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(f32::to_le_bytes).collect()
}

fn i64s(values: impl IntoIterator<Item = i64>) -> Vec<u8> {
    values.into_iter().flat_map(i64::to_le_bytes).collect()
}

/// 50 samples whose rows say which they are: `a` [i, i + 0.5, -i] (f32), `b` [10i, 10i + 1] (i64), class i % 3.
fn numbered(path: &Path, labels: (&str, Vec<u64>, Vec<u8>)) {
    let n = 50u64;
    let a = f32s((0..n).flat_map(|i| [i as f32, i as f32 + 0.5, -(i as f32)]));
    let b = i64s((0..n as i64).flat_map(|i| [10 * i, 10 * i + 1]));
    let (y_dtype, y_shape, y) = labels;
    write_safetensors(
        path,
        &[("x.b", "I64", vec![n, 2], b), ("x.a", "F32", vec![n, 3], a), ("y", y_dtype, y_shape, y)],
    );
}

fn index(out: &Path) -> DatasetIndex {
    DatasetIndex::from_json(&std::fs::read_to_string(out.join("index.json")).unwrap()).unwrap()
}

/// Every sample of `split`, read through the loader on 2 threads in batches of 7.
fn read_all(out: &Path, index: &DatasetIndex, train: bool) -> Vec<ringtrain_data::loader::Batch> {
    let split = if train { index.train.clone() } else { index.test.clone().unwrap() };
    let ids: Vec<u64> = (0..split.samples).collect();
    let plan: Vec<Vec<u64>> = ids.chunks(7).map(<[u64]>::to_vec).collect();
    let reader = Arc::new(SplitReader::new(out.to_path_buf(), split, Layout::of(index), 4));
    let transform = Transform { size: 0, crop: CropMode::Whole, seed: 0, epoch: 0 };
    let mut batches = Batches::start(reader, plan, transform, 2, 2);
    std::iter::from_fn(|| batches.next_batch()).map(Result::unwrap).collect()
}

#[test]
fn a_safetensors_data_set_packs_into_shards_that_give_back_every_row_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.safetensors");
    numbered(&file, ("I64", vec![50], i64s((0..50).map(|i| i % 3))));
    let out = dir.path().join("shards");
    let options = PackOptions { shard_bytes: 4096, ..Default::default() };
    let report = pack_tensors(&file, &out, &options).unwrap();
    // no test split in the file: the last tenth is held out, as the worker does for an upload
    assert_eq!((report.train_samples, report.test_samples, report.classes), (45, 5, 3));
    assert!(report.train_shards > 3, "{} shards", report.train_shards);
    let index = index(&out);
    assert_eq!(index.kind, SampleKind::Tensors);
    assert_eq!(index.classes, ["0", "1", "2"]);
    let names: Vec<(&str, Dtype, &[u64])> =
        index.inputs.iter().map(|i| (i.name.as_str(), i.dtype, i.shape.as_slice())).collect();
    assert_eq!(names, [("a", Dtype::F32, &[3][..]), ("b", Dtype::I64, &[2][..])]);

    for (train, expected) in [(true, (0..45).collect::<Vec<i64>>()), (false, (45..50).collect())] {
        let mut seen = Vec::new();
        for batch in read_all(&out, &index, train) {
            assert_eq!(batch.parts.len(), 2);
            let a: Vec<f32> =
                batch.parts[0].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
            let b: Vec<i64> =
                batch.parts[1].chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect();
            for (s, class) in batch.labels.iter().enumerate() {
                let i = a[3 * s] as i64;
                assert_eq!(&a[3 * s..3 * s + 3], [i as f32, i as f32 + 0.5, -(i as f32)]);
                assert_eq!(&b[2 * s..2 * s + 2], [10 * i, 10 * i + 1]);
                assert_eq!(*class, i % 3);
                seen.push(i);
            }
        }
        assert_ne!(seen, expected, "shuffled before sharding");
        seen.sort_unstable();
        assert_eq!(seen, expected, "every sample of the split once");
    }
}

#[test]
fn value_labels_become_f32_values() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.safetensors");
    let y: Vec<u8> = (0..50).flat_map(|i| [f64::from(i) * 2.0, -f64::from(i)]).flat_map(f64::to_le_bytes).collect();
    numbered(&file, ("F64", vec![50, 2], y));
    let out = dir.path().join("shards");
    pack_tensors(&file, &out, &PackOptions::default()).unwrap();
    let index = index(&out);
    assert_eq!((index.values.clone(), index.classes.len()), (Some(vec![2]), 0));
    for batch in read_all(&out, &index, true) {
        let a: Vec<f32> = batch.parts[0].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        let y: Vec<f32> = batch.parts[2].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        for s in 0..batch.labels.len() {
            assert_eq!(&y[2 * s..2 * s + 2], [a[3 * s] * 2.0, -a[3 * s]]);
        }
    }
}

#[test]
fn a_file_that_cannot_be_packed_is_refused_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.safetensors");
    let out = dir.path().join("shards");
    let cases: Vec<(Vec<Stored>, &str)> = vec![
        (
            vec![("x.a", "BF16", vec![10, 1], vec![0; 20]), ("y", "I64", vec![10], i64s(0..10))],
            "x.a: dtype BF16 has no .npy type",
        ),
        (vec![("x.a", "F32", vec![10, 1], f32s((0..10).map(|v| v as f32)))], "holds no labels y"),
        (vec![("x.a", "F32", vec![9, 1], vec![0; 36]), ("y", "I64", vec![10], i64s(0..10))], "x.a has Some(9) samples"),
        (
            vec![("x.a", "F32", vec![10, 1], vec![0; 40]), ("y", "I64", vec![10], i64s((0..10).map(|v| -v)))],
            "every class index",
        ),
        (
            vec![
                ("x.a", "F32", vec![10, 1], vec![0; 40]),
                ("y", "I64", vec![10], i64s(0..10)),
                ("y_test", "I64", vec![2], i64s(0..2)),
            ],
            "x_test.a is missing",
        ),
        (vec![("x.a b", "F32", vec![10, 1], vec![0; 40]), ("y", "I64", vec![10], i64s(0..10))], "names are 1 to 100"),
    ];
    for (tensors, expected) in cases {
        write_safetensors(&file, &tensors);
        let err = pack_tensors(&file, &out, &PackOptions::default()).unwrap_err().to_string();
        assert!(err.contains(expected), "{err} (expected {expected:?})");
        assert!(!out.join("index.json").exists(), "no index for a data set not packed");
    }
    std::fs::write(&file, b"not a safetensors file at all").unwrap();
    assert!(pack_tensors(&file, &out, &PackOptions::default()).unwrap_err().to_string().contains("not a safetensors"));
}

#[test]
fn a_member_that_is_not_its_index_s_fails_the_read_naming_the_shard_and_sample() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.safetensors");
    numbered(&file, ("I64", vec![50], i64s((0..50).map(|i| i % 3))));
    let out = dir.path().join("shards");
    pack_tensors(&file, &out, &PackOptions::default()).unwrap();
    // the index now says b is f64: every stored b is refused by what it is
    let mut index = index(&out);
    index.inputs[1].dtype = Dtype::F64;
    let ids: Vec<u64> = (0..index.train.samples).collect();
    let reader = Arc::new(SplitReader::new(out.clone(), index.train.clone(), Layout::of(&index), 4));
    let transform = Transform { size: 0, crop: CropMode::Whole, seed: 0, epoch: 0 };
    let mut batches = Batches::start(reader, vec![ids], transform, 1, 1);
    let err = batches.next_batch().unwrap().unwrap_err();
    assert!(
        err.starts_with("shard train-000000.tar sample 0") && err.contains("x.b.npy holds <i8, the index says <f8"),
        "{err}"
    );
}
