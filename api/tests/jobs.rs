//! Job routes through the real router, on Postgres and on SQLite: submission, validation, run history,
//! cancel, events, schedule, idempotency.

mod common;

use axum::body::Body;
use axum::http::{header, Method, Request};
use common::{spec, TestApp, ADMIN};
use serde_json::{json, Value};

async fn submit_returns_job_effective_lr_and_links(app: TestApp) {
    let team = app.team("alpha").await;
    let reply = app.post("/v1/jobs", &team.member, &spec("first")).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let id = reply.body["id"].as_str().unwrap();
    assert_eq!(reply.headers[header::LOCATION], format!("/v1/jobs/{id}"));
    assert_eq!(reply.body["state"], "queued");
    assert_eq!(reply.body["attempt"], 0);
    assert_eq!(reply.body["team_id"], team.id.as_str());
    assert_eq!(reply.body["links"]["schedule"], format!("/v1/jobs/{id}/schedule"));
    // Linear scaling: base 0.1 * kn 32 / reference 32 = 0.1; 512 / 32 = 16 iterations per epoch.
    let effective = &reply.body["effective"];
    assert_eq!(effective["global_batch"], 32);
    assert_eq!(effective["iterations_per_epoch"], 16);
    assert_eq!(effective["warmup_iterations"], 16);
    assert_eq!(effective["decay_milestones"], json!([2, 3]));

    let got = app.get(&format!("/v1/jobs/{id}"), &team.viewer).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body["id"], id);
    assert_eq!(got.body["spec"]["name"], "first");

    let schedule = app.get(&format!("/v1/jobs/{id}/schedule"), &team.viewer).await;
    assert_eq!(schedule.status, 200, "{}", schedule.text);
    assert_eq!(schedule.body["epochs"].as_array().unwrap().len(), 4);
    assert!(schedule.body.get("per_iteration").is_none());
    let full = app.get(&format!("/v1/jobs/{id}/schedule?per_iteration=true"), &team.viewer).await;
    assert_eq!(full.body["per_iteration"].as_array().unwrap().len(), 64);

    let checkpoints = app.get(&format!("/v1/jobs/{id}/checkpoints"), &team.viewer).await;
    assert_eq!(checkpoints.status, 200);
    assert_eq!(checkpoints.body["checkpoints"], json!([]));
}

