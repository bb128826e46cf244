//! Where a built-in model may be cut into pipeline stages, by name, and which blocks each stage holds: one
//! definition for the worker (which builds a stage) and the API (which checks a placement and estimates
//! each stage's memory).
//!
//! The ResNets are cut between residual blocks. A cut is named by the block it follows (`layer2.1`: the
//! second block of the second layer) or by a whole layer (`layer2`: after its last block). The stem goes
//! with the first stage, the pooling and classifier with the last; a cut after the last block would leave
//! the classifier alone, and is no cut.

use crate::spec::ModelName;

/// A residual block of a built-in ResNet, named by its layer and place (`layer2.1`, its variables' path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub name: String,
    /// Whether it is its layer's last block (a cut after it may name the layer alone).
    pub ends_layer: bool,
}

impl Block {
    fn layer(&self) -> &str {
        self.name.split('.').next().unwrap_or_default()
    }
}

/// The residual blocks of a built-in model in order, or None for a model that is not cut into stages.
pub fn blocks(model: ModelName) -> Option<Vec<Block>> {
    let per_layer: &[usize] = match model {
        ModelName::Resnet8 => &[1, 1, 1],
        ModelName::Resnet20 => &[3, 3, 3],
        ModelName::Resnet56 => &[9, 9, 9],
        ModelName::Resnet50 => &[3, 4, 6, 3],
        ModelName::Mlp | ModelName::Lenet5 => return None,
    };
    let blocks = per_layer.iter().enumerate().flat_map(|(layer, &count)| {
        (0..count).map(move |b| Block { name: format!("layer{}.{b}", layer + 1), ends_layer: b + 1 == count })
    });
    Some(blocks.collect())
}

/// The names a cut may take, in the network's order.
pub fn cut_points(blocks: &[Block]) -> Vec<String> {
    let inner = &blocks[..blocks.len().saturating_sub(1)];
    inner
        .iter()
        .flat_map(|b| std::iter::once(b.name.clone()).chain(b.ends_layer.then(|| b.layer().to_string())))
        .collect()
}

/// The block each stage starts at, and the block count last: `[0, c1, …, blocks]` for the stages `cuts`
/// make (each a [`cut_points`] name, in the network's order). The error names the cut at fault and says
/// which cuts there are.
pub fn stage_bounds(blocks: &[Block], cuts: &[String]) -> Result<Vec<usize>, String> {
    let mut bounds = vec![0];
    for cut in cuts {
        let after = blocks
            .iter()
            .position(|b| &b.name == cut || (b.ends_layer && b.layer() == cut))
            .filter(|&i| i + 1 < blocks.len());
        let Some(after) = after else {
            return Err(format!(
                "the model cannot be cut after {cut:?}: its cuts are {}",
                cut_points(blocks).join(", ")
            ));
        };
        if after < *bounds.last().unwrap_or(&0) {
            return Err(format!("the cuts must follow the network's order, each after the one before: {cut:?} is not"));
        }
        bounds.push(after + 1);
    }
    bounds.push(blocks.len());
    Ok(bounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cuts(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn resnet20_is_cut_after_any_block_but_its_last() {
        let blocks = blocks(ModelName::Resnet20).unwrap();
        assert_eq!(blocks.len(), 9);
        let points = cut_points(&blocks);
        assert_eq!(points.first().map(String::as_str), Some("layer1.0"));
        assert!(points.contains(&"layer2".to_string()) && !points.contains(&"layer3".to_string()));
        assert!(!points.contains(&"layer3.2".to_string()));
        assert_eq!(stage_bounds(&blocks, &cuts(&["layer2"])).unwrap(), vec![0, 6, 9]);
        assert_eq!(stage_bounds(&blocks, &cuts(&["layer1.1", "layer3.0"])).unwrap(), vec![0, 2, 7, 9]);
        assert_eq!(stage_bounds(&blocks, &[]).unwrap(), vec![0, 9]);
    }

    #[test]
    fn a_cut_it_has_not_or_out_of_order_is_named() {
        let blocks = blocks(ModelName::Resnet50).unwrap();
        let err = stage_bounds(&blocks, &cuts(&["layer5"])).unwrap_err();
        assert!(err.contains("\"layer5\"") && err.contains("layer3.5") && err.contains("layer3,"), "{err}");
        let err = stage_bounds(&blocks, &cuts(&["layer4.2"])).unwrap_err();
        assert!(err.contains("\"layer4.2\""), "the last block is no cut: {err}");
        let err = stage_bounds(&blocks, &cuts(&["layer2", "layer2.3"])).unwrap_err();
        assert!(err.contains("order") && err.contains("\"layer2.3\""), "{err}");
        assert!(super::blocks(ModelName::Lenet5).is_none());
    }
}
