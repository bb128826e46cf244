//! A worker's model cut into stages, each stage on a thread of its own joined by real TCP links, trains
//! step for step as the whole model on one device: the same losses and the same weights after the updates.

use std::sync::Mutex;
use std::time::Duration;

use ringtrain_core::spec::{ModelName, ModelSpec};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::{Stage, StageLinks, Traffic};
use crate::batch_norm::BatchNormState;
use crate::collective::RendezvousConfig;
use crate::models;
use crate::optim::{Sgd, SgdConfig};

const SEED: i64 = 7;
const MICRO_BATCHES: usize = 4;
const N: i64 = 8;
const STEPS: usize = 3;
const CLASSES: i64 = 10;
const SHAPE: [i64; 3] = [1, 16, 16];

/// tch's generator is one per process: models are built from the seed one at a time.
static SEEDED: Mutex<()> = Mutex::new(());

fn config() -> SgdConfig {
    SgdConfig::goyal(0.9, 1e-4)
}

/// The step's samples and labels, the same for every stage: micro-batch j is rows j·n..(j+1)·n.
fn data() -> (Tensor, Tensor) {
    let g = Tensor::randn([MICRO_BATCHES as i64 * N, SHAPE[0], SHAPE[1], SHAPE[2]], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(CLASSES, [MICRO_BATCHES as i64 * N], (Kind::Int64, Device::Cpu));
    (g, y)
}

fn micro_batch(t: &Tensor, j: usize) -> Tensor {
    t.narrow(0, j as i64 * N, N)
}

/// What a run ends with: every step's loss (summed over micro-batches; the last stage's in a pipeline) and
/// every variable after the last update, by name.
struct Run {
    losses: Vec<f64>,
    weights: Vec<(String, Tensor)>,
}

fn lr(step: usize) -> f64 {
    // a changing lr, so the momentum correction takes part
    0.05 * (step + 1) as f64
}

fn whole(x: &Tensor, y: &Tensor) -> Run {
    let _seeded = SEEDED.lock().unwrap();
    tch::manual_seed(SEED);
    let vs = VarStore::new(Device::Cpu);
    let model = models::build(&ModelSpec::new(ModelName::Resnet20), &vs.root(), &SHAPE, CLASSES, true).unwrap();
    let mut opt = Sgd::new(&vs, config());
    let mut bn = BatchNormState::new(&vs, MICRO_BATCHES);
    let mut losses = Vec::new();
    for step in 0..STEPS {
        opt.zero_grad();
        let mut total = 0.0;
        for j in 0..MICRO_BATCHES {
            bn.swap_in(j);
            let out = model.forward_t(&micro_batch(x, j), true);
            let loss = out.cross_entropy_for_logits(&micro_batch(y, j));
            bn.swap_out(j);
            loss.backward();
            total += loss.double_value(&[]);
        }
        losses.push(total);
        let grads: Vec<Tensor> = opt.local_gradients().iter().map(|g| g / MICRO_BATCHES as f64).collect();
        opt.step(lr(step), &grads);
    }
    Run { losses, weights: vs.variables().into_iter().collect() }
}

/// Worker w's stage s: builds its part from the seed, trains `STEPS` steps on the worker's micro-batches.
fn stage(x: Tensor, y: Tensor, cuts: Vec<String>, workers: usize, rendezvous: RendezvousConfig) -> (Run, Traffic) {
    let stages = cuts.len() + 1;
    let (ring, links) = super::connect(&rendezvous, stages).unwrap();
    let vs = VarStore::new(Device::Cpu);
    let model = {
        let _seeded = SEEDED.lock().unwrap();
        tch::manual_seed(SEED);
        let spec = ModelSpec::new(ModelName::Resnet20);
        models::build_stage(&spec, &vs, &SHAPE, CLASSES, true, &cuts, links.stage()).unwrap()
    };
    let v = MICRO_BATCHES / workers;
    let mut stage = Stage::new(model, vs, config(), v, links);
    if workers > 1 {
        stage = stage.with_data_parallel(Box::new(ring), MICRO_BATCHES);
    }
    let losses = (0..STEPS).map(|step| stage.train_step(lr(step), &x, &y).unwrap().loss.unwrap_or(0.0)).collect();
    (Run { losses, weights: stage.variables() }, stage.links.traffic)
}

/// Runs the cut model on `workers` workers, a thread per worker and stage (worker w takes the micro-batches
/// w·v..(w+1)·v of the step), and returns each rank's run, worker-major.
fn pipelined(x: &Tensor, y: &Tensor, cuts: &[&str], workers: usize) -> Vec<Run> {
    let cuts: Vec<String> = cuts.iter().map(|c| c.to_string()).collect();
    let stages = cuts.len() + 1;
    let rows = (MICRO_BATCHES / workers) as i64 * N;
    let address = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let threads: Vec<_> = (0..workers * stages)
        .map(|rank| {
            let worker = (rank / stages) as i64;
            let (x, y) = (x.narrow(0, worker * rows, rows), y.narrow(0, worker * rows, rows));
            let cuts = cuts.clone();
            std::thread::spawn(move || {
                let config = RendezvousConfig {
                    address,
                    rank,
                    world: workers * stages,
                    join_timeout: Duration::from_secs(20),
                    io_timeout: Duration::from_secs(60),
                    secret: Some("the placement's".into()),
                };
                stage(x, y, cuts, workers, config)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| {
            let (run, traffic) = t.join().unwrap();
            assert!(traffic.bytes_sent > 0, "every stage sent its activations or gradients");
            run
        })
        .collect()
}

/// The pipeline against one device: the same loss at every step (within 1e-5, exactly when a worker is
/// alone: its stages sum in one device's order), the same weights after the updates (bit for bit, or
/// within float rounding of a sum in another order), and each stage the same on every worker.
fn assert_agrees(cuts: &[&str], workers: usize) {
    tch::manual_seed(1);
    let (x, y) = data();
    let reference = whole(&x, &y);
    let runs = pipelined(&x, &y, cuts, workers);
    let stages = cuts.len() + 1;
    for step in 0..STEPS {
        let split: f64 = runs.iter().skip(stages - 1).step_by(stages).map(|r| r.losses[step]).sum();
        let one = reference.losses[step];
        let exact = workers == 1;
        let agrees = if exact { split == one } else { ((split - one) / one).abs() <= 1e-5 };
        assert!(agrees, "{cuts:?} on {workers} workers: step {step}'s loss {split} against {one} on one device");
    }
    for (rank, run) in runs.iter().enumerate() {
        let mut seen = 0;
        for (name, weight) in &run.weights {
            // a worker's live BatchNorm statistics are its last micro-batch's (Goyal's per-worker BN):
            // compared where that is one device's last, with a worker alone
            if !weight.requires_grad() && workers > 1 {
                continue;
            }
            let (_, unsplit) = reference.weights.iter().find(|(n, _)| n == name).unwrap();
            let diff = (weight - unsplit).abs().max().double_value(&[]);
            let bound = if workers == 1 { 0.0 } else { 1e-5 };
            assert!(diff <= bound, "{cuts:?} on {workers} workers: rank {rank}'s {name} differs by {diff}");
            let first_worker = &runs[rank % stages].weights;
            let (_, same_stage) = first_worker.iter().find(|(n, _)| n == name).unwrap();
            assert!(weight.equal(same_stage), "rank {rank}'s {name} is not worker 0's");
            seen += 1;
        }
        assert!(seen > 0, "rank {rank} holds weights");
    }
    let held: usize = runs[..stages].iter().map(|r| r.weights.len()).sum();
    assert_eq!(held, reference.weights.len(), "{cuts:?}: a worker's stages hold every variable once");
}

#[test]
fn resnet20_cut_after_layer2_trains_bit_for_bit_as_on_one_device() {
    assert_agrees(&["layer2"], 1);
}

#[test]
fn resnet20_in_three_stages_trains_bit_for_bit_as_on_one_device() {
    assert_agrees(&["layer1.1", "layer3.0"], 1);
}

/// Hybrid data × pipeline parallelism: 2 workers of 2 stages, each stage's gradients summed with the same
/// stage of the other worker, against one device playing all 4 micro-batches.
#[test]
fn two_workers_of_two_stages_train_as_one_device() {
    assert_agrees(&["layer2"], 2);
}

#[test]
fn a_cut_the_network_has_not_is_refused_with_the_cuts_it_has() {
    let vs = VarStore::new(Device::Cpu);
    let spec = ModelSpec::new(ModelName::Resnet20);
    let cuts = ["layer4".to_string()];
    let err = models::build_stage(&spec, &vs, &SHAPE, CLASSES, true, &cuts, 0).err().unwrap().to_string();
    assert!(err.contains("\"layer4\"") && err.contains("layer2.1") && !err.contains("layer3.2"), "{err}");
    let backwards = ["layer2".to_string(), "layer1".to_string()];
    let err = models::build_stage(&spec, &vs, &SHAPE, CLASSES, true, &backwards, 0).err().unwrap().to_string();
    assert!(err.contains("order"), "{err}");
    let mlp = models::build_stage(&ModelSpec::new(ModelName::Mlp), &vs, &SHAPE, CLASSES, true, &cuts, 0);
    assert!(mlp.err().unwrap().to_string().contains("only the ResNets"));
}

/// A stage that dies mid-step is named by its neighbour at once (its link closes), not waited for until
/// the timeout.
#[test]
fn a_stage_that_dies_is_named_by_its_neighbour_not_waited_for() {
    let address = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let config = move |rank| RendezvousConfig {
        address,
        rank,
        world: 2,
        join_timeout: Duration::from_secs(20),
        io_timeout: Duration::from_secs(120),
        secret: None,
    };
    let dying = std::thread::spawn(move || {
        let mut links = StageLinks::connect(&config(1)).unwrap();
        let received = links.receive_forward().unwrap();
        assert_eq!(received[0].size(), vec![2, 3]);
        assert_eq!(received[1].double_value(&[]), 5.0);
    });
    let mut links = StageLinks::connect(&config(0)).unwrap();
    let activations = [Tensor::ones([2, 3], (Kind::Float, Device::Cpu)), Tensor::from(5.0f32)];
    links.send_forward(&activations).unwrap();
    dying.join().unwrap();
    let started = std::time::Instant::now();
    let err = links.receive_backward().unwrap_err().to_string();
    assert!(err.contains("rank 1") && err.contains("pipeline stage 1") && err.contains("closed"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10), "named in {:?}", started.elapsed());
}

/// Trains `cuts.len() + 1` stages of one worker, then gathers their state in stage 0 and hands it back out;
/// returns what stage 0 assembled, after checking that every stage got back exactly its own.
fn gathered(x: &Tensor, y: &Tensor, cuts: &[&str]) -> Vec<(String, Tensor)> {
    let cuts: Vec<String> = cuts.iter().map(|c| c.to_string()).collect();
    let stages = cuts.len() + 1;
    let address = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let threads: Vec<_> = (0..stages)
        .map(|rank| {
            let (x, y, cuts) = (x.shallow_clone(), y.shallow_clone(), cuts.clone());
            std::thread::spawn(move || {
                let rendezvous = RendezvousConfig {
                    address,
                    rank,
                    world: stages,
                    join_timeout: Duration::from_secs(20),
                    io_timeout: Duration::from_secs(60),
                    secret: None,
                };
                let links = StageLinks::connect(&rendezvous).unwrap();
                let vs = VarStore::new(Device::Cpu);
                let model = {
                    let _seeded = SEEDED.lock().unwrap();
                    tch::manual_seed(SEED);
                    let spec = ModelSpec::new(ModelName::Resnet20);
                    models::build_stage(&spec, &vs, &SHAPE, CLASSES, true, &cuts, rank).unwrap()
                };
                let mut stage = Stage::new(model, vs, config(), MICRO_BATCHES, links);
                for step in 0..STEPS {
                    stage.train_step(lr(step), &x, &y).unwrap();
                }
                let own = stage.state();
                let whole = super::state::gather(&mut stage.links, copies(&own)).unwrap();
                let names: Vec<String> = own.iter().map(|(n, _)| n.clone()).collect();
                let back = super::state::scatter(&mut stage.links, whole.as_deref().map(copies), |n| {
                    names.iter().any(|m| m == n)
                })
                .unwrap();
                assert_eq!(sorted(&back).len(), own.len(), "stage {rank} got back as many tensors as it holds");
                for ((name, mine), (back_name, returned)) in sorted(&own).iter().zip(sorted(&back)) {
                    assert_eq!(name, &back_name);
                    assert!(mine.equal(&returned), "stage {rank}'s {name} came back changed");
                }
                whole.unwrap_or_default()
            })
        })
        .collect();
    let mut results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    results.swap_remove(0)
}

fn copies(named: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    named.iter().map(|(n, t)| (n.clone(), t.copy())).collect()
}

fn sorted(named: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    let mut named = copies(named);
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

/// A checkpoint of a pipelined worker is the unsplit model's: its stages' weights, BatchNorm statistics and
/// momentum, gathered in stage 0, are the unsplit model's by name and value after the same steps.
#[test]
fn a_workers_state_gathered_from_its_stages_is_the_unsplit_models_and_goes_back_where_it_came_from() {
    tch::manual_seed(1);
    let (x, y) = data();
    let unsplit = sorted(&gathered(&x, &y, &[]));
    let split = sorted(&gathered(&x, &y, &["layer1.1", "layer3.0"]));
    assert!(unsplit.iter().any(|(n, _)| n.starts_with("optimizer/")) && unsplit.len() > 100);
    assert_eq!(split.len(), unsplit.len());
    for ((name, a), (other, b)) in split.iter().zip(&unsplit) {
        assert_eq!(name, other);
        assert!(a.to_kind(Kind::Float).equal(&b.to_kind(Kind::Float)), "{name} differs from the unsplit model's");
    }
}
