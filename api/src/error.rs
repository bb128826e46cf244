//! One error type for every handler: RFC 7807 `application/problem+json`, with field-level `errors` for
//! validation. An internal error keeps its cause (with its chain) on the response, out of the body: the
//! client sees a generic 500 (503 when the database is unreachable), and [`log_internal_errors`] logs the
//! cause once, inside the request's span (axum's `examples/error-handling` pattern).

use std::sync::Arc;

use axum::extract::Request;
use axum::middleware::Next;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use ringtrain_core::FieldError;
use ringtrain_store::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 7807 problem document.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem (`urn:ringtrain:problem:validation`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Every problem with a field of the request, each with its JSON path.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<FieldErrorDoc>)]
    pub errors: Vec<FieldError>,
}

/// One problem with one field.
#[derive(Debug, Serialize, ToSchema)]
pub struct FieldErrorDoc {
    /// The JSON path of the field (`lr.warmup.epochs`), or the query parameter's name.
    pub path: String,
    pub reason: String,
}

/// A handler's failure.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    slug: &'static str,
    detail: String,
    errors: Vec<FieldError>,
    /// Seconds after which the same request may succeed (a `Retry-After` header).
    retry_after: Option<u64>,
    /// What went wrong on our side, for the log only.
    cause: Option<InternalCause>,
}

/// The cause of an internal error, carried on the response for [`log_internal_errors`].
#[derive(Debug, Clone)]
pub struct InternalCause(Arc<anyhow::Error>);

impl ApiError {
    pub fn new(status: StatusCode, slug: &'static str, detail: impl Into<String>) -> Self {
        ApiError { status, slug, detail: detail.into(), errors: Vec::new(), retry_after: None, cause: None }
    }

    /// 422: the request is well-formed but its content is wrong; every field problem listed.
    pub fn validation(errors: Vec<FieldError>) -> Self {
        let detail = match errors.as_slice() {
            [one] => one.to_string(),
            many => format!("{} problems with the request", many.len()),
        };
        ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            slug: "validation",
            detail,
            errors,
            retry_after: None,
            cause: None,
        }
    }

    pub fn field(status: StatusCode, slug: &'static str, path: &str, reason: impl Into<String>) -> Self {
        let error = FieldError::new(path, reason);
        ApiError { status, slug, detail: error.to_string(), errors: vec![error], retry_after: None, cause: None }
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad-request", detail)
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", what)
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", detail)
    }

    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", detail)
    }

    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", detail)
    }

    /// 429: a limit was reached; the same request may succeed after `seconds`.
    pub fn too_many(slug: &'static str, detail: impl Into<String>, seconds: u64) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, slug, detail).retry_after(seconds)
    }

    /// Adds a `Retry-After` header of at least one second.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds.max(1));
        self
    }

    /// A failure on our side: the client sees only that; the cause (and its chain) is logged once.
    pub fn internal(cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::internal_cause(anyhow::Error::new(cause))
    }

    /// [`ApiError::internal`] for a cause that is only a message (a broken invariant).
    pub fn internal_msg(message: impl std::fmt::Display) -> Self {
        Self::internal_cause(anyhow::anyhow!("{message}"))
    }

    fn internal_cause(cause: anyhow::Error) -> Self {
        let mut error = Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal server error");
        error.cause = Some(InternalCause(Arc::new(cause)));
        error
    }

    /// The field problems of a validation error (422), to report with others; any other error as it is.
    pub fn into_field_errors(self) -> Result<Vec<FieldError>, ApiError> {
        if self.slug == "validation" {
            Ok(self.errors)
        } else {
            Err(self)
        }
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn problem(&self) -> Problem {
        Problem {
            kind: format!("urn:ringtrain:problem:{}", self.slug),
            title: self.status.canonical_reason().unwrap_or("error").to_string(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            errors: self.errors.clone(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.problem()).unwrap_or_default();
        let mut response = (self.status, body).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Some(cause) = self.cause {
            response.extensions_mut().insert(cause);
        }
        response
    }
}

/// Logs each internal error once, with its cause chain, inside the request's span (which carries the
/// request id). Building an [`ApiError`] has no side effect; this layer is the one place that logs.
pub async fn log_internal_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if let Some(InternalCause(cause)) = response.extensions().get::<InternalCause>() {
        tracing::error!(status = response.status().as_u16(), error = format!("{cause:#}"), "internal error");
    }
    response
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Conflict(detail) => ApiError::conflict(detail),
            StoreError::InvalidTransition(detail) => ApiError::conflict(detail),
            other => ApiError::internal(other),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
