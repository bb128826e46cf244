//! A fork's starting point (`init_from`): the checkpoint of another job of the team whose weights a new job
//! starts from. Checked at submission (the team's, of the same model), then *pinned*: its archive is
//! hard-linked (copied where the file system cannot link) beside the new job's own checkpoints as
//! `init.tar`, so the fork starts as submitted even when the checkpoint is later pruned by its job's
//! retention or deleted with its job's artifacts. Rank 0 of the fork's first placement downloads it
//! (`GET /v1/agent/jobs/{id}/init`); a placement that resumes from the fork's own checkpoint does not.

use std::path::PathBuf;

use ringtrain_core::{FieldError, JobId, JobSpec};
use ringtrain_store::{Checkpoint, Job};

use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The file a fork's starting checkpoint is pinned as, in the job's checkpoint folder.
pub const INIT_ARCHIVE: &str = "init.tar";

/// The pinned starting checkpoint of job `job`.
pub fn init_archive(state: &AppState, job: JobId) -> PathBuf {
    state.config.data_dir.join("checkpoints").join(job.to_string()).join(INIT_ARCHIVE)
}

/// The checkpoint `init_from` names, when it is one of the caller's team's and its job trains the model
/// `spec` trains (422 at `init_from.checkpoint` otherwise: another model's weights would not load).
pub async fn check_init(state: &AppState, user: &User, spec: &JobSpec) -> ApiResult<Option<Checkpoint>> {
    let Some(init) = &spec.init_from else { return Ok(None) };
    let id = init.checkpoint;
    let fail = |reason: String| ApiError::validation(vec![FieldError::new("init_from.checkpoint", reason)]);
    let Some(checkpoint) = state.store.get_checkpoint(id).await? else {
        return Err(fail(format!("no checkpoint {id}")));
    };
    let source = state.store.get_job(checkpoint.job_id).await?.filter(|job| user.owns(job.team_id));
    let Some(source) = source else { return Err(fail(format!("no checkpoint {id}"))) };
    if source.spec.model != spec.model {
        let model = |spec: &JobSpec| serde_json::to_string(&spec.model).unwrap_or_else(|_| spec.model.label());
        return Err(fail(format!(
            "checkpoint {id} holds the weights of model {} (job {}); this spec trains {}: they would not load",
            model(&source.spec),
            source.name.as_deref().map_or_else(|| source.id.to_string(), str::to_string),
            model(spec),
        )));
    }
    Ok(Some(checkpoint))
}

/// Pins the starting checkpoint of `job`, a fork just stored (nothing for a job that is not one). Should the
/// checkpoint have gone since it was checked, the job is cancelled, saying so, and the refusal returned.
pub async fn pin_for(state: &AppState, job: &Job) -> ApiResult<()> {
    let Some(init) = &job.spec.init_from else { return Ok(()) };
    let pinned = match state.store.get_checkpoint(init.checkpoint).await? {
        Some(checkpoint) => pin_init(state, job.id, &checkpoint).await,
        None => Err(ApiError::conflict(format!("checkpoint {} was deleted as the job was submitted", init.checkpoint))),
    };
    if pinned.is_err() {
        let reason = format!("its starting checkpoint {} could not be kept beside it", init.checkpoint);
        state.store.cancel_job(job.id, &reason).await?;
    }
    pinned
}

/// Pins `checkpoint` as job `job`'s starting point (see the module's doc).
async fn pin_init(state: &AppState, job: JobId, checkpoint: &Checkpoint) -> ApiResult<()> {
    let folder = state.config.data_dir.join("checkpoints").join(checkpoint.job_id.to_string());
    let source = crate::files::under(&folder, std::path::Path::new(&checkpoint.path)).await?;
    let target = init_archive(state, job);
    let dir = target.parent().expect("a job's checkpoint folder");
    tokio::fs::create_dir_all(dir).await.map_err(ApiError::internal)?;
    if tokio::fs::hard_link(&source, &target).await.is_err() {
        // another file system, or one without links: a copy, made under a temporary name
        let partial = dir.join(format!("{INIT_ARCHIVE}.{}.part", uuid::Uuid::new_v4()));
        tokio::fs::copy(&source, &partial).await.map_err(ApiError::internal)?;
        tokio::fs::rename(&partial, &target).await.map_err(ApiError::internal)?;
    }
    Ok(())
}
