//! What `ringtrain datasets` and `ringtrain models` share: uploading a file to the team's artifacts,
//! listing them as a table, deleting one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use ringtrain_client::ApiClient;
use serde_json::Value;
use uuid::Uuid;

use crate::commands::connection::{encode, Connection};
use crate::commands::jobs::manage::table;

/// An upload's whole call: a data set of gigabytes, or a model whose check runs up to two minutes.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(3600);

/// A column of a list: its header, and its cell for one item.
pub type Column = (&'static str, fn(&Value) -> String);

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
    pub async fn upload(&self, route: &str, summary: fn(&Value) -> String) -> Result<()> {
        let api = self.connection.client()?;
        let name = self.name.clone().unwrap_or_else(|| default_name(&self.file));
        let separator = if route.contains('?') { '&' } else { '?' };
        let stored = upload(&api, &format!("{route}{separator}name={}", encode(&name)), &self.file).await?;
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
async fn upload(api: &ApiClient, route: &str, file: &Path) -> Result<Value> {
    let opened = tokio::fs::File::open(file).await.with_context(|| format!("cannot read {}", file.display()))?;
    let length = opened.metadata().await.with_context(|| format!("cannot read {}", file.display()))?.len();
    Ok(api.post_file(route, opened, length, UPLOAD_TIMEOUT).await?)
}

/// The name an upload gets when none is given: the file's name without its extension.
pub fn default_name(file: &Path) -> String {
    file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "upload".to_string())
}

/// Prints `GET route`'s list under `key` as a table of `columns` (header, cell of one item), or the whole
/// answer with `--json`.
pub async fn list(args: &ListArgs, route: &str, key: &str, columns: &[Column]) -> Result<()> {
    let answer: Value = args.connection.client()?.get(route).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(());
    }
    let items = answer[key].as_array().cloned().unwrap_or_default();
    let headers: Vec<&str> = columns.iter().map(|(header, _)| *header).collect();
    let rows: Vec<Vec<String>> =
        items.iter().map(|item| columns.iter().map(|(_, cell)| cell(item)).collect()).collect();
    print!("{}", table(&headers, &rows));
    if items.is_empty() {
        println!("(no {key})");
    }
    Ok(())
}

/// `DELETE route/ID`, then says so.
pub async fn delete(args: &DeleteArgs, route: &str, what: &str) -> Result<()> {
    args.connection.client()?.delete(&format!("{route}/{}", args.id)).await?;
    println!("deleted {what} {}", args.id);
    Ok(())
}

/// A text field of an artifact.
pub fn text(item: &Value, field: &str) -> String {
    item[field].as_str().unwrap_or("").to_string()
}

/// A size in bytes for people: 91.6 KB, 12.0 MB.
pub fn size(item: &Value) -> String {
    let bytes = item["size_bytes"].as_f64().unwrap_or(0.0);
    match bytes {
        b if b >= 1e9 => format!("{:.1} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        b => format!("{:.1} KB", b / 1e3),
    }
}

/// When it was uploaded, to the second.
pub fn created(item: &Value) -> String {
    text(item, "created_at").chars().take(19).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn sizes_read_in_decimal_units_and_names_default_to_the_file_stem() {
        let sized = |bytes: u64| super::size(&json!({ "size_bytes": bytes }));
        assert_eq!(
            (sized(91_584), sized(12_000_000), sized(3_500_000_000)),
            ("91.6 KB".into(), "12.0 MB".into(), "3.5 GB".into())
        );
        assert_eq!(super::default_name(std::path::Path::new("examples/multi-input/model.pt")), "model");
    }
}
