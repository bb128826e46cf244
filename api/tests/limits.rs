//! Resource limits: no request does unbounded work, no team's queue hides another's.

mod common;

use std::time::Duration;

use common::TestApp;
use serde_json::{json, Value};

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
    let view = ringtrain_scheduler::ViewConfig { queue_window: 5, ..Default::default() };
    let config = ringtrain_scheduler::LoopConfig { owner: "test".into(), view, ..Default::default() };
    let pass = app.state.scheduler(config).pass().await.unwrap();
    assert_eq!(pass.started, 1, "{pass:?}");
    assert_eq!(app.get(&format!("/v1/jobs/{id}"), &b.member).await.body["state"], "scheduled");
}

/// A finished job's result of several megabytes (10,000 epoch records) is taken and the job succeeds:
/// before, anything over the 1 MiB body limit was refused, and the agent's job was re-run until it failed.
async fn a_long_jobs_large_result_is_taken(app: TestApp) {
    let team = app.team("alpha").await;
    let (id, agent, attempt) = common::placed_job(&app, &team, 4, Duration::from_secs(60), true).await;
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

/// Small limits, so that tests can reach them: 1 request/s per token after a burst of 20, two event
/// streams per token living 2 s, 100 iteration reports per second per job, and a safety-net poll of a
/// minute (so a stream that reacts at once was woken by the change notifier).
async fn strict(store: std::sync::Arc<dyn ringtrain_store::Store>) -> TestApp {
    TestApp::with_config(store, |config| {
        config.admission.rate_per_second = 1.0;
        config.admission.rate_burst = 20.0;
        config.admission.max_streams_per_token = 2;
        config.admission.max_stream_lifetime = Duration::from_secs(2);
        config.metric_rows_per_second = 100.0;
        config.event_poll = Duration::from_secs(60);
    })
    .await
}

/// A token over its rate is refused with 429 and a Retry-After, without slowing another token; an invented
/// HTTP method does not become a label of `/metrics`.
async fn a_token_over_its_rate_is_refused_and_others_are_not(app: TestApp) {
    let team = app.team("alpha").await;
    for _ in 0..20 {
        assert_eq!(app.get("/v1/jobs", &team.viewer).await.status, 200);
    }
    let limited = app.get("/v1/jobs", &team.viewer).await;
    limited.problem(429);
    assert_eq!(limited.body["type"], "urn:ringtrain:problem:rate-limited");
    let retry: u64 = limited.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "Retry-After: {retry}");
    // an unknown token is limited too, before any database lookup, and apart from the others
    for _ in 0..20 {
        assert_eq!(app.get("/v1/jobs", "rt_no_such_token").await.status, 401);
    }
    assert_eq!(app.get("/v1/jobs", "rt_no_such_token").await.status, 429);
    assert_eq!(app.get("/v1/jobs", &team.member).await.status, 200, "another token has its own budget");

    let invented = axum::http::Method::from_bytes(b"FROBNICATE").unwrap();
    app.call(invented, "/v1/jobs", None, None).await;
    let scraped = app.call(axum::http::Method::GET, "/metrics", None, None).await;
    assert!(!scraped.text.contains("FROBNICATE"), "{}", scraped.text);
    assert!(scraped.text.contains("method=\"OTHER\""), "{}", scraped.text);
    assert!(scraped.text.contains("status=\"429\""), "refusals are counted");
}

/// Opens an event stream of `job`; the response with its body not yet read.
async fn open_stream(app: &TestApp, job: &str, token: &str) -> axum::response::Response {
    use tower::ServiceExt;
    let request = axum::http::Request::builder()
        .uri(format!("/v1/jobs/{job}/events"))
        .header("authorization", format!("Bearer {token}"))
        .header("accept", "text/event-stream")
        .body(axum::body::Body::empty())
        .unwrap();
    app.router.clone().oneshot(request).await.unwrap()
}

