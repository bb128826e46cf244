//! /v1/datasets: safetensors uploads (`x`: samples, `y`: integer labels; or named inputs `x.NAME` with
//! class or value labels, for uploaded models), streamed to the data directory under a size limit and
//! checked before they are accepted.

use std::path::Path;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use ringtrain_core::{DatasetId, FieldError};
use ringtrain_store::{Dataset, DatasetInput, NewDataset};
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiPath, ApiQuery};
use crate::state::AppState;
use crate::uploads::{self, UploadKind};

pub use ringtrain_views::artifacts::DatasetList;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct UploadParams {
    /// A label for the dataset: 1 to 200 characters, not only spaces, no control characters.
    #[param(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\s\\u0000-\\u001f\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    pub name: String,
}

/// Labels must be class indices below this.
pub const MAX_CLASSES: i64 = 100_000;

/// What the checks found in an upload.
#[derive(Debug, PartialEq)]
pub struct Contents {
    pub samples: i64,
    pub sample_shape: Vec<i64>,
    pub num_classes: i32,
    /// The named inputs (`x.NAME`), empty for a data set of one `x`.
    pub inputs: Vec<DatasetInput>,
    /// `classes` or `values`.
    pub labels: String,
}

/// Checks a safetensors file: `x` float32 or uint8 with shape [N, ...] (1 to 3 sample dimensions), `y`
/// integer labels with shape [N], every label in 0..MAX_CLASSES; and the same of `x_test`/`y_test` when
/// given (both or neither; the test samples shaped like the training ones). Without them the worker holds
/// out the last 10% as the test split, so the training samples counted are the rest. A file with tensors
/// `x.NAME` instead of `x` is a data set of named inputs, for uploaded models ([`crate::submission::named_inputs`]).
pub fn check_safetensors(bytes: &[u8]) -> Result<Contents, Vec<FieldError>> {
    let tensors = SafeTensors::deserialize(bytes)
        .map_err(|e| vec![FieldError::new("", format!("not a safetensors file: {e}"))])?;
    if crate::submission::named_inputs::is_named(&tensors) {
        return crate::submission::named_inputs::check_named(&tensors);
    }
    let mut errors = Vec::new();
    let train = check_split(&tensors, "x", "y", &mut errors);
    let test = match (tensors.tensor("x_test").is_ok(), tensors.tensor("y_test").is_ok()) {
        (false, false) => None,
        (true, true) => check_split(&tensors, "x_test", "y_test", &mut errors),
        (has_x, _) => {
            let missing = if has_x { "y_test" } else { "x_test" };
            errors.push(FieldError::new(missing, "missing: x_test and y_test come together"));
            None
        }
    };
    let (Some(train), true) = (train, errors.is_empty()) else { return Err(errors) };
    if let Some(test) = &test {
        if test.sample_shape != train.sample_shape {
            errors.push(FieldError::new(
                "x_test",
                format!("samples of shape {:?} where x's are {:?}", test.sample_shape, train.sample_shape),
            ));
        }
    }
    let samples = match &test {
        Some(_) => train.samples,
        None => {
            let held_out = ringtrain_core::dataset::held_out_test_samples(train.samples.max(0) as u64) as i64;
            if train.samples <= held_out {
                errors.push(FieldError::new(
                    "x",
                    "too few samples to hold out a test split (at least 2, or give x_test and y_test)",
                ));
            }
            train.samples - held_out
        }
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    let max_label = test.as_ref().map_or(train.max_label, |t| t.max_label.max(train.max_label));
    Ok(Contents {
        samples,
        sample_shape: train.sample_shape,
        num_classes: (max_label + 1) as i32,
        inputs: Vec::new(),
        labels: "classes".to_string(),
    })
}

/// One checked split of an upload.
struct SplitContents {
    samples: i64,
    sample_shape: Vec<i64>,
    max_label: i64,
}

/// Checks the samples tensor `xn` and the labels tensor `yn`; every problem goes to `errors`.
fn check_split(tensors: &SafeTensors, xn: &str, yn: &str, errors: &mut Vec<FieldError>) -> Option<SplitContents> {
    let before = errors.len();
    let Ok(x) = tensors.tensor(xn) else {
        errors.push(FieldError::new(xn, "missing: the samples tensor"));
        return None;
    };
    let Ok(y) = tensors.tensor(yn) else {
        errors.push(FieldError::new(yn, "missing: the labels tensor"));
        return None;
    };
    if !matches!(x.dtype(), Dtype::F32 | Dtype::U8) {
        errors.push(FieldError::new(xn, format!("dtype must be F32 or U8 (got {:?})", x.dtype())));
    }
    if !(2..=4).contains(&x.shape().len()) || x.shape()[0] == 0 {
        errors.push(FieldError::new(
            xn,
            format!("shape must be [N, ...] with N >= 1 and 1 to 3 sample dimensions (got {:?})", x.shape()),
        ));
    }
    if y.shape().len() != 1 {
        errors.push(FieldError::new(yn, format!("shape must be [N] (got {:?})", y.shape())));
    } else if x.shape().first() != y.shape().first() {
        errors.push(FieldError::new(
            yn,
            format!("has {} labels for {} samples", y.shape()[0], x.shape().first().unwrap_or(&0)),
        ));
    }
    let labels: Option<Vec<i64>> = match y.dtype() {
        Dtype::I64 => {
            Some(y.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
        }
        Dtype::I32 => Some(
            y.data().chunks_exact(4).map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap_or([0; 4])))).collect(),
        ),
        Dtype::U8 => Some(y.data().iter().map(|&b| i64::from(b)).collect()),
        other => {
            errors.push(FieldError::new(yn, format!("dtype must be I64, I32 or U8 (got {other:?})")));
            None
        }
    };
    let mut max_label = 0;
    if let Some(labels) = &labels {
        if let Some((i, bad)) = labels.iter().enumerate().find(|(_, l)| !(0..MAX_CLASSES).contains(*l)) {
            errors.push(FieldError::new(yn, format!("label {bad} at index {i} is outside 0..{MAX_CLASSES}")));
        }
        max_label = labels.iter().copied().max().unwrap_or(0);
    }
    (errors.len() == before).then(|| SplitContents {
        samples: x.shape()[0] as i64,
        sample_shape: x.shape()[1..].iter().map(|&d| d as i64).collect(),
        max_label,
    })
}

