//! A composite uploaded model ([`ringtrain_core::composite`]) in a rank: an archive of TorchScript modules
//! and the manifest that joins them. A rank loads the modules of its pipeline stage (all of them when the
//! model is not split), each a [`Scripted`] whose tensors are registered in the VarStore under the module's
//! name (`encode_set.phi.0.weight`), and runs them in the manifest's order.
//!
//! The archive is tenant data: it is read with every member's kind, name and count checked, and the
//! modules are loaded from memory (never unpacked onto a disk), each through the operator allow-list.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use ringtrain_core::composite::{is_archive_head, Manifest, StagePlan, ARCHIVE_HEAD_BYTES, MANIFEST, MAX_MODULES};
use tch::{nn, Tensor};

use super::scripted::{OperatorCheck, ScriptModule, Scripted};

/// Whether `path` holds a tar archive (a composite model) rather than a TorchScript file (a zip archive).
pub fn is_archive(path: &Path) -> bool {
    let mut head = [0u8; ARCHIVE_HEAD_BYTES];
    let read = std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head));
    read.is_ok() && is_archive_head(&head)
}

/// A composite model's archive, read: its manifest and each module's file.
#[derive(Debug)]
pub struct Archive {
    pub manifest: Manifest,
    modules: HashMap<String, Vec<u8>>,
}

impl Archive {
    /// Reads the archive at `path`: `composite.json` and one `NAME.pt` per module it lists, plain files at
    /// the top, nothing else.
    pub fn read(path: &Path) -> Result<Archive> {
        let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let mut archive = tar::Archive::new(file);
        let mut members: HashMap<String, Vec<u8>> = HashMap::new();
        for entry in archive.entries().context("not a readable tar archive")? {
            let mut entry = entry.context("not a readable tar archive")?;
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            ensure!(
                entry.header().entry_type().is_file(),
                "the archive's member {name:?} is not a plain file: a composite model holds {MANIFEST} and NAME.pt files"
            );
            ensure!(!name.contains('/'), "the archive's member {name:?} is in a folder: put every file at its top");
            ensure!(members.len() <= MAX_MODULES, "the archive holds more than {MAX_MODULES} modules");
            ensure!(!members.contains_key(&name), "the archive holds {name} twice");
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).with_context(|| format!("cannot read the archive's {name}"))?;
            members.insert(name, bytes);
        }
        let Some(manifest) = members.remove(MANIFEST) else {
            bail!("the archive holds no {MANIFEST}, the manifest naming its modules");
        };
        let manifest = Manifest::parse(&manifest).map_err(anyhow::Error::msg)?;
        let mut modules = HashMap::new();
        for name in manifest.names() {
            let file = format!("{name}.pt");
            let bytes =
                members.remove(&file).with_context(|| format!("the archive lacks {file}, module {name}'s file"))?;
            modules.insert(name, bytes);
        }
        if let Some(extra) = members.keys().next() {
            bail!("the archive holds {extra}, which is no module of its {MANIFEST}");
        }
        Ok(Archive { manifest, modules })
    }

    /// Module `name`'s TorchScript file.
    pub fn module(&self, name: &str) -> Option<&[u8]> {
        self.modules.get(name).map(Vec::as_slice)
    }
}

/// The modules of one stage of a composite model, loaded and registered.
#[derive(Debug)]
pub struct Composite {
    manifest: Manifest,
    plan: StagePlan,
    /// Whether this stage makes the model's output (the whole model, or the last stage).
    last: bool,
    /// The stage's modules with their place in the manifest, in the order they run.
    pub modules: Vec<(usize, Scripted)>,
    /// The data set's inputs, in the order the rank loads them ([`Manifest::data_inputs`]).
    data_inputs: Vec<String>,
    /// The BatchNorm modules' parameters, by their VarStore names.
    batch_norm_params: HashSet<String>,
    pub has_batch_norm: bool,
}

impl Composite {
    /// Loads the modules stage `stage` of `stages` runs (None: every module, the model unsplit) onto
    /// `root`'s device, each registered under `root / NAME`.
    pub fn load(
        path: &Path,
        root: &nn::Path,
        check: OperatorCheck,
        stages: Option<(&[Vec<String>], usize)>,
    ) -> Result<Composite> {
        let archive = Archive::read(path)?;
        Self::from_archive(&archive, root, check, stages)
    }

