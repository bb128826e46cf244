//! /v1/datasets/uploads: a data set uploaded in parts, for files that one request should not carry whole
//! (a connection that drops loses one part, not the upload). The client declares the name and the size,
//! sends each part with its sha256 (`x-checksum-sha256`, lowercase hex) in any order and as often as it
//! needs, and completes the upload: the parts are joined, checked as a single upload is, and become the data
//! set. A part is kept only when its size and checksum hold, so after an interruption the client asks which
//! parts arrived and sends the rest. The declared size counts against the team's quota from the start; an
//! upload left unfinished for `ApiConfig::upload_retention` (7 days) is deleted with its parts.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use ringtrain_core::{DatasetId, FieldError};
use ringtrain_store::{Dataset, NewDataset, Upload};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::auth::User;
use crate::error::{ApiError, ApiResult, ProblemType};
use crate::extract::{ApiPath, JsonBody};
use crate::files::{self, PartialFile};
use crate::state::AppState;
use crate::storage;

/// The header that carries a part's sha256.
pub const CHECKSUM_HEADER: &str = "x-checksum-sha256";
/// Parts unless the client asks otherwise.
const DEFAULT_PART_BYTES: u64 = 64 << 20;
const MIN_PART_BYTES: u64 = 1 << 20;
const MAX_PART_BYTES: u64 = 1 << 30;
/// Uploads one team may have in progress.
const MAX_OPEN_UPLOADS: usize = 8;

/// An upload to start.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewUpload {
    /// The data set's name: 1 to 200 characters, not only spaces, no control characters.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\s\\u0000-\\u001f\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    pub name: String,
    /// The whole safetensors file's size, at most the server's dataset upload limit.
    #[schema(minimum = 8, maximum = 9223372036854775807_u64)]
    pub size_bytes: u64,
    /// Every part's size but the last's: 1 MiB to 1 GiB (default 64 MiB).
    #[schema(minimum = 1048576, maximum = 1073741824)]
    pub part_bytes: Option<u64>,
}

pub use ringtrain_views::uploads::{ReceivedPart, UploadList, UploadView};

fn area(upload: Uuid) -> String {
    format!("uploads/{upload}")
}

fn part_name(number: i64) -> String {
    format!("part-{number:06}")
}

async fn view(state: &AppState, upload: Upload) -> ApiResult<UploadView> {
    let kept = state.config.blobs().list(&area(upload.id)).await?;
    let parts = upload.parts();
    let (received, missing): (Vec<i64>, Vec<i64>) = (1..=parts).partition(|n| kept.contains(&part_name(*n)));
    Ok(UploadView {
        id: upload.id,
        name: upload.name,
        size_bytes: upload.size_bytes,
        part_bytes: upload.part_bytes,
        parts,
        received,
        missing,
        created_at: upload.created_at,
    })
}

/// The team's upload `id`; another team's is 404, as a missing one.
async fn team_upload(state: &AppState, user: &User, id: Uuid) -> ApiResult<Upload> {
    state
        .store
        .get_upload(id)
        .await?
        .filter(|u| user.owns(u.team_id))
        .ok_or_else(|| ApiError::not_found(format!("no upload {id}")))
}

/// Start an upload in parts: declares the data set's name and size (counted against the team's storage
/// quota from now until the upload completes or is deleted).
#[utoipa::path(post, path = "/v1/datasets/uploads", tag = "datasets", request_body = NewUpload,
    responses((status = 201, body = UploadView), (status = 403),
        (status = 409, description = "The team already has 8 uploads in progress"),
        (status = 413, description = "Larger than the upload limit, or past the team's storage quota"),
        (status = 422),
        (status = 507, description = "The server's disk would fall below its reserve of free space")),
    security(("bearer" = [])))]
pub async fn start_upload(
    State(state): State<AppState>,
    user: User,
    JsonBody(body): JsonBody<NewUpload>,
) -> ApiResult<(StatusCode, Json<UploadView>)> {
    user.require_write()?;
    let mut errors: Vec<FieldError> = ringtrain_core::validate::name_problems(&body.name)
        .into_iter()
        .map(|reason| FieldError::new("name", reason))
        .collect();
    if body.size_bytes < 8 {
        errors.push(FieldError::new("size_bytes", "a safetensors file has at least 8 bytes"));
    }
    if body.size_bytes > i64::MAX as u64 {
        errors.push(FieldError::new("size_bytes", format!("must be at most {}", i64::MAX)));
    }
    let part_bytes = body.part_bytes.unwrap_or(DEFAULT_PART_BYTES);
    if !(MIN_PART_BYTES..=MAX_PART_BYTES).contains(&part_bytes) {
        errors.push(FieldError::new("part_bytes", format!("must be from 1 MiB to 1 GiB (got {part_bytes})")));
    }
    if !errors.is_empty() {
        return Err(ApiError::validation(errors));
    }
    let limit = state.config.max_dataset_bytes;
    if body.size_bytes > limit {
        return Err(files::too_large("datasets", limit));
    }
    if state.store.list_uploads(user.team_id).await?.len() >= MAX_OPEN_UPLOADS {
        return Err(ApiError::conflict(format!(
            "the team has {MAX_OPEN_UPLOADS} uploads in progress: complete or delete one (GET /v1/datasets/uploads)"
        )));
    }
    storage::check_room(&state, user.team_id, body.size_bytes, "dataset").await?;
    let upload = state
        .store
        .add_upload(Upload {
            id: Uuid::new_v4(),
            team_id: user.team_id,
            name: body.name,
            size_bytes: body.size_bytes as i64,
            part_bytes: part_bytes as i64,
            created_at: ringtrain_store::now(),
        })
        .await?;
    Ok((StatusCode::CREATED, Json(view(&state, upload).await?)))
}

