//! Hosts of their own (issue 30, item 1): agents each in a Linux network namespace with its own address on
//! a bridge, and the server on the bridge's address over TLS. A job's three ranks run one per host, so its
//! ring and rank 0's rendezvous cross the bridge between real addresses (rank 0 is never on the server's
//! host); the same job with one host's link limited to 4 Mbit/s (`tc tbf` on its end of the bridge) slows
//! down and still succeeds. A host cut off by `nft` for longer than the lease is written off, its job
//! resumes elsewhere from its checkpoint, and once healed the host is used again. Needs root (namespaces,
//! links, qdiscs, nftables), as CI here has.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{
    assert_complete_series, fashion_mnist, fresh_postgres_database, scratch, start_server, Api, Process, TestCa,
    ADMIN_TOKEN,
};

const LONG: Duration = Duration::from_secs(300);

/// `ip ARGS`, which must succeed.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip (iproute2) runs");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// A bridge on this machine (10.77.S.1) and `count` hosts, each a network namespace at 10.77.S.(10 + i)
/// joined to it by a veth pair; all removed when dropped.
struct Hosts {
    tag: u32,
    subnet: u32,
    count: u32,
}

impl Hosts {
    fn create(count: u32) -> Hosts {
        let pid = std::process::id();
        let hosts = Hosts { tag: pid % 10_000, subnet: 20 + pid % 200, count };
        hosts.remove();
        let bridge = hosts.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&["addr", "add", &format!("{}/24", hosts.gateway()), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        for i in 1..=count {
            let (namespace, inside, outside) = (hosts.namespace(i), format!("rt{}v{i}", hosts.tag), hosts.link(i));
            ip(&["netns", "add", &namespace]);
            ip(&["link", "add", &inside, "type", "veth", "peer", "name", &outside]);
            ip(&["link", "set", &outside, "master", &bridge]);
            ip(&["link", "set", &outside, "up"]);
            ip(&["link", "set", &inside, "netns", &namespace]);
            ip(&["-n", &namespace, "addr", "add", &format!("{}/24", hosts.address(i)), "dev", &inside]);
            ip(&["-n", &namespace, "link", "set", &inside, "up"]);
            ip(&["-n", &namespace, "link", "set", "lo", "up"]);
        }
        hosts
    }

    fn bridge(&self) -> String {
        format!("rtb{}", self.tag)
    }

    fn namespace(&self, i: u32) -> String {
        format!("rt{}h{i}", self.tag)
    }

    /// Host `i`'s end of its link, on the bridge: a qdisc here shapes what reaches the host.
    fn link(&self, i: u32) -> String {
        format!("rt{}p{i}", self.tag)
    }

    fn gateway(&self) -> String {
        format!("10.77.{}.1", self.subnet)
    }

    fn address(&self, i: u32) -> String {
        format!("10.77.{}.{}", self.subnet, 10 + i)
    }

    fn remove(&self) {
        for i in 1..=self.count {
            let _ = Command::new("ip").args(["netns", "del", &self.namespace(i)]).stderr(Stdio::null()).status();
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge()]).stderr(Stdio::null()).status();
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.remove();
    }
}

/// An agent of one CPU slot on host `i`, in its namespace, at its own address.
fn start_agent(hosts: &Hosts, i: u32, server: &str, token: &str, ca: &TestCa, dir: &Path) -> Process {
    let token_file = dir.join(format!("host{i}.token"));
    std::fs::write(&token_file, token).unwrap();
    std::fs::set_permissions(&token_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let agent = Command::new("ip")
        .args(["netns", "exec", &hosts.namespace(i), env!("CARGO_BIN_EXE_ringtrain"), "agent", "--server", server])
        .arg("--ca-cert")
        .arg(&ca.ca_cert)
        .arg("--token-file")
        .arg(&token_file)
        .args(["--name", &format!("host{i}"), "--address", &hosts.address(i), "--gpus", "none", "--cpus", "1"])
        .args(["--heartbeat-s", "1", "--work-dir"])
        .arg(dir.join(format!("host{i}")))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start an agent in its namespace");
    Process(agent)
}

/// The server on the bridge's address over TLS (its certificate for that address, from a test CA) and an
/// agent of one slot on each of `count` hosts, all up. Fields drop in order: agents, then the server, then
/// the hosts.
struct Pool {
    _agents: Vec<Process>,
    _server: Process,
    api: Api,
    hosts: Hosts,
}

impl Pool {
    async fn start(name: &str, count: u32) -> Pool {
        assert!(ringtrain_sandbox::probe().root, "network namespaces need root (ip netns)");
        let hosts = Hosts::create(count);
        let dir = scratch(name);
        let ca = TestCa::make_for(&dir, &[&hosts.gateway()]);
        let db = fresh_postgres_database(name).await;
        let (server, url) = start_server(&format!("{}:0", hosts.gateway()), &db, &dir, Some(&ca));
        assert!(url.starts_with(&format!("https://{}:", hosts.gateway())), "{url}");
        let api = Api::with_ca(&url, ADMIN_TOKEN, Some(&ca.ca_cert));
        let mut agents = Vec::new();
        for i in 1..=count {
            let token = api.post("/v1/agent-tokens", json!({"label": format!("host{i}")})).await;
            agents.push(start_agent(&hosts, i, &url, token["token"].as_str().unwrap(), &ca, &dir));
        }
        api.wait_for("/v1/nodes", LONG, "every host up", |nodes| {
            nodes["nodes"].as_array().is_some_and(|n| n.iter().filter(|n| n["state"] == "up").count() == count as usize)
        })
        .await;
        Pool { _agents: agents, _server: server, api, hosts }
    }
}

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
    let mut child = Command::new("ip")
        .args(["netns", "exec", &hosts.namespace(i), "nft"])
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
    let folder = std::fs::read_link(format!("/proc/{}/cwd", pids[0])).unwrap();
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

    let id = api.submit(&fashion_mnist("partition", 2, 6000, 4)).await;
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
