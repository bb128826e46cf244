//! Bring your own model: uploaded TorchScript models trained by real `ringtrain train` rank processes over
//! the TCP ring, on multi-input data sets. The models and data are committed files made by PyTorch
//! (examples/multi-input/make.py, tests/fixtures/byo/make.py).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use ringtrain_core::{Effective, JobSpec};
use ringtrain_worker::data::shuffle::{batch_indices, epoch_permutation};
use ringtrain_worker::data::Dataset;
use ringtrain_worker::metrics::{Metric, RunResult};
use ringtrain_worker::models::{Network, Scripted};
use ringtrain_worker::optim::{Sgd, SgdConfig};
use serde_json::{json, Value};
use tch::nn::VarStore;
use tch::{CModule, Device, Kind, Tensor};

const EXAMPLE_INPUTS: &str = "numeric,tokens,tokens_mask,set,set_mask";
/// Any id: `ringtrain train` is given the files directly; the id only marks the dataset as an upload.
const UPLOAD_ID: &str = "00000000-0000-4000-8000-000000000015";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringtrain-byo-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_spec(dir: &Path, name: &str, spec: &Value) -> PathBuf {
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(spec).unwrap()).unwrap();
    path
}

/// A spec for an uploaded model: k ranks of n, plain momentum SGD with weight decay, a gradual warmup over
/// half an epoch (the lr changes every step), checkpoints every epoch.
fn spec(workers: u32, batch: u32, train_samples: u32, epochs: u32) -> Value {
    json!({
        "model": {"uploaded": UPLOAD_ID},
        "dataset": UPLOAD_ID,
        "workers": workers,
        "per_worker_batch": batch,
        "train_samples": train_samples,
        "epochs": epochs,
        "lr": {"base": 0.05, "reference_batch": 32, "warmup": {"kind": "gradual", "epochs": 0.5}, "decay": {"kind": "none"}},
        "optimizer": {"momentum": 0.9, "weight_decay": 0.0001},
        "seed": 3,
        "checkpoint_every_epochs": 1,
        "log_every_iterations": 1
    })
}

/// The arguments that hand a rank the model and data files.
fn files(model: &str, data: &str, inputs: &str) -> Vec<String> {
    let path = |p: &str| repo(p).to_string_lossy().into_owned();
    vec![
        "--model-file".into(),
        path(model),
        "--dataset-file".into(),
        path(data),
        "--model-inputs".into(),
        inputs.into(),
    ]
}

fn example_files() -> Vec<String> {
    files("examples/multi-input/model.pt", "examples/multi-input/data.safetensors", EXAMPLE_INPUTS)
}

