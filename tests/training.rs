//! The training engine end to end: real `ringtrain train` rank processes talking over the TCP ring,
//! checked against large-batch SGD computed here, against virtual ranks, and across a crash and resume.
//!
//! Over 450 lines: one scenario per test, each a few real rank processes and the reference it is held to.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ringtrain_core::{Effective, JobSpec};
use ringtrain_worker::data::shuffle::{batch_indices, epoch_permutation};
use ringtrain_worker::data::Dataset;
use ringtrain_worker::metrics::Metric;
use ringtrain_worker::models;
use ringtrain_worker::optim::{Sgd, SgdConfig};
use serde_json::Value;
use tch::nn::VarStore;
use tch::{Device, Tensor};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringtrain-training-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_spec(dir: &Path, spec: &Value) -> PathBuf {
    let path = dir.join("spec.json");
    std::fs::write(&path, serde_json::to_vec_pretty(spec).unwrap()).unwrap();
    path
}

fn ringtrain() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ringtrain"))
}

/// `ringtrain train --local`, not yet run.
fn local_command(spec: &Path, processes: usize, extra: &[&str], out: &Path) -> Command {
    let mut command = ringtrain();
    command.arg("train").arg("--spec").arg(spec).args(["--local", &processes.to_string(), "--out"]).arg(out);
    command.args(["--comm-timeout-s", "60"]).args(extra);
    command
}

fn train_local(spec: &Path, processes: usize, extra: &[&str], out: &Path) -> Output {
    let output = local_command(spec, processes, extra, out).output().unwrap();
    assert!(output.status.success(), "training failed:\n{}", String::from_utf8_lossy(&output.stderr));
    output
}

fn metrics(output: &[u8]) -> Vec<Metric> {
    String::from_utf8_lossy(output).lines().map(|l| serde_json::from_str(l).expect("a metrics line")).collect()
}

