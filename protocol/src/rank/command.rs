//! The command line of one rank process, built in one place: by the agent for every rank it starts, by
//! `ringtrain train --local` for its k processes and by `ringtrain-bench submit`. The binary's tests parse
//! what [`RankCommand::args`] builds with `train`'s own argument parser, so a renamed flag fails there,
//! not in production.

use std::ffi::OsString;
use std::path::PathBuf;

/// The subcommand a rank runs.
pub const SUBCOMMAND: &str = "train";

/// `ringtrain train` for one rank. Unset options are left to the binary's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankCommand {
    /// The job spec (JSON).
    pub spec: PathBuf,
    /// This rank, the number of rank processes, and where rank 0 listens.
    pub rank: usize,
    pub world: usize,
    pub rendezvous: String,
    /// Where rank 0 writes checkpoints/ and result.json.
    pub out: Option<PathBuf>,
    /// The checkpoints folder to resume from.
    pub resume: Option<PathBuf>,
    /// A fork's starting checkpoint (laid out as a resume folder): its weights, when there is no `resume`.
    pub init_from: Option<PathBuf>,
    pub virtual_ranks: Option<usize>,
    pub threads: Option<i32>,
    pub comm_timeout_s: Option<u64>,
    pub join_timeout_s: Option<u64>,
    pub bucket_mb: Option<usize>,
    /// Sum gradients while backward runs, not after it.
    pub overlap: bool,
    /// auto, ring, shm or nccl.
    pub collective: Option<String>,
    /// The shared memory segment (a passed `memfd`, `/proc/self/fd/N`) every rank of this machine was
    /// given: CPU ranks all-reduce through it.
    pub shared_memory: Option<PathBuf>,
    /// Rank 0 only: the socket it accepts the rendezvous on (a passed descriptor, `/proc/self/fd/N`), bound
    /// by the agent to the port it reported, so no other process can take that port before rank 0 listens.
    pub rendezvous_listener: Option<PathBuf>,
    /// An uploaded dataset's file, an uploaded model's file, and the model's inputs in forward's order.
    pub dataset_file: Option<PathBuf>,
    pub model_file: Option<PathBuf>,
    pub model_inputs: Option<Vec<String>>,
    /// The model cut into pipeline stages after these layers: ranks w·S..w·S+S−1 are worker w's S stages.
    pub pipeline_cuts: Option<Vec<String>>,
    /// Exit when the starting process is gone; its pid when known (a parent that died before the rank
    /// watched is noticed too).
    pub exit_with_parent: bool,
    pub parent_pid: Option<u32>,
    /// When this file appears, every rank stops after a checkpoint.
    pub stop_file: Option<PathBuf>,
    /// The rank's sandbox: its only writable folder, its largest file.
    pub sandbox_dir: Option<PathBuf>,
    pub max_file_mib: Option<u64>,
    pub allow_unsandboxed: bool,
    /// Tests of the sandbox only.
    pub skip_operator_check: bool,
}

impl RankCommand {
    /// The arguments after the binary: `train --spec ... --rank ...`.
    pub fn args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![SUBCOMMAND.into(), "--spec".into(), self.spec.clone().into()];
        let mut flag = |name: &str, value: OsString| {
            args.push(name.into());
            args.push(value);
        };
        flag("--rank", self.rank.to_string().into());
        flag("--world", self.world.to_string().into());
        flag("--rendezvous", self.rendezvous.clone().into());
        let paths = [
            ("--out", &self.out),
            ("--resume", &self.resume),
            ("--init-from", &self.init_from),
            ("--dataset-file", &self.dataset_file),
            ("--model-file", &self.model_file),
            ("--stop-file", &self.stop_file),
            ("--sandbox-dir", &self.sandbox_dir),
            ("--shared-memory", &self.shared_memory),
            ("--rendezvous-listener", &self.rendezvous_listener),
        ];
        for (name, path) in paths {
            if let Some(path) = path {
                flag(name, path.clone().into());
            }
        }
        let numbers = [
            ("--virtual-ranks", self.virtual_ranks.map(|n| n.to_string())),
            ("--threads", self.threads.map(|n| n.to_string())),
            ("--comm-timeout-s", self.comm_timeout_s.map(|n| n.to_string())),
            ("--join-timeout-s", self.join_timeout_s.map(|n| n.to_string())),
            ("--bucket-mb", self.bucket_mb.map(|n| n.to_string())),
            ("--parent-pid", self.parent_pid.map(|n| n.to_string())),
            ("--max-file-mib", self.max_file_mib.map(|n| n.to_string())),
        ];
        for (name, number) in numbers {
            if let Some(number) = number {
                flag(name, number.into());
            }
        }
        if let Some(collective) = &self.collective {
            flag("--collective", collective.into());
        }
        if let Some(inputs) = &self.model_inputs {
            flag("--model-inputs", inputs.join(",").into());
        }
        if let Some(cuts) = &self.pipeline_cuts {
            flag("--pipeline-cuts", cuts.join(",").into());
        }
        let switches = [
            ("--exit-with-parent", self.exit_with_parent),
            ("--overlap", self.overlap),
            ("--allow-unsandboxed", self.allow_unsandboxed),
            ("--skip-operator-check", self.skip_operator_check),
        ];
        args.extend(switches.into_iter().filter(|(_, on)| *on).map(|(name, _)| OsString::from(name)));
        args
    }
}

#[cfg(test)]
mod tests {
    use super::RankCommand;

    #[test]
    fn unset_options_are_left_out_and_set_ones_follow_their_flag() {
        let minimal = RankCommand {
            spec: "s.json".into(),
            rank: 1,
            world: 2,
            rendezvous: "127.0.0.1:4000".into(),
            ..Default::default()
        };
        let args: Vec<String> = minimal.args().iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            args,
            ["train", "--spec", "s.json", "--rank", "1", "--world", "2", "--rendezvous", "127.0.0.1:4000"]
        );
        let inputs =
            RankCommand { model_inputs: Some(vec!["a".into(), "b".into()]), exit_with_parent: true, ..minimal };
        let args: Vec<String> = inputs.args().iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert!(args.ends_with(&["--model-inputs".into(), "a,b".into(), "--exit-with-parent".into()]), "{args:?}");
    }
}
