//! Two `ringtrain serve` replicas on one Postgres behind one address, over TLS (issue 30, item 1's failover,
//! on this machine's loopback): kill -9 of the replica that leads the scheduler, and the other takes over
//! within seconds; the agents, which know only the front's address, carry on with it; a job whose two ranks
//! run on two agents, training across the kill, and one submitted after it both succeed exactly once, every
//! metric once.
//!
//! The front stands for what a deployment puts before the replicas (a Kubernetes Service, a TCP load
//! balancer): connections go in turn to the replicas whose `/readyz` answered at the last check, every
//! 250 ms; TLS passes through it to the replicas, which share one certificate.

mod support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use support::{assert_complete_series, fashion_mnist, fresh_postgres_database, Api, Cluster, ADMIN_TOKEN};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const LONG: Duration = Duration::from_secs(300);
/// How soon the surviving replica must schedule: its next pass (every 2 s) takes the advisory lock the
/// killed one's connection held.
const TAKEOVER: Duration = Duration::from_secs(15);

/// One address before several replicas, as a Service or load balancer is.
struct Front {
    url: String,
    tasks: Vec<JoinHandle<()>>,
}

impl Front {
    async fn start(replicas: &[String], ca_cert: &Path) -> Front {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let addresses: Vec<String> = replicas.iter().map(|r| r.trim_start_matches("https://").to_string()).collect();
        let ready = Arc::new(Mutex::new(vec![true; addresses.len()]));
        let checks = tokio::spawn(health_checks(replicas.to_vec(), ca_cert.to_path_buf(), ready.clone()));
        let forwarding = tokio::spawn(async move {
            let mut turn = 0usize;
            loop {
                let Ok((inbound, _)) = listener.accept().await else { continue };
                let candidates: Vec<String> = {
                    let ready = ready.lock().unwrap();
                    (0..addresses.len())
                        .map(|i| (turn + i) % addresses.len())
                        .filter(|i| ready[*i])
                        .map(|i| addresses[i].clone())
                        .collect()
                };
                turn += 1;
                tokio::spawn(forward(inbound, candidates));
            }
        });
        Front { url, tasks: vec![checks, forwarding] }
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn health_checks(replicas: Vec<String>, ca_cert: PathBuf, ready: Arc<Mutex<Vec<bool>>>) {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca_cert).unwrap()).unwrap();
    let http = reqwest::Client::builder().timeout(Duration::from_millis(500)).add_root_certificate(ca).build().unwrap();
    loop {
        for (i, replica) in replicas.iter().enumerate() {
            let up = http.get(format!("{replica}/readyz")).send().await.is_ok_and(|r| r.status().is_success());
            ready.lock().unwrap()[i] = up;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// To the first candidate that takes the connection (one that died since its last check does not).
async fn forward(mut inbound: TcpStream, candidates: Vec<String>) {
    for address in candidates {
        if let Ok(mut outbound) = TcpStream::connect(&address).await {
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            return;
        }
    }
}

/// Waits until a server holds the scheduler's advisory lock on `database_url` (the store's leader lock).
async fn wait_for_a_leader(database_url: &str, within: Duration) {
    use sqlx::Connection;
    let mut connection = sqlx::PgConnection::connect(database_url).await.unwrap();
    let deadline = Instant::now() + within;
    loop {
        let (held,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .fetch_one(&mut connection)
        .await
        .unwrap();
        if held > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "no replica took the scheduler's lock within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_replica_takes_over_when_the_leader_is_killed_and_every_job_succeeds_once() {
    let db = fresh_postgres_database("failover").await;
    // the first replica holds the scheduler's lock before the second starts: it is the leader
    let mut cluster = Cluster::serve_tls("failover", &db, 0, 1).await;
    wait_for_a_leader(&db, Duration::from_secs(10)).await;
    let leader = cluster.url.clone();
    let (_second, second_url) = cluster.start_replica();
    let ca = cluster.ca_cert().unwrap().to_path_buf();
    let front = Front::start(&[leader.clone(), second_url.clone()], &ca).await;
    cluster.url = front.url.clone();
    cluster.api = Api::with_ca(&front.url, ADMIN_TOKEN, Some(&ca));
    // one slot each: the first job's two ranks run on two agents, the second job on the third
    for n in 0..3 {
        let token = cluster.api.post("/v1/agent-tokens", json!({"label": format!("failover node{n}")})).await;
        cluster.start_agent(&format!("node{n}"), token["token"].as_str().unwrap(), 1);
    }
    cluster.wait_for_nodes(3).await;
    // any replica answers any request: the same job from both
    let from_second = Api::with_ca(&second_url, ADMIN_TOKEN, Some(&ca));
    let api = cluster.api.clone();

    let across = api.submit(&fashion_mnist("failover-across", 2, 12000, 3)).await;
    api.wait_first_iteration(&across, LONG).await;
    assert_eq!(from_second.job(&across).await["id"], across.as_str());
    cluster.kill_server();
    let killed = Instant::now();
    eprintln!("killed the leading replica ({leader})");
    // a kept-alive connection the front had given to the killed replica breaks with it (one failed request,
    // as any client of a load balancer sees); a client's next connection goes to the survivor
    let api = Api::with_ca(&front.url, ADMIN_TOKEN, Some(&ca));

    // only the survivor can schedule this one, on the third agent
    let after = api.submit(&fashion_mnist("failover-after", 1, 2000, 1)).await;
    api.wait_job(&after, TAKEOVER, "scheduled by the surviving replica", |job| job["state"] != "queued").await;
    let takeover = killed.elapsed();
    eprintln!("kill -9 of the leader -> the next job scheduled: {:.1} s", takeover.as_secs_f64());
    assert!(takeover < TAKEOVER, "{takeover:?}");

    let events = api.get(&format!("/v1/jobs/{across}/events")).await;
    let placed = events["events"][1]["reason"].as_str().unwrap();
    assert!(placed.contains("2 device(s) of 2 node(s)"), "{placed}");
    for (id, ranks) in [(&across, 2), (&after, 1)] {
        let job = api.wait_state(id, "succeeded", LONG).await;
        // trained on through the failover: never restarted, never preempted
        assert_eq!((job["attempt"].as_i64(), job["preemptions"].as_i64()), (Some(1), Some(0)), "{job}");
        let events = api.get(&format!("/v1/jobs/{id}/events")).await;
        let ended = events["events"].as_array().unwrap().iter().filter(|e| e["to_state"] == "succeeded").count();
        assert_eq!(ended, 1, "{events}");
        let total = job["effective"]["total_iterations"].as_i64().unwrap();
        assert_complete_series(&api.metrics(id, "iteration").await, ranks, total);
    }
}