/// The team's uploads in progress, oldest first.
#[utoipa::path(get, path = "/v1/datasets/uploads", tag = "datasets",
    responses((status = 200, body = UploadList)),
    security(("bearer" = [])))]
pub async fn list_uploads(State(state): State<AppState>, user: User) -> ApiResult<Json<UploadList>> {
    let mut uploads = Vec::new();
    for upload in state.store.list_uploads(user.team_id).await? {
        uploads.push(view(&state, upload).await?);
    }
    Ok(Json(UploadList { uploads }))
}

/// An upload in progress: which parts arrived and which are missing.
#[utoipa::path(get, path = "/v1/datasets/uploads/{id}", tag = "datasets", params(("id" = Uuid, Path)),
    responses((status = 200, body = UploadView), (status = 404)),
    security(("bearer" = [])))]
pub async fn get_upload(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<UploadView>> {
    let upload = team_upload(&state, &user, id).await?;
    Ok(Json(view(&state, upload).await?))
}

/// Send part `number` (from 1) of an upload, with its sha256 in `x-checksum-sha256`: kept only when its
/// size is the declared part size (the rest, for the last) and its checksum holds. Sending a part again
/// replaces it.
#[utoipa::path(put, path = "/v1/datasets/uploads/{id}/parts/{number}", tag = "datasets",
    params(("id" = Uuid, Path), ("number" = i64, Path, minimum = 1),
        ("x-checksum-sha256" = String, Header, pattern = "^[0-9a-fA-F]{64}$",
            description = "The part's sha256, 64 hex digits")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The part's bytes"),
    responses((status = 200, body = ReceivedPart), (status = 400), (status = 403), (status = 404),
        (status = 413, description = "Longer than the part"),
        (status = 422, description = "A part number past the last, a part of the wrong size, or a checksum that does not hold: nothing was kept")),
    security(("bearer" = [])))]
pub async fn put_part(
    State(state): State<AppState>,
    user: User,
    ApiPath((id, number)): ApiPath<(Uuid, i64)>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<ReceivedPart>> {
    user.require_write()?;
    let upload = team_upload(&state, &user, id).await?;
    let claimed = headers.get(CHECKSUM_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
    let claimed = claimed.trim().to_ascii_lowercase();
    if claimed.len() != 64 || !claimed.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::field(
            ProblemType::BadHeader,
            CHECKSUM_HEADER,
            "send the part's sha256 as 64 hex digits",
        ));
    }
    let parts = upload.parts();
    if !(1..=parts).contains(&number) {
        return Err(ApiError::validation(vec![FieldError::new(
            "number",
            format!("upload {id} has parts 1 to {parts} (got {number})"),
        )]));
    }
    let expected = upload.part_size(number) as u64;
    files::check_declared_length(&headers, expected, "this part")?;
    let blobs = state.config.blobs();
    let (area, name) = (area(id), part_name(number));
    let partial_path = blobs.partial(&area, &name).await?;
    let partial = PartialFile::new(partial_path.clone());
    let written = files::stream_to_file(body, &partial_path, expected, "this part").await?;
    if written.bytes != expected {
        return Err(ApiError::validation(vec![FieldError::new(
            "body",
            format!("part {number} has {} bytes; it must have {expected}: it was not kept", written.bytes),
        )]));
    }
    if written.sha256 != claimed {
        return Err(ApiError::validation(vec![FieldError::new(
            CHECKSUM_HEADER,
            format!("part {number} has sha256 {}, the header says {claimed}: it was not kept", written.sha256),
        )]));
    }
    let kept = blobs.keep(&partial_path, &area, &name).await?;
    partial.keep();
    if state.store.get_upload(id).await?.is_none() {
        // completed or deleted while this part arrived: leave nothing behind
        blobs.remove(&area, std::iter::once(kept.as_str())).await;
        return Err(ApiError::not_found(format!("no upload {id}")));
    }
    Ok(Json(ReceivedPart { number, size_bytes: written.bytes as i64, sha256: written.sha256 }))
}

