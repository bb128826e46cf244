//! The store on both databases: guarded transitions, concurrent starts, the named life-cycle operations,
//! leases, metrics de-duplication.
//! Postgres tests use `#[sqlx::test]` (a fresh database each; they fail when Postgres is unreachable).
//!
//! Over 450 lines: each test runs on both databases, so the two cannot drift apart.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ringtrain_core::spec::DeviceKind;
use ringtrain_core::{AssignmentState, JobId, JobState, NodeState};
use ringtrain_store::*;
use serde_json::json;

/// The store itself is the fixture.
async fn store(store: Arc<dyn Store>) -> Arc<dyn Store> {
    store
}

async fn team(store: &Arc<dyn Store>) -> Team {
    store
        .create_team(NewTeam { name: "t".into(), gpu_quota: 1, cpu_quota: 4, storage_quota_bytes: None })
        .await
        .unwrap()
}

fn new_job(team: &Team, name: &str, priority: i32) -> NewJob {
    NewJob {
        id: JobId::new(),
        team_id: team.id,
        created_by: None,
        name: Some(name.into()),
        spec_json: json!({"name": name, "model": {"name": "mlp"}, "dataset": "synthetic"}),
        effective: None,
        dataset_size: None,
        priority,
        device: DeviceKind::Cpu,
        devices: 1,
        max_restarts: 3,
        study: None,
    }
}

async fn submit(store: &Arc<dyn Store>, job: NewJob) -> Job {
    match store.submit_job(job, None).await.unwrap() {
        Submitted::Created(job) => job,
        other => panic!("{other:?}"),
    }
}

async fn guarded_transitions_refuse_stale_writers(store: Arc<dyn Store>) {
    let team = team(&store).await;
    let job = submit(&store, new_job(&team, "a", 0)).await;
    let (claimed, _) = store.start_job(job.id, "owner-a", Duration::from_secs(60), &[]).await.unwrap().unwrap();
    assert_eq!(claimed.lease_owner.as_deref(), Some("owner-a"));
    assert_eq!(claimed.attempt, 1);

    // A stale owner, a stale state or a stale attempt changes nothing.
    let stale_owner = Transition::new(job.id, JobState::Scheduled, JobState::Running, "x").owned_by("owner-b");
    assert!(store.transition(&stale_owner).await.unwrap().is_none());
    let stale_state = Transition::new(job.id, JobState::Queued, JobState::Scheduled, "x");
    assert!(store.transition(&stale_state).await.unwrap().is_none());
    let stale_attempt = Transition::new(job.id, JobState::Scheduled, JobState::Running, "x").at_attempt(0);
    assert!(store.transition(&stale_attempt).await.unwrap().is_none());
    let unchanged = store.get_job(job.id).await.unwrap().unwrap();
    assert_eq!(unchanged.state, JobState::Scheduled);
    assert_eq!(unchanged.updated_at, claimed.updated_at);
    assert_eq!(store.list_events(job.id, 0, 100).await.unwrap().len(), 2, "no event for refused transitions");

    let running =
        Transition::new(job.id, JobState::Scheduled, JobState::Running, "started").owned_by("owner-a").at_attempt(1);
    let job_now = store.transition(&running).await.unwrap().expect("the owner wins");
    assert_eq!(job_now.state, JobState::Running);
    assert!(job_now.started_at.is_some());
    assert_eq!(job_now.lease_owner.as_deref(), Some("owner-a"), "Keep keeps the lease");
    // The life cycle is enforced before any SQL runs.
    let backwards = Transition::new(job.id, JobState::Running, JobState::Scheduled, "x");
    assert!(matches!(store.transition(&backwards).await, Err(StoreError::InvalidTransition(_))));

    // Two concurrent finishers: exactly one wins.
    let succeed = Transition::new(job.id, JobState::Running, JobState::Succeeded, "a");
    let fail = Transition::new(job.id, JobState::Running, JobState::Failed, "b");
    let (a, b) = tokio::join!(store.transition(&succeed), store.transition(&fail));
    assert_eq!(u8::from(a.unwrap().is_some()) + u8::from(b.unwrap().is_some()), 1);
    let finished = store.get_job(job.id).await.unwrap().unwrap();
    assert!(finished.state.is_terminal() && finished.finished_at.is_some() && finished.lease_owner.is_none());
}

async fn concurrent_starts_never_share_a_job(store: Arc<dyn Store>) {
    let team = team(&store).await;
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(submit(&store, new_job(&team, &format!("j{i}"), 0)).await.id);
    }
    // Two schedulers (say, a leader and one that still believes it leads) start every job at once.
    let mut starters = Vec::new();
    for c in 0..20 {
        let store = store.clone();
        let job = ids[c % 10];
        starters.push(tokio::spawn(async move {
            store.start_job(job, &format!("starter-{c}"), Duration::from_secs(60), &[]).await.unwrap()
        }));
    }
    let mut started = Vec::new();
    for starter in starters {
        started.extend(starter.await.unwrap().map(|(job, _)| job));
    }
    let unique: HashSet<JobId> = started.iter().map(|j| j.id).collect();
    assert_eq!(started.len(), 10, "every job started once");
    assert_eq!(unique, ids.iter().copied().collect());
    for job in &started {
        let events = store.list_events(job.id, 0, 10).await.unwrap();
        assert_eq!(events.len(), 2);
        let owner = job.lease_owner.as_deref().unwrap();
        assert!(events[1].reason.as_deref().unwrap().ends_with(&format!("by {owner}")), "{events:?}");
    }
    assert!(store.list_queued(10).await.unwrap().is_empty());
}

