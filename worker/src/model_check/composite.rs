//! The check of a composite model (an archive of TorchScript modules and its `composite.json`): the
//! archive and manifest are well formed, every module loads through the operator allow-list, the whole
//! model takes two samples of the data set's inputs the manifest names and makes what the labels need, and
//! the loss reaches every module's parameters. Then it measures what a training step takes in memory, of
//! the whole model and of each module alone (its inputs given, as a pipeline stage gets them), so that
//! admission can fit each stage of a job's placement on its device.

use std::path::Path;

use ringtrain_protocol::model::{MeasuredStep, ModelMemory, ModelRefusal, ModelReport, ModuleReport};
use tch::nn::VarStore;
use tch::{Device, Tensor};

use super::{bounded, bytes, forward_refusal, refuse, MEASURED_BATCHES};
use crate::data::{Dataset, Labels};
use crate::models::composite::{Archive, Composite};
use crate::models::OperatorCheck;
use crate::peak_memory::PeakMeter;
use crate::trainer::{loss_and_tally, training_loss};

fn body(e: anyhow::Error) -> ModelRefusal {
    refuse("body", bounded(&format!("{e:#}")))
}

/// Checks the composite model at `archive` against the safetensors data set `dataset`.
pub fn check(
    archive: &Path,
    dataset: &Path,
    operators: OperatorCheck,
    meter: Option<PeakMeter>,
) -> Result<ModelReport, ModelRefusal> {
    let archive = Archive::read(archive).map_err(body)?;
    let inputs = archive.manifest.data_inputs();
    let mut data = Dataset::load_safetensors(dataset, Some(&inputs), None, None).map_err(|e| {
        refuse("body", format!("the modules of composite.json take inputs the data set does not hold: {e:#}"))
    })?;
    let vs = VarStore::new(Device::Cpu);
    let mut model = Composite::from_archive(&archive, &vs.root(), operators, None).map_err(body)?;
    let loss = training_loss(None, data.labels).map_err(|e| refuse("dataset", e))?;
    let batch: Vec<i64> = (0..data.train_len().min(2) as i64).collect();
    let (x, y) = data.train_batch(&batch, Device::Cpu).map_err(|e| refuse("dataset", format!("{e:#}")))?;

    let evaluated = tch::no_grad(|| model.outputs(&x, false)).map_err(forward_refusal)?;
    let out = evaluated.last().expect("a manifest has modules");
    let _fits = loss_and_tally(loss, data.classes(), out, &y).map_err(body)?;

    let trained = model.outputs(&x, true).map_err(forward_refusal)?;
    let (value, _) = loss_and_tally(loss, data.classes(), trained.last().expect("modules"), &y).map_err(body)?;
    value.backward();
    let mut modules = Vec::with_capacity(model.modules.len());
    for ((_, scripted), output) in model.modules.iter().zip(&evaluated) {
        let name = &model.manifest().modules[modules.len()];
        let tensors = scripted.module.tensors().map_err(body)?;
        let trainable: Vec<&Tensor> =
            tensors.iter().filter(|t| !t.buffer && t.tensor.requires_grad()).map(|t| &t.tensor).collect();
        if !trainable.iter().any(|t| t.grad().defined()) {
            return Err(refuse(
                "body",
                format!("the loss does not reach any parameter of module {}: it would not train", name.name),
            ));
        }
        modules.push(ModuleReport {
            name: name.name.clone(),
            inputs: name.inputs.clone(),
            parameters: trainable.iter().map(|t| t.numel() as u64).sum(),
            batch_norm: scripted.has_batch_norm,
            output_shape: output.size(),
            memory: None,
        });
    }
    let all_tensors: Vec<Tensor> = vs.variables().into_values().collect();
    let trainable: Vec<&Tensor> = all_tensors.iter().filter(|t| t.requires_grad()).collect();
    let mut memory = None;
    if let Some(mut meter) = meter {
        memory = measure_whole(&mut model, &mut data, loss, &mut meter, &all_tensors)?;
        for (i, module) in modules.iter_mut().enumerate() {
            module.memory = measure_module(&mut model, i, &mut data, loss, &mut meter)?;
        }
    }
    Ok(ModelReport {
        parameters: trainable.iter().map(|t| t.numel() as u64).sum(),
        parameter_tensors: trainable.len() as u64,
        buffers: all_tensors.len() as u64 - trainable.len() as u64,
        batch_norm: model.has_batch_norm,
        inputs,
        output_shape: out.size(),
        labels: match data.labels {
            Labels::Classes(_) => "classes".to_string(),
            Labels::Values { .. } => "values".to_string(),
        },
        memory,
        modules,
    })
}

