//! The soak's verdict on each job, from what the API reports once every job has ended: it ended
//! `succeeded`, exactly once; every rank reported every iteration and every epoch (once: the store keys
//! them); its curves and result are bit-for-bit those of the same spec run undisturbed; and how much work
//! the faults cost it.

use std::collections::BTreeMap;

use anyhow::Result;
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::faults::{Fault, FaultKind};
use super::get_retrying;
use ringtrain_client::ApiClient;

/// What the API says a job did: its view, events, metric points and checkpoints.
#[derive(Debug)]
pub struct JobRecord {
    pub job: Value,
    pub events: Vec<Value>,
    pub iterations: Vec<Value>,
    pub epochs: Vec<Value>,
    pub checkpoints: Vec<Value>,
}

impl JobRecord {
    pub async fn read(api: &ApiClient, id: &str) -> Result<JobRecord> {
        let job = get_retrying(api, &format!("/v1/jobs/{id}")).await?;
        let events = get_retrying(api, &format!("/v1/jobs/{id}/events")).await?;
        let checkpoints = get_retrying(api, &format!("/v1/jobs/{id}/checkpoints")).await?;
        Ok(JobRecord {
            job,
            events: events["events"].as_array().cloned().unwrap_or_default(),
            iterations: metrics(api, id, "iteration").await?,
            epochs: metrics(api, id, "epoch").await?,
            checkpoints: checkpoints["checkpoints"].as_array().cloned().unwrap_or_default(),
        })
    }

    fn int(&self, field: &str) -> i64 {
        self.job[field].as_i64().unwrap_or(0)
    }
}

/// Every metric point of `kind`, all pages.
async fn metrics(api: &ApiClient, id: &str, kind: &str) -> Result<Vec<Value>> {
    let mut points = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/jobs/{id}/metrics?kind={kind}&limit=10000");
        if let Some(c) = &cursor {
            path += &format!("&cursor={c}");
        }
        let page = get_retrying(api, &path).await?;
        points.extend(page["points"].as_array().cloned().unwrap_or_default());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return Ok(points),
        }
    }
}

/// The deterministic fields of a metric point (timings differ from run to run and are left out).
const ITERATION_FIELDS: [&str; 3] = ["lr", "loss", "rank_loss"];
const EPOCH_FIELDS: [&str; 4] = ["train_loss", "train_error", "test_loss", "test_error"];

/// (rank, iteration) -> the point's fields named in `fields`.
fn series(points: &[Value], fields: &[&str]) -> BTreeMap<(i64, i64), Vec<Value>> {
    points
        .iter()
        .map(|p| {
            let key = (p["rank"].as_i64().unwrap_or(-1), p["iteration"].as_i64().unwrap_or(-1));
            (key, fields.iter().map(|f| p["fields"][f].clone()).collect())
        })
        .collect()
}

/// Everything wrong with job `id` next to `reference` (the same spec, run undisturbed).
pub fn problems(id: &str, record: &JobRecord, reference: &JobRecord) -> Vec<String> {
    let mut found = Vec::new();
    let state = record.job["state"].as_str().unwrap_or("?");
    if state != "succeeded" {
        found.push(format!("job {id} ended {state}: {}", record.job["error"]));
        return found;
    }
    let successes = record.events.iter().filter(|e| e["to_state"] == "succeeded").count();
    if successes != 1 {
        found.push(format!("job {id} succeeded {successes} times"));
    }
    let workers = record.int("workers");
    let total = record.job["effective"]["total_iterations"].as_i64().unwrap_or(0);
    let epochs = record.job["effective"]["epochs"].as_i64().unwrap_or(0);
    let mut by_rank: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for p in &record.iterations {
        by_rank.entry(p["rank"].as_i64().unwrap_or(-1)).or_default().push(p["iteration"].as_i64().unwrap_or(-1));
    }
    for rank in 0..workers {
        let mut seen = by_rank.remove(&rank).unwrap_or_default();
        seen.sort_unstable();
        if seen != (0..total).collect::<Vec<_>>() {
            found.push(format!("job {id} rank {rank}: {} iteration points for {total} iterations", seen.len()));
        }
    }
    if !by_rank.is_empty() {
        found.push(format!("job {id}: points of ranks it does not have: {:?}", by_rank.keys().collect::<Vec<_>>()));
    }
    if record.epochs.len() as i64 != workers * epochs {
        found.push(format!("job {id}: {} epoch points for {workers} ranks x {epochs} epochs", record.epochs.len()));
    }
    for (kind, fields, mine, theirs) in [
        ("iteration", &ITERATION_FIELDS[..], &record.iterations, &reference.iterations),
        ("epoch", &EPOCH_FIELDS[..], &record.epochs, &reference.epochs),
    ] {
        let (mine, theirs) = (series(mine, fields), series(theirs, fields));
        let differing = mine.iter().filter(|(key, values)| theirs.get(key) != Some(values)).count();
        if differing > 0 || mine.len() != theirs.len() {
            let first = mine.iter().find(|(key, values)| theirs.get(key) != Some(values));
            found.push(format!(
                "job {id}: {differing} of {} {kind} points differ from the undisturbed run (first: {first:?} vs {:?})",
                mine.len(),
                first.and_then(|(key, _)| theirs.get(key))
            ));
        }
    }
    let result = |r: &JobRecord, field: &str| r.job["result"][field].clone();
    if result(record, "final_test_error") != result(reference, "final_test_error") {
        found.push(format!(
            "job {id}: final test error {} where the undisturbed run had {}",
            result(record, "final_test_error"),
            result(reference, "final_test_error")
        ));
    }
    let strip = |epochs: Value| -> Vec<Value> {
        let mut epochs = epochs.as_array().cloned().unwrap_or_default();
        for record in &mut epochs {
            if let Some(object) = record.as_object_mut() {
                object.remove("seconds");
            }
        }
        epochs
    };
    if strip(result(record, "epochs")) != strip(result(reference, "epochs")) {
        found.push(format!("job {id}: the result's epoch records differ from the undisturbed run's"));
    }
    found
}

