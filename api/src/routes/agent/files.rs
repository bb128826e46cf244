//! Files an agent moves: rank 0's checkpoint uploads, and the downloads a rank needs to start (a resumed
//! placement's checkpoint, an uploaded dataset, an uploaded model). Nothing is held in memory whole; the
//! server's store (its folder or its bucket: `crate::blobs`) is the one place they live, so a resumed job
//! may land on any node, and an agent needs no credential of the bucket.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Json;
use ringtrain_core::{CheckpointId, DatasetId, FieldError, JobId};
use ringtrain_protocol::rank::CheckpointName;
use ringtrain_protocol::ArchiveParams;
use ringtrain_store::{Checkpoint, NewCheckpoint};

use crate::access::{agent_uses_dataset, assigned_job, rank_zero_job};
use crate::auth::Agent;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiPath, ApiQuery};
use crate::files::{self, PartialFile};
use crate::state::AppState;
use crate::storage::{self, checkpoint_file, find_checkpoint};

/// An upload's `name` must be a trainer checkpoint folder's (`protocol::rank::CheckpointName`).
fn check_name(name: &str) -> Result<(), FieldError> {
    match CheckpointName::parse(name) {
        Some(_) => Ok(()),
        None => {
            Err(FieldError::new("name", format!("{name:?} is not a checkpoint name (epoch-NNNN[-iter-NNNNNNNNNN])")))
        }
    }
}

/// Upload a checkpoint archive (a tar of the trainer's `epoch-NNNN/` directory) and register it.
#[utoipa::path(put, path = "/v1/agent/jobs/{id}/checkpoints/{name}", tag = "agent",
    params(("id" = Uuid, Path), ("name" = String, Path, description = "epoch-NNNN"), ArchiveParams),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "A tar archive"),
    responses((status = 201, body = Checkpoint, description = "Registered; the job's checkpoints beyond the newest few (3 by default) besides its final weights are forgotten"),
        (status = 404),
        (status = 409, description = "The attempt is over"),
        (status = 413, description = "Larger than the checkpoint limit, or past the team's storage quota"),
        (status = 422),
        (status = 507, description = "The server's disk would fall below its reserve of free space")),
    security(("bearer" = [])))]
pub async fn upload_checkpoint(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath((id, name)): ApiPath<(JobId, String)>,
    ApiQuery(params): ApiQuery<ArchiveParams>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, Json<Checkpoint>)> {
    check_name(&name).map_err(|e| ApiError::validation(vec![e]))?;
    let job = rank_zero_job(&state, &agent, id, params.attempt).await?;
    if job.attempt != params.attempt {
        return Err(ApiError::conflict(format!(
            "attempt {} of job {id} is over: the job has moved on",
            params.attempt
        )));
    }
    // The newest checkpoint is every later placement's resume point: its iteration must be one the job has.
    let total = job.effective.as_ref().map_or(i64::MAX as u64, |e| e.total_iterations);
    if params.iteration > total {
        return Err(ApiError::validation(vec![FieldError::new(
            "iteration",
            format!("must be at most the job's {total} iterations (got {})", params.iteration),
        )]));
    }
    let limit = state.config.max_checkpoint_bytes;
    let declared = files::check_declared_length(&headers, limit, "checkpoints")?;
    storage::check_room(&state, job.team_id, declared, "checkpoint").await?;
    let blobs = state.config.blobs();
    let area = storage::checkpoint_area(job.id);
    // One file per placement: a late upload of an older placement never overwrites the newer one's file.
    let kind = if params.r#final { "-final" } else { "" };
    let file_name = format!("{name}{kind}-attempt-{}.tar", params.attempt);
    let partial_path = blobs.partial(&area, &file_name).await?;
    let partial = PartialFile::new(partial_path.clone());
    let written = files::stream_to_file(body, &partial_path, limit, "checkpoints").await?;
    storage::check_quota(&state, job.team_id, written.bytes, "checkpoint").await?;
    let path = blobs.keep(&partial_path, &area, &file_name).await?;
    partial.keep();
    let checkpoint = state
        .store
        .add_checkpoint(NewCheckpoint {
            job_id: job.id,
            attempt: params.attempt,
            epoch: i64::from(params.epoch),
            iteration: params.iteration as i64,
            path: path.clone(),
            size_bytes: written.bytes as i64,
            sha256: written.sha256,
            is_final: params.r#final,
        })
        .await;
    let checkpoint = match checkpoint {
        Ok(checkpoint) => checkpoint,
        Err(err) => {
            blobs.remove(&area, std::iter::once(path.as_str())).await;
            return Err(err.into());
        }
    };
    storage::apply_retention(&state, job.id).await?;
    Ok((StatusCode::CREATED, Json(checkpoint)))
}

