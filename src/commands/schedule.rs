//! `ringtrain schedule`: the LR-schedule preview of a spec file, nothing trained.

use std::path::PathBuf;
use std::process::ExitCode;

use ringtrain_core::{Effective, FieldError, JobSpec};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The job spec (JSON).
    #[arg(long)]
    spec: PathBuf,
    /// Training samples in the dataset; needed for idx: and uploaded datasets, overrides a built-in size.
    #[arg(long)]
    dataset_size: Option<u64>,
    /// Also list the lr of every iteration.
    #[arg(long)]
    per_iteration: bool,
}

/// Exit code for a spec that does not validate (clap uses 2 for bad arguments too).
const INVALID_SPEC: u8 = 2;

pub fn run(args: Args) -> ExitCode {
    let text = match std::fs::read_to_string(&args.spec) {
        Ok(text) => text,
        Err(err) => {
            eprintln!("error: cannot read {}: {err}", args.spec.display());
            return ExitCode::FAILURE;
        }
    };
    match schedule_json(&text, args.dataset_size, args.per_iteration) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("error: invalid spec {}:", args.spec.display());
            for error in errors {
                eprintln!("  {error}");
            }
            ExitCode::from(INVALID_SPEC)
        }
    }
}

fn schedule_json(text: &str, dataset_size: Option<u64>, per_iteration: bool) -> Result<String, Vec<FieldError>> {
    let spec = JobSpec::parse(text).map_err(|e| vec![e])?;
    let Some(size) = dataset_size.or_else(|| spec.dataset.known_train_size()) else {
        let mut errors = spec.validate().err().unwrap_or_default();
        errors.push(FieldError::new(
            "dataset",
            format!("the size of {} is not known without reading it: pass --dataset-size", spec.dataset),
        ));
        return Err(errors);
    };
    let effective = Effective::new(&spec, size)?;
    Ok(serde_json::to_string_pretty(&effective.render(per_iteration)).expect("a schedule always serialises"))
}
