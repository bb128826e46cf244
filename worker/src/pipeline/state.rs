//! A worker's state held across its stages (weights, optimizer state, BatchNorm tables, each stage its
//! own variables'), assembled in stage 0 and handed back out: so a pipelined worker's checkpoint can be the
//! unsplit model's (the same names, files and folder), and the server, downloads, resume and forks need
//! not know that stages exist.
//!
//! Both run between steps, on the links the steps use: gathering in the gradients' direction (towards
//! stage 0), handing out in the activations' direction.

use tch::Tensor;

use super::StageLinks;
use crate::collective::CommResult;

/// Collects every stage's named tensors in stage 0: the last stage sends its own to the one before, each
/// stage in between adds its own and passes them on. Stage 0 gets them all (its own first); the others
/// get None.
pub fn gather(links: &mut StageLinks, own: Vec<(String, Tensor)>) -> CommResult<Option<Vec<(String, Tensor)>>> {
    let mut all = own;
    if !links.is_last() {
        all.extend(links.receive_named_backward()?);
    }
    if links.is_first() {
        return Ok(Some(all));
    }
    links.send_named_backward(&all)?;
    Ok(None)
}

/// Hands each stage its part of the worker's state: stage 0 passes what [`gather`] assembled (or a
/// checkpoint read whole), the others None. Each stage keeps the tensors `mine` accepts and passes the
/// rest on; the last stage gets what no stage before it took.
pub fn scatter(
    links: &mut StageLinks,
    whole: Option<Vec<(String, Tensor)>>,
    mine: impl Fn(&str) -> bool,
) -> CommResult<Vec<(String, Tensor)>> {
    let all = match whole {
        Some(all) => all,
        None => links.receive_named_forward()?,
    };
    let (own, rest): (Vec<_>, Vec<_>) = all.into_iter().partition(|(name, _)| mine(name));
    if !links.is_last() {
        links.send_named_forward(&rest)?;
    }
    Ok(own)
}

/// Sums `mine` (a few numbers: a step's loss and error tallies, whether to stop) over the worker's stages
/// and gives every stage the sum: up the chain adding, then the last stage's total back down. Where only
/// one stage contributes a number (the last stage's loss), the others add zeros and it arrives exact.
pub fn sum_along(links: &mut StageLinks, mine: &[f32]) -> CommResult<Vec<f32>> {
    let mut sum = Tensor::from_slice(mine);
    if !links.is_first() {
        sum += links.receive_forward()?.remove(0);
    }
    if !links.is_last() {
        links.send_forward(std::slice::from_ref(&sum))?;
        sum = links.receive_backward()?.remove(0);
    }
    if !links.is_first() {
        links.send_backward(std::slice::from_ref(&sum))?;
    }
    Ok(Vec::<f32>::try_from(&sum).unwrap_or_default())
}