/// Bad specs, each answered 422 problem+json naming exactly these field paths.
async fn invalid_specs_name_every_field(app: TestApp) {
    let team = app.team("alpha").await;
    let with = |patch: Value| {
        let mut s = spec("bad");
        merge(&mut s, patch);
        s
    };
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (with(json!({"workers": 0})), vec!["workers"]),
        (with(json!({"workers": -1})), vec!["workers"]),
        (with(json!({"workers": 1e12})), vec!["workers"]),
        (with(json!({"workers": 99999999999999999999u128.to_string()})), vec!["workers"]),
        (with(json!({"workers": 0, "per_worker_batch": 0})), vec!["workers", "per_worker_batch"]),
        (
            with(json!({"epochs": 0})),
            vec!["epochs", "lr.warmup.epochs", "lr.decay.milestones[0]", "lr.decay.milestones[1]"],
        ),
        (with(json!({"colour": "blue"})), vec!["colour"]),
        (with(json!({"optimizer": {"momentun": 0.9}})), vec!["optimizer.momentun"]),
        // every problem at once: structural (an unknown value, a misspelt field) with the ranges
        (
            with(json!({"model": {"name": "lenet6"}, "optimiser": {}, "workers": 0,
                "lr": {"warmup": {"kind": "gradual", "epochs": 5}}})),
            vec![
                "model.name",
                "optimiser",
                "workers",
                "lr.warmup.epochs",
                "lr.decay.milestones[0]",
                "lr.decay.milestones[1]",
            ],
        ),
        (with(json!({"epochs": "four", "seed": -1, "priority": 5000})), vec!["epochs", "seed", "priority"]),
        (with(json!({"model": {"name": "vgg"}})), vec!["model.name"]),
        (with(json!({"model": {"name": "resnet20", "hidden": [3]}})), vec!["model.hidden"]),
        (with(json!({"model": {"name": "mlp", "hidden": [0, 8]}})), vec!["model.hidden[0]"]),
        (with(json!({"dataset": "cifar"})), vec!["dataset"]),
        (with(json!({"lr": {"base": -0.1}})), vec!["lr.base"]),
        (with(json!({"lr": {"warmup": {"kind": "gradual", "epochs": -1}}})), vec!["lr.warmup.epochs"]),
        (with(json!({"lr": {"decay": {"kind": "step", "milestones": [3, 2]}}})), vec!["lr.decay.milestones[1]"]),
        (with(json!({"optimizer": {"momentum": 1.5}})), vec!["optimizer.momentum"]),
        (with(json!({"per_worker_batch": 512})), vec!["per_worker_batch"]),
        (with(json!({"priority": 5000, "max_restarts": 1000})), vec!["max_restarts", "priority"]),
        (json!({"dataset": "fashion-mnist"}), vec![""]),
        (json!([1, 2]), vec![""]),
    ];
    for (body, expected) in cases {
        let reply = app.post("/v1/jobs", &team.member, &body).await;
        let mut paths = reply.problem(422);
        paths.sort();
        let mut expected: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        expected.sort();
        // a document without a field that has no default, or not an object: one problem for the whole
        if expected == [""] {
            assert_eq!(paths.len(), 1, "{body}: {}", reply.text);
        } else {
            assert_eq!(paths, expected, "{body}: {}", reply.text);
        }
    }
    // the reasons say what was meant
    let body = with(json!({"optimiser": {}, "model": {"name": "lenet6"}}));
    let reply = app.post("/v1/jobs", &team.member, &body).await;
    reply.problem(422);
    let reason = |path: &str| {
        let errors = reply.body["errors"].as_array().unwrap();
        errors.iter().find(|e| e["path"] == path).unwrap()["reason"].as_str().unwrap().to_string()
    };
    assert_eq!(reason("optimiser"), "unknown field `optimiser`: did you mean `optimizer`?");
    assert!(reason("model.name").ends_with("did you mean `lenet5`?"), "{}", reply.text);
    // the schedule preview and a dry run say the same at once
    let preview = app.post("/v1/schedules/preview", &team.member, &body).await;
    let mut paths = preview.problem(422);
    paths.sort();
    assert_eq!(paths, ["model.name", "optimiser"], "{}", preview.text);
    // Nothing was stored.
    let list = app.get("/v1/jobs", &team.member).await;
    assert_eq!(list.body["jobs"], json!([]));
}

fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                match t.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        t.insert(k, v);
                    }
                }
            }
        }
        (t, p) => *t = p,
    }
}

