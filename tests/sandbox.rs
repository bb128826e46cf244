//! Hostile uploaded models against the sandbox, with the real `ringtrain` binary: a model that maps a
//! secret file and raises its bytes, one that saves a file on the host, and one that behaves for the
//! upload's two-sample check and attacks from its first training batch. Each is refused by the operator
//! allow-list at its check and at a rank's load, naming the operator; and with the list skipped (the
//! sandbox alone), it still reads nothing and writes nothing outside its own folder.

#[path = "support/hostile.rs"]
mod hostile;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

const DATA: &str = "examples/multi-input/data.safetensors";
const UPLOAD_ID: &str = "00000000-0000-4000-8000-000000000026";
/// What the secret files hold: a test fails if any of it comes back.
const SECRET: &str = "rt_agent_0123456789abcdef_secret";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Host {
        Host { dir: tempfile::tempdir().unwrap() }
    }

    /// A secret of the host's (as the agent token, another job's checkpoint or another team's data set):
    /// readable by this user, so only the sandbox stands in the way.
    fn secret(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, SECRET).unwrap();
        path
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

fn assert_no_secret(output: &Output) {
    let all = text(output);
    assert!(!all.contains(&SECRET[..12]), "the secret came back:\n{all}");
}

fn check(model: &Path, skip_operator_check: bool) -> (Output, Option<Value>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ringtrain"));
    command.args(["models", "check", "--model"]).arg(model).arg("--dataset").arg(repo(DATA));
    command.args(["--inputs", "numeric"]);
    if skip_operator_check {
        command.arg("--skip-operator-check");
    }
    let output = command.output().unwrap();
    let line = String::from_utf8_lossy(&output.stdout).lines().last().unwrap_or("").to_string();
    (output, serde_json::from_str(&line).ok())
}

/// One rank training `model` on the example's numeric input, as `train --local` runs an uploaded model.
fn train(host: &Host, model: &Path, skip_operator_check: bool) -> Output {
    let spec = json!({
        "model": {"uploaded": UPLOAD_ID}, "dataset": UPLOAD_ID, "workers": 1, "per_worker_batch": 32,
        "train_samples": 256, "epochs": 1, "lr": {"base": 0.05, "reference_batch": 32, "warmup": {"kind": "none"}, "decay": {"kind": "none"}},
        "seed": 1, "log_every_iterations": 1
    });
    let spec_path = host.path("spec.json");
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_ringtrain"));
    command.arg("train").arg("--spec").arg(&spec_path).args(["--local", "1", "--out"]).arg(host.path("out"));
    command.arg("--model-file").arg(model).arg("--dataset-file").arg(repo(DATA)).args(["--model-inputs", "numeric"]);
    if skip_operator_check {
        command.arg("--skip-operator-check");
    }
    command.output().unwrap()
}

#[test]
fn hostile_models_are_refused_at_their_check_naming_the_operator_and_where() {
    let host = Host::new();
    let token = host.secret("ringtrain-data/agent-token");
    let canary = host.path("written-by-the-check");
    let cases = [
        ("raise", hostile::raise_file(&token, 16), "aten::from_file"),
        ("save", hostile::save_file(&canary), "aten::save"),
        ("delayed", hostile::delayed(&token, 16, &canary), "aten::from_file"),
    ];
    for (name, body, operator) in cases {
        let model = hostile::model(host.dir.path(), name, &body);
        let (output, refusal) = check(&model, false);
        assert_eq!(output.status.code(), Some(2), "{name}: {}", text(&output));
        let refusal = refusal.unwrap_or_else(|| panic!("{name}: no refusal: {}", text(&output)));
        let reason = refusal["reason"].as_str().unwrap();
        assert_eq!(refusal["field"], "body", "{name}");
        assert!(reason.contains(operator) && reason.contains("__torch__.BatchNormMlp.forward"), "{name}: {reason}");
        assert_no_secret(&output);
        assert!(!canary.exists(), "{name} wrote on the host");
    }
}

#[test]
fn with_the_operator_list_skipped_the_sandbox_alone_keeps_the_check_from_the_hosts_files() {
    let host = Host::new();
    let home = std::env::var("HOME").map(PathBuf::from).unwrap_or_else(|_| "/root".into());
    let secrets = [host.secret("ringtrain-data/admin-token"), host.secret("ringtrain-data/ringtrain.db")];
    for secret in &secrets {
        let model = hostile::model(host.dir.path(), "raise", &hostile::raise_file(secret, 16));
        let (output, refusal) = check(&model, true);
        assert_no_secret(&output);
        let reason = refusal.map(|r| r["reason"].to_string()).unwrap_or_default();
        assert!(
            reason.contains("Permission denied") || reason.contains("unable to open"),
            "{reason}\n{}",
            text(&output)
        );
    }
    // $HOME: a file of this user's home, mapped and raised, comes back as a refusal to open it
    let probe = home.join(format!(".ringtrain-sandbox-test-{}", std::process::id()));
    std::fs::write(&probe, SECRET).unwrap();
    let model = hostile::model(host.dir.path(), "home", &hostile::raise_file(&probe, 16));
    let (output, _) = check(&model, true);
    let _ = std::fs::remove_file(&probe);
    assert_no_secret(&output);
    // torch.save to a path of the host: nothing is written (libtorch ignores the failed open: the check
    // itself passes)
    let canary = host.path("canary");
    let model = hostile::model(host.dir.path(), "save", &hostile::save_file(&canary));
    let (output, _) = check(&model, true);
    assert!(!canary.exists(), "the check wrote on the host: {}", text(&output));
    assert!(text(&output).contains("sandbox: Landlock"), "{}", text(&output));
}

#[test]
fn a_rank_refuses_a_hostile_model_and_with_the_list_skipped_is_confined_by_the_sandbox() {
    let host = Host::new();
    let token = host.secret("agent/agent-token");
    let other_job = host.secret("agent/jobs/another-job/attempt-1/rank-0/out/checkpoints/epoch-0001/model.safetensors");
    let canary = host.path("written-by-a-rank");
    // the agent's re-check: refused at load, a job error (exit 3), nothing trained
    let model = hostile::model(host.dir.path(), "delayed", &hostile::delayed(&token, 16, &canary));
    let output = train(&host, &model, false);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output));
    assert!(text(&output).contains("aten::from_file"), "{}", text(&output));
    for secret in [&token, &other_job] {
        let model = hostile::model(host.dir.path(), "delayed", &hostile::delayed(secret, 16, &canary));
        let output = train(&host, &model, true);
        assert!(!output.status.success(), "the hostile rank trained: {}", text(&output));
        assert_no_secret(&output);
        assert!(!canary.exists(), "a rank wrote on the host");
        assert!(text(&output).contains("sandbox: Landlock"), "{}", text(&output));
    }
}
