//! Turning a submitted spec into a validated [`JobSpec`] and its effective hyperparameters, shared by job
//! submission and the schedule preview.

use ringtrain_core::{DatasetRef, Effective, FieldError, JobSpec};
use serde_json::Value;

use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Parses a JSON body as a spec: malformed JSON is 400; wrong types, unknown fields and every range
/// problem are 422 with their paths.
pub fn parse_spec(bytes: &[u8]) -> ApiResult<(JobSpec, Value)> {
    let value: Value = crate::extract::parse_json(bytes)?;
    let text = std::str::from_utf8(bytes).map_err(|_| ApiError::bad_request("the body is not UTF-8"))?;
    let spec = JobSpec::parse(text).map_err(|e| ApiError::validation(vec![e]))?;
    Ok((spec, value))
}

/// The number of training samples of the spec's dataset: built in, or an uploaded dataset of the caller's
/// team (another team's is "no such dataset"), or None for `idx:` paths that only the worker can read
/// (which must lie inside the server's `idx_roots`).
pub async fn dataset_size(state: &AppState, user: &User, spec: &JobSpec) -> ApiResult<Option<u64>> {
    match &spec.dataset {
        DatasetRef::Uploaded(id) => match state.store.get_dataset(*id).await? {
            Some(dataset) if user.owns(dataset.team_id) => Ok(Some(dataset.train_samples.max(0) as u64)),
            _ => Err(ApiError::validation(vec![FieldError::new("dataset", format!("no uploaded dataset {id}"))])),
        },
        DatasetRef::Idx { path } => match ringtrain_core::dataset::check_idx_path(path, &state.config.idx_roots) {
            Ok(()) => Ok(None),
            Err(reason) => Err(ApiError::validation(vec![FieldError::new("dataset", reason)])),
        },
        other => Ok(other.known_train_size()),
    }
}

/// Every validation problem of the spec for this dataset size, and the effective hyperparameters when the
/// size is known.
pub fn effective(spec: &JobSpec, dataset_size: Option<u64>) -> ApiResult<Option<Effective>> {
    spec.validate_for_dataset(dataset_size).map_err(ApiError::validation)?;
    match dataset_size {
        Some(size) => Effective::new(spec, size).map(Some).map_err(ApiError::validation),
        None => Ok(None),
    }
}
