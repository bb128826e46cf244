//! Accounting and one history per job, on a scripted run through the routes, the store and the real loop:
//! a job is placed, preempted, placed again and succeeds. The usage route's figures (by kind, token, day),
//! the `/metrics` counter (summed in SQL) and the result's history (summed per placement) must all equal
//! the device-seconds computed here by hand from the assignments' recorded start and end times; then a
//! budget makes the team's next job wait with `budget_exhausted`.

mod common;

use std::time::Duration;

use common::{spec, TestApp, ADMIN};
use ringtrain_core::{AssignmentState, JobId};
use ringtrain_scheduler::LoopConfig;
use serde_json::{json, Value};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-3
}

async fn pass(app: &TestApp) {
    let config = LoopConfig { owner: "test".into(), view: app.state.config.scheduling, ..Default::default() };
    app.state.scheduler(config).pass().await.expect("a pass");
    app.state.changed().await;
}

/// Seconds each rank of a placement held its device, by hand: updated_at (its end) − created_at.
async fn held(app: &TestApp, job: JobId, placement: i32) -> f64 {
    let ranks = app.store.job_assignments(job, placement).await.unwrap();
    assert!(ranks.iter().all(|a| !a.state.is_live()), "placement {placement} has ended: {ranks:?}");
    ranks.iter().map(|a| (a.updated_at - a.created_at).num_microseconds().unwrap() as f64 / 1e6).sum()
}