    /// As [`Composite::load`], from an archive already read.
    pub fn from_archive(
        archive: &Archive,
        root: &nn::Path,
        check: OperatorCheck,
        stages: Option<(&[Vec<String>], usize)>,
    ) -> Result<Composite> {
        let manifest = archive.manifest.clone();
        let (plan, last) = match stages {
            None => (manifest.whole(), true),
            Some((stages, stage)) => {
                let plans = manifest.plan(stages).map_err(|(at, why)| match at {
                    Some(s) => anyhow::anyhow!("placement.stages[{s}]: {why}"),
                    None => anyhow::anyhow!("placement.stages: {why}"),
                })?;
                let plan = plans.into_iter().nth(stage).with_context(|| format!("there is no stage {stage}"))?;
                (plan, stage + 1 == stages.len())
            }
        };
        let mut modules = Vec::with_capacity(plan.modules.len());
        let mut batch_norm_params = HashSet::new();
        let mut has_batch_norm = false;
        for &i in &plan.modules {
            let name = &manifest.modules[i].name;
            let bytes = archive.module(name).with_context(|| format!("module {name} has no file"))?;
            let loaded = ScriptModule::load_bytes(bytes, root.device())
                .and_then(|module| Scripted::registered(module, &(root / name.as_str()), check))
                .with_context(|| format!("module {name}"))?;
            batch_norm_params.extend(loaded.batch_norm_params.iter().map(|p| format!("{name}.{p}")));
            has_batch_norm |= loaded.has_batch_norm;
            modules.push((i, loaded));
        }
        let data_inputs = manifest.data_inputs();
        Ok(Composite { manifest, plan, last, modules, data_inputs, batch_norm_params, has_batch_norm })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Every module's output in the manifest's order, the whole model run on `data` (the check's view of
    /// each module).
    pub fn outputs(&mut self, data: &[Tensor], train: bool) -> Result<Vec<Tensor>> {
        ensure!(self.modules.len() == self.manifest.modules.len(), "a stage's modules are not the whole model");
        let mut outputs: Vec<Tensor> = Vec::with_capacity(self.modules.len());
        for at in 0..self.modules.len() {
            let args = self.arguments(at, data, &outputs)?;
            let scripted = &mut self.modules[at].1;
            scripted.module.set_training(train)?;
            let out =
                scripted.module.forward(&args).with_context(|| format!("module {}", self.manifest.modules[at].name))?;
            outputs.push(out);
        }
        Ok(outputs)
    }

    /// Module `i`'s arguments (the whole model's `i`th) from the data set's inputs and the outputs of the
    /// modules before it, in the manifest's order.
    pub fn arguments(&self, i: usize, data: &[Tensor], outputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let entry = &self.manifest.modules[i];
        entry
            .inputs
            .iter()
            .map(|input| match self.manifest.index(input) {
                Some(j) => outputs.get(j).map(Tensor::shallow_clone).with_context(|| format!("{input} has not run")),
                None => {
                    let at = self.data_inputs.iter().position(|d| d == input).filter(|&at| at < data.len());
                    at.map(|at| data[at].shallow_clone()).with_context(|| format!("no data input {input}"))
                }
            })
            .collect()
    }

    /// Whether a parameter (by its VarStore name) is a BatchNorm module's.
    pub fn is_batch_norm_param(&self, name: &str) -> bool {
        self.batch_norm_params.contains(name)
    }

    /// Runs this stage's modules in training or evaluation mode on `data` (the data set's inputs, in
    /// [`Manifest::data_inputs`] order) and `received` (the previous stage's outputs, in the plan's
    /// `receives` order). Returns the model's output alone in the last stage, else what the next stage
    /// gets (the plan's `sends`).
    pub fn forward_stage(&mut self, data: &[Tensor], received: &[Tensor], train: bool) -> Result<Vec<Tensor>> {
        ensure!(
            received.len() == self.plan.receives.len(),
            "this stage takes {} module outputs from the previous one ({}), got {}",
            self.plan.receives.len(),
            self.plan.receives.join(", "),
            received.len()
        );
        let mut values: HashMap<&str, Tensor> =
            self.plan.receives.iter().map(String::as_str).zip(received.iter().map(Tensor::shallow_clone)).collect();
        for (i, scripted) in &mut self.modules {
            let entry = &self.manifest.modules[*i];
            let mut args = Vec::with_capacity(entry.inputs.len());
            for input in &entry.inputs {
                let value = match values.get(input.as_str()) {
                    Some(value) => value.shallow_clone(),
                    None => {
                        let at = self.data_inputs.iter().position(|d| d == input);
                        let at = at.filter(|&at| at < data.len()).with_context(|| {
                            format!("module {} takes {input}, which this stage neither computes nor gets", entry.name)
                        })?;
                        data[at].shallow_clone()
                    }
                };
                args.push(value);
            }
            scripted.module.set_training(train)?;
            let out = scripted.module.forward(&args).with_context(|| format!("module {}", entry.name))?;
            values.insert(entry.name.as_str(), out);
        }
        if self.last {
            let output = values.remove(self.manifest.output()).context("the last stage did not make the output")?;
            return Ok(vec![output]);
        }
        self.plan
            .sends
            .iter()
            .map(|name| {
                values.get(name.as_str()).map(Tensor::shallow_clone).with_context(|| format!("{name} was not made"))
            })
            .collect()
    }
}
