//! What every user upload (datasets, models) does before its contents are checked: the request's form
//! (octet-stream, a name), room under the team's quota and on the disk, the body streamed to a partial file
//! under a size limit; and, once checked, the file kept in the server's store (`crate::blobs`). Also the rule both kinds share on
//! delete: nothing a queued or running job of the team uses may go.

use std::path::PathBuf;

use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};
use ringtrain_core::{JobSpec, JobState, TeamId};
use ringtrain_store::JobFilter;
use uuid::Uuid;

use crate::error::{ApiError, ApiResult, ProblemType};
use crate::files::{self, PartialFile, Written};
use crate::state::AppState;
use crate::storage;

/// A kind of upload: `datasets` or `models`.
#[derive(Debug, Clone, Copy)]
pub struct UploadKind {
    /// One of them, in messages: "dataset".
    pub what: &'static str,
    /// The folder under the data directory, and the plural in messages: "datasets".
    pub folder: &'static str,
    /// The stored file's extension: "safetensors".
    pub extension: &'static str,
    /// What the body must be, for the 415 message: "the safetensors file".
    pub body: &'static str,
}

/// An upload streamed to its partial file, not yet checked.
#[derive(Debug)]
pub struct Received {
    pub id: Uuid,
    pub partial_path: PathBuf,
    partial: PartialFile,
    pub written: Written,
    kind: UploadKind,
}

impl Received {
    /// Keeps the checked upload in the server's store; returns its stored location.
    pub async fn keep(self, state: &AppState) -> ApiResult<String> {
        let name = format!("{}.{}", self.id, self.kind.extension);
        let kept = state.config.blobs().keep(&self.partial_path, self.kind.folder, &name).await?;
        self.partial.keep();
        Ok(kept)
    }
}

/// The request's form: an octet-stream body and a name as every name is (`validate::name_problems`).
pub fn check_form(headers: &HeaderMap, name: &str, kind: UploadKind) -> ApiResult<()> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !content_type.starts_with("application/octet-stream") {
        return Err(ApiError::new(
            ProblemType::UnsupportedMediaType,
            format!("send {} as the body with Content-Type: application/octet-stream", kind.body),
        ));
    }
    if let Some(reason) = ringtrain_core::validate::name_problems(name).into_iter().next() {
        return Err(ApiError::field(ProblemType::BadQueryParameter, "name", reason));
    }
    Ok(())
}

/// Streams the body to a partial file under `limit` bytes, after checking the declared length against the
/// limit, the team's quota and the disk, and the real length against the quota again.
pub async fn receive(
    state: &AppState,
    team: TeamId,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
    kind: UploadKind,
) -> ApiResult<Received> {
    let declared = files::check_declared_length(headers, limit, kind.folder)?;
    storage::check_room(state, team, declared, kind.what).await?;
    let id = Uuid::new_v4();
    let partial_path = state.config.blobs().partial(kind.folder, &format!("{id}.{}", kind.extension)).await?;
    let partial = PartialFile::new(partial_path.clone());
    // Streamed to disk: the limit is enforced as bytes arrive, never by buffering the whole body.
    let written = files::stream_to_file(body, &partial_path, limit, kind.folder).await?;
    storage::check_quota(state, team, written.bytes, kind.what).await?;
    Ok(Received { id, partial_path, partial, written, kind })
}

/// Awaits the store's record of an upload kept at `location` (201 with it); when storing fails, the bytes
/// go too.
pub async fn record<T>(
    state: &AppState,
    kind: UploadKind,
    location: &str,
    stored: impl std::future::Future<Output = ringtrain_store::StoreResult<T>>,
) -> ApiResult<(StatusCode, axum::Json<T>)> {
    match stored.await {
        Ok(record) => Ok((StatusCode::CREATED, axum::Json(record))),
        Err(err) => {
            state.config.blobs().remove(kind.folder, std::iter::once(location)).await;
            Err(err.into())
        }
    }
}

/// 409 when a queued, scheduled or running job of the team passes `uses` (it would lose its file).
pub async fn refuse_if_in_use(
    state: &AppState,
    team: TeamId,
    what: &str,
    uses: impl Fn(&JobSpec) -> bool,
) -> ApiResult<()> {
    for job_state in [JobState::Queued, JobState::Scheduled, JobState::Running] {
        let filter = JobFilter { state: Some(job_state), limit: i64::MAX, ..JobFilter::default() };
        let jobs = state.store.list_jobs(team, &filter).await?;
        let found = jobs.iter().find(|job| uses(&job.spec));
        if let Some(job) = found {
            return Err(ApiError::conflict(format!("job {} ({job_state}) uses {what}", job.id)));
        }
    }
    Ok(())
}
