//! Studies and the reference guard through the real router, on Postgres and on SQLite: one job per point
//! in one transaction, the table, the plot, dry runs, cancel, every bad request named, other teams kept
//! out, `devices` fitted to the pool; and a run stopped when its reported epochs fall off its reference's.

mod common;

use common::{spec, TestApp, ADMIN};
use ringtrain_core::{DeviceId, JobId, JobState, NodeId};
use serde_json::{json, Value};

fn study(points: Value) -> Value {
    json!({"name": "sweep", "base": spec("base"), "points": points})
}

async fn a_study_makes_one_job_per_point_and_a_table(app: TestApp) {
    let team = app.team("alpha").await;
    let request = json!({"name": "sweep", "base": spec("base"),
        "axes": {"workers": [2, 1], "lr.warmup.kind": ["gradual", "constant"]}});
    let created = app.post("/v1/studies", &team.member, &request).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.body["id"].as_str().unwrap();
    assert_eq!(created.headers["location"], format!("/v1/studies/{id}"));
    let points = created.body["points"].as_array().unwrap();
    let labels: Vec<&str> = points.iter().map(|p| p["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "lr.warmup.kind=gradual workers=2",
            "lr.warmup.kind=gradual workers=1",
            "lr.warmup.kind=constant workers=2",
            "lr.warmup.kind=constant workers=1"
        ]
    );
    // the reference is the smallest global batch, the first of them
    assert_eq!(created.body["reference_point"], 1);
    assert_eq!(points[1]["is_reference"], true);
    assert_eq!(created.body["states"], json!({"queued": 4}));
    assert_eq!(points[0]["global_batch"], 32);
    assert_eq!(points[3]["warmup"], "constant");

    // every point is an ordinary job of the team that names its study and point
    let jobs = app.get("/v1/jobs?name_prefix=sweep", &team.viewer).await;
    let jobs = jobs.body["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 4);
    let first = jobs.iter().find(|j| j["study"]["point"] == 0).unwrap();
    assert_eq!(first["study"]["id"], id);
    assert_eq!(first["name"], "sweep #0: lr.warmup.kind=gradual workers=2");
    assert_eq!((first["workers"].as_i64(), first["devices"].as_i64()), (Some(2), Some(2)));

    let got = app.get(&format!("/v1/studies/{id}"), &team.viewer).await;
    assert_eq!(got.status, 200, "{}", got.text);
    assert_eq!(got.body["definition"]["axes"]["workers"], json!([2, 1]));
    let listed = app.get("/v1/studies", &team.viewer).await;
    assert_eq!(listed.body["studies"][0]["id"], id);
    assert_eq!(listed.body["studies"][0]["points"], 4);
    let (status, svg) = app.get_bytes(&format!("/v1/studies/{id}/plot.svg"), &team.viewer).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8(svg).unwrap().starts_with("<svg"));

    // cancel ends every point; a viewer may not
    app.post(&format!("/v1/studies/{id}/cancel"), &team.viewer, &json!({})).await.problem(403);
    let cancelled = app.post(&format!("/v1/studies/{id}/cancel"), &team.member, &json!({})).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.text);
    assert_eq!(cancelled.body["states"], json!({"cancelled": 4}));
}

async fn a_dry_run_plans_every_point_and_stores_nothing(app: TestApp) {
    let team = app.team("alpha").await;
    let request = json!({"template": "goyal"});
    let planned = app.post("/v1/studies?dry_run=true", &team.member, &request).await;
    assert_eq!(planned.status, 200, "{}", planned.text);
    assert_eq!(planned.body["dry_run"], true);
    let points = planned.body["points"].as_array().unwrap();
    assert_eq!(points.len(), 10);
    assert_eq!(points[0]["is_reference"], true);
    // kn = 1024 on Fashion-MNIST's 60,000: 58 iterations per epoch, lr 0.1 * 32
    let kn1024 = &points[4]["schedule"]["effective"];
    assert_eq!(kn1024["global_batch"], 1024);
    assert_eq!(kn1024["iterations_per_epoch"], 58);
    assert!((kn1024["scaled_lr"].as_f64().unwrap() - 3.2).abs() < 1e-12);
    assert_eq!(points[4]["spec"]["devices"], 2);
    assert_eq!(app.get("/v1/studies", &team.viewer).await.body["studies"], json!([]));
    assert_eq!(app.get("/v1/jobs", &team.viewer).await.body["jobs"], json!([]));
}

