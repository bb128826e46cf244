//! The agent-facing routes, end to end through the router: register, heartbeat, start (as the scheduler
//! does), poll, run, report metrics, checkpoints and results, with stale attempts refused.

mod common;

use std::time::Duration;

use common::{spec, TestApp};
use ringtrain_core::{AssignmentState, DeviceId, JobId, NodeId};
use ringtrain_store::{Assignment, Job, NewAssignment, StoreResult};
use serde_json::{json, Value};

fn devices(n: usize) -> serde_json::Value {
    json!((0..n).map(|i| json!({"index": i, "kind": "cpu", "name": format!("cpu{i}")})).collect::<Vec<_>>())
}

/// Registers a node with two CPU devices, claims the job and places its two ranks there.
async fn place(app: &TestApp, agent: &str, job: &str) -> (String, i32) {
    let node = app
        .post("/v1/agent/nodes", agent, &json!({"name": "node-a", "address": "127.0.0.1", "devices": devices(2)}))
        .await;
    assert_eq!(node.status, 200, "{}", node.text);
    let node_id: NodeId = node.body["id"].as_str().unwrap().parse().unwrap();
    let device_ids: Vec<DeviceId> =
        node.body["devices"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap().parse().unwrap()).collect();
    let ranks: Vec<NewAssignment> = device_ids
        .iter()
        .enumerate()
        .map(|(rank, device)| NewAssignment { node_id, device_id: *device, rank: rank as i32 })
        .collect();
    let (started, _) = start(app, JobId(job.parse().unwrap()), &ranks).await.unwrap().expect("the job is queued");
    assert_eq!(started.attempt, 1);
    (node_id.to_string(), started.attempt)
}

/// Starts a queued job on these ranks, as the scheduler loop does.
async fn start(app: &TestApp, job: JobId, ranks: &[NewAssignment]) -> StoreResult<Option<(Job, Vec<Assignment>)>> {
    app.store.start_job(job, "scheduler-1", Duration::from_secs(60), ranks).await
}

