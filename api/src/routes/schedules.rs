//! POST /v1/schedules/preview: a spec in, its LR schedule out, nothing stored; `?workers=a,b,c` answers
//! "what if k changes" with one schedule per world size.

use axum::extract::State;
use axum::Json;
use ringtrain_core::FieldError;
use serde::Deserialize;
use serde_json::Value;
use utoipa::IntoParams;

use crate::auth::User;
use crate::error::{ApiError, ApiResult, ProblemType};
use crate::extract::{ApiQuery, JsonBytes};
use crate::routes::jobs::metrics::MAX_PER_ITERATION;
use crate::state::AppState;
use crate::submission::checks;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PreviewParams {
    /// Training samples, for `idx:` datasets (overrides a built-in size).
    pub dataset_size: Option<u64>,
    /// Comma-separated world sizes, e.g. `8,16,32` (at most 16, each from 1 to 999,999,999): one schedule
    /// each, side by side.
    #[param(pattern = "^ *0*[1-9][0-9]{0,8} *(, *0*[1-9][0-9]{0,8} *){0,15}$")]
    pub workers: Option<String>,
    /// Also list the lr of every iteration.
    pub per_iteration: Option<bool>,
}

pub use ringtrain_views::schedules::{PreviewComparison, PreviewForWorkers};

const MAX_WORLD_SIZES: usize = 16;

/// The schedule of a spec without submitting it. Answers a ScheduleView, or with `workers` a
/// PreviewComparison.
#[utoipa::path(post, path = "/v1/schedules/preview", tag = "schedules", params(PreviewParams),
    request_body(content = Object, content_type = "application/json", description = "A job spec"),
    responses((status = 200, description = "A ScheduleView (effective, epochs, change_points), or with `workers` a PreviewComparison ({schedules: [{workers, schedule}]})",
            body = Object),
        (status = 400),
        (status = 422)),
    security(("bearer" = [])))]
pub async fn preview_schedule(
    State(state): State<AppState>,
    user: User,
    ApiQuery(params): ApiQuery<PreviewParams>,
    JsonBytes(body): JsonBytes,
) -> ApiResult<Json<Value>> {
    let (reading, _) = checks::parse_spec(&body)?;
    // every problem at once: the reading's, the dataset's and the ranges'
    let mut problems = checks::Problems::default();
    let known = problems.take(checks::dataset_size(&state, &user, &reading.spec).await)?.flatten();
    let size = params.dataset_size.or(known);
    if size.is_none() && problems.0.is_empty() {
        problems.0.push(FieldError::new(
            "dataset",
            format!("the size of {} is not known without reading it: pass ?dataset_size=N", reading.spec.dataset),
        ));
    }
    problems.0.extend(reading.spec.validate().err().unwrap_or_default());
    let spec = reading.finish(problems.0).map_err(ApiError::validation)?;
    let Some(size) = size else { return Err(ApiError::internal_msg("a spec without a size passed its checks")) };
    let per_iteration = params.per_iteration.unwrap_or(false);
    let render = |spec: &ringtrain_core::JobSpec| -> ApiResult<ringtrain_core::ScheduleView> {
        let effective = checks::effective(spec, Some(size))?.ok_or_else(|| ApiError::internal_msg("size was known"))?;
        if per_iteration && effective.total_iterations > MAX_PER_ITERATION {
            return Err(ApiError::field(
                ProblemType::TooLarge,
                "per_iteration",
                format!("{} iterations is more than {MAX_PER_ITERATION}", effective.total_iterations),
            ));
        }
        Ok(effective.render(per_iteration))
    };
    let Some(workers) = params.workers else {
        return Ok(Json(serde_json::to_value(render(&spec)?).map_err(ApiError::internal)?));
    };
    let sizes = parse_world_sizes(&workers)?;
    let mut schedules = Vec::with_capacity(sizes.len());
    let mut errors = Vec::new();
    for k in sizes {
        match render(&spec.with_workers(k)) {
            Ok(schedule) => schedules.push(PreviewForWorkers { workers: k, schedule }),
            // Name the world size each problem belongs to.
            Err(err) => errors.extend(
                err.problem()
                    .errors
                    .into_iter()
                    .map(|e| FieldError::new(e.path, format!("with workers = {k}: {}", e.reason))),
            ),
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::validation(errors));
    }
    Ok(Json(serde_json::to_value(PreviewComparison { schedules }).map_err(ApiError::internal)?))
}

fn parse_world_sizes(text: &str) -> ApiResult<Vec<u32>> {
    let bad = |reason: String| ApiError::field(ProblemType::BadQueryParameter, "workers", reason);
    // digits only (spaces around them allowed), as the parameter's pattern in the API document says
    let size = |part: &str| {
        let digits = part.trim_matches(' ');
        let plain = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
        let value = digits.trim_start_matches('0');
        (plain && value.len() <= 9).then(|| value.parse::<u32>().ok()).flatten().filter(|k| *k >= 1)
    };
    let sizes = text
        .split(',')
        .map(|part| size(part).ok_or_else(|| bad(format!("{part:?} is not a world size from 1 to 999999999"))))
        .collect::<ApiResult<Vec<u32>>>()?;
    if sizes.len() > MAX_WORLD_SIZES {
        return Err(bad(format!("at most {MAX_WORLD_SIZES} world sizes at once")));
    }
    Ok(sizes)
}