async fn leases_renew_and_expire(store: Arc<dyn Store>) {
    let team = team(&store).await;
    let (_, node) = cpu_node(&store, "n1", 1).await;
    let job = submit(&store, new_job(&team, "lease", 0)).await;
    let rank = NewAssignment { node_id: node.id, device_id: node.devices[0].id, rank: 0 };
    store.start_job(job.id, "owner", Duration::from_millis(1), &[rank]).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let expired = store.expired_leases(now(), 10).await.unwrap();
    assert_eq!(expired.iter().map(|j| j.id).collect::<Vec<_>>(), vec![job.id]);
    // A heartbeat of the node holding its rank renews it.
    assert_eq!(store.renew_node_leases(node.id, Duration::from_secs(60)).await.unwrap(), 1);
    assert!(store.expired_leases(now(), 10).await.unwrap().is_empty());
    // A failed placement goes back to the queue without its lease; the next start is a new attempt.
    let requeued = store.fail_placement(job.id, 1, "lease lost", true).await.unwrap().unwrap();
    assert_eq!(requeued.state, JobState::Queued);
    assert!(requeued.lease_owner.is_none() && requeued.lease_expires.is_none());
    assert_eq!(store.live_assignments().await.unwrap(), vec![], "its pending rank was cancelled with it");
    let (again, _) = store.start_job(job.id, "owner-2", Duration::from_secs(60), &[]).await.unwrap().unwrap();
    assert_eq!(again.attempt, 2);
}

async fn named_operations_end_placements_in_one_step(store: Arc<dyn Store>) {
    let team = team(&store).await;
    let (_, node) = cpu_node(&store, "n1", 2).await;
    let lease = Duration::from_secs(60);
    let rank = |d: usize| NewAssignment { node_id: node.id, device_id: node.devices[d].id, rank: 0 };

    // Cancel: any live state, with its pending ranks; twice is "already ended"; unknown is None.
    let a = submit(&store, new_job(&team, "a", 0)).await;
    store.start_job(a.id, "s", lease, &[rank(0)]).await.unwrap().unwrap();
    let Some(Cancellation::Cancelled(cancelled)) = store.cancel_job(a.id, "by test").await.unwrap() else {
        panic!("cancel")
    };
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert!(store.live_assignments().await.unwrap().is_empty(), "pending rank cancelled in the same step");
    assert!(matches!(store.cancel_job(a.id, "again").await.unwrap(), Some(Cancellation::AlreadyEnded(_))));
    assert!(store.cancel_job(JobId::new(), "nobody").await.unwrap().is_none());
    let events = store.list_events(a.id, 0, 10).await.unwrap();
    assert_eq!(events.last().unwrap().reason.as_deref(), Some("by test"));

    // Fail: a retryable failure requeues while restarts remain; a final one fails with the error; a stale
    // attempt changes nothing.
    let mut spec = new_job(&team, "b", 0);
    spec.max_restarts = 1;
    let b = submit(&store, spec).await;
    store.start_job(b.id, "s", lease, &[rank(1)]).await.unwrap().unwrap();
    assert!(store.fail_placement(b.id, 7, "stale", true).await.unwrap().is_none());
    let requeued = store.fail_placement(b.id, 1, "rank killed", true).await.unwrap().unwrap();
    assert_eq!(requeued.state, JobState::Queued);
    store.start_job(b.id, "s", lease, &[rank(1)]).await.unwrap().unwrap();
    let failed = store.fail_placement(b.id, 2, "rank killed again", true).await.unwrap().unwrap();
    assert_eq!((failed.state, failed.error.as_deref()), (JobState::Failed, Some("rank killed again")));

    // Succeed: only the active placement, with its result.
    let c = submit(&store, new_job(&team, "c", 0)).await;
    store.start_job(c.id, "s", lease, &[rank(0)]).await.unwrap().unwrap();
    let started = Transition::new(c.id, JobState::Scheduled, JobState::Running, "ranks started").at_attempt(1);
    store.transition(&started).await.unwrap().unwrap();
    assert!(store.succeed_job(c.id, 2, None).await.unwrap().is_none());
    let done = store.succeed_job(c.id, 1, Some(json!({"test_error": 0.1}))).await.unwrap().unwrap();
    assert_eq!((done.state, done.result), (JobState::Succeeded, Some(json!({"test_error": 0.1}))));
    assert!(store.live_assignments().await.unwrap().is_empty());
    assert!(store.fail_placement(c.id, 1, "late", true).await.unwrap().is_none(), "an ended job stays ended");

    // Stop (a study's search): the running placement ends `stopped` (its delivered ranks marked preempted,
    // to checkpoint and stop, as a preemption's; its pending ones cancelled), not queued again; a stale attempt changes nothing; resumed, it is queued as a stopped job's
    // second life, and a stopped job that is queued again is not "active" for a second stop.
    let d = submit(&store, new_job(&team, "d", 0)).await;
    store.start_job(d.id, "s", lease, &[rank(0)]).await.unwrap().unwrap();
    let started = Transition::new(d.id, JobState::Scheduled, JobState::Running, "ranks started").at_attempt(1);
    store.transition(&started).await.unwrap().unwrap();
    assert!(store.stop_job(d.id, 2, "stale").await.unwrap().is_none());
    let stopped = store.stop_job(d.id, 1, "not among the best").await.unwrap().unwrap();
    assert_eq!(stopped.state, JobState::Stopped);
    assert!(stopped.finished_at.is_some() && stopped.lease_owner.is_none(), "{stopped:?}");
    assert!(store.live_assignments().await.unwrap().is_empty(), "its pending rank was cancelled with it");
    let events = store.list_events(d.id, 0, 10).await.unwrap();
    assert!(events.last().unwrap().reason.as_deref().unwrap().ends_with("stopped: not among the best"));
    assert!(store.stop_job(d.id, 1, "again").await.unwrap().is_none(), "an ended job stays ended");
    let resumed = store.resume_job(d.id, "promoted").await.unwrap().unwrap();
    assert_eq!((resumed.state, resumed.finished_at), (JobState::Queued, None));
    assert!(store.stop_job(d.id, 1, "queued").await.unwrap().is_none(), "a queued job has no placement to stop");
}

