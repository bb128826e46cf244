//! Slurm as a resource manager: what a ringtrain server asks of a Slurm cluster's controller,
//! through Slurm's own commands, typed.
//!
//! - [`batch`]: one Slurm job for one placement (`sbatch` options and its script);
//! - [`queue`]: Slurm's jobs as `squeue --json` gives them, their state and why they wait;
//! - [`Slurm`]: the commands run (`sbatch`, `squeue`, `scancel`), their refusals as errors naming Slurm's
//!   own message.
//!
//! Why the commands rather than slurmrestd: every Slurm installation that runs jobs has them, configured
//! for the site (`SLURM_CONF`, munge), while slurmrestd is an optional daemon an operator must deploy and
//! secure (it refuses to run as root or as SlurmUser, and Debian 12's 22.05 speaks only OpenAPI v0.0.38).
//! `squeue --json` gives the same document slurmrestd would, so nothing is parsed from columns.

pub mod batch;
pub mod queue;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

pub use batch::BatchJob;
pub use queue::{JobState, SlurmJob};

/// A Slurm job's id.
pub type JobId = u64;

/// How long one command may take: a controller that does not answer within it is unreachable.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a command did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    /// Slurm said no (an unknown partition, an account without access, a request no node can meet): its
    /// own message, for the job's failure reason.
    #[error("Slurm refused it: {0}")]
    Refused(String),
    /// The command could not run or the controller did not answer (worth trying again).
    #[error("Slurm cannot be reached: {0}")]
    Unreachable(String),
    /// The command answered with something this crate does not read.
    #[error("Slurm's answer cannot be read: {0}")]
    Unreadable(String),
}

/// A Slurm cluster, reached through its commands.
#[derive(Debug, Clone, Default)]
pub struct Slurm {
    /// Where `sbatch`, `squeue` and `scancel` are (default: the PATH).
    pub bin_dir: Option<PathBuf>,
    /// `SLURM_CONF` for the commands (default: the site's, /etc/slurm/slurm.conf).
    pub conf: Option<PathBuf>,
}

impl Slurm {
    /// Submits `job`; its id.
    pub async fn submit(&self, job: &BatchJob) -> Result<JobId, SlurmError> {
        let out = self.run("sbatch", job.args(), Some(job.script.as_bytes())).await?;
        // --parsable: "ID" or "ID;CLUSTER"
        let id = out.trim().split(';').next().unwrap_or_default();
        id.parse().map_err(|_| SlurmError::Unreadable(format!("sbatch printed {out:?}, not a job id")))
    }

    /// Every job Slurm still lists whose comment starts with `comment_prefix` (the server's jobs; pass ""
    /// for all).
    pub async fn jobs(&self, comment_prefix: &str) -> Result<Vec<SlurmJob>, SlurmError> {
        let out = self.run("squeue", ["--all", "--json"], None).await?;
        let jobs = queue::parse(&out).map_err(SlurmError::Unreadable)?;
        Ok(jobs.into_iter().filter(|job| job.comment.starts_with(comment_prefix)).collect())
    }

    /// Ends job `id` (its steps are killed: the ranks with them).
    pub async fn cancel(&self, id: JobId) -> Result<(), SlurmError> {
        self.run("scancel", [id.to_string()], None).await.map(drop)
    }

    /// Sends `signal` (e.g. `USR1`) to job `id`'s batch script and steps: the grace signal a ringtrain
    /// preemption sends, as `--signal` would at the end of the time limit.
    pub async fn signal(&self, id: JobId, signal: &str) -> Result<(), SlurmError> {
        self.run("scancel", [format!("--signal={signal}"), "--full".into(), id.to_string()], None).await.map(drop)
    }

    /// Runs `program` with `args` (and `stdin`); its stdout, or its stderr as the error.
    async fn run<I, A>(&self, program: &str, args: I, stdin: Option<&[u8]>) -> Result<String, SlurmError>
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        let path = self.bin_dir.as_ref().map_or_else(|| PathBuf::from(program), |dir| dir.join(program));
        let mut command = tokio::process::Command::new(&path);
        command.args(args.into_iter().map(Into::into));
        if let Some(conf) = &self.conf {
            command.env("SLURM_CONF", conf);
        }
        command.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        command.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut child = command.spawn().map_err(|e| SlurmError::Unreachable(format!("cannot run {program}: {e}")))?;
        if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(bytes).await.map_err(|e| SlurmError::Unreachable(format!("{program}'s stdin: {e}")))?;
        }
        let output = tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| {
                SlurmError::Unreachable(format!("{program} did not answer in {} s", COMMAND_TIMEOUT.as_secs()))
            })?
            .map_err(|e| SlurmError::Unreachable(format!("{program}: {e}")))?;
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
        }
        Err(classify(program, &stderr))
    }
}

/// A failed command's error: the controller not answering is worth trying again; anything else is Slurm's
/// refusal, in its own words (the last `error:` line, which says what was wrong).
fn classify(program: &str, stderr: &str) -> SlurmError {
    let unreachable =
        ["Unable to contact slurm controller", "Socket timed out", "Connection refused", "Zero Bytes were transmitted"];
    if unreachable.iter().any(|m| stderr.contains(m)) {
        return SlurmError::Unreachable(format!("{program}: {stderr}"));
    }
    let said: Vec<&str> = stderr.lines().filter_map(|line| line.split_once("error: ").map(|(_, m)| m.trim())).collect();
    let message = said.last().map_or_else(|| stderr.to_string(), |m| (*m).to_string());
    SlurmError::Refused(if message.is_empty() { format!("{program} failed") } else { message })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_slurms_last_word_and_a_silent_controller_is_unreachable() {
        let refused = classify(
            "sbatch",
            "sbatch: error: invalid partition specified: gpu\nsbatch: error: Batch job submission failed: Invalid partition name specified",
        );
        assert!(
            matches!(&refused, SlurmError::Refused(m) if m == "Batch job submission failed: Invalid partition name specified"),
            "{refused:?}"
        );
        let down = classify("squeue", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)");
        assert!(matches!(down, SlurmError::Unreachable(_)));
    }

    #[tokio::test]
    async fn a_missing_command_is_unreachable() {
        let slurm = Slurm { bin_dir: Some("/nonexistent".into()), conf: None };
        assert!(matches!(slurm.cancel(1).await, Err(SlurmError::Unreachable(m)) if m.contains("cannot run scancel")));
    }
}
