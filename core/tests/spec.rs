//! Parsing and validation of job specs: defaults, unknown fields, and every problem reported at once with
//! its JSON path.

use ringtrain_core::spec::{DecayKind, DeviceKind, JobSpec, ModelName, MomentumForm, Scaling, WarmupKind};
use ringtrain_core::{DatasetRef, FieldError};

fn errors(json: &str) -> Vec<FieldError> {
    JobSpec::from_json(json).expect_err("spec should be rejected")
}

fn paths(json: &str) -> Vec<String> {
    errors(json).into_iter().map(|e| e.path).collect()
}

#[test]
fn minimal_spec_gets_goyal_defaults() {
    let spec = JobSpec::from_json(r#"{"model": {"name": "resnet50"}, "dataset": "fashion-mnist"}"#).unwrap();
    assert_eq!(spec.workers, 1);
    assert_eq!(spec.per_worker_batch, 32);
    assert_eq!(spec.epochs, 90);
    assert_eq!(spec.lr.base, 0.1);
    assert_eq!(spec.lr.reference_batch, 256);
    assert_eq!(spec.lr.scaling, Scaling::Linear);
    assert_eq!(spec.lr.warmup.kind, WarmupKind::Gradual);
    assert_eq!(spec.lr.warmup.resolved_epochs(), 5.0);
    assert_eq!(spec.lr.decay.kind, DecayKind::Step);
    assert_eq!(spec.lr.decay.resolved_milestones(90), vec![30, 60, 80]);
    assert_eq!(spec.lr.decay.factor, 0.1);
    assert_eq!(spec.optimizer.momentum, 0.9);
    assert!(spec.optimizer.nesterov);
    assert_eq!(spec.optimizer.momentum_form, MomentumForm::Goyal);
    assert_eq!(spec.optimizer.weight_decay, 1e-4);
    assert!(!spec.optimizer.bn_weight_decay);
    assert!(spec.bn_zero_init_last);
    assert_eq!(spec.device, DeviceKind::Cpu);
    assert_eq!(spec.dataset, DatasetRef::FashionMnist);
}

#[test]
fn default_milestones_follow_the_number_of_epochs() {
    let spec = JobSpec::from_json(
        r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "epochs": 9, "lr": {"warmup": {"epochs": 1}}}"#,
    )
    .unwrap();
    assert_eq!(spec.lr.decay.resolved_milestones(spec.epochs), vec![3, 6, 8]);
}

#[test]
fn model_options_parse() {
    let spec =
        JobSpec::from_json(r#"{"model": {"name": "mlp", "hidden": [64, 32]}, "dataset": "synthetic", "epochs": 20}"#)
            .unwrap();
    assert_eq!(spec.model.name, Some(ModelName::Mlp));
    assert_eq!(spec.model.hidden_widths(), vec![64, 32]);
}

#[test]
fn serialises_back_to_an_equal_spec() {
    let spec = JobSpec::from_json(
        r#"{"model": {"name": "resnet20"}, "dataset": "idx:/tmp/x", "epochs": 12, "workers": 4,
            "lr": {"base": 0.2, "max": 1.5, "warmup": {"kind": "constant", "epochs": 2.5},
                   "decay": {"kind": "step", "milestones": [6, 9], "factor": 0.2}}}"#,
    )
    .unwrap();
    let text = serde_json::to_string(&spec).unwrap();
    assert_eq!(JobSpec::from_json(&text).unwrap(), spec);
}

