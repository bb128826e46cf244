//! The `scale_search` template: find the lr for a larger batch by trying it, instead of trusting
//! a scaling rule. The base spec is the small-batch reference (k0 workers); the candidates run the same
//! recipe at `target_workers` k with the reference's lr times a multiplier m on a log grid from sqrt(k/k0)
//! (the square-root rule) to k/k0 (the linear rule), optionally times a few warmup lengths; successive
//! halving (`halving`) stops the candidates that are not among the best at each rung, so the grid is paid
//! for only where it is promising. The reference trains to the end: its curve is what the candidates are
//! shown against, unless `reference_job` names a finished run to reuse (the server fills the base from it).

use serde_json::{Map, Value};

use super::halving::{SearchKind, SearchMetric, SearchSpec};
use super::StudyRequest;
use crate::error::FieldError;
use crate::schedule::scaling_factor;
use crate::spec::JobSpec;

/// Candidates tried when the request does not say.
pub const DEFAULT_CANDIDATES: u32 = 6;

/// The study a `scale_search` request stands for: point 0 the reference (the base as given), then one
/// point per multiplier (and warmup length), and a halving search unless the request brings its own.
pub fn resolve(request: &StudyRequest) -> Result<StudyRequest, FieldError> {
    if request.axes.is_some() || request.points.is_some() || request.reference.is_some() {
        return Err(FieldError::new(
            "template",
            "scale_search makes its own points: give no axes, points or reference",
        ));
    }
    let base_json = match &request.base {
        Some(Value::Object(base)) => Value::Object(base.clone()),
        _ => return Err(FieldError::new("base", "is required: the small-batch reference spec (an object)")),
    };
    let base = JobSpec::from_value(&base_json).map_err(|mut errors| {
        let first = errors.remove(0);
        FieldError::new(format!("base.{}", first.path).trim_end_matches('.').to_string(), first.reason)
    })?;
    let Some(target) = request.target_workers else {
        return Err(FieldError::new("target_workers", "is required: the worker count to scale the base to"));
    };
    if target <= base.workers {
        return Err(FieldError::new(
            "target_workers",
            format!("must be above the base's workers ({}): the base is the small-batch reference", base.workers),
        ));
    }
    if let Some(devices) = request.devices {
        if devices == 0 || target % devices != 0 {
            return Err(FieldError::new("devices", format!("must divide target_workers ({target})")));
        }
    }
    let count = request.candidates.unwrap_or(DEFAULT_CANDIDATES);
    if !(2..=16).contains(&count) {
        return Err(FieldError::new("candidates", "must be 2 to 16"));
    }
    let warmups = request.warmup_epochs.clone().unwrap_or_default();
    if warmups.len() > 4 || warmups.iter().any(|w| !w.is_finite() || *w < 0.0 || *w >= f64::from(base.epochs)) {
        return Err(FieldError::new(
            "warmup_epochs",
            format!("must be at most 4 lengths, each from 0 to below the epochs ({})", base.epochs),
        ));
    }

    // the reference's own factor, so a candidate's lr is the reference's lr times m
    let reference_factor = scaling_factor(&base.lr, base.global_batch());
    let ratio = f64::from(target) / f64::from(base.workers);
    let mut points = vec![Map::new()];
    for m in multipliers(ratio, count) {
        let warmup_choices: Vec<Option<f64>> =
            if warmups.is_empty() { vec![None] } else { warmups.iter().copied().map(Some).collect() };
        for warmup in warmup_choices {
            let mut point = Map::new();
            point.insert("workers".into(), target.into());
            if let Some(devices) = request.devices {
                point.insert("devices".into(), devices.into());
            }
            point.insert("lr.multiplier".into(), round4(m * reference_factor).into());
            if let Some(epochs) = warmup {
                point.insert("lr.warmup.epochs".into(), epochs.into());
            }
            points.push(point);
        }
    }
    let search = match &request.search {
        Some(search) => search.clone(),
        None => default_search(base.epochs),
    };
    Ok(StudyRequest {
        name: request.name.clone().or_else(|| Some(format!("scale search: {} to {target} workers", base.workers))),
        template: None,
        base: Some(base_json),
        axes: None,
        points: Some(points),
        reference: Some(0),
        guard_points: request.guard_points,
        search: Some(search),
        max_device_hours: request.max_device_hours,
        target_workers: None,
        devices: None,
        candidates: None,
        warmup_epochs: None,
        reference_job: request.reference_job,
    })
}