/// Reads an event stream's text until `until` appears in it or the stream ends.
async fn read_stream(response: axum::response::Response, until: &str) -> String {
    use futures_util::StreamExt;
    let mut body = response.into_body().into_data_stream();
    let mut text = String::new();
    while let Some(Ok(chunk)) = body.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk));
        if text.contains(until) {
            break;
        }
    }
    text
}

/// A token holds at most two streams at once; a stream ends after its lifetime (the job still queued), and
/// a change wakes a stream at once, not at the next poll (a minute here).
async fn event_streams_are_bounded_and_woken_by_changes(app: TestApp) {
    let team = app.team("alpha").await;
    let job = app.submit(&team.member, &common::spec("queued")).await;
    let first = open_stream(&app, &job, &team.viewer).await;
    let second = open_stream(&app, &job, &team.viewer).await;
    assert_eq!((first.status().as_u16(), second.status().as_u16()), (200, 200));
    let third = open_stream(&app, &job, &team.viewer).await;
    assert_eq!(third.status(), 429);
    assert!(third.headers().contains_key("retry-after"));
    assert_eq!(open_stream(&app, &job, &team.member).await.status(), 200, "another token's streams are its own");

    // a queued job's stream ends with its lifetime, and frees its place
    let ended = tokio::time::timeout(Duration::from_secs(10), read_stream(first, "never")).await;
    assert!(ended.expect("the stream ends after its lifetime").contains("queued"));
    let replacement = open_stream(&app, &job, &team.viewer).await;
    assert_eq!(replacement.status(), 200);
    drop(second);

    // a cancel reaches a following stream at once (the safety-net poll is a minute away)
    let follower = tokio::spawn(read_stream(replacement, "cancelled"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    assert_eq!(app.post(&format!("/v1/jobs/{job}/cancel"), &team.member, &json!({})).await.status, 200);
    let text = tokio::time::timeout(Duration::from_secs(10), follower).await.expect("woken").unwrap();
    assert!(text.contains("cancelled"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(1), "woken after {:?}", started.elapsed());
}

/// Metric reports are bounded: no iteration past the job's end, at most 32 plain names; and a flood of
/// iteration reports is thinned evenly to the job's budget instead of written row by row.
async fn metric_ingestion_is_bounded(app: TestApp) {
    let team = app.team("alpha").await;
    let (job, agent, attempt) = common::placed_job(&app, &team, 1000, Duration::from_secs(60), true).await;
    let uri = format!("/v1/agent/jobs/{job}/metrics");
    let batch = |reports: Vec<serde_json::Value>| json!({"attempt": attempt, "reports": reports});
    let report =
        |iteration: u64| json!({"kind": "iteration", "rank": 0, "epoch": 0, "iteration": iteration, "loss": 1.0});

    let past_the_end = app.post(&uri, &agent, &batch(vec![report(32_001)])).await;
    assert_eq!(past_the_end.problem(422), vec!["reports[0].iteration"]);
    let mut wide = report(1);
    for i in 0..40 {
        wide[format!("m{i}")] = json!(1.0);
    }
    assert_eq!(app.post(&uri, &agent, &batch(vec![wide])).await.problem(422), vec!["reports[0].*"]);
    let mut odd = report(1);
    odd["Loss-Of-Everything"] = json!(1.0);
    assert_eq!(app.post(&uri, &agent, &batch(vec![odd])).await.problem(422), vec!["reports[0].Loss-Of-Everything"]);
    // an agent's sample of a rank is keyed by the Unix second it was taken at: bounded by the clock, not
    // by the job's iterations
    let now = chrono::Utc::now().timestamp();
    let sample = |second: i64| json!({"kind": "system", "rank": 0, "epoch": 0, "iteration": second, "cpu_cores": 0.9, "resident_bytes": 1e8});
    assert_eq!(app.post(&uri, &agent, &batch(vec![sample(now)])).await.status, 200);
    let ahead = app.post(&uri, &agent, &batch(vec![sample(now + 2 * 86_400)])).await;
    assert_eq!(ahead.problem(422), vec!["reports[0].iteration"], "two days ahead of the server's clock");
    let mut negative = sample(now);
    negative["resident_bytes"] = json!(-1.0);
    assert_eq!(app.post(&uri, &agent, &batch(vec![negative])).await.problem(422), vec!["reports[0].resident_bytes"]);

    // 20,000 reports in a few seconds against a budget of 100 a second (1,000 saved up)
    let started = std::time::Instant::now();
    let (mut accepted, mut downsampled) = (0, 0);
    for from in (0..20_000).step_by(2_000) {
        let ack = app.post(&uri, &agent, &batch((from..from + 2_000).map(report).collect())).await;
        assert_eq!(ack.status, 200, "{}", ack.text);
        accepted += ack.body["accepted"].as_u64().unwrap();
        downsampled += ack.body["downsampled"].as_u64().unwrap();
        let stride = ack.body["stride"].as_u64().unwrap();
        assert!(stride.is_power_of_two());
    }
    assert_eq!(accepted + downsampled, 20_000);
    let budget = 1_000 + (100.0 * started.elapsed().as_secs_f64()).ceil() as u64;
    assert!((1_000..=budget).contains(&accepted), "kept {accepted}, budget {budget}");
    let stored = app.get(&format!("/v1/jobs/{job}/metrics?kind=iteration&limit=10000"), &team.viewer).await;
    assert_eq!(stored.body["points"].as_array().unwrap().len() as u64, accepted);
}

/// A queue of three jobs per team.
async fn small_queue(store: std::sync::Arc<dyn ringtrain_store::Store>) -> TestApp {
    TestApp::with_config(store, |config| config.max_queued_per_team = 3).await
}

/// A team's queue is bounded, whichever way a job comes in: the fourth queued job is 429 with a
/// Retry-After, another team is not affected, once a job leaves the queue the team may submit again, and a
/// resume or a study that would take the queue past its bound is refused the same way (a study counting all
/// its new jobs).
async fn a_teams_queue_is_bounded(app: TestApp) {
    let a = app.team("alpha").await;
    let b = app.team("beta").await;
    let mut first = None;
    for i in 0..3 {
        let id = app.submit(&a.member, &common::spec(&format!("q{i}"))).await;
        first.get_or_insert(id);
    }
    let full = app.post("/v1/jobs", &a.member, &common::spec("q3")).await;
    full.problem(429);
    assert_eq!(full.body["type"], "urn:ringtrain:problem:queue-full");
    assert!(full.body["detail"].as_str().unwrap().contains("3 queued jobs"), "{}", full.text);
    assert!(full.headers.contains_key("retry-after"));
    app.submit(&b.member, &common::spec("other team")).await;
    let first = first.unwrap();
    let cancel = app.post(&format!("/v1/jobs/{first}/cancel"), &a.member, &json!({})).await;
    assert_eq!(cancel.status, 200, "{}", cancel.text);
    // one place free: a study of two new jobs does not fit, and stores nothing
    let study = json!({"base": common::spec("s"), "points": [{}, {"seed": 2}]});
    let refused = app.post("/v1/studies", &a.member, &study).await;
    refused.problem(429);
    assert!(refused.body["detail"].as_str().unwrap().contains("these 2 new jobs would make 4"), "{}", refused.text);
    assert_eq!(app.get("/v1/studies", &a.member).await.body["studies"], json!([]));
    app.submit(&a.member, &common::spec("q3")).await;
    let resume = app.post(&format!("/v1/jobs/{first}/resume"), &a.member, &json!({})).await;
    resume.problem(429);
    assert!(resume.body["detail"].as_str().unwrap().contains("resume it when"), "{}", resume.text);
}

/// A job the pool cannot place is marked with the reason in its view (and loses the mark once the pool can
/// place it); one that stays unplaceable past the grace period fails, saying why.
async fn an_unplaceable_job_says_why_and_fails_after_the_grace(app: TestApp) {
    let team = app.team("alpha").await;
    let register = |name: &'static str, agent: String| {
        let app = &app;
        async move {
            let devices = json!([{"index": 0, "kind": "cpu", "name": "cpu 0"}]);
            let body = json!({"name": name, "address": "127.0.0.1", "devices": devices});
            let node = app.post("/v1/agent/nodes", &agent, &body).await;
            assert_eq!(node.status, 200, "{}", node.text);
        }
    };
    register("one", app.agent_token().await).await;
    let mut two = common::spec("two");
    two["workers"] = json!(2);
    let two = app.submit(&team.member, &two).await;
    let mut gpu = common::spec("gpu");
    gpu["workers"] = json!(1);
    gpu["device"] = json!("gpu");
    let gpu = app.submit(&team.member, &gpu).await;
    let patient = ringtrain_scheduler::LoopConfig { owner: "test".into(), ..Default::default() };
    app.state.scheduler(patient.clone()).pass().await.unwrap();
    let view = app.get(&format!("/v1/jobs/{two}"), &team.viewer).await;
    assert_eq!(view.body["state"], "queued");
    assert_eq!(view.body["unplaceable"]["reason"], "needs 2 cpu devices; the pool has 1", "{}", view.text);
    let since = view.body["unplaceable"]["since"].clone();
    let view = app.get(&format!("/v1/jobs/{gpu}"), &team.viewer).await;
    assert_eq!(view.body["unplaceable"]["reason"], "needs 1 gpu devices; no node that is up offers any");
    // another pass keeps the first `since`
    app.state.scheduler(patient.clone()).pass().await.unwrap();
    assert_eq!(app.get(&format!("/v1/jobs/{two}"), &team.viewer).await.body["unplaceable"]["since"], since);

    // a second node makes the two-device job placeable: its mark goes, and it starts
    register("two", app.agent_token().await).await;
    app.state.scheduler(patient).pass().await.unwrap();
    let view = app.get(&format!("/v1/jobs/{two}"), &team.viewer).await;
    assert_eq!(view.body["state"], "scheduled", "{}", view.text);
    assert!(view.body["unplaceable"].is_null());

    // with no grace left, the GPU job fails with the reason
    let impatient = ringtrain_scheduler::LoopConfig {
        owner: "test".into(),
        unplaceable_grace: Duration::ZERO,
        ..Default::default()
    };
    let pass = app.state.scheduler(impatient).pass().await.unwrap();
    assert_eq!(pass.unplaceable_failed, 1, "{pass:?}");
    let view = app.get(&format!("/v1/jobs/{gpu}"), &team.viewer).await;
    assert_eq!(view.body["state"], "failed");
    let error = view.body["error"].as_str().unwrap();
    assert!(error.contains("needs 1 gpu devices; no node that is up offers any"), "{error}");
}

/// A job whose estimated memory per rank exceeds every device of its kind is 422, naming the field most
/// to blame and the numbers; one that fits, or one for a kind whose devices do not report memory, passes.
async fn a_job_that_can_never_fit_is_refused_with_its_estimate(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let devices = json!([{"index": 0, "kind": "cpu", "name": "cpu 0", "memory_bytes": 1u64 << 30},
                         {"index": 1, "kind": "gpu", "name": "gpu 0"}]);
    let node =
        app.post("/v1/agent/nodes", &agent, &json!({"name": "n", "address": "127.0.0.1", "devices": devices})).await;
    assert_eq!(node.status, 200, "{}", node.text);

    let mut wide = common::spec("wide");
    wide["model"] = json!({"name": "mlp", "hidden": [65536, 65536, 65536]});
    let refused = app.post("/v1/jobs", &team.member, &wide).await;
    assert_eq!(refused.problem(422), vec!["model"]);
    let reason = refused.body["errors"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("one rank needs about 96.") && reason.contains("GiB"), "{reason}");
    assert!(reason.contains("the largest cpu device offers 1.0 GiB"), "{reason}");

    let mut big_batch = common::spec("big batch");
    big_batch["model"] = json!({"name": "resnet56"});
    big_batch["per_worker_batch"] = json!(8192);
    big_batch["dataset"] = json!("synthetic:100000");
    assert_eq!(app.post("/v1/jobs", &team.member, &big_batch).await.problem(422), vec!["per_worker_batch"]);

    // the same jobs on GPUs, which report no memory here: nothing to check against
    wide["device"] = json!("gpu");
    assert_eq!(app.post("/v1/jobs", &team.member, &wide).await.status, 201);
    // an ordinary job fits
    app.submit(&team.member, &common::spec("small")).await;

    // ResNet-56 at n = 700: about 1.38 GB on one device, refused; cut in two pipeline stages, each device
    // holds one stage (0.57 and 0.87 GB), and it is taken
    let mut deep = common::spec("deep");
    deep["model"] = json!({"name": "resnet56"});
    deep["per_worker_batch"] = json!(700);
    deep["dataset"] = json!("synthetic:20000");
    let refused = app.post("/v1/jobs", &team.member, &deep).await;
    assert_eq!(refused.problem(422), vec!["per_worker_batch"]);
    deep["devices_per_worker"] = json!(2);
    deep["placement"] = json!({"cuts": ["layer1.5"]});
    let split = app.post("/v1/jobs", &team.member, &deep).await;
    assert_eq!(split.status, 201, "{}", split.text);
    assert_eq!(split.body["devices"], 4, "2 workers of 2 stages hold 4 devices: {}", split.text);
    // at a batch where even a stage cannot fit, the reason names the stage
    deep["per_worker_batch"] = json!(1000);
    let refused = app.post("/v1/jobs", &team.member, &deep).await;
    assert_eq!(refused.problem(422), vec!["per_worker_batch"]);
    let reason = refused.body["errors"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("in pipeline stage 1 (layer1.6 to layer3.8, 1 micro-batch at once)"), "{reason}");
}

/// The long poll's version is the database's: a poll that reaches another server on the same database (a
/// replica, or this one restarted, whose own change counter starts again at 0) with the version it had still
/// waits when nothing changed, and answers at once when something did.
async fn long_poll_versions_hold_across_servers(app: TestApp) {
    use tower::ServiceExt;
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let devices = json!([{"index": 0, "kind": "cpu", "name": "cpu 0"}]);
    let node =
        app.post("/v1/agent/nodes", &agent, &json!({"name": "n", "address": "127.0.0.1", "devices": devices})).await;
    let uri = format!("/v1/agent/nodes/{}/assignments", node.body["id"].as_str().unwrap());
    let version = app.get(&uri, &agent).await.body["version"].as_u64().unwrap();
    let replica = ringtrain_api::app(ringtrain_api::AppState::new(
        app.store.clone(),
        ringtrain_api::ApiConfig::new(app.dir.path()),
    ));
    let poll = |since: u64, wait_s: u64| {
        let replica = replica.clone();
        let request = axum::http::Request::builder()
            .uri(format!("{uri}?since={since}&wait_s={wait_s}"))
            .header("authorization", format!("Bearer {agent}"))
            .body(axum::body::Body::empty())
            .unwrap();
        async move {
            let response = replica.oneshot(request).await.unwrap();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()
        }
    };
    let started = std::time::Instant::now();
    let quiet = poll(version, 1).await;
    assert!(started.elapsed() >= Duration::from_millis(900), "answered after {:?}", started.elapsed());
    assert_eq!(quiet["version"].as_u64(), Some(version));
    app.submit(&team.member, &common::spec("a change")).await;
    let started = std::time::Instant::now();
    let moved = poll(version, 10).await;
    assert!(started.elapsed() < Duration::from_secs(2), "answered after {:?}", started.elapsed());
    assert!(moved["version"].as_u64().unwrap() > version, "{moved}");
}

/// A server that starts again after an outage longer than the lease does not fail the placements whose
/// agents kept running: leases expire only once the agents have had a node timeout to heartbeat.
async fn leases_that_ran_out_in_an_outage_get_a_grace(app: TestApp) {
    let team = app.team("alpha").await;
    // a lease that has already run out, as after an outage
    let (id, _, _) = common::placed_job(&app, &team, 4, Duration::ZERO, false).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let restarted = ringtrain_scheduler::LoopConfig {
        owner: "test".into(),
        ..ringtrain_scheduler::LoopConfig::starting_now(Duration::from_secs(30))
    };
    let pass = app.state.scheduler(restarted).pass().await.unwrap();
    assert_eq!(pass.failed_placements, 0, "{pass:?}");
    assert_eq!(app.get(&format!("/v1/jobs/{id}"), &team.viewer).await.body["state"], "scheduled");
    // once the grace is over, a lease nobody renewed expires as before
    let later = ringtrain_scheduler::LoopConfig { owner: "test".into(), ..Default::default() };
    let pass = app.state.scheduler(later).pass().await.unwrap();
    assert_eq!(pass.failed_placements, 1, "{pass:?}");
    let events = app.get(&format!("/v1/jobs/{id}/events"), &team.viewer).await;
    assert!(events.text.contains("its lease expired"), "{}", events.text);
}

ringtrain_store::on_both_backends!(
    setup = crate::small_queue;
    a_teams_queue_is_bounded,
);

ringtrain_store::on_both_backends!(
    setup = crate::strict;
    a_token_over_its_rate_is_refused_and_others_are_not,
    event_streams_are_bounded_and_woken_by_changes,
    metric_ingestion_is_bounded,
);

/// A loss spike and a throughput collapse in rank 0's reports become warnings on the job, which goes on.
async fn a_spike_and_a_collapse_are_warnings_on_a_job_that_goes_on(app: TestApp) {
    let team = app.team("alpha").await;
    let (job, agent, attempt) = common::placed_job(&app, &team, 1000, Duration::from_secs(60), true).await;
    let uri = format!("/v1/agent/jobs/{job}/metrics");
    let report = |iteration: u64, loss: f64, speed: f64| json!({"kind": "iteration", "rank": 0, "epoch": 0, "iteration": iteration, "loss": loss, "samples_per_s": speed});
    let mut reports: Vec<Value> = (0..60).map(|i| report(i, 1.0, 1000.0)).collect();
    reports.push(report(60, 12.0, 1000.0));
    reports.extend((61..70).map(|i| report(i, 1.0, 50.0)));
    let sent = app.post(&uri, &agent, &json!({"attempt": attempt, "reports": reports})).await;
    assert_eq!(sent.status, 200, "{}", sent.text);
    let events = app.get(&format!("/v1/jobs/{job}/events"), &team.viewer).await.body;
    let warnings: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "warning" && e["to_state"].is_null())
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(warnings.len(), 2, "{events}");
    assert!(warnings[0].starts_with("loss spike at iteration 60: 12.0000, 12.0 times the median"), "{warnings:?}");
    assert!(warnings[1].starts_with("throughput collapse at iteration 65: 50 samples/s"), "{warnings:?}");
    let view = app.get(&format!("/v1/jobs/{job}"), &team.viewer).await.body;
    assert_eq!(view["state"], "running", "a warning stops nothing: {view}");
}

ringtrain_store::on_both_backends!(
    setup = crate::common::TestApp::new;
    a_spike_and_a_collapse_are_warnings_on_a_job_that_goes_on,
    a_schedule_preview_cannot_freeze_the_server,
    one_teams_queue_cannot_hide_another_teams_job,
    a_long_jobs_large_result_is_taken,
    an_unplaceable_job_says_why_and_fails_after_the_grace,
    leases_that_ran_out_in_an_outage_get_a_grace,
    a_job_that_can_never_fit_is_refused_with_its_estimate,
    long_poll_versions_hold_across_servers,
);
