//! `jobs tag` and `jobs note`: what a team writes about a run beside its spec (`PATCH /v1/jobs/{id}`);
//! `jobs list --tag` and `--search` find runs by them.

use anyhow::Result;
use serde_json::json;

use crate::commands::connection::Connection;
use crate::commands::ids::{resolve, IdArg, Kind};

#[derive(Debug, clap::Args)]
pub struct TagArgs {
    /// The job's id, or the start of it.
    id: IdArg,
    /// Tags to add (letters, digits and `_ . : / = + -`).
    #[arg(required = true)]
    tags: Vec<String>,
    /// Take these tags off instead.
    #[arg(long)]
    remove: bool,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, clap::Args)]
pub struct NoteArgs {
    /// The job's id, or the start of it.
    id: IdArg,
    /// The note (replaces the one there; "" removes it).
    text: String,
    #[command(flatten)]
    connection: Connection,
}

/// Adds tags to a job (or takes them off), keeping the others.
pub async fn tag(args: &TagArgs) -> Result<()> {
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?;
    let mut tags = api.job(&id.to_string()).await?.tags;
    if args.remove {
        tags.retain(|t| !args.tags.contains(t));
    } else {
        tags.extend(args.tags.iter().cloned());
    }
    let job = api.annotate_job(&id.to_string(), &json!({ "tags": tags })).await?;
    println!("{id}: tags {}", tags_text(&job.tags));
    Ok(())
}

/// Sets a job's note.
pub async fn note(args: &NoteArgs) -> Result<()> {
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?;
    api.annotate_job(&id.to_string(), &json!({ "note": args.text })).await?;
    println!("{id}: note {}", if args.text.is_empty() { "removed" } else { "set" });
    Ok(())
}

/// A job's tags as `a, b` (`none` without).
pub fn tags_text(tags: &[String]) -> String {
    if tags.is_empty() {
        "none".into()
    } else {
        tags.join(", ")
    }
}