async fn bad_study_requests_name_the_field(app: TestApp) {
    let team = app.team("alpha").await;
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (json!({"points": [{}]}), vec!["base"]),
        (json!({"base": spec("b"), "axes": {"workers": [1]}, "points": [{}]}), vec!["points"]),
        (json!({"base": spec("b")}), vec!["axes"]),
        (json!({"base": spec("b"), "axes": {"workers": []}}), vec!["axes.workers"]),
        (study(json!([{"workers": 1}, {"workers": 0, "lr.base": -1}])), vec!["points[1].lr.base", "points[1].workers"]),
        (study(json!([{"workers": 4, "devices": 3}])), vec!["points[0].devices"]),
        (study(json!([{"model.name.x": 1}])), vec!["points[0]"]),
        (
            study(json!([{}]))
                .as_object()
                .cloned()
                .map(|mut s| {
                    s.insert("reference".into(), json!(2));
                    Value::Object(s)
                })
                .unwrap(),
            vec!["reference"],
        ),
        (json!({"template": "nope"}), vec!["template"]),
        (json!({"template": "goyal", "points": [{}]}), vec!["template"]),
        (json!({"base": spec("b"), "points": [{}], "extra": 1}), vec!["extra"]),
        (json!({"base": spec("b"), "points": "all"}), vec!["points"]),
        // a rung must fall before every searched point's end; the reference (workers 1) is not searched
        (
            json!({"base": spec("b"), "points": [{"workers": 1}, {"workers": 2}],
                   "search": {"kind": "asha", "rungs": [1, 4]}}),
            vec!["search.rungs[1]"],
        ),
        (json!({"base": spec("b"), "points": [{}], "search": {"kind": "grid", "rungs": [1]}}), vec!["search.kind"]),
        (json!({"base": spec("b"), "points": [{}], "target_workers": 4}), vec!["target_workers"]),
        (json!({"template": "scale_search", "base": spec("b"), "target_workers": 2}), vec!["target_workers"]),
        (json!({"template": "scale_search", "base": spec("b"), "target_workers": 8, "devices": 3}), vec!["devices"]),
    ];
    for (request, mut expected) in cases {
        let reply = app.post("/v1/studies", &team.member, &request).await;
        let mut paths = reply.problem(422);
        paths.sort();
        expected.sort();
        assert_eq!(paths, expected, "{request}: {}", reply.text);
    }
    // a viewer may not create one; nothing was stored by any of the above
    app.post("/v1/studies", &team.viewer, &study(json!([{}]))).await.problem(403);
    assert_eq!(app.get("/v1/studies", &team.viewer).await.body["studies"], json!([]));
    assert_eq!(app.get("/v1/jobs", &team.viewer).await.body["jobs"], json!([]));
    // a job's reference must be a job of its team
    let mut guarded = spec("g");
    guarded["guard"] = json!({"reference_job": JobId::new().to_string()});
    assert_eq!(app.post("/v1/jobs", &team.member, &guarded).await.problem(422), vec!["guard.reference_job"]);
    // and a spec's devices must divide its workers
    let mut uneven = spec("u");
    uneven["workers"] = json!(4);
    uneven["devices"] = json!(3);
    assert_eq!(app.post("/v1/jobs", &team.member, &uneven).await.problem(422), vec!["devices"]);
}

async fn other_teams_studies_are_not_found(app: TestApp) {
    let alpha = app.team("alpha").await;
    let beta = app.team("beta").await;
    let created = app.post("/v1/studies", &alpha.member, &study(json!([{}]))).await;
    let id = created.body["id"].as_str().unwrap();
    for path in [format!("/v1/studies/{id}"), format!("/v1/studies/{id}/plot.svg")] {
        app.get(&path, &beta.viewer).await.problem(404);
    }
    app.post(&format!("/v1/studies/{id}/cancel"), &beta.member, &json!({})).await.problem(404);
    assert_eq!(app.get("/v1/studies", &beta.viewer).await.body["studies"], json!([]));
    // nor can a job of another team be a reference
    let job = created.body["points"][0]["job_id"].as_str().unwrap();
    let mut guarded = spec("g");
    guarded["guard"] = json!({"reference_job": job});
    assert_eq!(app.post("/v1/jobs", &beta.member, &guarded).await.problem(422), vec!["guard.reference_job"]);
}

