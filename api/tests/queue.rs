//! Queue transparency through the API: a queued job's reason, place and estimated start, and dry runs that
//! answer what the next pass then does, on random clusters built through the routes and the real loop.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use axum::http::Method;
use common::{placed_job, spec, TestApp, ADMIN};
use ringtrain_core::JobId;
use ringtrain_scheduler::{LoopConfig, ViewConfig};
use ringtrain_store::Store;
use serde_json::{json, Value};

async fn job(app: &TestApp, token: &str, id: &str) -> Value {
    let reply = app.get(&format!("/v1/jobs/{id}"), token).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.body
}

fn one_worker(name: &str) -> Value {
    let mut one = spec(name);
    one["workers"] = json!(1);
    one
}

async fn a_queued_job_says_why_it_waits_where_it_stands_and_when_it_starts(app: TestApp) {
    let team = app.team("alpha").await;
    // one CPU slot, held by a running job of 4 epochs × 32 iterations
    let (running, agent, attempt) = placed_job(&app, &team, 4, Duration::from_secs(60), true).await;
    let waiting = app.submit(&team.member, &one_worker("waiting")).await;

    let view = job(&app, &team.viewer, &waiting).await;
    let reason = &view["pending_reason"];
    assert_eq!(reason["code"], "head_of_line", "{view}");
    assert_eq!(reason["awaiting_jobs"], json!([running]));
    assert!(reason["message"].as_str().unwrap().contains(&running), "{reason}");
    assert_eq!(view["queue_position"], 1);
    let estimate = &view["estimated_start"];
    assert_eq!((estimate["kind"].as_str(), &estimate["jobs"]), (Some("unknown"), &json!([running])), "{estimate}");

    // rank 0 reports iteration 9 of 128 at 160 samples/s: a global batch of 16, so 10 iterations/s and
    // 118 iterations (11.8 s) to go
    let report = json!({"kind": "iteration", "rank": 0, "epoch": 0, "iteration": 9, "lr": 0.1, "loss": 2.0,
        "samples_per_s": 160.0, "allreduce_s": 0.0});
    let sent = app
        .post(&format!("/v1/agent/jobs/{running}/metrics"), &agent, &json!({"attempt": attempt, "reports": [report]}))
        .await;
    assert_eq!(sent.status, 200, "{}", sent.text);
    let estimate = job(&app, &team.viewer, &waiting).await["estimated_start"].clone();
    assert_eq!((estimate["kind"].as_str(), &estimate["jobs"]), (Some("at"), &json!([running])), "{estimate}");
    assert!((estimate["seconds"].as_f64().unwrap() - 11.8).abs() < 0.01, "{estimate}");
    assert!(estimate["basis"].as_str().unwrap().contains("at its current rate"), "{estimate}");

    // a job larger than the pool has no place in the queue; the list shows reasons for queued jobs only
    let mut large = one_worker("large");
    large["workers"] = json!(4);
    let large = app.submit(&team.member, &large).await;
    let page = app.get("/v1/jobs", &team.viewer).await.body;
    let listed: BTreeMap<String, &Value> =
        page["jobs"].as_array().unwrap().iter().map(|j| (j["id"].as_str().unwrap().to_string(), j)).collect();
    assert_eq!(listed[&large]["pending_reason"]["code"], "too_large");
    assert_eq!(listed[&large]["pending_reason"]["pool_size"], 1);
    assert!(listed[&large]["queue_position"].is_null());
    assert_eq!(listed[&waiting]["pending_reason"]["code"], "head_of_line");
    assert_eq!(listed[&waiting]["queue_position"], 1);
    assert!(listed[&running]["pending_reason"].is_null() && listed[&running]["queue_position"].is_null());
    assert!(listed[&waiting]["estimated_start"].is_null(), "estimates are for one job's view only");
}

