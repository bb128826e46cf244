//! Running `ringtrain models check` on an uploaded model: tenant code, so in the sandbox
//! ([`ringtrain_sandbox`]). The check gets the model and the data set as open files and a private folder
//! of its own (none of the server's folders, nor its environment: not `DATABASE_URL`, not a token), runs
//! as the rank user where the server is root, and its output is read with a cap. One check per team at a
//! time and two in all, so that one member cannot keep every other team's uploads waiting.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use ringtrain_core::TeamId;
use ringtrain_sandbox::{Launch, RankUser};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::{ApiError, ProblemType};

/// The binary that checks models, and how.
#[derive(Debug, Clone)]
pub struct ModelChecker {
    /// A `ringtrain` binary (libtorch is not linked into the server).
    pub exe: PathBuf,
    /// The account checks run as where the server is root.
    pub user: Option<RankUser>,
    /// Check even where the kernel cannot confine (`--allow-unsandboxed`).
    pub allow_unsandboxed: bool,
    /// The address space one check may take, in GiB.
    pub max_memory_gib: u64,
}

impl ModelChecker {
    /// The checker for `exe`, or why this server cannot check models safely.
    pub fn prepare(exe: PathBuf, rank_user: Option<&str>, allow_unsandboxed: bool) -> Result<ModelChecker, String> {
        let support = ringtrain_sandbox::probe();
        if !support.can_confine() && !allow_unsandboxed {
            return Err(format!(
                "this server cannot confine model checks (its kernel lacks {}); its operator may pass \
                 --allow-unsandboxed on a single-team install",
                support.missing().join(" and ")
            ));
        }
        let user = RankUser::for_tenant_code(support.root, rank_user)?;
        Ok(ModelChecker { exe, user, allow_unsandboxed, max_memory_gib: 16 })
    }
}

/// Checks in progress: at most [`OVERALL`] at once, one per team.
#[derive(Debug)]
pub struct CheckSlots {
    teams: Mutex<HashSet<TeamId>>,
    overall: tokio::sync::Semaphore,
}

const OVERALL: usize = 2;

/// A team's claim on its one check, given back when dropped: also when the request that made it is
/// cancelled while it waits for one of the overall slots (a client that went away must not leave its team
/// locked out).
#[derive(Debug)]
struct TeamClaim<'a> {
    slots: &'a CheckSlots,
    team: TeamId,
}

impl Drop for TeamClaim<'_> {
    fn drop(&mut self) {
        self.slots.teams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.team);
    }
}

/// A team's turn to check a model.
#[derive(Debug)]
pub struct Turn<'a> {
    _claim: TeamClaim<'a>,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl Default for CheckSlots {
    fn default() -> Self {
        CheckSlots::new()
    }
}

impl CheckSlots {
    pub fn new() -> CheckSlots {
        CheckSlots { teams: Mutex::new(HashSet::new()), overall: tokio::sync::Semaphore::new(OVERALL) }
    }

    /// The team's turn: refused (429) while the team's previous check runs; waits for one of the two.
    pub async fn turn(&self, team: TeamId) -> Result<Turn<'_>, ApiError> {
        if !self.teams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(team) {
            return Err(ApiError::new(
                ProblemType::ModelCheckBusy,
                "a model of your team is being checked: upload the next one when that check has ended",
            ));
        }
        let claim = TeamClaim { slots: self, team };
        let permit = self.overall.acquire().await.map_err(ApiError::internal)?;
        Ok(Turn { _claim: claim, _permit: permit })
    }
}

/// How a check process ended.
#[derive(Debug)]
pub struct Outcome {
    pub status: std::process::ExitStatus,
    /// Its stdout's last line (the report or the refusal, as JSON).
    pub last_line: String,
    /// Its stderr's last line that is not empty.
    pub last_error: String,
}

/// The most of each output stream a check keeps (the rest is read and dropped).
const OUTPUT_CAP: usize = 1 << 20;

