//! What a finished (or running) job leaves behind, for its team: its checkpoints (listed, downloaded whole
//! or one file of weights at a time) and deleting them with its ranks' output.

use axum::extract::State;
use axum::response::Response;
use axum::Json;
use ringtrain_core::{CheckpointId, JobId};
use ringtrain_protocol::rank::checkpoint_files;

use crate::access::team_job;
use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiPath;
use crate::state::AppState;
use crate::storage::{checkpoint_area, checkpoint_file, find_checkpoint};

pub use ringtrain_views::jobs::records::CheckpointList;

/// The job's checkpoints, oldest first; `is_final` marks the finished job's weights.
#[utoipa::path(get, path = "/v1/jobs/{id}/checkpoints", tag = "jobs", params(("id" = Uuid, Path)),
    responses((status = 200, body = CheckpointList),
        (status = 404)),
    security(("bearer" = [])))]
pub async fn job_checkpoints(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<JobId>,
) -> ApiResult<Json<CheckpointList>> {
    let job = team_job(&state, &user, id).await?;
    Ok(Json(CheckpointList { checkpoints: state.store.list_checkpoints(job.id).await? }))
}

pub use ringtrain_views::jobs::records::DeletedCheckpoints;

/// Delete a finished job's artifacts: its checkpoints, final weights too, freeing the team's storage, and
/// its ranks' output (its record, events and metrics stay). Refused (409) while the job may still resume from them.
#[utoipa::path(delete, path = "/v1/jobs/{id}/artifacts", tag = "jobs", params(("id" = Uuid, Path)),
    responses((status = 200, body = DeletedCheckpoints),
        (status = 403),
        (status = 404),
        (status = 409, description = "The job has not finished")),
    security(("bearer" = [])))]
pub async fn delete_job_artifacts(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<JobId>,
) -> ApiResult<Json<DeletedCheckpoints>> {
    user.require_write()?;
    let job = team_job(&state, &user, id).await?;
    if !job.state.is_terminal() {
        return Err(ApiError::conflict(format!("job {id} is {}: it may still resume from its checkpoints", job.state)));
    }
    let deleted = state.store.delete_checkpoints(job.id).await?;
    state.config.blobs().remove(&checkpoint_area(job.id), deleted.iter().map(|c| c.path.as_str())).await;
    let freed_bytes = deleted.iter().map(|c| c.size_bytes).sum();
    let log_lines = state.store.delete_logs(job.id).await?;
    Ok(Json(DeletedCheckpoints { deleted: deleted.len(), freed_bytes, log_lines }))
}

/// Download a checkpoint archive of one of your team's jobs (a tar of model, optimizer and BatchNorm
/// safetensors files and state.json).
#[utoipa::path(get, path = "/v1/jobs/{id}/checkpoints/{checkpoint}/archive", tag = "jobs",
    params(("id" = Uuid, Path), ("checkpoint" = Uuid, Path)),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>),
        (status = 404)),
    security(("bearer" = [])))]
pub async fn download_checkpoint(
    State(state): State<AppState>,
    user: User,
    ApiPath((id, checkpoint)): ApiPath<(JobId, CheckpointId)>,
) -> ApiResult<Response> {
    let job = team_job(&state, &user, id).await?;
    let checkpoint = find_checkpoint(&state, job.id, checkpoint).await?;
    checkpoint_file(&state, &checkpoint).await
}

/// A file of a checkpoint's weights to take away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub enum WeightsFile {
    /// An uploaded model with the checkpoint's weights and rank 0's BatchNorm statistics, as TorchScript
    /// (`torch.jit.load` reads it).
    #[serde(rename = "model.pt")]
    TorchScript,
    /// The weights (and rank 0's BatchNorm statistics) as a safetensors state dict, named as PyTorch's
    /// `state_dict()` names them for an uploaded model.
    #[serde(rename = "model.safetensors")]
    Safetensors,
}

impl WeightsFile {
    fn name(self) -> &'static str {
        match self {
            WeightsFile::TorchScript => checkpoint_files::SCRIPT,
            WeightsFile::Safetensors => checkpoint_files::MODEL,
        }
    }
}

