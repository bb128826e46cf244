//! A pool laid out as a team deploys one, on one machine: hosts that are Linux network
//! namespaces, each with its own address on a bridge; Postgres on a host of its own; two `ringtrain serve`
//! replicas on two more, over TLS; one address before both replicas (the front, standing for a Kubernetes
//! Service or a TCP load balancer); and one agent of one CPU slot on each remaining host. Needs root
//! (namespaces, links), as CI here has.
//!
//! The replicas share one data folder, as they share a volume in a deployment (here: the one file system
//! every namespace sees).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::{scratch, serve_command, start_until, Api, Process, TestCa, ADMIN_TOKEN};

const LONG: Duration = Duration::from_secs(300);

/// `ip ARGS`, which must succeed.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip (iproute2) runs");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// A bridge on this machine (10.77.S.1) and `count` hosts, each a network namespace at 10.77.S.(10 + i)
/// joined to it by a veth pair; all removed when dropped.
pub struct Hosts {
    tag: u32,
    subnet: u32,
    count: u32,
}

impl Hosts {
    pub fn create(count: u32) -> Hosts {
        // tests of one binary run side by side in one process (cargo test): each pool its own names and subnet
        static POOLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = std::process::id() * 4 + POOLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 4;
        let hosts = Hosts { tag: n % 10_000, subnet: 20 + n % 200, count };
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

    pub fn namespace(&self, i: u32) -> String {
        format!("rt{}h{i}", self.tag)
    }

    /// Host `i`'s end of its link, on the bridge: a qdisc here shapes what reaches the host.
    pub fn link(&self, i: u32) -> String {
        format!("rt{}p{i}", self.tag)
    }

    /// This machine's address on the bridge (where the front listens).
    pub fn gateway(&self) -> String {
        format!("10.77.{}.1", self.subnet)
    }

    pub fn address(&self, i: u32) -> String {
        format!("10.77.{}.{}", self.subnet, 10 + i)
    }

    /// `program` run on host `i` (in its namespace; `ip netns exec` execs it, so the child is the program).
    pub fn command(&self, i: u32, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.namespace(i)]).arg(program);
        command
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

/// A Postgres server of its own on a host: initialised in `dir` and run as the `postgres` account (Debian's
/// postgresql package), listening on the host's address, trusting the bridge's subnet. Shut down (fast
/// shutdown, so it leaves no shared memory behind) when dropped.
pub struct PostgresHost {
    process: std::process::Child,
    pub url: String,
}

impl PostgresHost {
    pub async fn start(hosts: &Hosts, i: u32, dir: &Path) -> PostgresHost {
        let bin = postgres_bin();
        let data = dir.join("postgres");
        std::fs::create_dir_all(&data).unwrap();
        let chown = Command::new("chown").args(["postgres:postgres"]).arg(&data).status().unwrap();
        assert!(chown.success(), "chown the Postgres data folder to postgres");
        let as_postgres = |program: PathBuf| {
            let mut command = Command::new("setpriv");
            command.args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"]).arg(program);
            command
        };
        let out = as_postgres(bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "--no-locale", "-E", "UTF8"])
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        let subnet = hosts.gateway().rsplit_once('.').unwrap().0.to_string() + ".0/24";
        let mut hba = std::fs::OpenOptions::new().append(true).open(data.join("pg_hba.conf")).unwrap();
        std::io::Write::write_all(&mut hba, format!("host all all {subnet} trust\n").as_bytes()).unwrap();

        let address = hosts.address(i);
        let log = std::fs::File::create(dir.join("postgres.log")).unwrap();
        let mut command = hosts.command(i, "setpriv");
        command.args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"]).arg(bin.join("postgres"));
        let process = command
            .arg("-D")
            .arg(&data)
            .args(["-c", &format!("listen_addresses={address}"), "-c", "port=5432", "-c", "fsync=off"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", data.display()))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start postgres on its host");
        let postgres = PostgresHost { process, url: format!("postgres://postgres@{address}:5432/postgres") };
        postgres.wait_until_it_answers(Duration::from_secs(60)).await;
        postgres
    }

