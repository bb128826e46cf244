//! One stage of a worker's pipeline as a unit that trains: its part of the model, its optimizer, each
//! micro-batch's BatchNorm statistics and its links to the neighbouring stages. Tests and
//! `ringtrain bench pipeline` drive it on a worker's batch.

use anyhow::Result;
use tch::nn::{ModuleT, VarStore};
use tch::Tensor;

use super::{one_forward_one_backward, StageLinks, StageStep};
use crate::batch_norm::BatchNormState;
use crate::collective::Collective;
use crate::optim::{Sgd, SgdConfig};

pub struct Stage {
    model: Box<dyn ModuleT>,
    /// Holds the stage's variables (the model and optimizer hold tensors of it).
    vs: VarStore,
    opt: Sgd,
    bn: BatchNormState,
    micro_batches: usize,
    pub links: StageLinks,
    /// The ring of this stage across the job's workers, and k (every worker's micro-batches); None: a
    /// worker alone, k = its micro-batches.
    data_parallel: Option<(Box<dyn Collective>, usize)>,
    staging: Vec<f32>,
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage").field("stage", &self.links.stage()).field("stages", &self.links.stages()).finish()
    }
}

/// What a stage's step gave: the micro-batches' mean losses summed (the last stage alone has them) and
/// where its time went.
#[derive(Debug, Clone, Copy)]
pub struct StepDone {
    pub loss: Option<f64>,
    pub step: StageStep,
}

impl Stage {
    /// A stage of `model` (built by [`crate::models::build_stage`] into `vs`), playing `micro_batches`
    /// virtual ranks.
    pub fn new(
        model: Box<dyn ModuleT>,
        vs: VarStore,
        config: SgdConfig,
        micro_batches: usize,
        links: StageLinks,
    ) -> Stage {
        let opt = Sgd::new(&vs, config);
        let bn = BatchNormState::new(&vs, micro_batches);
        Stage { model, vs, opt, bn, micro_batches, links, data_parallel: None, staging: Vec::new() }
    }

    /// Sums this stage's gradients with the same stage of the other workers over `ring`; `total_ranks` is
    /// k, every worker's micro-batches together.
    pub fn with_data_parallel(mut self, ring: Box<dyn Collective>, total_ranks: usize) -> Stage {
        self.data_parallel = Some((ring, total_ranks));
        self
    }

    /// One SGD step of one worker on its batch: `x` (read by the first stage) and `labels` (read by the
    /// last) hold the micro-batches one after the other, n rows each. Each micro-batch's loss is its mean
    /// over n; the gradients are their sum over every worker's micro-batches divided by k, their number.
    pub fn train_step(&mut self, lr: f64, x: &Tensor, labels: &Tensor) -> Result<StepDone> {
        let v = self.micro_batches;
        let n = x.size()[0] / v as i64;
        let (model, bn, last) = (&self.model, &mut self.bn, self.links.is_last());
        self.opt.zero_grad();
        let mut loss_sum = 0.0;
        let step = one_forward_one_backward(&mut self.links, v, |j, inputs| {
            let input = match inputs {
                [activation] => activation.shallow_clone(),
                [] => x.narrow(0, j as i64 * n, n),
                more => anyhow::bail!("a ResNet stage takes one activation, not {}", more.len()),
            };
            bn.swap_in(j);
            let out = model.forward_t(&input, true);
            bn.swap_out(j);
            if !last {
                return Ok(vec![out]);
            }
            let loss = out.cross_entropy_for_logits(&labels.narrow(0, j as i64 * n, n));
            loss_sum += loss.double_value(&[]);
            Ok(vec![loss])
        })?;
        let mut grads = self.opt.local_gradients();
        let k = match &mut self.data_parallel {
            Some((ring, k)) => {
                ring.all_reduce_sum_tensors(&mut grads, &mut self.staging)?;
                *k
            }
            None => v,
        };
        let grads: Vec<Tensor> = grads.iter().map(|g| g / k as f64).collect();
        self.opt.step(lr, &grads);
        Ok(StepDone { loss: last.then_some(loss_sum), step })
    }

    /// The stage's variables by name (weights and BatchNorm buffers).
    pub fn variables(&self) -> Vec<(String, Tensor)> {
        self.vs.variables().into_iter().collect()
    }

    /// What a checkpoint keeps of this stage: its variables (`model/NAME`) and their momentum
    /// (`optimizer/NAME`), copies.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let model = self.variables().into_iter().map(|(n, t)| (format!("model/{n}"), t.detach().copy()));
        let optimizer = self.opt.state().into_iter().map(|(n, t)| (format!("optimizer/{n}"), t.detach().copy()));
        model.chain(optimizer).collect()
    }
}