/// A node offering `n` CPU slots: its id and devices.
async fn node(app: &TestApp, agent: &str, n: u32) -> (NodeId, Vec<DeviceId>) {
    let devices: Vec<Value> = (0..n).map(|i| json!({"index": i, "kind": "cpu", "name": format!("cpu {i}")})).collect();
    let reply =
        app.post("/v1/agent/nodes", agent, &json!({"name": "n", "address": "127.0.0.1", "devices": devices})).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let ids = reply.body["devices"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap().parse().unwrap());
    (reply.body["id"].as_str().unwrap().parse().unwrap(), ids.collect())
}

async fn points_get_the_devices_that_fit_the_pool(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    node(&app, &agent, 2).await;
    let mut base = spec("b");
    base["dataset"] = json!("synthetic:4096");
    let request = json!({"base": base, "points": [{"workers": 1}, {"workers": 8}, {"workers": 6, "devices": 1}]});
    let created = app.post("/v1/studies", &team.member, &request).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let devices: Vec<i64> =
        created.body["points"].as_array().unwrap().iter().map(|p| p["devices"].as_i64().unwrap()).collect();
    // 8 workers on a pool of 2: 2 devices of 4 virtual ranks each; an explicit choice is kept
    assert_eq!(devices, [1, 2, 1]);
    assert_eq!(created.body["points"][1]["workers"], 8);
}

/// Places `job` on `devices` and reports it running; its attempt.
async fn run(app: &TestApp, agent: &str, job: &str, node: NodeId, devices: &[DeviceId]) -> i32 {
    let ranks: Vec<ringtrain_store::NewAssignment> = devices
        .iter()
        .enumerate()
        .map(|(rank, &device_id)| ringtrain_store::NewAssignment { node_id: node, device_id, rank: rank as i32 })
        .collect();
    let lease = std::time::Duration::from_secs(60);
    let (placed, _) = app.store.start_job(JobId(job.parse().unwrap()), "s", lease, &ranks).await.unwrap().unwrap();
    let running = app.post(&format!("/v1/agent/jobs/{job}/running"), agent, &json!({"attempt": placed.attempt})).await;
    assert_eq!(running.status, 200, "{}", running.text);
    placed.attempt
}

async fn report_epoch(app: &TestApp, agent: &str, job: &str, attempt: i32, epoch: i64, train_error: f64) {
    let report = json!({"kind": "epoch", "rank": 0, "epoch": epoch, "iteration": (epoch + 1) * 16 - 1,
        "train_error": train_error, "test_error": train_error, "test_loss": 1.0, "seconds": 30.0});
    let sent = app
        .post(&format!("/v1/agent/jobs/{job}/metrics"), agent, &json!({"attempt": attempt, "reports": [report]}))
        .await;
    assert_eq!(sent.status, 200, "{}", sent.text);
}

