//! The soak's platform: `ringtrain serve` and `ringtrain agent`s as real child processes of this one (their
//! logs in the work folder), killed with SIGKILL and started again on demand; and the rank processes the
//! agents started, found by their command lines.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ringtrain_client::ApiClient;
use serde_json::{json, Value};

/// The admin token the soak's server is bootstrapped with (it lives only as long as the soak).
const ADMIN_TOKEN: &str = "rt_soak_admin_token_0123456789abcdef";

/// A child process killed (SIGKILL) and reaped when dropped, so a failed soak leaves nothing running.
#[derive(Debug)]
struct Owned(Child);

impl Owned {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Debug)]
struct AgentProcess {
    name: String,
    token_file: PathBuf,
    process: Option<Owned>,
}

#[derive(Debug)]
pub struct SoakCluster {
    exe: PathBuf,
    pub dir: PathBuf,
    database_url: Option<String>,
    /// `http://127.0.0.1:PORT`; a restarted server listens on the same port.
    pub url: String,
    server: Option<Owned>,
    agents: Vec<AgentProcess>,
    pub slots: u32,
    pub admin: ApiClient,
    /// More environment for the server (its limits, as `ringtrain serve` reads them).
    server_env: Vec<(String, String)>,
}

/// A rank process an agent of the soak started, from its command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankProcess {
    pub pid: u32,
    pub node: String,
    pub job: String,
    pub attempt: u32,
    pub rank: u32,
}

impl SoakCluster {
    /// The server on `database_url` (None: SQLite in its data folder) and `agents` agents of `slots` CPU
    /// slots each, all registered.
    pub async fn start(dir: &Path, database_url: Option<String>, agents: usize, slots: u32) -> Result<SoakCluster> {
        Self::start_with(dir, database_url, agents, slots, Vec::new()).await
    }