/// Complete an upload: its parts are joined and checked as a single upload is; the data set is created
/// (with the upload's id) and the parts removed. A joined file that is not a data set is refused (422) and
/// the upload deleted.
#[utoipa::path(post, path = "/v1/datasets/uploads/{id}/complete", tag = "datasets", params(("id" = Uuid, Path)),
    responses((status = 201, body = Dataset), (status = 403), (status = 404),
        (status = 409, description = "Parts are missing (named in the detail)"),
        (status = 422, description = "The joined file is not a data set: the upload is deleted")),
    security(("bearer" = [])))]
pub async fn complete_upload(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<(StatusCode, Json<Dataset>)> {
    user.require_write()?;
    let upload = team_upload(&state, &user, id).await?;
    let seen = view(&state, upload.clone()).await?;
    if !seen.missing.is_empty() {
        let missing: Vec<String> = seen.missing.iter().map(ToString::to_string).collect();
        return Err(ApiError::conflict(format!(
            "parts {} of {} have not arrived: send them first",
            missing.join(", "),
            seen.parts
        )));
    }
    // one completion wins: the row is claimed before the parts are joined
    if state.store.delete_upload(id).await?.is_none() {
        return Err(ApiError::not_found(format!("no upload {id}")));
    }
    match join_parts(&state, &upload, seen.parts).await {
        Ok(created) => {
            forget(&state, id).await?;
            Ok(created)
        }
        Err(err) if err.status() == StatusCode::UNPROCESSABLE_ENTITY => {
            // the parts held their checksums, so the file itself is not a data set: sending it again
            // cannot help, and the upload goes
            forget(&state, id).await?;
            Err(err)
        }
        Err(err) => {
            // the server's trouble (the store, the disk): the upload stays for another try
            state.store.add_upload(upload).await?;
            Err(err)
        }
    }
}

/// The upload's parts joined into one file, checked and kept as a data set.
async fn join_parts(state: &AppState, upload: &Upload, parts: i64) -> ApiResult<(StatusCode, Json<Dataset>)> {
    let blobs = state.config.blobs();
    let area = area(upload.id);
    let name = format!("{}.safetensors", upload.id);
    let partial_path = blobs.partial("datasets", &name).await?;
    let partial = PartialFile::new(partial_path.clone());
    let mut file = tokio::fs::File::create(&partial_path).await.map_err(ApiError::internal)?;
    let mut hasher = Sha256::new();
    for number in 1..=parts {
        let part = blobs.location(&area, &part_name(number));
        blobs.append_to(&area, &part, &mut file, &mut |chunk| hasher.update(chunk)).await?;
    }
    tokio::io::AsyncWriteExt::flush(&mut file).await.map_err(ApiError::internal)?;
    drop(file);
    let contents = super::datasets::check_file(&partial_path).await?;
    let location = blobs.keep(&partial_path, "datasets", &name).await?;
    partial.keep();
    let stored = state.store.add_dataset(NewDataset {
        id: DatasetId(upload.id),
        team_id: upload.team_id,
        name: upload.name.clone(),
        path: location.clone(),
        size_bytes: upload.size_bytes,
        sha256: crate::hex(&hasher.finalize()),
        train_samples: contents.samples,
        sample_shape: contents.sample_shape,
        num_classes: contents.num_classes,
        inputs: contents.inputs,
        labels: contents.labels,
        source: None,
    });
    crate::uploads::record(state, super::datasets::DATASETS, &location, stored).await
}

/// Forgets upload `id` (if it is still stored) and removes its parts.
async fn forget(state: &AppState, id: Uuid) -> ApiResult<()> {
    state.store.delete_upload(id).await?;
    let blobs = state.config.blobs();
    let area = area(id);
    let kept: Vec<String> = blobs.list(&area).await?.iter().map(|name| blobs.location(&area, name)).collect();
    blobs.remove(&area, kept.iter().map(String::as_str)).await;
    Ok(())
}

/// Deletes the uploads (of any team) started longer ago than the configured retention, with their parts:
/// how many went. Run hourly by the server beside the logs' retention.
pub async fn expire_abandoned(state: &AppState) -> ApiResult<usize> {
    let cutoff = chrono::Duration::from_std(state.config.upload_retention).unwrap_or(chrono::Duration::MAX);
    let Some(before) = ringtrain_store::now().checked_sub_signed(cutoff) else { return Ok(0) };
    let abandoned = state.store.uploads_started_before(before).await?;
    for upload in &abandoned {
        forget(state, upload.id).await?;
    }
    Ok(abandoned.len())
}

/// Delete an upload in progress and the parts it received.
#[utoipa::path(delete, path = "/v1/datasets/uploads/{id}", tag = "datasets", params(("id" = Uuid, Path)),
    responses((status = 204), (status = 403), (status = 404)),
    security(("bearer" = [])))]
pub async fn delete_upload(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<StatusCode> {
    user.require_write()?;
    team_upload(&state, &user, id).await?;
    forget(&state, id).await?;
    Ok(StatusCode::NO_CONTENT)
}
