//! `ringtrain datasets upload` of a file larger than one part: `POST /v1/datasets/uploads`, each missing
//! part `PUT` with its sha256 (a failed part is sent again, up to 4 tries), then `complete`. An upload
//! that stops (the network, this process) is taken up again with `--resume ID`: the server says which
//! parts it holds, and only the others are sent.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use reqwest::Method;
use ringtrain_client::ApiClient;
use ringtrain_views::artifacts::Dataset;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

/// One part's whole call.
const PART_TIMEOUT: Duration = Duration::from_secs(600);
/// Joining and checking a whole data set.
const COMPLETE_TIMEOUT: Duration = Duration::from_secs(3600);
const TRIES: u32 = 4;

/// Uploads `file` as data set `name` in parts of `part_bytes` (or goes on with upload `resume`): the data set.
pub async fn upload_in_parts(
    api: &ApiClient,
    file: &Path,
    name: &str,
    part_bytes: u64,
    resume: Option<uuid::Uuid>,
) -> Result<Dataset> {
    let mut opened = tokio::fs::File::open(file).await.with_context(|| format!("cannot read {}", file.display()))?;
    let size = opened.metadata().await.with_context(|| format!("cannot read {}", file.display()))?.len();
    let upload = match resume {
        Some(id) => {
            let upload = api.upload(&id.to_string()).await?;
            if u64::try_from(upload.size_bytes).ok() != Some(size) {
                bail!(
                    "upload {id} is of {} bytes; {} has {size}: resume it with the file it was started with",
                    upload.size_bytes,
                    file.display()
                );
            }
            upload
        }
        None => api.start_upload(name, size, part_bytes).await?,
    };
    let id = upload.id.to_string();
    let part_bytes = u64::try_from(upload.part_bytes).context("the server's part size is negative")?;
    let parts = upload.parts;
    let missing: Vec<u64> = upload.missing.iter().filter_map(|&n| u64::try_from(n).ok()).collect();
    eprintln!("upload {id}: {} of {parts} parts to send", missing.len());
    for (done, number) in missing.iter().enumerate() {
        let offset = (number - 1) * part_bytes;
        let length = part_bytes.min(size - offset);
        let mut bytes = vec![0u8; length as usize];
        opened.seek(std::io::SeekFrom::Start(offset)).await?;
        opened.read_exact(&mut bytes).await.with_context(|| format!("cannot read {}", file.display()))?;
        let checksum: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        send_part(api, &id, *number, bytes, &checksum).await.with_context(|| {
            format!(
                "the upload stopped at part {number} of {parts}; go on with: ringtrain datasets upload {} --resume {id}",
                file.display()
            )
        })?;
        eprintln!("upload {id}: part {number} sent ({} of {parts})", done + 1);
    }
    let path = format!("/v1/datasets/uploads/{id}/complete");
    Ok(api.call(Method::POST, &path, Some(&json!({})), COMPLETE_TIMEOUT).await?)
}

/// PUTs one part, trying again (after 1, 2, 4 s) when the network or the server failed, not when the
/// server refused the part.
async fn send_part(api: &ApiClient, id: &str, number: u64, bytes: Vec<u8>, checksum: &str) -> Result<()> {
    let path = format!("/v1/datasets/uploads/{id}/parts/{number}");
    let mut wait = Duration::from_secs(1);
    let mut attempt = 1;
    loop {
        let request = api
            .request(Method::PUT, &path)
            .header("content-type", "application/octet-stream")
            .header("x-checksum-sha256", checksum)
            .body(bytes.clone())
            .timeout(PART_TIMEOUT);
        match api.send(request).await {
            Ok(_) => return Ok(()),
            Err(err) if attempt < TRIES && err.status.is_none_or(|s| s.is_server_error()) => {
                eprintln!("upload {id}: part {number} failed ({err}); again in {}s", wait.as_secs());
                tokio::time::sleep(wait).await;
                wait *= 2;
                attempt += 1;
            }
            Err(err) => return Err(err.into()),
        }
    }
}