    /// [`SoakCluster::start`], the server with `server_env` besides.
    pub async fn start_with(
        dir: &Path,
        database_url: Option<String>,
        agents: usize,
        slots: u32,
        server_env: Vec<(String, String)>,
    ) -> Result<SoakCluster> {
        let exe = crate::commands::product();
        let mut cluster = SoakCluster {
            exe,
            dir: dir.to_path_buf(),
            database_url,
            url: String::new(),
            server: None,
            agents: Vec::new(),
            slots,
            admin: ApiClient::new("http://127.0.0.1:1", ADMIN_TOKEN)?,
            server_env,
        };
        let (server, url) = cluster.spawn_server("127.0.0.1:0")?;
        cluster.server = Some(server);
        cluster.url = url;
        cluster.admin = ApiClient::new(&cluster.url, ADMIN_TOKEN)?;
        for n in 0..agents {
            // one agent token per node: a token belongs to the first node it registers
            let name = format!("node{n}");
            let token: Value =
                cluster.admin.post("/v1/agent-tokens", &json!({"label": format!("soak {name}")})).await?;
            let token = token["token"].as_str().context("no agent token in the answer")?;
            let token_file = dir.join(format!("{name}.token"));
            std::fs::write(&token_file, token)?;
            // the agent refuses a token file other users may read
            std::fs::set_permissions(&token_file, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            cluster.agents.push(AgentProcess { name, token_file, process: None });
            cluster.start_agent(n)?;
        }
        cluster.wait_for_nodes(agents).await?;
        Ok(cluster)
    }

    fn log(&self, name: &str) -> Result<File> {
        let path = self.dir.join(format!("{name}.log"));
        File::options().create(true).append(true).open(&path).with_context(|| format!("cannot open {}", path.display()))
    }

    /// Starts `ringtrain serve` on `listen`; returns it once it prints its address.
    fn spawn_server(&self, listen: &str) -> Result<(Owned, String)> {
        let mut command = Command::new(&self.exe);
        command.args(["serve", "--listen", listen, "--data-dir"]).arg(self.dir.join("server"));
        // The soak's database only: never one DATABASE_URL names in this environment.
        command.env_remove("DATABASE_URL");
        if let Some(url) = &self.database_url {
            command.args(["--database-url", url]);
        }
        command
            .env("RINGTRAIN_BOOTSTRAP_TOKEN", ADMIN_TOKEN)
            // every checkpoint is kept: the lost-work figure needs the resume point each fault fell back to
            .env("RINGTRAIN_KEEP_CHECKPOINTS", "1000")
            .env("RUST_LOG", "warn,ringtrain_api::scheduling=info")
            .envs(self.server_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(self.log("server")?);
        let mut child = Owned(command.spawn().context("cannot start ringtrain serve")?);
        let stdout = child.0.stdout.take().context("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Read to the end, so the server never blocks on a full pipe.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("listening on ") {
                    let _ = tx.send(rest.trim().to_string());
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(url) => Ok((child, url)),
            Err(_) => bail!("the server did not print its address (see {}/server.log)", self.dir.display()),
        }
    }

    /// SIGKILL to the server, `outage` without one, and a new one on the same address and database.
    pub async fn restart_server(&mut self, outage: Duration) -> Result<()> {
        if let Some(mut server) = self.server.take() {
            server.kill();
        }
        tokio::time::sleep(outage).await;
        let listen = self.url.trim_start_matches("http://").to_string();
        let (server, _) = self.spawn_server(&listen)?;
        self.server = Some(server);
        Ok(())
    }

    pub fn agent_count(&self) -> usize {
        self.agents.len()
    }

    pub fn agent_name(&self, index: usize) -> &str {
        &self.agents[index].name
    }

    /// Starts agent `index` (again: same name, token and work folder, as a restarted machine would).
    pub fn start_agent(&mut self, index: usize) -> Result<()> {
        let log = self.log(&self.agents[index].name)?;
        let agent = &self.agents[index];
        let child = Command::new(&self.exe)
            .args(["agent", "--server", &self.url, "--token-file"])
            .arg(&agent.token_file)
            .args(["--name", &agent.name, "--gpus", "none", "--cpus", &self.slots.to_string(), "--heartbeat-s", "1"])
            .arg("--work-dir")
            .arg(self.dir.join(&agent.name))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("cannot start ringtrain agent")?;
        self.agents[index].process = Some(Owned(child));
        Ok(())
    }

    /// SIGKILL to agent `index` (its ranks die with it: they exit with their parent).
    pub fn kill_agent(&mut self, index: usize) {
        if let Some(mut process) = self.agents[index].process.take() {
            process.kill();
        }
    }

    async fn wait_for_nodes(&self, count: usize) -> Result<()> {
        for _ in 0..600 {
            if let Ok(nodes) = self.admin.get::<Value>("/v1/nodes").await {
                let up = nodes["nodes"].as_array().map_or(0, |n| n.iter().filter(|n| n["state"] == "up").count());
                if up >= count {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the agents did not register within a minute (see the logs in {})", self.dir.display())
    }

    /// The rank processes of this soak's agents alive now.
    pub fn ranks(&self) -> Vec<RankProcess> {
        rank_processes(&self.dir)
    }
}

/// Rank processes whose working folder lies under `root` (an agent starts each in its private folder
/// `NODE/jobs/JOB/attempt-A/rank-R/`; its arguments name only the files passed to it, `/proc/self/fd/N`).
pub fn rank_processes(root: &Path) -> Vec<RankProcess> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return found };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        // A process that exited and was not reaped yet has an empty command line: not alive.
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> = cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        if args.get(1).map(String::as_str) != Some("train") {
            continue;
        }
        let Ok(folder) = std::fs::read_link(entry.path().join("cwd")) else { continue };
        if let Some(rank) = folder.strip_prefix(root).ok().and_then(|relative| parse_rank_path(pid, relative)) {
            found.push(rank);
        }
    }
    found
}

fn parse_rank_path(pid: u32, relative: &Path) -> Option<RankProcess> {
    let parts: Vec<&str> = relative.iter().map(|p| p.to_str()).collect::<Option<_>>()?;
    match parts.as_slice() {
        [node, "jobs", job, attempt, rank] => Some(RankProcess {
            pid,
            node: node.to_string(),
            job: job.to_string(),
            attempt: attempt.strip_prefix("attempt-")?.parse().ok()?,
            rank: rank.strip_prefix("rank-")?.parse().ok()?,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_is_known_by_its_working_folder() {
        let path = Path::new("node2/jobs/5b1c/attempt-3/rank-1");
        let rank = parse_rank_path(7, path).unwrap();
        assert_eq!(rank, RankProcess { pid: 7, node: "node2".into(), job: "5b1c".into(), attempt: 3, rank: 1 });
        assert!(parse_rank_path(7, Path::new("node2/jobs/5b1c/attempt-x/rank-1")).is_none());
        assert!(parse_rank_path(7, Path::new("server")).is_none());
    }
}