fn final_model(out: &Path) -> Vec<(String, Tensor)> {
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
    let mut named =
        Tensor::read_safetensors(out.join("checkpoints").join(latest.trim()).join("model.safetensors")).unwrap();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

fn batch_norm_stats(out: &Path) -> Vec<(String, Tensor)> {
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
    let mut named =
        Tensor::read_safetensors(out.join("checkpoints").join(latest.trim()).join("batch_norm.safetensors")).unwrap();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

/// ‖a − b‖ / ‖b‖ over every tensor, the worst one.
fn worst_relative_difference(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|((na, ta), (nb, tb))| {
            assert_eq!(na, nb);
            let diff = (ta - tb).norm().double_value(&[]);
            diff / tb.norm().double_value(&[]).max(1e-12)
        })
        .fold(0.0, f64::max)
}

/// An MLP without BN on synthetic data: 2 epochs of 10 iterations, gradual warmup over 1.5 epochs (the lr
/// changes every step), then constant.
fn mlp_spec(workers: usize, batch: usize, form: &str) -> Value {
    serde_json::json!({
        "model": {"name": "mlp", "hidden": [32, 16]},
        "dataset": format!("synthetic:{}", 10 * workers * batch),
        "workers": workers,
        "per_worker_batch": batch,
        "epochs": 2,
        "lr": {"base": 0.05, "reference_batch": 8, "warmup": {"kind": "gradual", "epochs": 1.5}, "decay": {"kind": "none"}},
        "optimizer": {"momentum": 0.9, "nesterov": true, "momentum_form": form, "weight_decay": 0.0005},
        "seed": 11,
        "checkpoint_every_epochs": 2,
        "log_every_iterations": 1
    })
}

/// Large-batch SGD written out directly: one process, one forward pass over all kn samples of each
/// iteration (the union of the k ranks' batches), the same schedule and optimizer.
fn reference_large_batch(spec: &JobSpec) -> Vec<(String, Tensor)> {
    let mut data = Dataset::load(&spec.dataset, None, None).unwrap();
    let eff = Effective::new(spec, data.train_len() as u64).unwrap();
    tch::manual_seed(spec.seed as i64);
    let vs = VarStore::new(Device::Cpu);
    let model = models::build(&spec.model, &vs.root(), &data.sample_shape(), data.classes(), true).unwrap();
    let mut opt = Sgd::new(&vs, SgdConfig::from_effective(&eff));
    let (k, n) = (spec.workers as usize, spec.per_worker_batch as usize);
    for epoch in 0..u64::from(eff.epochs) {
        let perm = epoch_permutation(spec.seed, epoch, data.train_len());
        for t in 0..eff.iterations_per_epoch as usize {
            let indices: Vec<i64> = (0..k).flat_map(|r| batch_indices(&perm, k, r, t, n).to_vec()).collect();
            let (x, y) = data.train_batch(&indices, Device::Cpu).unwrap();
            opt.zero_grad();
            model.forward_t(&x[0], true).cross_entropy_for_logits(&y).backward();
            let grads = opt.local_gradients();
            opt.step(eff.lr_at(epoch * eff.iterations_per_epoch + t as u64), &grads);
        }
    }
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

#[test]
fn k_rank_processes_take_the_steps_of_one_large_batch() {
    tch::set_num_threads(1);
    for form in ["goyal", "pytorch"] {
        for k in [2, 4] {
            let dir = scratch(&format!("equivalence-{form}-{k}"));
            let spec_json = mlp_spec(k, 8, form);
            let spec_path = write_spec(&dir, &spec_json);
            let out = dir.join("out");
            let output = train_local(&spec_path, k, &[], &out);
            let lines = metrics(&output.stdout);
            let iterations = lines.iter().filter(|m| matches!(m, Metric::Iteration { rank: 0, .. })).count();
            assert_eq!(iterations, 20, "20 steps");

            let spec = JobSpec::from_json(&spec_json.to_string()).unwrap();
            let worst = worst_relative_difference(&final_model(&out), &reference_large_batch(&spec));
            assert!(worst < 1e-5, "{form}, k = {k}: parameters differ by {worst:e} (relative)");
            std::fs::remove_dir_all(dir).unwrap();
        }
    }
}

fn resnet_spec(workers: usize) -> Value {
    serde_json::json!({
        "model": {"name": "resnet20"},
        "dataset": "synthetic:320",
        "workers": workers,
        "per_worker_batch": 8,
        "epochs": 2,
        "lr": {"base": 0.1, "reference_batch": 16, "warmup": {"kind": "gradual", "epochs": 1}, "decay": {"kind": "none"}},
        "seed": 5,
        "checkpoint_every_epochs": 2,
        "log_every_iterations": 5
    })
}

#[test]
fn virtual_ranks_reproduce_real_ranks_with_batch_norm() {
    let dir = scratch("virtual");
    let spec = write_spec(&dir, &resnet_spec(2));
    let (real, virt) = (dir.join("real"), dir.join("virtual"));
    train_local(&spec, 2, &[], &real);
    train_local(&spec, 1, &["--virtual-ranks", "2"], &virt);

    let worst = worst_relative_difference(&final_model(&virt), &final_model(&real));
    assert!(worst < 1e-5, "weights differ by {worst:e}");
    let (real_bn, virt_bn) = (batch_norm_stats(&real), batch_norm_stats(&virt));
    let worst = worst_relative_difference(&virt_bn, &real_bn);
    assert!(worst < 1e-5, "per-rank BN statistics differ by {worst:e}");

    // BN statistics are per rank: rank 0's and rank 1's differ (their shards differ)
    let of_rank = |r: usize| -> Vec<&Tensor> {
        real_bn.iter().filter(|(n, _)| n.starts_with(&format!("rank{r}."))).map(|(_, t)| t).collect()
    };
    let (r0, r1) = (of_rank(0), of_rank(1));
    assert!(!r0.is_empty() && r0.len() == r1.len());
    assert!(r0.iter().zip(&r1).any(|(a, b)| !a.allclose(b, 1e-4, 1e-6, false)), "BN statistics were synchronised");
    std::fs::remove_dir_all(dir).unwrap();
}

/// The all-reduce overlapped with backward (`--overlap`) trains the same weights, bit for bit, as summing
/// after backward: ResNet-20's gradients in 5 buckets, 2 rank processes over shared memory.
#[test]
fn overlapping_the_all_reduce_with_backward_changes_no_bit() {
    let dir = scratch("overlap");
    let spec = write_spec(&dir, &resnet_spec(2));
    let (overlapped, after) = (dir.join("overlapped"), dir.join("after"));
    let run = train_local(&spec, 2, &["--overlap"], &overlapped);
    assert!(String::from_utf8_lossy(&run.stderr).contains("overlapped with backward"), "the ranks say they overlap");
    let plain = train_local(&spec, 2, &[], &after);
    assert!(!String::from_utf8_lossy(&plain.stderr).contains("overlapped"), "by default they do not");
    let (a, b) = (final_model(&overlapped), final_model(&after));
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(x.equal(y), "{name} differs");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// The files of a run's newest checkpoint, as bytes.
fn checkpoint_files(out: &Path) -> Vec<(String, Vec<u8>)> {
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
    ["model.safetensors", "optimizer.safetensors", "batch_norm.safetensors"]
        .map(|file| (file.to_string(), std::fs::read(out.join("checkpoints").join(latest.trim()).join(file)).unwrap()))
        .to_vec()
}

/// ResNet-20 cut after `layer2` (`--pipeline-cuts`): 2 workers of 2 stage processes, the stages passing
/// activations and gradients over their links and each stage summing its gradients with the other
/// worker's, train the losses of 2 unsplit rank processes to the bit, write the unsplit run's checkpoint
/// byte for byte (assembled from the stages), and resume from the unsplit run's checkpoint to its end; one
/// worker of three stages trains as one process playing every rank.
#[test]
fn a_model_cut_into_pipeline_stages_trains_and_checkpoints_as_the_unsplit_one() {
    let dir = scratch("pipeline");
    let mut spec = resnet_spec(4);
    spec["epochs"] = 3.into();
    spec["checkpoint_every_epochs"] = 1.into();
    spec["log_every_iterations"] = 1.into();
    let spec_path = write_spec(&dir, &spec);
    let (unsplit_out, split_out) = (dir.join("unsplit"), dir.join("split"));
    let unsplit = metrics(&train_local(&spec_path, 2, &[], &unsplit_out).stdout);
    let split = metrics(&train_local(&spec_path, 4, &["--pipeline-cuts", "layer2"], &split_out).stdout);
    assert_eq!(losses(&split).len(), 30, "one line per iteration, from worker 0's first stage only");
    assert_eq!(losses(&split), losses(&unsplit), "every iteration's loss and lr");
    assert_eq!(epoch_records(&split), epoch_records(&unsplit));
    assert!(checkpoint_files(&split_out) == checkpoint_files(&unsplit_out), "the checkpoint is the unsplit one's");

    // the stages resume from the unsplit run's second checkpoint, each taking its own variables
    let resume = dir.join("resume");
    std::fs::create_dir(&resume).unwrap();
    let second = unsplit_out.join("checkpoints/epoch-0002");
    std::fs::create_dir(resume.join("epoch-0002")).unwrap();
    for file in std::fs::read_dir(&second).unwrap() {
        let file = file.unwrap();
        std::fs::copy(file.path(), resume.join("epoch-0002").join(file.file_name())).unwrap();
    }
    std::fs::write(resume.join("latest"), "epoch-0002").unwrap();
    let resumed_out = dir.join("resumed");
    let extra = ["--pipeline-cuts", "layer2", "--resume", resume.to_str().unwrap()];
    let resumed = metrics(&train_local(&spec_path, 4, &extra, &resumed_out).stdout);
    let expected: Vec<_> = losses(&unsplit).into_iter().filter(|l| l.0 >= 20).collect();
    assert_eq!(losses(&resumed), expected, "the third epoch, resumed");
    assert!(checkpoint_files(&resumed_out) == checkpoint_files(&unsplit_out), "the same final checkpoint");

    // one worker of three stages (a middle stage receives and sends both ways) playing all 4 ranks: one
    // process playing them, to the bit
    let (three_out, one_out) = (dir.join("three"), dir.join("one"));
    let three = metrics(&train_local(&spec_path, 3, &["--pipeline-cuts", "layer1.1,layer3.0"], &three_out).stdout);
    let one = metrics(&train_local(&spec_path, 1, &["--virtual-ranks", "4"], &one_out).stdout);
    assert_eq!(losses(&three), losses(&one), "three stages against one process");
    assert!(checkpoint_files(&three_out) == checkpoint_files(&one_out), "three stages' checkpoint is one process's");
    std::fs::remove_dir_all(dir).unwrap();
}

fn spawn_ranks(spec: &Path, world: usize, out: &Path, extra: &[&str], env: Option<(&str, &str)>) -> Vec<Child> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    (0..world)
        .map(|rank| {
            let mut cmd = ringtrain();
            cmd.arg("train").arg("--spec").arg(spec);
            cmd.args(["--rank", &rank.to_string(), "--world", &world.to_string()]);
            cmd.args(["--rendezvous", &format!("127.0.0.1:{port}"), "--comm-timeout-s", "10", "--out"]);
            cmd.arg(out).args(extra).stdout(Stdio::piped()).stderr(Stdio::piped());
            if let Some((k, v)) = env {
                cmd.env(k, v);
            }
            cmd.spawn().unwrap()
        })
        .collect()
}

fn epoch_records(lines: &[Metric]) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|m| match m {
            Metric::Epoch(r) if r.rank == 0 => {
                let mut v = serde_json::to_value(r).unwrap();
                v.as_object_mut().unwrap().remove("seconds");
                Some(v)
            }
            _ => None,
        })
        .collect()
}

