//! Slurm for real: a cluster of three hosts, each a network namespace running its own slurmd
//! (tests/support/slurm.rs).
//!
//! ringtrain's Slurm client (`ringtrain_slurm`): one Slurm job of a placement spans the three hosts, each
//! task on its own host and address; a job that does not fit waits with Slurm's own reason; the grace
//! signal reaches the running job; one that can never run as asked, or that names an unknown partition,
//! is said so in Slurm's words; and cancelling leaves nothing in Slurm's queue.
//!
//! The agent as a Slurm step (`srun ringtrain agent --slurm`): agents Slurm started on its three hosts
//! register with a server through the bridge, a job of 3 ranks is placed on them and trains across the
//! hosts to the very result the same spec gives on agents given whole to ringtrain, and the allocation goes
//! back to Slurm once they are idle.
//!
//! The Slurm pool (`serve --slurm-partition`): the server asks Slurm for the nodes a waiting job lacks and
//! the job trains there; a job Slurm holds pending says so with Slurm's reason, and cancelling it cancels
//! its Slurm job; one too large fails at once; Slurm's grace signal checkpoints the job, which resumes
//! where it stopped on the next Slurm job; a node going DOWN is a lost agent, and the job resumes on the
//! others from its checkpoint.

use std::path::Path;
use std::time::{Duration, Instant};

use ringtrain_slurm::{BatchJob, JobState, SlurmError, SlurmJob};
use serde_json::{json, Value};
use support::slurm::SlurmCluster;
use support::{assert_complete_series, fashion_mnist, fresh_postgres_database, Cluster};

mod support;

/// A job of `nodes` whole hosts (2 CPUs each) running `script`.
fn job(cluster: &SlurmCluster, dir: &Path, comment: &str, nodes: u32, script: String) -> BatchJob {
    BatchJob {
        name: "ringtrain-test".into(),
        partition: Some(cluster.partition.clone()),
        account: None,
        nodes,
        tasks_per_node: 1,
        cpus_per_task: Some(2),
        gpus_per_node: None,
        time_limit_minutes: Some(10),
        grace_seconds: Some(60),
        comment: comment.into(),
        output: Some(dir.join("slurm-%j.out")),
        script,
    }
}