/// Malformed requests of every kind answer 4xx problem+json, never 500.
async fn malformed_requests_are_problems(app: TestApp) {
    let team = app.team("alpha").await;
    let raw = |method: Method, uri: &str, content_type: Option<&str>, body: Vec<u8>| {
        let mut request =
            Request::builder().method(method).uri(uri).header(header::AUTHORIZATION, format!("Bearer {}", team.member));
        if let Some(ct) = content_type {
            request = request.header(header::CONTENT_TYPE, ct);
        }
        request.body(Body::from(body)).unwrap()
    };
    let malformed = app.send(raw(Method::POST, "/v1/jobs", Some("application/json"), b"{\"model\": ".to_vec())).await;
    malformed.problem(400);
    assert!(malformed.body["detail"].as_str().unwrap().contains("not valid JSON"));
    app.send(raw(Method::POST, "/v1/jobs", Some("text/plain"), spec("x").to_string().into_bytes())).await.problem(415);
    app.send(raw(Method::POST, "/v1/jobs", None, spec("x").to_string().into_bytes())).await.problem(415);
    let huge = format!("{{\"name\": \"{}\"}}", "x".repeat(2 << 20));
    app.send(raw(Method::POST, "/v1/jobs", Some("application/json"), huge.into_bytes())).await.problem(413);
    app.get("/v1/nothing-here", &team.member).await.problem(404);
    app.get("/nope", &team.member).await.problem(404);
    app.call(Method::DELETE, "/v1/jobs", Some(&team.member), None).await.problem(405);
    assert_eq!(app.get("/v1/jobs/not-a-uuid", &team.member).await.problem(400), vec!["id"]);
    assert_eq!(app.get("/v1/jobs/not-a-uuid/metrics", &team.member).await.problem(400), vec!["id"]);
    assert_eq!(app.get("/v1/jobs?limit=-3", &team.member).await.problem(400), vec!["limit"]);
    assert_eq!(app.get("/v1/jobs?limit=100000", &team.member).await.problem(400), vec!["limit"]);
    assert_eq!(app.get("/v1/jobs?state=done", &team.member).await.problem(400), vec!["state"]);
    assert_eq!(app.get("/v1/jobs?cursor=abc", &team.member).await.problem(400), vec!["cursor"]);
    assert_eq!(app.get("/v1/jobs?created_after=yesterday", &team.member).await.problem(400), vec!["created_after"]);
    assert_eq!(app.get("/v1/jobs?colour=red", &team.member).await.problem(400).len(), 1);
    let team_body = json!({"name": "Bad Name!", "gpu_quota": -1, "cpu_quota": 1});
    assert_eq!(app.post("/v1/teams", ADMIN, &team_body).await.problem(422), vec!["gpu_quota"]);
    let team_body = json!({"name": "Bad Name!", "gpu_quota": 1, "cpu_quota": 2_000_000});
    let mut paths = app.post("/v1/teams", ADMIN, &team_body).await.problem(422);
    paths.sort();
    assert_eq!(paths, vec!["cpu_quota", "name"]);
    let bad_key = Request::builder()
        .method(Method::POST)
        .uri("/v1/jobs")
        .header(header::AUTHORIZATION, format!("Bearer {}", team.member))
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", "x".repeat(300))
        .body(Body::from(spec("k").to_string()))
        .unwrap();
    assert_eq!(app.send(bad_key).await.problem(400), vec!["Idempotency-Key"]);
}

async fn auth_is_required_and_roles_hold(app: TestApp) {
    let team = app.team("alpha").await;
    app.call(Method::GET, "/v1/jobs", None, None).await.problem(401);
    let wrong = app.get("/v1/jobs", "rt_not_a_token").await;
    wrong.problem(401);
    assert_eq!(wrong.headers[header::WWW_AUTHENTICATE], "Bearer");
    let basic = Request::builder()
        .uri("/v1/jobs")
        .header(header::AUTHORIZATION, "Basic dXNlcjpwYXNz")
        .body(Body::empty())
        .unwrap();
    app.send(basic).await.problem(401);
    // A viewer reads but cannot submit, cancel or upload.
    app.post("/v1/jobs", &team.viewer, &spec("v")).await.problem(403);
    let id = app.submit(&team.member, &spec("m")).await;
    app.post(&format!("/v1/jobs/{id}/cancel"), &team.viewer, &json!({})).await.problem(403);
    assert_eq!(app.get(&format!("/v1/jobs/{id}"), &team.viewer).await.status, 200);
    // Only admins manage teams and tokens.
    app.post("/v1/teams", &team.member, &json!({"name": "x", "gpu_quota": 0, "cpu_quota": 0})).await.problem(403);
    app.get("/v1/teams", &team.viewer).await.problem(403);
    app.post(&format!("/v1/teams/{}/tokens", team.id), &team.member, &json!({"role": "admin"})).await.problem(403);
    app.post("/v1/agent-tokens", &team.member, &json!({})).await.problem(403);
    assert_eq!(app.get("/v1/teams", ADMIN).await.status, 200);
    // Agent tokens only work on /v1/agent, and user tokens not there.
    let agent = app.agent_token().await;
    app.get("/v1/jobs", &agent).await.problem(403);
    app.post("/v1/agent/nodes", &team.admin, &json!({"name": "n", "devices": []})).await.problem(403);
    // Duplicate team names conflict.
    let taken = app.post("/v1/teams", ADMIN, &json!({"name": "alpha", "gpu_quota": 0, "cpu_quota": 0})).await;
    taken.problem(409);
    // the answer names the team, never the database's own message (tables, constraints)
    assert_eq!(taken.body["detail"], "a team named \"alpha\" exists", "{}", taken.text);
    for internal in ["UNIQUE", "unique constraint", "duplicate key", "teams.name", "teams_name"] {
        assert!(!taken.text.contains(internal), "{}", taken.text);
    }
    app.post("/v1/teams/00000000-0000-0000-0000-000000000000/tokens", ADMIN, &json!({"role": "member"}))
        .await
        .problem(404);
    assert_eq!(
        app.post(&format!("/v1/teams/{}/tokens", team.id), ADMIN, &json!({"role": "agent"})).await.problem(422),
        vec!["role"]
    );
}