async fn a_run_that_falls_off_its_reference_stops_whichever_reports_first(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let (node_id, devices) = node(&app, &agent, 4).await;
    let one_worker = |name: &str| {
        let mut s = spec(name);
        // kn = 32 = the reference batch: 16 iterations per epoch, and the warmup (1 epoch) is not skipped
        s["workers"] = json!(1);
        s["per_worker_batch"] = json!(32);
        s["epochs"] = json!(4);
        s
    };
    let reference = app.submit(&team.member, &one_worker("reference")).await;
    let mut follower_spec = one_worker("follower");
    follower_spec["guard"] = json!({"reference_job": reference, "tolerance": 0.05});
    let follower = app.submit(&team.member, &follower_spec).await;
    let ref_attempt = run(&app, &agent, &reference, node_id, &devices[..1]).await;
    let attempt = run(&app, &agent, &follower, node_id, &devices[1..2]).await;

    // epoch 0 lies in the warmup: not compared, however far behind
    report_epoch(&app, &agent, &reference, ref_attempt, 0, 0.50).await;
    report_epoch(&app, &agent, &follower, attempt, 0, 0.90).await;
    // within the tolerance at epoch 1
    report_epoch(&app, &agent, &reference, ref_attempt, 1, 0.30).await;
    report_epoch(&app, &agent, &follower, attempt, 1, 0.34).await;
    // the follower reports epoch 2 before its reference: nothing to compare yet...
    report_epoch(&app, &agent, &follower, attempt, 2, 0.40).await;
    assert_eq!(app.get(&format!("/v1/jobs/{follower}"), &team.viewer).await.body["state"], "running");
    // ...until the reference reaches it
    report_epoch(&app, &agent, &reference, ref_attempt, 2, 0.25).await;
    let stopped = app.get(&format!("/v1/jobs/{follower}"), &team.viewer).await;
    assert_eq!(stopped.body["state"], "failed", "{}", stopped.text);
    let error = stopped.body["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("fell off its reference job {reference}: train error 0.40 at epoch 3 vs 0.25")),
        "{error}"
    );
    assert!(error.contains("device-hours"), "{error}");
    // not retried, and the reference runs on
    assert_eq!(stopped.body["attempt"], 1);
    assert_eq!(app.get(&format!("/v1/jobs/{reference}"), &team.viewer).await.body["state"], "running");
}

/// A study of a reference and three lr points under successive halving (rungs [1], η = 3), every point
/// placed on a device of its own and running: the study's id, its jobs and their attempts.
async fn running_search(app: &TestApp, member: &str, agent: &str) -> (String, Vec<String>, Vec<i32>) {
    let (node_id, devices) = node(app, agent, 4).await;
    let mut base = spec("b");
    base["workers"] = json!(1);
    base["per_worker_batch"] = json!(32);
    let request = json!({"name": "halving", "base": base, "reference": 0,
        "points": [{}, {"lr.base": 0.05}, {"lr.base": 0.2}, {"lr.base": 0.4}],
        "search": {"kind": "asha", "rungs": [1], "reduction": 3}});
    let created = app.post("/v1/studies", member, &request).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.body["id"].as_str().unwrap().to_string();
    let jobs: Vec<String> =
        created.body["points"].as_array().unwrap().iter().map(|p| p["job_id"].as_str().unwrap().into()).collect();
    let mut attempts = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        attempts.push(run(app, agent, job, node_id, &devices[i..i + 1]).await);
    }
    (id, jobs, attempts)
}

async fn job_state(app: &TestApp, viewer: &str, job: &str) -> String {
    app.get(&format!("/v1/jobs/{job}"), viewer).await.body["state"].as_str().unwrap().to_string()
}

/// Successive halving through the real router: points judged as their epochs are reported, a point stopped
/// for want of rivals, then resumed when a later result proves it best; the study's view says where each
/// stands.
async fn a_search_stops_points_at_rungs_and_resumes_the_one_a_later_result_promotes(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let (id, jobs, attempts) = running_search(&app, &team.member, &agent).await;
    let state = |i: usize| job_state(&app, &team.viewer, &jobs[i]);
    // the reference is not searched: its figures stop nothing
    report_epoch(&app, &agent, &jobs[0], attempts[0], 0, 0.9).await;
    assert_eq!(state(0).await, "running");
    // point 1 alone at the rung: ⌊1/3⌋ = 0 go on, and the others may still come
    report_epoch(&app, &agent, &jobs[1], attempts[1], 0, 0.2).await;
    assert_eq!(state(1).await, "stopped");
    report_epoch(&app, &agent, &jobs[2], attempts[2], 0, 0.5).await;
    assert_eq!(state(2).await, "stopped");
    // the third makes ⌊3/3⌋ = 1 place: point 1's, which resumes; point 3 is stopped
    report_epoch(&app, &agent, &jobs[3], attempts[3], 0, 0.6).await;
    assert_eq!([state(1).await, state(2).await, state(3).await], ["queued", "stopped", "stopped"]);
    let events = app.get(&format!("/v1/jobs/{}/events", jobs[1]), &team.viewer).await;
    let reasons: Vec<&str> =
        events.body["events"].as_array().unwrap().iter().filter_map(|e| e["reason"].as_str()).collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("stopped: search: not among the best 1/3 at rung 1 (1 epochs): test_error 0.2000")),
        "{reasons:?}"
    );
    assert!(reasons.iter().any(|r| r.starts_with("search: promoted")), "{reasons:?}");

    let view = app.get(&format!("/v1/studies/{id}"), &team.viewer).await;
    let points = view.body["points"].as_array().unwrap();
    let standing: Vec<&str> = points.iter().map(|p| p["search"].as_str().unwrap()).collect();
    assert_eq!(
        standing,
        [
            "the reference: trains to the end",
            "promoted past every rung (1)",
            "stopped at rung 1 (1 epochs)",
            "stopped at rung 1 (1 epochs)"
        ]
    );
    let search = &view.body["search"];
    assert_eq!((search["done"].as_bool(), search["best_point"].as_i64()), (Some(false), Some(1)), "{search}");
    assert_eq!(search["best_spec"]["lr"]["base"], 0.05, "{search}");
}

