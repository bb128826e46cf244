//! Range and consistency checks of a parsed [`JobSpec`]: every problem at once, each with its path.

use crate::error::FieldError;
use crate::spec::{DecayKind, Devices, JobSpec, Loss, ModelName, WarmupKind};

/// Limits that keep a spec sane; beyond them a job is a typo, not a plan.
pub mod limits {
    pub const MAX_WORKERS: u32 = 4096;
    pub const MAX_PER_WORKER_BATCH: u32 = 65_536;
    pub const MAX_EPOCHS: u32 = 10_000;
    pub const MAX_LR: f64 = 100.0;
    /// Most an lr multiplier may scale the base by (a 100,000-fold batch).
    pub const MAX_LR_MULTIPLIER: f64 = 100_000.0;
    pub const MAX_RESTARTS: u32 = 100;
    pub const MAX_PRIORITY: i32 = 1000;
    pub const MAX_NAME_CHARS: usize = 200;
    pub const MAX_MLP_LAYERS: usize = 32;
    pub const MAX_MLP_WIDTH: u32 = 65_536;
    /// A worker's pipeline stages: a server's GPUs.
    pub const MAX_DEVICES_PER_WORKER: u32 = 16;
    /// A job's iterations (per epoch × epochs): 10^9 is ImageNet's 90 epochs at a global batch of 1 many
    /// times over; beyond it a spec is a mistake or an attack on the schedule's rendering.
    pub const MAX_TOTAL_ITERATIONS: u64 = 1_000_000_000;
}

/// What is wrong with a name a user gives a job, a study, a dataset or a model (shown in tables and
/// events): each reason, none when it is non-blank, at most [`limits::MAX_NAME_CHARS`] characters and free
/// of control characters. The one rule for every kind of name, so a name one form takes another accepts.
pub fn name_problems(name: &str) -> Vec<String> {
    let max = limits::MAX_NAME_CHARS;
    let mut reasons = Vec::new();
    if name.trim().is_empty() {
        reasons.push("must not be blank".to_string());
    }
    let chars = name.chars().count();
    if chars > max {
        reasons.push(format!("must be at most {max} characters (got {chars})"));
    }
    if name.chars().any(char::is_control) {
        reasons.push("must not contain control characters".to_string());
    }
    reasons
}

/// Collects problems instead of stopping at the first.
#[derive(Debug, Default)]
struct Problems(Vec<FieldError>);

impl Problems {
    fn check(&mut self, ok: bool, path: &str, reason: impl FnOnce() -> String) {
        if !ok {
            self.0.push(FieldError::new(path, reason()));
        }
    }

    fn int_range<T: PartialOrd + std::fmt::Display + Copy>(&mut self, path: &str, value: T, min: T, max: T) {
        self.check(value >= min && value <= max, path, || format!("must be from {min} to {max} (got {value})"));
    }

    /// A finite float in the half-open or closed range the caller describes.
    fn float(&mut self, path: &str, value: f64, ok: impl Fn(f64) -> bool, expected: &str) {
        self.check(value.is_finite() && ok(value), path, || format!("must be {expected} (got {value})"));
    }
}

