//! The bodies and queries of the `/v1/agent` calls, in the order an agent makes them: register its node,
//! heartbeat, long-poll for work, report rank 0's endpoint, move assignments along, report the job running,
//! relay metrics, upload checkpoints, report the result. Request bodies refuse unknown fields, so a typo in
//! an agent is a 422, not a silently ignored field.

use chrono::{DateTime, Utc};
use ringtrain_core::{AssignmentId, Effective, JobState, ModelId, NodeId};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use crate::records::{Assignment, Checkpoint};

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterDevice {
    /// CUDA ordinal, or 0.. for CPU slots.
    pub index: u32,
    /// `cpu` or `gpu`.
    pub kind: String,
    pub name: String,
    pub memory_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterNode {
    /// Unique in the pool (the host name, usually).
    pub name: String,
    /// Where the node's ranks can be reached by other ranks (host or IP).
    pub address: Option<String>,
    pub devices: Vec<RegisterDevice>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HeartbeatAck {
    pub node_id: NodeId,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PollQuery {
    /// The `version` of the previous answer: wait until something changed since.
    pub since: Option<u64>,
    /// The longest to wait, in seconds (capped by the server, 20 s by default); 0 answers at once.
    pub wait_s: Option<u64>,
}

/// What a node should run and stop.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Poll {
    /// Pass it back as `since`: the poll then waits until something changed after this answer. The
    /// database's change version: valid on every server of the pool and across their restarts.
    pub version: u64,
    /// Ranks to run (pending ones are marked delivered by this poll; delivered and running ones are repeated,
    /// so a restarted agent finds them again).
    pub work: Vec<Work>,
    /// Assignments that are over on the server's side (their job finished, was cancelled or failed, or this
    /// placement was requeued): stop their ranks at once if they still run, then report each one ended
    /// (done, failed or cancelled), which frees its device.
    pub stop: Vec<AssignmentId>,
    /// Assignments of a placement the scheduler preempted: ask their ranks to stop after a checkpoint of where
    /// they are (`ringtrain train --stop-file`), upload it (rank 0), then report them cancelled.
    #[serde(default)]
    pub preempt: Vec<AssignmentId>,
}

/// One rank to run: its assignment and what it trains.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Work {
    /// `delivered` (start it) or `running` (it should be running here; an agent that has no such process,
    /// having restarted, reports it failed).
    pub assignment: Assignment,
    #[schema(value_type = Object)]
    pub spec: Value,
    /// The hyperparameters the job runs with (the rank works them out again from the spec and the
    /// dataset; these are for logs and tools); null while the dataset's size is unknown.
    #[schema(value_type = Option<Object>)]
    pub effective: Option<Effective>,
    pub dataset_size: Option<i64>,
    /// Rank 0's HOST:PORT, once its agent reported it: ranks above 0 wait for it.
    pub rendezvous: Option<String>,
    /// The checkpoint to resume from (the job's newest), for rank 0 to download and broadcast.
    pub resume: Option<Checkpoint>,
    /// Rank 0 of a fork (a spec with `init_from`) that does not resume: download the job's starting
    /// checkpoint (`GET /v1/agent/jobs/{id}/init`) and start from its weights.
    #[serde(default)]
    pub init_weights: bool,
    /// The secret this placement's ranks prove to each other in the rendezvous and on the ring; the agent
    /// hands it to the rank in its environment (never in argv).
    #[serde(default)]
    pub rendezvous_secret: Option<String>,
    /// The sha256 of the uploaded dataset the job trains on (when it does): the agent checks its download,
    /// and its cached copy, against it.
    #[serde(default)]
    pub dataset_sha256: Option<String>,
    /// For an `idx:` or `shards:` data set: the granted folder its path lies under (the team's, or one of
    /// the server's `--idx-root`). The agent checks the path, links followed, is still inside it (and
    /// inside one of its own `--idx-root` folders): a link in one team's folder cannot lead to another's.
    #[serde(default)]
    pub dataset_root: Option<String>,
    /// The uploaded TorchScript model the job trains (when it does), for the agent to download and check.
    #[serde(default)]
    pub model: Option<ModelFile>,
    /// The index of the assignment's device on this node (the CUDA ordinal for a GPU).
    pub device_index: i32,
    /// Every rank of this placement runs on this node: the agent gives them one shared memory segment,
    /// and CPU ranks all-reduce through it instead of the TCP ring.
    #[serde(default)]
    pub ranks_on_one_node: bool,
}

impl Work {
    /// The spec, typed: the agent reads its fields this way, never by JSON key. (It travels as the JSON the
    /// team submitted, which the rank parses again from its `spec.json`.)
    pub fn job_spec(&self) -> Result<ringtrain_core::JobSpec, serde_json::Error> {
        serde_json::from_value(self.spec.clone())
    }
}

/// An uploaded model a rank needs: its file's id and sha256, and its inputs in `forward`'s order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelFile {
    pub id: ModelId,
    pub sha256: String,
    pub inputs: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EndpointReport {
    /// Where rank 0 listens for the other ranks: HOST:PORT.
    pub address: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AssignmentUpdate {
    /// The state the agent saw (`delivered`, `running`).
    pub from: String,
    /// `running`, `done`, `failed`, or `cancelled` (stopped because a poll said so).
    pub to: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttemptBody {
    pub attempt: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricsBatch {
    pub attempt: i32,
    /// Rank reports as they print them: `{"kind": "iteration", "rank": 0, "epoch": 0, "iteration": 20,
    /// "lr": 0.1, "loss": 2.3, ...}`; every field besides kind/rank/epoch/iteration must be a number.
    #[schema(value_type = Vec<Object>)]
    pub reports: Vec<Map<String, Value>>,
}

/// A batch of one rank's output lines (stderr, and stdout lines that are not metric reports).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LogBatch {
    pub attempt: i32,
    pub rank: i32,
    pub lines: Vec<LogLine>,
}

/// One line a rank printed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LogLine {
    /// The line's number in the rank's output (from 0): a batch sent again stores nothing twice.
    pub seq: i64,
    /// When the agent read it.
    pub at: chrono::DateTime<chrono::Utc>,
    /// `stderr` or `stdout`.
    pub stream: String,
    /// The text, at most 4 KiB (longer lines are cut).
    pub text: String,
}

/// The longest line kept, in bytes.
pub const MAX_LOG_LINE_BYTES: usize = 4096;

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LogAck {
    /// Lines stored.
    pub stored: u64,
    /// Lines left out: beyond the job's rate or its total.
    pub dropped: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MetricsAck {
    /// Reports stored.
    pub accepted: usize,
    /// Iteration reports left out because the job went over its budget of reports per second.
    #[serde(default)]
    pub downsampled: usize,
    /// Of the iteration reports, only iterations that are multiples of this were kept.
    #[serde(default = "one")]
    pub stride: i64,
}

fn one() -> i64 {
    1
}

/// Where a checkpoint archive comes from (the query of its upload).
#[derive(Debug, Clone, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ArchiveParams {
    /// The placement that wrote it (the agent protocol's attempt).
    pub attempt: i32,
    /// Epochs done when it was written.
    pub epoch: u32,
    /// The next global iteration when it was written.
    pub iteration: u64,
    /// The finished job's weights.
    #[serde(default)]
    pub r#final: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Succeeded,
    Failed,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResultReport {
    pub attempt: i32,
    pub outcome: Outcome,
    /// Final metrics (test error, wall time, ...), for `succeeded`.
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    /// What went wrong, for `failed`.
    pub error: Option<String>,
    /// A failure worth retrying from the last checkpoint (a lost node, a killed rank), while restarts remain.
    #[serde(default)]
    pub retryable: bool,
}

impl ResultReport {
    pub fn succeeded(attempt: i32, result: Option<Value>) -> Self {
        ResultReport { attempt, outcome: Outcome::Succeeded, result, error: None, retryable: false }
    }

    pub fn failed(attempt: i32, error: impl Into<String>, retryable: bool) -> Self {
        ResultReport { attempt, outcome: Outcome::Failed, result: None, error: Some(error.into()), retryable }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ResultAck {
    /// The job's state after the report: succeeded, failed, or queued (to be retried).
    #[schema(value_type = String)]
    pub state: JobState,
}

/// `ringtrain self-test --json`, which an agent runs at start and while idle and sends to
/// `POST /v1/agent/nodes/{id}/self-test`: a failed check sets the node aside (no new placements) until a
/// platform admin lifts it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SelfTestReport {
    pub checks: Vec<SelfTestCheck>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SelfTestCheck {
    /// `matmul` (a known matrix product in libtorch) or `allreduce` (a known sum over shared memory).
    pub name: String,
    pub passed: bool,
    /// What was wrong, or what was measured.
    pub detail: String,
    /// False when the check could not run at all (a timeout, a port, the binary replaced by an upgrade):
    /// that says nothing of the node's arithmetic, and sets nothing aside.
    #[serde(default = "ran_by_default")]
    pub ran: bool,
}

fn ran_by_default() -> bool {
    true
}

impl SelfTestReport {
    /// The checks that ran and found a wrong result, in words ("matmul: ..."); None when there are none.
    pub fn failure(&self) -> Option<String> {
        let failed: Vec<String> =
            self.checks.iter().filter(|c| c.ran && !c.passed).map(|c| format!("{}: {}", c.name, c.detail)).collect();
        (!failed.is_empty()).then(|| failed.join("; "))
    }
}

#[cfg(test)]
mod self_test_tests {
    use super::*;

    #[test]
    fn only_a_wrong_result_is_a_failure_and_a_check_that_did_not_run_is_not() {
        let check = |name: &str, passed: bool, ran: bool| SelfTestCheck {
            name: name.into(),
            passed,
            detail: if passed { "exact".into() } else { "wrong at [1, 1]".into() },
            ran,
        };
        let passed = SelfTestReport { checks: vec![check("matmul", true, true), check("allreduce", true, true)] };
        assert_eq!(passed.failure(), None);
        let not_run = SelfTestReport { checks: vec![check("self-test", false, false)] };
        assert_eq!(not_run.failure(), None, "a test that could not run says nothing of the node");
        let wrong = SelfTestReport { checks: vec![check("matmul", false, true), check("allreduce", true, true)] };
        assert_eq!(wrong.failure().as_deref(), Some("matmul: wrong at [1, 1]"));
        // an older agent's report, without `ran`, counts as run
        let old: SelfTestCheck =
            serde_json::from_value(serde_json::json!({"name": "matmul", "passed": false, "detail": "x"})).unwrap();
        assert!(old.ran);
    }
}
