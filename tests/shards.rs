//! Training from a sharded data set with real `ringtrain train` rank processes: Debian's
//! Fashion-MNIST written as an image folder of JPEGs, packed by `ringtrain datasets pack`, streamed by the
//! ranks. The same 4-worker job on 1, 2 and 4 processes takes the same samples in the same order (every
//! iteration's loss equal within 1e-5 relative), a stop mid-epoch resumed on another number of processes
//! continues it, and a damaged shard fails the job naming the shard. A rank's memory does not grow with
//! its data set (synthetic photographs of ImageNet's size, 4× as many: the same peak). Through the API
//! (`ringtrain up`), a job trains from shards inside an allowed root, its ranks confined, and a folder
//! outside it is refused.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ringtrain_data::synthetic::Chroma;
use ringtrain_worker::metrics::Metric;
use serde_json::{json, Value};
use support::shards::{open_to_ranks, pack, packed, ringtrain};

mod support;

/// LeNet-5 on the shards, 4 workers; elastic, so its gradients are summed in worker order on any number of
/// processes (a fixed job may sum them in another order, which moves the losses in their last bits).
fn spec(dir: &Path, shards: &Path, epochs: u32) -> PathBuf {
    let spec = json!({
        "model": {"name": "lenet5"}, "dataset": format!("shards:{}", shards.display()), "image_size": 28,
        "workers": 4, "devices": {"min": 1}, "per_worker_batch": 16, "epochs": epochs, "seed": 3,
        "log_every_iterations": 1,
        "lr": {"base": 0.05, "reference_batch": 64, "warmup": {"kind": "none"}, "decay": {"kind": "none"}}
    });
    let path = dir.join(format!("spec-{epochs}.json"));
    std::fs::write(&path, spec.to_string()).unwrap();
    path
}

