//! /v1/models: uploaded TorchScript models, team-scoped like datasets. An upload is streamed to the data
//! directory under a size limit, then checked against one of the team's data sets by `ringtrain models
//! check` in a process of its own (libtorch is not linked into the server, and a hostile or broken file
//! must never touch the server's process): it loads, has trainable parameters, and its `forward` takes two
//! samples of the declared inputs and returns what the labels need. Only then is it stored.

use std::path::Path;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use ringtrain_core::{DatasetId, FieldError, ModelId};
use ringtrain_protocol::model::{ModelRefusal, ModelReport, EXIT_REFUSED};
use ringtrain_store::{Dataset, Model, NewModel};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::User;
use crate::error::{ApiError, ApiResult, ProblemType};
use crate::extract::{ApiPath, ApiQuery};
use crate::model_check::{self, ModelChecker};
use crate::state::AppState;
use crate::uploads::{self, UploadKind};

pub use ringtrain_views::artifacts::ModelList;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ModelUploadParams {
    /// A label for the model: 1 to 200 characters, not only spaces, no control characters.
    #[param(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\s\\u0000-\\u001f\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    pub name: String,
    /// An uploaded data set of the team: the check runs the model on two of its samples.
    pub dataset: DatasetId,
    /// forward's inputs in order, comma-separated: the data set's tensors x.NAME. Default: the data set's
    /// one input (its `x`, or its only `x.NAME`). Not for a composite model, whose manifest names them.
    #[param(max_length = 2000)]
    pub inputs: Option<String>,
}

/// The one input of a plain data set, as a model's input list names it.
pub const PLAIN_INPUT: &str = "x";

/// Upload a TorchScript model (saved with `torch.jit.script(model).save(path)` in PyTorch 2.x): the body is
/// the file. Or a composite model: a tar archive of TorchScript modules (`NAME.pt`) and `composite.json`,
/// which lists the modules in the order they run and what each takes (the data set's inputs or earlier
/// modules' outputs); a job may place its modules on a worker's devices (`placement.stages`). It is
/// checked against the data set named before it is stored.
#[utoipa::path(post, path = "/v1/models", tag = "models", params(ModelUploadParams),
    request_body(content = Vec<u8>, content_type = "application/octet-stream",
        description = "A TorchScript file, or a composite model's tar archive"),
    responses((status = 201, body = Model), (status = 403),
        (status = 413, description = "Larger than the model upload limit, or past the team's storage quota"),
        (status = 415),
        (status = 422, description = "Not TorchScript, an operator outside the allow-list (file, thread or foreign operators), no trainable parameters, or forward does not take the inputs or fit the labels: the reason, at `body`, `inputs` or `dataset`"),
        (status = 429, description = "A model of the team is being checked"),
        (status = 503, description = "This server has no model checker, or cannot confine one"),
        (status = 507, description = "The server's disk would fall below its reserve of free space")),
    security(("bearer" = [])))]
pub async fn upload_model(
    State(state): State<AppState>,
    user: User,
    headers: HeaderMap,
    ApiQuery(params): ApiQuery<ModelUploadParams>,
    body: Body,
) -> ApiResult<(StatusCode, Json<Model>)> {
    user.require_write()?;
    uploads::check_form(&headers, &params.name, MODELS)?;
    let dataset = state
        .store
        .get_dataset(params.dataset)
        .await?
        .filter(|d| user.owns(d.team_id))
        .ok_or_else(|| field_error("dataset", format!("no uploaded dataset {}", params.dataset)))?;
    if let Some(source) = &dataset.source {
        return Err(field_error(
            "dataset",
            format!(
                "dataset {} is sharded images ({source}): a model is checked against an uploaded safetensors data set",
                dataset.id
            ),
        ));
    }
    let checker = match &state.config.model_checker {
        Ok(checker) => checker.clone(),
        Err(why) => return Err(ApiError::new(ProblemType::NoModelChecker, why.clone())),
    };
    let limit = state.config.max_model_bytes;
    let received = uploads::receive(&state, user.team_id, &headers, body, limit, MODELS).await?;
    // a composite model (a tar archive of modules) names its inputs in its own manifest
    let inputs = match (is_archive(&received.partial_path).await, params.inputs.as_deref()) {
        (true, Some(_)) => {
            return Err(field_error(
                "inputs",
                "a composite model (an archive of modules) names each module's inputs in its composite.json: leave inputs out",
            ))
        }
        (true, None) => Vec::new(),
        (false, declared) => declared_inputs(&dataset, declared)?,
    };
    let report = run_check(&state, user.team_id, &checker, &received.partial_path, &dataset, &inputs).await?;
    let (id, written) = (received.id, received.written.clone());
    let location = received.keep(&state).await?;
    let stored = state.store.add_model(NewModel {
        id: ModelId(id),
        team_id: user.team_id,
        name: params.name,
        path: location.clone(),
        size_bytes: written.bytes as i64,
        sha256: written.sha256,
        inputs: report.inputs.clone(),
        report: serde_json::to_value(&report).map_err(ApiError::internal)?,
    });
    uploads::record(&state, MODELS, &location, stored).await
}

/// Whether an upload is a composite model's tar archive rather than a TorchScript file.
async fn is_archive(path: &Path) -> bool {
    use ringtrain_core::composite::{is_archive_head, ARCHIVE_HEAD_BYTES};
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; ARCHIVE_HEAD_BYTES];
    let Ok(mut file) = tokio::fs::File::open(path).await else { return false };
    file.read_exact(&mut head).await.is_ok() && is_archive_head(&head)
}