async fn usage_is_the_device_seconds_of_every_placement_and_a_budget_holds_jobs_back(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let devices = json!([{"index": 0, "kind": "cpu", "name": "c0"}, {"index": 1, "kind": "cpu", "name": "c1"}]);
    let node =
        app.post("/v1/agent/nodes", &agent, &json!({"name": "n", "address": "127.0.0.1", "devices": devices})).await;
    let node = node.body["id"].as_str().unwrap().to_string();
    let poll = format!("/v1/agent/nodes/{node}/assignments");
    let id = app.submit(&team.member, &spec("accounted")).await; // k = 2
    let job = JobId(id.parse().unwrap());

    // placement 1: delivered, runs a while, preempted (its ranks stop after a checkpoint)
    pass(&app).await;
    app.get(&poll, &agent).await;
    let running = app.post(&format!("/v1/agent/jobs/{id}/running"), &agent, &json!({"attempt": 1})).await;
    assert_eq!(running.status, 200, "{}", running.text);
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.store.preempt_job(job, 1, "reclaimed for the test").await.unwrap().expect("preempted");
    for rank in app.store.job_assignments(job, 1).await.unwrap() {
        assert!(app
            .store
            .set_assignment_state(rank.id, AssignmentState::Delivered, AssignmentState::Cancelled)
            .await
            .unwrap());
    }
    // placement 2: runs a while and succeeds
    pass(&app).await;
    app.get(&poll, &agent).await;
    let running = app.post(&format!("/v1/agent/jobs/{id}/running"), &agent, &json!({"attempt": 2})).await;
    assert_eq!(running.status, 200, "{}", running.text);
    tokio::time::sleep(Duration::from_millis(200)).await;
    app.end_other_ranks(&id, 2, AssignmentState::Done).await;
    let result =
        json!({"attempt": 2, "outcome": "succeeded", "result": {"wall_seconds": 0.1, "final_test_error": 0.2}});
    let done = app.post(&format!("/v1/agent/jobs/{id}/result"), &agent, &result).await;
    assert_eq!(done.status, 200, "{}", done.text);
    let rank0 = app.store.job_assignments(job, 2).await.unwrap().into_iter().find(|a| a.rank == 0).unwrap();
    assert!(app.store.set_assignment_state(rank0.id, AssignmentState::Delivered, AssignmentState::Done).await.unwrap());

    let (first, second) = (held(&app, job, 1).await, held(&app, job, 2).await);
    let total = first + second;
    assert!(first >= 0.6 && second >= 0.4, "two devices each: {first} {second}");

    // the usage route, three ways
    let usage = |by: &str| {
        let uri = format!("/v1/teams/{}/usage?by={by}", team.id);
        let (app, token) = (&app, team.viewer.clone());
        async move { app.get(&uri, &token).await }
    };
    let by_kind = usage("kind").await;
    assert_eq!(by_kind.status, 200, "{}", by_kind.text);
    let rows = by_kind.body["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{}", by_kind.body);
    assert_eq!(rows[0]["key"], "cpu");
    assert!(close(rows[0]["device_seconds"].as_f64().unwrap(), total), "{} vs {total}", by_kind.body);
    let outcomes = &rows[0]["by_outcome"];
    assert!(close(outcomes["preempted"].as_f64().unwrap(), first), "{outcomes}");
    assert!(close(outcomes["done"].as_f64().unwrap(), second), "{outcomes}");
    let by_token = usage("token").await.body;
    let member = app.store.get_job(job).await.unwrap().unwrap().created_by.unwrap().to_string();
    assert_eq!(by_token["rows"][0]["key"], member.as_str(), "{by_token}");
    let by_day = usage("day").await.body;
    let days: f64 = by_day["rows"].as_array().unwrap().iter().map(|r| r["device_seconds"].as_f64().unwrap()).sum();
    assert!(close(days, total), "{by_day}");
    assert!(close(by_day["device_hours"].as_f64().unwrap() * 3600.0, total));

    // /metrics sums the same in SQL
    let text = app.call(axum::http::Method::GET, "/metrics", None, None).await.text;
    let line = text
        .lines()
        .find(|l| l.starts_with("ringtrain_team_device_seconds_total{") && l.contains("team=\"alpha\""))
        .unwrap_or_else(|| panic!("no counter for alpha:\n{text}"));
    let counted: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    // SQLite's date functions keep milliseconds: a few spans may each be off by one
    assert!((counted - total).abs() < 0.01, "{line} vs {total}");

    // one history: both placements, named the same way in the events and the result
    let view = app.get(&format!("/v1/jobs/{id}"), &team.viewer).await.body;
    let result = &view["result"];
    // taken at the success report, while rank 0 still held its device a moment longer
    let reported = result["device_seconds"].as_f64().unwrap();
    assert!(reported <= total + 1e-3 && reported > total - 0.05, "{result} vs {total}");
    assert_eq!(result["trainer_wall_seconds"], 0.1, "the trainer's own figure is kept");
    assert!(result["wall_seconds"].as_f64().unwrap() >= 0.5, "every placement's wall time: {result}");
    let history = result["history"].as_array().unwrap();
    let ended: Vec<(i64, i64, &str)> = history
        .iter()
        .map(|p| (p["placement"].as_i64().unwrap(), p["attempt"].as_i64().unwrap(), p["ended"].as_str().unwrap()))
        .collect();
    assert_eq!(ended, [(1, 1, "preempted"), (2, 1, "succeeded")], "{result}");
    assert!(close(history[0]["device_seconds"].as_f64().unwrap(), first));
    let events = app.get(&format!("/v1/jobs/{id}/events"), &team.viewer).await.body;
    let named: Vec<(i64, i64, String)> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (e["placement"].as_i64().unwrap(), e["attempt"].as_i64().unwrap(), e["to_state"].as_str().unwrap().into())
        })
        .collect();
    let expected: Vec<(i64, i64, String)> = [
        (0, 0, "queued"),
        (1, 1, "scheduled"),
        (1, 1, "running"),
        (1, 1, "queued"),
        (2, 1, "scheduled"),
        (2, 1, "running"),
        (2, 1, "succeeded"),
    ]
    .into_iter()
    .map(|(p, a, s)| (p, a, s.to_string()))
    .collect();
    assert_eq!(named, expected, "{events}");
    let reasons = events.to_string();
    assert!(
        reasons.contains("placement 1 (attempt 1) preempted") && reasons.contains("placement 2 (attempt 1) succeeded"),
        "{reasons}"
    );

    // a budget below what was used: the team's next job waits, and says why
    let budget = json!({"budget": {"device_hours": 0.0001, "period": "day"}, "weight": 3});
    let changed =
        app.call(axum::http::Method::PATCH, &format!("/v1/teams/{}", team.id), Some(ADMIN), Some(&budget)).await;
    assert_eq!(changed.status, 200, "{}", changed.text);
    assert_eq!((changed.body["weight"].as_i64(), &changed.body["budget"]["period"]), (Some(3), &json!("day")));
    let next = app.submit(&team.member, &spec("over-budget")).await;
    pass(&app).await;
    let waiting = app.get(&format!("/v1/jobs/{next}"), &team.viewer).await.body;
    assert_eq!(waiting["state"], "queued", "{waiting}");
    assert_eq!(waiting["pending_reason"]["code"], "budget_exhausted", "{waiting}");
    let used = waiting["pending_reason"]["used_device_seconds"].as_u64().unwrap() as f64;
    assert!((used - total.floor()).abs() <= 1.0, "{waiting}");
    let usage = usage("kind").await.body;
    assert_eq!(usage["budget"]["exhausted"], true, "{usage}");
    let dry = app.post("/v1/jobs?dry_run=true", &team.member, &spec("dry")).await.body;
    assert_eq!(dry["pending_reason"]["code"], "budget_exhausted", "{dry}");
    // no budget: it starts
    let lifted = app
        .call(axum::http::Method::PATCH, &format!("/v1/teams/{}", team.id), Some(ADMIN), Some(&json!({"budget": null})))
        .await;
    assert_eq!(lifted.status, 200, "{}", lifted.text);
    pass(&app).await;
    let started = app.get(&format!("/v1/jobs/{next}"), &team.viewer).await.body;
    assert_eq!(started["state"], "scheduled", "{started}");
}

