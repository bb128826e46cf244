//! `jobs tag` and `jobs note`: what a team writes about a run beside its spec (`PATCH /v1/jobs/{id}`);
//! `jobs list --tag` and `--search` find runs by them.

use anyhow::Result;
use serde_json::{json, Value};

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
    let job: Value = api.get(&format!("/v1/jobs/{id}")).await?;
    let mut tags: Vec<String> =
        job["tags"].as_array().into_iter().flatten().filter_map(|t| t.as_str().map(str::to_string)).collect();
    if args.remove {
        tags.retain(|t| !args.tags.contains(t));
    } else {
        tags.extend(args.tags.iter().cloned());
    }
    let job: Value = api.patch(&format!("/v1/jobs/{id}"), &json!({ "tags": tags })).await?;
    println!("{id}: tags {}", tags_text(&job));
    Ok(())
}

/// Sets a job's note.
pub async fn note(args: &NoteArgs) -> Result<()> {
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?;
    api.patch::<Value>(&format!("/v1/jobs/{id}"), &json!({ "note": args.text })).await?;
    println!("{id}: note {}", if args.text.is_empty() { "removed" } else { "set" });
    Ok(())
}

/// A job's tags as `a, b` (`none` without).
pub fn tags_text(job: &Value) -> String {
    let tags: Vec<&str> = job["tags"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if tags.is_empty() {
        "none".into()
    } else {
        tags.join(", ")
    }
}
