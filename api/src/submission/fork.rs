//! A fork's starting point (`init_from`): the checkpoint of another job of the team whose weights a new job
//! starts from. Checked at submission (the team's, of the same model), then *pinned*: its archive is
//! copied beside the new job's own checkpoints as `init.tar` (hard-linked in the server's folder where the
//! file system allows; the bucket's own copy in a bucket), so the fork starts as submitted even when the checkpoint is later pruned by its job's
//! retention or deleted with its job's artifacts. Rank 0 of the fork's first placement downloads it
//! (`GET /v1/agent/jobs/{id}/init`); a placement that resumes from the fork's own checkpoint does not.

use ringtrain_core::{FieldError, JobId, JobSpec};
use ringtrain_store::{Checkpoint, Job};

use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::storage::checkpoint_area;

/// The file a fork's starting checkpoint is pinned as, in the job's checkpoint folder.
pub const INIT_ARCHIVE: &str = "init.tar";

/// Where the pinned starting checkpoint of job `job` is stored (a path in the server's folder, or an
/// `s3://` location in its bucket).
pub fn init_archive(state: &AppState, job: JobId) -> String {
    match &state.config.store_bucket {
        None => state.config.data_dir.join(checkpoint_area(job)).join(INIT_ARCHIVE).to_string_lossy().into_owned(),
        Some(bucket) => format!("{}/{}/{INIT_ARCHIVE}", bucket.url(), checkpoint_area(job)),
    }
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
    let (from, to) = (checkpoint_area(checkpoint.job_id), checkpoint_area(job));
    // kept where `init_archive` says, wherever the checkpoint lies (one kept in the folder before the
    // server moved to a bucket is uploaded)
    state.config.blobs().copy(&from, &checkpoint.path, &to, INIT_ARCHIVE).await?;
    Ok(())
}