fn point(kind: &str, rank: i32, iteration: i64, attempt: i32, loss: f64) -> MetricPoint {
    let fields = json!({"loss": loss, "lr": 0.1}).as_object().unwrap().clone();
    MetricPoint { kind: kind.into(), rank, epoch: iteration / 10, iteration, attempt, fields }
}

async fn metrics_deduplicate_across_attempts(store: Arc<dyn Store>) {
    let team = team(&store).await;
    let job = submit(&store, new_job(&team, "m", 0)).await;
    let first: Vec<MetricPoint> = (0..30).map(|i| point("iteration", 0, i, 1, 1.0)).collect();
    store.record_metrics(job.id, &first).await.unwrap();
    // Attempt 2 resumes from iteration 20 and re-reports 20..40; an old attempt-1 straggler for 25 arrives late.
    let second: Vec<MetricPoint> = (20..40).map(|i| point("iteration", 0, i, 2, 2.0)).collect();
    store.record_metrics(job.id, &second).await.unwrap();
    store.record_metrics(job.id, &[point("iteration", 0, 25, 1, 9.0)]).await.unwrap();
    // Duplicates inside one batch keep the last.
    store.record_metrics(job.id, &[point("epoch", 0, 9, 2, 5.0), point("epoch", 0, 9, 2, 6.0)]).await.unwrap();
    let query = MetricsQuery { kind: Some("iteration".into()), stride: 1, limit: 1000, ..Default::default() };
    let points = store.query_metrics(job.id, &query).await.unwrap();
    assert_eq!(points.len(), 40, "no double counting");
    assert_eq!(points[19].fields["loss"], 1.0);
    assert_eq!(points[25].fields["loss"], 2.0, "the newer attempt wins; the stale one is ignored");
    assert_eq!(points[25].attempt, 2);
    assert_eq!(store.count_metrics(job.id, &query).await.unwrap(), 40);
    let epoch = MetricsQuery { kind: Some("epoch".into()), stride: 1, limit: 10, ..Default::default() };
    assert_eq!(store.query_metrics(job.id, &epoch).await.unwrap()[0].fields["loss"], 6.0);
    // Large batches are chunked.
    let many: Vec<MetricPoint> = (0..2000).map(|i| point("iteration", 1, i, 1, 0.5)).collect();
    assert_eq!(store.record_metrics(job.id, &many).await.unwrap(), 2000);
    // How far each rank's reports reached (what a resumed placement's checkpoint is chosen by).
    let mut progress = store.reported_progress(job.id).await.unwrap();
    progress.sort_by_key(|p| p.rank);
    assert_eq!(
        progress,
        [
            RankProgress { rank: 0, newest_iteration: Some(39), epochs: 1 },
            RankProgress { rank: 1, newest_iteration: Some(1999), epochs: 0 },
        ]
    );
    assert!(store.reported_progress(JobId::new()).await.unwrap().is_empty());
    let downsampled = MetricsQuery { rank: Some(1), stride: 100, limit: 1000, ..Default::default() };
    let points = store.query_metrics(job.id, &downsampled).await.unwrap();
    assert_eq!(points.iter().map(|p| p.iteration).collect::<Vec<_>>(), (0..2000).step_by(100).collect::<Vec<_>>());
    // a series' newest points first, and pages after a cursor both ways
    let newest = MetricsQuery { kind: Some("iteration".into()), rank: Some(0), newest_first: true, ..query.clone() };
    let newest = store.query_metrics(job.id, &MetricsQuery { limit: 2, ..newest }).await.unwrap();
    assert_eq!(newest.iter().map(|p| p.iteration).collect::<Vec<_>>(), [39, 38]);
    let after = MetricsQuery { after: Some(("iteration".into(), 38, 0)), rank: Some(0), limit: 5, ..query.clone() };
    let later = store.query_metrics(job.id, &after).await.unwrap();
    assert_eq!(later.iter().map(|p| p.iteration).collect::<Vec<_>>(), [39]);
    let before = MetricsQuery { newest_first: true, ..after };
    let earlier = store.query_metrics(job.id, &before).await.unwrap();
    assert_eq!(earlier.iter().map(|p| p.iteration).collect::<Vec<_>>(), [37, 36, 35, 34, 33]);
    let other_kind = MetricsQuery { after: Some(("epoch".into(), 99, 0)), rank: Some(0), limit: 2, ..query.clone() };
    let from_start = store.query_metrics(job.id, &other_kind).await.unwrap();
    assert_eq!(from_start.iter().map(|p| p.iteration).collect::<Vec<_>>(), [0, 1], "`epoch` sorts before `iteration`");

    // Downsampled with a kind: the first report at or after every stride-th iteration of the series, paged.
    let iterations = |points: &[MetricPoint]| points.iter().map(|p| p.iteration).collect::<Vec<_>>();
    let rank_1 = MetricsQuery { rank: Some(1), ..query.clone() };
    let (points, stride) = store.downsample_metrics(job.id, &rank_1, 20).await.unwrap();
    assert_eq!(stride, 100);
    assert_eq!(iterations(&points), (0..2000).step_by(100).collect::<Vec<_>>());
    let page = MetricsQuery { limit: 5, ..rank_1.clone() };
    let (first, _) = store.downsample_metrics(job.id, &page, 20).await.unwrap();
    let cursor = first.last().map(|p| (p.kind.clone(), p.iteration, p.rank));
    let (second, _) = store.downsample_metrics(job.id, &MetricsQuery { after: cursor, ..page }, 20).await.unwrap();
    assert_eq!(iterations(&second), [500, 600, 700, 800, 900]);
    // a thinned series (every 8th iteration kept) gives the reports nearest after each step
    let thinned: Vec<MetricPoint> = (0..100).map(|i| point("iteration", 2, i * 8, 1, 0.5)).collect();
    store.record_metrics(job.id, &thinned).await.unwrap();
    let rank_2 = MetricsQuery { rank: Some(2), ..query.clone() };
    let (points, stride) = store.downsample_metrics(job.id, &rank_2, 30).await.unwrap();
    assert_eq!(stride, 27, "793 iterations in 30 steps");
    let expected: Vec<i64> = (0..30).map(|k| (k * 27 + 7) / 8 * 8).filter(|&i| i <= 792).collect();
    assert_eq!(iterations(&points), expected);
    // without a kind: every stride-th report of each series, as before
    let all_kinds = MetricsQuery { rank: Some(1), stride: 1, limit: 1000, ..Default::default() };
    let (points, stride) = store.downsample_metrics(job.id, &all_kinds, 20).await.unwrap();
    assert_eq!((stride, points.len()), (100, 20));
}