fn train(spec: &Path, processes: usize, extra: &[String], out: &Path) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_ringtrain"))
        .arg("train")
        .arg("--spec")
        .arg(spec)
        .args(["--local", &processes.to_string(), "--comm-timeout-s", "60", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    assert!(output.status.success(), "training failed:\n{}", String::from_utf8_lossy(&output.stderr));
    output
}

fn latest_checkpoint(out: &Path) -> PathBuf {
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
    out.join("checkpoints").join(latest.trim())
}

fn weights(out: &Path) -> Vec<(String, Tensor)> {
    let mut named = Tensor::read_safetensors(latest_checkpoint(out).join("model.safetensors")).unwrap();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

fn result(out: &Path) -> RunResult {
    serde_json::from_slice(&std::fs::read(out.join("result.json")).unwrap()).unwrap()
}

/// ‖a − b‖ / ‖b‖ over every tensor, the worst one.
fn worst_relative_difference(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    assert_eq!(a.iter().map(|t| &t.0).collect::<Vec<_>>(), b.iter().map(|t| &t.0).collect::<Vec<_>>());
    a.iter()
        .zip(b)
        .map(|((_, ta), (_, tb))| {
            let (ta, tb) = (ta.to_kind(Kind::Double), tb.to_kind(Kind::Double));
            (&ta - &tb).norm().double_value(&[]) / tb.norm().double_value(&[]).max(1e-12)
        })
        .fold(0.0, f64::max)
}

/// The example's test split, loaded as PyTorch would hand it to the model.
fn example_test_split() -> (Vec<Tensor>, Tensor) {
    let data = Tensor::read_safetensors(repo("examples/multi-input/data.safetensors")).unwrap();
    let take = |name: &str| data.iter().find(|(n, _)| n == name).unwrap().1.shallow_clone();
    let inputs = EXAMPLE_INPUTS.split(',').map(|n| take(&format!("x_test.{n}"))).collect();
    (inputs, take("y_test"))
}

/// Large-batch SGD written out directly, as one process with k = 1 and n = kn would take it: each step one
/// forward pass of the scripted module over all kn samples of the step (the union of the k ranks' batches),
/// with ringtrain's schedule and optimizer.
fn reference_large_batch(spec: &JobSpec, model: &Path, data: &Path, inputs: &[String]) -> Vec<(String, Tensor)> {
    let mut data = Dataset::load_safetensors(data, Some(inputs), spec.train_samples, None).unwrap();
    let eff = Effective::new(spec, data.train_len() as u64).unwrap();
    let vs = VarStore::new(Device::Cpu);
    let mut network = Network::Scripted(Scripted::load(model, &vs.root()).unwrap());
    let mut opt = Sgd::with_rules(&vs, SgdConfig::from_effective(&eff), &|name, t| network.param_kind(name, t));
    let (k, n) = (spec.workers as usize, spec.per_worker_batch as usize);
    for epoch in 0..u64::from(eff.epochs) {
        let perm = epoch_permutation(spec.seed, epoch, data.train_len());
        for t in 0..eff.iterations_per_epoch as usize {
            let indices: Vec<i64> = (0..k).flat_map(|r| batch_indices(&perm, k, r, t, n).to_vec()).collect();
            let (x, y) = data.train_batch(&indices, Device::Cpu).unwrap();
            opt.zero_grad();
            network.forward(&x, true).unwrap().log_softmax(-1, Kind::Float).nll_loss(&y).backward();
            let grads = opt.local_gradients();
            opt.step(eff.lr_at(epoch * eff.iterations_per_epoch + t as u64), &grads);
        }
    }
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

/// A scripted multi-input model (embedding, GRU, Deep Sets; no BatchNorm) on 2 rank processes of n = 16
/// takes the 20 steps of one process over the same 32 samples per step, to within float rounding: written
/// out directly, and as one rank process playing both ranks.
#[test]
fn a_scripted_model_on_two_rank_processes_takes_the_steps_of_one_large_batch() {
    let dir = scratch("equal");
    let spec_json = spec(2, 16, 640, 1);
    let spec_path = write_spec(&dir, "spec", &spec_json);
    let two = dir.join("two");
    train(&spec_path, 2, &example_files(), &two);
    assert_eq!(result(&two).effective.total_iterations, 20);
    let ranks = weights(&two);
    assert!(ranks.iter().any(|(n, _)| n == "gru.weight_hh_l0"), "{:?}", ranks.iter().map(|t| &t.0).collect::<Vec<_>>());

    let inputs: Vec<String> = EXAMPLE_INPUTS.split(',').map(str::to_string).collect();
    let spec = JobSpec::from_json(&spec_json.to_string()).unwrap();
    let model = repo("examples/multi-input/model.pt");
    tch::set_num_threads(1);
    let reference = reference_large_batch(&spec, &model, &repo("examples/multi-input/data.safetensors"), &inputs);
    let worst = worst_relative_difference(&ranks, &reference);
    assert!(worst < 1e-5, "2 rank processes vs one large batch: worst relative difference {worst:e}");

    let one = dir.join("one");
    let mut extra = example_files();
    extra.extend(["--virtual-ranks".to_string(), "2".to_string()]);
    train(&spec_path, 1, &extra, &one);
    let worst = worst_relative_difference(&ranks, &weights(&one));
    assert!(worst < 1e-5, "2 rank processes vs 1 process: worst relative difference {worst:e}");

    // and the weights really moved: this is not two untrained models compared
    let initial = CModule::load(&model).unwrap().named_parameters().unwrap();
    let moved = ranks.iter().find(|(n, _)| n == "head.2.weight").unwrap().1.shallow_clone();
    let start = initial.iter().find(|(n, _)| n == "head.2.weight").unwrap().1.shallow_clone();
    assert!((moved - start).abs().max().double_value(&[]) > 1e-3);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Rank 1 aborts in the third epoch; resumed from the second epoch's checkpoint, the run ends with the
/// uninterrupted run's weights, bit for bit.
#[test]
fn a_scripted_model_resumes_bit_for_bit_after_a_crash() {
    let dir = scratch("resume");
    let spec_path = write_spec(&dir, "spec", &spec(2, 16, 480, 3)); // 15 iterations per epoch
    let whole = dir.join("whole");
    train(&spec_path, 2, &example_files(), &whole);

    let crashed = dir.join("crashed");
    let output = Command::new(env!("CARGO_BIN_EXE_ringtrain"))
        .arg("train")
        .arg("--spec")
        .arg(&spec_path)
        .args(["--local", "2", "--comm-timeout-s", "10", "--out"])
        .arg(&crashed)
        .args(example_files())
        .env("RINGTRAIN_CRASH", "1:37")
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success(), "rank 1 crashed");
    assert_eq!(std::fs::read_to_string(crashed.join("checkpoints/latest")).unwrap().trim(), "epoch-0002");
    let resumed = dir.join("resumed");
    let mut extra = example_files();
    extra.extend(["--resume".to_string(), crashed.join("checkpoints").to_string_lossy().into_owned()]);
    train(&spec_path, 2, &extra, &resumed);
    assert_eq!(worst_relative_difference(&weights(&resumed), &weights(&whole)), 0.0, "bit-identical weights");
    std::fs::remove_dir_all(dir).unwrap();
}

/// BatchNorm inside a scripted model keeps statistics per rank: one process playing 2 virtual ranks (its
/// buffers swapped per micro-batch) ends where 2 rank processes end, running statistics included.
#[test]
fn batch_norm_of_a_scripted_model_is_per_rank_on_virtual_ranks_too() {
    let dir = scratch("bn");
    let spec_path = write_spec(&dir, "spec", &spec(2, 16, 640, 1));
    let bn = files("tests/fixtures/byo/bn_mlp.pt", "examples/multi-input/data.safetensors", "numeric");
    let real = dir.join("real");
    let virtual_ranks = dir.join("virtual");
    train(&spec_path, 2, &bn, &real);
    let mut extra = bn.clone();
    extra.extend(["--virtual-ranks".to_string(), "2".to_string()]);
    train(&spec_path, 1, &extra, &virtual_ranks);
    let (a, b) = (weights(&virtual_ranks), weights(&real));
    assert!(a.iter().any(|(n, _)| n == "net.1.running_var"), "the BatchNorm buffers are saved");
    let worst = worst_relative_difference(&a, &b);
    assert!(worst < 1e-5, "virtual vs real ranks: {worst:e}");
    let stats = |out: &Path| {
        let mut t = Tensor::read_safetensors(latest_checkpoint(out).join("batch_norm.safetensors")).unwrap();
        t.sort_by(|a, b| a.0.cmp(&b.0));
        t
    };
    let (sa, sb) = (stats(&virtual_ranks), stats(&real));
    assert!(sa.iter().any(|(n, _)| n == "rank1.net.1.running_mean"));
    assert!(worst_relative_difference(&sa, &sb) < 1e-5);
    // the two ranks' statistics differ: each normalised its own samples
    let rank = |r: u32| sb.iter().find(|(n, _)| *n == format!("rank{r}.net.1.running_mean")).unwrap().1.shallow_clone();
    assert!((rank(0) - rank(1)).abs().max().double_value(&[]) > 1e-4);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Every iteration's (iteration, loss, lr) as the run's rank 0 printed it.
fn losses(output: &Output) -> Vec<(u64, f64, f64)> {
    let lines = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect::<Vec<Metric>>();
    lines
        .iter()
        .filter_map(|m| match m {
            Metric::Iteration { rank: 0, iteration, loss, lr, .. } => Some((*iteration, *loss, *lr)),
            _ => None,
        })
        .collect()
}

/// Each iteration's losses agree within `tolerance`, relative.
fn assert_losses_agree(a: &[(u64, f64, f64)], b: &[(u64, f64, f64)], tolerance: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: every iteration once");
    for (x, y) in a.iter().zip(b) {
        assert_eq!((x.0, x.2), (y.0, y.2), "{what}: the same iteration and lr");
        let relative = (x.1 - y.1).abs() / y.1.abs().max(1e-12);
        assert!(relative <= tolerance, "{what}: iteration {} loss {} vs {} ({relative:e})", x.0, x.1, y.1);
    }
}

/// The seed's question: one model of three encoders (a numeric vector, a sequence, a set) and a head, its
/// modules on devices of their own. The composite form of the example (examples/multi-input/composite.tar,
/// model.pt's encoders and head as four modules) trains model.pt's run; placed on 2 stages (two encoders
/// on one device, the set encoder and the head on the other) × 2 workers of 2 micro-batches, every
/// iteration's loss agrees with the unsplit run's within 1e-5 relative and the weights end the same. With a
/// BatchNorm in the numeric encoder, its statistics per micro-batch, one worker of 3 stages trains one
/// process's run.
#[test]
fn a_composite_model_split_into_stages_trains_the_unsplit_run() {
    let dir = scratch("composite");
    let mut spec_json = spec(4, 16, 512, 2);
    spec_json["epochs"] = 2.into();
    let unsplit_spec = write_spec(&dir, "unsplit", &spec_json);
    spec_json["devices_per_worker"] = 2.into();
    spec_json["placement"] = json!({"stages": [["encode_numeric", "encode_sequence"], ["encode_set", "head"]]});
    let split_spec = write_spec(&dir, "split", &spec_json);
    let composite =
        files("examples/multi-input/composite.tar", "examples/multi-input/data.safetensors", EXAMPLE_INPUTS);

    let whole = train(&unsplit_spec, 2, &example_files(), &dir.join("whole"));
    let unsplit = train(&unsplit_spec, 2, &composite, &dir.join("unsplit"));
    let split = train(&split_spec, 4, &composite, &dir.join("split"));
    assert_eq!(losses(&unsplit).len(), 16, "8 iterations per epoch");
    assert_losses_agree(&losses(&unsplit), &losses(&whole), 1e-5, "the composite model against model.pt");
    assert_losses_agree(&losses(&split), &losses(&unsplit), 1e-5, "2 stages × 2 workers against 2 unsplit processes");
    let (split_weights, unsplit_weights) = (weights(&dir.join("split")), weights(&dir.join("unsplit")));
    assert!(
        split_weights.iter().any(|(n, _)| n == "encode_sequence.gru.weight_hh_l0"),
        "the weights are named by module"
    );
    let worst = worst_relative_difference(&split_weights, &unsplit_weights);
    assert!(worst < 1e-5, "the split run's weights differ by {worst:e}");

    // BatchNorm in the first stage, 3 stages (the middle one passes the first's output on) playing 4 ranks
    let mut spec_json = spec(4, 16, 512, 1);
    let one_spec = write_spec(&dir, "one", &spec_json);
    spec_json["devices_per_worker"] = 3.into();
    spec_json["placement"] = json!({"stages": [["encode_numeric"], ["encode_sequence"], ["encode_set", "head"]]});
    let three_spec = write_spec(&dir, "three", &spec_json);
    let bn = files("tests/fixtures/byo/composite_bn.tar", "examples/multi-input/data.safetensors", EXAMPLE_INPUTS);
    let mut one_process = bn.clone();
    one_process.extend(["--virtual-ranks".to_string(), "4".to_string()]);
    let one = train(&one_spec, 1, &one_process, &dir.join("one"));
    let three = train(&three_spec, 3, &bn, &dir.join("three"));
    assert_losses_agree(&losses(&three), &losses(&one), 1e-5, "3 stages against one process");
    let stats = |out: &Path| {
        let mut t = Tensor::read_safetensors(latest_checkpoint(out).join("batch_norm.safetensors")).unwrap();
        t.sort_by(|a, b| a.0.cmp(&b.0));
        t
    };
    let (three_stats, one_stats) = (stats(&dir.join("three")), stats(&dir.join("one")));
    assert!(three_stats.iter().any(|(n, _)| n == "rank3.encode_numeric.numeric.1.running_mean"), "per micro-batch");
    assert!(worst_relative_difference(&three_stats, &one_stats) < 1e-5);
    std::fs::remove_dir_all(dir).unwrap();
}

/// The worked example learns on 2 rank processes: its test error falls far below chance (two thirds)
/// within a few epochs, and the TorchScript file of its final checkpoint, loaded as `torch.jit.load` would,
/// gives the test error the job reported.
#[test]
fn the_multi_input_example_learns_and_its_torchscript_file_gives_the_reported_error() {
    let dir = scratch("learns");
    let mut example: Value =
        serde_json::from_slice(&std::fs::read(repo("examples/multi-input/spec.json")).unwrap()).unwrap();
    example["model"]["uploaded"] = UPLOAD_ID.into();
    example["dataset"] = UPLOAD_ID.into();
    let out = dir.join("out");
    let output = train(&write_spec(&dir, "spec", &example), 2, &example_files(), &out);
    let run = result(&out);
    assert!(run.final_test_error < 0.2, "final test error {}", run.final_test_error);
    let epochs: Vec<f64> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| match serde_json::from_str(l) {
            Ok(Metric::Epoch(r)) if r.rank == 0 => Some(r.test_error),
            _ => None,
        })
        .collect();
    assert_eq!(epochs.len(), example["epochs"].as_u64().unwrap() as usize);

    let mut module = CModule::load(latest_checkpoint(&out).join("model.pt")).unwrap();
    module.set_eval();
    let (inputs, labels) = example_test_split();
    let logits = tch::no_grad(|| module.forward_ts(&inputs)).unwrap();
    let error = logits.argmax(-1, false).ne_tensor(&labels).to_kind(Kind::Double).mean(Kind::Double).double_value(&[]);
    assert!(
        (error - run.final_test_error).abs() < 1e-6,
        "the file gives {error}, the job said {}",
        run.final_test_error
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// Value labels: a scripted regressor trains with mse and with huber, and its error fields hold the root
/// mean squared error, well below the target's standard deviation (0.80).
#[test]
fn a_scripted_regressor_reports_its_root_mean_squared_error() {
    let dir = scratch("regression");
    let regression = files("tests/fixtures/byo/regressor.pt", "tests/fixtures/byo/regression.safetensors", "numeric");
    for loss in ["mse", "huber"] {
        let mut s = spec(2, 16, 992, 8);
        s["loss"] = loss.into();
        let out = dir.join(loss);
        train(&write_spec(&dir, loss, &s), 2, &regression, &out);
        let run = result(&out);
        assert_eq!(serde_json::to_value(run.error_metric).unwrap(), "rmse");
        assert!(run.final_test_error < 0.4, "{loss}: test RMSE {}", run.final_test_error);
    }
    // cross-entropy on value labels is the job's error, named
    let mut s = spec(1, 16, 992, 1);
    s["loss"] = "cross_entropy".into();
    let output = Command::new(env!("CARGO_BIN_EXE_ringtrain"))
        .arg("train")
        .arg("--spec")
        .arg(write_spec(&dir, "ce", &s))
        .args(["--local", "1"])
        .args(&regression)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("cross_entropy needs class labels"), "{stderr}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// An uploaded model on a plain data set (one `x`, no names): the model gets `x` normalised as the built-in
/// models do, without `--model-inputs`.
#[test]
fn an_uploaded_model_trains_on_a_plain_data_set_of_one_x() {
    let dir = scratch("plain");
    let example = Tensor::read_safetensors(repo("examples/multi-input/data.safetensors")).unwrap();
    let take = |name: &str| example.iter().find(|(n, _)| n == name).unwrap().1.shallow_clone();
    let plain = dir.join("plain.safetensors");
    let (x, y) = (take("x.numeric") * 3.0 + 1.0, take("y"));
    Tensor::write_safetensors(&[("x", &x), ("y", &y)], &plain).unwrap();
    let out = dir.join("out");
    let extra: Vec<String> = vec![
        "--model-file".into(),
        repo("tests/fixtures/byo/bn_mlp.pt").to_string_lossy().into_owned(),
        "--dataset-file".into(),
        plain.to_string_lossy().into_owned(),
    ];
    train(&write_spec(&dir, "spec", &spec(2, 16, 3200, 2)), 2, &extra, &out);
    let run = result(&out);
    // the vector alone carries a third of the label: well below chance (0.65; 0.47 measured), far above
    // what all three inputs give (0.07)
    assert!(run.final_test_error < 0.55, "final test error {}", run.final_test_error);
    assert_eq!(run.epochs.len(), 2);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Shards of named tensors: the multi-input example's safetensors file packed by `ringtrain datasets pack`
/// trains the scripted model from `shards:` as it does from the upload (the same test error bound), and the
/// same 2-worker job on 1 process of 2 virtual ranks and on 2 processes takes the same samples in the same
/// order (every iteration's loss within 1e-5 relative; elastic, so gradients are summed in worker order).
#[test]
fn a_scripted_model_trains_from_shards_of_named_tensors_the_same_at_any_number_of_processes() {
    let dir = scratch("named-shards");
    let shards = dir.join("shards");
    let packed = Command::new(env!("CARGO_BIN_EXE_ringtrain"))
        .args(["datasets", "pack"])
        .arg(repo("examples/multi-input/data.safetensors"))
        .arg(&shards)
        .args(["--shard-mib", "0.5"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&packed.stdout);
    assert!(packed.status.success(), "pack failed:\n{}", String::from_utf8_lossy(&packed.stderr));
    assert!(
        said.contains("packed 3 classes: 4000 training samples in") && said.contains("1000 test samples"),
        "{said}"
    );

    let mut example: Value =
        serde_json::from_slice(&std::fs::read(repo("examples/multi-input/spec.json")).unwrap()).unwrap();
    example["model"]["uploaded"] = UPLOAD_ID.into();
    example["dataset"] = format!("shards:{}", shards.display()).into();
    example["devices"] = json!({"min": 1});
    example["log_every_iterations"] = 1.into();
    let spec = write_spec(&dir, "spec", &example);
    let model = ["--model-file".to_string(), repo("examples/multi-input/model.pt").to_string_lossy().into_owned()];
    let args: Vec<String> = model.into_iter().chain(["--model-inputs".into(), EXAMPLE_INPUTS.into()]).collect();
    let losses = |output: &Output| -> Vec<(u64, f64)> {
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|l| match serde_json::from_str(l) {
                Ok(Metric::Iteration { rank: 0, iteration, loss, .. }) => Some((iteration, loss)),
                _ => None,
            })
            .collect()
    };
    let two = train(&spec, 2, &args, &dir.join("two"));
    let run = result(&dir.join("two"));
    assert!(run.final_test_error < 0.2, "final test error {}", run.final_test_error);
    let virtual_ranks: Vec<String> = args.iter().cloned().chain(["--virtual-ranks".into(), "2".into()]).collect();
    let one = train(&spec, 1, &virtual_ranks, &dir.join("one"));
    let (one, two) = (losses(&one), losses(&two));
    assert_eq!(one.len(), 6 * (4000 / 64), "every iteration of the 6 epochs");
    assert_eq!(one.len(), two.len());
    for ((i, a), (_, b)) in one.iter().zip(&two) {
        assert!((a - b).abs() <= 1e-5 * a.abs().max(b.abs()), "iteration {i}: {a} on 1 process, {b} on 2");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
