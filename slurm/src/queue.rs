//! Slurm's jobs as `squeue --json` lists them (Slurm's OpenAPI job document), and what their state means
//! to a ringtrain job waiting on them. 22.05 writes v0.0.38 (tested against it); from 23.02 on `job_state`
//! is a list of flags and numbers are objects (`{"set": true, "number": N}`): both forms are read, and a
//! field that is null or missing reads as empty.

use serde::Deserialize;

use crate::JobId;

/// One Slurm job, as much of it as ringtrain reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmJob {
    pub id: JobId,
    pub state: JobState,
    /// Why it waits (`Resources`, `Priority`, `QOSMaxGRESPerUser`, …); None when it does not.
    pub reason: Option<String>,
    pub comment: String,
    pub partition: String,
    /// The nodes it holds, in Slurm's compact form (`h[1-3]`); empty while it waits.
    pub nodes: String,
    /// When Slurm expects a waiting job to start (Unix seconds), once its backfill pass has computed it.
    pub expected_start: Option<u64>,
}

/// A job's state, as Slurm names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    Pending,
    Running,
    /// Running, or ending: its processes are being stopped.
    Completing,
    Completed,
    Cancelled,
    Failed,
    Timeout,
    NodeFail,
    Preempted,
    OutOfMemory,
    /// Anything else (SUSPENDED, BOOT_FAIL, DEADLINE, …), as Slurm names it.
    Other(String),
}

impl JobState {
    fn from_slurm(name: &str) -> JobState {
        match name {
            "PENDING" => JobState::Pending,
            "RUNNING" => JobState::Running,
            "COMPLETING" => JobState::Completing,
            "COMPLETED" => JobState::Completed,
            "CANCELLED" => JobState::Cancelled,
            "FAILED" => JobState::Failed,
            "TIMEOUT" => JobState::Timeout,
            "NODE_FAIL" => JobState::NodeFail,
            "PREEMPTED" => JobState::Preempted,
            "OUT_OF_MEMORY" => JobState::OutOfMemory,
            other => JobState::Other(other.to_string()),
        }
    }

    /// Whether Slurm holds the job still: waiting, or with processes on nodes.
    pub fn is_active(&self) -> bool {
        matches!(self, JobState::Pending | JobState::Running | JobState::Completing)
    }
}

/// Why a job waits that no amount of waiting cures: it asks for more than its partition, account or QOS
/// ever gives one job. Slurm keeps such a job pending (unless the site sets `EnforcePartLimits`), so a
/// ringtrain job would sit `queued` forever; it fails instead, with Slurm's reason. `PartitionConfig` is
/// what 22.05 says of a job asking for more nodes of some size than the partition has (tests/slurm.rs
/// meets it: 5 nodes of 2 CPUs in a partition of 3).
const NEVER_RUNS: [&str; 12] = [
    "PartitionConfig",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "InvalidAccount",
    "InvalidQOS",
    "BadConstraints",
    "QOSMaxNodePerJobLimit",
    "QOSMaxWallDurationPerJobLimit",
    "QOSMaxGRESPerJob",
    "QOSMaxCpuPerJobLimit",
    "AssocMaxNodesPerJobLimit",
    "AssocMaxWallDurationPerJobLimit",
];

impl SlurmJob {
    /// What a ringtrain job waiting on this one says (`waiting in Slurm: Resources`), while it waits.
    pub fn waiting_reason(&self) -> Option<String> {
        if self.state != JobState::Pending {
            return None;
        }
        Some(format!("waiting in Slurm: {}", self.reason.as_deref().unwrap_or("(no reason given yet)")))
    }

    /// Why this job will never start as asked, if that is why it waits.
    pub fn never_runs(&self) -> Option<String> {
        let reason = self.reason.as_deref().filter(|_| self.state == JobState::Pending)?;
        NEVER_RUNS
            .contains(&reason)
            .then(|| format!("Slurm will not start it as asked in partition {} ({reason})", self.partition))
    }
}

#[derive(Deserialize)]
struct Document {
    jobs: Vec<serde_json::Value>,
}

