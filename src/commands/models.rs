//! `ringtrain models`: the team's uploaded TorchScript models (`upload`, `list`, `delete`, as
//! `/v1/models` handles them), and `check`: the check of a model against a data set, in a process of its
//! own. The server runs `check` on every upload (so libtorch and a hostile file never share the server's
//! process) and reads its one line of JSON; users can run it before uploading.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use ringtrain_protocol::model::ModelMemory;
use ringtrain_protocol::model::EXIT_REFUSED;
use ringtrain_views::artifacts::Model;
use ringtrain_worker::models::OperatorCheck;
use uuid::Uuid;

use crate::commands::artifacts::{self, created, size, Column, DeleteArgs, ListArgs};
use crate::commands::block_on;
use crate::commands::connection::encode;

#[derive(Debug, clap::Subcommand)]
pub enum Models {
    /// Upload a TorchScript model, checked by the server against one of the team's data sets before it is
    /// stored; train it with `"model": {"uploaded": "<id>"}`.
    Upload(ModelUploadArgs),
    /// The team's models, newest first.
    List(ListArgs),
    /// Delete a model that no queued or running job trains.
    Delete(DeleteArgs),
    /// Check a TorchScript model against a safetensors data set: it loads, has trainable parameters, and its
    /// forward takes two samples of the named inputs and returns what the labels need. Prints one JSON line:
    /// the report (exit 0) or {field, reason} (exit 2).
    Check(CheckArgs),
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The TorchScript file (torch.jit.script(model).save(path) in PyTorch).
    #[arg(long)]
    model: PathBuf,
    /// The safetensors data set.
    #[arg(long)]
    dataset: PathBuf,
    /// forward's inputs in order, comma-separated: the data set's tensors x.NAME. Default: its one x.
    #[arg(long, value_delimiter = ',')]
    inputs: Vec<String>,
    /// The most memory (address space, in GiB) the check may take: a model whose forward allocates more
    /// fails its check instead of starving the machine (the server passes its own limit).
    #[arg(long, default_value_t = 16)]
    max_memory_gib: u64,
    /// The most CPU time the check may take, in seconds.
    #[arg(long, default_value_t = 120)]
    max_cpu_s: u64,
    /// The check's only writable folder (default: a fresh temporary one). The check always runs confined
    /// (see `ringtrain_sandbox`): it reads only the model and the data set.
    #[arg(long)]
    sandbox_dir: Option<PathBuf>,
    /// Check even where this kernel cannot confine it (no Landlock or seccomp).
    #[arg(long)]
    allow_unsandboxed: bool,
    /// Skip the operator allow-list (tests of the sandbox only).
    #[arg(long, hide = true)]
    skip_operator_check: bool,
}

#[derive(Debug, clap::Args)]
pub struct ModelUploadArgs {
    #[command(flatten)]
    upload: artifacts::UploadArgs,
    /// The id of an uploaded data set of the team that the model trains on: its check runs forward on two
    /// of its samples.
    #[arg(long)]
    dataset: Uuid,
    /// forward's inputs in order, comma-separated: the data set's tensors x.NAME. Default: its one input.
    /// Not for a composite model (a tar archive of modules), whose composite.json names each module's.
    #[arg(long)]
    inputs: Option<String>,
}

pub fn run(models: Models) -> ExitCode {
    match models {
        Models::Check(args) => check(&args),
        Models::Upload(args) => block_on("models upload", upload(&args)),
        Models::List(args) => block_on("models list", list(&args)),
        Models::Delete(args) => block_on("models delete", artifacts::delete(&args, "/v1/models", "model")),
    }
}

async fn upload(args: &ModelUploadArgs) -> Result<()> {
    let mut route = format!("/v1/models?dataset={}", args.dataset);
    if let Some(inputs) = &args.inputs {
        route += &format!("&inputs={}", encode(inputs));
    }
    args.upload.upload(&route, summary).await
}

/// What the server's check found in the model.
fn summary(model: &Model) -> String {
    let Some(report) = model.checked() else {
        return format!("uploaded model {} ({}): forward({})", model.id, model.name, inputs(model));
    };
    format!(
        "uploaded model {} ({}): {} parameters in {} tensors, forward({}) -> {:?}{}{}{}",
        model.id,
        model.name,
        report.parameters,
        report.parameter_tensors,
        inputs(model),
        report.output_shape,
        if report.batch_norm { ", BatchNorm (statistics per rank)" } else { "" },
        report.memory.as_ref().map_or_else(String::new, step_memory),
        modules(&report.modules),
    )
}

