//! `jobs resume` and `jobs fork`: a job run again from a checkpoint, as itself (a failed or cancelled job
//! queued again) or as a new job starting from its weights.

use std::path::PathBuf;

use anyhow::{Context, Result};
use ringtrain_views::jobs::records::Checkpoint;
use serde_json::{json, Value};

use super::manage::ShowArgs;
use crate::commands::connection::Connection;
use crate::commands::ids::{resolve, IdArg, Kind};

#[derive(Debug, clap::Args)]
pub struct ForkArgs {
    /// The job whose checkpoint the new job starts from: its id, or the start of it.
    id: IdArg,
    /// Which checkpoint (its id, or the start of it); default: the final weights, else the newest.
    #[arg(long)]
    checkpoint: Option<IdArg>,
    /// The new job's spec (a JSON file); default: the job's own spec.
    #[arg(long)]
    spec: Option<PathBuf>,
    /// Change a field of the spec: a dotted path and a JSON value (`--set epochs=5 --set lr.base=0.01`;
    /// a value that is not JSON is a string).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    set: Vec<String>,
    /// The new job's name; default: the job's, with `-fork`.
    #[arg(long)]
    name: Option<String>,
    #[command(flatten)]
    connection: Connection,
    /// Print the server's answer as JSON.
    #[arg(long)]
    json: bool,
}

/// Submits a new job that starts from the weights of a checkpoint of another: fine-tuning, or going on
/// with a changed schedule (`init_from` in the spec).
pub async fn fork(args: &ForkArgs) -> Result<()> {
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?;
    let job = api.job(&id.to_string()).await?;
    let checkpoints = api.job_checkpoints(&id.to_string()).await?.checkpoints;
    let checkpoint = pick_checkpoint(&checkpoints, args.checkpoint.as_ref())?;
    let mut spec = match &args.spec {
        Some(file) => {
            let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
            serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?
        }
        None => job.spec.clone(),
    };
    for change in &args.set {
        let (path, text) = change.split_once('=').with_context(|| format!("--set {change}: write PATH=VALUE"))?;
        let value = serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()));
        ringtrain_core::study::set_path(&mut spec, path, value).map_err(|e| anyhow::anyhow!("--set {change}: {e}"))?;
    }
    let name = args.name.clone().unwrap_or_else(|| format!("{}-fork", job.name.as_deref().unwrap_or("job")));
    let fields = spec.as_object_mut().context("the spec is not a JSON object")?;
    fields.insert("name".into(), name.into());
    fields.insert("init_from".into(), json!({"checkpoint": checkpoint.id}));
    let answer = api.submit_job(&spec).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        println!(
            "submitted {} ({}): {}, starting from the weights of {} of job {id}",
            answer.id,
            answer.name.as_deref().unwrap_or("unnamed"),
            answer.state.as_str(),
            checkpoint.name,
        );
    }
    Ok(())
}

/// The checkpoint `wanted` names (a unique start of its id), or the final weights, else the newest.
fn pick_checkpoint<'a>(checkpoints: &'a [Checkpoint], wanted: Option<&IdArg>) -> Result<&'a Checkpoint> {
    match wanted {
        Some(prefix) => {
            let matching: Vec<&Checkpoint> =
                checkpoints.iter().filter(|c| c.id.to_string().starts_with(&prefix.to_string())).collect();
            match matching.as_slice() {
                [one] => Ok(one),
                [] => anyhow::bail!("the job has no checkpoint {prefix} (`jobs show` lists them)"),
                _ => anyhow::bail!(
                    "{prefix} is the start of {} of the job's checkpoints: give more of it",
                    matching.len()
                ),
            }
        }
        None => checkpoints
            .iter()
            .max_by_key(|c| (c.is_final, c.iteration))
            .context("the job has no checkpoint to start from"),
    }
}

/// Queues a failed or cancelled job again; it resumes from its newest checkpoint.
pub async fn resume(args: &ShowArgs) -> Result<()> {
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?;
    let job = api.resume_job(&id.to_string()).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&job)?);
    } else {
        println!("{id}: {} (it resumes from its newest checkpoint)", job.state.as_str());
    }
    Ok(())
}