/// Download one file of a checkpoint of one of your team's jobs: `model.pt` (an uploaded model as
/// TorchScript, with the checkpoint's weights) or `model.safetensors` (the weights).
#[utoipa::path(get, path = "/v1/jobs/{id}/checkpoints/{checkpoint}/weights/{file}", tag = "jobs",
    params(("id" = Uuid, Path), ("checkpoint" = Uuid, Path),
        ("file" = String, Path, description = "model.pt or model.safetensors")),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>),
        (status = 404, description = "No such job, checkpoint or file (model.pt exists for uploaded models only)")),
    security(("bearer" = [])))]
pub async fn download_weights(
    State(state): State<AppState>,
    user: User,
    ApiPath((id, checkpoint, file)): ApiPath<(JobId, CheckpointId, String)>,
) -> ApiResult<Response> {
    let file = serde_json::from_value::<WeightsFile>(serde_json::Value::String(file.clone()))
        .map_err(|_| ApiError::not_found(format!("no file {file:?}: model.pt or model.safetensors")))?;
    let job = team_job(&state, &user, id).await?;
    let checkpoint = find_checkpoint(&state, job.id, checkpoint).await?;
    let area = checkpoint_area(checkpoint.job_id);
    let Some((offset, length)) = find_member(&state, &area, &checkpoint.path, file.name()).await? else {
        return Err(ApiError::not_found(format!(
            "checkpoint {} has no {} (TorchScript is saved for uploaded models of one file only; a composite model's weights are model.safetensors)",
            checkpoint.id,
            file.name()
        )));
    };
    // served from inside the archive: no copy on the server's disk per download
    state.config.blobs().response(&area, &checkpoint.path, offset, Some(length)).await
}

/// Where the archive's `<folder>/<name>` lies in it (the offset of its data and its length); `None` when the
/// archive has none. The archive is uncompressed tar, so a member is a plain range of it: its headers are
/// read one block at a time, never the archive whole (it may lie in a bucket).
async fn find_member(state: &AppState, area: &str, stored: &str, name: &str) -> ApiResult<Option<(u64, u64)>> {
    let blobs = state.config.blobs();
    let size = blobs.size(area, stored).await?;
    let mut offset = 0u64;
    // a GNU long name or a PAX header names the entry that follows it
    let mut long_name: Option<Vec<u8>> = None;
    while offset + BLOCK <= size {
        let block = blobs.read(area, stored, offset..offset + BLOCK).await?;
        if block.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let header = tar::Header::from_byte_slice(&block);
        if header.cksum().ok() != Some(checksum(&block)) {
            return Err(damaged(offset));
        }
        let length = header.entry_size().map_err(ApiError::internal)?;
        let data = offset + BLOCK;
        let entry_type = header.entry_type();
        if entry_type.is_gnu_longname() || entry_type.is_pax_local_extensions() {
            let bytes = blobs.read(area, stored, data..data + length).await?;
            let named = if entry_type.is_gnu_longname() {
                Some(bytes.iter().copied().take_while(|&b| b != 0).collect())
            } else {
                pax_path(&bytes)
            };
            long_name = named.or(long_name);
        } else {
            let path = long_name.take().unwrap_or_else(|| header.path_bytes().into_owned());
            let file_name = path.rsplit(|&b| b == b'/').find(|part| !part.is_empty()).unwrap_or(&[]);
            if entry_type.is_file() && file_name == name.as_bytes() {
                return Ok(Some((data, length)));
            }
        }
        offset = data + length.div_ceil(BLOCK) * BLOCK;
    }
    // past the last entry without an end marker is a tar; a header cut short is not
    if offset < size {
        return Err(damaged(offset));
    }
    Ok(None)
}

/// A tar header's checksum: the sum of its bytes, its own checksum field counted as spaces.
fn checksum(block: &[u8]) -> u32 {
    block.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { 32 } else { u32::from(b) }).sum()
}

/// A stored archive that is not a tar: the server's own file damaged, so a 500 that says where.
fn damaged(offset: u64) -> ApiError {
    ApiError::internal_msg(format!("the checkpoint archive is damaged at byte {offset}"))
}

/// A tar archive's block.
const BLOCK: u64 = 512;

/// The `path` a PAX extended header records, if it records one.
fn pax_path(bytes: &[u8]) -> Option<Vec<u8>> {
    let extensions = tar::PaxExtensions::new(bytes).collect::<Result<Vec<_>, _>>().ok()?;
    extensions.iter().find(|e| e.key_bytes() == b"path").map(|e| e.value_bytes().to_vec())
}
