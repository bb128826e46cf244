//! The one HTTP client of ringtrain's API: calls with a bearer token, JSON in and out, and an answer that is
//! not a success turned into a [`CallError`] carrying the server's problem+json detail. The node agent's
//! typed `/v1/agent` calls and the command line's (`jobs watch`, `bench submit`) are built on it. (The API
//! load benchmark keeps its own raw HTTP/1.1 connections: it measures the server, not a client library.)

use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
pub use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// A failed call: the HTTP status when the server answered (its problem+json detail in the message), None
/// when it could not be reached or its answer could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    pub status: Option<StatusCode>,
    pub message: String,
}

impl CallError {
    /// The server refused the call (4xx): repeating it cannot help. A 5xx or no answer at all may pass.
    pub fn is_final(&self) -> bool {
        self.status.is_some_and(|s| s.is_client_error())
    }
}

/// How long a call without a timeout of its own may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A server's base URL and the bearer token to call it with.
#[derive(Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("ApiClient").field("base", &self.base).finish_non_exhaustive()
    }
}

impl ApiClient {
    pub fn new(base: &str, token: &str) -> Result<ApiClient, CallError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| CallError { status: None, message: format!("cannot build the HTTP client: {e}") })?;
        Ok(ApiClient { http, base: base.trim_end_matches('/').to_string(), token: token.to_string() })
    }

    /// A request to `path` (absolute, e.g. `/v1/jobs`), not yet sent.
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base))
    }

    /// Sends a request with the token; a non-success answer becomes a [`CallError`] with its detail.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, CallError> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| CallError { status: None, message: format!("cannot reach {}: {e}", self.base) })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let detail = body.get("detail").and_then(Value::as_str).unwrap_or("no detail");
        let errors = body.get("errors").map(|e| format!(" {e}")).unwrap_or_default();
        Err(CallError { status: Some(status), message: format!("{status}: {detail}{errors}") })
    }

    /// A JSON call: `body` (if any) as JSON, the answer read as `T`.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
        timeout: Duration,
    ) -> Result<T, CallError> {
        let mut request = self.request(method, path).timeout(timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = self.send(request).await.map_err(|e| CallError { message: format!("{path}: {e}"), ..e })?;
        response
            .json()
            .await
            .map_err(|e| CallError { status: None, message: format!("unreadable answer from {path}: {e}") })
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CallError> {
        self.call(Method::GET, path, None::<&()>, DEFAULT_TIMEOUT).await
    }

    pub async fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T, CallError> {
        self.call(Method::POST, path, Some(body), DEFAULT_TIMEOUT).await
    }

    /// A POST whose answer is not read (some routes answer with an empty body).
    pub async fn post_ignoring_answer(&self, path: &str, body: &impl Serialize) -> Result<(), CallError> {
        let request = self.request(Method::POST, path).json(body).timeout(DEFAULT_TIMEOUT);
        self.send(request).await.map(drop)
    }

    /// A PUT of raw bytes.
    pub async fn put_bytes(&self, path: &str, bytes: bytes::Bytes, timeout: Duration) -> Result<(), CallError> {
        let request = self
            .request(Method::PUT, path)
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(bytes)
            .timeout(timeout);
        self.send(request).await.map(drop)
    }
}
