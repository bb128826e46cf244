//! The files a rank needs before it starts: the uploaded dataset it trains on (downloaded once per node) and,
//! for rank 0 of a resumed placement, the checkpoint it resumes from.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ringtrain_protocol::{Checkpoint, Work};
use serde_json::Value;

use crate::rank::AgentContext;

/// The file of an uploaded dataset, downloaded once per node.
pub(crate) async fn dataset_file(ctx: &AgentContext, work: &Work) -> Result<Option<PathBuf>> {
    let Some(dataset) = work.spec.get("dataset").and_then(Value::as_str) else { return Ok(None) };
    let Ok(id) = dataset.parse::<uuid::Uuid>() else { return Ok(None) };
    let dir = ctx.work_dir.join("datasets");
    tokio::fs::create_dir_all(&dir).await?;
    let path = dir.join(format!("{id}.safetensors"));
    if !path.exists() {
        ctx.client.download(&format!("/v1/agent/datasets/{id}"), &path, None).await?;
    }
    Ok(Some(path))
}

/// Downloads and unpacks the checkpoint a resumed placement starts from; returns the folder for
/// `--resume` (it holds `epoch-NNNN/` and `latest`).
pub(crate) async fn fetch_checkpoint(
    ctx: &AgentContext,
    work: &Work,
    checkpoint: &Checkpoint,
    placement_dir: &Path,
) -> Result<PathBuf> {
    let archive = placement_dir.join("resume.tar");
    let path = format!("/v1/agent/jobs/{}/checkpoints/{}/archive", work.assignment.job_id, checkpoint.id);
    ctx.client.download(&path, &archive, Some(&checkpoint.sha256)).await?;
    let target = placement_dir.join("resume");
    let unpacked = target.clone();
    let name = tokio::task::spawn_blocking(move || -> Result<String> {
        if unpacked.exists() {
            std::fs::remove_dir_all(&unpacked)?;
        }
        std::fs::create_dir_all(&unpacked)?;
        let mut tar = tar::Archive::new(std::fs::File::open(&archive)?);
        tar.unpack(&unpacked).context("cannot unpack the checkpoint archive")?;
        let name = std::fs::read_dir(&unpacked)?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("epoch-"))
            .context("the checkpoint archive holds no epoch-NNNN folder")?;
        std::fs::write(unpacked.join(ringtrain_protocol::rank::LATEST), &name)?;
        std::fs::remove_file(&archive)?;
        Ok(name)
    })
    .await??;
    tracing::info!(checkpoint = %name, epoch = checkpoint.epoch, "resuming");
    Ok(target)
}