async fn idempotent_submits_race_to_one_job(store: Arc<dyn Store>) {
    let team = team(&store).await;
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let store = store.clone();
        let job = new_job(&team, "same", 0);
        tasks.push(tokio::spawn(async move {
            let key = IdempotencyKey { key: "k".into(), request_hash: "h".into() };
            store.submit_job(job, Some(key)).await.unwrap()
        }));
    }
    let mut created = 0;
    let mut ids = HashSet::new();
    for task in tasks {
        match task.await.unwrap() {
            Submitted::Created(job) => {
                created += 1;
                ids.insert(job.id);
            }
            Submitted::Replayed(job) => {
                ids.insert(job.id);
            }
            Submitted::KeyReused => panic!("same hash"),
        }
    }
    assert_eq!((created, ids.len()), (1, 1));
    let all = store.list_jobs(team.id, &JobFilter { limit: 100, ..Default::default() }).await.unwrap();
    assert_eq!(all.len(), 1);
    let key = IdempotencyKey { key: "k".into(), request_hash: "other".into() };
    assert!(matches!(store.submit_job(new_job(&team, "x", 0), Some(key)).await.unwrap(), Submitted::KeyReused));
}

async fn tokens_teams_and_readiness(store: Arc<dyn Store>) {
    store.ready().await.unwrap();
    let team = team(&store).await;
    assert!(matches!(
        store.create_team(NewTeam { name: "t".into(), gpu_quota: 0, cpu_quota: 0, storage_quota_bytes: None }).await,
        Err(StoreError::Conflict(_))
    ));
    let token = generate_token();
    let info = store
        .create_token(NewToken {
            token_hash: hash_token(&token),
            role: Role::Viewer,
            team_id: Some(team.id),
            platform: false,
            label: None,
            expires_at: None,
        })
        .await
        .unwrap();
    assert_eq!(store.find_token(&hash_token(&token)).await.unwrap(), Some(info));
    assert_eq!(store.find_token(&hash_token("nope")).await.unwrap(), None);
    assert_eq!(store.get_team_by_name("t").await.unwrap().unwrap().cpu_quota, 4);
}

