//! A flood of hostile callers against the real `ringtrain up` (security finding A1) does not cost a running
//! job its placement. For 20 s, longer than the node timeout (15 s), the server is sent many fast requests
//! without a token or with invented ones, stalled uploads without a token, and stalled JSON bodies with a
//! valid viewer token, more than the users' request slots; the node's agent, heartbeating beside it, keeps
//! its node up and the job trains on to success in its first placement.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{fashion_mnist, Cluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const FLOOD: Duration = Duration::from_secs(20);
/// More stalled viewer bodies than the users' 512 request slots (the server's default).
const SLOW_VIEWERS: usize = 600;
const SLOW_STRANGERS: usize = 150;
const FAST_STRANGERS: usize = 6;

/// How the server answered the flood: status → count (0: the connection closed without an answer).
type Answers = Arc<Mutex<BTreeMap<u16, u64>>>;

/// The head of a request with a `length`-byte body (sent apart, or never).
fn head(method: &str, path: &str, token: Option<&str>, length: usize) -> String {
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    format!(
        "{method} {path} HTTP/1.1\r\nHost: ringtrain\r\n{authorization}Content-Type: application/json\r\n\
         Content-Length: {length}\r\nConnection: close\r\n\r\n"
    )
}

fn count(answers: &Answers, reply: &[u8]) {
    let text = String::from_utf8_lossy(reply);
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    *answers.lock().unwrap().entry(status).or_default() += 1;
}

/// Until `until`: sends the head of a request (and one byte of its body), then a byte a second; once the
/// server answers (or closes), counts the answer and starts again.
async fn trickle(address: String, head: String, until: Instant, answers: Answers) {
    while Instant::now() < until {
        let Ok(mut stream) = TcpStream::connect(&address).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if stream.write_all(format!("{head}{{").as_bytes()).await.is_err() {
            continue;
        }
        let mut reply = [0u8; 512];
        loop {
            let wait = until.saturating_duration_since(Instant::now()).min(Duration::from_secs(1));
            if wait.is_zero() {
                return;
            }
            tokio::select! {
                read = stream.read(&mut reply) => {
                    count(&answers, &reply[..read.unwrap_or(0)]);
                    break;
                }
                () = tokio::time::sleep(wait) => {
                    if stream.write_all(b" ").await.is_err() {
                        break;
                    }
                }
            }
        }
        // a refused caller comes back at once, but not in a loop that only burns this machine's two cores
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Until `until`: short requests, one per connection, without a token or with an invented one.
async fn hammer(address: String, until: Instant, answers: Answers) {
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let invented = format!("rt_{}", uuid::Uuid::new_v4().simple());
        let token = (n % 2 == 0).then_some(invented.as_str());
        if let Ok(mut stream) = TcpStream::connect(&address).await {
            if stream.write_all(head("GET", "/v1/jobs", token, 0).as_bytes()).await.is_ok() {
                let mut reply = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut reply)).await;
                count(&answers, &reply);
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A viewer token of a new team.
async fn viewer(cluster: &Cluster) -> String {
    let team = cluster.api.post("/v1/teams", json!({"name": "onlookers", "gpu_quota": 0, "cpu_quota": 0})).await;
    let path = format!("/v1/teams/{}/tokens", team["id"].as_str().unwrap());
    let token = cluster.api.post(&path, json!({"role": "viewer", "label": "flood"})).await;
    token["token"].as_str().unwrap().to_string()
}

/// Starts every part of the flood; they end by themselves at `until`.
fn flood(address: &str, viewer: &str, until: Instant, answers: &Answers) -> Vec<tokio::task::JoinHandle<()>> {
    let preview = head("POST", "/v1/schedules/preview?dataset_size=1000", Some(viewer), 100_000);
    let upload = head("POST", "/v1/datasets?name=flood", None, 60_000_000);
    let mut tasks = Vec::new();
    for _ in 0..SLOW_VIEWERS {
        tasks.push(tokio::spawn(trickle(address.to_string(), preview.clone(), until, answers.clone())));
    }
    for _ in 0..SLOW_STRANGERS {
        tasks.push(tokio::spawn(trickle(address.to_string(), upload.clone(), until, answers.clone())));
    }
    for _ in 0..FAST_STRANGERS {
        tasks.push(tokio::spawn(hammer(address.to_string(), until, answers.clone())));
    }
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_strangers_and_slow_viewers_does_not_cost_a_running_job_its_placement() {
    let cluster = Cluster::up("flood", 1).await;
    let api = &cluster.api;
    let viewer = viewer(&cluster).await;
    // the viewer's token has been used once, as an attacker's would have been
    let (status, _) = support::Api::new(&cluster.url, &viewer).request(reqwest::Method::GET, "/v1/jobs", None).await;
    assert_eq!(status, 200);
    // LeNet-5 on 6,000 samples for 30 epochs: about 30 s on two cores beside the flood, which starts with
    // its first iteration
    let mut spec = fashion_mnist("flooded", 1, 6000, 30);
    spec["model"] = json!({"name": "lenet5"});
    let id = api.submit(&spec).await;
    api.wait_first_iteration(&id, Duration::from_secs(60)).await;

    let answers = Answers::default();
    let flood_started = chrono::Utc::now();
    let address = cluster.url.trim_start_matches("http://").to_string();
    let tasks = flood(&address, &viewer, Instant::now() + FLOOD, &answers);
    for task in tasks {
        task.await.unwrap();
    }
    let flood_ended = chrono::Utc::now();
    let answers = answers.lock().unwrap().clone();
    eprintln!("the flood's answers (status: count): {answers:?}");
    assert!(answers.get(&429).is_some_and(|&refused| refused > 100), "the flood reached the limits: {answers:?}");

    let job = api.wait_state(&id, "succeeded", Duration::from_secs(120)).await;
    let events: Value = api.get(&format!("/v1/jobs/{id}/events")).await;
    assert_eq!(job["attempt"], 1, "{job}\nevents: {events}");
    assert!(!events.to_string().contains("lost"), "no placement was lost: {events}");
    // the flood kept on past the node timeout while the job ran: without a heartbeat its node was lost
    let finished: chrono::DateTime<chrono::Utc> = job["finished_at"].as_str().unwrap().parse().unwrap();
    let flooded = (finished.min(flood_ended) - flood_started).to_std().unwrap_or_default();
    let node_timeout = ringtrain_protocol::timing::NODE_TIMEOUT;
    eprintln!("the job ran {flooded:?} under the flood, and ended {finished}");
    assert!(flooded > node_timeout + Duration::from_secs(2), "the job ran only {flooded:?} of the flood");
    let nodes = api.get("/v1/nodes").await;
    assert!(nodes["nodes"].as_array().unwrap().iter().all(|n| n["state"] == "up"), "{nodes}");
}