fn losses(lines: &[Metric]) -> Vec<(u64, f64, f64)> {
    lines
        .iter()
        .filter_map(|m| match m {
            Metric::Iteration { rank: 0, iteration, loss, lr, .. } => Some((*iteration, *loss, *lr)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_crashed_run_resumes_bit_for_bit_from_its_checkpoint() {
    let dir = scratch("resume");
    let mut spec = resnet_spec(2);
    spec["epochs"] = 3.into();
    spec["checkpoint_every_epochs"] = 1.into();
    spec["dataset"] = "synthetic:240".into(); // 15 iterations per epoch
    let spec_path = write_spec(&dir, &spec);

    let whole = dir.join("whole");
    let uninterrupted = metrics(&train_local(&spec_path, 2, &[], &whole).stdout);

    // rank 1 crashes (abort, like kill -9) in the middle of the third epoch
    let crashed = dir.join("crashed");
    let children = spawn_ranks(&spec_path, 2, &crashed, &[], Some(("RINGTRAIN_CRASH", "1:37")));
    let outputs: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    assert!(outputs.iter().all(|o| !o.status.success()), "both ranks must fail");
    let survivor = String::from_utf8_lossy(&outputs[0].stderr);
    assert!(survivor.contains("rank 1"), "rank 0 should name rank 1: {survivor}");
    assert_eq!(std::fs::read_to_string(crashed.join("checkpoints/latest")).unwrap().trim(), "epoch-0002");
    let before_crash = metrics(&outputs[0].stdout);

    let resumed_out = dir.join("resumed");
    let resume_from = crashed.join("checkpoints");
    let resumed =
        metrics(&train_local(&spec_path, 2, &["--resume", resume_from.to_str().unwrap()], &resumed_out).stdout);

    // epochs 0-1 from before the crash, epoch 2 from the resumed run: identical to the uninterrupted run
    let mut stitched = epoch_records(&before_crash);
    stitched.truncate(2);
    stitched.extend(epoch_records(&resumed));
    assert_eq!(stitched, epoch_records(&uninterrupted));
    let resumed_losses = losses(&resumed);
    assert_eq!(resumed_losses.first().map(|l| l.0), Some(34), "the resumed run starts at epoch 2's first logged step");
    let expected: Vec<_> = losses(&uninterrupted).into_iter().filter(|l| l.0 >= 30).collect();
    assert_eq!(resumed_losses, expected);
    let worst = worst_relative_difference(&final_model(&resumed_out), &final_model(&whole));
    assert_eq!(worst, 0.0, "final weights must be bit-identical");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_run_stopped_on_request_mid_epoch_resumes_bit_for_bit() {
    let dir = scratch("stop");
    let mut spec = resnet_spec(2);
    spec["epochs"] = 3.into();
    spec["checkpoint_every_epochs"] = 1.into();
    spec["log_every_iterations"] = 1.into();
    spec["dataset"] = "synthetic:240".into(); // 15 iterations per epoch
    let spec_path = write_spec(&dir, &spec);
    let whole = dir.join("whole");
    let uninterrupted = metrics(&train_local(&spec_path, 2, &[], &whole).stdout);

    // rank 1 asks to stop at iteration 20 (the sixth step of epoch 1), as a preempting agent would
    let stopped = dir.join("stopped");
    let children = spawn_ranks(&spec_path, 2, &stopped, &[], Some(("RINGTRAIN_STOP", "1:20")));
    let outputs: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    for (rank, output) in outputs.iter().enumerate() {
        assert_eq!(output.status.code(), Some(4), "rank {rank}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let latest = std::fs::read_to_string(stopped.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), "epoch-0001-iter-0000000021", "a checkpoint of exactly where every rank stopped");
    let before_stop = metrics(&outputs[0].stdout);
    assert_eq!(losses(&before_stop).last().map(|l| l.0), Some(20));

    let resumed_out = dir.join("resumed");
    let resume_from = stopped.join("checkpoints");
    let resumed =
        metrics(&train_local(&spec_path, 2, &["--resume", resume_from.to_str().unwrap()], &resumed_out).stdout);
    let mut stitched_losses = losses(&before_stop);
    stitched_losses.extend(losses(&resumed));
    assert_eq!(stitched_losses, losses(&uninterrupted), "every iteration once, with the same loss and lr");
    // The interrupted epoch's record (its running sums were in the checkpoint) matches too.
    let mut stitched = epoch_records(&before_stop);
    stitched.extend(epoch_records(&resumed));
    assert_eq!(stitched, epoch_records(&uninterrupted));
    let worst = worst_relative_difference(&final_model(&resumed_out), &final_model(&whole));
    assert_eq!(worst, 0.0, "final weights must be bit-identical");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `ringtrain train --local` with an environment, whatever its exit status (4: stopped on request).
fn train_local_stopping(spec: &Path, processes: usize, extra: &[&str], out: &Path, stop: &str) -> Output {
    let output = local_command(spec, processes, extra, out).env("RINGTRAIN_STOP", stop).output().unwrap();
    assert_eq!(output.status.code(), Some(4), "a stop on request:\n{}", String::from_utf8_lossy(&output.stderr));
    output
}

/// Issue 29's ground: an elastic 4-worker run resized at its stops, 4 → 2 → 4 devices (each of the 2 playing 2
/// virtual ranks, each virtual rank keeping its BatchNorm statistics and its shard), is the same job run on 4
/// devices throughout: every iteration's loss within 1e-5 relative (they are in fact equal: an elastic job
/// sums its gradients in virtual-rank order on any layout), the same lr, the same test error to 0.1 point.
#[test]
fn a_run_resized_at_its_stops_trains_the_fixed_run() {
    let dir = scratch("resized");
    let mut spec = resnet_spec(4);
    spec["devices"] = serde_json::json!({"min": 2});
    spec["epochs"] = 3.into();
    spec["log_every_iterations"] = 1.into();
    spec["dataset"] = "synthetic:480".into(); // 15 iterations per epoch
    let spec_path = write_spec(&dir, &spec);
    let fixed = metrics(&train_local(&spec_path, 4, &[], &dir.join("fixed")).stdout);

    // on 4 devices until a stop after iteration 11, on 2 until one after iteration 29, then on 4 again
    let first = dir.join("first");
    let part_one = metrics(&train_local_stopping(&spec_path, 4, &[], &first, "1:11").stdout);
    let second = dir.join("second");
    let resume_first = first.join("checkpoints");
    let on_two = ["--virtual-ranks", "2", "--resume", resume_first.to_str().unwrap()];
    let part_two = metrics(&train_local_stopping(&spec_path, 2, &on_two, &second, "1:29").stdout);
    let resume_second = second.join("checkpoints");
    let part_three =
        metrics(&train_local(&spec_path, 4, &["--resume", resume_second.to_str().unwrap()], &dir.join("third")).stdout);

    let resized: Vec<(u64, f64, f64)> =
        [&part_one, &part_two, &part_three].into_iter().flat_map(|part| losses(part)).collect();
    let expected = losses(&fixed);
    assert_eq!(resized.iter().map(|l| l.0).collect::<Vec<_>>(), expected.iter().map(|l| l.0).collect::<Vec<_>>());
    for ((iteration, loss, lr), (_, fixed_loss, fixed_lr)) in resized.iter().zip(&expected) {
        assert_eq!(lr, fixed_lr, "iteration {iteration}: the schedule is the run's");
        let relative = (loss - fixed_loss).abs() / fixed_loss.abs().max(1e-12);
        assert!(relative <= 1e-5, "iteration {iteration}: loss {loss} against {fixed_loss} ({relative:e} relative)");
    }
    let test_error = |lines: &[Metric]| {
        lines.iter().rev().find_map(|m| match m {
            Metric::Epoch(r) if r.rank == 0 => Some(r.test_error),
            _ => None,
        })
    };
    let (resized_error, fixed_error) = (test_error(&part_three).unwrap(), test_error(&fixed).unwrap());
    assert!((resized_error - fixed_error).abs() <= 0.001, "test error {resized_error} against {fixed_error}");
    // the weights, summed in the same order on every layout, are the fixed run's bit for bit (the reported
    // losses ride as f32 sums per process, which may differ in their last bits)
    let worst = worst_relative_difference(&final_model(&dir.join("third")), &final_model(&dir.join("fixed")));
    assert_eq!(worst, 0.0, "final weights must be bit-identical");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_killed_rank_fails_the_others_quickly_with_its_number() {
    let dir = scratch("killed");
    let mut spec = resnet_spec(3);
    spec["dataset"] = "synthetic:480".into();
    spec["epochs"] = 50.into(); // long enough to be killed mid-run
    let spec_path = write_spec(&dir, &spec);
    let started = Instant::now();
    // A short join timeout: on a loaded machine rank 1 may be killed before it joined the ring.
    let mut children = spawn_ranks(&spec_path, 3, &dir.join("out"), &["--join-timeout-s", "20"], None);
    std::thread::sleep(Duration::from_millis(1500));
    children[1].kill().unwrap(); // SIGKILL
    let outputs: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
    for rank in [0, 2] {
        assert!(!outputs[rank].status.success(), "rank {rank} must fail");
        let stderr = String::from_utf8_lossy(&outputs[rank].stderr);
        assert!(stderr.contains(&format!("rank {rank}: error")) && stderr.contains("rank "), "{stderr}");
    }
    let all: String = [0, 2].iter().map(|&r| String::from_utf8_lossy(&outputs[r].stderr).to_string()).collect();
    assert!(all.contains("rank 1 "), "nobody named the killed rank 1: {all}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn two_ranks_learn_fashion_mnist() {
    let dir = scratch("fashion");
    let spec = serde_json::json!({
        "model": {"name": "lenet5"},
        "dataset": "fashion-mnist",
        "train_samples": 10000,
        "test_samples": 2000,
        "workers": 2,
        "per_worker_batch": 32,
        "epochs": 2,
        "lr": {"base": 0.05, "reference_batch": 32, "warmup": {"kind": "gradual", "epochs": 0.5}, "decay": {"kind": "none"}},
        "seed": 3,
        "log_every_iterations": 50
    });
    let spec_path = write_spec(&dir, &spec);
    let out = dir.join("out");
    train_local(&spec_path, 2, &[], &out);
    let result: Value = serde_json::from_slice(&std::fs::read(out.join("result.json")).unwrap()).unwrap();
    let error = result["final_test_error"].as_f64().unwrap();
    assert!(error < 0.4, "test error {error} is not well below chance (0.9)");
    assert_eq!(result["epochs"].as_array().unwrap().len(), 2);
    assert_eq!(result["effective"]["iterations_per_epoch"], 10000 / 64);
    assert_eq!(result["schedule"]["effective"]["scaled_lr"], 0.1);
    // where the time went: every part measured, and the parts of the run add up to its wall time
    let timeline = &result["timeline"];
    let part = |name: &str| timeline[name].as_f64().unwrap_or_else(|| panic!("no {name}: {timeline}"));
    for name in ["start_up_s", "train_steps_s", "evaluation_s", "checkpoint_s", "reporting_s"] {
        assert!(part(name) > 0.0, "{name}: {timeline}");
    }
    let parts: f64 = ["train_steps_s", "evaluation_s", "checkpoint_s", "reporting_s", "other_s"].map(part).iter().sum();
    let wall = result["wall_seconds"].as_f64().unwrap();
    assert!((parts - wall).abs() < 1e-3 * wall.max(1.0), "{parts} vs {wall}: {timeline}");
    assert!(part("train_steps_s") > part("evaluation_s"), "{timeline}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_nan_loss_stops_every_rank_and_keeps_the_last_good_checkpoint() {
    let dir = scratch("nan");
    let mut spec = mlp_spec(2, 8, "goyal");
    spec["epochs"] = 3.into();
    spec["checkpoint_every_epochs"] = 1.into();
    spec["lr"]["warmup"]["epochs"] = 1.into();
    let spec_path = write_spec(&dir, &spec);
    let out = dir.join("out");
    // rank 1 gets NaN inputs at iteration 25 (epoch 2): the loss all-reduce carries the NaN to rank 0 too
    let children = spawn_ranks(&spec_path, 2, &out, &[], Some(("RINGTRAIN_NAN", "1:25")));
    let outputs: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    for (rank, output) in outputs.iter().enumerate() {
        assert!(!output.status.success(), "rank {rank} must stop");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("the training loss became NaN at iteration 25"), "rank {rank}: {stderr}");
    }
    assert_eq!(std::fs::read_to_string(out.join("checkpoints/latest")).unwrap().trim(), "epoch-0002");
    assert!(!out.join("result.json").exists());
    std::fs::remove_dir_all(dir).unwrap();
}

/// An MLP on Fashion-MNIST at lr 1 without warmup: the weights blow up in the first epochs and the network
/// predicts at chance with a huge but finite loss (so the NaN check never fires). The collapse guard stops every rank after that epoch
/// (a job error, exit 3, not retried), its epoch line reported first; without the guard it trains on.
#[test]
fn a_run_collapsed_to_chance_stops_after_the_epoch_unless_unguarded() {
    let dir = scratch("collapse");
    let mut spec = serde_json::json!({
        "model": {"name": "mlp", "hidden": [64]}, "dataset": "fashion-mnist", "train_samples": 2000,
        "test_samples": 500, "workers": 2, "per_worker_batch": 16, "epochs": 3,
        "lr": {"base": 1.0, "reference_batch": 32, "warmup": {"kind": "none"}, "decay": {"kind": "none"}},
        "optimizer": {"momentum": 0.9}, "seed": 3, "log_every_iterations": 10
    });
    let out = dir.join("guarded");
    let children = spawn_ranks(&write_spec(&dir, &spec), 2, &out, &[], None);
    let outputs: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    let mut stopped_after = Vec::new();
    for (rank, output) in outputs.iter().enumerate() {
        assert_eq!(output.status.code(), Some(3), "rank {rank} stops as a job error");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let why = stderr
            .lines()
            .find(|l| l.contains("collapsed to chance: train error 0."))
            .unwrap_or_else(|| panic!("{stderr}"));
        assert!(why.contains("after the warmup (chance is 0.900 for 10 classes; lr 1)"), "{why}");
        let epoch: u64 = why.split("in epoch ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        assert!(why.contains(&format!("with {} of 3 epochs left", 3 - epoch)), "{why}");
        stopped_after.push(epoch);
    }
    assert_eq!(stopped_after[0], stopped_after[1], "every rank stops after the same epoch");
    let epochs =
        String::from_utf8_lossy(&outputs[0].stdout).lines().filter(|l| l.contains(r#""kind":"epoch""#)).count();
    assert_eq!(epochs as u64, stopped_after[0], "the collapsed epoch is reported, then the run stops");
    assert!(stopped_after[0] < 3, "stopped early");
    assert!(!out.join("result.json").exists());

    spec["guard"] = serde_json::json!({"collapse": false});
    let out = dir.join("unguarded");
    let children = spawn_ranks(&write_spec(&dir, &spec), 2, &out, &[], None);
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    }
    let result: Value = serde_json::from_slice(&std::fs::read(out.join("result.json")).unwrap()).unwrap();
    assert_eq!(result["epochs"].as_array().unwrap().len(), 3);
    assert!(result["epochs"][2]["train_error"].as_f64().unwrap() > 0.8, "it stayed collapsed: {result}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A rank started for a parent that is already gone (an agent killed while the rank was still loading)
/// exits at once instead of training on as an orphan whose reports reach no one; with its real parent
/// named it trains.
#[test]
fn a_rank_whose_named_parent_is_gone_exits_at_once() {
    let dir = scratch("orphan");
    let spec = write_spec(&dir, &mlp_spec(1, 8, "goyal"));
    let rank = |parent: u32| {
        ringtrain()
            .arg("train")
            .arg("--spec")
            .arg(&spec)
            .args(["--rank", "0", "--world", "1", "--rendezvous", "127.0.0.1:0", "--out"])
            .arg(dir.join(format!("out-{parent}")))
            .args(["--exit-with-parent", "--parent-pid", &parent.to_string()])
            .output()
            .unwrap()
    };
    // pid 1 is never this test's process: the rank's named parent is "gone"
    let orphan = rank(1);
    // killed by itself at once (SIGKILL), not left to exit() while libtorch is torn down under it
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&orphan.status), Some(9), "{:?}", orphan.status);
    let stderr = String::from_utf8_lossy(&orphan.stderr);
    assert!(stderr.contains("(pid 1) is gone"), "{stderr}");
    assert!(metrics(&orphan.stdout).is_empty(), "it trained anyway");
    let adopted = rank(std::process::id());
    assert!(adopted.status.success(), "{}", String::from_utf8_lossy(&adopted.stderr));
    assert!(!metrics(&adopted.stdout).is_empty());
    std::fs::remove_dir_all(dir).unwrap();
}