/// A pass looks at the first jobs of each team's queue of each kind (by priority, then submission), all in
/// one list by priority then submission; a job that starts leaves its place to the next.
async fn the_queue_window_is_per_team_and_kind(store: Arc<dyn Store>) {
    let one = team(&store).await;
    let two = store
        .create_team(NewTeam { name: "u".into(), gpu_quota: 1, cpu_quota: 4, storage_quota_bytes: None })
        .await
        .unwrap();
    let job =
        |team: &Team, name: &str, priority: i32, device: DeviceKind| NewJob { device, ..new_job(team, name, priority) };
    let mut submitted = Vec::new();
    for (team, name, priority, device) in [
        (&one, "one-cpu-a", 0, DeviceKind::Cpu),
        (&one, "one-cpu-b", 5, DeviceKind::Cpu),
        (&one, "one-cpu-c", 0, DeviceKind::Cpu),
        (&one, "one-gpu-a", 1, DeviceKind::Gpu),
        (&two, "two-cpu-a", 2, DeviceKind::Cpu),
        (&two, "two-cpu-b", 2, DeviceKind::Cpu),
        (&two, "two-cpu-c", 9, DeviceKind::Cpu),
    ] {
        submitted.push(submit(&store, job(team, name, priority, device)).await);
    }
    let names = |jobs: Vec<Job>| jobs.into_iter().map(|j| j.name.unwrap_or_default()).collect::<Vec<_>>();
    assert_eq!(
        names(store.list_queued(2).await.unwrap()),
        ["two-cpu-c", "one-cpu-b", "two-cpu-a", "one-gpu-a", "one-cpu-a"],
        "each team's and kind's first two, by priority then submission"
    );
    let one_cpu_b = &submitted[1];
    store.start_job(one_cpu_b.id, "sched", Duration::from_secs(30), &[]).await.unwrap().unwrap();
    assert_eq!(
        names(store.list_queued(2).await.unwrap()),
        ["two-cpu-c", "two-cpu-a", "one-gpu-a", "one-cpu-a", "one-cpu-c"],
        "a started job is no longer queued, and the next of its queue takes its place"
    );
    assert_eq!(store.list_queued(10).await.unwrap().len(), 6);
}

async fn chosen_claims_queue_view_and_lost_nodes(store: Arc<dyn Store>) {
    let team = team(&store).await;
    let a = submit(&store, new_job(&team, "a", 0)).await;
    let b = submit(&store, new_job(&team, "b", 3)).await;
    let queue: Vec<JobId> = store.list_queued(10).await.unwrap().iter().map(|j| j.id).collect();
    assert_eq!(queue, vec![b.id, a.id]);
    // The policy may pick the lower-priority job (it fits); a second start of it gets nothing.
    let claimed = store.start_job(a.id, "sched", Duration::from_secs(30), &[]).await.unwrap().unwrap().0;
    assert_eq!((claimed.state, claimed.attempt), (JobState::Scheduled, 1));
    assert!(store.start_job(a.id, "other", Duration::from_secs(30), &[]).await.unwrap().is_none());
    assert_eq!(store.list_queued(10).await.unwrap().len(), 1);
    assert_eq!(store.list_events(a.id, 0, 10).await.unwrap().len(), 2);

    let agent = store
        .create_token(NewToken {
            token_hash: hash_token("agent"),
            role: Role::Agent,
            team_id: None,
            platform: false,
            label: None,
            expires_at: None,
        })
        .await
        .unwrap();
    let devices =
        vec![NewDevice { index: 0, kind: DeviceKind::Gpu, name: "H100".into(), memory_bytes: Some(80 << 30) }];
    let node =
        store.register_node(agent.id, NodeRegistration { name: "n1".into(), address: None, devices }).await.unwrap();
    let b_rank = NewAssignment { node_id: node.id, device_id: node.devices[0].id, rank: 0 };
    let (_, placed) = store.start_job(b.id, "sched", Duration::from_secs(30), &[b_rank]).await.unwrap().unwrap();
    assert_eq!(store.live_assignments().await.unwrap().len(), 1);
    let (pending, delivered) = (AssignmentState::Pending, AssignmentState::Delivered);
    assert!(store.set_assignment_state(placed[0].id, pending, delivered).await.unwrap());
    assert!(!store.set_assignment_state(placed[0].id, pending, delivered).await.unwrap(), "guarded");
    assert_eq!(store.cancel_pending_assignments(b.id).await.unwrap(), 0, "delivered ranks wait for their agent");
    let live = [AssignmentState::Pending, AssignmentState::Delivered, AssignmentState::Running];
    assert_eq!(store.node_assignments(node.id, &live).await.unwrap().len(), 1);
    assert_eq!(store.end_node_assignments(node.id, AssignmentState::Failed).await.unwrap(), 1);
    assert!(store.live_assignments().await.unwrap().is_empty());
    assert_eq!(store.get_assignment(placed[0].id).await.unwrap().unwrap().state, AssignmentState::Failed);

    assert!(store.mark_lost_nodes(now() - chrono::Duration::seconds(60)).await.unwrap().is_empty());
    assert_eq!(store.mark_lost_nodes(now() + chrono::Duration::seconds(1)).await.unwrap(), vec![node.id]);
    assert_eq!(store.get_node(node.id).await.unwrap().unwrap().state, NodeState::Lost);
    assert!(store.heartbeat(node.id, agent.id).await.unwrap());
    assert_eq!(store.get_node(node.id).await.unwrap().unwrap().state, NodeState::Up);

    // set aside, the first reason kept, then lifted
    assert!(store.set_quarantine(node.id, Some("its self-test failed: matmul")).await.unwrap());
    assert!(!store.set_quarantine(node.id, Some("again")).await.unwrap(), "already set aside");
    let aside = store.get_node(node.id).await.unwrap().unwrap();
    assert_eq!(aside.quarantine.as_deref(), Some("its self-test failed: matmul"));
    assert!(aside.quarantined_at.is_some());
    assert!(store.set_quarantine(node.id, None).await.unwrap());
    assert!(!store.set_quarantine(node.id, None).await.unwrap(), "not set aside");
    let lifted = store.list_nodes().await.unwrap().into_iter().find(|n| n.id == node.id).unwrap();
    assert_eq!((lifted.quarantine, lifted.quarantined_at), (None, None));
}