/// The indices of a batch of `batch` samples (the data set may hold fewer: they repeat).
fn indices(data: &Dataset, batch: u64) -> Vec<i64> {
    let samples = data.train_len().max(1) as i64;
    (0..batch as i64).map(|i| i % samples).collect()
}

/// Measures [`MEASURED_BATCHES`] with `step` (the batch's measured work, given its size); None when the
/// kernel stopped answering.
fn measure_two(
    meter: &mut PeakMeter,
    mut step: impl FnMut(&mut PeakMeter, u64) -> Result<Option<MeasuredStep>, ModelRefusal>,
) -> Result<Option<(MeasuredStep, MeasuredStep)>, ModelRefusal> {
    let (Some(small), Some(large)) = (step(meter, MEASURED_BATCHES.0)?, step(meter, MEASURED_BATCHES.1)?) else {
        return Ok(None);
    };
    Ok(Some((small, large)))
}

/// A whole training step of the model (batch, forward, loss, backward), as a model of one file is measured.
fn measure_whole(
    model: &mut Composite,
    data: &mut Dataset,
    loss: ringtrain_core::spec::Loss,
    meter: &mut PeakMeter,
    tensors: &[Tensor],
) -> Result<Option<ModelMemory>, ModelRefusal> {
    let measured = measure_two(meter, |meter, batch| {
        let indices = indices(data, batch);
        let measured = meter.measure(|| -> anyhow::Result<()> {
            let (x, y) = data.train_batch(&indices, Device::Cpu)?;
            let outputs = model.outputs(&x, true)?;
            let (value, _) = loss_and_tally(loss, data.classes(), outputs.last().expect("modules"), &y)?;
            value.backward();
            Ok(())
        });
        stepped(measured, batch)
    })?;
    let Some((small, large)) = measured else { return Ok(None) };
    let trainable = bytes(tensors.iter().filter(|t| t.requires_grad()));
    Ok(Some(ModelMemory::from_steps(bytes(tensors.iter()), trainable, small, large)))
}

/// Module `i`'s own training step, as the stage that holds it runs it: its inputs given (the earlier
/// modules' outputs computed beforehand and outside the measure, as a stage receives them, with gradients
/// wanted), its forward, and a backward from its output (the loss for the last module).
fn measure_module(
    model: &mut Composite,
    i: usize,
    data: &mut Dataset,
    loss: ringtrain_core::spec::Loss,
    meter: &mut PeakMeter,
) -> Result<Option<ModelMemory>, ModelRefusal> {
    let last = i + 1 == model.modules.len();
    let measured = measure_two(meter, |meter, batch| {
        let (x, y) =
            data.train_batch(&indices(data, batch), Device::Cpu).map_err(|e| refuse("dataset", format!("{e:#}")))?;
        let before = tch::no_grad(|| model.outputs(&x, true)).map_err(forward_refusal)?;
        let received: Vec<Tensor> = before.iter().map(|t| t.detach().set_requires_grad(true)).collect();
        let args = model.arguments(i, &x, &received).map_err(body)?;
        let classes = data.classes();
        let scripted = &mut model.modules[i].1;
        let measured = meter.measure(|| -> anyhow::Result<()> {
            let out = scripted.module.forward(&args)?;
            let value = match last {
                true => loss_and_tally(loss, classes, &out, &y)?.0,
                false => out.sum(None),
            };
            value.backward();
            Ok(())
        });
        stepped(measured, batch)
    })?;
    let Some((small, large)) = measured else { return Ok(None) };
    let tensors = model.modules[i].1.module.tensors().map_err(body)?;
    let trainable = bytes(tensors.iter().filter(|t| !t.buffer && t.tensor.requires_grad()).map(|t| &t.tensor));
    Ok(Some(ModelMemory::from_steps(bytes(tensors.iter().map(|t| &t.tensor)), trainable, small, large)))
}