#[test]
fn unknown_fields_are_rejected_with_their_path() {
    let err = errors(r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "lr": {"bsae": 0.1}}"#);
    assert_eq!(err.len(), 1);
    assert_eq!(err[0].path, "lr.bsae");
    assert!(err[0].reason.contains("unknown field `bsae`"), "{}", err[0].reason);

    let err = errors(r#"{"model": {"name": "lenet5", "depth": 3}, "dataset": "fashion-mnist"}"#);
    assert_eq!(err[0].path, "model.depth");
    assert!(err[0].reason.contains("unknown field `depth`"), "{}", err[0].reason);

    let err = errors(r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "gpus": 3}"#);
    assert!(err[0].reason.contains("unknown field `gpus`"), "{}", err[0].reason);
}

#[test]
fn wrong_types_and_names_are_rejected_with_their_path() {
    let cases = [
        (r#"{"model": {"name": "vgg"}, "dataset": "fashion-mnist"}"#, "model.name", "unknown variant `vgg`"),
        (r#"{"model": {"name": "lenet5"}, "dataset": "cifar"}"#, "dataset", "unknown dataset"),
        (r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "workers": -1}"#, "workers", "-1"),
        (r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "workers": "8"}"#, "workers", "string"),
        (
            r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "lr": {"scaling": "cubic"}}"#,
            "lr.scaling",
            "unknown variant `cubic`",
        ),
        (r#"{"model": {"name": "mlp", "hidden": [1, -2]}, "dataset": "fashion-mnist"}"#, "model.hidden[1]", "-2"),
        (r#"{"dataset": "fashion-mnist"}"#, "", "missing field `model`"),
    ];
    for (json, path, reason) in cases {
        let err = errors(json);
        assert_eq!(err.len(), 1, "{json}");
        assert_eq!(err[0].path, path, "{json}: {}", err[0]);
        assert!(err[0].reason.contains(reason), "{json}: {}", err[0]);
    }
}

#[test]
fn malformed_json_keeps_its_position() {
    let err = errors(r#"{"model": {"name": "lenet5"},"#);
    assert!(err[0].reason.contains("line 1"), "{}", err[0]);
}

#[test]
fn every_problem_is_reported_at_once() {
    let json = r#"{
        "model": {"name": "mlp", "hidden": [0]},
        "dataset": "fashion-mnist",
        "workers": 0, "per_worker_batch": 0, "epochs": 10,
        "lr": {"base": -1, "max": 0, "warmup": {"epochs": 12},
               "decay": {"milestones": [8, 4, 11], "factor": 2}},
        "optimizer": {"momentum": 1.5, "weight_decay": -0.1},
        "checkpoint_every_epochs": 11, "log_every_iterations": 0, "max_restarts": 1000, "priority": 5000
    }"#;
    let err = errors(json);
    let got: Vec<String> = err.iter().map(|e| e.path.clone()).collect();
    for path in [
        "model.hidden[0]",
        "workers",
        "per_worker_batch",
        "lr.base",
        "lr.max",
        "lr.warmup.epochs",
        "lr.decay.factor",
        "lr.decay.milestones[1]",
        "lr.decay.milestones[2]",
        "optimizer.momentum",
        "optimizer.weight_decay",
        "checkpoint_every_epochs",
        "log_every_iterations",
        "max_restarts",
        "priority",
    ] {
        assert!(got.iter().any(|p| p == path), "no error for {path}; got {got:?}");
    }
    let warmup = err.iter().find(|e| e.path == "lr.warmup.epochs").unwrap();
    assert_eq!(warmup.to_string(), "lr.warmup.epochs: must be < epochs (got 12, epochs = 10)");
}

#[test]
fn default_warmup_longer_than_a_short_run_says_it_is_the_default() {
    let err = errors(r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "epochs": 3}"#);
    let warmup = err.iter().find(|e| e.path == "lr.warmup.epochs").unwrap();
    assert!(warmup.reason.contains("the default"), "{warmup}");
}

#[test]
fn global_batch_larger_than_the_dataset_is_rejected() {
    assert_eq!(
        paths(
            r#"{"model": {"name": "lenet5"}, "dataset": "synthetic:100", "workers": 4, "per_worker_batch": 32,
                "epochs": 10, "lr": {"warmup": {"epochs": 1}}}"#
        ),
        vec!["per_worker_batch"]
    );
    // train_samples caps the dataset
    assert_eq!(
        paths(
            r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "train_samples": 64, "workers": 4,
                "epochs": 10, "lr": {"warmup": {"epochs": 1}}}"#
        ),
        vec!["per_worker_batch"]
    );
}

#[test]
fn non_finite_and_contradictory_values_are_rejected() {
    assert_eq!(
        paths(r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "lr": {"base": 1e309}}"#),
        vec!["lr.base"],
        "1e309 overflows to infinity"
    );
    assert_eq!(
        paths(
            r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "lr": {"warmup": {"kind": "none", "epochs": 3}}}"#
        ),
        vec!["lr.warmup.epochs"]
    );
    assert_eq!(
        paths(
            r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "lr": {"decay": {"kind": "cosine", "milestones": [30]}}}"#
        ),
        vec!["lr.decay.milestones"]
    );
    assert_eq!(
        paths(r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "optimizer": {"momentum": 0}}"#),
        vec!["optimizer.nesterov"]
    );
    assert_eq!(paths(r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "name": "  "}"#), vec!["name"]);
    assert_eq!(
        paths(r#"{"model": {"name": "lenet5", "hidden": [3]}, "dataset": "fashion-mnist"}"#),
        vec!["model.hidden"]
    );
    assert_eq!(
        paths(r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "augment": "none", "image_size": 28}"#),
        vec!["image_size", "augment"]
    );
    let spec = r#"{"model": {"name": "lenet5"}, "dataset": "shards:/data/x", "augment": "none"}"#;
    assert_eq!(JobSpec::from_json(spec).unwrap().augment, Some(ringtrain_core::spec::Augment::None));
}

#[test]
fn default_milestones_inside_the_default_warmup_say_they_are_defaults() {
    let err = errors(r#"{"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "epochs": 10}"#);
    assert_eq!(err.len(), 1, "{err:?}");
    assert_eq!(
        err[0].to_string(),
        "lr.decay.milestones[0]: must not fall inside the warmup (got 3, the default for 10 epochs; \
         warmup ends at epoch 5)"
    );
}

#[test]
fn a_model_is_a_built_in_name_or_an_upload_with_its_own_data() {
    let id = "0b4f8f36-44d2-4b3e-9a43-6f6d0d1c4c15";
    let uploaded = format!(r#"{{"model": {{"uploaded": "{id}"}}, "dataset": "{id}", "loss": "huber"}}"#);
    let spec = JobSpec::from_json(&uploaded).unwrap();
    assert_eq!((spec.model.name, spec.model.label()), (None, format!("uploaded:{id}")));
    let cases = [
        (
            format!(r#"{{"model": {{"name": "mlp", "uploaded": "{id}"}}, "dataset": "{id}"}}"#),
            "model.uploaded",
            "not both",
        ),
        (r#"{"model": {}, "dataset": "fashion-mnist"}"#.to_string(), "model.name", "missing"),
        (format!(r#"{{"model": {{"uploaded": "{id}"}}, "dataset": "fashion-mnist"}}"#), "dataset", "uploaded dataset"),
        (r#"{"model": {"name": "mlp"}, "dataset": "fashion-mnist", "loss": "mse"}"#.to_string(), "loss", "classify"),
        (
            r#"{"model": {"name": "mlp"}, "dataset": "fashion-mnist", "loss": "l1"}"#.to_string(),
            "loss",
            "unknown variant",
        ),
    ];
    for (json, path, reason) in cases {
        let err = errors(&json);
        assert_eq!(err.len(), 1, "{json}: {err:?}");
        assert_eq!(err[0].path, path, "{json}: {}", err[0]);
        assert!(err[0].reason.contains(reason), "{json}: {}", err[0]);
    }
}

/// `devices` as a range makes a job elastic: its counts are the divisors of `workers` in the range; a range
/// that holds none, or is upside down, is refused at its path; anything but a count or a range says what is
/// expected.
#[test]
fn a_device_range_lists_the_divisors_of_workers_within_it() {
    let spec = |devices: &str| {
        JobSpec::from_json(&format!(
            r#"{{"model": {{"name": "mlp"}}, "dataset": "synthetic", "workers": 12, "devices": {devices}}}"#
        ))
    };
    let elastic = spec(r#"{"min": 2}"#).unwrap();
    assert!(elastic.is_elastic());
    assert_eq!(elastic.allowed_device_counts(), [2, 3, 4, 6, 12]);
    assert_eq!(elastic.device_count(), 12);
    assert_eq!(spec(r#"{"min": 2, "max": 5}"#).unwrap().allowed_device_counts(), [2, 3, 4]);
    let fixed = spec("4").unwrap();
    assert!(!fixed.is_elastic());
    assert_eq!(fixed.allowed_device_counts(), [4]);
    assert_eq!(fixed.virtual_ranks(), 3);
    let paths = |devices: &str| -> Vec<String> { spec(devices).unwrap_err().into_iter().map(|e| e.path).collect() };
    assert_eq!(paths(r#"{"min": 5, "max": 5}"#), ["devices"], "no count from 5 to 5 divides 12");
    assert_eq!(paths(r#"{"min": 6, "max": 4}"#), ["devices.max"]);
    assert_eq!(paths(r#"{"min": 0}"#), ["devices.min"]);
    let wrong = spec(r#""four""#).unwrap_err();
    assert!(wrong[0].reason.contains(r#"a device count, or a range such as {"min": 1, "max": 8}"#), "{wrong:?}");
    let unknown = spec(r#"{"least": 1}"#).unwrap_err();
    assert_eq!(unknown[0].path, "devices.least", "{unknown:?}");
}
