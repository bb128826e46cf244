//! The confined process the sandbox's tests run: a scene of folders (the job's input, its private folder,
//! another job's secret), the confinement a rank of it gets, and the `sandbox-probe` binary run under it.

#![allow(dead_code)] // each test file uses its own part

use std::path::{Path, PathBuf};
use std::process::Command;

use ringtrain_sandbox::{Confinement, Launch, Limits, Network};

pub struct Scene {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub input: PathBuf,
    pub private: PathBuf,
    pub secret: PathBuf,
}

pub fn scene() -> Scene {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    for folder in ["inputs", "private", "other-job"] {
        std::fs::create_dir_all(root.join(folder)).unwrap();
    }
    let input = root.join("inputs/dataset.safetensors");
    std::fs::write(&input, b"the job's own data").unwrap();
    let secret = root.join("other-job/agent-token");
    std::fs::write(&secret, b"rt_agent_secret").unwrap();
    Scene { _dir: dir, private: root.join("private"), input, secret, root }
}

pub fn confinement(scene: &Scene, network: Network) -> Confinement {
    Confinement {
        read: vec![scene.input.clone()],
        write: vec![scene.private.clone()],
        kept: vec![],
        gpu: false,
        network,
        limits: Limits::rank(1 << 20),
    }
}

/// Runs the probe confined by `confinement`; its verdict line.
pub fn probe_with(confinement: &Confinement, action: &str, arg: &str, launch: Launch) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandbox-probe"));
    command.arg(serde_json::to_string(confinement).unwrap()).args([action, arg]);
    launch.apply(&mut command).unwrap();
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
    assert!(
        stdout.starts_with("allowed") || stdout.starts_with("refused"),
        "{action} {arg}: {stdout} / {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

pub fn probe(confinement: &Confinement, action: &str, arg: impl AsRef<Path>) -> String {
    probe_with(confinement, action, arg.as_ref().to_str().unwrap(), Launch::new())
}

pub fn assert_refused(verdict: String, what: &str) {
    assert!(verdict.starts_with("refused"), "{what} was not refused: {verdict}");
}

pub fn assert_allowed(verdict: String, what: &str) {
    assert_eq!(verdict, "allowed", "{what}");
}