/// `count` multipliers from sqrt(ratio) to ratio, evenly spaced in log.
pub fn multipliers(ratio: f64, count: u32) -> Vec<f64> {
    let (low, high) = (ratio.sqrt().ln(), ratio.ln());
    (0..count).map(|i| (low + (high - low) * f64::from(i) / f64::from(count - 1)).exp()).collect()
}

/// Rungs after 1, 2, 4 … epochs below `epochs`, the best third going on.
pub fn default_search(epochs: u32) -> SearchSpec {
    let rungs = std::iter::successors(Some(1u32), |r| r.checked_mul(2)).take_while(|r| *r < epochs).collect();
    SearchSpec { kind: SearchKind::Asha, metric: SearchMetric::TestError, rungs, reduction: 3 }
}

/// Four significant figures: labels and specs that read as numbers a person would write.
pub fn round4(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(3 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::study::reference_point;

    #[test]
    fn candidates_span_the_square_root_rule_to_the_linear_rule() {
        let m = multipliers(32.0, 6);
        assert!((m[0] - 32f64.sqrt()).abs() < 1e-9 && (m[5] - 32.0).abs() < 1e-9, "{m:?}");
        // 32^(1/10) apart: √2
        assert!(m.windows(2).all(|w| (w[1] / w[0] - 2f64.sqrt()).abs() < 1e-9), "{m:?}");
        assert_eq!(default_search(8).rungs, [1, 2, 4]);
        assert_eq!(default_search(1).rungs, Vec::<u32>::new());
        assert_eq!(round4(22.627416997969522), 22.63);
    }

    #[test]
    fn a_scale_search_is_the_reference_and_its_candidates_under_halving() {
        let request: StudyRequest = serde_json::from_value(json!({
            "template": "scale_search",
            "base": {"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "workers": 1, "per_worker_batch": 32,
                     "epochs": 8, "lr": {"base": 0.05, "reference_batch": 32, "warmup": {"epochs": 1}}},
            "target_workers": 32, "devices": 2, "warmup_epochs": [1, 2]
        }))
        .unwrap();
        let resolved = request.resolved().unwrap();
        let points = resolved.plan().unwrap();
        assert_eq!(points.len(), 1 + 6 * 2);
        assert_eq!(reference_point(&resolved, &points), 0);
        assert_eq!(points[0].spec.workers, 1);
        let first = &points[1].spec;
        assert_eq!((first.workers, first.global_batch()), (32, 1024));
        assert_eq!(first.lr.multiplier, Some(5.657));
        assert_eq!(points[12].spec.lr.multiplier, Some(32.0));
        assert_eq!(points[12].spec.lr.warmup.epochs, Some(2.0));
        assert_eq!(resolved.search.unwrap().rungs, [1, 2, 4]);

        let refused = |patch: Value| {
            let mut value = json!({"template": "scale_search", "base": {"model": {"name": "mlp"}, "dataset": "synthetic", "workers": 2}, "target_workers": 8});
            value.as_object_mut().unwrap().extend(patch.as_object().unwrap().clone());
            serde_json::from_value::<StudyRequest>(value).unwrap().resolved().unwrap_err().path
        };
        assert_eq!(refused(json!({"target_workers": 2})), "target_workers");
        assert_eq!(refused(json!({"devices": 3})), "devices");
        assert_eq!(refused(json!({"candidates": 1})), "candidates");
        assert_eq!(refused(json!({"axes": {"seed": [1]}})), "template");
        let stray: StudyRequest =
            serde_json::from_value(json!({"base": {}, "points": [{}], "target_workers": 4})).unwrap();
        assert_eq!(stray.resolved().unwrap_err().path, "target_workers");
    }
}
