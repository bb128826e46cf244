//! The one HTTP client of ringtrain's API: calls with a bearer token, JSON in and out, and an answer that is
//! not a success turned into a [`CallError`] carrying the server's problem+json detail. The node agent's
//! typed `/v1/agent` calls and the command line's (`jobs watch`, `ringtrain-bench submit`) are built on it. (The API
//! load benchmark keeps its own raw HTTP/1.1 connections: it measures the server, not a client library.)

use ringtrain_views as views;
use std::path::Path;
use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
pub use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// A failed call: the HTTP status when the server answered (its problem+json detail in the message), None
/// when it could not be reached or its answer could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    pub status: Option<StatusCode>,
    pub message: String,
}

impl CallError {
    /// The server refused the call (4xx): repeating it cannot help. A 5xx, no answer at all, a 429 (a limit
    /// that passes: see `Retry-After`) or a 408 may pass.
    pub fn is_final(&self) -> bool {
        self.status.is_some_and(|s| {
            s.is_client_error() && s != StatusCode::TOO_MANY_REQUESTS && s != StatusCode::REQUEST_TIMEOUT
        })
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

/// How a client reaches the server: which CA to trust beyond the system's, and whether plain `http://` to
/// a machine other than this one is allowed (it sends the bearer token in clear).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Transport {
    /// A PEM file of the CA that signed the server's certificate (a private CA), trusted besides the
    /// system's.
    #[arg(long, env = "RINGTRAIN_CA_CERT")]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Allow http:// to a server that is not on this machine: the token and the data then cross the
    /// network in clear. Only on a network you trust.
    #[arg(long)]
    pub allow_insecure_http: bool,
}

impl Transport {
    /// Refuses plain http:// to a server that is not on this machine, unless allowed. The base is parsed as
    /// reqwest will read it (scheme and host are case-insensitive: `HTTP://host` is plain http too), and one
    /// that is not a URL is refused rather than guessed at.
    pub fn check(&self, base: &str) -> Result<(), CallError> {
        let url = reqwest::Url::parse(base)
            .map_err(|e| CallError { status: None, message: format!("{base} is not a server URL: {e}") })?;
        if url.scheme() != "http" || is_this_machine(&url) || self.allow_insecure_http {
            return Ok(());
        }
        let host = host_of(&url);
        Err(CallError {
            status: None,
            message: format!(
                "refusing plain http:// to {host}: the token would cross the network in clear; use https:// (with \
                 --ca-cert for a private CA), or --allow-insecure-http on a network you trust"
            ),
        })
    }
}

/// The URL's host without an IPv6 address's brackets ("" when it has none).
fn host_of(url: &reqwest::Url) -> &str {
    url.host_str().unwrap_or("").trim_start_matches('[').trim_end_matches(']')
}

/// `localhost` or a loopback address: plain http never leaves the machine. (The URL parser has lowercased
/// the host already.)
fn is_this_machine(url: &reqwest::Url) -> bool {
    let host = host_of(url);
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl ApiClient {
    /// A client for a server on this machine, or one reached over https:// with the system's CAs.
    pub fn new(base: &str, token: &str) -> Result<ApiClient, CallError> {
        Self::with_transport(base, token, &Transport::default())
    }

    pub fn with_transport(base: &str, token: &str, transport: &Transport) -> Result<ApiClient, CallError> {
        transport.check(base)?;
        let build_error = |e: String| CallError { status: None, message: format!("cannot build the HTTP client: {e}") };
        let mut builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(5));
        if let Some(path) = &transport.ca_cert {
            let pem = std::fs::read(path).map_err(|e| build_error(format!("cannot read {}: {e}", path.display())))?;
            let ca = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| build_error(format!("{} is not a PEM certificate: {e}", path.display())))?;
            builder = builder.add_root_certificate(ca);
        }
        let http = builder.build().map_err(|e| build_error(e.to_string()))?;
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
        // every field problem on its own line, `path: reason`, as a person reads them
        let errors: String = body
            .get("errors")
            .and_then(Value::as_array)
            .filter(|errors| errors.len() > 1)
            .map(|errors| {
                errors
                    .iter()
                    .map(|e| {
                        let path = e.get("path").and_then(Value::as_str).unwrap_or("?");
                        format!("\n  {path}: {}", e.get("reason").and_then(Value::as_str).unwrap_or(""))
                    })
                    .collect()
            })
            .unwrap_or_default();
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
        let response = self.send(request).await.map_err(|e| in_call(path, e))?;
        read_json(path, response).await
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CallError> {
        self.call(Method::GET, path, None::<&()>, DEFAULT_TIMEOUT).await
    }

    pub async fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T, CallError> {
        self.call(Method::POST, path, Some(body), DEFAULT_TIMEOUT).await
    }

    pub async fn patch<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T, CallError> {
        self.call(Method::PATCH, path, Some(body), DEFAULT_TIMEOUT).await
    }

    /// A DELETE whose answer is not read (204).
    pub async fn delete(&self, path: &str) -> Result<(), CallError> {
        let request = self.request(Method::DELETE, path).timeout(DEFAULT_TIMEOUT);
        self.send(request).await.map(drop).map_err(|e| CallError { message: format!("{path}: {e}"), ..e })
    }

    /// A POST whose answer is not read (some routes answer with an empty body).
    pub async fn post_ignoring_answer(&self, path: &str, body: &impl Serialize) -> Result<(), CallError> {
        let request = self.request(Method::POST, path).json(body).timeout(DEFAULT_TIMEOUT);
        self.send(request).await.map(drop)
    }

    /// PUTs a file's bytes as `application/octet-stream`, streamed from disk (`length` bytes).
    pub async fn put_file(
        &self,
        path: &str,
        file: tokio::fs::File,
        length: u64,
        timeout: Duration,
    ) -> Result<(), CallError> {
        self.send(self.file_request(Method::PUT, path, file, length, timeout)).await.map(drop)
    }

    /// POSTs a file's bytes as `application/octet-stream` (an upload, as `curl --data-binary @FILE` sends
    /// it), streamed from disk, and reads the JSON answer.
    pub async fn post_file<T: DeserializeOwned>(
        &self,
        path: &str,
        file: tokio::fs::File,
        length: u64,
        timeout: Duration,
    ) -> Result<T, CallError> {
        let request = self.file_request(Method::POST, path, file, length, timeout);
        let response = self.send(request).await.map_err(|e| in_call(path, e))?;
        read_json(path, response).await
    }

    fn file_request(
        &self,
        method: Method,
        path: &str,
        file: tokio::fs::File,
        length: u64,
        timeout: Duration,
    ) -> reqwest::RequestBuilder {
        self.request(method, path)
            .header(CONTENT_TYPE, "application/octet-stream")
            .header(reqwest::header::CONTENT_LENGTH, length)
            .body(reqwest::Body::from(file))
            .timeout(timeout)
    }

    /// Downloads `path` into the file `to`, checking its sha256 when one is given, and returns the sha256.
    /// It is written under a name of its own and renamed when whole, so `to` is never half written (and two
    /// callers may fetch the same file at once).
    pub async fn download(
        &self,
        path: &str,
        to: &Path,
        sha256: Option<&str>,
        timeout: Duration,
    ) -> Result<String, CallError> {
        let failed = |what: String| CallError { status: None, message: format!("{path}: {what}") };
        let mut response = self.send(self.request(Method::GET, path).timeout(timeout)).await?;
        let partial = to.with_extension(format!("part-{}", uuid::Uuid::new_v4()));
        let mut file = tokio::fs::File::create(&partial)
            .await
            .map_err(|e| failed(format!("cannot create {}: {e}", partial.display())))?;
        let mut hasher = Sha256::new();
        let written = async {
            while let Some(chunk) =
                response.chunk().await.map_err(|e| failed(format!("the download broke off: {e}")))?
            {
                hasher.update(&chunk);
                file.write_all(&chunk).await.map_err(|e| failed(format!("cannot write {}: {e}", partial.display())))?;
            }
            file.flush().await.map_err(|e| failed(format!("cannot write {}: {e}", partial.display())))
        }
        .await;
        let digest = format!("{:x}", hasher.finalize());
        let checked = written.and_then(|()| match sha256 {
            Some(expected) if !expected.eq_ignore_ascii_case(&digest) => {
                Err(failed(format!("sha256 {digest} does not match the expected {expected}")))
            }
            _ => Ok(()),
        });
        if let Err(err) = checked {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(err);
        }
        tokio::fs::rename(&partial, to).await.map_err(|e| failed(format!("cannot write {}: {e}", to.display())))?;
        Ok(digest)
    }
}

/// A failed call's error, prefixed with the route it called.
fn in_call(path: &str, err: CallError) -> CallError {
    CallError { message: format!("{path}: {err}"), ..err }
}

/// A success's JSON body, read as `T`.
async fn read_json<T: DeserializeOwned>(path: &str, response: reqwest::Response) -> Result<T, CallError> {
    response
        .json()
        .await
        .map_err(|e| CallError { status: None, message: format!("unreadable answer from {path}: {e}") })
}

/// Typed calls, one per user route the command line uses, answering the types of `ringtrain-views` (the
/// agent's are in `ringtrain-agent`'s client, in `ringtrain-protocol`'s types). `job`, `study` and the like
/// take an id as the caller resolved it; queries are passed as the route's query string (`limit=50&tag=a`).
impl ApiClient {
    /// `GET /v1/nodes`: the worker pool, each device with who holds it.
    pub async fn nodes(&self) -> Result<views::nodes::NodeList, CallError> {
        self.get("/v1/nodes").await
    }

