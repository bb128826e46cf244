//! One Slurm job for one ringtrain placement: what `sbatch` is told.

use std::path::PathBuf;

/// A batch job: its allocation (nodes × tasks, CPUs or GPUs per node, a time limit), how it is told to
/// stop (`--signal`), the comment ringtrain finds it by, and the script that runs in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchJob {
    pub name: String,
    pub partition: Option<String>,
    pub account: Option<String>,
    pub nodes: u32,
    pub tasks_per_node: u32,
    /// CPUs of each task (CPU ranks: the rank's threads).
    pub cpus_per_task: Option<u32>,
    /// GPUs of each node (`--gres=gpu:N`).
    pub gpus_per_node: Option<u32>,
    /// The time limit, in minutes (None: the partition's).
    pub time_limit_minutes: Option<u32>,
    /// Seconds before the time limit at which the steps get `USR1`: the ranks checkpoint and stop, and
    /// ringtrain resumes the job later.
    pub grace_seconds: Option<u32>,
    /// How ringtrain finds its jobs among the cluster's (`squeue`'s comment): e.g. `ringtrain:JOB:ATTEMPT`.
    pub comment: String,
    /// Where the script's stdout and stderr go (Slurm's `%j` is the job's id).
    pub output: Option<PathBuf>,
    /// The batch script, `#!` line first.
    pub script: String,
}

impl BatchJob {
    /// `sbatch`'s arguments; the script goes on its stdin. `--no-requeue`: a job Slurm loses is ringtrain's
    /// to requeue (from its checkpoint, through its own queue), never Slurm's to run again on its own.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--parsable".to_string(),
            format!("--job-name={}", self.name),
            format!("--nodes={}", self.nodes),
            format!("--ntasks-per-node={}", self.tasks_per_node),
            "--no-requeue".to_string(),
            format!("--comment={}", self.comment),
        ];
        let optional = [
            self.partition.as_ref().map(|p| format!("--partition={p}")),
            self.account.as_ref().map(|a| format!("--account={a}")),
            self.cpus_per_task.map(|n| format!("--cpus-per-task={n}")),
            self.gpus_per_node.map(|n| format!("--gres=gpu:{n}")),
            self.time_limit_minutes.map(|m| format!("--time={m}")),
            self.grace_seconds.map(|s| format!("--signal=USR1@{s}")),
            self.output.as_ref().map(|o| format!("--output={}", o.display())),
        ];
        args.extend(optional.into_iter().flatten());
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placement_asks_for_its_nodes_devices_limit_and_signal_and_never_for_a_requeue() {
        let job = BatchJob {
            name: "ringtrain-resnet".into(),
            partition: Some("gpu".into()),
            account: Some("vision".into()),
            nodes: 2,
            tasks_per_node: 1,
            cpus_per_task: None,
            gpus_per_node: Some(8),
            time_limit_minutes: Some(240),
            grace_seconds: Some(120),
            comment: "ringtrain:7f3c:1".into(),
            output: Some("/var/log/ringtrain/slurm-%j.out".into()),
            script: "#!/bin/sh\n".into(),
        };
        assert_eq!(
            job.args(),
            [
                "--parsable",
                "--job-name=ringtrain-resnet",
                "--nodes=2",
                "--ntasks-per-node=1",
                "--no-requeue",
                "--comment=ringtrain:7f3c:1",
                "--partition=gpu",
                "--account=vision",
                "--gres=gpu:8",
                "--time=240",
                "--signal=USR1@120",
                "--output=/var/log/ringtrain/slurm-%j.out",
            ]
        );
    }
}