/// A text field: a string, or (23.02 on, for `job_state`) a list whose first item is the state.
fn text(job: &serde_json::Value, field: &str) -> String {
    match &job[field] {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(items) => items.first().and_then(|v| v.as_str()).unwrap_or_default().to_string(),
        _ => String::new(),
    }
}

/// A number field: a number, or (23.02 on) `{"set": bool, "number": N}`; None when unset or missing.
fn number(job: &serde_json::Value, field: &str) -> Option<u64> {
    let value = &job[field];
    match value.as_object() {
        Some(object) if object.get("set").and_then(|s| s.as_bool()) == Some(false) => None,
        Some(object) => object.get("number").and_then(|n| n.as_u64()),
        None => value.as_u64(),
    }
}

/// The jobs of `squeue --json`'s answer.
pub fn parse(json: &str) -> Result<Vec<SlurmJob>, String> {
    let document: Document = serde_json::from_str(json).map_err(|e| format!("squeue --json: {e}"))?;
    document
        .jobs
        .iter()
        .map(|job| {
            let id = number(job, "job_id").ok_or_else(|| format!("squeue --json: a job without a job_id: {job}"))?;
            let state = JobState::from_slurm(&text(job, "job_state"));
            let pending = state == JobState::Pending;
            let reason = text(job, "state_reason");
            Ok(SlurmJob {
                id,
                reason: Some(reason).filter(|r| !r.is_empty() && r != "None"),
                comment: text(job, "comment"),
                partition: text(job, "partition"),
                nodes: text(job, "nodes"),
                expected_start: number(job, "start_time").filter(|&t| pending && t > 0),
                state,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trimmed answer of Debian 12's squeue 22.05.8 (four of its jobs, the fields read here).
    const SQUEUE: &str = include_str!("squeue-22.05.json");

    #[test]
    fn jobs_are_read_with_their_state_reason_and_expected_start() {
        let jobs = parse(SQUEUE).unwrap();
        assert_eq!(jobs.len(), 4);
        let waiting = &jobs[0];
        assert_eq!((waiting.id, &waiting.state, waiting.reason.as_deref()), (6, &JobState::Pending, Some("Resources")));
        assert_eq!((waiting.expected_start, waiting.comment.as_str()), (Some(1796599999), "ringtrain:b:1"));
        assert_eq!(waiting.waiting_reason().as_deref(), Some("waiting in Slurm: Resources"));
        assert_eq!(waiting.never_runs(), None);
        let running = &jobs[1];
        assert_eq!(
            (&running.state, running.reason.as_deref(), running.nodes.as_str()),
            (&JobState::Running, None, "h[1-3]")
        );
        assert_eq!((running.expected_start, running.waiting_reason()), (None, None));
        assert!(running.state.is_active());
        let too_big = &jobs[3];
        assert_eq!(too_big.expected_start, None, "0: no estimate");
        let never = too_big.never_runs().unwrap();
        assert!(never.contains("PartitionNodeLimit") && never.contains("partition cpu"), "{never}");
    }

    #[test]
    fn the_forms_of_later_releases_and_null_fields_are_read() {
        let later = r#"{"jobs": [{"job_id": 12, "job_state": ["PENDING"], "state_reason": "Priority", "comment": null,
            "partition": "gpu", "start_time": {"set": true, "infinite": false, "number": 1796600000}},
            {"job_id": {"set": true, "number": 13}, "job_state": ["RUNNING", "COMPLETING"], "start_time": {"set": false}}]}"#;
        let jobs = parse(later).unwrap();
        assert_eq!((jobs[0].id, &jobs[0].state, jobs[0].comment.as_str()), (12, &JobState::Pending, ""));
        assert_eq!((jobs[0].reason.as_deref(), jobs[0].expected_start), (Some("Priority"), Some(1796600000)));
        assert_eq!((jobs[1].id, &jobs[1].state, jobs[1].expected_start), (13, &JobState::Running, None));
    }

    #[test]
    fn an_answer_that_is_not_squeues_is_an_error() {
        assert!(parse("slurm_load_jobs error").unwrap_err().contains("squeue --json"));
        assert!(parse(r#"{"jobs": [{"job_state": "RUNNING"}]}"#).is_err(), "no job_id");
    }
}