async fn a_dry_run_stores_nothing_and_refuses_bad_input_like_a_submission(app: TestApp) {
    let team = app.team("alpha").await;
    let before = app.get("/v1/jobs", &team.viewer).await.body["jobs"].as_array().unwrap().len();
    let dry = app.post("/v1/jobs?dry_run=true", &team.member, &one_worker("dry")).await;
    assert_eq!(dry.status, 200, "{}", dry.text);
    assert_eq!((dry.body["dry_run"].as_bool(), dry.body["verdict"].as_str()), (Some(true), Some("wait")));
    assert_eq!(dry.body["pending_reason"]["code"], "no_devices_of_kind", "no node is up: {}", dry.body);
    assert_eq!(dry.body["effective"]["global_batch"], 16);

    let mut bad = one_worker("bad");
    bad["workers"] = json!(0);
    let refused = app.post("/v1/jobs?dry_run=true", &team.member, &bad).await;
    assert_eq!(refused.status, 422, "{}", refused.text);
    assert!(refused.text.contains("workers"), "{}", refused.text);
    let odd = app.post("/v1/jobs?dry_run=perhaps", &team.member, &one_worker("odd")).await;
    assert_eq!(odd.status, 400, "{}", odd.text);
    let viewer = app.post("/v1/jobs?dry_run=true", &team.viewer, &one_worker("viewer")).await;
    assert_eq!(viewer.status, 403, "{}", viewer.text);
    let after = app.get("/v1/jobs", &team.viewer).await.body["jobs"].as_array().unwrap().len();
    assert_eq!(before, after, "a dry run stores nothing");
}

/// The reasons the loop adds to the policy's: a job beyond the pass's window of its team's queue, and a
/// preempted job whose previous placement is still stopping.
async fn jobs_the_pass_does_not_plan_say_why(app: TestApp) {
    let team = app.team("alpha").await;
    // the window is 2 (see `small_window`): the third queued job of the team is not planned
    let ids = [app.submit(&team.member, &one_worker("a")).await, app.submit(&team.member, &one_worker("b")).await];
    let third = app.submit(&team.member, &one_worker("c")).await;
    let view = job(&app, &team.viewer, &third).await;
    assert_eq!(view["pending_reason"]["code"], "beyond_queue_window", "{view}");
    assert_eq!(view["pending_reason"]["window"], 2);
    assert!(view["queue_position"].is_null() && view["estimated_start"].is_null(), "{view}");
    assert_eq!(job(&app, &team.viewer, &ids[0]).await["pending_reason"]["code"], "no_devices_of_kind");
    let dry = app.post("/v1/jobs?dry_run=true", &team.member, &one_worker("d")).await.body;
    assert_eq!(dry["pending_reason"]["code"], "beyond_queue_window", "{dry}");
    for id in ids.iter().chain([&third]) {
        app.post(&format!("/v1/jobs/{id}/cancel"), &team.member, &json!({})).await;
    }

    // a placed job, delivered to its agent, then preempted: its ranks still hold the devices while they
    // checkpoint, and it waits for them
    let (id, _, attempt) = placed_job(&app, &team, 4, Duration::from_secs(60), true).await;
    let job_id = JobId(id.parse().unwrap());
    for rank in app.store.job_assignments(job_id, attempt).await.unwrap() {
        use ringtrain_core::AssignmentState::{Delivered, Pending};
        app.store.set_assignment_state(rank.id, Pending, Delivered).await.unwrap();
    }
    app.store.preempt_job(job_id, attempt, "for the test").await.unwrap().expect("preempted");
    app.state.changed().await;
    let view = job(&app, &team.viewer, &id).await;
    assert_eq!(view["state"], "queued");
    assert_eq!(view["pending_reason"]["code"], "previous_placement_stopping", "{view}");
    assert!(view["pending_reason"]["message"].as_str().unwrap().contains("checkpoint"), "{view}");
}

async fn small_window(store: std::sync::Arc<dyn Store>) -> TestApp {
    TestApp::with_config(store, |config| config.scheduling = ViewConfig { queue_window: 2, ..Default::default() }).await
}

/// A few random numbers, the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Device id -> (node id, index) of every node.
async fn device_slots(app: &TestApp) -> BTreeMap<String, (String, u64)> {
    let mut slots = BTreeMap::new();
    for node in app.store.list_nodes().await.unwrap() {
        for device in &node.devices {
            slots.insert(device.id.to_string(), (node.id.to_string(), device.index as u64));
        }
    }
    slots
}