    /// `POST /v1/jobs`: submits `spec`; the job as stored (queued).
    pub async fn submit_job(&self, spec: &Value) -> Result<views::jobs::JobView, CallError> {
        self.post("/v1/jobs", spec).await
    }

    /// `POST /v1/jobs?dry_run=true`: what the scheduler would do with `spec` now; nothing is stored.
    pub async fn dry_run_job(&self, spec: &Value) -> Result<views::jobs::waiting::DryRunView, CallError> {
        self.post("/v1/jobs?dry_run=true", spec).await
    }

    /// `GET /v1/jobs?QUERY`: a page of the team's run history, newest first.
    pub async fn jobs(&self, query: &str) -> Result<views::jobs::JobPage, CallError> {
        self.get(&format!("/v1/jobs?{query}")).await
    }

    /// `GET /v1/jobs/{id}`: one job, with its standing, progress, resources and placements.
    pub async fn job(&self, job: &str) -> Result<views::jobs::JobView, CallError> {
        self.get(&format!("/v1/jobs/{job}")).await
    }

    /// `POST /v1/jobs/{id}/cancel`.
    pub async fn cancel_job(&self, job: &str) -> Result<views::jobs::JobView, CallError> {
        self.post(&format!("/v1/jobs/{job}/cancel"), &serde_json::json!({})).await
    }

