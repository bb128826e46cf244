//! The check of an uploaded TorchScript model, run by `ringtrain model check` in a process of its own (the
//! server starts it, so a hostile or broken file can crash nothing but that process): the file loads in
//! libtorch, has trainable parameters, and its `forward` takes two samples of the data set's named inputs
//! and returns what the labels need (class scores, or one value per label), in evaluation mode and in
//! training mode with a backward pass that reaches its parameters. It then measures what a training step
//! takes in memory at two batch sizes ([`MEASURED_BATCHES`]), which admission extrapolates to a job's
//! per-worker batch.

mod composite;

use std::path::Path;

use ringtrain_protocol::model::{MeasuredStep, ModelMemory, ModelRefusal, ModelReport};
use tch::nn::VarStore;
use tch::{Device, Tensor};

use crate::data::{Dataset, Labels};
use crate::models::{OperatorCheck, Scripted};
use crate::peak_memory::PeakMeter;
use crate::trainer::{loss_and_tally, training_loss};

/// The batch sizes whose training steps the check measures: small enough for one CPU thread on the
/// server, far enough apart that what grows with the batch stands out of the allocator's noise.
pub const MEASURED_BATCHES: (u64, u64) = (2, 16);

pub(super) fn refuse(field: &str, reason: impl Into<String>) -> ModelRefusal {
    ModelRefusal { field: field.to_string(), reason: reason.into() }
}

/// The longest reason a refusal gives: an error's own text, cut (a model that raises with a megabyte of
/// text does not get it all back, nor fill the server's log).
const MAX_REASON_CHARS: usize = 600;

pub(super) fn bounded(reason: &str) -> String {
    match reason.char_indices().nth(MAX_REASON_CHARS) {
        Some((cut, _)) => format!("{}… (cut)", &reason[..cut]),
        None => reason.to_string(),
    }
}

/// A forward pass that failed: the model's fault when it returned something else than a tensor or asked
/// for more memory than the check allows, else the inputs' (their number, names, dtypes or shapes), as
/// TorchScript says.
pub(super) fn forward_refusal(e: anyhow::Error) -> ModelRefusal {
    let reason = bounded(&format!("{e:#}"));
    let models_fault = reason.contains("not one tensor") || reason.contains("allocate memory");
    refuse(if models_fault { "body" } else { "inputs" }, reason)
}

/// Checks `model` against the safetensors data set `dataset`, whose tensors `x.NAME` for each of `inputs`
/// (or its one `x` when `inputs` is empty) are passed to `forward` in that order.
pub fn check(model: &Path, dataset: &Path, inputs: &[String]) -> Result<ModelReport, ModelRefusal> {
    check_with(model, dataset, inputs, OperatorCheck::Enforced, PeakMeter::open())
}

/// As [`check`], with the operator allow-list skipped when `operators` says so (the sandbox's own tests),
/// and the steps measured with `meter` (none: the report has no memory). A confined check opens its meter
/// before it confines itself.
pub fn check_with(
    model: &Path,
    dataset: &Path,
    inputs: &[String],
    operators: OperatorCheck,
    meter: Option<PeakMeter>,
) -> Result<ModelReport, ModelRefusal> {
    if crate::models::composite::is_archive(model) {
        return crate::model_check::composite::check(model, dataset, operators, meter);
    }
    let named = (!inputs.is_empty()).then_some(inputs);
    let mut data = Dataset::load_safetensors(dataset, named, None, None)
        .map_err(|e| refuse("inputs", format!("the data set does not hold the inputs named: {e:#}")))?;
    let vs = VarStore::new(Device::Cpu);
    let mut scripted =
        Scripted::load_with(model, &vs.root(), operators).map_err(|e| refuse("body", bounded(&format!("{e:#}"))))?;
    let tensors = scripted.module.tensors().map_err(|e| refuse("body", bounded(&format!("{e:#}"))))?;
    let trainable: Vec<&Tensor> =
        tensors.iter().filter(|t| !t.buffer && t.tensor.requires_grad()).map(|t| &t.tensor).collect();
    let loss = training_loss(None, data.labels).map_err(|e| refuse("dataset", e))?;
    let batch: Vec<i64> = (0..data.train_len().min(2) as i64).collect();
    let (x, y) = data.train_batch(&batch, Device::Cpu).map_err(|e| refuse("dataset", format!("{e:#}")))?;

    let out = tch::no_grad(|| {
        scripted.module.set_training(false)?;
        scripted.module.forward(&x)
    })
    .map_err(forward_refusal)?;
    let _fits =
        loss_and_tally(loss, data.classes(), &out, &y).map_err(|e| refuse("body", bounded(&format!("{e:#}"))))?;

    scripted.module.set_training(true).map_err(|e| refuse("body", bounded(&format!("{e:#}"))))?;
    let trained = scripted.module.forward(&x).map_err(forward_refusal)?;
    let (value, _) =
        loss_and_tally(loss, data.classes(), &trained, &y).map_err(|e| refuse("body", bounded(&format!("{e:#}"))))?;
    value.backward();
    if !trainable.iter().any(|t| t.grad().defined()) {
        return Err(refuse("body", "the loss does not reach any of the model's parameters: nothing would train"));
    }
    let memory = match meter {
        Some(meter) => measure_steps(&mut scripted, &mut data, loss, meter, &tensors)?,
        None => None,
    };
    let input_names = if inputs.is_empty() { vec!["x".to_string()] } else { inputs.to_vec() };
    Ok(ModelReport {
        parameters: trainable.iter().map(|t| t.numel() as u64).sum(),
        parameter_tensors: trainable.len() as u64,
        buffers: tensors.iter().filter(|t| t.buffer).count() as u64,
        batch_norm: scripted.has_batch_norm,
        inputs: input_names,
        output_shape: out.size(),
        labels: match data.labels {
            Labels::Classes(_) => "classes".to_string(),
            Labels::Values { .. } => "values".to_string(),
        },
        memory,
        modules: Vec::new(),
    })
}