/// Upload a dataset: the request body is the safetensors file (`Content-Type: application/octet-stream`).
#[utoipa::path(post, path = "/v1/datasets", tag = "datasets", params(UploadParams),
    request_body(content = Vec<u8>, content_type = "application/octet-stream",
        description = "A safetensors file with x and y"),
    responses((status = 201, body = Dataset), (status = 403),
        (status = 413, description = "Larger than the upload limit, or past the team's storage quota (the numbers in the detail)"),
        (status = 415),
        (status = 422),
        (status = 507, description = "The server's disk would fall below its reserve of free space")),
    security(("bearer" = [])))]
pub async fn upload_dataset(
    State(state): State<AppState>,
    user: User,
    headers: HeaderMap,
    ApiQuery(params): ApiQuery<UploadParams>,
    body: Body,
) -> ApiResult<(StatusCode, Json<Dataset>)> {
    user.require_write()?;
    uploads::check_form(&headers, &params.name, DATASETS)?;
    let limit = state.config.max_dataset_bytes;
    let received = uploads::receive(&state, user.team_id, &headers, body, limit, DATASETS).await?;
    let contents = check_file(&received.partial_path).await?;
    let (id, written) = (received.id, received.written.clone());
    let location = received.keep(&state).await?;
    let stored = state.store.add_dataset(NewDataset {
        id: DatasetId(id),
        team_id: user.team_id,
        name: params.name,
        path: location.clone(),
        size_bytes: written.bytes as i64,
        sha256: written.sha256,
        train_samples: contents.samples,
        sample_shape: contents.sample_shape,
        num_classes: contents.num_classes,
        inputs: contents.inputs,
        labels: contents.labels,
        source: None,
    });
    uploads::record(&state, DATASETS, &location, stored).await
}

pub(crate) const DATASETS: UploadKind =
    UploadKind { what: "dataset", folder: "datasets", extension: "safetensors", body: "the safetensors file" };

pub(crate) async fn check_file(path: &Path) -> ApiResult<Contents> {
    let path = path.to_path_buf();
    // Reading and scanning the labels is CPU work: keep it off the async workers.
    tokio::task::spawn_blocking(move || {
        let bytes = std::fs::read(&path).map_err(ApiError::internal)?;
        check_safetensors(&bytes).map_err(ApiError::validation)
    })
    .await
    .map_err(ApiError::internal)?
}

/// The team's uploaded datasets, newest first.
#[utoipa::path(get, path = "/v1/datasets", tag = "datasets",
    responses((status = 200, body = DatasetList),
        (status = 401)),
    security(("bearer" = [])))]
pub async fn list_datasets(State(state): State<AppState>, user: User) -> ApiResult<Json<DatasetList>> {
    Ok(Json(DatasetList { datasets: state.store.list_datasets(user.team_id).await? }))
}

/// Delete an uploaded dataset (and its file). Refused (409) while a job of the team that is not finished
/// trains on it.
#[utoipa::path(delete, path = "/v1/datasets/{id}", tag = "datasets", params(("id" = Uuid, Path)),
    responses((status = 204, description = "Deleted"),
        (status = 403),
        (status = 404),
        (status = 409, description = "A queued or running job trains on it")),
    security(("bearer" = [])))]
pub async fn delete_dataset(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<DatasetId>,
) -> ApiResult<StatusCode> {
    user.require_write()?;
    let not_found = || ApiError::not_found(format!("no dataset {id}"));
    let dataset = state.store.get_dataset(id).await?.filter(|d| user.owns(d.team_id)).ok_or_else(not_found)?;
    let uses = |spec: &ringtrain_core::JobSpec| super::registered_datasets::trains_on(spec, &dataset);
    uploads::refuse_if_in_use(&state, user.team_id, &format!("dataset {id}"), uses).await?;
    state.store.delete_dataset(dataset.id).await?.ok_or_else(not_found)?;
    // a registered data set's bytes are where the team keeps them, not the server's
    if dataset.source.is_none() {
        state.config.blobs().remove("datasets", std::iter::once(dataset.path.as_str())).await;
    }
    Ok(StatusCode::NO_CONTENT)
}