    /// `POST /v1/jobs/{id}/resume`: a stopped or failed job back into the queue, from its newest checkpoint.
    pub async fn resume_job(&self, job: &str) -> Result<views::jobs::JobView, CallError> {
        self.post(&format!("/v1/jobs/{job}/resume"), &serde_json::json!({})).await
    }

    /// `PATCH /v1/jobs/{id}`: sets what `annotations` names of the job's tags and note.
    pub async fn annotate_job(&self, job: &str, annotations: &Value) -> Result<views::jobs::JobView, CallError> {
        self.patch(&format!("/v1/jobs/{job}"), annotations).await
    }

    /// `GET /v1/jobs/{id}/schedule`: the learning rates a job trains with (with `per_iteration`, the lr of
    /// every iteration too).
    pub async fn job_schedule(&self, job: &str, per_iteration: bool) -> Result<views::ScheduleView, CallError> {
        let query = if per_iteration { "?per_iteration=true" } else { "" };
        self.get(&format!("/v1/jobs/{job}/schedule{query}")).await
    }

    /// `GET /v1/jobs/{id}/metrics?QUERY`: a page of its ranks' reports.
    pub async fn job_metrics(&self, job: &str, query: &str) -> Result<views::jobs::records::MetricsPage, CallError> {
        self.get(&format!("/v1/jobs/{job}/metrics?{query}")).await
    }

