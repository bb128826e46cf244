//! The authorisation matrix: every route the OpenAPI document lists, called by every kind of caller, with
//! the answer each must get. A route without a row here fails the test, so a new route cannot ship without
//! its access rule being decided.
//!
//! Callers, in the order of each row's rule string: platform admin, team A's admin, A's member, A's viewer,
//! the agent holding rank 0 of A's job, team B's admin, a revoked token of A, no token.
//! Each character: `y` allowed (any answer but 401, 403 and 404), `u` 401, `f` 403, `n` 404.

mod common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request};
use common::{safetensors_file, spec, TestApp, ADMIN};
use ringtrain_core::{DeviceId, JobId, NodeId};
use ringtrain_store::{NewAssignment, NewModel};
use serde_json::{json, Value};

const RULES: &[(&str, &str, &str)] = &[
    ("get", "/healthz", "yyyyyyyy"),
    ("get", "/readyz", "yyyyyyyy"),
    ("get", "/metrics", "yyyyyyyy"),
    ("get", "/openapi.json", "yyyyyyyy"),
    ("post", "/v1/jobs", "yyyffyuu"),
    ("get", "/v1/jobs", "yyyyfyuu"),
    ("get", "/v1/jobs/{id}", "nyyyfnuu"),
    ("post", "/v1/jobs/{id}/cancel", "nyyffnuu"),
    ("post", "/v1/jobs/{id}/resume", "nyyffnuu"),
    ("patch", "/v1/jobs/{id}", "nyyffnuu"),
    ("get", "/v1/jobs/{id}/events", "nyyyfnuu"),
    ("get", "/v1/jobs/{id}/logs", "nyyyfnuu"),
    ("get", "/v1/jobs/{id}/metrics", "nyyyfnuu"),
    ("get", "/v1/jobs/{id}/schedule", "nyyyfnuu"),
    ("get", "/v1/jobs/{id}/checkpoints", "nyyyfnuu"),
    ("get", "/v1/jobs/{id}/checkpoints/{checkpoint}/archive", "nyyyfnuu"),
    ("get", "/v1/jobs/{id}/checkpoints/{checkpoint}/weights/{file}", "nyyyfnuu"),
    ("post", "/v1/models", "yyyffyuu"),
    ("get", "/v1/models", "yyyyfyuu"),
    ("get", "/v1/models/{id}", "nyyyfnuu"),
    ("delete", "/v1/models/{id}", "nyyffnuu"),
    ("get", "/v1/agent/jobs/{id}/model", "ffffyfuu"),
    // the fixture's job is not a fork: 404 even to its rank 0's agent (tests/cluster.rs downloads a fork's)
    ("get", "/v1/agent/jobs/{id}/init", "ffffnfuu"),
    ("post", "/v1/schedules/preview", "yyyyfyuu"),
    ("post", "/v1/studies", "yyyffyuu"),
    ("get", "/v1/studies", "yyyyfyuu"),
    ("get", "/v1/studies/{id}", "nyyyfnuu"),
    ("get", "/v1/studies/{id}/plot.svg", "nyyyfnuu"),
    ("post", "/v1/studies/{id}/cancel", "nyyffnuu"),
    ("post", "/v1/datasets", "yyyffyuu"),
    ("get", "/v1/datasets", "yyyyfyuu"),
    ("delete", "/v1/datasets/{id}", "nyyffnuu"),
    ("post", "/v1/datasets/uploads", "yyyffyuu"),
    ("post", "/v1/datasets/sharded", "yyyffyuu"),
    ("get", "/v1/datasets/uploads", "yyyyfyuu"),
    ("get", "/v1/datasets/uploads/{id}", "nyyyfnuu"),
    ("put", "/v1/datasets/uploads/{id}/parts/{number}", "nyyffnuu"),
    ("post", "/v1/datasets/uploads/{id}/complete", "nyyffnuu"),
    ("delete", "/v1/datasets/uploads/{id}", "nyyffnuu"),
    ("delete", "/v1/jobs/{id}/artifacts", "nyyffnuu"),
    ("patch", "/v1/teams/{id}", "yfffffuu"),
    ("get", "/v1/teams/{id}/storage", "yyyyfnuu"),
    ("get", "/v1/teams/{id}/usage", "yyyyfnuu"),
    ("get", "/v1/me", "yyyyfyuu"),
    ("post", "/v1/teams", "yfffffuu"),
    ("get", "/v1/teams", "yyfffyuu"),
    ("post", "/v1/teams/{id}/tokens", "yyfffnuu"),
    ("get", "/v1/teams/{id}/tokens", "yyfffnuu"),
    ("post", "/v1/agent-tokens", "yfffffuu"),
    ("get", "/v1/agent-tokens", "yfffffuu"),
    ("delete", "/v1/tokens/{id}", "yyfffnuu"),
    ("get", "/v1/nodes", "yyyyfyuu"),
    ("post", "/v1/agent/nodes", "ffffyfuu"),
    ("post", "/v1/agent/nodes/{id}/heartbeat", "ffffyfuu"),
    ("post", "/v1/agent/nodes/{id}/self-test", "ffffyfuu"),
    ("post", "/v1/nodes/{id}/quarantine", "yfffffuu"),
    ("delete", "/v1/nodes/{id}/quarantine", "yfffffuu"),
    ("get", "/v1/agent/nodes/{id}/assignments", "ffffyfuu"),
    ("post", "/v1/agent/assignments/{id}/endpoint", "ffffyfuu"),
    ("post", "/v1/agent/assignments/{id}/state", "ffffyfuu"),
    ("post", "/v1/agent/jobs/{id}/running", "ffffyfuu"),
    ("post", "/v1/agent/jobs/{id}/metrics", "ffffyfuu"),
    ("post", "/v1/agent/jobs/{id}/logs", "ffffyfuu"),
    ("put", "/v1/agent/jobs/{id}/checkpoints/{name}", "ffffyfuu"),
    ("get", "/v1/agent/jobs/{id}/checkpoints/{checkpoint}/archive", "ffffyfuu"),
    ("get", "/v1/agent/datasets/{id}", "ffffyfuu"),
    ("post", "/v1/agent/jobs/{id}/result", "ffffyfuu"),
];

