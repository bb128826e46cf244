//! The order in which one stage runs a step's micro-batches: one forward, one backward (1F1B, the
//! non-interleaved schedule of PipeDream-Flush, Narayanan et al. 2021).
//!
//! Stage s of S first runs S−1−s forwards (the pipeline filling), then alternates a forward with a backward,
//! then runs the backwards left (draining). Its bubble is GPipe's, (S−1)/(v+S−1) of a step at v
//! micro-batches, but a stage holds at most S−s micro-batches' activations instead of all v. Backwards run in
//! micro-batch order in every stage, so each parameter's gradient is summed in the order one device
//! would sum it: the split model's gradients are the unsplit one's, bit for bit.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use tch::Tensor;

use super::link::{StageLinks, Traffic};

/// What one stage's share of a step cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageStep {
    /// Forward and backward passes.
    pub compute: Duration,
    /// Sending activations or gradients, and waiting for them (see [`Traffic`]).
    pub traffic: Traffic,
}

/// A micro-batch between its forward and its backward: the inputs it got (to send their gradients back)
/// and what it made (the next stage's inputs, or the loss alone in the last stage).
struct InFlight {
    inputs: Vec<Tensor>,
    outputs: Vec<Tensor>,
}

/// Runs one step of `micro_batches` micro-batches through this stage. `forward(j, inputs)` is micro-batch
/// j's forward pass: `inputs` is empty in the first stage (it reads its own data) and the previous stage's
/// activations otherwise; it returns the activations for the next stage, or in the last stage the loss to
/// back-propagate (alone). Parameters' gradients accumulate into their `.grad`, as one device's would.
pub fn one_forward_one_backward(
    links: &mut StageLinks,
    micro_batches: usize,
    mut forward: impl FnMut(usize, &[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<StageStep> {
    let started = Instant::now();
    let before = links.traffic;
    let filling = (links.stages() - links.stage() - 1).min(micro_batches);
    let mut in_flight = VecDeque::new();
    let mut next = 0;
    let mut run_forward = |links: &mut StageLinks, j: usize| -> Result<InFlight> {
        let inputs: Vec<Tensor> = match links.is_first() {
            true => Vec::new(),
            false => links.receive_forward()?.into_iter().map(|t| t.set_requires_grad(true)).collect(),
        };
        let outputs = forward(j, &inputs).with_context(|| format!("forward of micro-batch {j}"))?;
        if !links.is_last() {
            links.send_forward(&outputs)?;
        }
        Ok(InFlight { inputs, outputs })
    };
    for _ in 0..filling {
        in_flight.push_back(run_forward(links, next)?);
        next += 1;
    }
    for j in 0..micro_batches {
        if next < micro_batches {
            in_flight.push_back(run_forward(links, next)?);
            next += 1;
        }
        let done = in_flight.pop_front().expect("a forward precedes each backward");
        backward(links, done).with_context(|| format!("backward of micro-batch {j}"))?;
    }
    let traffic = Traffic {
        sending: links.traffic.sending - before.sending,
        waiting: links.traffic.waiting - before.waiting,
        bytes_sent: links.traffic.bytes_sent - before.bytes_sent,
    };
    let compute = started.elapsed().saturating_sub(traffic.sending + traffic.waiting);
    Ok(StageStep { compute, traffic })
}

/// Back-propagates one micro-batch through this stage: from its loss in the last stage, else from the
/// gradients the next stage sends for its outputs; then sends its inputs' gradients to the previous stage.
fn backward(links: &mut StageLinks, micro_batch: InFlight) -> Result<()> {
    let InFlight { inputs, outputs } = micro_batch;
    if links.is_last() {
        ensure!(outputs.len() == 1, "the last stage makes one loss, not {} tensors", outputs.len());
        outputs[0].f_backward()?;
    } else {
        let gradients = links.receive_backward()?;
        ensure!(
            gradients.len() == outputs.len(),
            "the next stage sent {} gradients for {} activations",
            gradients.len(),
            outputs.len()
        );
        // d(Σ output·g)/d output is g exactly (1·g), so this is backward(outputs, gradients) to the last bit
        let mut surrogate: Option<Tensor> = None;
        for (output, gradient) in outputs.iter().zip(gradients) {
            let term = (output * gradient.to_device(output.device()).to_kind(output.kind())).sum(None);
            surrogate = Some(match surrogate {
                Some(sum) => sum + term,
                None => term,
            });
        }
        if let Some(surrogate) = surrogate {
            surrogate.f_backward()?;
        }
    }
    if !inputs.is_empty() {
        let gradients: Vec<Tensor> = inputs
            .iter()
            .map(|input| {
                let gradient = input.grad();
                if gradient.defined() {
                    gradient
                } else {
                    input.zeros_like()
                }
            })
            .collect();
        links.send_backward(&gradients)?;
    }
    Ok(())
}
