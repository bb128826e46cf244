//! The deployment files are checked as their tools would, and against the binary
//! they start: the systemd units pass `systemd-analyze verify` with nothing to say and keep their exposure
//! score; the Kubernetes manifests render with `kubectl kustomize` (base and the try-it overlay) and
//! validate against the Kubernetes API's schemas (kubernetes-validate, strict: an unknown field fails). In
//! both, every command line is one `ringtrain` accepts and every `RINGTRAIN_*` variable one it reads, so a
//! renamed flag breaks this test rather than a deployment.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn ringtrain() -> &'static str {
    env!("CARGO_BIN_EXE_ringtrain")
}

/// Runs `command`, asserting it succeeds; returns its stdout and stderr.
fn run(command: &mut Command) -> (String, String) {
    let out = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "{command:?} failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

/// `ringtrain ARGS --help` succeeds (every flag in ARGS exists and takes what it is given) and names each
/// variable of `env` as one it reads.
fn assert_accepted(args: &[String], env: &[String]) {
    let (help, _) = run(Command::new(ringtrain()).args(args).arg("--help"));
    for name in env.iter().filter(|n| n.starts_with("RINGTRAIN_") || *n == "DATABASE_URL") {
        assert!(help.contains(&format!("[env: {name}")), "`ringtrain {}` reads no {name}:\n{help}", args[0]);
    }
}

/// The value of `key=` lines in a unit (the last one wins for ExecStart; all of them for Environment).
fn unit_values<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines().filter_map(|l| l.strip_prefix(key).and_then(|rest| rest.strip_prefix('='))).collect()
}

#[test]
fn the_systemd_units_verify_and_start_commands_ringtrain_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let units = [("ringtrain-serve.service", 3.5), ("ringtrain-agent.service", 6.0)];
    for (name, most_exposed) in units {
        let text = std::fs::read_to_string(root().join("deploy/systemd").join(name)).unwrap();
        // verified with the binary this test built where the unit says /usr/local/bin/ringtrain (verify
        // checks that the command exists)
        let local = text.replace("/usr/local/bin/ringtrain", ringtrain());
        let path = dir.path().join(name);
        std::fs::write(&path, &local).unwrap();
        let (stdout, stderr) = run(Command::new("systemd-analyze").arg("verify").arg(&path));
        // verify exits 0 on an unknown key or a bad value, and says so: anything said fails
        assert!(format!("{stdout}{stderr}").trim().is_empty(), "{name}:\n{stdout}{stderr}");

        let (report, _) = run(Command::new("systemd-analyze").args(["security", "--offline=true"]).arg(&path));
        let score: f64 = report
            .lines()
            .find_map(|l| l.split("Overall exposure level for ").nth(1))
            .and_then(|l| l.split(": ").nth(1))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no exposure level in:\n{report}"));
        eprintln!("{name}: systemd-analyze security exposure {score}");
        assert!(score <= most_exposed, "{name} is exposed {score} (at most {most_exposed})");

        let exec = unit_values(&text, "ExecStart").pop().expect("an ExecStart");
        let args: Vec<String> = exec.split_whitespace().skip(1).map(String::from).collect();
        let env: Vec<String> = unit_values(&text, "Environment")
            .iter()
            .filter_map(|assignment| assignment.split('=').next())
            .map(String::from)
            .collect();
        assert_accepted(&args, &env);
    }
}

/// `kubectl kustomize` of `folder`, as JSON documents (PyYAML of the validator's environment converts).
fn render(venv: &Path, folder: &Path, into: &Path) -> Vec<Value> {
    let (yaml, _) = run(Command::new("kubectl").arg("kustomize").arg(folder));
    std::fs::write(into, &yaml).unwrap();
    let script = "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))";
    let (json, _) = run(Command::new(venv.join("bin/python")).args(["-c", script]).arg(into));
    serde_json::from_str(&json).unwrap()
}

/// What the base holds, by kind, sorted.
const BASE_KINDS: [&str; 8] = [
    "DaemonSet",
    "DaemonSet",
    "Deployment",
    "Namespace",
    "NetworkPolicy",
    "NetworkPolicy",
    "PersistentVolumeClaim",
    "Service",
];
/// What the try-it overlay adds: its Postgres (StatefulSet, Service, NetworkPolicy) and the Secret of its URL.
const TRY_IT_ADDS: [&str; 4] = ["NetworkPolicy", "Secret", "Service", "StatefulSet"];

#[test]
fn the_kubernetes_manifests_render_validate_and_start_commands_ringtrain_accepts() {
    let venv = Command::new(root().join("scripts/deploy-check/venv.sh")).output().expect("venv.sh runs");
    assert!(venv.status.success(), "{}", String::from_utf8_lossy(&venv.stderr));
    let venv = PathBuf::from(String::from_utf8(venv.stdout).unwrap().trim());
    assert!(
        Command::new("kubectl").arg("version").arg("--client").output().is_ok_and(|o| o.status.success()),
        "kubectl is needed to render the manifests (kubectl kustomize)"
    );
    let dir = tempfile::tempdir().unwrap();
    for (folder, adds) in [("base", &[][..]), ("overlays/try-it", &TRY_IT_ADDS[..])] {
        let mut kinds: Vec<&str> = BASE_KINDS.iter().chain(adds).copied().collect();
        kinds.sort_unstable();
        let rendered = dir.path().join(format!("{}.yaml", folder.replace('/', "-")));
        let documents = render(&venv, &root().join("deploy/kubernetes").join(folder), &rendered);
        let mut found: Vec<&str> = documents.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        found.sort_unstable();
        assert_eq!(found, kinds, "{folder}");
        let (said, _) =
            run(Command::new(venv.join("bin/kubernetes-validate")).args(["--strict", "--quiet"]).arg(&rendered));
        assert!(!said.contains("ERROR") && !said.contains("WARN"), "{folder}:\n{said}");

        for document in documents.iter().filter(|d| ["Deployment", "DaemonSet"].contains(&d["kind"].as_str().unwrap()))
        {
            let name = document["metadata"]["name"].as_str().unwrap();
            let pod = &document["spec"]["template"]["spec"];
            let container = &pod["containers"][0];
            assert!(container["image"].as_str().unwrap().starts_with("ringtrain:"), "{name}");
            // $(NODE_NAME) and the like are the kubelet's: any word stands in for them here
            let args: Vec<String> = container["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().replace("$(NODE_NAME)", "node-1").replace("$(POD_IP)", "10.0.0.7"))
                .collect();
            let env: Vec<String> =
                container["env"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap().to_string()).collect();
            assert_accepted(&args, &env);
            // the server is probed where it says it is ready, and no container keeps a capability it does not need
            if document["kind"] == "Deployment" {
                assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz", "{name}");
                assert_eq!(document["spec"]["replicas"], 2, "{name}");
            }
            assert_eq!(container["securityContext"]["allowPrivilegeEscalation"], false, "{name}");
            assert_eq!(container["securityContext"]["capabilities"]["drop"][0], "ALL", "{name}");
            assert_eq!(pod["automountServiceAccountToken"], false, "{name}");
        }
    }
}