/// Any Slurm job `id` (whatever its comment) once `ready` holds of it (within 60 s).
async fn wait_for_any(cluster: &SlurmCluster, id: u64, what: &str, ready: impl Fn(&SlurmJob) -> bool) -> SlurmJob {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(job) = cluster.slurm().jobs("").await.unwrap().into_iter().find(|j| j.id == id) {
            if ready(&job) {
                return job;
            }
        }
        assert!(Instant::now() < deadline, "job {id} is not {what} after 60 s (logs in {})", cluster.dir().display());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Slurm's job `id` once `ready` holds of it (within 60 s).
async fn wait_for(cluster: &SlurmCluster, id: u64, what: &str, ready: impl Fn(&SlurmJob) -> bool) -> SlurmJob {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let jobs = cluster.slurm().jobs("ringtrain:").await.unwrap();
        if let Some(job) = jobs.into_iter().find(|j| j.id == id) {
            if ready(&job) {
                return job;
            }
            assert!(
                Instant::now() < deadline,
                "job {id} is not {what} after 60 s: {job:?} (logs in {})",
                cluster.dir().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slurm_job_spans_the_hosts_waits_with_slurms_reason_takes_the_signal_and_leaves_nothing_when_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = SlurmCluster::start(dir.path(), 3, 2);
    let slurm = cluster.slurm();

    // a placement's job: one task per host, each told its place by Slurm's environment; then it waits for
    // the grace signal, as ranks do
    let (tasks, signalled) = (dir.path().join("tasks"), dir.path().join("signalled"));
    let script = format!(
        "#!/bin/sh\ntrap 'echo USR1 > {signalled}; exit 0' USR1\n\
         srun sh -c 'echo \"$SLURM_PROCID $SLURM_NTASKS $SLURMD_NODENAME $(hostname -I)\"' > {tasks}\n\
         sleep 120 &\nwait\n",
        signalled = signalled.display(),
        tasks = tasks.display()
    );
    let first = slurm.submit(&job(&cluster, dir.path(), "ringtrain:job-a:1", 3, script)).await.unwrap();
    let running = wait_for(&cluster, first, "running", |j| j.state == JobState::Running).await;
    assert_eq!((running.nodes.as_str(), running.reason.as_deref()), ("h[1-3]", None), "{running:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&tasks).map_or(0, |t| t.lines().count()) < 3 {
        assert!(Instant::now() < deadline, "the three tasks did not report (logs in {})", cluster.dir().display());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut lines: Vec<String> = std::fs::read_to_string(&tasks).unwrap().lines().map(str::to_string).collect();
    lines.sort();
    for (rank, line) in lines.iter().enumerate() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let host = rank as u32 + 1;
        assert_eq!(
            fields,
            [rank.to_string().as_str(), "3", format!("h{host}").as_str(), cluster.hosts.address(host).as_str()],
            "task {rank} runs on host {host}, at its own address: {lines:?}"
        );
    }

    // the cluster is full: a second placement waits, with Slurm's reason in ringtrain's words
    let second = slurm
        .submit(&job(&cluster, dir.path(), "ringtrain:job-b:1", 3, "#!/bin/sh\nsrun sleep 120\n".into()))
        .await
        .unwrap();
    let waiting =
        wait_for(&cluster, second, "waiting for resources", |j| j.reason.as_deref() == Some("Resources")).await;
    assert_eq!(waiting.waiting_reason().as_deref(), Some("waiting in Slurm: Resources"));
    assert_eq!(waiting.never_runs(), None);

    // the grace signal reaches the running job's script (and steps); it ends, and the second starts
    slurm.signal(first, "USR1").await.unwrap();
    wait_for(&cluster, first, "over", |j| !j.state.is_active()).await;
    assert_eq!(std::fs::read_to_string(&signalled).unwrap_or_default().trim(), "USR1");
    wait_for(&cluster, second, "running", |j| j.state == JobState::Running).await;

    // asking for more hosts than the partition has: Slurm keeps it pending for ever, ringtrain says why
    let too_big =
        slurm.submit(&job(&cluster, dir.path(), "ringtrain:job-c:1", 5, "#!/bin/sh\ntrue\n".into())).await.unwrap();
    let never = wait_for(&cluster, too_big, "judged never to run", |j| j.never_runs().is_some()).await;
    let why = never.never_runs().unwrap();
    assert!(why.contains("Partition") && why.contains("partition cpu"), "{why}");

    // an unknown partition is refused at once, in Slurm's words
    let mut nowhere = job(&cluster, dir.path(), "ringtrain:job-d:1", 1, "#!/bin/sh\ntrue\n".into());
    nowhere.partition = Some("nowhere".into());
    match slurm.submit(&nowhere).await {
        Err(SlurmError::Refused(message)) => assert!(message.contains("Invalid partition"), "{message}"),
        other => panic!("an unknown partition is refused: {other:?}"),
    }

    // cancelled, nothing of ringtrain's is left in Slurm's queue
    for id in [second, too_big] {
        slurm.cancel(id).await.unwrap();
    }
    for id in [second, too_big] {
        let ended = wait_for(&cluster, id, "cancelled", |j| !j.state.is_active()).await;
        assert_eq!(ended.state, JobState::Cancelled, "{ended:?}");
    }
    let active: Vec<SlurmJob> =
        slurm.jobs("ringtrain:").await.unwrap().into_iter().filter(|j| j.state.is_active()).collect();
    assert!(active.is_empty(), "{active:?}");
    assert!(cluster.run("squeue", &["-h"]).trim().is_empty());
}

/// Once Slurm's queue is empty (within `seconds`).
async fn wait_for_empty_queue(cluster: &SlurmCluster, seconds: u64) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while !cluster.run("squeue", &["-h"]).trim().is_empty() {
        assert!(Instant::now() < deadline, "Slurm jobs left: {}", cluster.run("squeue", &["-h"]));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The nodes of the server whose names are `names`, with their states and addresses.
async fn nodes(ringtrain: &Cluster, names: &[String]) -> Vec<Value> {
    let nodes = ringtrain.api.get("/v1/nodes").await;
    let all = nodes["nodes"].as_array().unwrap().clone();
    names.iter().filter_map(|name| all.iter().find(|n| n["name"] == name.as_str()).cloned()).collect()
}

/// A new agent token.
async fn agent_token(ringtrain: &Cluster, label: &str) -> String {
    ringtrain.api.post("/v1/agent-tokens", json!({"label": label})).await["token"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn ranks_on_agents_slurm_started_train_across_its_hosts_to_the_result_of_agents_given_whole() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = SlurmCluster::start(dir.path(), 3, 2);
    let db = fresh_postgres_database("slurm").await;
    // the server listens on the bridge, where the hosts reach it (plain HTTP on this private bridge: the
    // agents are told it is trusted)
    let mut ringtrain = Cluster::serve_on("slurm", &db, &format!("{}:0", cluster.hosts.gateway())).await;

    // one agent token per node of the allocation, in node order; each step's agent takes its own line
    let mut tokens = String::new();
    for i in 1..=3 {
        tokens.push_str(&agent_token(&ringtrain, &format!("slurm h{i}")).await);
        tokens.push('\n');
    }
    let token_file = dir.path().join("tokens");
    std::fs::write(&token_file, tokens).unwrap();
    std::fs::set_permissions(&token_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let script = format!(
        "#!/bin/sh\nexec srun {} agent --slurm --allow-insecure-http --server {} --token-file {} --heartbeat-s 1 --exit-when-idle-s 5\n",
        env!("CARGO_BIN_EXE_ringtrain"),
        ringtrain.url,
        token_file.display()
    );
    let mut placement = job(&cluster, dir.path(), "ringtrain:agents:1", 3, script);
    placement.cpus_per_task = Some(1);
    let slurm_job = cluster.slurm().submit(&placement).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while ringtrain.api.get("/v1/nodes").await["nodes"].as_array().map_or(0, Vec::len) < 3 {
        let output = std::fs::read_to_string(dir.path().join(format!("slurm-{slurm_job}.out"))).unwrap_or_default();
        assert!(
            Instant::now() < deadline,
            "the steps' agents did not register in 60 s; the Slurm job's output:\n{output}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ringtrain.wait_for_nodes(3).await;
    let names: Vec<String> = (1..=3).map(|i| format!("slurm-{slurm_job}-h{i}")).collect();
    for (i, node) in (1..=3).zip(nodes(&ringtrain, &names).await) {
        assert_eq!(node["address"], cluster.hosts.address(i).as_str(), "the step's agent is on its host: {node}");
        assert_eq!(node["devices"].as_array().map(Vec::len), Some(1), "one CPU slot, Slurm's allocation: {node}");
    }

    let api = ringtrain.team("slurm", 3).await;
    let spec = fashion_mnist("through slurm", 3, 3000, 1);
    let id = api.submit(&spec).await;
    let through_slurm = api.wait_state(&id, "succeeded", Duration::from_secs(300)).await;
    let events = api.get(&format!("/v1/jobs/{id}/events")).await;
    let placed = events["events"][1]["reason"].as_str().unwrap_or_default().to_string();
    assert!(placed.contains("3 device(s) of 3 node(s)"), "one rank on each host: {placed}");
    let total = through_slurm["effective"]["total_iterations"].as_i64().unwrap();
    assert_complete_series(&api.metrics(&id, "iteration").await, 3, total);

    // idle, the agents leave and the allocation goes back to Slurm
    let over = wait_for(&cluster, slurm_job, "over", |j| !j.state.is_active()).await;
    assert_eq!(over.state, JobState::Completed, "{over:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while nodes(&ringtrain, &names).await.iter().any(|n| n["state"] == "up") {
        assert!(Instant::now() < deadline, "the steps' nodes are still up a minute after their agents left");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // the same spec on agents given whole to ringtrain: the same result
    for i in 1..=3 {
        let token = agent_token(&ringtrain, &format!("whole {i}")).await;
        ringtrain.start_agent(&format!("whole{i}"), &token, 1);
    }
    ringtrain.wait_for_nodes(3).await;
    let mut same = spec.clone();
    same["name"] = json!("on agents");
    let id = api.submit(&same).await;
    let on_agents = api.wait_state(&id, "succeeded", Duration::from_secs(300)).await;
    let (a, b) = (&through_slurm["result"]["final_test_error"], &on_agents["result"]["final_test_error"]);
    eprintln!("3 ranks, MLP on 3,000 Fashion-MNIST images: final test error {a} through Slurm, {b} on agents");
    assert_eq!(a, b, "through Slurm and on agents: the same result");
}

/// The agent tokens a Slurm pool made, and whether each is revoked.
async fn pool_tokens(ringtrain: &Cluster) -> Vec<(String, bool)> {
    let tokens = ringtrain.api.get("/v1/agent-tokens").await;
    tokens["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["label"].as_str().is_some_and(|l| l.starts_with("slurm pool:")))
        .map(|t| (t["label"].as_str().unwrap().to_string(), !t["revoked_at"].is_null()))
        .collect()
}

/// A server with no agents whose Slurm pool asks `cluster` for CPU nodes of 2 slots (at most 3 per job,
/// 10 minutes), its agents heartbeating every second and leaving after 5 s idle.
async fn serve_with_pool(cluster: &SlurmCluster, dir: &Path, name: &str) -> Cluster {
    let db = fresh_postgres_database(name).await;
    for (variable, value) in [
        ("RINGTRAIN_SLURM_PARTITION", cluster.partition.clone()),
        ("RINGTRAIN_SLURM_DEVICE", "cpu".into()),
        ("RINGTRAIN_SLURM_DEVICES_PER_NODE", "2".into()),
        ("RINGTRAIN_SLURM_MAX_NODES", "3".into()),
        ("RINGTRAIN_SLURM_TIME_MINUTES", "10".into()),
        ("RINGTRAIN_SLURM_CONF", cluster.conf.display().to_string()),
        ("RINGTRAIN_SLURM_DIR", dir.join("pool").display().to_string()),
        ("RINGTRAIN_SLURM_AGENT_COMMAND", env!("CARGO_BIN_EXE_ringtrain").into()),
        ("RINGTRAIN_SLURM_AGENT_ARGS", "--heartbeat-s 1 --exit-when-idle-s 5".into()),
    ] {
        std::env::set_var(variable, value);
    }
    Cluster::serve_on(name, &db, &format!("{}:0", cluster.hosts.gateway())).await
}

/// A Slurm pool: a server with no agents of its own, told to ask Slurm for CPU nodes (2 slots each). A
/// 3-rank job gets one Slurm job of 2 nodes running the agent, trains on them with a complete metric
/// series, and the allocation goes back once the agents are idle (their tokens revoked). A job that the
/// busy cluster cannot take now waits with Slurm's reason in its pending reason, and cancelling it
/// cancels its Slurm job; one larger than the pool's largest Slurm job fails at once, saying so.
#[tokio::test(flavor = "multi_thread")]
async fn a_slurm_pool_asks_slurm_for_the_nodes_a_job_lacks_and_gives_them_back() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = SlurmCluster::start(dir.path(), 3, 2);
    let ringtrain = serve_with_pool(&cluster, dir.path(), "slurmpool").await;
    let api = ringtrain.team("slurm", 6).await;

    // another user's job holds two of the three hosts
    let other = job(&cluster, dir.path(), "someone else", 2, "#!/bin/sh\nsrun sleep 600\n".into());
    let other = cluster.slurm().submit(&other).await.unwrap();
    wait_for_any(&cluster, other, "running", |j| j.state == JobState::Running).await;

    // 3 ranks and no agent: one Slurm job of 2 nodes of 2 CPUs, named by the job's id, which waits in
    // Slurm; the job says so in Slurm's words
    let spec = fashion_mnist("through the pool", 3, 6000, 2);
    let id = api.submit(&spec).await;
    let job = api
        .wait_job(&id, Duration::from_secs(60), "waiting in Slurm", |job| {
            job["pending_reason"]["slurm"]["reason"].as_str().is_some_and(|r| r == "Resources")
        })
        .await;
    let message = job["pending_reason"]["message"].as_str().unwrap();
    assert!(message.contains("waiting in Slurm: Resources"), "{message}");
    let slurm_job = job["pending_reason"]["slurm"]["job"].as_u64().unwrap();
    // its estimate is Slurm's expected start (squeue --start): when the other job's 10 minutes are up
    let job = api
        .wait_job(&id, Duration::from_secs(60), "Slurm's expected start", |job| job["estimated_start"]["kind"] == "at")
        .await;
    let basis = job["estimated_start"]["basis"].as_str().unwrap();
    assert!(basis.contains(&format!("Slurm job {slurm_job}")) && basis.contains("squeue --start"), "{basis}");
    let seconds = job["estimated_start"]["seconds"].as_f64().unwrap();
    assert!((300.0..=600.0).contains(&seconds), "within the other job's 10 minutes: {seconds} s");
    let ours = cluster.slurm().jobs(&format!("ringtrain:{id}")).await.unwrap();
    assert_eq!(ours.iter().map(|j| j.id).collect::<Vec<_>>(), [slurm_job], "one Slurm job, named by the job's id");

    // another waits too; cancelled, its Slurm job goes with it
    let waiting = api.submit(&fashion_mnist("cancelled while waiting", 3, 3000, 1)).await;
    let job = api
        .wait_job(&waiting, Duration::from_secs(60), "waiting in Slurm", |job| {
            job["pending_reason"]["slurm"]["job"].is_u64()
        })
        .await;
    let pending_id = job["pending_reason"]["slurm"]["job"].as_u64().unwrap();
    api.post(&format!("/v1/jobs/{waiting}/cancel"), json!({})).await;
    let cancelled = wait_for(&cluster, pending_id, "cancelled", |j| !j.state.is_active()).await;
    assert_eq!(cancelled.state, JobState::Cancelled, "{cancelled:?}");

    // more than 3 nodes of 2: never
    let too_large = api.submit(&fashion_mnist("too large", 8, 3000, 1)).await;
    let failed = api.wait_state(&too_large, "failed", Duration::from_secs(30)).await;
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("the Slurm pool's largest job is 6 (3 nodes of 2)"), "{error}");

    // the other user's job ends: the pool's Slurm job starts, its agents register and the job runs there
    cluster.slurm().cancel(other).await.unwrap();
    wait_for(&cluster, slurm_job, "running", |j| j.state == JobState::Running).await;

    // the first job trains on the pool's nodes to its end; idle, its agents leave, and so does its allocation
    let done = api.wait_state(&id, "succeeded", Duration::from_secs(300)).await;
    let total = done["effective"]["total_iterations"].as_i64().unwrap();
    assert_complete_series(&api.metrics(&id, "iteration").await, 3, total);
    let events = api.get(&format!("/v1/jobs/{id}/events")).await;
    let placed = events["events"][1]["reason"].as_str().unwrap_or_default().to_string();
    assert!(placed.contains("3 device(s) of 2 node(s)"), "the pool's two nodes: {placed}");
    let over = wait_for(&cluster, slurm_job, "over", |j| !j.state.is_active()).await;
    assert_eq!(over.state, JobState::Completed, "{over:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let tokens = pool_tokens(&ringtrain).await;
        if tokens.len() >= 4 && tokens.iter().all(|(_, revoked)| *revoked) {
            break;
        }
        assert!(Instant::now() < deadline, "the pool's agent tokens are still valid: {tokens:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(cluster.run("squeue", &["-h"]).trim().is_empty(), "nothing left in Slurm's queue");

    // a maintenance reservation of every host for an hour: a job waits with Slurm's reason for it
    // (22.05's squeue --json says ReqNodeNotAvail, its text adds "Reserved for maintenance"), expected to
    // start when the reservation ends, and its cancel leaves nothing in Slurm
    let reserve = ["create", "reservation", "reservationname=maint", "starttime=now", "duration=60", "nodes=ALL"];
    cluster.run("scontrol", &[&reserve[..], &["users=root", "flags=maint"]].concat());
    let held = api.submit(&fashion_mnist("behind a reservation", 2, 1000, 1)).await;
    let job = api
        .wait_job(&held, Duration::from_secs(60), "waiting for the reservation", |job| {
            job["pending_reason"]["slurm"]["reason"] == "ReqNodeNotAvail" && job["estimated_start"]["kind"] == "at"
        })
        .await;
    let message = job["pending_reason"]["message"].as_str().unwrap();
    assert!(message.ends_with("; waiting in Slurm: ReqNodeNotAvail"), "{message}");
    let seconds = job["estimated_start"]["seconds"].as_f64().unwrap();
    assert!((3000.0..=3600.0).contains(&seconds), "when the hour's reservation ends: {seconds} s");
    api.post(&format!("/v1/jobs/{held}/cancel"), json!({})).await;
    wait_for_empty_queue(&cluster, 30).await;
}

/// Slurm's grace signal before a time limit (`--signal=USR1@N`, sent here at once with `scancel
/// --signal=USR1`): the pool's agents have their ranks checkpoint and stop, and leave; the job goes back to
/// the queue, the pool asks Slurm for nodes again, and the job resumes from that checkpoint where it
/// stopped: nothing trained twice, nothing lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_slurm_jobs_grace_signal_checkpoints_the_job_which_resumes_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = SlurmCluster::start(dir.path(), 3, 2);
    let ringtrain = serve_with_pool(&cluster, dir.path(), "slurmgrace").await;
    let api = ringtrain.team("slurm", 6).await;
    let mut spec = fashion_mnist("stopped by slurm", 2, 12000, 2);
    spec["model"] = json!({"name": "lenet5"});
    let id = api.submit(&spec).await;
    api.wait_job(&id, Duration::from_secs(120), "training", |job| {
        job["progress"]["iterations_done"].as_i64() > Some(20)
    })
    .await;
    let first = cluster.slurm().jobs(&format!("ringtrain:{id}")).await.unwrap();
    let first = first.iter().find(|j| j.state == JobState::Running).expect("the job's Slurm job runs").id;
    cluster.slurm().signal(first, "USR1").await.unwrap();

    // the first Slurm job ends once its agents left; the job runs again on a second one and succeeds
    let over = wait_for(&cluster, first, "over", |j| !j.state.is_active()).await;
    assert_eq!(over.state, JobState::Completed, "the agents left on their own: {over:?}");
    let done = api.wait_state(&id, "succeeded", Duration::from_secs(300)).await;
    let placements = done["placements"].as_array().unwrap();
    let events = api.get(&format!("/v1/jobs/{id}/events")).await;
    let logs = api.get(&format!("/v1/jobs/{id}/logs?q=rank")).await;
    assert_eq!(placements.len(), 2, "stopped once, resumed once: {placements:?}\nevents: {events}\nlogs: {logs}");
    assert_eq!(placements[0]["iterations_lost"], 0, "the stop checkpointed where it stopped: {placements:?}");
    let resumed = placements[1]["resumed_from_iteration"].as_i64().unwrap();
    assert!(resumed > 20, "resumed mid-run, not from the start: {placements:?}");
    let total = done["effective"]["total_iterations"].as_i64().unwrap();
    assert!(resumed < total);
    assert_complete_series(&api.metrics(&id, "iteration").await, 2, total);
    let ours = cluster.slurm().jobs(&format!("ringtrain:{id}")).await.unwrap();
    assert!(ours.iter().any(|j| j.id != first), "the pool asked Slurm again: {ours:?}");
}

/// Waits for 3-rank job `id` to succeed after `what` cost it its agents: placed again, resumed from a
/// checkpoint (not from the start), its metric series complete. Its events.
/// Waits until the job trains its second epoch and the server holds its first epoch's checkpoint: the
/// agent registers a rank's checkpoint on its next tick, so an interruption right at the epoch's start
/// could otherwise find none and the job would (correctly) start over.
async fn past_its_first_checkpoint(api: &support::Api, id: &str, timeout: Duration) {
    api.wait_job(id, timeout, "its second epoch", |job| job["progress"]["epoch"].as_i64() >= Some(1)).await;
    api.wait_for(&format!("/v1/jobs/{id}/checkpoints"), Duration::from_secs(60), "its first checkpoint", |list| {
        list["checkpoints"].as_array().is_some_and(|c| !c.is_empty())
    })
    .await;
}

async fn succeeds_resumed_from_a_checkpoint(api: &support::Api, id: &str, what: &str) -> Value {
    let done = api.wait_state(id, "succeeded", Duration::from_secs(400)).await;
    let placements = done["placements"].as_array().unwrap();
    let events = api.get(&format!("/v1/jobs/{id}/events")).await;
    assert!(placements.len() >= 2, "placed again after {what}: {placements:?}\nevents: {events}");
    let resumed = placements.last().unwrap()["resumed_from_iteration"].as_i64().unwrap();
    assert!(resumed > 0, "resumed from a checkpoint, not from the start: {placements:?}");
    let total = done["effective"]["total_iterations"].as_i64().unwrap();
    assert_complete_series(&api.metrics(id, "iteration").await, 3, total);
    events
}

/// A LeNet-5 job that may be stopped and lose nodes (5 restarts) and still learn (lr 0.02).
fn interruptible(name: &str, workers: u32, train: u32, epochs: u32) -> Value {
    let mut spec = fashion_mnist(name, workers, train, epochs);
    spec["model"] = json!({"name": "lenet5"});
    spec["lr"]["base"] = json!(0.02);
    spec["max_restarts"] = json!(5);
    spec
}

/// A node going DOWN in Slurm mid-training is a lost agent to the job: Slurm ends the job's Slurm job, the
/// server finds the nodes lost and queues the job again, the pool asks Slurm for nodes among those left,
/// and the job resumes from its newest checkpoint to the end, its metric series complete.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_going_down_in_slurm_is_a_lost_agent_and_the_job_resumes_on_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = SlurmCluster::start(dir.path(), 3, 2);
    let ringtrain = serve_with_pool(&cluster, dir.path(), "slurmdown").await;
    let api = ringtrain.team("slurm", 6).await;
    let id = api.submit(&interruptible("a node goes down", 3, 9000, 3)).await;
    // past its first checkpoint (an epoch), on 2 of the 3 hosts
    past_its_first_checkpoint(&api, &id, Duration::from_secs(180)).await;
    let first = running_slurm_job(&cluster, &id).await;
    let host = if first.nodes.contains('2') { "h2" } else { "h1" };
    cluster.run("scontrol", &["update", &format!("nodename={host}"), "state=down", "reason=ringtrain-test"]);

    let events = succeeds_resumed_from_a_checkpoint(&api, &id, "the node went down").await;
    let lost = events.to_string();
    assert!(lost.contains("was lost") || lost.contains("killed"), "the node's loss is in the job's events: {events}");
    let jobs = cluster.slurm().jobs(&format!("ringtrain:{id}")).await.unwrap();
    assert!(jobs.iter().any(|j| j.id != first.id), "the pool asked Slurm again: {jobs:?}");
}

/// Slurm's own preemption (`PreemptMode=CANCEL`: a job of the higher-tier `urgent` partition wants every
/// host) ends the pool's Slurm job, its agents and ranks killed: to the ringtrain job it is a lost agent.
/// It is queued again, the pool asks Slurm for nodes, and once the urgent job is over it resumes from its
/// newest checkpoint, its metric series complete.
#[tokio::test(flavor = "multi_thread")]
async fn slurms_own_preemption_is_a_lost_agent_and_the_job_resumes_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = SlurmCluster::start(dir.path(), 3, 2);
    let ringtrain = serve_with_pool(&cluster, dir.path(), "slurmpreempt").await;
    let api = ringtrain.team("slurm", 6).await;
    let id = api.submit(&interruptible("preempted by Slurm", 3, 9000, 3)).await;
    past_its_first_checkpoint(&api, &id, Duration::from_secs(180)).await;
    let first = running_slurm_job(&cluster, &id).await;

    let urgent = BatchJob {
        partition: Some("urgent".into()),
        ..job(&cluster, dir.path(), "urgent", 3, "#!/bin/sh\nsrun sleep 20\n".into())
    };
    cluster.slurm().submit(&urgent).await.unwrap();
    let preempted = wait_for(&cluster, first.id, "preempted", |j| !j.state.is_active()).await;
    assert!(matches!(preempted.state, JobState::Preempted | JobState::Cancelled), "Slurm preempted it: {preempted:?}");

    succeeds_resumed_from_a_checkpoint(&api, &id, "Slurm's preemption").await;
    wait_for_empty_queue(&cluster, 60).await;
}

/// A ringtrain reclaim on a Slurm pool: team a borrows team b's idle share on nodes the pool got from
/// Slurm for it; b's job takes b's guarantee back, so a's job checkpoints and stops (ringtrain's preemption:
/// the Slurm job keeps running, its agents stay), b's job runs on the devices it gave back, and a's job
/// resumes where it stopped once they are free again: nothing trained twice, and Slurm's queue ends empty.
#[tokio::test(flavor = "multi_thread")]
async fn a_ringtrain_reclaim_preempts_a_borrower_on_slurm_nodes_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = SlurmCluster::start(dir.path(), 3, 2);
    let ringtrain = serve_with_pool(&cluster, dir.path(), "slurmreclaim").await;
    let team_a = ringtrain.team("team-a", 2).await;
    let team_b = ringtrain.team("team-b", 4).await;

    // a asks for 4, twice its guarantee: the pool gets 2 nodes of 2 from Slurm, and a borrows b's share
    let mut spec = fashion_mnist("a borrows", 4, 4000, 4);
    spec["model"] = json!({"name": "lenet5"});
    let borrower = team_a.submit(&spec).await;
    team_a.wait_first_checkpoint(&borrower, Duration::from_secs(240)).await;
    let first = cluster.slurm().jobs(&format!("ringtrain:{borrower}")).await.unwrap();
    let first = first.into_iter().find(|j| j.state == JobState::Running).expect("the borrower's Slurm job runs");

    // b wants 2 of its guarantee back
    let claimer = team_b.submit(&fashion_mnist("b reclaims", 2, 1000, 1)).await;
    team_b.wait_state(&claimer, "succeeded", Duration::from_secs(240)).await;
    let resumed = team_a.wait_state(&borrower, "succeeded", Duration::from_secs(400)).await;
    let events = team_a.get(&format!("/v1/jobs/{borrower}/events")).await;
    assert!(resumed["preemptions"].as_i64().unwrap() >= 1, "the borrower was not preempted: {resumed}\n{events}");
    assert!(events.to_string().contains("reclaimed by another team"), "{events}");
    let placements = resumed["placements"].as_array().unwrap();
    // the preempted placement lost nothing (a later placement once failed under the suite's load and was
    // restarted from its checkpoint, 2 of many runs: its own loss is the restart budget's, not the reclaim's)
    for preempted in placements.iter().filter(|p| p["ended"] == "preempted") {
        assert_eq!(preempted["iterations_lost"], 0, "it checkpointed where it stopped: {resumed}\n{events}");
    }
    assert!(placements[1]["resumed_from_iteration"].as_i64() > Some(0), "resumed mid-run: {placements:?}");
    let total = resumed["effective"]["total_iterations"].as_i64().unwrap();
    assert_complete_series(&team_a.metrics(&borrower, "iteration").await, 4, total);

    // the preemption was ringtrain's: the Slurm job it ran on was not cancelled, its agents left once idle
    let over = wait_for(&cluster, first.id, "over", |j| !j.state.is_active()).await;
    assert_eq!(over.state, JobState::Completed, "ringtrain's reclaim leaves the Slurm job be: {over:?}");
    wait_for_empty_queue(&cluster, 60).await;
}

/// The running Slurm job of ringtrain job `id` (its pool's), once there is one (within 120 s).
async fn running_slurm_job(cluster: &SlurmCluster, id: &str) -> SlurmJob {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let jobs = cluster.slurm().jobs(&format!("ringtrain:{id}")).await.unwrap();
        if let Some(running) = jobs.into_iter().find(|j| j.state == JobState::Running) {
            return running;
        }
        assert!(Instant::now() < deadline, "no running Slurm job for {id} (logs in {})", cluster.dir().display());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The long form of the pool tests above, run by hand (the operator guide, "Running on Slurm", names it):
/// one 4-rank run through a pool of three hosts meets Slurm's interruptions in turn — the grace signal in
/// its second epoch, then one of its nodes going DOWN in its fourth — and trains to the final test error
/// of the same spec and seed run through the pool untouched (within 0.5 point), its metric series
/// complete, nothing left in Slurm's queue.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "the long form (about 2 minutes here): cargo nextest run -p ringtrain --test slurm --run-ignored only"]
async fn long_a_run_through_a_slurm_pool_survives_its_interruptions_to_the_result_of_one_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = SlurmCluster::start(dir.path(), 3, 2);
    let ringtrain = serve_with_pool(&cluster, dir.path(), "slurmlong").await;
    let api = ringtrain.team("slurm", 6).await;
    let mut spec = interruptible("left alone", 4, 60000, 6);
    let alone = api.submit(&spec).await;
    let alone = api.wait_state(&alone, "succeeded", Duration::from_secs(1200)).await;
    // its agents gone, so the next job gets a Slurm job of its own
    wait_for_empty_queue(&cluster, 60).await;

    spec["name"] = json!("interrupted");
    let id = api.submit(&spec).await;
    past_its_first_checkpoint(&api, &id, Duration::from_secs(600)).await;
    let first = running_slurm_job(&cluster, &id).await;
    cluster.slurm().signal(first.id, "USR1").await.unwrap();
    wait_for(&cluster, first.id, "over", |j| !j.state.is_active()).await;

    api.wait_job(&id, Duration::from_secs(900), "its fourth epoch", |job| job["progress"]["epoch"].as_i64() >= Some(3))
        .await;
    let second = running_slurm_job(&cluster, &id).await;
    let host = if second.nodes.contains('2') { "h2" } else { "h1" };
    cluster.run("scontrol", &["update", &format!("nodename={host}"), "state=down", "reason=ringtrain-long-test"]);

    let done = api.wait_state(&id, "succeeded", Duration::from_secs(1200)).await;
    let placements = done["placements"].as_array().unwrap();
    let events = api.get(&format!("/v1/jobs/{id}/events")).await;
    assert!(placements.len() >= 3, "stopped, lost a node, resumed each time: {placements:?}\nevents: {events}");
    assert_eq!(placements[0]["iterations_lost"], 0, "the grace signal checkpointed where it stopped: {placements:?}");
    let total = done["effective"]["total_iterations"].as_i64().unwrap();
    assert_complete_series(&api.metrics(&id, "iteration").await, 4, total);
    let (interrupted, untouched) =
        (done["result"]["final_test_error"].as_f64().unwrap(), alone["result"]["final_test_error"].as_f64().unwrap());
    eprintln!("final test error: interrupted {interrupted:.4}, left alone {untouched:.4}");
    assert!((interrupted - untouched).abs() <= 0.005, "interrupted {interrupted} against {untouched} left alone");
    wait_for_empty_queue(&cluster, 60).await;
}