async fn usage_refuses_bad_ranges_and_other_teams(app: TestApp) {
    let team = app.team("alpha").await;
    let other = app.team("beta").await;
    let uri = |q: &str| format!("/v1/teams/{}/usage{q}", team.id);
    app.get(&uri(""), &other.admin).await.problem(404);
    let reversed = app.get(&uri("?from=2026-12-02T00:00:00Z&to=2026-12-01T00:00:00Z"), &team.viewer).await;
    assert_eq!((reversed.status.as_u16(), &reversed.body["device_seconds"]), (200, &json!(0.0)), "{}", reversed.text);
    let by = app.get(&uri("?by=week"), &team.viewer).await;
    assert_eq!(by.status, 400, "{}", by.text);
    assert!(by.text.contains("by"), "{}", by.text);
    let bad_date = app.get(&uri("?from=yesterday"), &team.viewer).await;
    assert_eq!(bad_date.status, 400, "{}", bad_date.text);
    let long = app.get(&uri("?from=2000-01-01T00:00:00Z"), &team.viewer).await;
    assert_eq!(long.status, 200, "a long range is fine: {}", long.text);
    let empty = app.get(&uri(""), &team.viewer).await;
    assert_eq!((empty.status.as_u16(), &empty.body["rows"]), (200, &json!([])), "{}", empty.text);
    let bad_weight = app
        .call(axum::http::Method::PATCH, &format!("/v1/teams/{}", team.id), Some(ADMIN), Some(&json!({"weight": 0})))
        .await;
    assert_eq!(bad_weight.status, 422, "{}", bad_weight.text);
    let bad_budget = json!({"budget": {"device_hours": -1, "period": "day"}});
    let refused =
        app.call(axum::http::Method::PATCH, &format!("/v1/teams/{}", team.id), Some(ADMIN), Some(&bad_budget)).await;
    assert_eq!(refused.status, 422, "{}", refused.text);
    assert!(refused.text.contains("budget.device_hours"), "{}", refused.text);
    let _: Value = refused.body;
}

ringtrain_store::on_both_backends!(
    setup = crate::common::TestApp::new;
    usage_is_the_device_seconds_of_every_placement_and_a_budget_holds_jobs_back,
    usage_refuses_bad_ranges_and_other_teams,
);
