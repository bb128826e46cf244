//! `ringtrain models check`: the check of an uploaded TorchScript model against a data set, in a process of
//! its own. The server runs it on every upload (so libtorch and a hostile file never share the server's
//! process) and reads its one line of JSON; users can run it before uploading.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use ringtrain_protocol::model::EXIT_REFUSED;

#[derive(Debug, clap::Subcommand)]
pub enum Models {
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
}

pub fn run(models: Models) -> ExitCode {
    match models {
        Models::Check(args) => check(&args),
    }
}

fn check(args: &CheckArgs) -> ExitCode {
    let bytes = args.max_memory_gib.saturating_mul(1 << 30);
    let limit = rustix::process::Rlimit { current: Some(bytes), maximum: Some(bytes) };
    if let Err(err) = rustix::process::setrlimit(rustix::process::Resource::As, limit) {
        eprintln!("models check: error: cannot limit its memory: {err}");
        return ExitCode::FAILURE;
    }
    // one libtorch thread: the server may run several checks beside its own work
    tch::set_num_threads(1);
    let outcome = ringtrain_worker::model_check::check(&args.model, &args.dataset, &args.inputs);
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