/// A measured step's outcome: its peak, the model's refusal when the step failed, None when the kernel
/// would not say.
fn stepped(
    measured: std::io::Result<(anyhow::Result<()>, u64)>,
    batch: u64,
) -> Result<Option<MeasuredStep>, ModelRefusal> {
    match measured {
        Ok((outcome, peak_bytes)) => {
            outcome.map(|()| Some(MeasuredStep { batch, peak_bytes })).map_err(forward_refusal)
        }
        Err(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::path::{Path, PathBuf};

    use super::check;
    use crate::models::OperatorCheck;
    use crate::peak_memory::PeakMeter;

    fn repo(path: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
    }

    /// An archive's members: name and bytes.
    type Members = Vec<(String, Vec<u8>)>;

    /// The example's composite.tar, member by member.
    fn members() -> Members {
        let mut archive = tar::Archive::new(std::fs::File::open(repo("examples/multi-input/composite.tar")).unwrap());
        let mut out = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).unwrap();
            out.push((entry.path().unwrap().to_string_lossy().into_owned(), bytes));
        }
        out
    }

    /// An archive of `members` (and a link named `link`, when given) at `path`.
    fn archive(path: &Path, members: &Members, link: Option<&str>) {
        let mut builder = tar::Builder::new(std::fs::File::create(path).unwrap());
        for (name, bytes) in members {
            let mut header = tar::Header::new_ustar();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_path(name).unwrap();
            header.set_cksum();
            builder.append(&header, bytes.as_slice()).unwrap();
        }
        if let Some(name) = link {
            let mut header = tar::Header::new_ustar();
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            builder.append_link(&mut header, name, "/etc/passwd").unwrap();
        }
        builder.finish().unwrap();
    }

    #[test]
    fn the_example_passes_module_by_module() {
        let data = repo("examples/multi-input/data.safetensors");
        let report =
            check(&repo("examples/multi-input/composite.tar"), &data, OperatorCheck::Enforced, PeakMeter::open())
                .unwrap();
        assert_eq!(report.inputs, ["numeric", "tokens", "tokens_mask", "set", "set_mask"]);
        assert_eq!(report.output_shape, [2, 3]);
        let names: Vec<&str> = report.modules.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["encode_numeric", "encode_sequence", "encode_set", "head"]);
        assert_eq!(report.modules.iter().map(|m| m.parameters).sum::<u64>(), report.parameters);
        assert_eq!(report.modules[3].output_shape, [2, 3]);
        assert_eq!(report.modules[0].output_shape, [2, 32], "each encoder's output, as the head takes it");
        for module in &report.modules {
            let memory = module.memory.as_ref().expect("each module's step measured");
            assert_eq!(memory.trainable_bytes, module.parameters * 4, "{}", module.name);
        }
    }

    #[test]
    fn a_bad_archive_is_refused_naming_what_is_wrong() {
        let data = repo("examples/multi-input/data.safetensors");
        let dir = std::env::temp_dir().join(format!("ringtrain-composite-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let all = members();
        let without = |name: &str| all.iter().filter(|(n, _)| n != name).cloned().collect::<Vec<_>>();
        let with = |name: &str, bytes: &[u8]| {
            let mut changed = without(name);
            changed.push((name.to_string(), bytes.to_vec()));
            changed
        };
        let manifest = |text: &str| with("composite.json", text.as_bytes());
        let colour = r#"{"modules": [{"name": "encode_numeric", "inputs": ["colour"]}, {"name": "encode_sequence", "inputs": ["tokens", "tokens_mask"]}, {"name": "encode_set", "inputs": ["set", "set_mask"]}, {"name": "head", "inputs": ["encode_numeric", "encode_sequence", "encode_set"]}]}"#;
        let mut extra = all.clone();
        extra.push(("notes.txt".to_string(), b"hello".to_vec()));
        let mut nested = without("head.pt");
        nested.push(("models/head.pt".to_string(), all.iter().find(|(n, _)| n == "head.pt").unwrap().1.clone()));
        let cases: Vec<(&str, Members, Option<&str>, &str)> = vec![
            ("no manifest", without("composite.json"), None, "holds no composite.json"),
            ("no module file", without("encode_set.pt"), None, "lacks encode_set.pt"),
            ("a member too many", extra, None, "notes.txt, which is no module"),
            ("a folder", nested, None, "is in a folder"),
            ("a link", all.clone(), Some("link.pt"), "not a plain file"),
            ("a module that is not TorchScript", with("encode_set.pt", b"PK\x03\x04 junk"), None, "module encode_set"),
            ("an input the data set lacks", manifest(colour), None, "x.colour"),
            (
                "a manifest out of order",
                manifest(
                    r#"{"modules": [{"name": "head", "inputs": ["encode_numeric"]}, {"name": "encode_numeric", "inputs": ["numeric"]}]}"#,
                ),
                None,
                "listed after it",
            ),
        ];
        for (what, members, link, expected) in cases {
            let path = dir.join("model.tar");
            archive(&path, &members, link);
            let refusal = check(&path, &data, OperatorCheck::Enforced, None).unwrap_err();
            assert_eq!(refusal.field, "body", "{what}: {refusal:?}");
            assert!(refusal.reason.contains(expected), "{what}: {}", refusal.reason);
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
