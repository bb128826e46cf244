//! ringtrain's REST API: [`app`] builds the whole axum [`Router`] from an [`AppState`], separate from any
//! binary, so handler tests drive it with `tower::ServiceExt::oneshot` and `ringtrain serve` just binds it.

pub mod access;
pub mod admission;
pub mod auth;
pub mod blobs;
pub mod bootstrap;
pub mod changes;
pub mod dispatch;
pub mod error;
pub mod extract;
pub mod files;
pub mod largest_memory;
pub mod model_check;
pub mod placements;
pub mod progress;
pub mod prometheus;
pub mod queue;
pub mod queue_room;
pub mod reference_guard;
pub mod resources;
pub mod resume;
pub mod routes;
pub mod search;
pub mod slurm_pool;
pub mod state;
pub mod storage;
pub mod submission;
pub mod system_now;
pub mod token_cache;
pub mod training_watch;
pub mod unread_body;
pub mod uploads;
pub mod web;

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderName, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower_http::compression::CompressionLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

pub use error::{ApiError, Problem, ProblemType};
pub use model_check::ModelChecker;
pub use ringtrain_core::hex;
pub use state::{ApiConfig, AppState};

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The complete application: every route, problem+json fallbacks, body limit, timeout, admission limits,
/// request ids, tracing, compression and request metrics.
pub fn app(state: AppState) -> Router {
    let (router, _doc) = routes::router().split_for_parts();
    let body_limit = state.config.max_body_bytes;
    router
        .merge(web::routes())
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(error::log_internal_errors))
        // inside the request metrics, so refusals are counted too
        .layer(middleware::from_fn_with_state(state.clone(), admission::requests::admit))
        .layer(middleware::from_fn_with_state(state.clone(), prometheus::record))
        .layer(middleware::from_fn_with_state(state.clone(), timeout))
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .layer(CompressionLayer::new())
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(TraceLayer::new_for_http().make_span_with(|request: &Request| {
            let id = request.headers().get(&REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("");
            tracing::info_span!("request", method = %request.method(), uri = %request.uri(), request_id = %id)
        }))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
        .with_state(state)
}

/// The OpenAPI 3.1 document of every route.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = routes::router().split_for_parts().1;
    utoipa::Modify::modify(&submission::schema::JobSpecSchema, &mut doc);
    utoipa::Modify::modify(&routes::ProblemResponses, &mut doc);
    doc
}

async fn unknown_route(uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(ProblemType::MethodNotAllowed, format!("{method} is not allowed on {}", uri.path()))
}

/// Answers 503 problem+json when a handler takes longer than the configured timeout. (tower-http's
/// TimeoutLayer answers with an empty body.) Streams are timed only until their headers are sent.
async fn timeout(State(state): State<AppState>, request: Request, next: Next) -> Response {
    // a model upload includes its check, which has its own (longer) timeout
    let checks_a_model = request.method() == Method::POST && request.uri().path() == "/v1/models";
    let limit: Duration = if checks_a_model {
        state.config.request_timeout + state.config.model_check_timeout
    } else {
        state.config.request_timeout
    };
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            ApiError::new(ProblemType::Timeout, format!("the request took longer than {} s", limit.as_secs_f64()))
                .into_response()
        }
    }
}