/// A point that fails reports no rung, but it closes one: the best point stopped there for want of rivals
/// resumes, so the search still trains one point to the end (it used to wait for a report that never came).
async fn a_point_that_fails_closes_the_rung_and_the_best_stopped_point_resumes(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let (id, jobs, attempts) = running_search(&app, &team.member, &agent).await;
    let state = |i: usize| job_state(&app, &team.viewer, &jobs[i]);
    report_epoch(&app, &agent, &jobs[1], attempts[1], 0, 0.2).await;
    report_epoch(&app, &agent, &jobs[2], attempts[2], 0, 0.5).await;
    assert_eq!([state(1).await, state(2).await, state(3).await], ["stopped", "stopped", "running"]);
    let failed = json!({"attempt": attempts[3], "outcome": "failed", "error": "diverged", "retryable": false});
    let ended = app.post(&format!("/v1/agent/jobs/{}/result", jobs[3]), &agent, &failed).await;
    assert_eq!(ended.status, 200, "{}", ended.text);
    assert_eq!([state(1).await, state(2).await, state(3).await], ["queued", "stopped", "failed"]);
    let view = app.get(&format!("/v1/studies/{id}"), &team.viewer).await;
    let search = &view.body["search"];
    assert_eq!((search["done"].as_bool(), search["best_point"].as_i64()), (Some(false), Some(1)), "{search}");
}

/// A promotion whose stop lands after it (two points' reports judged at once): the point's job ends
/// `stopped` though the search promoted it, and the next judgement, whichever point reports, resumes it.
async fn a_promoted_point_whose_stop_landed_late_resumes_at_the_next_judgement(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let (_, jobs, attempts) = running_search(&app, &team.member, &agent).await;
    let state = |i: usize| job_state(&app, &team.viewer, &jobs[i]);
    for (point, error) in [(1, 0.2), (2, 0.5), (3, 0.6)] {
        report_epoch(&app, &agent, &jobs[point], attempts[point], 0, error).await;
    }
    assert_eq!(state(1).await, "queued", "promoted and resumed");
    // the stop of another judgement, decided before the promotion, lands now
    let late = ringtrain_store::Transition::new(
        JobId(jobs[1].parse().unwrap()),
        JobState::Queued,
        JobState::Stopped,
        "stopped: search: not among the best 1/3 at rung 1 (a judgement that lost the race)",
    );
    assert!(app.store.transition(&late).await.unwrap().is_some());
    assert_eq!(state(1).await, "stopped");
    // the reference's next epoch is judged: the memory does not change, and the promoted point resumes
    report_epoch(&app, &agent, &jobs[0], attempts[0], 0, 0.3).await;
    assert_eq!([state(1).await, state(2).await, state(3).await], ["queued", "stopped", "stopped"]);
}

