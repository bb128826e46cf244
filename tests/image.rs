//! The OCI image: `scripts/image.sh` builds it with podman from this test's binary, and
//! the image's own root filesystem (`podman mount`, then `chroot`, since a container engine may not run
//! here) runs `ringtrain doctor` and a one-epoch `train --local 2`, with exactly the image's environment and
//! entrypoint: a library, a data file or an account the image lacks fails this test.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn run(command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{command:?} failed:\n{said}");
    said
}

fn stdout(command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(out.status.success(), "{command:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The image's container, mounted, with the host's /proc and /dev bound into it; all undone when dropped.
struct Mounted {
    image: String,
    container: String,
    root: PathBuf,
    bound: Vec<PathBuf>,
}

impl Mounted {
    fn new(image: &str) -> Mounted {
        let container = stdout(Command::new("podman").args(["create", image]));
        let root = PathBuf::from(stdout(Command::new("podman").args(["mount", &container])));
        let mut mounted = Mounted { image: image.to_string(), container, root, bound: Vec::new() };
        for host in ["/proc", "/dev"] {
            let inside = mounted.root.join(&host[1..]);
            run(Command::new("mount").arg("--bind").arg(host).arg(&inside));
            mounted.bound.push(inside);
        }
        mounted
    }

    /// Runs the image's entrypoint with `args` inside its root, in exactly the image's environment.
    fn entrypoint(&self, args: &[&str]) -> Command {
        let config: Value = serde_json::from_str(&stdout(Command::new("podman").args([
            "image",
            "inspect",
            "--format",
            "{{json .Config}}",
            &self.image,
        ])))
        .unwrap();
        let entrypoint: Vec<&str> =
            config["Entrypoint"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        let mut command = Command::new("chroot");
        command.arg(&self.root).args(&entrypoint).args(args).env_clear();
        for variable in config["Env"].as_array().unwrap() {
            let (name, value) = variable.as_str().unwrap().split_once('=').unwrap();
            command.env(name, value);
        }
        command
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        for inside in self.bound.iter().rev() {
            let _ = Command::new("umount").arg(inside).status();
        }
        let _ = Command::new("podman").args(["umount", &self.container]).output();
        let _ = Command::new("podman").args(["rm", "-f", &self.container]).output();
        let _ = Command::new("podman").args(["rmi", &self.image]).output();
    }
}

#[test]
fn the_image_runs_doctor_and_trains_in_its_own_root_filesystem() {
    assert!(
        ringtrain_sandbox::probe().root,
        "building the image and mounting its root filesystem needs root (podman, mount, chroot)"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tag = format!("localhost/ringtrain-image-test:{}", std::process::id());
    let built = run(Command::new(root.join("scripts/image.sh")).args([
        "--tag",
        &tag,
        "--binary",
        env!("CARGO_BIN_EXE_ringtrain"),
    ]));
    eprintln!("{built}");
    let image = Mounted::new(&tag);

    let doctor = run(&mut image.entrypoint(&["doctor"]));
    assert!(doctor.contains("libtorch (built against)  2.11.0"), "{doctor}");
    assert!(doctor.contains("dataset fashion-mnist     present"), "{doctor}");
    assert!(doctor.contains("rank user               ringtrain-rank (uid 10002"), "{doctor}");

    let spec = serde_json::json!({
        "model": {"name": "lenet5"}, "dataset": "fashion-mnist", "train_samples": 6000, "test_samples": 500,
        "workers": 2, "per_worker_batch": 32, "epochs": 1,
        "lr": {"base": 0.05, "reference_batch": 64, "warmup": {"kind": "none"}}, "seed": 3
    });
    std::fs::write(image.root.join("tmp/spec.json"), spec.to_string()).unwrap();
    let trained =
        run(&mut image.entrypoint(&["train", "--local", "2", "--spec", "/tmp/spec.json", "--out", "/tmp/out"]));
    let result: Value =
        serde_json::from_slice(&std::fs::read(image.root.join("tmp/out/result.json")).unwrap()).unwrap();
    let error = result["final_test_error"].as_f64().unwrap_or_else(|| panic!("{result}\n{trained}"));
    assert!(error < 0.7, "test error {error} after one epoch inside the image is no better than chance:\n{trained}");
}
