//! The faults the soak injects, in a seeded random order: SIGKILL to a rank process, SIGKILL to an agent
//! (started again a moment later), SIGKILL to the server (started again on the same address and database
//! after an outage), and the database going away under the server (Postgres: every connection of the
//! server terminated; SQLite: the write lock held by another process for seconds).

use std::time::Duration;

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use ringtrain_client::ApiClient;
use ringtrain_core::random::SplitMix64;
use serde::Serialize;
use serde_json::Value;

use super::cluster::SoakCluster;
use super::Database;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    RankKill,
    AgentKill,
    ServerRestart,
    DatabaseDrop,
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::RankKill => "rank kill -9",
            FaultKind::AgentKill => "agent kill -9",
            FaultKind::ServerRestart => "server kill -9 + restart",
            FaultKind::DatabaseDrop => "database taken away",
        }
    }
}

/// One fault as injected.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    pub kind: FaultKind,
    /// Seconds into the soak.
    pub at_s: f64,
    #[serde(skip)]
    pub at: DateTime<Utc>,
    pub detail: String,
    /// The jobs whose ranks it killed, with the newest iteration each had reported by then.
    pub hit: Vec<(String, Option<i64>)>,
    /// The node an agent kill stopped the agent of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// The shuffle's generator: the same seed gives the same fault order, targets and waits.
#[derive(Debug)]
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64::new(seed))
    }

    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0.below(n as u64) as usize
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0.unit()
    }
}

/// `counts` of each kind, shuffled.
pub fn plan(counts: &[(FaultKind, usize)], rng: &mut Rng) -> Vec<FaultKind> {
    let mut faults: Vec<FaultKind> = counts.iter().flat_map(|(kind, n)| std::iter::repeat_n(*kind, *n)).collect();
    for i in (1..faults.len()).rev() {
        faults.swap(i, rng.below(i + 1));
    }
    faults
}

/// Injects one fault of `kind`; None when it has no target now (no rank alive), to be tried again.
pub async fn inject(
    kind: FaultKind,
    cluster: &mut SoakCluster,
    database: &Database,
    owners: &[(String, ApiClient)],
    rng: &mut Rng,
    started: std::time::Instant,
) -> Result<Option<Fault>> {
    let at = Utc::now();
    let at_s = started.elapsed().as_secs_f64();
    let fault = |detail: String, hit| Fault { kind, at_s, at, detail, hit, node: None };
    match kind {
        FaultKind::RankKill => {
            let ranks = cluster.ranks();
            if ranks.is_empty() {
                return Ok(None);
            }
            let victim = ranks[rng.below(ranks.len())].clone();
            let reached = newest_iteration(owners, &victim.job).await;
            kill_9(victim.pid);
            let detail =
                format!("rank {} of job {} (attempt {}) on {}", victim.rank, victim.job, victim.attempt, victim.node);
            Ok(Some(fault(detail, vec![(victim.job, reached)])))
        }
        FaultKind::AgentKill => {
            let index = rng.below(cluster.agent_count());
            let name = cluster.agent_name(index).to_string();
            let on_node = |cluster: &SoakCluster| -> Vec<String> {
                cluster.ranks().into_iter().filter(|r| r.node == name).map(|r| r.job).collect()
            };
            let mut hit = Vec::new();
            for job in on_node(cluster) {
                if !hit.iter().any(|(j, _)| j == &job) {
                    let reached = newest_iteration(owners, &job).await;
                    hit.push((job, reached));
                }
            }
            // Looked at again just before the kill: a rank started meanwhile is hit too.
            let late: Vec<String> = on_node(cluster);
            cluster.kill_agent(index);
            for job in late {
                if !hit.iter().any(|(j, _)| j == &job) {
                    hit.push((job, None));
                }
            }
            let down = Duration::from_millis(1000 + rng.below(3000) as u64);
            tokio::time::sleep(down).await;
            cluster.start_agent(index)?;
            let detail = format!("{name} ({} job(s) on it), down {:.1} s", hit.len(), down.as_secs_f64());
            Ok(Some(Fault { node: Some(name), ..fault(detail, hit) }))
        }
        FaultKind::ServerRestart => {
            let outage = Duration::from_millis(2000 + rng.below(4000) as u64);
            cluster.restart_server(outage).await?;
            Ok(Some(fault(format!("down {:.1} s", outage.as_secs_f64()), Vec::new())))
        }
        FaultKind::DatabaseDrop => Ok(Some(fault(database.disrupt().await?, Vec::new()))),
    }
}

/// The newest iteration rank 0 of `job` has reported, if any (None also when the server does not answer,
/// or the job is a reference run, which no fault targets on purpose).
async fn newest_iteration(owners: &[(String, ApiClient)], job: &str) -> Option<i64> {
    let (_, owner) = owners.iter().find(|(id, _)| id == job)?;
    let path = format!("/v1/jobs/{job}/metrics?kind=iteration&rank=0&limit=10000");
    let page: Value = owner.get(&path).await.ok()?;
    page["points"].as_array()?.iter().filter_map(|p| p["iteration"].as_i64()).max()
}

fn kill_9(pid: u32) {
    // A rank that ended a moment ago is not an error: the fault simply hit nothing.
    let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
}

impl Database {
    /// Takes the database away from the server for a moment; says what it did.
    pub async fn disrupt(&self) -> Result<String> {
        use sqlx::Connection;
        match self {
            Database::Postgres { admin_url, name, .. } => {
                let mut admin = sqlx::PgConnection::connect(admin_url).await.context("connect to Postgres")?;
                let (dropped,): (i64,) = sqlx::query_as(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE datname = $1 AND pid <> pg_backend_pid()",
                )
                .bind(name)
                .fetch_one(&mut admin)
                .await?;
                Ok(format!("{dropped} server connection(s) terminated"))
            }
            Database::Sqlite { path } => {
                // SQLite has no connections to drop: the nearest fault is another process holding the
                // write lock, so every write of the server waits (its busy timeout is longer).
                let url = format!("sqlite:{}", path.display());
                let mut connection = sqlx::SqliteConnection::connect(&url).await.context("open the SQLite file")?;
                let held = Duration::from_secs(5);
                sqlx::query("BEGIN IMMEDIATE").execute(&mut connection).await?;
                tokio::time::sleep(held).await;
                sqlx::query("ROLLBACK").execute(&mut connection).await?;
                Ok(format!("write lock held {} s by another process", held.as_secs()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_holds_every_fault_asked_for_in_a_seeded_order() {
        let counts = [(FaultKind::RankKill, 3), (FaultKind::ServerRestart, 1), (FaultKind::DatabaseDrop, 2)];
        let first = plan(&counts, &mut Rng::new(7));
        assert_eq!(first, plan(&counts, &mut Rng::new(7)));
        let mut sorted = first.clone();
        sorted.sort();
        let expected = [FaultKind::RankKill; 3]
            .into_iter()
            .chain([FaultKind::ServerRestart])
            .chain([FaultKind::DatabaseDrop; 2])
            .collect::<Vec<_>>();
        assert_eq!(sorted, expected);
        let unit = Rng::new(1).unit();
        assert!((0.0..1.0).contains(&unit));
    }
}