fn train(spec: &Path, processes: usize, extra: &[&str], out: &Path) -> Output {
    ringtrain()
        .arg("train")
        .arg("--spec")
        .arg(spec)
        .args(["--local", &processes.to_string(), "--comm-timeout-s", "60", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

/// (iteration, loss) of rank 0's lines.
fn losses(output: &Output) -> Vec<(u64, f64)> {
    assert!(output.status.success(), "training failed:\n{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Metric>(l).ok())
        .filter_map(|m| match m {
            Metric::Iteration { rank: 0, iteration, loss, .. } => Some((iteration, loss)),
            _ => None,
        })
        .collect()
}

fn assert_close(a: &[(u64, f64)], b: &[(u64, f64)], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: {} against {} iterations", a.len(), b.len());
    for ((i, x), (j, y)) in a.iter().zip(b) {
        assert_eq!(i, j, "{what}");
        assert!((x - y).abs() <= 1e-5 * x.abs().max(y.abs()), "{what}: iteration {i}: {x} against {y}");
    }
}

#[test]
fn the_same_job_on_1_2_and_4_processes_takes_the_same_samples_and_a_resume_continues_it() {
    let dir = tempfile::tempdir().unwrap();
    let shards = packed(dir.path());
    let spec = spec(dir.path(), &shards, 2);
    let one = losses(&train(&spec, 1, &["--virtual-ranks", "4"], &dir.path().join("one")));
    assert_eq!(one.len(), 2 * (2400 / 64), "every iteration of both epochs");
    assert!(one.last().unwrap().1 < one[0].1, "it learns: {:?} → {:?}", one[0], one.last());
    let two = losses(&train(&spec, 2, &[], &dir.path().join("two")));
    assert_close(&one, &two, "2 processes of 2 virtual ranks against 1 of 4");
    let four = losses(&train(&spec, 4, &[], &dir.path().join("four")));
    assert_close(&one, &four, "4 processes against 1 of 4 virtual ranks");

    // stopped on request at iteration 50 (mid-epoch 2) on 2 processes, resumed on 4 from that checkpoint (an
    // elastic resize mid-epoch): the rest of the same run, its shards not read again from the epoch's start
    let stopped = dir.path().join("stopped");
    let mut first = Command::new(env!("CARGO_BIN_EXE_ringtrain"));
    first.arg("train").arg("--spec").arg(&spec).args(["--local", "2", "--comm-timeout-s", "60", "--out"]).arg(&stopped);
    let first = first.env("RINGTRAIN_STOP", "0:50").output().unwrap();
    assert_eq!(first.status.code(), Some(4), "a stop on request:\n{}", String::from_utf8_lossy(&first.stderr));
    let mut stitched: Vec<(u64, f64)> = String::from_utf8_lossy(&first.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Metric>(l).ok())
        .filter_map(|m| match m {
            Metric::Iteration { rank: 0, iteration, loss, .. } => Some((iteration, loss)),
            _ => None,
        })
        .collect();
    assert_eq!(stitched.last().map(|l| l.0), Some(50));
    let checkpoints = stopped.join("checkpoints");
    stitched.extend(losses(&train(
        &spec,
        4,
        &["--resume", checkpoints.to_str().unwrap()],
        &dir.path().join("resumed"),
    )));
    assert_close(&stitched, &one, "stopped on 2 processes and resumed on 4, against the uninterrupted run");
}

#[test]
fn a_damaged_shard_fails_the_job_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let shards = packed(dir.path());
    let index: Value = serde_json::from_str(&std::fs::read_to_string(shards.join("index.json")).unwrap()).unwrap();
    let name = index["train"]["shards"][1]["name"].as_str().unwrap().to_string();
    let path = shards.join(&name);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 4096]).unwrap();
    let output = train(&spec(dir.path(), &shards, 1), 1, &["--virtual-ranks", "4"], &dir.path().join("out"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "a job error, not retried:\n{stderr}");
    assert!(stderr.contains(&format!("shard {name} at byte")) && stderr.contains("the index says"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_trains_through_the_api_from_shards_inside_an_allowed_root() {
    let dir = tempfile::tempdir().unwrap();
    let shards = packed(dir.path());
    open_to_ranks(dir.path());
    // the server's and the agent's --idx-root (nextest runs each test in a process of its own)
    std::env::set_var("RINGTRAIN_IDX_ROOTS", dir.path());
    let cluster = support::Cluster::up("shards-api", 2).await;
    let api = cluster.team("shards", 2).await;
    let spec = json!({
        "name": "lenet5 from shards", "model": {"name": "lenet5"}, "dataset": format!("shards:{}", shards.display()),
        "image_size": 28, "workers": 2, "per_worker_batch": 32, "epochs": 2, "seed": 1,
        "lr": {"base": 0.05, "reference_batch": 64, "warmup": {"kind": "none"}, "decay": {"kind": "none"}}
    });
    // registered by reference with the command line, and trained on by its id
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringtrain"))
        .args(["datasets", "register", shards.to_str().unwrap(), "--name", "fashion", "--json"])
        .args(["--server", &cluster.url, "--token", support::ADMIN_TOKEN])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let registered: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((&registered["train_samples"], &registered["num_classes"]), (&json!(2400), &json!(10)), "{registered}");
    let mut by_id = spec.clone();
    by_id["dataset"] = registered["id"].clone();
    let id = cluster.api.submit(&by_id).await;
    let job = cluster.api.wait_state(&id, "succeeded", std::time::Duration::from_secs(240)).await;
    assert_eq!(job["spec"]["dataset"], format!("shards:{}", shards.display()), "stored naming its source");
    let error = job["result"]["final_test_error"].as_f64().unwrap();
    assert!(error < 0.6, "it learned from the shards: final test error {error}");
    let logs = cluster.api.get(&format!("/v1/jobs/{id}/logs?q=sandbox")).await;
    assert!(logs.to_string().contains("seccomp on"), "its ranks were confined: {logs}");

    let mut outside = spec.clone();
    outside["dataset"] = json!("shards:/etc");
    let (status, problem) = api.request(reqwest::Method::POST, "/v1/jobs", Some(outside)).await;
    assert_eq!(status, 422, "{problem}");
    assert!(problem.to_string().contains("dataset") && problem.to_string().contains("inside"), "{problem}");
}

/// The most memory rank 0 held resident, over its iteration reports, training one epoch of LeNet-5 at 32×32
/// on `per_class` × 4 synthetic photographs of ImageNet's size (about 110 KB each), packed; and the bytes of
/// the training shards.
fn peak_memory_training_on(dir: &Path, per_class: u32) -> (f64, u64) {
    let photos = dir.join(format!("photos-{per_class}"));
    ringtrain_data::synthetic::image_folder(&photos.join("train"), 4, per_class, (400, 350), Chroma::Full, 7).unwrap();
    ringtrain_data::synthetic::image_folder(&photos.join("test"), 4, 8, (400, 350), Chroma::Full, 8).unwrap();
    let shards = photos.join("shards");
    pack(&photos, &shards, 8.0);
    let index: Value = serde_json::from_str(&std::fs::read_to_string(shards.join("index.json")).unwrap()).unwrap();
    let bytes = index["train"]["shards"].as_array().unwrap().iter().map(|s| s["bytes"].as_u64().unwrap()).sum();
    let spec = json!({
        "model": {"name": "lenet5"}, "dataset": format!("shards:{}", shards.display()), "image_size": 32,
        "workers": 1, "per_worker_batch": 16, "epochs": 1, "seed": 3, "log_every_iterations": 1,
        "lr": {"base": 0.01, "reference_batch": 16, "warmup": {"kind": "none"}, "decay": {"kind": "none"}}
    });
    let spec_path = photos.join("spec.json");
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let trained = train(&spec_path, 1, &[], &photos.join("out"));
    assert!(trained.status.success(), "training failed:\n{}", String::from_utf8_lossy(&trained.stderr));
    let peak = String::from_utf8_lossy(&trained.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Metric>(l).ok())
        .filter_map(|m| match m {
            Metric::Iteration { rank: 0, peak_rss_bytes, .. } => Some(peak_rss_bytes),
            _ => None,
        })
        .fold(0.0, f64::max);
    assert!(peak > 0.0, "rank 0 reported its memory");
    (peak, bytes)
}

/// A rank's memory is bounded by its window, not by its data set: the same job on four times the images
/// peaks within 40 MB of the smaller one, where holding the larger set's bytes would add about 100 MB.
#[test]
fn a_ranks_memory_does_not_grow_with_its_data_set() {
    let dir = tempfile::tempdir().unwrap();
    let (small, small_bytes) = peak_memory_training_on(dir.path(), 75);
    let (large, large_bytes) = peak_memory_training_on(dir.path(), 300);
    let mib = |bytes: f64| bytes / f64::from(1 << 20);
    assert!(large_bytes > 3 * small_bytes && large_bytes - small_bytes > 90 << 20, "{small_bytes} {large_bytes}");
    assert!(
        large - small < f64::from(40 << 20),
        "peak {:.0} MiB training on {:.0} MiB of shards against {:.0} MiB on {:.0} MiB",
        mib(large),
        mib(large_bytes as f64),
        mib(small),
        mib(small_bytes as f64)
    );
    eprintln!(
        "peak {:.0} MiB on {:.0} MiB of shards, {:.0} MiB on {:.0} MiB",
        mib(small),
        mib(small_bytes as f64),
        mib(large),
        mib(large_bytes as f64)
    );
}
