//! A job whose model is cut into pipeline stages, through the service: the spec's `devices_per_worker` and
//! `placement` checked field by field, the job placed on workers × stages devices, its rank processes
//! joined as stages, and its run the unsplit job's, iteration for iteration.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{fresh_postgres_database, Cluster};

const LONG: Duration = Duration::from_secs(300);

fn resnet(devices: u32) -> Value {
    json!({
        "name": "pipeline",
        "model": {"name": "resnet20"},
        "dataset": "synthetic:320",
        "workers": 4,
        "devices": devices,
        "per_worker_batch": 8,
        "epochs": 2,
        "lr": {"base": 0.1, "reference_batch": 16, "warmup": {"kind": "gradual", "epochs": 1}, "decay": {"kind": "none"}},
        "seed": 3,
        "log_every_iterations": 1
    })
}

/// Every iteration's (iteration, loss, lr) as rank 0 reported it.
fn losses(points: &[Value]) -> Vec<(i64, f64, f64)> {
    let mut losses: Vec<_> = points
        .iter()
        .filter(|p| p["rank"] == 0)
        .map(|p| {
            (
                p["iteration"].as_i64().unwrap(),
                p["fields"]["loss"].as_f64().unwrap(),
                p["fields"]["lr"].as_f64().unwrap(),
            )
        })
        .collect();
    losses.sort_by_key(|l| l.0);
    losses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cut_into_pipeline_stages_trains_through_the_api_as_the_unsplit_one() {
    let db = fresh_postgres_database("pipeline").await;
    let cluster = Cluster::serve("pipeline", &db, 2, 2).await;
    let api = &cluster.api;

    let mut split = resnet(2);
    split["devices_per_worker"] = 2.into();
    split["placement"] = json!({"cuts": ["layer2"]});
    // what is wrong with a placement is named, field by field, and nothing is stored
    for (change, field, words) in [
        (json!({"placement": {"cuts": ["layer4"]}}), "placement.cuts", "cannot be cut after \"layer4\""),
        (json!({"placement": {"cuts": ["layer1", "layer2"]}}), "placement.cuts", "more than the 2 devices"),
        (json!({"placement": null}), "placement", "needs placement.cuts"),
        (json!({"model": {"name": "lenet5"}}), "placement", "only the built-in ResNets"),
        (json!({"devices": {"min": 1, "max": 2}}), "placement", "elastic"),
    ] {
        let mut bad = split.clone();
        for (key, value) in change.as_object().unwrap() {
            bad[key] = value.clone();
        }
        let (status, problem) = api.request(reqwest::Method::POST, "/v1/jobs", Some(bad)).await;
        assert_eq!(status, 422, "{change}: {problem}");
        let errors = problem["errors"].as_array().unwrap();
        assert!(
            errors.iter().any(|e| e["path"] == field && e["reason"].as_str().unwrap().contains(words)),
            "{change}: expected {field} ({words}): {problem}"
        );
    }
    let listed = api.get("/v1/jobs").await;
    assert_eq!(listed["jobs"].as_array().map(Vec::len), Some(0), "a refused spec stores nothing: {listed}");

    // the dry run shows each stage's blocks and memory
    let (status, dry) = api.request(reqwest::Method::POST, "/v1/jobs?dry_run=true", Some(split.clone())).await;
    assert_eq!(status, 200, "{dry}");
    let stages = dry["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 2, "{dry}");
    assert_eq!(stages[0]["blocks"], json!(["layer1.0", "layer2.2"]), "{dry}");
    assert_eq!(stages[1]["blocks"], json!(["layer3.0", "layer3.2"]), "{dry}");
    assert!(stages.iter().all(|s| s["memory"]["total"].as_u64().unwrap() > 0), "{dry}");
    let (_, unsplit_dry) = api.request(reqwest::Method::POST, "/v1/jobs?dry_run=true", Some(resnet(2))).await;
    assert!(unsplit_dry.get("stages").is_none(), "{unsplit_dry}");

    let unsplit_id = api.submit(&resnet(2)).await;
    let unsplit = api.wait_state(&unsplit_id, "succeeded", LONG).await;
    let split_id = api.submit(&split).await;
    let pipelined = api.wait_state(&split_id, "succeeded", LONG).await;

    // 2 worker processes of 2 stages: the job held 4 devices, on the 2 nodes of 2 slots
    let events = api.get(&format!("/v1/jobs/{split_id}/events")).await;
    assert!(events.to_string().contains("4 device(s)"), "{events}");
    let split_losses = losses(&api.metrics(&split_id, "iteration").await);
    let unsplit_losses = losses(&api.metrics(&unsplit_id, "iteration").await);
    let total = pipelined["effective"]["total_iterations"].as_u64().unwrap();
    assert_eq!(split_losses.len() as u64, total, "every iteration once");
    assert_eq!(split_losses, unsplit_losses, "the pipelined run is the unsplit one");
    assert_eq!(pipelined["result"]["final_test_error"], unsplit["result"]["final_test_error"]);
    // where each stage's steps went: computing, waiting (the bubble of 2 stages at 2 micro-batches is a
    // third of a step, plus their imbalance), sending
    let timeline = &pipelined["result"]["timeline"];
    let stages = timeline["stages"].as_array().unwrap_or_else(|| panic!("the stages' timeline: {timeline}"));
    assert_eq!(stages.len(), 2, "{timeline}");
    assert!((timeline["bubble_share"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-9, "{timeline}");
    for stage in stages {
        let share = |name: &str| stage[name].as_f64().unwrap();
        let sum = share("busy_share") + share("waiting_share") + share("sending_share");
        assert!((sum - 1.0).abs() < 1e-3 && share("busy_share") > 0.1, "{stage}");
        assert!(
            stage["bytes_sent_per_step"].as_f64().unwrap() > 0.0,
            "activations one way, gradients the other: {stage}"
        );
    }
    assert!(unsplit["result"]["timeline"].get("stages").is_none(), "no stages in an unsplit run");

    // a worker's stages share a node: 3 stages on nodes of 2 slots can never be placed, and the job says why
    let mut three = resnet(1);
    three["devices_per_worker"] = 3.into();
    three["placement"] = json!({"cuts": ["layer1", "layer2"]});
    let three_id = api.submit(&three).await;
    let waiting = api
        .wait_for(&format!("/v1/jobs/{three_id}"), Duration::from_secs(30), "its reason", |job| {
            job["pending_reason"]["code"] == "worker_larger_than_nodes"
        })
        .await;
    let message = waiting["pending_reason"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("1 worker of 3 devices on one node") && message.contains("the largest node has 2"),
        "{waiting}"
    );
    api.post(&format!("/v1/jobs/{three_id}/cancel"), json!({})).await;
}
