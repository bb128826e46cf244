//! A real cluster for end-to-end tests: `ringtrain serve` (on a fresh Postgres database) or `ringtrain up`
//! (SQLite), and `ringtrain agent` processes, as child processes on free ports; a small HTTP client; and
//! ways to find and kill rank processes.
//!
//! Over 450 lines because every end-to-end test file shares it: one cluster harness, not one per file.

#![allow(dead_code)]

pub mod hosts;
pub mod s3;
pub mod shards;
pub mod slurm;
pub mod steps;
pub mod webdriver;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const ADMIN_TOKEN: &str = "rt_e2e_admin_token_0123456789abcdef";

/// Kills its process (and waits for it) when dropped, so a failed test leaves nothing running.
#[derive(Debug)]
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ringtrain() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ringtrain"))
}

/// Starts `command`, forwards its stderr to ours, and returns it once a stdout line starts with `marker`,
/// with the rest of that line.
fn start_until(mut command: Command, marker: &str) -> (Process, String) {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("start ringtrain");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let marker = marker.to_string();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if !sent {
                if let Some(rest) = line.strip_prefix(&marker) {
                    let _ = tx.send(rest.trim().to_string());
                    sent = true;
                }
            }
        }
    });
    let rest = rx.recv_timeout(Duration::from_secs(120)).expect("the server printed its address");
    (Process(child), rest)
}

pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringtrain-e2e-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A fresh Postgres database on the server `DATABASE_URL` names (scripts/test.sh sets it; missing is a
/// failure, not a skip).
pub async fn fresh_postgres_database(name: &str) -> String {
    use sqlx::Connection;
    let admin_url = std::env::var("DATABASE_URL").expect("DATABASE_URL must name a Postgres server");
    let mut admin = sqlx::PgConnection::connect(&admin_url).await.expect("connect to DATABASE_URL");
    // Databases this test left in earlier runs go first (only this test uses its prefix).
    let prefix = format!("ringtrain_e2e_{name}_");
    let stale: Vec<(String,)> = sqlx::query_as("SELECT datname FROM pg_database WHERE starts_with(datname, $1)")
        .bind(&prefix)
        .fetch_all(&mut admin)
        .await
        .unwrap();
    for (old,) in stale {
        sqlx::query(&format!("DROP DATABASE IF EXISTS {old} WITH (FORCE)")).execute(&mut admin).await.unwrap();
    }
    let db = format!("{prefix}{}", std::process::id());
    sqlx::query(&format!("CREATE DATABASE {db}")).execute(&mut admin).await.unwrap();
    let (base, _) = admin_url.rsplit_once('/').expect("DATABASE_URL ends in /DATABASE");
    format!("{base}/{db}")
}

#[derive(Debug)]
pub struct Cluster {
    pub url: String,
    pub dir: PathBuf,
    pub api: Api,
    server: Process,
    /// How to start the server again (`restart_server`).
    server_command: Option<(String, String)>,
    agents: Vec<Process>,
    /// Set when the server speaks TLS: the test CA that signed its certificate.
    tls: Option<TestCa>,
}

/// A CA made for one test, and the server certificate it signed (for 127.0.0.1 and localhost), as PEM files.
#[derive(Debug, Clone)]
pub struct TestCa {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

impl TestCa {
    pub fn make(dir: &Path) -> TestCa {
        Self::make_for(dir, &["127.0.0.1", "localhost"])
    }

    /// A CA and a server certificate for `names` (addresses or host names).
    pub fn make_for(dir: &Path, names: &[&str]) -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "ringtrain test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let server_key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        let server = params.signed_by(&server_key, &ca, &ca_key).unwrap();
        let files = TestCa {
            ca_cert: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server-key.pem"),
        };
        std::fs::write(&files.ca_cert, ca.pem()).unwrap();
        std::fs::write(&files.server_cert, server.pem()).unwrap();
        std::fs::write(&files.server_key, server_key.serialize_pem()).unwrap();
        files
    }
}

/// Starts `ringtrain up` on `dir/data`; the process and the address it serves.
fn start_up(dir: &Path, cpus: u32) -> (Process, String) {
    let mut command = ringtrain();
    command
        .args(["up", "--listen", "127.0.0.1:0", "--gpus", "none", "--cpus", &cpus.to_string(), "--data-dir"])
        .arg(dir.join("data"))
        .env("RINGTRAIN_BOOTSTRAP_TOKEN", ADMIN_TOKEN)
        .env("RINGTRAIN_KEEP_CHECKPOINTS", "1000")
        // the elastic test shrinks a job seconds after it started and grows it back seconds later; the
        // minimum run time and the grow interval are tested in the scheduler's own tests
        .env("RINGTRAIN_MIN_RUN_BEFORE_PREEMPTION_SECONDS", "0")
        .env("RINGTRAIN_GROW_INTERVAL_SECONDS", "2")
        // the tests read every iteration's report; the metric budget's thinning is tested in
        // api/src/admission/metric_budget.rs (a fast machine put 4 ranks' reports past 500 a second)
        .env("RINGTRAIN_METRIC_ROWS_PER_SECOND", "0")
        // each rank's CPU and memory every second, not every 10: the tests' jobs last seconds
        .env("RINGTRAIN_SYSTEM_METRICS_S", "1")
        .env("RUST_LOG", "warn");
    let (server, rest) = start_until(command, "ringtrain is up at ");
    let address = rest.split_whitespace().next().unwrap().trim_end_matches(':').to_string();
    (server, address)
}

/// `command` (`ringtrain`, or a wrapper that runs it) with the arguments and environment of `serve`.
fn serve_command(mut command: Command, listen: &str, database_url: &str, dir: &Path, tls: Option<&TestCa>) -> Command {
    command
        .args(["serve", "--listen", listen, "--database-url", database_url, "--data-dir"])
        .arg(dir.join("server"))
        .env("RINGTRAIN_BOOTSTRAP_TOKEN", ADMIN_TOKEN)
        // these tests read a job's whole checkpoint history (the one taken at a preemption among them);
        // retention is tested on its own in api/tests/storage.rs
        .env("RINGTRAIN_KEEP_CHECKPOINTS", "1000")
        // the reclaim test preempts a job seconds after it started; the minimum run time before a preemption
        // (thrash protection) is tested in api/tests/scheduling.rs
        .env("RINGTRAIN_MIN_RUN_BEFORE_PREEMPTION_SECONDS", "0")
        // every iteration's report is read (see `start_up`)
        .env("RINGTRAIN_METRIC_ROWS_PER_SECOND", "0")
        .env("RUST_LOG", "warn,ringtrain_api::scheduling=info");
    if let Some(tls) = tls {
        command.arg("--tls-cert").arg(&tls.server_cert).arg("--tls-key").arg(&tls.server_key);
    }
    command
}

impl Cluster {
    /// `ringtrain serve` on `database_url` with `nodes` agents of `cpus` CPU slots each.
    pub async fn serve(name: &str, database_url: &str, nodes: usize, cpus: u32) -> Cluster {
        Self::serve_with(name, database_url, nodes, cpus, false).await
    }

    /// The same over HTTPS: the server with a certificate of a test CA, agents and clients trusting it.
    pub async fn serve_tls(name: &str, database_url: &str, nodes: usize, cpus: u32) -> Cluster {
        Self::serve_with(name, database_url, nodes, cpus, true).await
    }

    /// `ringtrain serve` on `database_url` listening on `listen` (an address other hosts reach, e.g. a
    /// bridge's), with no agent of its own.
    pub async fn serve_on(name: &str, database_url: &str, listen: &str) -> Cluster {
        Self::serve_listening(name, database_url, listen, 0, 0, false).await
    }

    async fn serve_with(name: &str, database_url: &str, nodes: usize, cpus: u32, tls: bool) -> Cluster {
        Self::serve_listening(name, database_url, "127.0.0.1:0", nodes, cpus, tls).await
    }

    async fn serve_listening(
        name: &str,
        database_url: &str,
        listen: &str,
        nodes: usize,
        cpus: u32,
        tls: bool,
    ) -> Cluster {
        let dir = scratch(name);
        let tls = tls.then(|| TestCa::make(&dir));
        let (server, address) =
            start_until(serve_command(ringtrain(), listen, database_url, &dir, tls.as_ref()), "listening on ");
        let api = Api::with_ca(&address, ADMIN_TOKEN, tls.as_ref().map(|t| t.ca_cert.as_path()));
        let listen = address.trim_start_matches("http://").trim_start_matches("https://").to_string();
        let server_command = Some((listen, database_url.to_string()));
        let mut cluster = Cluster { url: address, dir, api, server, server_command, agents: Vec::new(), tls };
        for n in 0..nodes {
            cluster.add_node(&format!("node{n}"), cpus, &[]).await;
        }
        cluster.wait_for_nodes(nodes).await;
        cluster
    }

    /// Starts an agent of `cpus` CPU slots named `name`, with `extra` arguments, on a token of its own (a
    /// token belongs to the first node it registers).
    pub async fn add_node(&mut self, name: &str, cpus: u32, extra: &[&str]) {
        self.add_node_with(name, cpus, extra, &[]).await;
    }

    /// [`Cluster::add_node`] with variables in the agent's environment.
    pub async fn add_node_with(&mut self, name: &str, cpus: u32, extra: &[&str], env: &[(&str, &str)]) {
        let token = self.api.post("/v1/agent-tokens", json!({"label": format!("e2e {name}")})).await;
        let token = token["token"].as_str().expect("an agent token").to_string();
        self.start_agent_with(name, &token, cpus, extra, env);
    }

    /// `ringtrain up` (SQLite, one local agent with `cpus` slots).
    pub async fn up(name: &str, cpus: u32) -> Cluster {
        let dir = scratch(name);
        let (server, address) = start_up(&dir, cpus);
        let api = Api::new(&address, ADMIN_TOKEN);
        let cluster = Cluster { url: address, dir, api, server, server_command: None, agents: Vec::new(), tls: None };
        cluster.wait_for_nodes(1).await;
        cluster
    }

    /// Ctrl-C to `ringtrain up`: waits up to `within` for it to exit, and returns how it exited.
    pub fn interrupt_up(&mut self, within: Duration) -> std::process::ExitStatus {
        let pid = self.server.0.id().to_string();
        assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.server.0.try_wait().unwrap() {
                return status;
            }
            assert!(std::time::Instant::now() < deadline, "ringtrain up did not stop within {within:?} of Ctrl-C");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `ringtrain up` again on the same data directory (it listens on a new port).
    pub async fn up_again(&mut self, cpus: u32) {
        let (server, address) = start_up(&self.dir, cpus);
        self.server = server;
        self.api = Api::new(&address, ADMIN_TOKEN);
        self.url = address;
        self.wait_for_nodes(1).await;
    }

    /// Kills the server (SIGKILL: no graceful anything) and starts it again on the same address and database.
    pub fn restart_server(&mut self) {
        self.kill_server();
        self.start_server_again();
    }

    /// Kills the server (SIGKILL) and leaves it down.
    pub fn kill_server(&mut self) {
        let _ = self.server.0.kill();
        let _ = self.server.0.wait();
    }

    /// Starts a killed `serve` again on the same address and database.
    pub fn start_server_again(&mut self) {
        let (listen, database_url) = self.server_command.clone().expect("a `serve` cluster");
        let (server, _) = start_until(
            serve_command(ringtrain(), &listen, &database_url, &self.dir, self.tls.as_ref()),
            "listening on ",
        );
        self.server = server;
    }

    /// Another `serve` on the cluster's database with a data folder of its own under `name` (a replica that
    /// shares no disk with the first), and its URL; the replica stops when the process is dropped.
    pub fn start_replica(&self, name: &str) -> (Process, String) {
        let (_, database_url) = self.server_command.clone().expect("a `serve` cluster");
        let dir = self.dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let command = serve_command(ringtrain(), "127.0.0.1:0", &database_url, &dir, self.tls.as_ref());
        start_until(command, "listening on ")
    }

    pub fn start_agent(&mut self, name: &str, token: &str, cpus: u32) {
        self.start_agent_with(name, token, cpus, &[], &[]);
    }

    fn start_agent_with(&mut self, name: &str, token: &str, cpus: u32, extra: &[&str], env: &[(&str, &str)]) {
        let token_file = self.dir.join(format!("{name}.token"));
        std::fs::write(&token_file, token).expect("write the agent token file");
        // the agent refuses a token file other users may read
        std::fs::set_permissions(&token_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let off_loopback = self.tls.is_none() && !self.url.starts_with("http://127.0.0.1");
        let agent = ringtrain()
            .args(["agent", "--server", &self.url, "--token-file"])
            .arg(&token_file)
            .args(["--name", name, "--gpus", "none"])
            .args(self.tls.iter().flat_map(|t| [std::ffi::OsStr::new("--ca-cert"), t.ca_cert.as_os_str()]))
            .args(["--cpus", &cpus.to_string(), "--heartbeat-s", "1", "--work-dir"])
            .arg(self.dir.join(name))
            // a server on a test bridge (`serve_on`) speaks plain HTTP off loopback
            .args(off_loopback.then_some("--allow-insecure-http"))
            .args(extra)
            .env("RINGTRAIN_SYSTEM_METRICS_S", "1")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start an agent");
        self.agents.push(Process(agent));
    }

    pub async fn wait_for_nodes(&self, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let nodes = self.api.get("/v1/nodes").await;
            let up = nodes["nodes"].as_array().map_or(0, |n| n.iter().filter(|n| n["state"] == "up").count());
            if up >= count {
                return;
            }
            assert!(Instant::now() < deadline, "only {up} of {count} nodes registered: {nodes}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A team with CPU quota `cpus` and a member token of it.
    pub async fn team(&self, name: &str, cpus: i32) -> Api {
        let team = self.api.post("/v1/teams", json!({"name": name, "gpu_quota": 0, "cpu_quota": cpus})).await;
        let id = team["id"].as_str().unwrap();
        let token = self.api.post(&format!("/v1/teams/{id}/tokens"), json!({"role": "member", "label": name})).await;
        Api { http: self.api.http.clone(), base: self.url.clone(), token: token["token"].as_str().unwrap().to_string() }
    }
}

#[derive(Debug, Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Api {
    pub fn new(base: &str, token: &str) -> Api {
        Self::with_ca(base, token, None)
    }

    /// A client that also trusts the CA in this PEM file.
    pub fn with_ca(base: &str, token: &str, ca: Option<&Path>) -> Api {
        let mut builder = reqwest::Client::builder();
        if let Some(ca) = ca {
            builder =
                builder.add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap());
        }
        Api { http: builder.build().unwrap(), base: base.to_string(), token: token.to_string() }
    }

    /// The same client (its token, its trust) of the server at `base`: another replica.
    pub fn at(&self, base: &str) -> Api {
        Api { http: self.http.clone(), base: base.to_string(), token: self.token.clone() }
    }

    pub async fn request(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.timeout(Duration::from_secs(60)).send().await.expect("the server answers");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// POSTs a file as the body (application/octet-stream), as `curl --data-binary @FILE` does.
    pub async fn upload(&self, path: &str, bytes: Vec<u8>) -> (u16, Value) {
        let request = self.http.post(format!("{}{path}", self.base)).bearer_auth(&self.token);
        let request = request.header("content-type", "application/octet-stream").body(bytes);
        let response = request.timeout(Duration::from_secs(120)).send().await.expect("the server answers");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// A PUT of `bytes` with the extra `headers`: its status and JSON answer.
    pub async fn put_bytes(&self, path: &str, headers: &[(&str, &str)], bytes: Vec<u8>) -> (u16, Value) {
        let mut request = self.http.put(format!("{}{path}", self.base)).bearer_auth(&self.token);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.header("content-type", "application/octet-stream").body(bytes);
        let response = request.timeout(Duration::from_secs(120)).send().await.expect("the server answers");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// A GET's status and body bytes.
    pub async fn download(&self, path: &str) -> (u16, Vec<u8>) {
        let request = self.http.get(format!("{}{path}", self.base)).bearer_auth(&self.token);
        let response = request.timeout(Duration::from_secs(120)).send().await.expect("the server answers");
        let status = response.status().as_u16();
        (status, response.bytes().await.map(|b| b.to_vec()).unwrap_or_default())
    }

    /// The status of a GET, or None when no HTTP answer came (e.g. plain HTTP to a TLS port).
    pub async fn http_status(&self, path: &str) -> Option<u16> {
        let request = self.http.get(format!("{}{path}", self.base)).bearer_auth(&self.token);
        request.timeout(Duration::from_secs(10)).send().await.ok().map(|r| r.status().as_u16())
    }

    pub async fn get(&self, path: &str) -> Value {
        let (status, body) = self.request(reqwest::Method::GET, path, None).await;
        assert!(status < 300, "GET {path}: {status} {body}");
        body
    }

    pub async fn post(&self, path: &str, body: Value) -> Value {
        let (status, answer) = self.request(reqwest::Method::POST, path, Some(body)).await;
        assert!(status < 300, "POST {path}: {status} {answer}");
        answer
    }

    /// Submits a spec; returns the job id.
    pub async fn submit(&self, spec: &Value) -> String {
        let job = self.post("/v1/jobs", spec.clone()).await;
        job["id"].as_str().expect("a job id").to_string()
    }

    pub async fn job(&self, id: &str) -> Value {
        self.get(&format!("/v1/jobs/{id}")).await
    }

    /// Polls the job until `done` holds, failing after `timeout` with the job and its events.
    pub async fn wait_job(&self, id: &str, timeout: Duration, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let job = self.job(id).await;
            if done(&job) {
                return job;
            }
            if Instant::now() > deadline {
                let events = self.get(&format!("/v1/jobs/{id}/events")).await;
                panic!("job {id} did not reach {what} in {timeout:?}: {job}\nevents: {events}");
            }
            assert!(
                !(matches!(job["state"].as_str(), Some("failed" | "cancelled")) && what != job["state"]),
                "job {id} ended {}: {}\nevents: {}",
                job["state"],
                job["error"],
                self.get(&format!("/v1/jobs/{id}/events")).await
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Polls GET `path` until `done` holds for its body; fails after `timeout`, naming `what`.
    pub async fn wait_for(&self, path: &str, timeout: Duration, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let body = self.get(path).await;
            if done(&body) {
                return body;
            }
            assert!(Instant::now() < deadline, "{what}: not within {timeout:?} ({path}: {body})");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until rank reports of the job arrive.
    pub async fn wait_first_iteration(&self, id: &str, timeout: Duration) {
        let path = format!("/v1/jobs/{id}/metrics?kind=iteration&limit=1");
        self.wait_for(&path, timeout, "the first iteration", |page| {
            page["points"].as_array().is_some_and(|p| !p.is_empty())
        })
        .await;
    }

    /// Waits until the job has a checkpoint on the server.
    pub async fn wait_first_checkpoint(&self, id: &str, timeout: Duration) {
        let path = format!("/v1/jobs/{id}/checkpoints");
        self.wait_for(&path, timeout, "a checkpoint", |list| {
            list["checkpoints"].as_array().is_some_and(|c| !c.is_empty())
        })
        .await;
    }

    pub async fn wait_state(&self, id: &str, state: &str, timeout: Duration) -> Value {
        self.wait_job(id, timeout, state, |job| job["state"] == state).await
    }

    /// Every metric point of `kind`, all pages.
    pub async fn metrics(&self, id: &str, kind: &str) -> Vec<Value> {
        let mut points = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/v1/jobs/{id}/metrics?kind={kind}&limit=10000");
            if let Some(c) = &cursor {
                path += &format!("&cursor={c}");
            }
            let page = self.get(&path).await;
            points.extend(page["points"].as_array().unwrap().iter().cloned());
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_string()),
                None => return points,
            }
        }
    }
}

/// Per rank: the iterations reported and the attempts that reported them.
pub fn iterations_by_rank(points: &[Value]) -> BTreeMap<i64, Vec<(i64, i64)>> {
    let mut by_rank: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
    for p in points {
        by_rank
            .entry(p["rank"].as_i64().unwrap())
            .or_default()
            .push((p["iteration"].as_i64().unwrap(), p["attempt"].as_i64().unwrap()));
    }
    by_rank
}

/// Every iteration 0..total exactly once per rank, for `ranks` ranks.
pub fn assert_complete_series(points: &[Value], ranks: i64, total: i64) {
    let by_rank = iterations_by_rank(points);
    assert_eq!(by_rank.keys().copied().collect::<Vec<_>>(), (0..ranks).collect::<Vec<_>>(), "ranks reporting");
    for (rank, series) in &by_rank {
        let iterations: Vec<i64> = series.iter().map(|(i, _)| *i).collect();
        assert_eq!(iterations, (0..total).collect::<Vec<_>>(), "rank {rank}: gaps or duplicates");
    }
}

/// A small Fashion-MNIST job: `train` samples, `epochs` epochs, `workers` ranks, every iteration logged.
pub fn fashion_mnist(name: &str, workers: u32, train: u32, epochs: u32) -> Value {
    let warmup_epochs = if epochs > 1 { 1.0 } else { 0.5 };
    json!({
        "name": name,
        "model": {"name": "mlp", "hidden": [64]},
        "dataset": "fashion-mnist",
        "train_samples": train,
        "test_samples": 1000,
        "workers": workers,
        "per_worker_batch": 32,
        "epochs": epochs,
        "lr": {"base": 0.1, "reference_batch": 64, "warmup": {"kind": "gradual", "epochs": warmup_epochs}},
        "optimizer": {"momentum": 0.9},
        "seed": 11,
        "checkpoint_every_epochs": 1,
        "log_every_iterations": 1,
        "max_restarts": 2,
        "device": "cpu"
    })
}

/// The environment of each running rank of `job`, once they run.
pub async fn rank_environments(job: &str) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let pids = rank_pids(job, None);
        let environments: Vec<String> = pids
            .iter()
            .filter_map(|pid| std::fs::read(format!("/proc/{pid}/environ")).ok())
            .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', "\n"))
            .collect();
        if !environments.is_empty() {
            return environments;
        }
        assert!(std::time::Instant::now() < deadline, "no rank of {job} ran within 120 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Pids of the rank processes of `job`: `train` processes whose working folder (the agent starts each in
/// its private folder, `.../jobs/JOB/attempt-A/rank-R`) names the job.
pub fn rank_pids(job: &str, rank: Option<u32>) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> = cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let folder = std::fs::read_link(entry.path().join("cwd")).unwrap_or_default();
        let is_rank = args.iter().any(|a| a == "train") && folder.to_string_lossy().contains(job);
        let rank_matches = rank.is_none_or(|r| args.windows(2).any(|w| w[0] == "--rank" && w[1] == r.to_string()));
        if is_rank && rank_matches {
            pids.push(pid);
        }
    }
    pids
}

pub fn kill_9(pid: u32) {
    let status = Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill -9 {pid}");
}