/// Runs the check of `model` against `dataset` with `inputs`, in a fresh private folder under `tmp`,
/// killed at `timeout`. `None` when it did not finish in time.
pub async fn run(
    checker: &ModelChecker,
    tmp: &Path,
    model: &Path,
    dataset: &Path,
    inputs: &[String],
    timeout: Duration,
) -> Result<Option<Outcome>, ApiError> {
    let private = PrivateFolder::new(tmp, checker.user.as_ref()).map_err(ApiError::internal)?;
    let mut launch = Launch::new();
    let dir = launch.pass(File::open(&private.0).map_err(ApiError::internal)?);
    let model_file = launch.pass(File::open(model).map_err(ApiError::internal)?);
    let dataset_file = launch.pass(File::open(dataset).map_err(ApiError::internal)?);
    launch.private_dir(dir.clone());
    launch.run_as(checker.user.clone());
    let mut command = tokio::process::Command::new(&checker.exe);
    command.args(["models", "check", "--model"]).arg(&model_file).arg("--dataset").arg(&dataset_file);
    command.arg("--sandbox-dir").arg(&dir);
    command.args(["--max-memory-gib", &checker.max_memory_gib.to_string()]);
    command.args(["--max-cpu-s", &timeout.as_secs().max(1).to_string()]);
    if checker.allow_unsandboxed {
        command.arg("--allow-unsandboxed");
    }
    if !inputs.is_empty() {
        command.arg("--inputs").arg(inputs.join(","));
    }
    launch.apply(command.as_std_mut()).map_err(ApiError::internal)?;
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut child = command.spawn().map_err(ApiError::internal)?;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let finished = tokio::time::timeout(timeout, async {
        let (out, err) = tokio::join!(read_capped(stdout), read_capped(stderr));
        (child.wait().await, out, err)
    })
    .await;
    let Ok((status, stdout, stderr)) = finished else { return Ok(None) };
    let stdout = String::from_utf8_lossy(&stdout);
    let stderr = String::from_utf8_lossy(&stderr);
    Ok(Some(Outcome {
        status: status.map_err(ApiError::internal)?,
        last_line: stdout.lines().last().unwrap_or("").to_string(),
        last_error: bounded(stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message")),
    }))
}

/// The first [`OUTPUT_CAP`] bytes of a stream, read to its end.
async fn read_capped(stream: Option<impl AsyncRead + Unpin>) -> Vec<u8> {
    let Some(mut stream) = stream else { return Vec::new() };
    let mut kept = Vec::new();
    let mut buffer = vec![0u8; 64 << 10];
    while let Ok(n) = stream.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        let room = OUTPUT_CAP.saturating_sub(kept.len());
        kept.extend_from_slice(&buffer[..n.min(room)]);
    }
    kept
}

/// A line of a crashed check's output, cut to what a reason may say.
fn bounded(line: &str) -> String {
    const MAX: usize = 300;
    match line.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}… (cut)", &line[..cut]),
        None => line.to_string(),
    }
}

/// A check's private folder (0700, the check user's), removed with everything in it when dropped.
struct PrivateFolder(PathBuf);

impl PrivateFolder {
    fn new(tmp: &Path, user: Option<&RankUser>) -> std::io::Result<PrivateFolder> {
        std::fs::create_dir_all(tmp)?;
        let dir = tmp.join(format!("check-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        if let Some(user) = user {
            user.own(&dir)?;
        }
        Ok(PrivateFolder(dir))
    }
}

impl Drop for PrivateFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_check_per_team_and_two_in_all() {
        let slots = CheckSlots::new();
        let (a, b, c) = (TeamId::new(), TeamId::new(), TeamId::new());
        let first = slots.turn(a).await.unwrap();
        assert!(slots.turn(a).await.is_err(), "a second check of team a is refused");
        let _second = slots.turn(b).await.unwrap();
        let third = tokio::time::timeout(Duration::from_millis(50), slots.turn(c)).await;
        assert!(third.is_err(), "a third team waits for one of the two");
        drop(first);
        assert!(slots.turn(c).await.is_ok());
        assert!(slots.turn(a).await.is_ok(), "team a may check again once its check ended");
    }

    #[tokio::test]
    async fn a_flood_of_output_is_read_to_its_end_and_kept_to_a_megabyte() {
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", "head -c 50000000 /dev/zero"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let kept = read_capped(child.stdout.take()).await;
        assert_eq!(kept.len(), OUTPUT_CAP);
        assert!(child.wait().await.unwrap().success());
    }
}