impl JobSpec {
    /// Every range and consistency problem of this spec. Checks that need the dataset's size (kn must not
    /// exceed it) run when the size is known from the name alone; [`JobSpec::validate_for_dataset`] adds them
    /// for uploaded or on-disk datasets.
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        self.validate_for_dataset(self.dataset.known_train_size())
    }

    pub fn validate_for_dataset(&self, dataset_size: Option<u64>) -> Result<(), Vec<FieldError>> {
        use limits::*;
        let mut p = Problems::default();

        if let Some(name) = &self.name {
            p.0.extend(name_problems(name).into_iter().map(|reason| FieldError::new("name", reason)));
        }
        match (self.model.name, self.model.uploaded) {
            (Some(_), Some(_)) => p.check(false, "model.uploaded", || {
                "give either name (a built-in model) or uploaded (a model id), not both".into()
            }),
            (None, None) => p.check(false, "model.name", || {
                "missing: name a built-in model or give uploaded (a model id from POST /v1/models)".into()
            }),
            _ => {}
        }
        let named_inputs = matches!(self.dataset, crate::DatasetRef::Uploaded(_) | crate::DatasetRef::Shards { .. });
        if self.model.uploaded.is_some() && !named_inputs {
            p.check(false, "dataset", || {
                "an uploaded model trains on an uploaded dataset (its id) or a sharded one (shards:...)".into()
            });
        }
        if self.model.uploaded.is_none() && self.loss.is_some_and(Loss::regresses) {
            p.check(false, "loss", || "the built-in models classify: only cross_entropy applies".into());
        }
        match (&self.model.hidden, self.model.name) {
            (Some(hidden), Some(ModelName::Mlp)) => {
                p.check(hidden.len() <= MAX_MLP_LAYERS, "model.hidden", || {
                    format!("at most {MAX_MLP_LAYERS} hidden layers (got {})", hidden.len())
                });
                for (i, &width) in hidden.iter().enumerate() {
                    p.int_range(&format!("model.hidden[{i}]"), width, 1, MAX_MLP_WIDTH);
                }
            }
            (Some(_), _) => {
                p.check(false, "model.hidden", || format!("only applies to mlp (model is {})", self.model.label()))
            }
            (None, _) => {}
        }
        match (self.image_size, &self.dataset) {
            (Some(size), crate::DatasetRef::Shards { .. }) => p.int_range("image_size", size, 8, 1024),
            (Some(_), _) => p.check(false, "image_size", || "only applies to shards: data sets".into()),
            (None, _) => {}
        }
        if self.augment.is_some() && !matches!(self.dataset, crate::DatasetRef::Shards { .. }) {
            p.check(false, "augment", || "only applies to shards: data sets".into());
        }
        if self.model.init.is_some() && !self.model.takes_init() {
            p.check(false, "model.init", || {
                format!(
                    "only applies to mlp and lenet5 (model is {}: {})",
                    self.model.label(),
                    if self.model.uploaded.is_some() {
                        "an uploaded model starts from its own weights"
                    } else {
                        "the ResNets start by Goyal's rule"
                    }
                )
            })
        }
        if let Some(n) = self.train_samples {
            p.check(n >= 1, "train_samples", || "must be at least 1 (got 0)".into());
        }
        if let Some(n) = self.test_samples {
            p.check(n >= 1, "test_samples", || "must be at least 1 (got 0)".into());
        }
        p.int_range("workers", self.workers, 1, MAX_WORKERS);
        match self.devices {
            Some(Devices::Fixed(devices)) => {
                p.int_range("devices", devices, 1, self.workers.max(1));
                p.check(devices == 0 || self.workers % devices == 0, "devices", || {
                    format!(
                        "must divide workers = {} (each device plays workers / devices virtual ranks; got {devices})",
                        self.workers
                    )
                });
            }
            Some(Devices::Range(range)) => {
                let max = range.max.unwrap_or(self.workers);
                p.int_range("devices.min", range.min, 1, self.workers.max(1));
                if let Some(max) = range.max {
                    p.int_range("devices.max", max, range.min.max(1), self.workers.max(1));
                }
                let fits = range.min >= 1 && max >= range.min && max <= self.workers;
                p.check(!fits || !self.allowed_device_counts().is_empty(), "devices", || {
                    format!(
                        "no count from {} to {max} divides workers = {}: the job could run on none",
                        range.min, self.workers
                    )
                });
            }
            None => {}
        }
        self.validate_placement(&mut p);
        p.int_range("per_worker_batch", self.per_worker_batch, 1, MAX_PER_WORKER_BATCH);
        p.int_range("epochs", self.epochs, 1, MAX_EPOCHS);
        if let Some(size) = self.effective_train_size(dataset_size) {
            let kn = self.global_batch();
            p.check(kn <= size, "per_worker_batch", || {
                format!(
                    "the global batch workers * per_worker_batch = {kn} exceeds the {size} training samples: \
                     not one iteration per epoch"
                )
            });
            let total = (size / kn.max(1)).checked_mul(u64::from(self.epochs));
            p.check(total.is_some_and(|t| t <= MAX_TOTAL_ITERATIONS), "epochs", || {
                format!(
                    "{size} samples / {kn} per iteration x {} epochs is more than {MAX_TOTAL_ITERATIONS} iterations",
                    self.epochs
                )
            });
        }

        self.validate_lr(&mut p);

        let opt = &self.optimizer;
        p.float("optimizer.momentum", opt.momentum, |m| (0.0..1.0).contains(&m), "in [0, 1)");
        p.check(!opt.nesterov || opt.momentum > 0.0, "optimizer.nesterov", || {
            "needs momentum > 0 (Nesterov momentum with momentum 0 is plain SGD)".into()
        });
        p.float("optimizer.weight_decay", opt.weight_decay, |w| (0.0..1.0).contains(&w), "in [0, 1)");

        p.int_range("checkpoint_every_epochs", self.checkpoint_every_epochs, 0, self.epochs.max(1));
        p.int_range("log_every_iterations", self.log_every_iterations, 1, 1_000_000);
        p.int_range("max_restarts", self.max_restarts, 0, MAX_RESTARTS);
        p.int_range("priority", self.priority, -MAX_PRIORITY, MAX_PRIORITY);
        p.float("guard.tolerance", self.guard.tolerance, |t| (0.0..=1.0).contains(&t), "in [0, 1]");

        if p.0.is_empty() {
            Ok(())
        } else {
            Err(p.0)
        }
    }

    /// `devices_per_worker` and `placement`: one stage per device, cuts the model has, and what is not cut
    /// into stages yet (uploaded models, elastic jobs).
    fn validate_placement(&self, p: &mut Problems) {
        p.int_range("devices_per_worker", self.devices_per_worker, 1, limits::MAX_DEVICES_PER_WORKER);
        let stages = self.devices_per_worker;
        let Some(placement) = &self.placement else {
            p.check(stages <= 1, "placement", || {
                format!(
                    "missing: devices_per_worker = {stages} needs placement.cuts (a built-in ResNet) or placement.stages (a composite uploaded model)"
                )
            });
            return;
        };
        let devices = if stages == 1 { "device" } else { "devices" };
        match (placement.cuts.is_empty(), placement.stages.is_empty(), self.model.uploaded) {
            (false, false, _) => p.check(false, "placement", || {
                "cuts or stages, not both: cuts cut a built-in model, stages place an uploaded one's modules".into()
            }),
            (true, true, _) => p.check(stages <= 1, "placement", || {
                "missing: placement.cuts (a built-in ResNet) or placement.stages (a composite uploaded model)".into()
            }),
            (false, true, _) => self.validate_cuts(&placement.cuts, stages, devices, p),
            (true, false, None) => p.check(false, "placement.stages", || {
                format!(
                    "stages place a composite uploaded model's modules; {} is cut with placement.cuts",
                    self.model.label()
                )
            }),
            (true, false, Some(_)) => {
                let made = placement.stages.len() as u64;
                p.check(made == u64::from(stages), "placement.stages", || {
                    let s = if made == 1 { "" } else { "s" };
                    format!(
                        "{made} stage{s} for {stages} {devices} per worker (devices_per_worker): one stage per device"
                    )
                });
                for (s, modules) in placement.stages.iter().enumerate() {
                    p.check(!modules.is_empty(), &format!("placement.stages[{s}]"), || {
                        "a stage without modules: a device would have no work".into()
                    });
                }
            }
        }
        p.check(!self.is_elastic(), "placement", || "an elastic job is not cut into stages yet".into());
    }

    /// `placement.cuts`: as many stages as devices, at cuts the built-in model has.
    fn validate_cuts(&self, cuts: &[String], stages: u32, devices: &str, p: &mut Problems) {
        let made = cuts.len() as u64 + 1;
        p.check(made == u64::from(stages), "placement.cuts", || {
            let count = cuts.len();
            let s = if count == 1 { "" } else { "s" };
            match made > u64::from(stages) {
                true => format!("{count} cut{s} make {made} stages, more than the {stages} {devices} per worker (devices_per_worker)"),
                false => format!("{count} cut{s} make {made} stages for {stages} {devices} per worker: a device would have no stage"),
            }
        });
        match (self.model.name.and_then(crate::pipeline::blocks), self.model.uploaded) {
            (_, Some(_)) => p.check(false, "placement.cuts", || {
                "an uploaded model is not cut: place its modules with placement.stages (a composite model)".into()
            }),
            (None, None) => p.check(false, "placement", || {
                format!("only the built-in ResNets are cut into stages (model is {})", self.model.label())
            }),
            (Some(blocks), None) => {
                if let Err(why) = crate::pipeline::stage_bounds(&blocks, cuts) {
                    p.check(false, "placement.cuts", || why.clone());
                }
            }
        }
    }

    fn validate_lr(&self, p: &mut Problems) {
        use limits::MAX_LR;
        let lr = &self.lr;
        let in_lr_range = |v: f64| v > 0.0 && v <= MAX_LR;
        p.float("lr.base", lr.base, in_lr_range, &format!("> 0 and <= {MAX_LR}"));
        p.int_range("lr.reference_batch", lr.reference_batch, 1, u32::MAX);
        if let Some(max) = lr.max {
            p.float("lr.max", max, in_lr_range, &format!("> 0 and <= {MAX_LR}"));
        }
        if let Some(multiplier) = lr.multiplier {
            let in_range = |m: f64| m > 0.0 && m <= limits::MAX_LR_MULTIPLIER;
            p.float("lr.multiplier", multiplier, in_range, &format!("> 0 and <= {}", limits::MAX_LR_MULTIPLIER));
        }

        let epochs = f64::from(self.epochs);
        let warmup = lr.warmup.resolved_epochs();
        match (lr.warmup.kind, lr.warmup.epochs) {
            (WarmupKind::None, Some(e)) => {
                p.check(e == 0.0, "lr.warmup.epochs", || format!("must be 0 or absent when kind is none (got {e})"))
            }
            _ => {
                p.float("lr.warmup.epochs", warmup, |w| w >= 0.0, ">= 0");
                p.check(!warmup.is_finite() || warmup < epochs, "lr.warmup.epochs", || {
                    let default = if lr.warmup.epochs.is_none() { ", the default" } else { "" };
                    format!("must be < epochs (got {warmup}{default}, epochs = {})", self.epochs)
                });
            }
        }

        let decay = &lr.decay;
        p.float("lr.decay.factor", decay.factor, |f| f > 0.0 && f <= 1.0, "in (0, 1]");
        match decay.kind {
            DecayKind::Step => {
                let milestones = decay.resolved_milestones(self.epochs);
                let default = if decay.milestones.is_none() {
                    format!(", the default for {} epochs", self.epochs)
                } else {
                    String::new()
                };
                for (i, &m) in milestones.iter().enumerate() {
                    let path = format!("lr.decay.milestones[{i}]");
                    p.check(m < self.epochs, &path, || {
                        format!("must be < epochs (got {m}{default}, epochs = {})", self.epochs)
                    });
                    p.check(f64::from(m) >= warmup, &path, || {
                        format!("must not fall inside the warmup (got {m}{default}; warmup ends at epoch {warmup})")
                    });
                    if i > 0 {
                        let previous = milestones[i - 1];
                        p.check(m > previous, &path, || {
                            format!("milestones must be strictly increasing (got {m} after {previous})")
                        });
                    }
                }
            }
            DecayKind::Cosine | DecayKind::None => {
                p.check(decay.milestones.is_none(), "lr.decay.milestones", || {
                    format!("only apply to kind step (kind is {:?})", decay.kind).to_lowercase()
                });
            }
        }
    }

    /// The number of training samples used: the dataset's size, capped by `train_samples`.
    pub fn effective_train_size(&self, dataset_size: Option<u64>) -> Option<u64> {
        match (dataset_size, self.train_samples) {
            (Some(size), Some(limit)) => Some(size.min(limit)),
            (Some(size), None) => Some(size),
            (None, Some(_)) | (None, None) => None,
        }
    }
}