async fn agent_runs_a_job_to_success(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let job = app.submit(&team.member, &spec("agent-run")).await;
    let (node, attempt) = place(&app, &agent, &job).await;

    let beat = app.post(&format!("/v1/agent/nodes/{node}/heartbeat"), &agent, &json!({})).await;
    assert_eq!(beat.status, 200, "{}", beat.text);
    let nodes = app.get("/v1/nodes", &team.viewer).await;
    assert_eq!(nodes.body["nodes"][0]["devices"].as_array().unwrap().len(), 2);
    assert!(nodes.body["nodes"][0].get("agent_token_id").is_none());

    let poll = app.get(&format!("/v1/agent/nodes/{node}/assignments"), &agent).await;
    assert_eq!(poll.status, 200, "{}", poll.text);
    let work = poll.body["work"].as_array().unwrap();
    assert_eq!(work.len(), 2);
    assert_eq!(work[0]["assignment"]["state"], "delivered");
    assert_eq!(work[0]["assignment"]["world_size"], 2);
    assert_eq!(work[0]["effective"]["global_batch"], 32);
    for w in work {
        let id = w["assignment"]["id"].as_str().unwrap();
        let moved = app
            .post(&format!("/v1/agent/assignments/{id}/state"), &agent, &json!({"from": "delivered", "to": "running"}))
            .await;
        assert_eq!(moved.status, 200, "{}", moved.text);
    }
    let bad_move = work[0]["assignment"]["id"].as_str().unwrap();
    app.post(
        &format!("/v1/agent/assignments/{bad_move}/state"),
        &agent,
        &json!({"from": "delivered", "to": "running"}),
    )
    .await
    .problem(409);

    let running = app.post(&format!("/v1/agent/jobs/{job}/running"), &agent, &json!({"attempt": attempt})).await;
    assert_eq!(running.status, 200, "{}", running.text);
    assert_eq!(app.get(&format!("/v1/jobs/{job}"), &team.viewer).await.body["state"], "running");

    // Metrics as ranks print them; rank 1's report at iteration 20 is sent twice (a retried batch).
    let mut reports = Vec::new();
    for iteration in (0..64).step_by(4) {
        for rank in 0..2 {
            reports.push(json!({"kind": "iteration", "rank": rank, "epoch": iteration / 16, "iteration": iteration,
                "lr": 0.1, "loss": 2.3 - iteration as f64 * 0.01, "samples_per_s": 812.0, "allreduce_s": 0.004}));
        }
    }
    reports.push(json!({"kind": "iteration", "rank": 1, "epoch": 1, "iteration": 20, "lr": 0.1, "loss": 1.0,
        "samples_per_s": 1.0, "allreduce_s": 0.004}));
    reports.push(json!({"kind": "epoch", "rank": 0, "epoch": 0, "iteration": 15, "train_error": 0.21,
        "test_error": 0.18, "test_loss": 0.5}));
    let sent = app
        .post(&format!("/v1/agent/jobs/{job}/metrics"), &agent, &json!({"attempt": attempt, "reports": reports}))
        .await;
    assert_eq!(sent.status, 200, "{}", sent.text);
    let again = app
        .post(&format!("/v1/agent/jobs/{job}/metrics"), &agent, &json!({"attempt": attempt, "reports": reports}))
        .await;
    assert_eq!(again.status, 200);

    let all = app.get(&format!("/v1/jobs/{job}/metrics?limit=10000"), &team.viewer).await;
    assert_eq!(all.status, 200, "{}", all.text);
    assert_eq!(all.body["points"].as_array().unwrap().len(), 16 * 2 + 1, "de-duplicated");
    let loss = app.get(&format!("/v1/jobs/{job}/metrics?name=loss&rank=1&from_iteration=20"), &team.viewer).await;
    let points = loss.body["points"].as_array().unwrap();
    assert_eq!(points.len(), 11);
    assert_eq!(points[0]["iteration"], 20);
    assert_eq!(points[0]["fields"], json!({"loss": 1.0}), "the last report of a step wins");
    let epoch = app.get(&format!("/v1/jobs/{job}/metrics?name=test_error"), &team.viewer).await;
    assert_eq!(epoch.body["points"].as_array().unwrap().len(), 1);
    assert_eq!(epoch.body["points"][0]["fields"]["test_error"], 0.18);
    let plot = app.get(&format!("/v1/jobs/{job}/metrics?kind=iteration&rank=0&points=4"), &team.viewer).await;
    let plotted: Vec<i64> =
        plot.body["points"].as_array().unwrap().iter().map(|p| p["iteration"].as_i64().unwrap()).collect();
    assert_eq!(plotted, vec![0, 16, 32, 48]);
    assert_eq!(plot.body["stride"], 16, "with a kind, the stride is in iterations (reports every 4th)");
    // Pages of 10 cover everything exactly once.
    let mut count = 0;
    let mut uri = format!("/v1/jobs/{job}/metrics?limit=10");
    loop {
        let page = app.get(&uri, &team.viewer).await;
        count += page.body["points"].as_array().unwrap().len();
        match page.body["next_cursor"].as_str() {
            Some(cursor) => uri = format!("/v1/jobs/{job}/metrics?limit=10&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(count, 33);

    // The running job's view (one job and the list alike) carries rank 0's newest report as its progress.
    let view = app.get(&format!("/v1/jobs/{job}"), &team.viewer).await;
    let list = app.get("/v1/jobs?state=running", &team.viewer).await;
    for progress in [&view.body["progress"], &list.body["jobs"][0]["progress"]] {
        let fields = ["iterations_done", "total_iterations", "epoch", "samples_per_s"].map(|f| progress[f].clone());
        assert_eq!(fields, [json!(61), json!(64), json!(3), json!(812.0)], "{progress}");
        assert!((progress["loss"].as_f64().unwrap() - 1.7).abs() < 1e-9, "{progress}");
        assert!(progress["allreduce_share"].is_null(), "these reports have none");
    }

    // Bad reports name their field.
    let bad = json!({"attempt": attempt, "reports": [
        {"kind": "iteration", "rank": 5, "epoch": 0, "iteration": 1, "loss": 1.0},
        {"kind": "Iteration!", "rank": 0, "epoch": 0, "iteration": -1, "loss": "high"}]});
    let mut paths = app.post(&format!("/v1/agent/jobs/{job}/metrics"), &agent, &bad).await.problem(422);
    paths.sort();
    assert_eq!(paths, vec!["reports[0].rank", "reports[1].iteration", "reports[1].kind", "reports[1].loss"]);

    let uri = format!("/v1/agent/jobs/{job}/checkpoints/epoch-0001?attempt={attempt}&epoch=1&iteration=32");
    let uploaded = app.send_bytes(axum::http::Method::PUT, &uri, &agent, vec![7u8; 1234]).await;
    assert_eq!(uploaded.status, 201, "{}", uploaded.text);
    let listed = app.get(&format!("/v1/jobs/{job}/checkpoints"), &team.viewer).await;
    assert_eq!(listed.body["checkpoints"][0]["iteration"], 32);
    assert_eq!(listed.body["checkpoints"][0]["size_bytes"], 1234);

    // A stale attempt is refused; the real one finishes the job once rank 1's agent ended its rank `done`
    // (it does after sending the rank's last metric lines).
    app.post(&format!("/v1/agent/jobs/{job}/result"), &agent, &json!({"attempt": attempt + 1, "outcome": "succeeded"}))
        .await
        .problem(404);
    app.end_other_ranks(&job, attempt, ringtrain_core::AssignmentState::Done).await;
    let done = app
        .post(
            &format!("/v1/agent/jobs/{job}/result"),
            &agent,
            &json!({"attempt": attempt, "outcome": "succeeded", "result": {"test_error": 0.12}}),
        )
        .await;
    assert_eq!(done.status, 200, "{}", done.text);
    assert_eq!(done.body["state"], "succeeded");
    let finished = app.get(&format!("/v1/jobs/{job}"), &team.viewer).await;
    assert_eq!(finished.body["state"], "succeeded");
    assert_eq!(finished.body["result"]["test_error"], 0.12);
    app.post(&format!("/v1/agent/jobs/{job}/result"), &agent, &json!({"attempt": attempt, "outcome": "failed"}))
        .await
        .problem(409);
    // Nothing left to run; the agent is told the attempt is over and reports rank 0 done (rank 1 was).
    let poll = app.get(&format!("/v1/agent/nodes/{node}/assignments"), &agent).await;
    assert_eq!(poll.body["work"], json!([]));
    let stop = poll.body["stop"].as_array().unwrap().clone();
    assert_eq!(stop.len(), 1);
    for id in &stop {
        let uri = format!("/v1/agent/assignments/{}/state", id.as_str().unwrap());
        assert_eq!(app.post(&uri, &agent, &json!({"from": "running", "to": "done"})).await.status, 200);
    }
    let poll = app.get(&format!("/v1/agent/nodes/{node}/assignments"), &agent).await;
    assert_eq!(poll.body["stop"], json!([]));
    assert!(app.store.live_assignments().await.unwrap().is_empty());
    let events = app.get(&format!("/v1/jobs/{job}/events"), &team.viewer).await;
    let states: Vec<&str> =
        events.body["events"].as_array().unwrap().iter().map(|e| e["to_state"].as_str().unwrap()).collect();
    assert_eq!(states, vec!["queued", "scheduled", "running", "succeeded"]);
}

/// Does what an agent does with a poll's `stop` list (ranks that never started): reports each cancelled.
async fn stop_all(app: &TestApp, agent: &str, stop: &Value) -> usize {
    let stop = stop.as_array().unwrap();
    for id in stop {
        let uri = format!("/v1/agent/assignments/{}/state", id.as_str().unwrap());
        let reply = app.post(&uri, agent, &json!({"from": "delivered", "to": "cancelled"})).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
    }
    stop.len()
}

/// A success is not taken while another rank of the attempt ended otherwise than `done` (its agent died
/// with its last metric lines, or it was stopped): the attempt cannot have succeeded with every report.
async fn a_success_is_refused_when_another_rank_did_not_end_done(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let job = app.submit(&team.member, &spec("gate")).await;
    let (_, attempt) = place(&app, &agent, &job).await;
    app.post(&format!("/v1/agent/jobs/{job}/running"), &agent, &json!({"attempt": attempt})).await;
    app.end_other_ranks(&job, attempt, ringtrain_core::AssignmentState::Failed).await;
    let success = json!({"attempt": attempt, "outcome": "succeeded", "result": {}});
    let refused = app.post(&format!("/v1/agent/jobs/{job}/result"), &agent, &success).await;
    assert_eq!(refused.status, 409, "{}", refused.text);
    assert!(refused.text.contains("rank 1"), "{}", refused.text);
    assert_eq!(app.get(&format!("/v1/jobs/{job}"), &team.viewer).await.body["state"], "running");
}

async fn retryable_failure_requeues_and_cancel_stops_ranks(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let job = app.submit(&team.member, &spec("retry")).await;
    let (node, attempt) = place(&app, &agent, &job).await;
    let poll_uri = format!("/v1/agent/nodes/{node}/assignments");
    assert_eq!(app.get(&poll_uri, &agent).await.body["work"].as_array().unwrap().len(), 2);
    app.post(&format!("/v1/agent/jobs/{job}/running"), &agent, &json!({"attempt": attempt})).await;
    let failed = app
        .post(
            &format!("/v1/agent/jobs/{job}/result"),
            &agent,
            &json!({"attempt": attempt, "outcome": "failed", "error": "rank 1 lost", "retryable": true}),
        )
        .await;
    assert_eq!(failed.status, 200, "{}", failed.text);
    assert_eq!(failed.body["state"], "queued");
    // A report from the old attempt is refused.
    app.post(&format!("/v1/agent/jobs/{job}/running"), &agent, &json!({"attempt": attempt})).await.problem(409);

    // The old attempt's ranks hold their devices until the agent, told to stop them, says they ended.
    let node_id: NodeId = node.parse().unwrap();
    let node_info = app.store.get_node(node_id).await.unwrap().unwrap();
    let ranks: Vec<NewAssignment> = node_info
        .devices
        .iter()
        .enumerate()
        .map(|(rank, d)| NewAssignment { node_id, device_id: d.id, rank: rank as i32 })
        .collect();
    let job_id = JobId(job.parse().unwrap());
    assert!(start(&app, job_id, &ranks).await.is_err(), "devices still busy");
    let poll = app.get(&poll_uri, &agent).await;
    assert_eq!(poll.body["work"], json!([]));
    assert_eq!(stop_all(&app, &agent, &poll.body["stop"]).await, 2);
    let (second, placed) = start(&app, job_id, &ranks).await.expect("freed devices can be placed again").unwrap();
    assert_eq!(second.attempt, 2);

    // Cancel while scheduled: the delivered ranks are to stop; a pending one is cancelled outright.
    let poll = app.get(&poll_uri, &agent).await;
    assert_eq!(poll.body["work"].as_array().unwrap().len(), 2);
    let cancelled = app.post(&format!("/v1/jobs/{job}/cancel"), &team.member, &json!({})).await;
    assert_eq!(cancelled.body["state"], "cancelled");
    let poll = app.get(&poll_uri, &agent).await;
    assert_eq!(poll.body["work"], json!([]));
    assert_eq!(stop_all(&app, &agent, &poll.body["stop"]).await, 2);
    assert_eq!(app.store.get_assignment(placed[0].id).await.unwrap().unwrap().state, AssignmentState::Cancelled);
    let other = app.submit(&team.member, &spec("next")).await;
    let (_, pending) = start(&app, JobId(other.parse().unwrap()), &ranks).await.unwrap().unwrap();
    app.post(&format!("/v1/jobs/{other}/cancel"), &team.member, &json!({})).await;
    assert_eq!(app.store.get_assignment(pending[0].id).await.unwrap().unwrap().state, AssignmentState::Cancelled);
    assert!(app.store.live_assignments().await.unwrap().is_empty());
}

async fn agents_are_isolated(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let intruder = app.agent_token().await;
    let job = app.submit(&team.member, &spec("iso")).await;
    let (node, attempt) = place(&app, &agent, &job).await;
    app.post(&format!("/v1/agent/nodes/{node}/heartbeat"), &intruder, &json!({})).await.problem(404);
    app.get(&format!("/v1/agent/nodes/{node}/assignments"), &intruder).await.problem(404);
    app.post(&format!("/v1/agent/jobs/{job}/running"), &intruder, &json!({"attempt": attempt})).await.problem(404);
    let reports = json!({"attempt": attempt, "reports": []});
    app.post(&format!("/v1/agent/jobs/{job}/metrics"), &intruder, &reports).await.problem(404);
    // Another agent cannot take over the node's name.
    let takeover = app.post("/v1/agent/nodes", &intruder, &json!({"name": "node-a", "devices": devices(1)})).await;
    takeover.problem(409);
    let dup = json!({"name": "node-b", "devices": [
        {"index": 0, "kind": "cpu", "name": "a"},
        {"index": 0, "kind": "tpu", "name": "b"}]});
    let mut paths = app.post("/v1/agent/nodes", &agent, &dup).await.problem(422);
    paths.sort();
    assert_eq!(paths, vec!["devices[1].index", "devices[1].kind"]);
}

ringtrain_store::on_both_backends!(setup = crate::common::TestApp::new; agent_runs_a_job_to_success, a_success_is_refused_when_another_rank_did_not_end_done, retryable_failure_requeues_and_cancel_stops_ranks, agents_are_isolated);