/// How many times each queued job has been reclaimed (its preemption events, which name neither the
/// reclaiming team nor its job), by id.
async fn reclaims(app: &TestApp) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for queued in app.store.list_queued(10_000).await.unwrap() {
        let events = app.store.list_events(queued.id, 0, 10_000).await.unwrap();
        let reclaimed =
            events.iter().filter(|e| e.reason.as_deref().is_some_and(|r| r.contains("reclaimed by"))).count();
        counts.insert(queued.id.to_string(), reclaimed);
    }
    counts
}

/// The jobs reclaimed between two counts.
fn newly_reclaimed(before: &BTreeMap<String, usize>, after: &BTreeMap<String, usize>) -> BTreeSet<String> {
    after.iter().filter(|(id, n)| **n > before.get(*id).copied().unwrap_or(0)).map(|(id, _)| id.clone()).collect()
}

/// The tokens of one team the dry-run rounds use: a member, and a platform admin of the team (it sees the
/// other teams' job ids a dry run's answer hides from the member).
struct Submitter {
    member: String,
    platform: String,
}

/// A dry run of `submission`, then the submission and one pass: the pass does what the dry run said.
/// Returns the verdict.
async fn dry_run_then_pass(
    app: &TestApp,
    config: &LoopConfig,
    team: &Submitter,
    submission: &Value,
    round: usize,
) -> String {
    let member = team.member.as_str();
    let dry = app.post("/v1/jobs?dry_run=true", &team.platform, submission).await;
    assert_eq!(dry.status, 200, "{}", dry.text);
    let dry = dry.body;
    let tenant = app.post("/v1/jobs?dry_run=true", member, submission).await.body;
    assert_eq!(tenant["verdict"], dry["verdict"], "round {round}: {tenant}");
    let before = reclaims(app).await;
    let id = app.submit(member, submission).await;
    app.state.scheduler(config.clone()).pass().await.expect("a pass");
    app.state.changed().await; // as the loop announces what it did
    let seen = job(app, member, &id).await;
    let verdict = dry["verdict"].as_str().unwrap().to_string();
    let preempted = newly_reclaimed(&before, &reclaims(app).await);
    match verdict.as_str() {
        "start" => {
            assert_eq!(seen["state"], "scheduled", "round {round}: {dry} then {seen}");
            let slots = device_slots(app).await;
            let mut ranks = app.store.job_assignments(JobId(id.parse().unwrap()), 1).await.unwrap();
            ranks.sort_by_key(|a| a.rank);
            let placed: Vec<Value> = ranks
                .iter()
                .map(|a| {
                    let (node, index) = &slots[&a.device_id.to_string()];
                    json!({"node_id": node, "index": index})
                })
                .collect();
            assert_eq!(json!(placed), dry["devices"], "round {round}: the devices the dry run named");
        }
        "reclaim" => {
            assert_eq!(seen["state"], "queued", "round {round}");
            // reclaiming while the victims stop; victims that never reached an agent stop at once
            let code = seen["pending_reason"]["code"].as_str();
            assert!(matches!(code, Some("reclaiming" | "starting_next_pass")), "round {round}: {seen}");
            let named: BTreeSet<String> =
                dry["preempts"].as_array().unwrap().iter().map(|p| p["job_id"].as_str().unwrap().to_string()).collect();
            assert!(!named.is_empty());
            assert_eq!(named, preempted, "round {round}: the jobs the dry run said it would preempt");
            for victim in &preempted {
                let events = app.store.list_events(victim.parse().unwrap(), 0, 10_000).await.unwrap();
                let texts: Vec<&str> = events.iter().filter_map(|e| e.reason.as_deref()).collect();
                assert!(texts.iter().all(|t| !t.contains(&id)), "round {round}: a victim learns the job: {texts:?}");
            }
            // the member learns how many of other teams' jobs, not which
            assert_eq!(tenant["preempts"], json!([]), "round {round}: {tenant}");
            let victims = tenant["pending_reason"]["victims"].as_array().unwrap();
            assert_eq!(victims.len(), named.len(), "round {round}: {tenant}");
            for id in &named {
                assert!(!tenant.to_string().contains(id.as_str()), "round {round}: {tenant}");
            }
        }
        _ => {
            assert_eq!(seen["state"], "queued", "round {round}: {dry} then {seen}");
            assert!(preempted.is_empty(), "round {round}: a waiting job preempts nobody: {preempted:?}");
        }
    }
    for delayed in dry["delays"].as_array().unwrap() {
        let delayed = app.store.get_job(JobId(delayed.as_str().unwrap().parse().unwrap())).await.unwrap().unwrap();
        assert_eq!(delayed.state, ringtrain_core::JobState::Queued, "round {round}: a delayed job did not start");
    }
    verdict
}