/// A node of `slots` CPU devices registered under a fresh agent token.
async fn cpu_node(store: &Arc<dyn Store>, name: &str, slots: i32) -> (TokenInfo, Node) {
    let agent = store
        .create_token(NewToken {
            token_hash: hash_token(name),
            role: Role::Agent,
            team_id: None,
            platform: false,
            label: None,
            expires_at: None,
        })
        .await
        .unwrap();
    let devices = (0..slots)
        .map(|index| NewDevice { index, kind: DeviceKind::Cpu, name: format!("slot {index}"), memory_bytes: None })
        .collect();
    let node =
        store.register_node(agent.id, NodeRegistration { name: name.into(), address: None, devices }).await.unwrap();
    (agent, node)
}

async fn starts_are_atomic_and_preemptions_keep_the_restart_budget(store: Arc<dyn Store>) {
    let team = team(&store).await;
    let (agent, node) = cpu_node(&store, "n1", 2).await;
    let ranks = |devices: &[usize]| -> Vec<NewAssignment> {
        devices
            .iter()
            .enumerate()
            .map(|(rank, &d)| NewAssignment { node_id: node.id, device_id: node.devices[d].id, rank: rank as i32 })
            .collect()
    };
    let a = submit(&store, new_job(&team, "a", 0)).await;
    let b = submit(&store, new_job(&team, "b", 0)).await;
    let lease = Duration::from_secs(30);
    let (started, placed) = store.start_job(a.id, "sched", lease, &ranks(&[0])).await.unwrap().unwrap();
    assert_eq!((started.state, started.attempt, placed.len()), (JobState::Scheduled, 1, 1));
    assert!(store.start_job(a.id, "sched", lease, &ranks(&[1])).await.unwrap().is_none(), "not queued any more");

    // Device 0 is busy: b's start fails as a whole and b stays queued with its attempt untouched.
    let busy = store.start_job(b.id, "sched", lease, &ranks(&[1, 0])).await;
    assert!(matches!(busy, Err(StoreError::Conflict(_))), "{busy:?}");
    let b_now = store.get_job(b.id).await.unwrap().unwrap();
    assert_eq!((b_now.state, b_now.attempt), (JobState::Queued, 0));
    assert_eq!(store.live_assignments().await.unwrap().len(), 1);

    // Leases are renewed by heartbeats of the nodes holding live ranks.
    assert_eq!(store.renew_node_leases(node.id, Duration::from_secs(600)).await.unwrap(), 1);
    let renewed = store.get_job(a.id).await.unwrap().unwrap().lease_expires.unwrap();
    assert!(renewed > now() + chrono::Duration::seconds(500));

    // Rank 0's endpoint is recorded on its (delivered) assignment only.
    assert!(!store.set_assignment_endpoint(placed[0].id, "10.0.0.1:4000").await.unwrap(), "still pending");
    let (pending, delivered) = (AssignmentState::Pending, AssignmentState::Delivered);
    assert!(store.set_assignment_state(placed[0].id, pending, delivered).await.unwrap());
    assert!(store.set_assignment_endpoint(placed[0].id, "10.0.0.1:4000").await.unwrap());
    assert_eq!(store.get_assignment(placed[0].id).await.unwrap().unwrap().endpoint.as_deref(), Some("10.0.0.1:4000"));

    // A preemption requeues without spending the restart budget; a stale attempt changes nothing.
    assert!(store.preempt_job(a.id, 7, "stale").await.unwrap().is_none());
    let preempted = store.preempt_job(a.id, 1, "reclaimed").await.unwrap().unwrap();
    assert_eq!((preempted.state, preempted.attempt, preempted.preemptions), (JobState::Queued, 1, 1));
    assert_eq!(preempted.user_attempt(), 0);
    assert!(preempted.lease_owner.is_none());
    let events = store.list_events(a.id, 0, 10).await.unwrap();
    assert!(events.last().unwrap().reason.as_deref().unwrap().contains("preempted: reclaimed"), "{events:?}");
    assert_eq!(events.last().unwrap().from_state.as_deref(), Some("scheduled"));
    // Its delivered rank keeps the device until the agent says it stopped.
    assert_eq!(store.live_assignments().await.unwrap().len(), 1);
    assert!(store.set_assignment_state(placed[0].id, delivered, AssignmentState::Cancelled).await.unwrap());

    let (again, _) = store.start_job(a.id, "sched", lease, &ranks(&[0, 1])).await.unwrap().unwrap();
    assert_eq!((again.attempt, again.user_attempt()), (2, 1), "the placement counter moves, the user's attempt not");
    assert!(again.may_restart());
    assert_eq!(store.active_jobs().await.unwrap().iter().map(|j| j.id).collect::<Vec<_>>(), vec![a.id]);
    let _ = agent;
}

