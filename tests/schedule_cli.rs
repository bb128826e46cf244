//! `ringtrain schedule` end to end: the real binary on the example specs.

use std::process::{Command, Output};

use serde_json::Value;

fn ringtrain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ringtrain")).args(args).output().expect("ringtrain runs")
}

fn write_spec(name: &str, json: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ringtrain-schedule-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, json).unwrap();
    path
}

#[test]
fn goyal_example_gives_the_papers_schedule() {
    let out = ringtrain(&["schedule", "--spec", "examples/goyal-resnet50-imagenet.json", "--dataset-size", "1281167"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["effective"]["global_batch"], 8192);
    assert_eq!(view["effective"]["scaled_lr"], 3.2);
    let epochs = view["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 90);
    assert_eq!(epochs[0]["lr_first"], 0.1);
    assert_eq!(epochs[5]["lr_first"], 3.2);
    let lr_at = |e: usize| epochs[e]["lr_first"].as_f64().unwrap();
    for (epoch, lr) in [(30, 0.32), (60, 0.032), (80, 0.0032)] {
        assert!((lr_at(epoch) - lr).abs() < 1e-12, "epoch {epoch}: {}", lr_at(epoch));
    }
    assert!(view.get("per_iteration").is_none());
}

#[test]
fn fashion_mnist_example_lists_every_iteration_on_request() {
    let out = ringtrain(&["schedule", "--spec", "examples/fashion-mnist-lenet5.json", "--per-iteration"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    let per_iteration = view["per_iteration"].as_array().unwrap();
    assert_eq!(per_iteration.len() as u64, view["effective"]["total_iterations"].as_u64().unwrap());
    assert_eq!(view["effective"]["iterations_per_epoch"], 60_000 / 64);
}

#[test]
fn invalid_spec_exits_2_with_every_field_error() {
    let spec = write_spec(
        "bad.json",
        r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "workers": 0, "epochs": 10,
            "lr": {"base": -0.1, "warmup": {"epochs": 12}}}"#,
    );
    let out = ringtrain(&["schedule", "--spec", spec.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for expected in [
        "workers: must be from 1 to 4096 (got 0)",
        "lr.base: must be > 0 and <= 100 (got -0.1)",
        "lr.warmup.epochs: must be < epochs (got 12, epochs = 10)",
    ] {
        assert!(stderr.contains(expected), "missing {expected:?} in:\n{stderr}");
    }
    assert!(out.stdout.is_empty());
}

#[test]
fn unknown_dataset_size_asks_for_it() {
    let out = ringtrain(&["schedule", "--spec", "examples/goyal-resnet50-imagenet.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("dataset: the size of shards:/data/imagenet-shards is not known")
    );
}

#[test]
fn every_example_spec_is_valid() {
    let mut seen = 0;
    for entry in std::fs::read_dir("examples").unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).unwrap();
            if let Err(errors) = ringtrain_core::JobSpec::from_json(&text) {
                panic!("{} is invalid: {errors:?}", path.display());
            }
            seen += 1;
        }
    }
    assert!(seen >= 4, "only {seen} example specs found");
}