/// The objects the calls are about: all of team A's, its job placed on the agent's node.
struct Fixture {
    callers: Vec<Option<String>>,
    team_a: String,
    job: String,
    attempt: i32,
    node: NodeId,
    assignment: String,
    checkpoint: String,
    dataset: String,
    /// Team A's uploaded model, which the placed job trains (on the dataset).
    model: String,
    admin_a: String,
    /// A queued job of team A: deleting its checkpoints is refused (409) to those allowed, so no call of
    /// the matrix removes the checkpoint the download routes ask for.
    queued_job: String,
    /// A study of team A.
    study: String,
    /// An upload in parts of team A, none of its parts sent: completing it is refused (409).
    upload: String,
}

/// The body that starts an upload in parts.
fn new_upload() -> Value {
    json!({"name": "u", "size_bytes": 100, "part_bytes": 1 << 20})
}

/// A new upload of team A to delete, after deleting the others but the fixture's (a team has at most 8 in
/// progress, and the callers refused the delete leave theirs).
async fn fresh_upload(app: &TestApp, fx: &Fixture) -> String {
    let uploads = app.get("/v1/datasets/uploads", &fx.admin_a).await.body["uploads"].clone();
    for upload in uploads.as_array().into_iter().flatten() {
        let id = upload["id"].as_str().unwrap();
        if id != fx.upload {
            app.call(Method::DELETE, &format!("/v1/datasets/uploads/{id}"), Some(&fx.admin_a), None).await;
        }
    }
    let created = app.post("/v1/datasets/uploads", &fx.admin_a, &new_upload()).await;
    created.body["id"].as_str().unwrap().to_string()
}

