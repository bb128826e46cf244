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

/// Every kind of problem the API answers with, one table: its `type` (`urn:ringtrain:problem:<slug>`, a
/// public contract clients match on), its HTTP status and its title. The OpenAPI document lists them as
/// the values of `Problem.type`; the user guide's "Errors" lists them too (a test keeps it whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub enum ProblemType {
    #[serde(rename = "urn:ringtrain:problem:validation")]
    Validation,
    #[serde(rename = "urn:ringtrain:problem:bad-request")]
    BadRequest,
    #[serde(rename = "urn:ringtrain:problem:malformed-json")]
    MalformedJson,
    #[serde(rename = "urn:ringtrain:problem:bad-path-parameter")]
    BadPathParameter,
    #[serde(rename = "urn:ringtrain:problem:bad-query-parameter")]
    BadQueryParameter,
    #[serde(rename = "urn:ringtrain:problem:bad-header")]
    BadHeader,
    #[serde(rename = "urn:ringtrain:problem:unsupported-media-type")]
    UnsupportedMediaType,
    #[serde(rename = "urn:ringtrain:problem:payload-too-large")]
    PayloadTooLarge,
    #[serde(rename = "urn:ringtrain:problem:too-large")]
    TooLarge,
    #[serde(rename = "urn:ringtrain:problem:storage-quota")]
    StorageQuota,
    #[serde(rename = "urn:ringtrain:problem:insufficient-storage")]
    InsufficientStorage,
    #[serde(rename = "urn:ringtrain:problem:unauthorized")]
    Unauthorized,
    #[serde(rename = "urn:ringtrain:problem:forbidden")]
    Forbidden,
    #[serde(rename = "urn:ringtrain:problem:not-found")]
    NotFound,
    #[serde(rename = "urn:ringtrain:problem:method-not-allowed")]
    MethodNotAllowed,
    #[serde(rename = "urn:ringtrain:problem:conflict")]
    Conflict,
    #[serde(rename = "urn:ringtrain:problem:queue-full")]
    QueueFull,
    #[serde(rename = "urn:ringtrain:problem:rate-limited")]
    RateLimited,
    #[serde(rename = "urn:ringtrain:problem:address-busy")]
    AddressBusy,
    #[serde(rename = "urn:ringtrain:problem:server-busy")]
    ServerBusy,
    #[serde(rename = "urn:ringtrain:problem:too-many-streams")]
    TooManyStreams,
    #[serde(rename = "urn:ringtrain:problem:model-check-busy")]
    ModelCheckBusy,
    #[serde(rename = "urn:ringtrain:problem:no-model-checker")]
    NoModelChecker,
    #[serde(rename = "urn:ringtrain:problem:not-ready")]
    NotReady,
    #[serde(rename = "urn:ringtrain:problem:ranks-still-running")]
    RanksStillRunning,
    #[serde(rename = "urn:ringtrain:problem:timeout")]
    Timeout,
    #[serde(rename = "urn:ringtrain:problem:internal")]
    Internal,
}

impl ProblemType {
    /// Every one, in the table's order.
    pub const ALL: [ProblemType; 27] = [
        ProblemType::Validation,
        ProblemType::BadRequest,
        ProblemType::MalformedJson,
        ProblemType::BadPathParameter,
        ProblemType::BadQueryParameter,
        ProblemType::BadHeader,
        ProblemType::UnsupportedMediaType,
        ProblemType::PayloadTooLarge,
        ProblemType::TooLarge,
        ProblemType::StorageQuota,
        ProblemType::InsufficientStorage,
        ProblemType::Unauthorized,
        ProblemType::Forbidden,
        ProblemType::NotFound,
        ProblemType::MethodNotAllowed,
        ProblemType::Conflict,
        ProblemType::QueueFull,
        ProblemType::RateLimited,
        ProblemType::AddressBusy,
        ProblemType::ServerBusy,
        ProblemType::TooManyStreams,
        ProblemType::ModelCheckBusy,
        ProblemType::NoModelChecker,
        ProblemType::NotReady,
        ProblemType::RanksStillRunning,
        ProblemType::Timeout,
        ProblemType::Internal,
    ];