    async fn wait_until_it_answers(&self, within: Duration) {
        use sqlx::Connection;
        let deadline = Instant::now() + within;
        while sqlx::PgConnection::connect(&self.url).await.is_err() {
            assert!(Instant::now() < deadline, "Postgres on its host did not answer at {} within {within:?}", self.url);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for PostgresHost {
    fn drop(&mut self) {
        let pid = self.process.id().to_string();
        let _ = Command::new("kill").args(["-INT", &pid]).status();
        for _ in 0..100 {
            if self.process.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// The newest of Debian's Postgres server programs (/usr/lib/postgresql/VERSION/bin).
fn postgres_bin() -> PathBuf {
    let versions = std::fs::read_dir("/usr/lib/postgresql").expect("Debian's postgresql package (/usr/lib/postgresql)");
    let mut bins: Vec<(u32, PathBuf)> = versions
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    bins.sort();
    bins.pop().expect("initdb under /usr/lib/postgresql/*/bin").1
}

/// One address before several replicas, as a Service or load balancer is: connections go in turn to the
/// replicas whose `/readyz` answered at the last check (every 250 ms); TLS passes through it to the
/// replicas, whose certificate names the front's address too.
pub struct Front {
    pub url: String,
    tasks: Vec<JoinHandle<()>>,
}

impl Front {
    pub async fn start(listen: &str, replicas: &[String], ca_cert: &Path) -> Front {
        let listener = TcpListener::bind(listen).await.unwrap();
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
pub async fn wait_for_a_leader(database_url: &str, within: Duration) {
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

/// Agents on hosts 1..=agents (agent `i` is node `host{i}`, its folder `host{i}`), Postgres on the next
/// host, and the replicas on the two after it; the first replica leads the scheduler (it held the lock
/// before the second started). Fields drop in order: agents, the front, replicas, Postgres, hosts.
pub struct Pool {
    agents: Vec<Process>,
    front: Front,
    replicas: Vec<Process>,
    pub replica_urls: Vec<String>,
    pub postgres: PostgresHost,
    pub api: Api,
    pub ca_cert: PathBuf,
    pub hosts: Hosts,
}

impl Pool {
    pub async fn start(name: &str, agents: u32) -> Pool {
        assert!(ringtrain_sandbox::probe().root, "network namespaces need root (ip netns)");
        let hosts = Hosts::create(agents + 3);
        let (postgres_host, replica_hosts) = (agents + 1, [agents + 2, agents + 3]);
        let dir = scratch(name);
        let names = [hosts.gateway(), hosts.address(replica_hosts[0]), hosts.address(replica_hosts[1])];
        let ca = TestCa::make_for(&dir, &names.iter().map(String::as_str).collect::<Vec<_>>());
        let postgres = PostgresHost::start(&hosts, postgres_host, &dir).await;

        let mut replicas = Vec::new();
        let mut replica_urls = Vec::new();
        for (n, host) in replica_hosts.into_iter().enumerate() {
            let base = hosts.command(host, env!("CARGO_BIN_EXE_ringtrain"));
            let listen = format!("{}:0", hosts.address(host));
            let (replica, url) =
                start_until(serve_command(base, &listen, &postgres.url, &dir, Some(&ca)), "listening on ");
            assert!(url.starts_with(&format!("https://{}:", hosts.address(host))), "{url}");
            replicas.push(replica);
            replica_urls.push(url);
            if n == 0 {
                wait_for_a_leader(&postgres.url, Duration::from_secs(30)).await;
            }
        }
        let front = Front::start(&format!("{}:0", hosts.gateway()), &replica_urls, &ca.ca_cert).await;
        let api = Api::with_ca(&front.url, ADMIN_TOKEN, Some(&ca.ca_cert));
        let mut pool =
            Pool { agents: Vec::new(), front, replicas, replica_urls, postgres, api, ca_cert: ca.ca_cert, hosts };
        for i in 1..=agents {
            let token = pool.api.post("/v1/agent-tokens", json!({"label": format!("host{i}")})).await;
            let agent = pool.start_agent(i, token["token"].as_str().unwrap(), &dir);
            pool.agents.push(agent);
        }
        pool.api
            .wait_for("/v1/nodes", LONG, "every host up", |nodes| {
                let up = nodes["nodes"].as_array().map_or(0, |n| n.iter().filter(|n| n["state"] == "up").count());
                up == agents as usize
            })
            .await;
        pool
    }

    /// An agent of one CPU slot on host `i`, at its own address, knowing only the front's.
    fn start_agent(&self, i: u32, token: &str, dir: &Path) -> Process {
        let token_file = dir.join(format!("host{i}.token"));
        std::fs::write(&token_file, token).unwrap();
        std::fs::set_permissions(&token_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let agent = self
            .hosts
            .command(i, env!("CARGO_BIN_EXE_ringtrain"))
            .args(["agent", "--server", &self.front.url, "--ca-cert"])
            .arg(&self.ca_cert)
            .arg("--token-file")
            .arg(&token_file)
            .args(["--name", &format!("host{i}"), "--address", &self.hosts.address(i), "--gpus", "none", "--cpus", "1"])
            .args(["--heartbeat-s", "1", "--work-dir"])
            .arg(dir.join(format!("host{i}")))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start an agent on its host");
        Process(agent)
    }

    /// kill -9 of the replica that leads the scheduler. The API client is made anew: a kept-alive
    /// connection the front had given to the killed replica broke with it (one failed request, as any
    /// client of a load balancer sees); the next connection goes to the survivor.
    pub fn kill_the_leader(&mut self) -> String {
        let leader = &mut self.replicas[0].0;
        let _ = leader.kill();
        let _ = leader.wait();
        self.api = Api::with_ca(&self.front.url, ADMIN_TOKEN, Some(&self.ca_cert));
        self.replica_urls[0].clone()
    }

    /// A client of one replica, not through the front.
    pub fn replica_api(&self, n: usize) -> Api {
        Api::with_ca(&self.replica_urls[n], ADMIN_TOKEN, Some(&self.ca_cert))
    }
}