/// A composite model's modules, as `; modules encode_numeric(numeric) -> [2, 32], …, head(encode_numeric,
/// …) -> [2, 3]`; nothing for a model of one file.
fn modules(modules: &[ringtrain_protocol::model::ModuleReport]) -> String {
    if modules.is_empty() {
        return String::new();
    }
    let each: Vec<String> =
        modules.iter().map(|m| format!("{}({}) -> {:?}", m.name, m.inputs.join(", "), m.output_shape)).collect();
    format!("; modules {} (placed on a worker's devices with placement.stages)", each.join(", "))
}

/// What the check measured of a training step, as `; a training step takes 12 MiB + 1.5 MiB per sample`.
fn step_memory(memory: &ModelMemory) -> String {
    use ringtrain_core::memory::human_bytes;
    format!(
        "; a training step takes {} + {} per sample",
        human_bytes(memory.step_fixed_bytes),
        human_bytes(memory.step_per_sample_bytes)
    )
}

async fn list(args: &ListArgs) -> Result<()> {
    let answer = args.connection.client()?.models().await?;
    let columns: [Column<Model>; 6] = [
        ("ID", |m| m.id.to_string()),
        ("NAME", |m| m.name.clone()),
        ("PARAMETERS", |m| m.checked().map_or_else(String::new, |r| r.parameters.to_string())),
        ("INPUTS", inputs),
        ("SIZE", |m| size(m.size_bytes)),
        ("CREATED", |m| created(m.created_at)),
    ];
    artifacts::print_list(args, &answer, &answer.models, "models", &columns)
}

/// forward's inputs, comma-separated (`x` for a plain data set's one input).
fn inputs(model: &Model) -> String {
    if model.inputs.is_empty() {
        "x".to_string()
    } else {
        model.inputs.join(", ")
    }
}

fn check(args: &CheckArgs) -> ExitCode {
    // A fresh private folder unless the caller (the server) made one; kept until the check ends.
    let temporary = match &args.sandbox_dir {
        Some(_) => None,
        None => match tempfile::Builder::new().prefix("ringtrain-check-").tempdir() {
            Ok(dir) => Some(dir),
            Err(err) => {
                eprintln!("models check: error: cannot make its private folder: {err}");
                return ExitCode::FAILURE;
            }
        },
    };
    let private = args.sandbox_dir.clone().or_else(|| temporary.as_ref().map(|d| d.path().to_path_buf()));
    // opened before the sandbox makes /proc/self root's: the check measures the model's steps with it
    let meter = ringtrain_worker::peak_memory::PeakMeter::open();
    let confinement = ringtrain_sandbox::Confinement {
        read: vec![args.model.clone(), args.dataset.clone()],
        write: private.into_iter().chain(meter.as_ref().map(|m| m.descriptor_path())).collect(),
        kept: vec![],
        gpu: false,
        network: ringtrain_sandbox::Network::None,
        limits: ringtrain_sandbox::Limits::model_check(args.max_memory_gib.saturating_mul(1 << 30), args.max_cpu_s),
    };
    let enforcement = if args.allow_unsandboxed {
        ringtrain_sandbox::Enforcement::BestEffort
    } else {
        ringtrain_sandbox::Enforcement::Required
    };
    match ringtrain_sandbox::enter(&confinement, enforcement) {
        Ok(applied) => eprintln!("models check: {applied}"),
        Err(err) => {
            eprintln!("models check: error: {err}");
            return ExitCode::FAILURE;
        }
    }
    // one libtorch thread: the server may run several checks beside its own work
    tch::set_num_threads(1);
    let operators = if args.skip_operator_check { OperatorCheck::Skipped } else { OperatorCheck::Enforced };
    let outcome = ringtrain_worker::model_check::check_with(&args.model, &args.dataset, &args.inputs, operators, meter);
    let (line, status) = match &outcome {
        Ok(report) => (serde_json::to_string(report), ExitCode::SUCCESS),
        Err(refusal) => (serde_json::to_string(refusal), ExitCode::from(EXIT_REFUSED)),
    };
    let mut out = std::io::stdout().lock();
    match line {
        Ok(line) if writeln!(out, "{line}").is_ok() => status,
        _ => ExitCode::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use ringtrain_protocol::model::ModuleReport;

    #[test]
    fn a_composite_models_modules_are_listed_with_what_each_takes_and_makes() {
        let module = |name: &str, inputs: &[&str], shape: &[i64]| ModuleReport {
            name: name.to_string(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            parameters: 10,
            batch_norm: false,
            output_shape: shape.to_vec(),
            memory: None,
        };
        let listed = super::modules(&[module("encode", &["a", "b"], &[2, 8]), module("head", &["encode"], &[2, 3])]);
        assert_eq!(
            listed,
            "; modules encode(a, b) -> [2, 8], head(encode) -> [2, 3] (placed on a worker's devices with placement.stages)"
        );
        assert_eq!(super::modules(&[]), "", "a model of one file lists none");
    }
}
