//! Hosts of their own: agents each in a Linux network namespace with its own address on
//! a bridge, and Postgres and two server replicas on hosts of their own, over TLS (`support::hosts::Pool`).
//! A job's three ranks run one per host, so its ring and rank 0's rendezvous cross the bridge between real
//! addresses (rank 0 is never on a server's host); the same job with one host's link limited to 4 Mbit/s
//! (`tc tbf` on its end of the bridge) slows down and still succeeds. A host cut off by `nft` for longer
//! than the lease is written off, its job resumes elsewhere from its checkpoint, and once healed the host
//! is used again. Needs root (namespaces, links, qdiscs, nftables), as CI here has.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::hosts::{Hosts, Pool};
use support::{assert_complete_series, fashion_mnist, Api};

const LONG: Duration = Duration::from_secs(300);

/// Submits `spec` and waits for it to succeed: the job and the seconds it took.
async fn run_job(api: &Api, spec: &Value) -> (Value, f64) {
    let started = Instant::now();
    let id = api.submit(spec).await;
    let job = api.wait_state(&id, "succeeded", LONG).await;
    (job, started.elapsed().as_secs_f64())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_on_three_hosts_train_across_a_bridge_and_a_slow_link() {
    let pool = Pool::start("multihost", 3).await;
    let (hosts, api) = (&pool.hosts, &pool.api);
    let nodes = api.get("/v1/nodes").await;
    for node in nodes["nodes"].as_array().unwrap() {
        let i: u32 = node["name"].as_str().unwrap().trim_start_matches("host").parse().unwrap();
        assert_eq!(node["address"], hosts.address(i).as_str(), "{node}");
    }

    let (job, free_s) = run_job(api, &fashion_mnist("multihost-free", 3, 3000, 1)).await;
    let id = job["id"].as_str().unwrap();
    let events = api.get(&format!("/v1/jobs/{id}/events")).await;
    let placed = events["events"][1]["reason"].as_str().unwrap();
    assert!(placed.contains("3 device(s) of 3 node(s)"), "{placed}");
    let total = job["effective"]["total_iterations"].as_i64().unwrap();
    assert_complete_series(&api.metrics(id, "iteration").await, 3, total);

    // host 1's link at 4 Mbit/s: every all-reduce crosses it
    let shaped = hosts.link(1);
    let tc = Command::new("tc")
        .args(["qdisc", "add", "dev", &shaped, "root", "tbf", "rate", "4mbit", "burst", "32kbit", "latency", "400ms"])
        .output()
        .unwrap();
    assert!(tc.status.success(), "tc tbf: {}", String::from_utf8_lossy(&tc.stderr));
    let (job, slow_s) = run_job(api, &fashion_mnist("multihost-slow", 3, 3000, 1)).await;
    eprintln!("3 ranks on 3 hosts: {free_s:.1} s; with one host's link at 4 Mbit/s: {slow_s:.1} s");
    assert!(slow_s > free_s, "the limited link did not slow the job ({slow_s:.1} s against {free_s:.1} s)");
    let id = job["id"].as_str().unwrap();
    assert_eq!(job["attempt"], 1, "{job}");
    assert_complete_series(&api.metrics(id, "iteration").await, 3, total);
}

/// Runs `nft` in host `i`'s namespace with `rules` on its standard input.
fn nft(hosts: &Hosts, i: u32, args: &[&str], rules: Option<&str>) {
    use std::io::Write;
    let mut child = hosts
        .command(i, "nft")
        .args(args)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nft (Debian's nftables) runs");
    if let Some(rules) = rules {
        child.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "nft {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Everything into and out of host `i` dropped, but its own loopback.
const PARTITION: &str = "table inet partition {
  chain input { type filter hook input priority 0; policy drop; iif \"lo\" accept; }
  chain output { type filter hook output priority 0; policy drop; oif \"lo\" accept; }
}
";

/// The host (1..) whose agent runs rank `rank` of `job`, from the rank process's folder.
fn host_of_rank(job: &str, rank: u32) -> u32 {
    let pids = support::rank_pids(job, Some(rank));
    let pid = pids.first().unwrap_or_else(|| panic!("rank {rank} of {job} does not run (has the job ended?)"));
    let folder = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap();
    let text = folder.to_string_lossy().into_owned();
    let host = text.split('/').find_map(|part| part.strip_prefix("host")).expect("a host folder");
    host.parse().unwrap()
}

async fn node_state(api: &Api, name: &str) -> String {
    let nodes = api.get("/v1/nodes").await;
    let node = nodes["nodes"].as_array().unwrap().iter().find(|n| n["name"] == name).cloned().unwrap();
    node["state"].as_str().unwrap().to_string()
}

async fn wait_node(api: &Api, name: &str, state: &str, within: Duration) -> f64 {
    let started = Instant::now();
    while node_state(api, name).await != state {
        assert!(started.elapsed() < within, "{name} is not {state} within {within:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    started.elapsed().as_secs_f64()
}

/// A host cut off (`nft` drop rules in its namespace) for longer than the lease: the server declares its
/// node lost after the node timeout, the job's placement fails and resumes from its checkpoint on the hosts
/// left, nothing trained twice; healed, the node comes back up, its agent stops what it still ran of the old
/// placement, and the node is used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_host_is_written_off_its_job_resumes_elsewhere_and_the_healed_host_is_used_again() {
    let pool = Pool::start("partition", 4).await;
    let (hosts, api) = (&pool.hosts, &pool.api);

    // long enough that rank 1 still trains when its host is cut after the first checkpoint (6,000 samples
    // were done in about a second: the job had ended by then once)
    let id = api.submit(&fashion_mnist("partition", 2, 30000, 4)).await;
    api.wait_first_checkpoint(&id, LONG).await;
    let cut = host_of_rank(&id, 1);
    nft(hosts, cut, &["-f", "-"], Some(PARTITION));
    let cut_at = Instant::now();
    eprintln!("host{cut} (rank 1) cut off");
    let lost_after = wait_node(api, &format!("host{cut}"), "lost", Duration::from_secs(60)).await;
    let job = api.wait_state(&id, "succeeded", LONG).await;
    eprintln!("host{cut} lost after {lost_after:.1} s; the job resumed on the others and succeeded");
    assert_eq!(job["attempt"], 2, "one placement failed with the host: {job}");
    let total = job["effective"]["total_iterations"].as_i64().unwrap();

    // held past the lease (30 s): the server has placed the job elsewhere whatever the host's agent does
    let lease = Duration::from_secs(31);
    tokio::time::sleep(lease.saturating_sub(cut_at.elapsed())).await;
    nft(hosts, cut, &["delete", "table", "inet", "partition"], None);
    let back_after = wait_node(api, &format!("host{cut}"), "up", Duration::from_secs(60)).await;
    eprintln!("host{cut} healed: up again after {back_after:.1} s");
    // what the cut-off rank reported just before the cut waited in its agent, which sends it now (the
    // agent keeps a stopped rank's lines for 2 minutes): then every iteration is there once
    let deadline = Instant::now() + Duration::from_secs(60);
    let complete = |points: &[Value]| {
        let by_rank = support::iterations_by_rank(points);
        by_rank.len() == 2 && by_rank.values().all(|series| series.len() as i64 == total)
    };
    while !complete(&api.metrics(&id, "iteration").await) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_complete_series(&api.metrics(&id, "iteration").await, 2, total);
    // and its agent, hearing the server again, stopped what it still ran of the written-off placement
    let deadline = Instant::now() + Duration::from_secs(30);
    while !support::rank_pids(&id, None).is_empty() {
        assert!(Instant::now() < deadline, "ranks of {id} still run on host{cut} after the heal");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // all four hosts, the healed one among them
    let (job, _) = run_job(api, &fashion_mnist("partition-healed", 4, 2000, 1)).await;
    let healed = job["id"].as_str().unwrap();
    let events = api.get(&format!("/v1/jobs/{healed}/events")).await;
    let placed = events["events"][1]["reason"].as_str().unwrap();
    assert!(placed.contains("4 device(s) of 4 node(s)"), "{placed}");
}