/// Download a checkpoint archive: for the agent of rank 0 of the job's current placement.
#[utoipa::path(get, path = "/v1/agent/jobs/{id}/checkpoints/{checkpoint}/archive", tag = "agent",
    params(("id" = Uuid, Path), ("checkpoint" = Uuid, Path)),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>),
        (status = 404)),
    security(("bearer" = [])))]
pub async fn agent_download_checkpoint(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath((id, checkpoint)): ApiPath<(JobId, CheckpointId)>,
) -> ApiResult<Response> {
    let job = state.store.get_job(id).await?.ok_or_else(|| ApiError::not_found(format!("no job {id}")))?;
    assigned_job(&state, &agent, id, job.attempt).await?;
    let checkpoint = find_checkpoint(&state, job.id, checkpoint).await?;
    checkpoint_file(&state, &checkpoint).await
}

/// Download a fork's starting checkpoint (the archive its `init_from` named, pinned when it was submitted):
/// for the agent of rank 0 of the job's current placement.
#[utoipa::path(get, path = "/v1/agent/jobs/{id}/init", tag = "agent", params(("id" = Uuid, Path)),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>),
        (status = 404)),
    security(("bearer" = [])))]
pub async fn agent_download_init(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<JobId>,
) -> ApiResult<Response> {
    let job = state.store.get_job(id).await?.ok_or_else(|| ApiError::not_found(format!("no job {id}")))?;
    let job = rank_zero_job(&state, &agent, id, job.attempt).await?;
    if job.spec.init_from.is_none() {
        return Err(ApiError::not_found(format!("job {id} is not a fork: it has no starting checkpoint")));
    }
    let init = crate::submission::fork::init_archive(&state, job.id);
    state.config.blobs().response(&storage::checkpoint_area(job.id), &init, 0, None).await
}

/// Download an uploaded dataset's safetensors file: only for an agent holding a live rank of a job that
/// trains on it (anything else is 404).
#[utoipa::path(get, path = "/v1/agent/datasets/{id}", tag = "agent", params(("id" = Uuid, Path)),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>),
        (status = 404)),
    security(("bearer" = [])))]
pub async fn agent_download_dataset(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<DatasetId>,
) -> ApiResult<Response> {
    let not_found = || ApiError::not_found(format!("no dataset {id} for this agent's ranks"));
    if !agent_uses_dataset(&state, &agent, id).await? {
        return Err(not_found());
    }
    let dataset = state.store.get_dataset(id).await?.ok_or_else(not_found)?;
    state.config.blobs().response("datasets", &dataset.path, 0, None).await
}

/// Download the uploaded model (TorchScript) a job trains: for an agent holding a rank of the job's current
/// attempt (anything else is 404).
#[utoipa::path(get, path = "/v1/agent/jobs/{id}/model", tag = "agent", params(("id" = Uuid, Path)),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>),
        (status = 404)),
    security(("bearer" = [])))]
pub async fn agent_download_model(
    State(state): State<AppState>,
    agent: Agent,
    ApiPath(id): ApiPath<JobId>,
) -> ApiResult<Response> {
    let job = state.store.get_job(id).await?.ok_or_else(|| ApiError::not_found(format!("no job {id}")))?;
    let job = assigned_job(&state, &agent, id, job.attempt).await?;
    let not_found = || ApiError::not_found(format!("job {id} trains no uploaded model"));
    let model_id = job.spec.model.uploaded.ok_or_else(not_found)?;
    let model = state.store.get_model(model_id).await?.ok_or_else(not_found)?;
    state.config.blobs().response("models", &model.path, 0, None).await
}

#[cfg(test)]
mod tests {
    use super::check_name;

    #[test]
    fn checkpoint_names_are_the_trainers() {
        for good in ["epoch-0007", "epoch-0001-iter-0000000021", "epoch-12345"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["latest", "epoch-7", "epoch-0001-iter-21", "epoch-0001/../x", "epoch-0001-iter-", ""] {
            assert!(check_name(bad).unwrap_err().reason.contains("not a checkpoint name"), "{bad}");
        }
    }
}