    /// `GET /v1/jobs/{id}/logs?QUERY`: a page of its ranks' output lines.
    pub async fn job_logs(&self, job: &str, query: &str) -> Result<views::jobs::records::LogPage, CallError> {
        self.get(&format!("/v1/jobs/{job}/logs?{query}")).await
    }

    /// `GET /v1/jobs/{id}/checkpoints`: oldest first.
    pub async fn job_checkpoints(&self, job: &str) -> Result<views::jobs::records::CheckpointList, CallError> {
        self.get(&format!("/v1/jobs/{job}/checkpoints")).await
    }

    /// `GET /v1/studies?QUERY`: a page of the team's studies, newest first.
    pub async fn studies(&self, query: &str) -> Result<views::studies::StudyPage, CallError> {
        self.get(&format!("/v1/studies?{query}")).await
    }

    /// `POST /v1/studies`: starts the study `request` describes.
    pub async fn create_study(&self, request: &Value) -> Result<views::studies::StudyView, CallError> {
        self.post("/v1/studies", request).await
    }

    /// `POST /v1/studies?dry_run=true`: the points `request` would make, each with its schedule.
    pub async fn plan_study(&self, request: &Value) -> Result<views::studies::StudyDryRun, CallError> {
        self.post("/v1/studies?dry_run=true", request).await
    }

    /// `GET /v1/studies/{id}`: the study with every point's curves and costs.
    pub async fn study(&self, study: &str) -> Result<views::studies::StudyView, CallError> {
        self.get(&format!("/v1/studies/{study}")).await
    }

    /// `POST /v1/studies/{id}/cancel`: cancels every point not ended.
    pub async fn cancel_study(&self, study: &str) -> Result<views::studies::StudyView, CallError> {
        self.post(&format!("/v1/studies/{study}/cancel"), &serde_json::json!({})).await
    }

    /// `GET /v1/teams`: every team for a platform admin, its own for a team admin.
    pub async fn teams(&self) -> Result<views::teams::TeamList, CallError> {
        self.get("/v1/teams").await
    }

    /// `POST /v1/teams`: creates a team as `body` describes.
    pub async fn create_team(&self, body: &Value) -> Result<views::teams::Team, CallError> {
        self.post("/v1/teams", body).await
    }

    /// `GET /v1/teams/{id}/tokens`: the team's tokens, newest first (never their secrets).
    pub async fn team_tokens(&self, team: &str) -> Result<views::teams::TokenList, CallError> {
        self.get(&format!("/v1/teams/{team}/tokens")).await
    }

    /// `POST /v1/teams/{id}/tokens`: mints a token of the team as `body` describes; its secret is in this
    /// answer only.
    pub async fn create_team_token(&self, team: &str, body: &Value) -> Result<views::teams::CreatedToken, CallError> {
        self.post(&format!("/v1/teams/{team}/tokens"), body).await
    }

    /// `GET /v1/datasets`: the team's data sets, newest first.
    pub async fn datasets(&self) -> Result<views::artifacts::DatasetList, CallError> {
        self.get("/v1/datasets").await
    }

