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

/// Each CPU slot's memory on the test's node, in MiB: between what ResNet-50's larger pipeline stage
/// needs and what the whole model needs (estimated: 181 and about 300 MiB at a batch of 32 on 16×16
/// images).
const SLOT_MIB: u64 = 256;

/// ResNet-50 on small images: its memory is mostly its weights, their gradients and momentum, which a
/// cut shares out between the stages.
fn resnet50(split: bool) -> Value {
    let mut spec = json!({
        "name": if split { "split-to-fit" } else { "too-large" },
        "model": {"name": "resnet50"},
        "dataset": "synthetic:1024",
        "workers": 1,
        "devices": 1,
        "per_worker_batch": 32,
        "epochs": 1,
        "lr": {"base": 0.02, "reference_batch": 32, "warmup": {"kind": "none"}, "decay": {"kind": "none"}},
        "guard": {"collapse": false},
        "seed": 5,
        "log_every_iterations": 1
    });
    if split {
        spec["devices_per_worker"] = 2.into();
        spec["placement"] = json!({"cuts": ["layer3"]});
    }
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_larger_than_a_slot_trains_split_across_two_and_each_ranks_use_is_sampled() {
    let db = fresh_postgres_database("pipeline_memory").await;
    let mut cluster = Cluster::serve("pipeline-memory", &db, 0, 0).await;
    cluster.add_node("node0", 2, &["--slot-memory-mib", &SLOT_MIB.to_string()]).await;
    cluster.wait_for_nodes(1).await;
    let api = &cluster.api;

    // the whole model does not fit a slot: refused, with the way out
    let (status, problem) = api.request(reqwest::Method::POST, "/v1/jobs", Some(resnet50(false))).await;
    assert_eq!(status, 422, "{problem}");
    let reason = problem["errors"][0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("the largest cpu device offers 256 MiB")
            && reason.contains("a worker may span several devices")
            && reason.contains("devices_per_worker with placement.cuts"),
        "{problem}"
    );
    // cut in two, each stage fits its slot
    let (status, dry) = api.request(reqwest::Method::POST, "/v1/jobs?dry_run=true", Some(resnet50(true))).await;
    assert_eq!(status, 200, "{dry}");
    let stages = dry["stages"].as_array().unwrap();
    assert!(stages.iter().all(|s| s["memory"]["total"].as_u64().unwrap() <= SLOT_MIB << 20), "{dry}");

    let id = api.submit(&resnet50(true)).await;
    // while it trains, its node says what its ranks use, and so does /metrics
    let nodes = api
        .wait_for("/v1/nodes", LONG, "the ranks' use on the node", |nodes| {
            nodes["nodes"][0]["ranks_use"]["resident_bytes"].as_f64().is_some_and(|b| b > 0.0)
        })
        .await;
    assert!(nodes["nodes"][0]["ranks_use"]["cpu_cores"].as_f64().is_some(), "{nodes}");
    let scraped = reqwest::get(format!("{}/metrics", cluster.url)).await.unwrap().text().await.unwrap();
    assert!(
        scraped.lines().any(|l| l.starts_with("ringtrain_rank_resident_bytes{") && l.contains(&id)),
        "each live rank's memory is exported: {scraped}"
    );
    assert!(scraped.contains("ringtrain_node_rank_cpu_cores{node=\"node0\"}"), "{scraped}");
    let done = api.wait_state(&id, "succeeded", LONG).await;
    assert!(done["result"]["final_test_error"].as_f64().is_some(), "{done}");

    // each rank ran in a cgroup of its slot and the runtime's allowance, and its samples stayed under it
    let limit_mib = SLOT_MIB + (ringtrain_agent::devices::RANK_RUNTIME_BYTES >> 20);
    if !matches!(
        ringtrain_sandbox::cgroup::Hierarchy::detect(),
        ringtrain_sandbox::cgroup::Hierarchy::Unavailable { .. }
    ) {
        let logs = api.get(&format!("/v1/jobs/{id}/logs?q=runs%20in%20a%20cgroup")).await;
        let lines = logs["lines"].as_array().unwrap_or_else(|| panic!("{logs}"));
        assert_eq!(lines.len(), 2, "{logs}");
        assert!(
            lines.iter().all(|l| l["line"].as_str().unwrap().contains(&format!("memory {limit_mib} MiB"))),
            "{logs}"
        );
    }
    let samples = api.get(&format!("/v1/jobs/{id}/metrics?kind=system&limit=10000")).await;
    let points = samples["points"].as_array().unwrap();
    for rank in 0..2 {
        let of_rank: Vec<_> = points.iter().filter(|p| p["rank"] == rank).collect();
        assert!(!of_rank.is_empty(), "rank {rank} was sampled: {samples}");
        for p in of_rank {
            let resident = p["fields"]["resident_bytes"].as_f64().unwrap();
            assert!(resident > 0.0 && resident <= (limit_mib << 20) as f64, "{p}");
            assert!(p["fields"]["cpu_cores"].as_f64().unwrap() >= 0.0, "{p}");
        }
    }
}