/// Bytes of a set of tensors.
pub(super) fn bytes<'a>(tensors: impl Iterator<Item = &'a Tensor>) -> u64 {
    tensors.map(|t| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64).sum()
}

/// Measures a training step (the batch, forward, loss, backward) at each of [`MEASURED_BATCHES`], after
/// the check's own step has allocated the gradients, as they are in training. A step that fails here
/// (memory, most likely) is the model's refusal; a meter the kernel stops answering is no measure.
fn measure_steps(
    scripted: &mut Scripted,
    data: &mut Dataset,
    loss: ringtrain_core::spec::Loss,
    mut meter: PeakMeter,
    tensors: &[crate::models::scripted::ScriptTensor],
) -> Result<Option<ModelMemory>, ModelRefusal> {
    let samples = data.train_len().max(1) as i64;
    let mut step = |batch: u64| -> Result<Option<MeasuredStep>, ModelRefusal> {
        // the data set may hold fewer samples than the batch: they repeat
        let indices: Vec<i64> = (0..batch as i64).map(|i| i % samples).collect();
        let measured = meter.measure(|| -> anyhow::Result<()> {
            let (x, y) = data.train_batch(&indices, Device::Cpu)?;
            let out = scripted.module.forward(&x)?;
            let (value, _) = loss_and_tally(loss, data.classes(), &out, &y)?;
            value.backward();
            Ok(())
        });
        match measured {
            Ok((outcome, peak_bytes)) => {
                outcome.map(|()| Some(MeasuredStep { batch, peak_bytes })).map_err(forward_refusal)
            }
            Err(_) => Ok(None),
        }
    };
    let (Some(small), Some(large)) = (step(MEASURED_BATCHES.0)?, step(MEASURED_BATCHES.1)?) else { return Ok(None) };
    let weights = bytes(tensors.iter().map(|t| &t.tensor));
    let trainable = bytes(tensors.iter().filter(|t| !t.buffer && t.tensor.requires_grad()).map(|t| &t.tensor));
    Ok(Some(ModelMemory::from_steps(weights, trainable, small, large)))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::check;

    fn repo(path: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
    }

    fn example_inputs() -> Vec<String> {
        ["numeric", "tokens", "tokens_mask", "set", "set_mask"].iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_worked_example_passes_with_its_five_inputs() {
        let data = repo("examples/multi-input/data.safetensors");
        let report = check(&repo("examples/multi-input/model.pt"), &data, &example_inputs()).unwrap();
        assert_eq!(report.output_shape, vec![2, 3]);
        assert_eq!(report.labels, "classes");
        assert!(report.parameters > 10_000 && !report.batch_norm, "{report:?}");
        let memory = report.memory.expect("the steps were measured");
        assert_eq!(memory.trainable_bytes, report.parameters * 4, "float32 parameters");
        assert!(memory.weights_bytes >= memory.trainable_bytes);
        assert_eq!(memory.measured.iter().map(|s| s.batch).collect::<Vec<_>>(), [2, 16]);
        assert!(memory.measured[0].peak_bytes > 0, "a step makes something resident: {memory:?}");
    }

    #[test]
    fn batch_norm_and_regression_models_are_recognised() {
        let data = repo("examples/multi-input/data.safetensors");
        let numeric = vec!["numeric".to_string()];
        let report = check(&repo("tests/fixtures/byo/bn_mlp.pt"), &data, &numeric).unwrap();
        assert!(report.batch_norm && report.buffers == 3, "{report:?}");
        let values = repo("tests/fixtures/byo/regression.safetensors");
        let report = check(&repo("tests/fixtures/byo/regressor.pt"), &values, &numeric).unwrap();
        assert_eq!((report.labels.as_str(), report.output_shape.as_slice()), ("values", &[2][..]));
    }

    #[test]
    fn bad_models_are_refused_with_the_field_at_fault() {
        let data = repo("examples/multi-input/data.safetensors");
        let numeric = vec!["numeric".to_string()];
        let not_a_model = std::env::temp_dir().join(format!("ringtrain-not-a-model-{}.pt", std::process::id()));
        std::fs::write(&not_a_model, b"PK\x03\x04 this is not a zip").unwrap();
        let cases = [
            (not_a_model.clone(), example_inputs(), "body", "not a loadable TorchScript file"),
            (repo("examples/multi-input/model.pt"), numeric.clone(), "inputs", "forward"),
            (repo("examples/multi-input/model.pt"), vec!["nope".to_string()], "inputs", "no x.nope"),
            (repo("tests/fixtures/byo/no_parameters.pt"), numeric.clone(), "body", "no trainable parameters"),
            (repo("tests/fixtures/byo/two_outputs.pt"), numeric.clone(), "body", "not one tensor"),
            (repo("tests/fixtures/byo/regressor.pt"), numeric.clone(), "body", "output has shape [2]"),
            (repo("tests/fixtures/byo/memory_hog.pt"), numeric.clone(), "body", "can't allocate memory"),
        ];
        for (model, inputs, field, reason) in cases {
            let refusal = check(&model, &data, &inputs).unwrap_err();
            assert_eq!(refusal.field, field, "{model:?}: {refusal:?}");
            assert!(refusal.reason.contains(reason), "{model:?}: {}", refusal.reason);
        }
        std::fs::remove_file(not_a_model).unwrap();
    }
}