/// Iterations the faults made the job train again: for each kill that hit it, from the resume point (its
/// newest checkpoint taken before the kill) to the newest iteration it had reported then. A lower bound:
/// iterations trained but not yet reported when the kill came are not seen.
pub fn lost_iterations(id: &str, record: &JobRecord, faults: &[Fault]) -> i64 {
    let mut lost = 0;
    for fault in faults {
        for (job, reached) in &fault.hit {
            let Some(reached) = reached.filter(|_| job == id) else { continue };
            let resume = record
                .checkpoints
                .iter()
                .filter(|c| !c["is_final"].as_bool().unwrap_or(false))
                .filter(|c| {
                    c["created_at"]
                        .as_str()
                        .and_then(|t| t.parse::<DateTime<Utc>>().ok())
                        .is_some_and(|t| t <= fault.at)
                })
                .filter_map(|c| c["iteration"].as_i64())
                .max()
                .unwrap_or(0);
            lost += (reached + 1 - resume).max(0);
        }
    }
    lost
}

/// A failed attempt no kill explains: only a rank or agent killed may cost a job an attempt (a server
/// restart or a database outage must not, and neither may anything else in a soak of sound jobs). Each
/// kill that hit the job explains one, and so does each failure that says its rank was lost because the
/// agent of a node an agent kill stopped restarted: an agent killed while it held an assignment it had not
/// started yet (its files still coming) leaves no rank process for the kill to see, and the restarted agent
/// reports that assignment lost, naming its node.
pub fn unexplained_failures(id: &str, record: &JobRecord, faults: &[Fault]) -> Option<String> {
    let failures = (record.int("attempt") - 1).max(0);
    let hit_it = |f: &&Fault| f.hit.iter().any(|(job, _)| job == id);
    let kills = faults.iter().filter(hit_it).count() as i64;
    if failures <= kills {
        return None;
    }
    let reasons: Vec<String> = record
        .events
        .iter()
        .filter(|e| e["to_state"] == "queued" && e["from_state"].is_string())
        // every line: a failure's stderr tail is what tells an unexplained one apart (its first line alone
        // said only "exited with status 1" in a CI run that could not be repeated)
        .filter_map(|e| e["reason"].as_str().map(|r| r.lines().collect::<Vec<_>>().join(" | ")))
        .collect();
    let agents_killed: Vec<&str> =
        faults.iter().filter(|f| f.kind == FaultKind::AgentKill).filter_map(|f| f.node.as_deref()).collect();
    let lost_with_an_agent = reasons
        .iter()
        .filter(|r| agents_killed.iter().any(|n| r.contains(&format!("on node {n} was lost: its agent restarted"))))
        .count() as i64;
    let rank_kills = faults.iter().filter(hit_it).filter(|f| f.kind == FaultKind::RankKill).count() as i64;
    if failures <= rank_kills + lost_with_an_agent {
        return None;
    }
    Some(format!(
        "job {id}: {failures} failed attempt(s) but {kills} kill(s) hit it; the failures: {}",
        reasons.join(" / ")
    ))
}

/// Attempts beyond the first, and preemptions.
pub fn restarts(record: &JobRecord) -> (i64, i64) {
    ((record.int("attempt") - 1).max(0), record.int("preemptions"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fault(kind: FaultKind, hit: &[&str], node: Option<&str>) -> Fault {
        let hit = hit.iter().map(|j| (j.to_string(), None)).collect();
        Fault { kind, at_s: 1.0, at: Utc::now(), detail: String::new(), hit, node: node.map(String::from) }
    }

    fn failed_twice(reasons: [&str; 2]) -> JobRecord {
        let events = reasons.iter().map(|r| json!({"from_state": "running", "to_state": "queued", "reason": r}));
        JobRecord {
            job: json!({"attempt": 3}),
            events: events.collect(),
            iterations: Vec::new(),
            epochs: Vec::new(),
            checkpoints: Vec::new(),
        }
    }

    /// A rank kill explains the failure it caused; an agent kill explains a rank lost with its restarted
    /// agent even when it saw no rank of the job (the assignment not started yet); nothing else does.
    #[test]
    fn each_failure_needs_a_kill_that_explains_it() {
        let lost = "rank 0 on node node0 was lost: its agent restarted";
        let record = failed_twice(["rank 1 exited: killed by signal 9", lost]);
        let rank_kill = fault(FaultKind::RankKill, &["j"], None);
        let agent_kill = |node| fault(FaultKind::AgentKill, &[], Some(node));
        assert_eq!(unexplained_failures("j", &record, &[rank_kill.clone(), agent_kill("node0")]), None);
        let elsewhere = unexplained_failures("j", &record, &[rank_kill.clone(), agent_kill("node1")]);
        assert!(elsewhere.is_some_and(|v| v.contains("2 failed attempt(s) but 1 kill(s)")));
        let restart = fault(FaultKind::ServerRestart, &[], None);
        assert!(unexplained_failures("j", &record, &[rank_kill, restart]).is_some());
    }
}
