//! The agent as a Slurm job step (`srun ringtrain agent --slurm …`): inside an allocation the
//! node is Slurm's for as long as the job lasts, so the agent takes what it offers from Slurm's environment
//! rather than from flags an operator would have to write per node, and leaves when its work is done (the
//! allocation ends with the last step). One code path: a step runs this same agent, which starts the same
//! rank processes under the same sandbox as on a node given to ringtrain whole.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::Args;

/// How long a step's agent waits without a rank before it leaves, unless told (its placement comes within
/// seconds of its registration; after the placement, its allocation should go back to Slurm).
pub const DEFAULT_IDLE_EXIT_S: u64 = 60;

/// `args` completed from Slurm's environment (`env` reads a variable): what the command line did not say.
/// - the node's name: `slurm-SLURM_JOB_ID-SLURMD_NODENAME`;
/// - its CPU slots: `SLURM_CPUS_ON_NODE` (when no GPU is allocated);
/// - its GPUs: `SLURM_STEP_GPUS` or `SLURM_JOB_GPUS` (the allocation's), else none: never every GPU of
///   a machine Slurm shares with other jobs;
/// - the work folder: under `TMPDIR` (node-local scratch on most sites), one per job and node, not the
///   submission folder, which is often a shared file system every node of the job sees;
/// - the token: line `SLURM_NODEID + 1` of --token-file, one per node of the allocation (a token belongs
///   to the first node it registers);
/// - leaving: after --exit-when-idle-s ([`DEFAULT_IDLE_EXIT_S`]) without a rank.
pub fn configure(mut args: Args, env: impl Fn(&str) -> Option<String>) -> Result<Args> {
    let need = |name: &str| {
        env(name)
            .filter(|v| !v.is_empty())
            .with_context(|| format!("--slurm: {name} is not set (run the agent with srun inside an allocation)"))
    };
    let node = need("SLURMD_NODENAME")?;
    let job = need("SLURM_JOB_ID")?;
    if args.name.is_none() {
        // one name per allocation: a node's name belongs to the token it first registered with, and each
        // allocation brings tokens of its own
        args.name = Some(format!("slurm-{job}-{node}"));
    }
    let gpus = env("SLURM_STEP_GPUS").or_else(|| env("SLURM_JOB_GPUS")).filter(|g| !g.is_empty());
    if args.gpus == "all" {
        args.gpus = gpus.clone().unwrap_or_else(|| "none".into());
    }
    if args.cpus.is_none() && gpus.is_none() {
        let cpus = need("SLURM_CPUS_ON_NODE")?;
        args.cpus = Some(cpus.parse().with_context(|| format!("--slurm: SLURM_CPUS_ON_NODE is {cpus:?}"))?);
    }
    if args.work_dir == std::path::Path::new(crate::DEFAULT_WORK_DIR) {
        let scratch = env("TMPDIR").filter(|t| !t.is_empty()).unwrap_or_else(|| "/tmp".into());
        args.work_dir = PathBuf::from(scratch).join(format!("ringtrain-agent-{job}-{node}"));
    }
    if let (None, Some(file)) = (&args.token, &args.token_file) {
        let index: usize = need("SLURM_NODEID")?.parse().context("--slurm: SLURM_NODEID is not a number")?;
        crate::confine::check_token_file(file)?;
        let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
        let token = text.lines().nth(index).map(str::trim).filter(|t| !t.is_empty());
        let token = token
            .with_context(|| format!("{} has no token on line {} (SLURM_NODEID {index})", file.display(), index + 1))?;
        args.token = Some(token.to_string());
        args.token_file = None;
    }
    args.exit_when_idle_s.get_or_insert(DEFAULT_IDLE_EXIT_S);
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::collections::HashMap;

    #[derive(clap::Parser)]
    struct Command {
        #[command(flatten)]
        args: Args,
    }

    fn args(line: &[&str]) -> Args {
        Command::parse_from(std::iter::once("agent").chain(line.iter().copied())).args
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn a_step_takes_its_node_devices_folder_and_token_from_slurm() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "first\nsecond\nthird\n").unwrap();
        std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let slurm = [
            ("SLURMD_NODENAME", "h2"),
            ("SLURM_JOB_ID", "417"),
            ("SLURM_NODEID", "1"),
            ("SLURM_CPUS_ON_NODE", "8"),
            ("TMPDIR", "/scratch/local"),
        ];
        let token_file = tokens.to_str().unwrap();
        let got = configure(args(&["--slurm", "--token-file", token_file]), env(&slurm)).unwrap();
        assert_eq!((got.name.as_deref(), got.cpus, got.gpus.as_str()), (Some("slurm-417-h2"), Some(8), "none"));
        assert_eq!(got.work_dir, PathBuf::from("/scratch/local/ringtrain-agent-417-h2"));
        assert_eq!((got.token.as_deref(), got.exit_when_idle_s), (Some("second"), Some(DEFAULT_IDLE_EXIT_S)));
        // GPUs allocated: those, and no CPU slot unless asked; flags given win
        let gpus = [("SLURMD_NODENAME", "g1"), ("SLURM_JOB_ID", "9"), ("SLURM_STEP_GPUS", "2,3")];
        let got =
            configure(args(&["--slurm", "--token", "t", "--name", "mine", "--exit-when-idle-s", "5"]), env(&gpus))
                .unwrap();
        assert_eq!((got.name.as_deref(), got.cpus, got.gpus.as_str()), (Some("mine"), None, "2,3"));
        assert_eq!((got.token.as_deref(), got.exit_when_idle_s), (Some("t"), Some(5)));
        // outside an allocation, or a token file short of the node's line: said
        let outside = configure(args(&["--slurm", "--token", "t"]), env(&[])).unwrap_err().to_string();
        assert!(outside.contains("SLURMD_NODENAME is not set"), "{outside}");
        let far =
            [("SLURMD_NODENAME", "h9"), ("SLURM_JOB_ID", "1"), ("SLURM_NODEID", "8"), ("SLURM_CPUS_ON_NODE", "1")];
        let short = configure(args(&["--slurm", "--token-file", token_file]), env(&far)).unwrap_err().to_string();
        assert!(short.contains("no token on line 9"), "{short}");
    }
}
