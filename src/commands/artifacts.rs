//! What `ringtrain datasets` and `ringtrain models` share: uploading a file to the team's artifacts,
//! listing them as a table, deleting one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use ringtrain_client::ApiClient;
use serde::de::DeserializeOwned;
use serde::Serialize;
use uuid::Uuid;

use crate::commands::connection::{encode, Connection};
use crate::commands::jobs::manage::table;

/// An upload's whole call: a data set of gigabytes, or a model whose check runs up to two minutes.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(3600);

/// A column of a list: its header, and its cell for one item.
pub type Column<T> = (&'static str, fn(&T) -> String);

#[derive(Debug, clap::Args)]
pub struct UploadArgs {
    /// The file.
    pub file: PathBuf,
    /// Its name on the server (default: the file's name without its extension).
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub connection: Connection,
    /// Print the server's answer as JSON.
    #[arg(long)]
    pub json: bool,
}

impl UploadArgs {
    /// Uploads the file to `route` (with `name=` added to its query) and prints what was stored: the JSON
    /// with `--json`, else its `summary`.
    pub async fn upload<T: DeserializeOwned + Serialize>(&self, route: &str, summary: fn(&T) -> String) -> Result<()> {
        let api = self.connection.client()?;
        let name = self.name.clone().unwrap_or_else(|| default_name(&self.file));
        let separator = if route.contains('?') { '&' } else { '?' };
        let stored: T = upload(&api, &format!("{route}{separator}name={}", encode(&name)), &self.file).await?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&stored)?);
        } else {
            println!("{}", summary(&stored));
        }
        Ok(())
    }
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// Print the server's answer as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    /// Its id.
    pub id: Uuid,
    #[command(flatten)]
    pub connection: Connection,
}

/// POSTs `file` to `route` (which carries the query), streamed from disk: the stored artifact.
async fn upload<T: DeserializeOwned>(api: &ApiClient, route: &str, file: &Path) -> Result<T> {
    let opened = tokio::fs::File::open(file).await.with_context(|| format!("cannot read {}", file.display()))?;
    let length = opened.metadata().await.with_context(|| format!("cannot read {}", file.display()))?.len();
    Ok(api.post_file(route, opened, length, UPLOAD_TIMEOUT).await?)
}

/// The name an upload gets when none is given: the file's name without its extension.
pub fn default_name(file: &Path) -> String {
    file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "upload".to_string())
}

/// Prints `items` (the `noun` of `answer`) as a table of `columns` (header, cell of one item), or the whole
/// answer with `--json`.
pub fn print_list<T>(
    args: &ListArgs,
    answer: &impl Serialize,
    items: &[T],
    noun: &str,
    columns: &[Column<T>],
) -> Result<()> {
    if args.json {
        println!("{}", serde_json::to_string_pretty(answer)?);
        return Ok(());
    }
    let headers: Vec<&str> = columns.iter().map(|(header, _)| *header).collect();
    let rows: Vec<Vec<String>> =
        items.iter().map(|item| columns.iter().map(|(_, cell)| cell(item)).collect()).collect();
    print!("{}", table(&headers, &rows));
    if items.is_empty() {
        println!("(no {noun})");
    }
    Ok(())
}

/// `DELETE route/ID`, then says so.
pub async fn delete(args: &DeleteArgs, route: &str, what: &str) -> Result<()> {
    args.connection.client()?.delete(&format!("{route}/{}", args.id)).await?;
    println!("deleted {what} {}", args.id);
    Ok(())
}

/// A size in bytes for people: 91.6 KB, 12.0 MB.
pub fn size(bytes: i64) -> String {
    match bytes as f64 {
        b if b >= 1e9 => format!("{:.1} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        b => format!("{:.1} KB", b / 1e3),
    }
}

/// When it was uploaded, to the second.
pub fn created(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%S").to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_in_decimal_units_and_names_default_to_the_file_stem() {
        let sized = super::size;
        assert_eq!(
            (sized(91_584), sized(12_000_000), sized(3_500_000_000)),
            ("91.6 KB".into(), "12.0 MB".into(), "3.5 GB".into())
        );
        assert_eq!(super::default_name(std::path::Path::new("examples/multi-input/model.pt")), "model");
    }
}
