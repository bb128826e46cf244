//! The agent's side of the /v1/agent API: typed calls with the agent token, in the shared wire types of
//! [`ringtrain_protocol`].

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use ringtrain_client::{ApiClient, CallError, Method};
use ringtrain_core::{AssignmentId, AssignmentState, JobId, NodeId};
use ringtrain_protocol::{
    AssignmentUpdate, AttemptBody, EndpointReport, MetricsBatch, Node, Poll, RegisterDevice, RegisterNode, ResultAck,
    ResultReport,
};
use serde_json::{Map, Value};

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
}

/// The /v1/agent calls of one agent.
#[derive(Debug, Clone)]
pub struct Client {
    api: ApiClient,
}

impl Client {
    pub fn new(base: &str, token: &str, transport: &ringtrain_client::Transport) -> Result<Client> {
        Ok(Client { api: ApiClient::with_transport(base, token, transport)? })
    }

    pub async fn register(&self, name: &str, address: &str, devices: &[RegisterDevice]) -> Result<Node, CallError> {
        let body =
            RegisterNode { name: name.to_string(), address: Some(address.to_string()), devices: devices.to_vec() };
        self.api.post("/v1/agent/nodes", &body).await
    }

    /// The node's self-test: the node as the server now has it (in quarantine if a check failed).
    pub async fn self_test(
        &self,
        node: NodeId,
        report: &ringtrain_protocol::SelfTestReport,
    ) -> Result<Node, CallError> {
        self.api.post(&format!("/v1/agent/nodes/{node}/self-test"), report).await
    }

    pub async fn heartbeat(&self, node: NodeId) -> Result<(), CallError> {
        self.api.post::<Value>(&format!("/v1/agent/nodes/{node}/heartbeat"), &serde_json::json!({})).await.map(drop)
    }

    /// Long poll: answers when something changed after `since`, or after `wait`.
    pub async fn poll(&self, node: NodeId, since: Option<u64>, wait: Duration) -> Result<Poll, CallError> {
        let query = match since {
            Some(v) => format!("?since={v}&wait_s={}", wait.as_secs()),
            None => String::new(),
        };
        let path = format!("/v1/agent/nodes/{node}/assignments{query}");
        self.api.call(Method::GET, &path, None::<&()>, wait + Duration::from_secs(15)).await
    }

    pub async fn set_assignment_state(
        &self,
        assignment: AssignmentId,
        from: AssignmentState,
        to: AssignmentState,
    ) -> Result<(), CallError> {
        let body = AssignmentUpdate { from: from.to_string(), to: to.to_string() };
        self.api.post::<Value>(&format!("/v1/agent/assignments/{assignment}/state"), &body).await.map(drop)
    }

    pub async fn report_endpoint(&self, assignment: AssignmentId, address: &str) -> Result<(), CallError> {
        let body = EndpointReport { address: address.to_string() };
        self.api.post::<Value>(&format!("/v1/agent/assignments/{assignment}/endpoint"), &body).await.map(drop)
    }

    pub async fn job_running(&self, job: JobId, attempt: i32) -> Result<(), CallError> {
        self.api.post_ignoring_answer(&format!("/v1/agent/jobs/{job}/running"), &AttemptBody { attempt }).await
    }

    pub async fn report_metrics(
        &self,
        job: JobId,
        attempt: i32,
        reports: &[Map<String, Value>],
    ) -> Result<(), CallError> {
        let body = MetricsBatch { attempt, reports: reports.to_vec() };
        self.api.post::<Value>(&format!("/v1/agent/jobs/{job}/metrics"), &body).await.map(drop)
    }

    /// A batch of one rank's output lines; the server stores each line once.
    pub async fn report_logs(&self, job: JobId, batch: &ringtrain_protocol::LogBatch) -> Result<(), CallError> {
        self.api.post::<Value>(&format!("/v1/agent/jobs/{job}/logs"), batch).await.map(drop)
    }

    pub async fn report_result(&self, job: JobId, report: &ResultReport) -> Result<ResultAck, CallError> {
        self.api.post(&format!("/v1/agent/jobs/{job}/result"), report).await
    }

    /// Uploads a checkpoint archive and registers it.
    /// Uploads the archive at `file`, streamed from disk.
    pub async fn upload_checkpoint(
        &self,
        job: JobId,
        archive: &CheckpointArchive,
        file: &Path,
    ) -> Result<(), CallError> {
        let a = archive;
        let path = format!(
            "/v1/agent/jobs/{job}/checkpoints/{}?attempt={}&epoch={}&iteration={}&final={}",
            a.name, a.attempt, a.epoch, a.iteration, a.is_final
        );
        let unreadable = |err: std::io::Error| CallError {
            status: None,
            message: format!("cannot read the archive {}: {err}", file.display()),
        };
        let opened = tokio::fs::File::open(file).await.map_err(unreadable)?;
        let length = opened.metadata().await.map_err(unreadable)?.len();
        self.api.put_file(&path, opened, length, Duration::from_secs(600)).await
    }

    /// Downloads `path` into `to`, checking its sha256 when one is given (two ranks of a node may fetch the
    /// same dataset at once: each writes a name of its own first).
    pub async fn download(&self, path: &str, to: &Path, sha256: Option<&str>) -> Result<()> {
        self.api.download(path, to, sha256, Duration::from_secs(3600)).await?;
        Ok(())
    }
}