    /// Its slug, status and title: the table.
    pub fn row(self) -> (&'static str, StatusCode, &'static str) {
        use ProblemType::*;
        match self {
            Validation => (
                "validation",
                StatusCode::UNPROCESSABLE_ENTITY,
                "the request's content is wrong; `errors` names each field",
            ),
            BadRequest => ("bad-request", StatusCode::BAD_REQUEST, "the request could not be read"),
            MalformedJson => ("malformed-json", StatusCode::BAD_REQUEST, "the body is not JSON"),
            BadPathParameter => {
                ("bad-path-parameter", StatusCode::BAD_REQUEST, "a path parameter is not what the route takes")
            }
            BadQueryParameter => {
                ("bad-query-parameter", StatusCode::BAD_REQUEST, "a query parameter is not what the route takes")
            }
            BadHeader => ("bad-header", StatusCode::BAD_REQUEST, "a header is not what the route takes"),
            UnsupportedMediaType => (
                "unsupported-media-type",
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "the body is not of the type the route takes",
            ),
            PayloadTooLarge => (
                "payload-too-large",
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is larger than the route accepts",
            ),
            TooLarge => (
                "too-large",
                StatusCode::UNPROCESSABLE_ENTITY,
                "the answer asked for would be larger than one answer may be",
            ),
            StorageQuota => {
                ("storage-quota", StatusCode::PAYLOAD_TOO_LARGE, "the team's storage quota has no room for it")
            }
            InsufficientStorage => {
                ("insufficient-storage", StatusCode::INSUFFICIENT_STORAGE, "the server's disk has no room for it")
            }
            Unauthorized => ("unauthorized", StatusCode::UNAUTHORIZED, "no valid token"),
            Forbidden => ("forbidden", StatusCode::FORBIDDEN, "the token may not do this"),
            NotFound => ("not-found", StatusCode::NOT_FOUND, "no such thing, or not the caller's to see"),
            MethodNotAllowed => {
                ("method-not-allowed", StatusCode::METHOD_NOT_ALLOWED, "the route does not take this method")
            }
            Conflict => ("conflict", StatusCode::CONFLICT, "the thing is not in a state that allows this"),
            QueueFull => ("queue-full", StatusCode::TOO_MANY_REQUESTS, "the team's queue has no room; retry later"),
            RateLimited => {
                ("rate-limited", StatusCode::TOO_MANY_REQUESTS, "too many requests from this token; retry later")
            }
            AddressBusy => (
                "address-busy",
                StatusCode::TOO_MANY_REQUESTS,
                "too many requests at once from this address; retry later",
            ),
            ServerBusy => (
                "server-busy",
                StatusCode::TOO_MANY_REQUESTS,
                "the server is at its limit of requests at once; retry later",
            ),
            TooManyStreams => ("too-many-streams", StatusCode::TOO_MANY_REQUESTS, "too many open streams; retry later"),
            ModelCheckBusy => {
                ("model-check-busy", StatusCode::TOO_MANY_REQUESTS, "every model check slot is busy; retry later")
            }
            NoModelChecker => {
                ("no-model-checker", StatusCode::SERVICE_UNAVAILABLE, "this server cannot check uploaded models")
            }
            NotReady => ("not-ready", StatusCode::SERVICE_UNAVAILABLE, "the server is not ready to serve"),
            RanksStillRunning => (
                "ranks-still-running",
                StatusCode::SERVICE_UNAVAILABLE,
                "the job's other ranks still run; report again",
            ),
            Timeout => ("timeout", StatusCode::SERVICE_UNAVAILABLE, "the request took longer than the server allows"),
            Internal => ("internal", StatusCode::INTERNAL_SERVER_ERROR, "a failure on the server's side"),
        }
    }
}