/// A study's device-hour cap: more than the team's budget has left is refused, the dry run says both, and
/// once the points together held the cap, every point not ended is stopped.
async fn a_study_s_cap_is_held_to_the_budget_and_stops_its_points_when_reached(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let (node_id, devices) = node(&app, &agent, 2).await;
    let budget = json!({"budget": {"device_hours": 1.0, "period": "month"}});
    let changed =
        app.call(axum::http::Method::PATCH, &format!("/v1/teams/{}", team.id), Some(ADMIN), Some(&budget)).await;
    assert_eq!(changed.status, 200, "{}", changed.text);
    let request = |cap: f64| json!({"name": "capped", "base": spec("b"), "points": [{"workers": 1}, {"workers": 2}], "max_device_hours": cap});
    let refused = app.post("/v1/studies", &team.member, &request(2.0)).await;
    assert_eq!(refused.problem(422), vec!["max_device_hours"]);
    assert!(refused.text.contains("more than the team's budget has left this period"), "{}", refused.text);
    assert_eq!(app.post("/v1/studies", &team.member, &request(-1.0)).await.problem(422), vec!["max_device_hours"]);
    let dry = app.post("/v1/studies?dry_run=true", &team.member, &request(0.5)).await;
    assert_eq!(dry.body["max_device_hours"], 0.5, "{}", dry.text);
    assert!((dry.body["budget_left_device_hours"].as_f64().unwrap() - 1.0).abs() < 1e-6, "{}", dry.text);

    // a cap of 3.6 µs: reached at the first epoch report
    let created = app.post("/v1/studies", &team.member, &request(1e-9)).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.body["id"].as_str().unwrap().to_string();
    let jobs: Vec<String> =
        created.body["points"].as_array().unwrap().iter().map(|p| p["job_id"].as_str().unwrap().into()).collect();
    let attempt = run(&app, &agent, &jobs[0], node_id, &devices[..1]).await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    report_epoch(&app, &agent, &jobs[0], attempt, 0, 0.5).await;
    let view = app.get(&format!("/v1/studies/{id}"), &team.viewer).await.body;
    let states: Vec<&str> = view["points"].as_array().unwrap().iter().map(|p| p["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["stopped", "stopped"], "{view}");
    assert!(view["device_hours"].as_f64().unwrap() > 0.0 && view["max_device_hours"] == 1e-9, "{view}");
    let events = app.get(&format!("/v1/jobs/{}/events", jobs[1]), &team.viewer).await;
    let reasons: Vec<&str> =
        events.body["events"].as_array().unwrap().iter().filter_map(|e| e["reason"].as_str()).collect();
    assert!(
        reasons.iter().any(|r| r.starts_with("the study's cap of 0.000000001 device-hours is reached")),
        "{reasons:?}"
    );
}

/// A scale search that reuses a finished run as its reference (`reference_job`): refused while the run is not
/// finished, not the team's, or given with a base; then its spec is the base, it is point 0 without being
/// run again, the candidates are guarded against it, and its device-hours are not the study's.
async fn a_scale_search_reuses_a_finished_reference_instead_of_running_one(app: TestApp) {
    let team = app.team("alpha").await;
    let other = app.team("beta").await;
    let agent = app.agent_token().await;
    let (node_id, devices) = node(&app, &agent, 2).await;
    let mut small = spec("small");
    small["workers"] = json!(1);
    small["per_worker_batch"] = json!(32);
    let reference = app.submit(&team.member, &small).await;
    let theirs = app.submit(&other.member, &small).await;
    let search = |patch: Value| {
        let mut request = json!({"template": "scale_search", "reference_job": reference, "target_workers": 4,
            "devices": 1, "candidates": 2, "guard_points": true});
        request.as_object_mut().unwrap().extend(patch.as_object().unwrap().clone());
        request
    };
    let attempt = run(&app, &agent, &reference, node_id, &devices[..1]).await;
    let refused = app.post("/v1/studies", &team.member, &search(json!({}))).await;
    assert_eq!(refused.problem(422), vec!["reference_job"]);
    assert!(refused.text.contains("is running"), "{}", refused.text);
    for (patch, field) in [
        (json!({"reference_job": theirs}), "reference_job"),
        (json!({"reference_job": JobId::new().to_string()}), "reference_job"),
        (json!({"reference_job": "not-an-id"}), "reference_job"),
        (json!({"base": spec("b")}), "base"),
    ] {
        let request = search(patch);
        assert_eq!(app.post("/v1/studies", &team.member, &request).await.problem(422), vec![field], "{request}");
    }
    // only a scale search reuses a job
    let plain = json!({"base": spec("b"), "points": [{}], "reference_job": reference});
    assert_eq!(app.post("/v1/studies", &team.member, &plain).await.problem(422), vec!["reference_job"]);
    for epoch in 0..4 {
        report_epoch(&app, &agent, &reference, attempt, epoch, 0.5 - 0.1 * epoch as f64).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let done = app
        .post(
            &format!("/v1/agent/jobs/{reference}/result"),
            &agent,
            &json!({"attempt": attempt, "outcome": "succeeded"}),
        )
        .await;
    assert_eq!(done.status, 200, "{}", done.text);

    let created = app.post("/v1/studies", &team.member, &search(json!({}))).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let view = &created.body;
    let points = view["points"].as_array().unwrap();
    assert_eq!(points.len(), 3, "{view}");
    assert_eq!((points[0]["job_id"].as_str(), points[0]["reused"].as_bool()), (Some(reference.as_str()), Some(true)));
    assert_eq!((points[0]["is_reference"].as_bool(), points[0]["state"].as_str()), (Some(true), Some("succeeded")));
    assert_eq!(points[0]["search"], "the reference: a finished job, reused");
    assert!((points[0]["final_test_error"].as_f64().unwrap() - 0.2).abs() < 1e-9, "{view}");
    assert!(points[0]["device_seconds"].as_f64().unwrap() > 0.0, "{view}");
    // the candidates: the reused run's recipe at 4 workers, each lr a multiple of its lr, guarded against it
    let multipliers: Vec<f64> = points[1..].iter().map(|p| p["overrides"]["lr.multiplier"].as_f64().unwrap()).collect();
    assert_eq!(multipliers, [2.0, 4.0], "{view}");
    for point in &points[1..] {
        assert_eq!((point["reused"].as_bool(), point["workers"].as_i64()), (Some(false), Some(4)));
        let job = app.get(&format!("/v1/jobs/{}", point["job_id"].as_str().unwrap()), &team.viewer).await.body;
        assert_eq!(job["spec"]["guard"]["reference_job"], reference.as_str(), "{job}");
        assert_eq!(job["spec"]["per_worker_batch"], 32, "{job}");
    }
    // nothing of the reused run is the study's: no device-hours spent yet, and the grid is the candidates'
    assert_eq!(view["device_hours"], 0.0, "{view}");
    assert_eq!(view["search"]["device_hours"], 0.0, "{view}");
    assert_eq!(view["definition"]["reference_job"], reference.as_str(), "{view}");
    // one job submitted per candidate, none for the reference
    assert_eq!(app.get("/v1/jobs", &team.viewer).await.body["jobs"].as_array().unwrap().len(), 3);
    let listed = app.get("/v1/studies", &team.viewer).await.body;
    assert_eq!(listed["studies"][0]["points"], 3, "{listed}");
    // cancelling the study leaves the reused run as it ended
    let id = view["id"].as_str().unwrap();
    let cancelled = app.post(&format!("/v1/studies/{id}/cancel"), &team.member, &json!({})).await.body;
    let states: Vec<&str> =
        cancelled["points"].as_array().unwrap().iter().map(|p| p["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["succeeded", "cancelled", "cancelled"], "{cancelled}");
}

ringtrain_store::on_both_backends!(
    setup = crate::common::TestApp::new;
    a_study_makes_one_job_per_point_and_a_table,
    a_dry_run_plans_every_point_and_stores_nothing,
    bad_study_requests_name_the_field,
    other_teams_studies_are_not_found,
    points_get_the_devices_that_fit_the_pool,
    a_run_that_falls_off_its_reference_stops_whichever_reports_first,
    a_search_stops_points_at_rungs_and_resumes_the_one_a_later_result_promotes,
    a_point_that_fails_closes_the_rung_and_the_best_stopped_point_resumes,
    a_promoted_point_whose_stop_landed_late_resumes_at_the_next_judgement,
    a_study_s_cap_is_held_to_the_budget_and_stops_its_points_when_reached,
    a_scale_search_reuses_a_finished_reference_instead_of_running_one,
);
