//! Liveness, readiness, Prometheus metrics and the OpenAPI document: unauthenticated, outside /v1.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult, ProblemType};
use crate::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// The database answers and every migration is applied.
#[utoipa::path(get, path = "/readyz", tag = "ops",
    responses((status = 200, body = Health),
        (status = 503)))]
pub async fn readyz(State(state): State<AppState>) -> ApiResult<Json<Health>> {
    match state.store.ready().await {
        Ok(()) => Ok(Json(Health { status: "ready" })),
        Err(err) => {
            tracing::warn!(error = %err, "not ready");
            Err(ApiError::new(ProblemType::NotReady, "the database is not reachable or not migrated"))
        }
    }
}

/// The OpenMetrics content type Prometheus scrapes.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Prometheus metrics (OpenMetrics text): requests by route and status, latency histograms, jobs by state,
/// queue depth, device-seconds per team and kind, each live rank's CPU cores and resident memory (and their
/// sums per node).
#[utoipa::path(get, path = "/metrics", tag = "ops",
    responses((status = 200, description = "OpenMetrics text format", body = String,
        content_type = "application/openmetrics-text")))]
pub async fn prometheus(State(state): State<AppState>) -> ApiResult<Response> {
    let jobs = state.store.count_jobs_by_state().await?;
    let usage = state.store.device_totals().await?;
    let uses = state.system_now.live_rank_use(state.store.as_ref()).await?;
    let names: std::collections::HashMap<_, _> =
        state.store.list_nodes().await?.into_iter().map(|n| (n.id, n.name)).collect();
    let ranks: Vec<_> = uses
        .iter()
        .map(|u| {
            let node = names.get(&u.node).cloned().unwrap_or_else(|| u.node.to_string());
            (u.job.to_string(), u.rank, node, u.cpu_cores, u.resident_bytes)
        })
        .collect();
    let text = state.metrics.render(&jobs, &usage, &ranks);
    Ok(([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response())
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "ops",
    responses((status = 200, description = "OpenAPI 3.1", body = Object)))]
pub async fn openapi_json() -> Response {
    // Built once: the document never changes while the process runs.
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let doc = DOC.get_or_init(|| crate::openapi().to_json().unwrap_or_default());
    ([(header::CONTENT_TYPE, "application/json")], doc.clone()).into_response()
}
