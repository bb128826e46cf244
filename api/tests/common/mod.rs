//! The test harness: the real app on a fresh database (Postgres through `#[sqlx::test]`, which fails when
//! Postgres is unreachable, or a temporary SQLite file), driven through `oneshot`.

#![allow(dead_code)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::Router;
use ringtrain_api::{app, ApiConfig, AppState};
use ringtrain_store::Store;
use serde_json::{json, Value};
use tower::ServiceExt;

pub const ADMIN: &str = "rt_test_bootstrap_admin_0123456789abcdef";

pub struct TestApp {
    pub router: Router,
    pub store: Arc<dyn Store>,
    pub state: AppState,
    pub dir: tempfile::TempDir,
}

/// A response, its body parsed as JSON when it is JSON.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
    pub text: String,
}

impl Reply {
    pub fn content_type(&self) -> &str {
        self.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    /// Asserts a problem+json answer with this status, and returns its field paths.
    pub fn problem(&self, status: u16) -> Vec<String> {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.text);
        assert_eq!(self.content_type(), "application/problem+json", "body: {}", self.text);
        assert_eq!(self.body["status"], status);
        assert!(self.body["type"].as_str().unwrap().starts_with("urn:ringtrain:problem:"));
        self.body["errors"]
            .as_array()
            .map(|errors| errors.iter().map(|e| e["path"].as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    }
}

/// The tokens of one team.
#[derive(Debug, Clone)]
pub struct Team {
    pub id: String,
    pub member: String,
    pub viewer: String,
    pub admin: String,
}

impl TestApp {
    /// The app on a fresh store (see `on_both_backends!`), with its data directory in a temporary folder.
    /// No per-token rate limit or metric budget: tests of other things make requests as fast as they can.
    pub async fn new(store: Arc<dyn Store>) -> TestApp {
        Self::with_config(store, |config| {
            config.admission.rate_per_second = 0.0;
            config.metric_rows_per_second = 0.0;
        })
        .await
    }

    /// The app with `configure` applied to the test configuration.
    pub async fn with_config(store: Arc<dyn Store>, configure: impl FnOnce(&mut ApiConfig)) -> TestApp {
        let dir = tempfile::tempdir().unwrap();
        ringtrain_api::bootstrap::bootstrap(store.as_ref(), Some(ADMIN)).await.unwrap();
        let mut config = ApiConfig::new(dir.path());
        config.event_poll = std::time::Duration::from_millis(50);
        config.max_dataset_bytes = 1 << 20;
        config.idx_roots = vec!["/data".into()];
        configure(&mut config);
        let state = AppState::new(store.clone(), config);
        let router = app(state.clone());
        TestApp { router, store, state, dir }
    }

    /// The same server started again: a new app on the same store, data folder and configuration.
    pub async fn restarted(self) -> TestApp {
        let TestApp { store, state, dir, .. } = self;
        let state = AppState::new(store.clone(), (*state.config).clone());
        let router = app(state.clone());
        TestApp { router, store, state, dir }
    }

    pub async fn send(&self, request: Request<Body>) -> Reply {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply { status, headers, body, text }
    }

    pub async fn call(&self, method: Method, uri: &str, token: Option<&str>, body: Option<&Value>) -> Reply {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = match body {
            Some(body) => request.header(header::CONTENT_TYPE, "application/json").body(Body::from(body.to_string())),
            None => request.body(Body::empty()),
        };
        self.send(request.unwrap()).await
    }

    pub async fn get(&self, uri: &str, token: &str) -> Reply {
        self.call(Method::GET, uri, Some(token), None).await
    }

    pub async fn post(&self, uri: &str, token: &str, body: &Value) -> Reply {
        self.call(Method::POST, uri, Some(token), Some(body)).await
    }

    /// Sends raw bytes as `application/octet-stream`.
    pub async fn patch(&self, uri: &str, token: &str, body: &Value) -> Reply {
        self.call(Method::PATCH, uri, Some(token), Some(body)).await
    }

    pub async fn send_bytes(&self, method: Method, uri: &str, token: &str, bytes: Vec<u8>) -> Reply {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(Body::from(bytes))
            .unwrap();
        self.send(request).await
    }

    /// The raw bytes of a GET.
    pub async fn get_bytes(&self, uri: &str, token: &str) -> (StatusCode, Vec<u8>) {
        let request = Request::builder()
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        (status, axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap().to_vec())
    }

    /// A new team with an admin, a member and a viewer token.
    pub async fn team(&self, name: &str) -> Team {
        let created = self.post("/v1/teams", ADMIN, &json!({"name": name, "gpu_quota": 2, "cpu_quota": 8})).await;
        assert_eq!(created.status, 201, "{}", created.text);
        let id = created.body["id"].as_str().unwrap().to_string();
        let mut tokens = Vec::new();
        for role in ["member", "viewer", "admin"] {
            let reply =
                self.post(&format!("/v1/teams/{id}/tokens"), ADMIN, &json!({"role": role, "label": role})).await;
            assert_eq!(reply.status, 201, "{}", reply.text);
            tokens.push(reply.body["token"].as_str().unwrap().to_string());
        }
        Team { id, member: tokens[0].clone(), viewer: tokens[1].clone(), admin: tokens[2].clone() }
    }

    pub async fn agent_token(&self) -> String {
        let reply = self.post("/v1/agent-tokens", ADMIN, &json!({"label": "agent"})).await;
        assert_eq!(reply.status, 201, "{}", reply.text);
        reply.body["token"].as_str().unwrap().to_string()
    }

    /// Ends every rank of the attempt but rank 0 `to`, as their agents do once their ranks exited and their
    /// metric lines were sent (a success is taken only after the others ended `done`).
    pub async fn end_other_ranks(&self, job: &str, attempt: i32, to: ringtrain_core::AssignmentState) {
        use ringtrain_core::AssignmentState::{Delivered, Pending, Running};
        let id = ringtrain_core::JobId(job.parse().unwrap());
        for a in self.store.job_assignments(id, attempt).await.unwrap() {
            if a.rank == 0 {
                continue;
            }
            let mut ended = false;
            for from in [Pending, Delivered, Running] {
                ended = ended || self.store.set_assignment_state(a.id, from, to).await.unwrap();
            }
            assert!(ended, "rank {} was {}", a.rank, a.state);
        }
    }

    /// Submits `spec` and returns the job's id.
    pub async fn submit(&self, token: &str, spec: &Value) -> String {
        let reply = self.post("/v1/jobs", token, spec).await;
        assert_eq!(reply.status, 201, "{}", reply.text);
        reply.body["id"].as_str().unwrap().to_string()
    }
}

/// A one-rank job of `epochs` epochs (32 iterations each) placed on a fresh one-CPU node with `lease`, and
/// reported running when `running`; its id, the agent's token and the attempt.
pub async fn placed_job(
    app: &TestApp,
    team: &Team,
    epochs: u32,
    lease: std::time::Duration,
    running: bool,
) -> (String, String, i32) {
    use ringtrain_core::{DeviceId, JobId, NodeId};
    let agent = app.agent_token().await;
    let devices = json!([{"index": 0, "kind": "cpu", "name": "cpu 0"}]);
    let node =
        app.post("/v1/agent/nodes", &agent, &json!({"name": "n", "address": "127.0.0.1", "devices": devices})).await;
    assert_eq!(node.status, 200, "{}", node.text);
    let node_id: NodeId = node.body["id"].as_str().unwrap().parse().unwrap();
    let device: DeviceId = node.body["devices"][0]["id"].as_str().unwrap().parse().unwrap();
    let mut one = spec("one");
    one["workers"] = json!(1);
    one["epochs"] = json!(epochs);
    let id = app.submit(&team.member, &one).await;
    let ranks = [ringtrain_store::NewAssignment { node_id, device_id: device, rank: 0 }];
    let (job, _) = app.store.start_job(JobId(id.parse().unwrap()), "s", lease, &ranks).await.unwrap().unwrap();
    if running {
        let running = app.post(&format!("/v1/agent/jobs/{id}/running"), &agent, &json!({"attempt": job.attempt})).await;
        assert_eq!(running.status, 200, "{}", running.text);
    }
    (id, agent, job.attempt)
}

/// A small valid spec: 512 synthetic samples, k = 2, n = 16 (16 iterations per epoch), 4 epochs.
pub fn spec(name: &str) -> Value {
    json!({
        "name": name,
        "model": {"name": "mlp", "hidden": [32]},
        "dataset": "synthetic:512",
        "workers": 2,
        "per_worker_batch": 16,
        "epochs": 4,
        "lr": {"base": 0.1, "reference_batch": 32, "warmup": {"kind": "gradual", "epochs": 1},
               "decay": {"kind": "step", "milestones": [2, 3], "factor": 0.1}}
    })
}

/// A safetensors dataset of `samples` 1×2×2 f32 inputs with these labels.
pub fn safetensors_file(samples: usize, label: impl Fn(usize) -> i64) -> Vec<u8> {
    use safetensors::tensor::{Dtype, TensorView};
    let x: Vec<u8> = (0..samples * 4).flat_map(|i| (i as f32 / 10.0).to_le_bytes()).collect();
    let y: Vec<u8> = (0..samples).flat_map(|i| label(i).to_le_bytes()).collect();
    let tensors = vec![
        ("x", TensorView::new(Dtype::F32, vec![samples, 1, 2, 2], &x).unwrap()),
        ("y", TensorView::new(Dtype::I64, vec![samples], &y).unwrap()),
    ];
    safetensors::serialize(tensors, &None).unwrap()
}