async fn fixture(app: &TestApp) -> Fixture {
    let a = app.team("alpha").await;
    let b = app.team("beta").await;
    let agent = app.agent_token().await;
    let upload =
        app.send_bytes(Method::POST, "/v1/datasets?name=d", &a.member, safetensors_file(100, |i| (i % 3) as i64)).await;
    let dataset = upload.body["id"].as_str().unwrap().to_string();
    // a model as an upload stores it (the check itself runs in `ringtrain models check`, which these tests
    // of the server alone do not have; tests/byo_api.rs uploads through it)
    let models = app.dir.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    let model_id = ringtrain_core::ModelId::new();
    let model_path = models.join(format!("{model_id}.pt"));
    std::fs::write(&model_path, b"a TorchScript file").unwrap();
    let team_a = ringtrain_core::TeamId(a.id.parse().unwrap());
    app.store
        .add_model(NewModel {
            id: model_id,
            team_id: team_a,
            name: "m".into(),
            path: model_path.to_string_lossy().into_owned(),
            size_bytes: 18,
            sha256: "0".repeat(64),
            inputs: vec!["x".into()],
            report: json!({}),
        })
        .await
        .unwrap();
    let mut on_dataset = spec("matrix");
    on_dataset["model"] = json!({"uploaded": model_id});
    on_dataset["dataset"] = json!(dataset);
    on_dataset["workers"] = json!(1);
    let job = app.submit(&a.member, &on_dataset).await;
    // it trains the model too, and nothing cancels it: deleting the model is refused (409) to those allowed
    let mut waits = spec("waits");
    waits["model"] = json!({"uploaded": model_id});
    waits["dataset"] = json!(dataset);
    waits["workers"] = json!(1);
    let queued_job = app.submit(&a.member, &waits).await;
    let study = app.post("/v1/studies", &a.member, &json!({"base": spec("s"), "points": [{}]})).await;
    let study = study.body["id"].as_str().unwrap().to_string();
    let upload = app.post("/v1/datasets/uploads", &a.member, &new_upload()).await;
    let upload = upload.body["id"].as_str().unwrap().to_string();
    let devices = json!([{"index": 0, "kind": "cpu", "name": "cpu 0"}]);
    let node =
        app.post("/v1/agent/nodes", &agent, &json!({"name": "n0", "address": "127.0.0.1", "devices": devices})).await;
    let node_id: NodeId = node.body["id"].as_str().unwrap().parse().unwrap();
    let device: DeviceId = node.body["devices"][0]["id"].as_str().unwrap().parse().unwrap();
    let ranks = [NewAssignment { node_id, device_id: device, rank: 0 }];
    let (started, placed) = app
        .store
        .start_job(JobId(job.parse().unwrap()), "scheduler-1", Duration::from_secs(600), &ranks)
        .await
        .unwrap()
        .unwrap();
    let uri = format!("/v1/agent/jobs/{job}/checkpoints/epoch-0001?attempt={}&epoch=1&iteration=3", started.attempt);
    let checkpoint =
        app.send_bytes(Method::PUT, &uri, &agent, vec![1; 16]).await.body["id"].as_str().unwrap().to_string();
    let revoked = app.post(&format!("/v1/teams/{}/tokens", a.id), &a.admin, &json!({"role": "member"})).await;
    let revoked_id = revoked.body["info"]["id"].as_str().unwrap();
    assert_eq!(app.call(Method::DELETE, &format!("/v1/tokens/{revoked_id}"), Some(&a.admin), None).await.status, 204);
    Fixture {
        callers: vec![
            Some(ADMIN.to_string()),
            Some(a.admin.clone()),
            Some(a.member.clone()),
            Some(a.viewer.clone()),
            Some(agent.clone()),
            Some(b.admin.clone()),
            Some(revoked.body["token"].as_str().unwrap().to_string()),
            None,
        ],
        team_a: a.id.clone(),
        job,
        attempt: started.attempt,
        node: node_id,
        assignment: placed[0].id.to_string(),
        checkpoint,
        dataset,
        model: model_id.to_string(),
        admin_a: a.admin,
        queued_job,
        study,
        upload,
    }
}

