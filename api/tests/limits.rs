//! Resource limits (issue 12): no request does unbounded work, no team's queue hides another's.

mod common;

use std::time::Duration;

use common::TestApp;
use serde_json::json;

/// The preview that froze a server thread (a 1-sample batch, 10,000 epochs, 10^12 samples: 10^16
/// iterations) is refused at once, and a large valid schedule renders without walking every iteration.
async fn a_schedule_preview_cannot_freeze_the_server(app: TestApp) {
    let team = app.team("alpha").await;
    let spec = json!({"model": {"name": "mlp"}, "dataset": "synthetic", "per_worker_batch": 1, "epochs": 10000,
                      "lr": {"warmup": {"kind": "none"}, "decay": {"kind": "none"}}});
    let uri = "/v1/schedules/preview?dataset_size=1000000000000";
    // a guard against a hang, not a speed test: before the fix this did not answer for hours
    let refused =
        tokio::time::timeout(Duration::from_secs(10), app.post(uri, &team.viewer, &spec)).await.expect("an answer");
    assert_eq!(refused.problem(422), vec!["epochs"]);
    // 10^9 iterations over 10,000 epochs with warmup and step decay: rendered from its change points
    let big = json!({"model": {"name": "mlp"}, "dataset": "synthetic", "per_worker_batch": 1, "epochs": 10000,
                     "lr": {"warmup": {"kind": "gradual", "epochs": 5}}});
    let uri = "/v1/schedules/preview?dataset_size=100000";
    let rendered =
        tokio::time::timeout(Duration::from_secs(10), app.post(uri, &team.viewer, &big)).await.expect("an answer");
    assert_eq!(rendered.status, 200, "{}", rendered.text);
    assert_eq!(rendered.body["effective"]["total_iterations"], 1_000_000_000u64);
    assert_eq!(rendered.body["epochs"].as_array().unwrap().len(), 10000);
}

/// Team A's queue of never-placeable high-priority jobs, longer than the scheduler's window, does not hide
/// team B's job: the window is per team, and B's job starts in the first pass.
async fn one_teams_queue_cannot_hide_another_teams_job(app: TestApp) {
    let a = app.team("alpha").await;
    let b = app.team("beta").await;
    let agent = app.agent_token().await;
    let devices = json!([{"index": 0, "kind": "cpu", "name": "cpu 0"}]);
    let node =
        app.post("/v1/agent/nodes", &agent, &json!({"name": "n", "address": "127.0.0.1", "devices": devices})).await;
    assert_eq!(node.status, 200, "{}", node.text);
    let mut hog = common::spec("hog");
    hog["workers"] = json!(8); // more devices than the pool has: never placeable
    hog["priority"] = json!(1000);
    for _ in 0..6 {
        app.submit(&a.member, &hog).await;
    }
    let mut small = common::spec("small");
    small["workers"] = json!(1);
    let id = app.submit(&b.member, &small).await;
    let config = ringtrain_scheduler::LoopConfig { owner: "test".into(), queue_window: 5, ..Default::default() };
    let pass = app.state.scheduler(config).pass().await.unwrap();
    assert_eq!(pass.started, 1, "{pass:?}");
    assert_eq!(app.get(&format!("/v1/jobs/{id}"), &b.member).await.body["state"], "scheduled");
}

/// A finished job's result of several megabytes (10,000 epoch records) is taken and the job succeeds:
/// before, anything over the 1 MiB body limit was refused, and the agent's job was re-run until it failed.
async fn a_long_jobs_large_result_is_taken(app: TestApp) {
    use ringtrain_core::{DeviceId, JobId, NodeId};
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let devices = json!([{"index": 0, "kind": "cpu", "name": "cpu 0"}]);
    let node =
        app.post("/v1/agent/nodes", &agent, &json!({"name": "n", "address": "127.0.0.1", "devices": devices})).await;
    let node_id: NodeId = node.body["id"].as_str().unwrap().parse().unwrap();
    let device: DeviceId = node.body["devices"][0]["id"].as_str().unwrap().parse().unwrap();
    let mut one = common::spec("long");
    one["workers"] = json!(1);
    let id = app.submit(&team.member, &one).await;
    let ranks = [ringtrain_store::NewAssignment { node_id, device_id: device, rank: 0 }];
    let (job, _) =
        app.store.start_job(JobId(id.parse().unwrap()), "s", Duration::from_secs(60), &ranks).await.unwrap().unwrap();
    let attempt = job.attempt;
    app.post(&format!("/v1/agent/jobs/{id}/running"), &agent, &json!({"attempt": attempt})).await;
    let epochs: Vec<serde_json::Value> = (0..10_000)
        .map(|e| json!({"epoch": e, "train_loss": 0.123456789, "train_error": 0.0456, "test_error": 0.0789,
                         "test_loss": 0.3456789, "seconds": 12.345678, "lr_first": 0.1, "lr_last": 0.1, "samples_per_s": 12345.6}))
        .collect();
    let result = json!({"attempt": attempt, "outcome": "succeeded", "result": {"epochs": epochs}});
    assert!(result.to_string().len() > 1 << 20, "bigger than the ordinary body limit");
    let taken = app.post(&format!("/v1/agent/jobs/{id}/result"), &agent, &result).await;
    assert_eq!(taken.status, 200, "{}", taken.text);
    assert_eq!(app.get(&format!("/v1/jobs/{id}"), &team.viewer).await.body["state"], "succeeded");
}

ringtrain_store::on_both_backends!(
    setup = crate::common::TestApp::new;
    a_schedule_preview_cannot_freeze_the_server,
    one_teams_queue_cannot_hide_another_teams_job,
    a_long_jobs_large_result_is_taken,
);
