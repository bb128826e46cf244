//! The scheduler loop's passes against the real store and routes: placement and the long poll, rank 0's
//! rendezvous address, lost nodes and restarts, reclaim with preemption, and checkpoint archives.

mod common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use common::{spec, TestApp};
use ringtrain_scheduler::{LoopConfig, PassReport};
use serde_json::{json, Value};
use tower::ServiceExt;

fn cpus(n: usize) -> Value {
    json!((0..n).map(|i| json!({"index": i, "kind": "cpu", "name": format!("cpu{i}")})).collect::<Vec<_>>())
}

async fn register(app: &TestApp, agent: &str, name: &str, slots: usize) -> String {
    let node = app
        .post("/v1/agent/nodes", agent, &json!({"name": name, "address": "127.0.0.1", "devices": cpus(slots)}))
        .await;
    assert_eq!(node.status, 200, "{}", node.text);
    node.body["id"].as_str().unwrap().to_string()
}

fn config() -> LoopConfig {
    LoopConfig { owner: "test-scheduler".into(), ..LoopConfig::default() }
}

async fn run_pass(app: &TestApp, config: &LoopConfig) -> PassReport {
    app.state.scheduler(config.clone()).pass().await.expect("a pass")
}

async fn job(app: &TestApp, token: &str, id: &str) -> Value {
    app.get(&format!("/v1/jobs/{id}"), token).await.body
}

