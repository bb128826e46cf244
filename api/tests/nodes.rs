//! Registering nodes: what an agent token may claim. A re-registration keeps or reduces the devices its
//! node was registered with; adding, changing a kind or raising memory needs a platform admin (security
//! review 3, N-M6). Device fields are bounded, so no one claim disables the memory check for everyone.

mod common;

use common::{TestApp, ADMIN};
use serde_json::{json, Value};

const GIB: u64 = 1 << 30;

fn cpu_slots(n: u64, memory_bytes: u64) -> Value {
    let slots: Vec<Value> = (0..n)
        .map(|i| json!({"index": i, "kind": "cpu", "name": format!("cpu slot {i}"), "memory_bytes": memory_bytes}))
        .collect();
    json!(slots)
}

fn gpus(n: u64) -> Value {
    let gpus: Vec<Value> =
        (0..n).map(|i| json!({"index": i, "kind": "gpu", "name": "NVIDIA H200", "memory_bytes": 140 * GIB})).collect();
    json!(gpus)
}

async fn register(app: &TestApp, agent: &str, devices: Value) -> common::Reply {
    app.post("/v1/agent/nodes", agent, &json!({"name": "n1", "address": "127.0.0.1", "devices": devices})).await
}

/// The devices of the only node, as `/v1/nodes` shows them: (kind, index).
async fn listed_devices(app: &TestApp) -> Vec<(String, i64)> {
    let nodes = app.get("/v1/nodes", ADMIN).await;
    assert_eq!(nodes.status, 200, "{}", nodes.text);
    let devices = nodes.body["nodes"][0]["devices"].as_array().unwrap().clone();
    devices.iter().map(|d| (d["kind"].as_str().unwrap().to_string(), d["index"].as_i64().unwrap())).collect()
}

/// Asserts a 409 at `devices` that says a platform admin must remove the node.
fn refused_at_devices(reply: &common::Reply, why: &str) {
    assert_eq!(reply.problem(409), vec!["devices"], "{why}");
    assert!(reply.text.contains("platform admin must remove the node"), "{why}: {}", reply.text);
}

async fn a_re_registration_may_keep_or_reduce_its_devices_but_not_add_to_them(app: TestApp) {
    let agent = app.agent_token().await;
    let first = register(&app, &agent, cpu_slots(2, 8 * GIB)).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let two_slots = vec![("cpu".to_string(), 0), ("cpu".to_string(), 1)];

    let grown = register(&app, &agent, gpus(8)).await;
    refused_at_devices(&grown, "8 GPUs");
    assert!(grown.text.contains("device 0 was registered as cpu, not gpu"), "{}", grown.text);
    assert!(grown.text.contains("device 2 was not registered"), "{}", grown.text);
    assert_eq!(listed_devices(&app).await, two_slots, "the node keeps its 2 slots");
    refused_at_devices(&register(&app, &agent, cpu_slots(3, 8 * GIB)).await, "a third slot");
    let more_memory = register(&app, &agent, cpu_slots(2, 9 * GIB)).await;
    refused_at_devices(&more_memory, "more memory");
    assert!(
        more_memory.text.contains("18.0 GiB") && more_memory.text.contains("more than the 16.0 GiB"),
        "{}",
        more_memory.text
    );
    assert_eq!(listed_devices(&app).await, two_slots);

    let same = register(&app, &agent, cpu_slots(2, 8 * GIB)).await;
    assert_eq!(same.status, 200, "{}", same.text);
    assert_eq!(same.body["id"], first.body["id"]);
    // an agent restarted with fewer --cpus gives each slot a larger share of the same machine: fine
    let fewer = register(&app, &agent, cpu_slots(1, 16 * GIB)).await;
    assert_eq!(fewer.status, 200, "{}", fewer.text);
    assert_eq!(listed_devices(&app).await, [("cpu".to_string(), 0)]);
    refused_at_devices(&register(&app, &agent, cpu_slots(1, 17 * GIB)).await, "more memory in all");
    // fewer devices or less memory: fine; and a device that went away may come back, within the same total
    assert_eq!(register(&app, &agent, cpu_slots(2, 8 * GIB)).await.status, 200);
    assert_eq!(register(&app, &agent, cpu_slots(1, 4 * GIB)).await.status, 200);
    assert_eq!(listed_devices(&app).await, [("cpu".to_string(), 0)]);
    assert_eq!(register(&app, &agent, cpu_slots(2, 2 * GIB)).await.status, 200);
    assert_eq!(listed_devices(&app).await, two_slots);
    refused_at_devices(&register(&app, &agent, cpu_slots(2, 4 * GIB)).await, "a lowered total is the ceiling");
    // the memory last registered is the ceiling: once unsaid, a claim is a raise
    let unsaid = json!([{"index": 0, "kind": "cpu", "name": "cpu slot 0"}]);
    assert_eq!(register(&app, &agent, unsaid).await.status, 200);
    refused_at_devices(&register(&app, &agent, cpu_slots(1, GIB)).await, "memory after none");
}

async fn a_registration_claims_plausible_devices_only(app: TestApp) {
    let agent = app.agent_token().await;
    let field = |devices: Value| {
        let app = &app;
        let agent = agent.clone();
        async move { register(app, &agent, devices).await.problem(422) }
    };
    let huge = json!([{"index": 0, "kind": "gpu", "name": "g", "memory_bytes": (16u64 << 40) + 1}]);
    assert_eq!(field(huge).await, ["devices[0].memory_bytes"]);
    let long = json!([{"index": 0, "kind": "cpu", "name": "x".repeat(201)}]);
    assert_eq!(field(long).await, ["devices[0].name"]);
    let two_lines = json!([{"index": 0, "kind": "cpu", "name": "cpu\nslot"}]);
    assert_eq!(field(two_lines).await, ["devices[0].name"]);
    let address = json!({"name": "n1", "address": "10.0.0.1\u{1b}[2J", "devices": cpu_slots(1, GIB)});
    assert_eq!(app.post("/v1/agent/nodes", &agent, &address).await.problem(422), ["address"]);
    // at the bounds: accepted
    let largest = json!([{"index": 0, "kind": "gpu", "name": "y".repeat(200), "memory_bytes": 16u64 << 40}]);
    let accepted = register(&app, &agent, largest).await;
    assert_eq!(accepted.status, 200, "{}", accepted.text);
}

ringtrain_store::on_both_backends!(
    setup = crate::common::TestApp::new;
    a_re_registration_may_keep_or_reduce_its_devices_but_not_add_to_them,
    a_registration_claims_plausible_devices_only,
);