/// The request a route gets: its path with the fixture's ids, and a body that passes validation where one
/// is needed (a fresh token to revoke each time).
async fn request(app: &TestApp, fx: &Fixture, method: &str, path: &str, token: Option<&str>) -> Request<Body> {
    let id = if path.starts_with("/v1/teams/") {
        fx.team_a.clone()
    } else if path.starts_with("/v1/tokens/") {
        let fresh = app.post(&format!("/v1/teams/{}/tokens", fx.team_a), &fx.admin_a, &json!({"role": "viewer"})).await;
        fresh.body["info"]["id"].as_str().unwrap().to_string()
    } else if path.starts_with("/v1/agent/nodes/") || path.starts_with("/v1/nodes/") {
        fx.node.to_string()
    } else if path.starts_with("/v1/agent/assignments/") {
        fx.assignment.clone()
    } else if (method, path) == ("delete", "/v1/jobs/{id}/artifacts") {
        fx.queued_job.clone()
    } else if path.starts_with("/v1/studies/") {
        fx.study.clone()
    } else if (method, path) == ("delete", "/v1/datasets/uploads/{id}") {
        fresh_upload(app, fx).await
    } else if path.starts_with("/v1/datasets/uploads/") {
        fx.upload.clone()
    } else if path.starts_with("/v1/agent/datasets/") || path.starts_with("/v1/datasets/") {
        fx.dataset.clone()
    } else if path.starts_with("/v1/models/") {
        fx.model.clone()
    } else {
        fx.job.clone()
    };
    let mut uri = path
        .replace("{id}", &id)
        .replace("{checkpoint}", &fx.checkpoint)
        .replace("{name}", "epoch-0002")
        .replace("{file}", "model.safetensors")
        .replace("{number}", "1");
    let attempt = fx.attempt;
    let body: Option<Value> = match (method, path) {
        ("post", "/v1/jobs") | ("post", "/v1/schedules/preview") => Some(spec("m")),
        ("post", "/v1/studies") => Some(json!({"base": spec("m"), "points": [{}]})),
        ("post", "/v1/studies/{id}/cancel") | ("post", "/v1/datasets/uploads/{id}/complete") => Some(json!({})),
        ("post", "/v1/datasets/uploads") => Some(new_upload()),
        ("post", "/v1/datasets/sharded") => Some(json!({"name": "r", "source": "/data/shards"})),
        ("post", "/v1/teams") => {
            Some(json!({"name": format!("t{}", uuid::Uuid::new_v4().simple()), "gpu_quota": 0, "cpu_quota": 1}))
        }
        ("post", "/v1/teams/{id}/tokens") => Some(json!({"role": "viewer"})),
        ("patch", "/v1/teams/{id}") => Some(json!({"cpu_quota": 8})),
        ("post", "/v1/agent-tokens") => Some(json!({})),
        ("post", "/v1/jobs/{id}/cancel")
        | ("post", "/v1/jobs/{id}/resume")
        | ("post", "/v1/agent/nodes/{id}/heartbeat") => Some(json!({})),
        ("patch", "/v1/jobs/{id}") => Some(json!({"note": "checked"})),
        ("post", "/v1/agent/nodes/{id}/self-test") => {
            Some(json!({"checks": [{"name": "matmul", "passed": true, "detail": "exact"}]}))
        }
        ("post", "/v1/nodes/{id}/quarantine") => Some(json!({"reason": "a drill"})),
        ("post", "/v1/agent/nodes") => Some(
            json!({"name": "n0", "address": "127.0.0.1", "devices": [{"index": 0, "kind": "cpu", "name": "cpu 0"}]}),
        ),
        ("post", "/v1/agent/assignments/{id}/endpoint") => Some(json!({"address": "127.0.0.1:4000"})),
        ("post", "/v1/agent/assignments/{id}/state") => Some(json!({"from": "delivered", "to": "running"})),
        ("post", "/v1/agent/jobs/{id}/running") => Some(json!({"attempt": attempt})),
        ("post", "/v1/agent/jobs/{id}/metrics") => Some(json!({"attempt": attempt, "reports": []})),
        ("post", "/v1/agent/jobs/{id}/logs") => Some(json!({"attempt": attempt, "rank": 0, "lines": []})),
        ("post", "/v1/agent/jobs/{id}/result") => {
            Some(json!({"attempt": attempt, "outcome": "failed", "error": "x", "retryable": true}))
        }
        _ => None,
    };
    if (method, path) == ("post", "/v1/datasets") {
        uri.push_str("?name=upload");
    }
    if (method, path) == ("post", "/v1/models") {
        uri.push_str(&format!("?name=upload&dataset={}", fx.dataset));
    }
    if path == "/v1/agent/nodes/{id}/assignments" {
        uri.push_str("?wait_s=0");
    }
    if path == "/v1/agent/jobs/{id}/checkpoints/{name}" {
        uri.push_str(&format!("?attempt={attempt}&epoch=2&iteration=5"));
    }
    let mut builder = Request::builder().method(Method::from_bytes(method.to_uppercase().as_bytes()).unwrap()).uri(uri);
    if let Some(token) = token {
        builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    match (method, path, body) {
        (_, _, Some(body)) => {
            builder.header(header::CONTENT_TYPE, "application/json").body(Body::from(body.to_string()))
        }
        ("post", "/v1/models", None) => {
            builder.header(header::CONTENT_TYPE, "application/octet-stream").body(Body::from("a TorchScript file"))
        }
        ("post", "/v1/datasets", None) | ("put", _, None) => builder
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(Body::from(safetensors_file(50, |i| (i % 2) as i64))),
        _ => builder.body(Body::empty()),
    }
    .unwrap()
}

async fn every_route_answers_every_caller_as_its_rule_says(app: TestApp) {
    let fx = fixture(&app).await;
    let doc = app.call(Method::GET, "/openapi.json", None, None).await.body;
    let mut failures = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in
            item.as_object().unwrap().keys().filter(|m| ["get", "post", "put", "delete", "patch"].contains(&m.as_str()))
        {
            let Some((_, _, rule)) = RULES.iter().find(|(m, p, _)| m == method && p == path) else {
                failures.push(format!("{method} {path}: no rule in RULES"));
                continue;
            };
            for (caller, expected) in fx.callers.iter().zip(rule.chars()) {
                let reply = app.send(request(&app, &fx, method, path, caller.as_deref()).await).await;
                let status = reply.status.as_u16();
                let ok = match expected {
                    'y' => ![401, 403, 404].contains(&status),
                    'u' => status == 401,
                    'f' => status == 403,
                    'n' => status == 404,
                    other => panic!("unknown rule character {other:?}"),
                };
                if !ok {
                    let who = [
                        "platform",
                        "team admin",
                        "member",
                        "viewer",
                        "agent",
                        "other team's admin",
                        "revoked",
                        "no token",
                    ][fx.callers.iter().position(|c| c == caller).unwrap()];
                    failures.push(format!("{method} {path} as {who}: {status}, expected {expected}: {}", reply.text));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

ringtrain_store::on_both_backends!(
    setup = crate::common::TestApp::new;
    every_route_answers_every_caller_as_its_rule_says,
);