async fn a_pass_places_jobs_and_the_long_poll_delivers_them_with_the_rendezvous(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let node = register(&app, &agent, "n1", 2).await;
    let poll_uri = format!("/v1/agent/nodes/{node}/assignments");
    let id = app.submit(&team.member, &spec("placed")).await;
    let first = app.get(&poll_uri, &agent).await;
    assert_eq!(first.body["work"], json!([]), "queued, not placed yet");
    let version = first.body["version"].as_u64().unwrap();

    // A long poll waits for a change: the pass that places the job.
    let waiting = {
        let router = app.router.clone();
        let uri = format!("{poll_uri}?since={version}&wait_s=10");
        let agent = agent.clone();
        tokio::spawn(async move {
            use tower::ServiceExt;
            let request = axum::http::Request::builder()
                .uri(uri)
                .header("authorization", format!("Bearer {agent}"))
                .body(axum::body::Body::empty())
                .unwrap();
            let response = router.oneshot(request).await.unwrap();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
            serde_json::from_slice::<Value>(&bytes).unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "the poll waits while nothing changes");
    let report = run_pass(&app, &config()).await;
    assert!(report.leader);
    assert_eq!(report.started, 1, "{report:?}");
    app.state.changed().await;
    let woke = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("the poll answered").unwrap();
    let work = woke["work"].as_array().unwrap();
    assert_eq!(work.len(), 2, "{woke}");
    assert!(work.iter().all(|w| w["rendezvous"].is_null()), "rank 0 has not reported its address yet");
    assert_eq!(job(&app, &team.viewer, &id).await["state"], "scheduled");
    assert_eq!(job(&app, &team.viewer, &id).await["attempt"], 1);

    let rank = |r: i64| {
        work.iter().find(|w| w["assignment"]["rank"] == r).unwrap()["assignment"]["id"].as_str().unwrap().to_string()
    };
    let endpoint = |a: &str| format!("/v1/agent/assignments/{a}/endpoint");
    let paths = app.post(&endpoint(&rank(0)), &agent, &json!({"address": "no port"})).await.problem(422);
    assert_eq!(paths, vec!["address"]);
    app.post(&endpoint(&rank(1)), &agent, &json!({"address": "127.0.0.1:4000"})).await.problem(422);
    let set = app.post(&endpoint(&rank(0)), &agent, &json!({"address": "127.0.0.1:4000"})).await;
    assert_eq!(set.status, 200, "{}", set.text);
    let again = app.get(&poll_uri, &agent).await;
    let rendezvous: Vec<&Value> = again.body["work"].as_array().unwrap().iter().map(|w| &w["rendezvous"]).collect();
    assert_eq!(rendezvous, vec![&json!("127.0.0.1:4000"), &json!("127.0.0.1:4000")]);

    // Nothing else to do: a second pass changes nothing.
    let idle = run_pass(&app, &config()).await;
    assert_eq!((idle.started, idle.preempted, idle.failed_placements), (0, 0, 0));
}

async fn a_lost_node_fails_its_placements_which_restart_elsewhere(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let lost = register(&app, &agent, "lost", 2).await;
    let id = app.submit(&team.member, &spec("survivor")).await;
    assert_eq!(run_pass(&app, &config()).await.started, 1);
    app.get(&format!("/v1/agent/nodes/{lost}/assignments"), &agent).await; // delivered

    // A second node (its own agent) comes up; the first stops heartbeating.
    let second = app.agent_token().await;
    let other = register(&app, &second, "other", 2).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    app.post(&format!("/v1/agent/nodes/{other}/heartbeat"), &second, &json!({})).await;
    let strict = LoopConfig { node_timeout: Duration::from_secs(1), ..config() };
    let report = run_pass(&app, &strict).await;
    assert_eq!(report.lost_nodes, 1, "{report:?}");
    assert_eq!(report.failed_placements, 1);
    assert_eq!(report.started, 1, "restarted on the other node in the same pass: {report:?}");
    let restarted = job(&app, &team.viewer, &id).await;
    assert_eq!((restarted["state"].as_str(), restarted["attempt"].as_i64()), (Some("scheduled"), Some(2)));
    let events = app.get(&format!("/v1/jobs/{id}/events"), &team.viewer).await.body.to_string();
    assert!(events.contains("node lost was lost (no heartbeat for 1 s)"), "{events}");
    let on_other = app.get(&format!("/v1/agent/nodes/{other}/assignments"), &second).await;
    assert_eq!(on_other.body["work"].as_array().unwrap().len(), 2);
}

async fn a_team_below_its_guarantee_reclaims_and_the_victim_keeps_its_attempt(app: TestApp) {
    let agent = app.agent_token().await;
    let node = register(&app, &agent, "n1", 2).await;
    let mut teams = Vec::new();
    for name in ["a", "b"] {
        let created =
            app.post("/v1/teams", common::ADMIN, &json!({"name": name, "gpu_quota": 0, "cpu_quota": 1})).await;
        let team_id = created.body["id"].as_str().unwrap().to_string();
        let token = app.post(&format!("/v1/teams/{team_id}/tokens"), common::ADMIN, &json!({"role": "member"})).await;
        teams.push(token.body["token"].as_str().unwrap().to_string());
    }
    let borrower = app.submit(&teams[0], &spec("borrower")).await; // k = 2: one device borrowed
    assert_eq!(run_pass(&app, &config()).await.started, 1);
    let poll_uri = format!("/v1/agent/nodes/{node}/assignments");
    let delivered = app.get(&poll_uri, &agent).await.body;

    let mut small = spec("claimer");
    small["workers"] = json!(1);
    let claimer = app.submit(&teams[1], &small).await;
    // Thrash protection: the borrower has not run the minimum time before a preemption (5 min by default),
    // so the reclaim waits, and says so.
    let protected = run_pass(&app, &config()).await;
    assert_eq!((protected.preempted, protected.started), (0, 0), "{protected:?}");
    let waits = job(&app, &teams[1], &claimer).await;
    assert_eq!(waits["pending_reason"]["code"], "reclaim_after_min_run_time", "{waits}");
    // the borrower is another team's job: counted, not named (N-L1)
    assert_eq!(waits["pending_reason"]["protected_jobs"], json!([null]), "{waits}");
    assert!(!waits.to_string().contains(&borrower), "{waits}");
    // Once it has (here: a loop whose minimum is zero), the reclaim preempts it.
    let view = ringtrain_scheduler::ViewConfig { min_run_before_preemption: Duration::ZERO, ..Default::default() };
    let no_minimum = || LoopConfig { view, ..config() };
    let report = run_pass(&app, &no_minimum()).await;
    assert_eq!((report.preempted, report.started), (1, 0), "{report:?}");
    let victim = job(&app, &teams[0], &borrower).await;
    assert_eq!((victim["state"].as_str(), victim["preemptions"].as_i64()), (Some("queued"), Some(1)));
    // Its ranks still hold the devices until the agent stops them: nothing starts yet, no second victim.
    let waiting = run_pass(&app, &no_minimum()).await;
    assert_eq!((waiting.preempted, waiting.started), (0, 0), "{waiting:?}");
    let stop = app.get(&poll_uri, &agent).await.body;
    assert_eq!(stop["preempt"].as_array().unwrap().len(), 2, "checkpoint, then stop: {stop}");
    assert_eq!(stop["stop"], json!([]));
    for w in delivered["work"].as_array().unwrap() {
        let id = w["assignment"]["id"].as_str().unwrap();
        let ended = app
            .post(
                &format!("/v1/agent/assignments/{id}/state"),
                &agent,
                &json!({"from": "delivered", "to": "cancelled"}),
            )
            .await;
        assert_eq!(ended.status, 200, "{}", ended.text);
    }
    assert_eq!(run_pass(&app, &no_minimum()).await.started, 1);
    assert_eq!(job(&app, &teams[1], &claimer).await["state"], "scheduled");
    // The victim waits (one device left, it needs two); when placed again its attempt is still 1.
    assert_eq!(job(&app, &teams[0], &borrower).await["attempt"], 0);
}

async fn checkpoint_archives_go_up_and_come_back(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let node = register(&app, &agent, "n1", 2).await;
    let id = app.submit(&team.member, &spec("ckpt")).await;
    run_pass(&app, &config()).await;
    app.get(&format!("/v1/agent/nodes/{node}/assignments"), &agent).await;

    let archive: Vec<u8> = (0..100_000u32).flat_map(|i| i.to_le_bytes()).collect();
    let uri = |name: &str, attempt: i32| {
        format!("/v1/agent/jobs/{id}/checkpoints/{name}?attempt={attempt}&epoch=1&iteration=16")
    };
    app.send_bytes(Method::PUT, &uri("latest", 1), &agent, archive.clone()).await.problem(422);
    app.send_bytes(Method::PUT, &uri("epoch-0001", 9), &agent, archive.clone()).await.problem(404);
    let stored = app.send_bytes(Method::PUT, &uri("epoch-0001", 1), &agent, archive.clone()).await;
    assert_eq!(stored.status, 201, "{}", stored.text);
    assert_eq!(stored.body["size_bytes"], archive.len());
    let checkpoint = stored.body["id"].as_str().unwrap();

    // The resume point of the next placement, and the bytes back, for the agent and for the team.
    let poll = app.get(&format!("/v1/agent/nodes/{node}/assignments"), &agent).await.body;
    let rank0 = poll["work"].as_array().unwrap().iter().find(|w| w["assignment"]["rank"] == 0).unwrap();
    assert_eq!(rank0["resume"]["id"], checkpoint);
    let (status, bytes) = app.get_bytes(&format!("/v1/agent/jobs/{id}/checkpoints/{checkpoint}/archive"), &agent).await;
    assert_eq!((status, bytes.len()), (StatusCode::OK, archive.len()));
    assert!(bytes == archive);
    let (status, bytes) = app.get_bytes(&format!("/v1/jobs/{id}/checkpoints/{checkpoint}/archive"), &team.viewer).await;
    assert_eq!(status, StatusCode::OK);
    assert!(bytes == archive);
    // as a browser asks for it: gzip-compressed, read to its end (the compression layer polls the file's
    // stream once more after its end, which must not panic)
    let request = Request::builder()
        .uri(format!("/v1/jobs/{id}/checkpoints/{checkpoint}/archive"))
        .header(header::AUTHORIZATION, format!("Bearer {}", team.viewer))
        .header(header::ACCEPT_ENCODING, "gzip")
        .body(Body::empty())
        .unwrap();
    let response = app.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.headers()[header::CONTENT_ENCODING], "gzip");
    let compressed = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&compressed[..]), &mut bytes).unwrap();
    assert!(bytes == archive);
    let stranger = app.team("beta").await;
    let (status, _) = app.get_bytes(&format!("/v1/jobs/{id}/checkpoints/{checkpoint}/archive"), &stranger.viewer).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

ringtrain_store::on_both_backends!(
    setup = crate::common::TestApp::new;
    a_pass_places_jobs_and_the_long_poll_delivers_them_with_the_rendezvous,
    a_lost_node_fails_its_placements_which_restart_elsewhere,
    a_team_below_its_guarantee_reclaims_and_the_victim_keeps_its_attempt,
    checkpoint_archives_go_up_and_come_back,
);