/// An agent restarted with fewer devices (a dead GPU, fewer CPU slots) re-registers its node: the devices
/// it no longer offers are gone from the node and the pool; offering one again brings it back (same id).
async fn re_registering_replaces_the_device_list(store: Arc<dyn Store>) {
    let (agent, four) = cpu_node(&store, "n", 4).await;
    let register = |slots: i32| {
        let devices = (0..slots)
            .map(|index| NewDevice { index, kind: DeviceKind::Cpu, name: format!("slot {index}"), memory_bytes: None })
            .collect();
        NodeRegistration { name: "n".into(), address: None, devices }
    };
    let two = store.register_node(agent.id, register(2)).await.unwrap();
    assert_eq!(two.devices.len(), 2);
    assert_eq!(store.list_nodes().await.unwrap()[0].devices.len(), 2);
    let three = store.register_node(agent.id, register(3)).await.unwrap();
    assert_eq!(
        three.devices.iter().map(|d| d.id).collect::<Vec<_>>(),
        four.devices[..3].iter().map(|d| d.id).collect::<Vec<_>>()
    );
}

/// Unplaceable marks are set and cleared for many jobs in one call, only on queued jobs, keeping each job's
/// first `since`; the largest device memory counts only devices in service of the kind asked.
async fn marks_many_unplaceable_and_reads_the_largest_memory(store: Arc<dyn Store>) {
    let team = team(&store).await;
    let jobs = [submit(&store, new_job(&team, "a", 0)).await, submit(&store, new_job(&team, "b", 0)).await];
    let started = submit(&store, new_job(&team, "c", 0)).await;
    store.start_job(started.id, "owner", Duration::from_secs(60), &[]).await.unwrap().unwrap();
    let all = [jobs[0].id, jobs[1].id, started.id];
    store.mark_unplaceable(&all, Some("too large")).await.unwrap();
    let marked = |id| {
        let store = store.clone();
        async move { store.get_job(id).await.unwrap().unwrap().unplaceable }
    };
    let first = marked(jobs[0].id).await.expect("marked");
    assert_eq!(first.reason, "too large");
    assert!(marked(jobs[1].id).await.is_some());
    assert!(marked(started.id).await.is_none(), "no longer queued: untouched");
    store.mark_unplaceable(&all, Some("still too large")).await.unwrap();
    let again = marked(jobs[0].id).await.expect("marked");
    assert_eq!((again.reason.as_str(), again.since), ("still too large", first.since), "the first since is kept");
    store.mark_unplaceable(&[jobs[0].id], None).await.unwrap();
    assert!(marked(jobs[0].id).await.is_none());
    assert!(marked(jobs[1].id).await.is_some(), "only the job named is cleared");

    assert_eq!(store.largest_device_memory(DeviceKind::Gpu).await.unwrap(), None);
    let (agent, _) = cpu_node(&store, "n", 2).await;
    assert_eq!(store.largest_device_memory(DeviceKind::Cpu).await.unwrap(), None, "no device says");
    let device = |index, kind, memory| NewDevice { index, kind, name: format!("d{index}"), memory_bytes: memory };
    let devices = vec![
        device(0, DeviceKind::Gpu, Some(80 << 30)),
        device(1, DeviceKind::Gpu, Some(40 << 30)),
        device(2, DeviceKind::Cpu, Some(1 << 30)),
    ];
    store.register_node(agent.id, NodeRegistration { name: "n".into(), address: None, devices }).await.unwrap();
    assert_eq!(store.largest_device_memory(DeviceKind::Gpu).await.unwrap(), Some(80 << 30));
    assert_eq!(store.largest_device_memory(DeviceKind::Cpu).await.unwrap(), Some(1 << 30));
    // re-registered without the 80 GiB one: it is retired, and no longer counts
    let devices = vec![device(1, DeviceKind::Gpu, Some(40 << 30))];
    store.register_node(agent.id, NodeRegistration { name: "n".into(), address: None, devices }).await.unwrap();
    assert_eq!(store.largest_device_memory(DeviceKind::Gpu).await.unwrap(), Some(40 << 30));
}

/// A failure report that arrives after the job was placed again changes nothing, and never cancels the new
/// placement's ranks.
async fn a_late_report_leaves_the_next_placement_alone(store: Arc<dyn Store>) {
    let team = team(&store).await;
    let (_, node) = cpu_node(&store, "n", 1).await;
    let job = submit(&store, new_job(&team, "a", 0)).await;
    let rank = [NewAssignment { node_id: node.id, device_id: node.devices[0].id, rank: 0 }];
    let lease = Duration::from_secs(30);
    let (first, placed) = store.start_job(job.id, "sched", lease, &rank).await.unwrap().unwrap();
    assert!(store.fail_placement(job.id, first.attempt, "boom", true).await.unwrap().is_some());
    // the first placement's rank was never picked up: cancelled with it, so the device is free again
    assert_eq!(store.get_assignment(placed[0].id).await.unwrap().unwrap().state, AssignmentState::Cancelled);
    let (second, next) = store.start_job(job.id, "sched", lease, &rank).await.unwrap().unwrap();
    assert_eq!(second.attempt, first.attempt + 1);
    assert!(store.fail_placement(job.id, first.attempt, "boom again", true).await.unwrap().is_none());
    assert!(store.preempt_job(job.id, first.attempt, "stale").await.unwrap().is_none());
    assert_eq!(store.get_assignment(next[0].id).await.unwrap().unwrap().state, AssignmentState::Pending);
}