const MODELS: UploadKind =
    UploadKind { what: "model", folder: "models", extension: "pt", body: "the TorchScript file" };

fn field_error(field: &str, reason: impl Into<String>) -> ApiError {
    ApiError::validation(vec![FieldError::new(field, reason)])
}

/// The inputs forward takes, in order: as declared (each a named input of the data set), or the data set's
/// one input. Empty means the plain data set's `x`.
fn declared_inputs(dataset: &Dataset, declared: Option<&str>) -> ApiResult<Vec<String>> {
    let held: Vec<&str> = dataset.inputs.iter().map(|i| i.name.as_str()).collect();
    let listed = || {
        if held.is_empty() {
            "it holds one input, x".to_string()
        } else {
            format!("it holds {}", held.iter().map(|n| format!("x.{n}")).collect::<Vec<_>>().join(", "))
        }
    };
    let Some(declared) = declared.map(str::trim).filter(|d| !d.is_empty()) else {
        return match held.as_slice() {
            [] => Ok(Vec::new()),
            [one] => Ok(vec![one.to_string()]),
            _ => Err(field_error("inputs", format!("missing: name forward's inputs in order ({})", listed()))),
        };
    };
    let names: Vec<String> = declared.split(',').map(|n| n.trim().to_string()).collect();
    if held.is_empty() {
        return match names.as_slice() {
            [one] if one == PLAIN_INPUT => Ok(Vec::new()),
            _ => Err(field_error("inputs", format!("dataset {} has no named inputs: {}", dataset.id, listed()))),
        };
    }
    for name in &names {
        if !held.contains(&name.as_str()) {
            return Err(field_error("inputs", format!("dataset {} has no x.{name}: {}", dataset.id, listed())));
        }
    }
    Ok(names)
}

/// Runs `ringtrain models check` on the uploaded file (confined: see [`crate::model_check`]), killed after
/// the configured timeout: its report, or 422 with the reason it refused the model (a crash or a timeout
/// is the file's doing too).
async fn run_check(
    state: &AppState,
    team: ringtrain_core::TeamId,
    checker: &ModelChecker,
    model: &Path,
    dataset: &Dataset,
    inputs: &[String],
) -> ApiResult<ModelReport> {
    let _turn = state.model_checks.turn(team).await?;
    let timeout = state.config.model_check_timeout;
    let tmp = state.config.data_dir.join("tmp");
    // the data set as a file the check can read (a copy in the scratch folder when it lies in a bucket)
    let dataset_file = state.config.blobs().local("datasets", &dataset.path).await?;
    let Some(outcome) = model_check::run(checker, &tmp, model, &dataset_file.path, inputs, timeout).await? else {
        return Err(field_error("body", format!("the check of the model did not finish in {}s", timeout.as_secs())));
    };
    match outcome.status.code() {
        Some(0) => serde_json::from_str(&outcome.last_line).map_err(ApiError::internal),
        Some(code) if code == i32::from(EXIT_REFUSED) => {
            let refusal: ModelRefusal = serde_json::from_str(&outcome.last_line).map_err(ApiError::internal)?;
            Err(field_error(&refusal.field, refusal.reason))
        }
        _ => Err(field_error(
            "body",
            format!("the model crashed its check ({}): {}", outcome.status, outcome.last_error),
        )),
    }
}

/// The team's uploaded models, newest first.
#[utoipa::path(get, path = "/v1/models", tag = "models",
    responses((status = 200, body = ModelList), (status = 401)),
    security(("bearer" = [])))]
pub async fn list_models(State(state): State<AppState>, user: User) -> ApiResult<Json<ModelList>> {
    Ok(Json(ModelList { models: state.store.list_models(user.team_id).await? }))
}

/// A model of your team (what its check found included).
#[utoipa::path(get, path = "/v1/models/{id}", tag = "models", params(("id" = Uuid, Path)),
    responses((status = 200, body = Model), (status = 404)),
    security(("bearer" = [])))]
pub async fn get_model(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<ModelId>,
) -> ApiResult<Json<Model>> {
    Ok(Json(team_model(&state, &user, id).await?))
}

/// The team's model `id`; another team's is 404, as a missing one.
pub async fn team_model(state: &AppState, user: &User, id: ModelId) -> ApiResult<Model> {
    state
        .store
        .get_model(id)
        .await?
        .filter(|m| user.owns(m.team_id))
        .ok_or_else(|| ApiError::not_found(format!("no model {id}")))
}

/// Delete an uploaded model (and its file). Refused (409) while a job of the team that is not finished
/// trains it.
#[utoipa::path(delete, path = "/v1/models/{id}", tag = "models", params(("id" = Uuid, Path)),
    responses((status = 204, description = "Deleted"),
        (status = 403),
        (status = 404),
        (status = 409, description = "A queued or running job trains it")),
    security(("bearer" = [])))]
pub async fn delete_model(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<ModelId>,
) -> ApiResult<StatusCode> {
    user.require_write()?;
    let model = team_model(&state, &user, id).await?;
    uploads::refuse_if_in_use(&state, user.team_id, &format!("model {id}"), |spec| spec.model.uploaded == Some(id))
        .await?;
    state.store.delete_model(model.id).await?.ok_or_else(|| ApiError::not_found(format!("no model {id}")))?;
    state.config.blobs().remove("models", std::iter::once(model.path.as_str())).await;
    Ok(StatusCode::NO_CONTENT)
}
