//! The agent's side of the /v1/agent API: typed calls over HTTP with the agent token.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// A failed call: the HTTP status when the server answered (its problem+json detail in the message), None
/// when it could not be reached.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    pub status: Option<StatusCode>,
    pub message: String,
}

impl CallError {
    /// The server answered that this report is stale or unknown (another report won, or the placement is
    /// over): retrying cannot help.
    pub fn is_final(&self) -> bool {
        self.status.is_some_and(|s| s.is_client_error())
    }
}

#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Node {
    pub id: Uuid,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Assignment {
    pub id: Uuid,
    pub job_id: Uuid,
    pub attempt: i32,
    pub rank: i32,
    pub world_size: i32,
    pub state: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Checkpoint {
    pub id: Uuid,
    pub sha256: String,
    pub epoch: i64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Work {
    pub assignment: Assignment,
    pub spec: Value,
    pub rendezvous: Option<String>,
    pub resume: Option<Checkpoint>,
    /// The device's index on this node (the CUDA ordinal of a GPU).
    #[serde(default)]
    pub device_index: i32,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Poll {
    pub version: u64,
    pub work: Vec<Work>,
    pub stop: Vec<Uuid>,
    #[serde(default)]
    pub preempt: Vec<Uuid>,
}

/// A checkpoint folder packed as a tar archive, with what the server records about it.
#[derive(Debug, Clone)]
pub struct CheckpointArchive {
    /// `epoch-NNNN`.
    pub name: String,
    pub attempt: i32,
    /// Epochs done.
    pub epoch: u64,
    /// The next global iteration.
    pub iteration: u64,
    pub is_final: bool,
    pub bytes: axum::body::Bytes,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceInfo {
    pub index: u32,
    pub kind: String,
    pub name: String,
    pub memory_bytes: Option<u64>,
}

impl Client {
    pub fn new(base: &str, token: &str) -> Result<Client> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Client { http, base: base.trim_end_matches('/').to_string(), token: token.to_string() })
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, CallError> {
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

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        timeout: Duration,
    ) -> Result<T, CallError> {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).timeout(timeout);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = self.send(request).await?;
        response
            .json()
            .await
            .map_err(|e| CallError { status: None, message: format!("unreadable answer from {path}: {e}") })
    }

    async fn post<T: DeserializeOwned>(&self, path: &str, body: Value) -> Result<T, CallError> {
        self.call(Method::POST, path, Some(body), Duration::from_secs(30)).await
    }

    pub async fn register(&self, name: &str, address: &str, devices: &[DeviceInfo]) -> Result<Node, CallError> {
        self.post("/v1/agent/nodes", json!({"name": name, "address": address, "devices": devices})).await
    }

    pub async fn heartbeat(&self, node: Uuid) -> Result<(), CallError> {
        self.post::<Value>(&format!("/v1/agent/nodes/{node}/heartbeat"), json!({})).await.map(drop)
    }

    /// Long poll: answers when something changed after `since`, or after `wait`.
    pub async fn poll(&self, node: Uuid, since: Option<u64>, wait: Duration) -> Result<Poll, CallError> {
        let query = match since {
            Some(v) => format!("?since={v}&wait_s={}", wait.as_secs()),
            None => String::new(),
        };
        let path = format!("/v1/agent/nodes/{node}/assignments{query}");
        self.call(Method::GET, &path, None, wait + Duration::from_secs(15)).await
    }

    pub async fn set_assignment_state(&self, assignment: Uuid, from: &str, to: &str) -> Result<(), CallError> {
        self.post::<Value>(&format!("/v1/agent/assignments/{assignment}/state"), json!({"from": from, "to": to}))
            .await
            .map(drop)
    }

    pub async fn report_endpoint(&self, assignment: Uuid, address: &str) -> Result<(), CallError> {
        self.post::<Value>(&format!("/v1/agent/assignments/{assignment}/endpoint"), json!({"address": address}))
            .await
            .map(drop)
    }

    pub async fn job_running(&self, job: Uuid, attempt: i32) -> Result<(), CallError> {
        let path = format!("/v1/agent/jobs/{job}/running");
        let request = self.http.post(format!("{}{path}", self.base)).json(&json!({"attempt": attempt}));
        self.send(request.timeout(Duration::from_secs(30))).await.map(drop)
    }

    pub async fn report_metrics(
        &self,
        job: Uuid,
        attempt: i32,
        reports: &[Map<String, Value>],
    ) -> Result<(), CallError> {
        self.post::<Value>(&format!("/v1/agent/jobs/{job}/metrics"), json!({"attempt": attempt, "reports": reports}))
            .await
            .map(drop)
    }

    pub async fn report_result(&self, job: Uuid, attempt: i32, report: Value) -> Result<Value, CallError> {
        let mut body = report;
        body["attempt"] = json!(attempt);
        self.post(&format!("/v1/agent/jobs/{job}/result"), body).await
    }

    /// Uploads a checkpoint archive and registers it.
    pub async fn upload_checkpoint(&self, job: Uuid, archive: &CheckpointArchive) -> Result<(), CallError> {
        let a = archive;
        let url = format!(
            "{}/v1/agent/jobs/{job}/checkpoints/{}?attempt={}&epoch={}&iteration={}&final={}",
            self.base, a.name, a.attempt, a.epoch, a.iteration, a.is_final
        );
        let request = self
            .http
            .put(url)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(a.bytes.clone())
            .timeout(Duration::from_secs(600));
        self.send(request).await.map(drop)
    }

    /// Downloads `path` into `to`, checking its sha256 when one is given.
    pub async fn download(&self, path: &str, to: &Path, sha256: Option<&str>) -> Result<()> {
        let request = self.http.get(format!("{}{path}", self.base)).timeout(Duration::from_secs(3600));
        let mut response = self.send(request).await?;
        // A name of its own: two ranks of a node may fetch the same dataset at once.
        let partial = to.with_extension(format!("part-{}", Uuid::new_v4()));
        let mut file =
            tokio::fs::File::create(&partial).await.with_context(|| format!("cannot create {}", partial.display()))?;
        let mut hasher = Sha256::new();
        while let Some(chunk) = response.chunk().await.context("the download broke off")? {
            hasher.update(&chunk);
            tokio::io::AsyncWriteExt::write_all(&mut file, &chunk).await?;
        }
        tokio::io::AsyncWriteExt::flush(&mut file).await?;
        let digest = ringtrain_api::hex(&hasher.finalize());
        if let Some(expected) = sha256.filter(|e| !e.eq_ignore_ascii_case(&digest)) {
            let _ = tokio::fs::remove_file(&partial).await;
            anyhow::bail!("{path}: sha256 {digest} does not match the expected {expected}");
        }
        tokio::fs::rename(&partial, to).await?;
        Ok(())
    }
}