/// Team B sees none of team A's jobs on any route: 404, never 403.
async fn other_teams_jobs_are_not_found(app: TestApp) {
    let a = app.team("alpha").await;
    let b = app.team("beta").await;
    let id = app.submit(&a.member, &spec("a-job")).await;
    for suffix in ["", "/events", "/metrics", "/schedule", "/checkpoints"] {
        let uri = format!("/v1/jobs/{id}{suffix}");
        app.get(&uri, &b.member).await.problem(404);
        app.get(&uri, &b.admin).await.problem(404);
        app.get(&uri, ADMIN).await.problem(404);
        assert_eq!(app.get(&uri, &a.viewer).await.status, 200, "{uri}");
    }
    app.post(&format!("/v1/jobs/{id}/cancel"), &b.member, &json!({})).await.problem(404);
    assert_eq!(app.get("/v1/jobs", &b.member).await.body["jobs"], json!([]));
    assert_eq!(app.get("/v1/jobs", &a.member).await.body["jobs"].as_array().unwrap().len(), 1);
    // Still queued: B's cancel changed nothing.
    assert_eq!(app.get(&format!("/v1/jobs/{id}"), &a.member).await.body["state"], "queued");
}

async fn run_history_pages_newest_first_with_filters(app: TestApp) {
    let team = app.team("alpha").await;
    let mut ids = Vec::new();
    for i in 0..7 {
        let name = if i % 2 == 0 { format!("sweep-{i}") } else { format!("probe-{i}") };
        ids.push(app.submit(&team.member, &spec(&name)).await);
    }
    ids.reverse(); // newest first
    let mut seen = Vec::new();
    let mut uri = "/v1/jobs?limit=3".to_string();
    loop {
        let page = app.get(&uri, &team.viewer).await;
        assert_eq!(page.status, 200, "{}", page.text);
        seen.extend(page.body["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap().to_string()));
        match page.body["next_cursor"].as_str() {
            Some(cursor) => uri = format!("/v1/jobs?limit=3&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, ids);

    let sweeps = app.get("/v1/jobs?name_prefix=sweep-", &team.viewer).await;
    let names: Vec<&str> =
        sweeps.body["jobs"].as_array().unwrap().iter().map(|j| j["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["sweep-6", "sweep-4", "sweep-2", "sweep-0"]);
    // A prefix is literal: no LIKE wildcards.
    assert_eq!(app.get("/v1/jobs?name_prefix=%25", &team.viewer).await.body["jobs"], json!([]));

    app.post(&format!("/v1/jobs/{}/cancel", ids[0]), &team.member, &json!({})).await;
    let cancelled = app.get("/v1/jobs?state=cancelled", &team.viewer).await;
    assert_eq!(cancelled.body["jobs"].as_array().unwrap().len(), 1);
    assert_eq!(cancelled.body["jobs"][0]["id"], ids[0].as_str());
    assert_eq!(app.get("/v1/jobs?state=queued", &team.viewer).await.body["jobs"].as_array().unwrap().len(), 6);

    let future = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let past = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert_eq!(app.get(&format!("/v1/jobs?created_after={future}"), &team.viewer).await.body["jobs"], json!([]));
    let recent = app.get(&format!("/v1/jobs?created_after={past}&created_before={future}"), &team.viewer).await;
    assert_eq!(recent.body["jobs"].as_array().unwrap().len(), 7, "{}", recent.text);
}

async fn cancel_records_events_and_stream_ends(app: TestApp) {
    let team = app.team("alpha").await;
    let id = app.submit(&team.member, &spec("c")).await;
    let cancelled = app.post(&format!("/v1/jobs/{id}/cancel"), &team.member, &json!({})).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.text);
    assert_eq!(cancelled.body["state"], "cancelled");
    assert!(cancelled.body["finished_at"].is_string());
    app.post(&format!("/v1/jobs/{id}/cancel"), &team.member, &json!({})).await.problem(409);

    let events = app.get(&format!("/v1/jobs/{id}/events"), &team.viewer).await;
    let events = events.body["events"].as_array().unwrap().clone();
    let states: Vec<&str> = events.iter().map(|e| e["to_state"].as_str().unwrap()).collect();
    assert_eq!(states, vec!["queued", "cancelled"]);
    assert!(events[1]["reason"].as_str().unwrap().contains("cancelled by token member"));
    let after = events[0]["seq"].as_i64().unwrap();
    let later = app.get(&format!("/v1/jobs/{id}/events?after={after}"), &team.viewer).await;
    assert_eq!(later.body["events"].as_array().unwrap().len(), 1);

    // SSE: the job is over, so the stream sends both events and ends by itself.
    let request = Request::builder()
        .uri(format!("/v1/jobs/{id}/events"))
        .header(header::AUTHORIZATION, format!("Bearer {}", team.viewer))
        .header(header::ACCEPT, "text/event-stream")
        .body(Body::empty())
        .unwrap();
    let reply = tokio::time::timeout(std::time::Duration::from_secs(10), app.send(request)).await.expect("stream ends");
    assert_eq!(reply.status, 200);
    assert!(reply.content_type().starts_with("text/event-stream"));
    assert_eq!(reply.text.matches("event: state").count(), 2, "{}", reply.text);
    assert!(reply.text.contains("\"to_state\":\"cancelled\""));
}

/// SSE follows a live job: an event written after the stream opened arrives, and the stream ends with it.
async fn event_stream_follows_until_the_job_ends(app: TestApp) {
    let team = app.team("alpha").await;
    let id = app.submit(&team.member, &spec("follow")).await;
    let request = Request::builder()
        .uri(format!("/v1/jobs/{id}/events"))
        .header(header::AUTHORIZATION, format!("Bearer {}", team.viewer))
        .header(header::ACCEPT, "text/event-stream")
        .body(Body::empty())
        .unwrap();
    let router = app.router.clone();
    let stream = tokio::spawn(async move {
        use tower::ServiceExt;
        let response = router.oneshot(request).await.unwrap();
        axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap()
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!stream.is_finished(), "the stream must stay open while the job is queued");
    app.post(&format!("/v1/jobs/{id}/cancel"), &team.member, &json!({})).await;
    let bytes = tokio::time::timeout(std::time::Duration::from_secs(10), stream).await.expect("stream ends").unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert_eq!(text.matches("event: state").count(), 2, "{text}");
}

async fn idempotency_key_replays_or_conflicts(app: TestApp) {
    let team = app.team("alpha").await;
    let submit = |key: &str, body: &Value| {
        Request::builder()
            .method(Method::POST)
            .uri("/v1/jobs")
            .header(header::AUTHORIZATION, format!("Bearer {}", team.member))
            .header(header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", key)
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let first = app.send(submit("key-1", &spec("idem"))).await;
    assert_eq!(first.status, 201);
    let again = app.send(submit("key-1", &spec("idem"))).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body["id"], first.body["id"]);
    app.send(submit("key-1", &spec("other"))).await.problem(409);
    // Keys are per team.
    let other = app.team("beta").await;
    let request = Request::builder()
        .method(Method::POST)
        .uri("/v1/jobs")
        .header(header::AUTHORIZATION, format!("Bearer {}", other.member))
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", "key-1")
        .body(Body::from(spec("idem").to_string()))
        .unwrap();
    assert_eq!(app.send(request).await.status, 201);

    // 50 parallel submits with one key make one job.
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let router = app.router.clone();
        let request = submit("key-parallel", &spec("parallel"));
        tasks.push(tokio::spawn(async move {
            use tower::ServiceExt;
            let response = router.oneshot(request).await.unwrap();
            let status = response.status().as_u16();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
            let body: Value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("{status}: {e}: {}", String::from_utf8_lossy(&bytes)));
            (status, body["id"].as_str().map(str::to_string))
        }));
    }
    let mut ids = std::collections::HashSet::new();
    let mut created = 0;
    for task in tasks {
        let (status, id) = task.await.unwrap();
        assert!(status == 201 || status == 200, "status {status}");
        created += usize::from(status == 201);
        ids.insert(id.unwrap());
    }
    assert_eq!(created, 1);
    assert_eq!(ids.len(), 1);
    let parallel = app.get("/v1/jobs?name_prefix=parallel", &team.viewer).await;
    assert_eq!(parallel.body["jobs"].as_array().unwrap().len(), 1);
}

async fn schedule_preview_compares_world_sizes(app: TestApp) {
    let team = app.team("alpha").await;
    let one = app.post("/v1/schedules/preview", &team.viewer, &spec("p")).await;
    assert_eq!(one.status, 200, "{}", one.text);
    assert_eq!(one.body["effective"]["global_batch"], 32);
    let many = app.post("/v1/schedules/preview?workers=1,2,4", &team.viewer, &spec("p")).await;
    assert_eq!(many.status, 200, "{}", many.text);
    let schedules = many.body["schedules"].as_array().unwrap();
    let lrs: Vec<f64> = schedules.iter().map(|s| s["schedule"]["effective"]["scaled_lr"].as_f64().unwrap()).collect();
    // Linear scaling: the scaled lr doubles with k.
    assert_eq!(lrs.len(), 3);
    assert!((lrs[1] / lrs[0] - 2.0).abs() < 1e-12 && (lrs[2] / lrs[1] - 2.0).abs() < 1e-12, "{lrs:?}");
    assert_eq!(
        app.post("/v1/schedules/preview?workers=2,x", &team.viewer, &spec("p")).await.problem(400),
        vec!["workers"]
    );
    // k = 64 with n = 16 exceeds 512 samples.
    let too_big = app.post("/v1/schedules/preview?workers=2,64", &team.viewer, &spec("p")).await;
    assert_eq!(too_big.problem(422), vec!["per_worker_batch"]);
    assert!(too_big.body["errors"][0]["reason"].as_str().unwrap().contains("workers = 64"));
    let mut idx = spec("i");
    idx["dataset"] = json!("idx:/data/mnist");
    assert_eq!(app.post("/v1/schedules/preview", &team.viewer, &idx).await.problem(422), vec!["dataset"]);
    let sized = app.post("/v1/schedules/preview?dataset_size=60000", &team.viewer, &idx).await;
    assert_eq!(sized.status, 200, "{}", sized.text);
    assert_eq!(sized.body["effective"]["iterations_per_epoch"], 1875);
    // Nothing stored.
    assert_eq!(app.get("/v1/jobs", &team.viewer).await.body["jobs"], json!([]));
    // An idx: job is accepted without effective hyperparameters; its schedule waits for the size.
    let reply = app.post("/v1/jobs", &team.member, &idx).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    assert!(reply.body["effective"].is_null());
    let id = reply.body["id"].as_str().unwrap();
    app.get(&format!("/v1/jobs/{id}/schedule"), &team.viewer).await.problem(409);
}

/// A failed or cancelled job is queued again by `POST /v1/jobs/{id}/resume`, with an event naming who
/// resumed it; anything else is refused.
async fn ended_jobs_resume(app: TestApp) {
    let team = app.team("alpha").await;
    let reply = app.post("/v1/jobs", &team.member, &spec("again")).await;
    let id = reply.body["id"].as_str().unwrap().to_string();
    let resume = format!("/v1/jobs/{id}/resume");
    let refused = app.post(&resume, &team.member, &json!({})).await;
    refused.problem(409);
    assert!(
        refused.body["detail"].as_str().unwrap().contains("only a failed, cancelled or stopped job"),
        "{}",
        refused.text
    );
    assert_eq!(app.post(&format!("/v1/jobs/{id}/cancel"), &team.member, &json!({})).await.status, 200);
    app.post(&resume, &team.viewer, &json!({})).await.problem(403);
    let other = app.team("beta").await;
    app.post(&resume, &other.member, &json!({})).await.problem(404);
    let resumed = app.post(&resume, &team.member, &json!({})).await;
    assert_eq!(resumed.status, 200, "{}", resumed.text);
    assert_eq!(resumed.body["state"], "queued");
    assert!(resumed.body["finished_at"].is_null() && resumed.body["error"].is_null(), "{}", resumed.text);
    let events = app.get(&format!("/v1/jobs/{id}/events"), &team.viewer).await;
    let last = events.body["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!((&last["from_state"], &last["to_state"]), (&json!("cancelled"), &json!("queued")), "{last}");
    assert!(last["reason"].as_str().unwrap().starts_with("resumed by token"), "{last}");
    // queued again: it may be cancelled again, and resumed again
    assert_eq!(app.post(&format!("/v1/jobs/{id}/cancel"), &team.member, &json!({})).await.status, 200);
    assert_eq!(app.post(&resume, &team.member, &json!({})).await.status, 200);
}

/// A fork names a checkpoint of a job of its team that trains the same model; the checkpoint is pinned
/// beside the new job, so the fork starts as submitted even once its source's artifacts are deleted.
async fn forks_start_from_a_checkpoint_of_the_team(app: TestApp) {
    let team = app.team("alpha").await;
    let (source, agent, attempt) = common::placed_job(&app, &team, 4, std::time::Duration::from_secs(60), true).await;
    let upload = format!("/v1/agent/jobs/{source}/checkpoints/epoch-0001?attempt={attempt}&epoch=1&iteration=32");
    let uploaded = app.send_bytes(Method::PUT, &upload, &agent, vec![7u8; 1234]).await;
    assert_eq!(uploaded.status, 201, "{}", uploaded.text);
    let checkpoint = uploaded.body["id"].as_str().unwrap().to_string();

    // every problem at once: another model, and a field out of range
    let mut other_model = spec("fork");
    other_model["model"] = json!({"name": "mlp", "hidden": [64]});
    other_model["init_from"] = json!({"checkpoint": checkpoint});
    other_model["priority"] = json!(1_000_000);
    let refused = app.post("/v1/jobs", &team.member, &other_model).await;
    let mut paths = refused.problem(422);
    paths.sort();
    assert_eq!(paths, ["init_from.checkpoint", "priority"], "{}", refused.text);
    assert!(refused.text.contains("would not load"), "{}", refused.text);
    // another team's checkpoint is no checkpoint
    let beta = app.team("beta").await;
    let mut foreign = spec("foreign");
    foreign["init_from"] = json!({"checkpoint": checkpoint});
    assert_eq!(app.post("/v1/jobs", &beta.member, &foreign).await.problem(422), ["init_from.checkpoint"]);
    // an unknown id, and a field the fork does not have
    let mut unknown = spec("unknown");
    unknown["init_from"] = json!({"checkpoint": uuid::Uuid::new_v4().to_string(), "epoch": 1});
    let mut paths = app.post("/v1/jobs", &team.member, &unknown).await.problem(422);
    paths.sort();
    assert_eq!(paths, ["init_from.checkpoint", "init_from.epoch"], "the unknown field and the unknown id at once");

    // the placed job trains mlp [32] on synthetic data, as `spec` does
    let mut fork = spec("fork");
    fork["workers"] = json!(1);
    fork["init_from"] = json!({"checkpoint": checkpoint});
    let forked = app.post("/v1/jobs", &team.member, &fork).await;
    assert_eq!(forked.status, 201, "{}", forked.text);
    assert_eq!(forked.body["spec"]["init_from"]["checkpoint"], checkpoint.as_str());
    let fork_id = forked.body["id"].as_str().unwrap();
    let pinned = app.dir.path().join("checkpoints").join(fork_id).join("init.tar");
    // the source's artifacts go (it must have ended first); the fork keeps its starting point
    app.post(&format!("/v1/jobs/{source}/cancel"), &team.member, &json!({})).await;
    let deleted = app.call(Method::DELETE, &format!("/v1/jobs/{source}/artifacts"), Some(&team.member), None).await;
    assert_eq!(deleted.status, 200, "{}", deleted.text);
    assert_eq!(std::fs::read(&pinned).unwrap(), vec![7u8; 1234], "pinned at {}", pinned.display());
    // no agent may fetch it before the fork is placed on its node
    app.get(&format!("/v1/agent/jobs/{fork_id}/init"), &agent).await.problem(404);
}

/// Tags and a note are set with PATCH (each field given replaces the stored one), checked field by field, and
/// find runs in the history: by tag (whole tags only) and by words of the name or note (case ignored).
async fn tags_and_notes_find_runs(app: TestApp) {
    let team = app.team("alpha").await;
    let first = app.submit(&team.member, &spec("warmup-sweep-1")).await;
    let second = app.submit(&team.member, &spec("warmup-sweep-2")).await;
    let job = |id: &str| format!("/v1/jobs/{id}");
    let tagged = app
        .patch(
            &job(&first),
            &team.member,
            &json!({"tags": ["baseline", "kn=256", "baseline"], "note": "The Reference run\nof the sweep"}),
        )
        .await;
    assert_eq!(tagged.status, 200, "{}", tagged.text);
    assert_eq!(tagged.body["tags"], json!(["baseline", "kn=256"]), "a repeated tag is kept once");
    assert_eq!(app.patch(&job(&second), &team.member, &json!({"tags": ["baseline-2"]})).await.status, 200);
    // a field left out stays as it was
    let noted =
        app.patch(&job(&first), &team.member, &json!({"note": "the reference run of the sweep, checked"})).await;
    assert_eq!(noted.body["tags"], json!(["baseline", "kn=256"]));
    // every problem at once, with its path; nothing stored
    let bad = app
        .patch(&job(&first), &team.member, &json!({"tags": ["fine", "has space", "x".repeat(41)], "note": "bell\u{7}"}))
        .await;
    assert_eq!(bad.problem(422), ["tags[1]", "tags[2]", "note"]);
    assert_eq!(app.get(&format!("/v1/jobs/{first}"), &team.viewer).await.body["tags"], json!(["baseline", "kn=256"]));
    // a viewer may not write, another team does not see the job
    app.patch(&job(&first), &team.viewer, &json!({"note": "x"})).await.problem(403);
    let other = app.team("beta").await;
    app.patch(&job(&first), &other.member, &json!({"note": "x"})).await.problem(404);
    // the history by tag (a whole tag: `baseline` is not `baseline-2`), and by words
    let names = |reply: &common::Reply| -> Vec<String> {
        reply.body["jobs"].as_array().unwrap().iter().map(|j| j["name"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(names(&app.get("/v1/jobs?tag=baseline", &team.viewer).await), ["warmup-sweep-1"]);
    assert_eq!(names(&app.get("/v1/jobs?tag=baseline-2", &team.viewer).await), ["warmup-sweep-2"]);
    assert_eq!(names(&app.get("/v1/jobs?q=REFERENCE%20RUN", &team.viewer).await), ["warmup-sweep-1"]);
    assert_eq!(names(&app.get("/v1/jobs?q=sweep", &team.viewer).await), ["warmup-sweep-2", "warmup-sweep-1"]);
    // LIKE's wildcards in the text match only themselves (Postgres searches with LIKE through an index)
    assert!(names(&app.get("/v1/jobs?q=warmup_sweep", &team.viewer).await).is_empty());
    assert!(names(&app.get("/v1/jobs?q=ref%25run", &team.viewer).await).is_empty());
    assert_eq!(names(&app.get("/v1/jobs?q=sweep-1", &team.viewer).await), ["warmup-sweep-1"]);
    assert!(names(&app.get("/v1/jobs?tag=baseline", &other.viewer).await).is_empty());
}

ringtrain_store::on_both_backends!(
    setup = crate::common::TestApp::new;
    submit_returns_job_effective_lr_and_links,
    invalid_specs_name_every_field,
    malformed_requests_are_problems,
    auth_is_required_and_roles_hold,
    other_teams_jobs_are_not_found,
    run_history_pages_newest_first_with_filters,
    cancel_records_events_and_stream_ends,
    event_stream_follows_until_the_job_ends,
    idempotency_key_replays_or_conflicts,
    schedule_preview_compares_world_sizes,
    ended_jobs_resume,
    forks_start_from_a_checkpoint_of_the_team,
    tags_and_notes_find_runs,
);
