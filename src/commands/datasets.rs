//! `ringtrain datasets upload | list | delete`: the team's uploaded data sets (safetensors), as
//! `POST /v1/datasets`, `GET /v1/datasets` and `DELETE /v1/datasets/{id}` handle them.

use std::process::ExitCode;

use anyhow::Result;
use serde_json::Value;

use crate::commands::artifacts::{self, created, size, text, Column, DeleteArgs, ListArgs, UploadArgs};
use crate::commands::block_on;

#[derive(Debug, clap::Subcommand)]
pub enum Datasets {
    /// Upload a safetensors data set: `x` (or named inputs `x.NAME`) and labels `y`, optionally `x_test`
    /// and `y_test`. The server checks every tensor and prints what it found.
    Upload(UploadArgs),
    /// The team's data sets, newest first.
    List(ListArgs),
    /// Delete a data set that no queued or running job trains on.
    Delete(DeleteArgs),
}

pub fn run(datasets: Datasets) -> ExitCode {
    match datasets {
        Datasets::Upload(args) => block_on("datasets upload", args.upload("/v1/datasets", summary)),
        Datasets::List(args) => block_on("datasets list", list(&args)),
        Datasets::Delete(args) => block_on("datasets delete", artifacts::delete(&args, "/v1/datasets", "dataset")),
    }
}

/// What the server found in the data set.
fn summary(dataset: &Value) -> String {
    format!(
        "uploaded dataset {} ({}): {} training samples, {}, {}",
        text(dataset, "id"),
        text(dataset, "name"),
        dataset["train_samples"],
        inputs(dataset),
        labels(dataset)
    )
}

async fn list(args: &ListArgs) -> Result<()> {
    let columns: [Column; 7] = [
        ("ID", |d| text(d, "id")),
        ("NAME", |d| text(d, "name")),
        ("SAMPLES", |d| d["train_samples"].to_string()),
        ("INPUTS", inputs),
        ("LABELS", labels),
        ("SIZE", size),
        ("CREATED", created),
    ];
    artifacts::list(args, "/v1/datasets", "datasets", &columns).await
}

/// Its inputs: `x [1, 28, 28]`, or the named ones.
fn inputs(dataset: &Value) -> String {
    match dataset["inputs"].as_array().filter(|named| !named.is_empty()) {
        Some(named) => named.iter().map(|input| format!("x.{}", text(input, "name"))).collect::<Vec<_>>().join(" "),
        None => format!("x {}", dataset["sample_shape"]).replace(',', ", "),
    }
}

/// `3 classes`, or `values`.
fn labels(dataset: &Value) -> String {
    match dataset["num_classes"].as_i64() {
        Some(classes) if classes > 0 => format!("{classes} classes"),
        _ => "values".to_string(),
    }
}