    /// `POST /v1/datasets/sharded`: registers a sharded data set where it lies.
    pub async fn register_sharded_dataset(&self, body: &Value) -> Result<views::artifacts::Dataset, CallError> {
        self.post("/v1/datasets/sharded", body).await
    }

    /// `GET /v1/models`: the team's uploaded models, newest first.
    pub async fn models(&self) -> Result<views::artifacts::ModelList, CallError> {
        self.get("/v1/models").await
    }

    /// `POST /v1/datasets/uploads`: starts uploading data set `name` of `size_bytes` in parts of
    /// `part_bytes`.
    pub async fn start_upload(
        &self,
        name: &str,
        size_bytes: u64,
        part_bytes: u64,
    ) -> Result<views::uploads::UploadView, CallError> {
        let body = serde_json::json!({"name": name, "size_bytes": size_bytes, "part_bytes": part_bytes});
        self.post("/v1/datasets/uploads", &body).await
    }

    /// `GET /v1/datasets/uploads/{id}`: an upload in progress and the parts it still needs.
    pub async fn upload(&self, id: &str) -> Result<views::uploads::UploadView, CallError> {
        self.get(&format!("/v1/datasets/uploads/{id}")).await
    }

    /// `POST /v1/schedules/preview?workers=…`: `spec`'s schedule at each world size of `workers`
    /// (comma-separated), side by side.
    pub async fn preview_schedules(
        &self,
        spec: &Value,
        workers: &str,
    ) -> Result<views::schedules::PreviewComparison, CallError> {
        let path = "/v1/schedules/preview";
        let request = self.request(Method::POST, path).query(&[("workers", workers)]).json(spec);
        let response = self.send(request.timeout(DEFAULT_TIMEOUT)).await.map_err(|e| in_call(path, e))?;
        read_json(path, response).await
    }
}

#[cfg(test)]
mod tests {
    use super::{CallError, StatusCode, Transport};

    #[test]
    fn a_refusal_is_final_but_a_limit_passes() {
        let answer = |status| CallError { status: Some(status), message: String::new() };
        assert!(answer(StatusCode::UNPROCESSABLE_ENTITY).is_final());
        assert!(answer(StatusCode::PAYLOAD_TOO_LARGE).is_final());
        assert!(!answer(StatusCode::TOO_MANY_REQUESTS).is_final());
        assert!(!answer(StatusCode::SERVICE_UNAVAILABLE).is_final());
        assert!(!CallError { status: None, message: String::new() }.is_final());
    }

    #[test]
    fn plain_http_goes_only_to_this_machine_unless_allowed() {
        let strict = Transport::default();
        for local in
            ["http://127.0.0.1:8080", "http://localhost:1/x", "http://[::1]:8080", "https://server.example:8443"]
        {
            assert!(strict.check(local).is_ok(), "{local}");
        }
        let err = strict.check("http://10.0.0.5:8080").unwrap_err().to_string();
        assert!(err.contains("refusing plain http:// to 10.0.0.5") && err.contains("--allow-insecure-http"), "{err}");
        let allowed = Transport { allow_insecure_http: true, ..Transport::default() };
        assert!(allowed.check("http://10.0.0.5:8080").is_ok());
    }

    #[test]
    fn the_plain_http_check_ignores_case_and_refuses_what_is_not_a_url() {
        let strict = Transport::default();
        for remote in ["HTTP://10.0.0.5:8080", "Http://server.example/", "http://localhost@10.0.0.5/"] {
            let err = strict.check(remote).unwrap_err().to_string();
            assert!(err.contains("refusing plain http://"), "{remote}: {err}");
        }
        for local in ["HTTP://LOCALHOST:8080", "HTTP://127.0.0.1:8080", "HTTPS://server.example"] {
            assert!(strict.check(local).is_ok(), "{local}");
        }
        let err = strict.check("http://").unwrap_err().to_string();
        assert!(err.contains("is not a server URL"), "{err}");
    }
}