/// A new token of `team`, as the platform admin makes it.
async fn mint(app: &TestApp, team: &str, body: Value) -> String {
    let minted = app.post(&format!("/v1/teams/{team}/tokens"), ADMIN, &body).await;
    assert_eq!(minted.status, 201, "{}", minted.text);
    minted.body["token"].as_str().unwrap().to_string()
}

async fn register_node(app: &TestApp, name: &str, slots: u64) {
    let devices: Vec<Value> =
        (0..slots).map(|i| json!({"index": i, "kind": "cpu", "name": format!("cpu{i}")})).collect();
    let body = json!({"name": name, "address": "127.0.0.1", "devices": devices});
    // a token per node: an agent token belongs to the first node it registers
    let agent = app.agent_token().await;
    assert_eq!(app.post("/v1/agent/nodes", &agent, &body).await.status, 200);
}

async fn a_dry_run_answers_what_the_next_pass_does(app: TestApp) {
    let config = LoopConfig { owner: "test".into(), view: app.state.config.scheduling, ..Default::default() };
    let mut teams = Vec::new();
    for (t, quota) in [2, 1, 0].into_iter().enumerate() {
        let created =
            app.post("/v1/teams", ADMIN, &json!({"name": format!("t{t}"), "gpu_quota": 0, "cpu_quota": quota})).await;
        let id = created.body["id"].as_str().unwrap().to_string();
        let member = mint(&app, &id, json!({"role": "member"})).await;
        let platform = mint(&app, &id, json!({"role": "admin", "platform": true})).await;
        teams.push(Submitter { member, platform });
    }
    let members: Vec<&str> = teams.iter().map(|t| t.member.as_str()).collect();
    let mut rng = Rng(17);
    let random_spec = |rng: &mut Rng, name: String| {
        let mut job = one_worker(&name);
        job["workers"] = json!(1 + rng.below(3));
        job["priority"] = json!(rng.below(3) as i64 - 1);
        job
    };
    let mut verdicts = BTreeSet::new();
    let mut submitted: Vec<(String, usize)> = Vec::new();
    // random rounds: nodes join, jobs come and end (here: cancelled), a dry run is compared with the pass
    for round in 0..20 {
        if round < 3 || rng.below(4) == 0 {
            register_node(&app, &format!("n{round}"), 1 + rng.below(3)).await;
        }
        for j in 0..rng.below(2) {
            let team = rng.below(3) as usize;
            let id = app.submit(members[team], &random_spec(&mut rng, format!("r{round}j{j}"))).await;
            submitted.push((id, team));
        }
        for _ in 0..rng.below(3) {
            let active: Vec<String> = app.store.active_jobs().await.unwrap().iter().map(|j| j.id.to_string()).collect();
            let running: Vec<&(String, usize)> = submitted.iter().filter(|(id, _)| active.contains(id)).collect();
            if !running.is_empty() {
                let (id, team) = running[rng.below(running.len() as u64) as usize].clone();
                let cancelled = app.post(&format!("/v1/jobs/{id}/cancel"), members[team], &json!({})).await;
                assert_eq!(cancelled.status, 200, "{}", cancelled.text);
            }
        }
        app.state.scheduler(config.clone()).pass().await.expect("a pass");
        app.state.changed().await;

        let team = rng.below(3) as usize;
        let mut submission = random_spec(&mut rng, format!("dry{round}"));
        if rng.below(2) == 0 {
            submission["priority"] = json!(5); // first of its team's queue
        }
        verdicts.insert(dry_run_then_pass(&app, &config, &teams[team], &submission, round).await);
        let id = app.get("/v1/jobs?limit=1", members[team]).await.body["jobs"][0]["id"].as_str().unwrap().to_string();
        submitted.push((id, team));
    }
    // and one reclaim for sure: team 1 (guaranteed 1) ends all its jobs, the queue is emptied, the pool
    // fills with team 2's borrowing (guaranteed nothing), and team 1 asks for its device back
    let queued: Vec<String> = app.store.list_queued(10_000).await.unwrap().iter().map(|j| j.id.to_string()).collect();
    for (id, team) in submitted.iter().filter(|(id, t)| *t == 1 || queued.contains(id)) {
        app.post(&format!("/v1/jobs/{id}/cancel"), members[*team], &json!({})).await;
    }
    for j in 0..30 {
        app.submit(members[2], &one_worker(&format!("borrow{j}"))).await;
    }
    app.state.scheduler(config.clone()).pass().await.expect("a pass");
    app.state.changed().await;
    let mut claim = one_worker("claim");
    claim["priority"] = json!(5);
    let verdict = dry_run_then_pass(&app, &config, &teams[1], &claim, 99).await;
    assert_eq!(verdict, "reclaim");
    verdicts.insert(verdict);
    assert_eq!(verdicts.len(), 3, "the rounds saw every verdict: {verdicts:?}");
}