/// Preemptions and failure reports succeed while another connection writes metrics as fast as it can (on
/// SQLite a transaction that read before writing failed at once with SQLITE_BUSY_SNAPSHOT then).
async fn placements_end_cleanly_under_concurrent_writes(store: Arc<dyn Store>) {
    let team = team(&store).await;
    let (_, node) = cpu_node(&store, "n", 1).await;
    let noisy = submit(&store, new_job(&team, "noisy", 0)).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn({
        let (store, stop) = (store.clone(), stop.clone());
        async move {
            let mut iteration = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let point = MetricPoint {
                    kind: "iteration".into(),
                    rank: 0,
                    epoch: 0,
                    iteration,
                    attempt: 1,
                    fields: serde_json::Map::new(),
                };
                store.record_metrics(noisy.id, &[point]).await.unwrap();
                iteration += 1;
            }
        }
    });
    let job = submit(&store, NewJob { max_restarts: 100, ..new_job(&team, "a", 0) }).await;
    let rank = [NewAssignment { node_id: node.id, device_id: node.devices[0].id, rank: 0 }];
    for round in 0..20 {
        let (placed, ranks) = store.start_job(job.id, "sched", Duration::from_secs(30), &rank).await.unwrap().unwrap();
        let ended = if round % 2 == 0 {
            store.preempt_job(job.id, placed.attempt, "reclaimed").await
        } else {
            store.fail_placement(job.id, placed.attempt, "boom", true).await
        };
        assert!(ended.unwrap_or_else(|err| panic!("round {round}: {err}")).is_some());
        // free the device for the next round (a preempted pending rank is cancelled with the placement)
        let state = store.get_assignment(ranks[0].id).await.unwrap().unwrap().state;
        assert_eq!(state, AssignmentState::Cancelled, "round {round}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
}

ringtrain_store::on_both_backends!(
    setup = crate::store;
    marks_many_unplaceable_and_reads_the_largest_memory,
    re_registering_replaces_the_device_list,
    a_late_report_leaves_the_next_placement_alone,
    placements_end_cleanly_under_concurrent_writes,
    guarded_transitions_refuse_stale_writers,
    concurrent_starts_never_share_a_job,
    leases_renew_and_expire,
    named_operations_end_placements_in_one_step,
    metrics_deduplicate_across_attempts,
    idempotent_submits_race_to_one_job,
    tokens_teams_and_readiness,
    chosen_claims_queue_view_and_lost_nodes,
    the_queue_window_is_per_team_and_kind,
    starts_are_atomic_and_preemptions_keep_the_restart_budget,
);

/// The listener behind the servers' token caches (Postgres only: SQLite has one server and nothing to hear).
/// It says when it listens, hears a revocation only once it commits and a change as a change, and says it
/// lost the connection before it listens again: a cache that trusted it in between could miss a revocation.
#[sqlx::test(migrations = false)]
async fn the_listener_hears_revocations_and_says_when_it_stops(pool: sqlx::PgPool) {
    let store: Arc<dyn Store> = Arc::new(PgStore::from_pool(pool.clone()).await.unwrap());
    let (heard, mut notices) = tokio::sync::mpsc::unbounded_channel();
    let listening = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .listen(Box::new(move |notice| {
                    let _ = heard.send(notice);
                }))
                .await
        }
    });
    let next = async |notices: &mut tokio::sync::mpsc::UnboundedReceiver<Notice>| {
        tokio::time::timeout(Duration::from_secs(10), notices.recv()).await.expect("heard within 10 s").unwrap()
    };
    assert_eq!(next(&mut notices).await, Notice::Listening);

    let team = team(&store).await;
    let new_token = || NewToken {
        token_hash: hash_token(&generate_token()),
        role: Role::Member,
        team_id: Some(team.id),
        platform: false,
        label: None,
        expires_at: None,
    };
    let token = store.create_token(new_token()).await.unwrap();
    assert!(store.revoke_token(token.id, now()).await.unwrap());
    assert_eq!(next(&mut notices).await, Notice::TokenRevoked);
    // revoking a revoked token revokes nothing and announces nothing: the next notice is the change
    assert!(!store.revoke_token(token.id, now()).await.unwrap());
    store.bump_change_version().await.unwrap();
    assert_eq!(next(&mut notices).await, Notice::Changed);

    // the listener's connection is cut (a database restart, a network blip)
    let cut: Vec<(bool,)> = sqlx::query_as(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN%'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(cut, vec![(true,)], "one listening connection");
    assert_eq!(next(&mut notices).await, Notice::Lost);
    assert_eq!(next(&mut notices).await, Notice::Listening);
    let again = store.create_token(new_token()).await.unwrap();
    assert!(store.revoke_token(again.id, now()).await.unwrap());
    assert_eq!(next(&mut notices).await, Notice::TokenRevoked);
    listening.abort();
}