/// An RFC 7807 problem document.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    /// The kind of problem, one of [`ProblemType`]'s (`urn:ringtrain:problem:validation`, ...).
    #[serde(rename = "type")]
    pub kind: ProblemType,
    /// What that kind of problem is, in words (the same for every problem of its kind).
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
    kind: ProblemType,
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
    pub fn new(kind: ProblemType, detail: impl Into<String>) -> Self {
        ApiError { kind, detail: detail.into(), errors: Vec::new(), retry_after: None, cause: None }
    }

    /// 422: the request is well-formed but its content is wrong; every field problem listed.
    pub fn validation(errors: Vec<FieldError>) -> Self {
        let detail = match errors.as_slice() {
            [one] => one.to_string(),
            many => format!("{} problems with the request", many.len()),
        };
        ApiError { kind: ProblemType::Validation, detail, errors, retry_after: None, cause: None }
    }

    /// A problem with one field of the request (its JSON path, or a parameter's or header's name).
    pub fn field(kind: ProblemType, path: &str, reason: impl Into<String>) -> Self {
        let error = FieldError::new(path, reason);
        ApiError { kind, detail: error.to_string(), errors: vec![error], retry_after: None, cause: None }
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(ProblemType::BadRequest, detail)
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(ProblemType::NotFound, what)
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(ProblemType::Unauthorized, detail)
    }

    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(ProblemType::Forbidden, detail)
    }

    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(ProblemType::Conflict, detail)
    }

    /// A limit was reached (a 429 kind); the same request may succeed after `seconds`.
    pub fn too_many(kind: ProblemType, detail: impl Into<String>, seconds: u64) -> Self {
        Self::new(kind, detail).retry_after(seconds)
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
        let mut error = Self::new(ProblemType::Internal, "internal server error");
        error.cause = Some(InternalCause(Arc::new(cause)));
        error
    }

    /// The field problems of a validation error (422), to report with others; any other error as it is.
    pub fn into_field_errors(self) -> Result<Vec<FieldError>, ApiError> {
        if self.kind == ProblemType::Validation {
            Ok(self.errors)
        } else {
            Err(self)
        }
    }

    pub fn status(&self) -> StatusCode {
        self.kind.row().1
    }

    pub fn kind(&self) -> ProblemType {
        self.kind
    }

    pub fn problem(&self) -> Problem {
        let (_, status, title) = self.kind.row();
        Problem {
            kind: self.kind,
            title: title.to_string(),
            status: status.as_u16(),
            detail: self.detail.clone(),
            errors: self.errors.clone(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.problem()).unwrap_or_default();
        let status = self.status();
        let mut response = (status, body).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if status == StatusCode::UNAUTHORIZED {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_type_has_its_own_slug_and_serializes_as_its_urn() {
        let mut slugs: Vec<&str> = ProblemType::ALL.iter().map(|k| k.row().0).collect();
        for kind in ProblemType::ALL {
            let urn = serde_json::to_value(kind).unwrap();
            assert_eq!(urn, format!("urn:ringtrain:problem:{}", kind.row().0), "{kind:?}");
        }
        slugs.sort();
        slugs.dedup();
        assert_eq!(slugs.len(), ProblemType::ALL.len(), "two kinds share a slug");
    }

    /// The user guide's "Errors" table lists every problem type with its status, so that clients can
    /// match on them without reading the code.
    #[test]
    fn the_user_guide_lists_every_problem_type() {
        let guide = include_str!("../../docs/user-guide.md");
        for kind in ProblemType::ALL {
            let (slug, status, _) = kind.row();
            let row = format!("| `{slug}` | {} |", status.as_u16());
            assert!(guide.contains(&row), "docs/user-guide.md lacks the row {row}");
        }
    }
}