/// Team B borrows the only CPU slot; team A, below its guarantee, reclaims it. A's views of its waiting
/// job (one job, the list, a dry run) say it preempts "a job of another team" and carry neither B's job id
/// nor B's team id; a platform admin in team A sees the ids.
async fn a_reason_does_not_name_another_teams_job(app: TestApp) {
    let a = app.team("alpha").await;
    let b = app.team("beta").await;
    let no_guarantee = json!({"cpu_quota": 0});
    let patched = app.call(Method::PATCH, &format!("/v1/teams/{}", b.id), Some(ADMIN), Some(&no_guarantee)).await;
    assert_eq!(patched.status, 200, "{}", patched.text);
    let (borrower, _, _) = placed_job(&app, &b, 4, Duration::from_secs(60), true).await;
    let claim = app.submit(&a.member, &one_worker("claim")).await;
    app.state.changed().await;
    let hidden = [borrower.as_str(), b.id.as_str()];

    let view = job(&app, &a.viewer, &claim).await;
    let reason = &view["pending_reason"];
    assert_eq!(reason["code"], "reclaiming", "{view}");
    assert_eq!(reason["victims"], json!([{"job": null, "team": null}]), "{view}");
    assert!(reason["message"].as_str().unwrap().contains("preempting a job of another team"), "{reason}");
    let estimate = &view["estimated_start"];
    assert_eq!(estimate["jobs"], json!([null]), "{view}");
    assert!(estimate["basis"].as_str().unwrap().starts_with("after a job of another team ends"), "{estimate}");
    let list = app.get("/v1/jobs", &a.viewer).await;
    assert!(list.text.contains("a job of another team"), "{}", list.text);
    let dry = app.post("/v1/jobs?dry_run=true", &a.member, &one_worker("dry")).await;
    assert_eq!(dry.status, 200, "{}", dry.text);
    for text in [view.to_string(), list.text, dry.text] {
        for id in hidden {
            assert!(!text.contains(id), "{id} in {text}");
        }
    }

    let platform = mint(&app, &a.id, json!({"role": "admin", "platform": true})).await;
    let seen = job(&app, &platform, &claim).await;
    assert_eq!(seen["pending_reason"]["victims"], json!([{"job": borrower, "team": b.id}]), "{seen}");
    assert!(seen["pending_reason"]["message"].as_str().unwrap().contains(&borrower), "{seen}");
}

async fn reclaimable(store: std::sync::Arc<dyn Store>) -> TestApp {
    TestApp::with_config(store, |config| {
        config.scheduling = ViewConfig { min_run_before_preemption: Duration::ZERO, ..Default::default() }
    })
    .await
}

ringtrain_store::on_both_backends!(
    setup = crate::common::TestApp::new;
    a_queued_job_says_why_it_waits_where_it_stands_and_when_it_starts,
    a_dry_run_stores_nothing_and_refuses_bad_input_like_a_submission,
);

ringtrain_store::on_both_backends!(
    setup = crate::small_window;
    jobs_the_pass_does_not_plan_say_why,
);

ringtrain_store::on_both_backends!(
    setup = crate::reclaimable;
    a_dry_run_answers_what_the_next_pass_does,
    a_reason_does_not_name_another_teams_job,
);
