//! The job spec's JSON Schema in the API document: every field with its type, default, range and enum, as
//! `ringtrain_core::spec` parses and `ringtrain_core::validate` checks them. Rules across fields
//! (milestones within the epochs and after the warmup, the global batch within the dataset, checkpoints at
//! most every `epochs`) cannot be stated here; the server answers them with 422 and the field's path.
//!
//! Written out rather than derived: the core crate's types are serde's, and the bounds live in
//! `validate::limits`, which this uses, so a changed limit changes the document too. Nothing here is
//! stricter than the server (a request this schema refuses, the server refuses).

use ringtrain_core::validate::limits::*;
use serde_json::{json, Value};
use utoipa::openapi::{Content, OpenApi, Ref, RefOr, Schema};
use utoipa::Modify;

/// The name of the component.
pub const JOB_SPEC: &str = "JobSpec";
/// The name of the study request's component (`POST /v1/studies`), whose `base` is a [`JOB_SPEC`].
pub const STUDY_REQUEST: &str = "StudyRequest";

/// Operations whose JSON body is a job spec.
const SPEC_BODIES: [&str; 2] = ["/v1/jobs", "/v1/schedules/preview"];

/// Adds the `JobSpec` component and makes it the body of the routes that take a spec.
#[derive(Debug)]
pub struct JobSpecSchema;

impl Modify for JobSpecSchema {
    fn modify(&self, openapi: &mut OpenApi) {
        let schema: RefOr<Schema> = match serde_json::from_value(job_spec()) {
            Ok(schema) => schema,
            // A broken literal above: the tests that read the document fail on the missing component.
            Err(err) => {
                tracing::error!(error = %err, "the job spec's schema does not parse");
                return;
            }
        };
        openapi.components.get_or_insert_with(Default::default).schemas.insert(JOB_SPEC.to_string(), schema);
        for path in SPEC_BODIES {
            let Some(item) = openapi.paths.paths.get_mut(path) else { continue };
            let Some(body) = item.post.as_mut().and_then(|op| op.request_body.as_mut()) else { continue };
            body.content.insert("application/json".to_string(), Content::new(Some(Ref::from_schema_name(JOB_SPEC))));
        }
        let Ok(study) = serde_json::from_value::<RefOr<Schema>>(study_request()) else {
            tracing::error!("the study request's schema does not parse");
            return;
        };
        openapi.components.get_or_insert_with(Default::default).schemas.insert(STUDY_REQUEST.to_string(), study);
        let study_body = openapi.paths.paths.get_mut("/v1/studies").and_then(|item| item.post.as_mut());
        if let Some(body) = study_body.and_then(|op| op.request_body.as_mut()) {
            body.content
                .insert("application/json".to_string(), Content::new(Some(Ref::from_schema_name(STUDY_REQUEST))));
        }
    }
}

/// `POST /v1/studies`: what `ringtrain_core::study::StudyRequest` parses. Which of template, axes and points
/// may go together, and how many points axes make, are the server's 422s. Nullable fields are an `anyOf`
/// with `null` and arrays say what their items are, so client generators (openapi-python-client) can type
/// every field (tests/python_client.rs).
pub fn study_request() -> Value {
    use ringtrain_core::study::MAX_DEVICE_HOURS;
    let max_points = ringtrain_core::study::MAX_POINTS;
    json!({
        "type": "object", "additionalProperties": false,
        "properties": {
            "name": {"type": ["string", "null"], "minLength": 1, "maxLength": MAX_NAME_CHARS},
            "template": {"anyOf": [{"type": "string", "enum": ["goyal", "scale_search"]}, {"type": "null"}],
                "description": "A built-in study instead of base and axes or points: goyal (Goyal et al.'s Table 1 in miniature), or scale_search (base: the small-batch reference, or reference_job: a finished one; candidates at target_workers with lr multipliers from the square-root to the linear rule, under successive halving)."},
            "base": {"anyOf": [{"$ref": format!("#/components/schemas/{JOB_SPEC}")}, {"type": "null"}],
                "description": "The spec every point starts from."},
            "axes": {"anyOf": [{"type": "object", "additionalProperties": {"type": "array", "minItems": 1, "items": axis_value()}},
                               {"type": "null"}],
                "description": "Spec path (dotted) → values (any JSON the path takes); the points are every combination, paths in sorted order."},
            "points": {"type": ["array", "null"], "minItems": 1, "maxItems": max_points,
                "items": {"type": "object"}, "description": "Instead of axes: each point's overrides (spec path → value)."},
            "reference": {"type": ["integer", "null"], "minimum": 0, "maximum": max_points - 1,
                "description": "The reference point's index (default: the smallest global batch)."},
            "guard_points": {"type": "boolean", "default": false,
                "description": "Set every other point's guard.reference_job to the reference's job."},
            "search": {"anyOf": [search_spec(), {"type": "null"}],
                "description": "Successive halving over the points: those not among the best 1/reduction at a rung end stopped (the reference never)."},
            "max_device_hours": {"anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DEVICE_HOURS}, {"type": "null"}],
                "description": "A cap on the device-hours of all points together; reached, the points not ended are stopped. At most what the team's budget has left this period."},
            "target_workers": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_WORKERS,
                "description": "scale_search: the worker count to scale the base to (above the base's)."},
            "devices": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_WORKERS,
                "description": "scale_search: the devices each candidate holds (dividing target_workers)."},
            "candidates": {"type": ["integer", "null"], "minimum": 2, "maximum": 16,
                "description": "scale_search: how many lr multipliers to try (default 6)."},
            "warmup_epochs": {"type": ["array", "null"], "maxItems": 4, "items": {"type": "number", "minimum": 0},
                "description": "scale_search: warmup lengths to try with every multiplier."},
            "reference_job": {"type": ["string", "null"], "format": "uuid",
                "description": "scale_search: a finished job of the team to be the reference instead of running one; its spec is the base (give no base)."}
        }
    })
}

/// `search` of a study: what `ringtrain_core::study::halving::SearchSpec` parses.
fn search_spec() -> Value {
    json!({
        "type": "object", "additionalProperties": false, "required": ["kind", "rungs"],
        "properties": {
            "kind": {"type": "string", "enum": ["asha"], "description": "Asynchronous successive halving."},
            "metric": {"type": "string", "enum": ["test_error", "train_error"], "default": "test_error",
                "description": "The figure points are compared by (lower is better)."},
            "rungs": {"type": "array", "minItems": 1, "maxItems": ringtrain_core::study::halving::MAX_RUNGS,
                "items": {"type": "integer", "minimum": 1},
                "description": "Epochs after which points are compared, increasing, each below every searched point's epochs."},
            "reduction": {"type": "integer", "minimum": 2, "maximum": 16, "default": 3,
                "description": "The best 1/reduction of the points at a rung go on."}
        }
    })
}

/// A value an axis gives its spec path: any JSON a spec field takes. Spelled out as a union because a
/// schema without a type (`{}`) does not survive utoipa's reading of this literal, and client generators
/// cannot type an array whose items are unknown.
fn axis_value() -> Value {
    let numbers = json!({"type": "array", "items": {"type": "number"}});
    json!({"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "object"}, numbers, {"type": "null"}]})
}

/// `integer` within a range, with a default.
fn integer(min: i128, max: i128, default: Option<i64>, description: &str) -> Value {
    let mut schema = json!({"type": "integer", "minimum": min, "maximum": max, "description": description});
    if let Some(default) = default {
        schema["default"] = json!(default);
    }
    schema
}

fn one_of(values: &[&str], default: &str, description: &str) -> Value {
    json!({"type": "string", "enum": values, "default": default, "description": description})
}

/// No control characters (what `char::is_control` refuses).
const NO_CONTROL: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$";

/// `fashion-mnist`, `synthetic[:N]`, `idx:PATH`, or an uploaded dataset's id (any form a UUID is read in).
const DATASET: &str = "^(fashion-mnist|synthetic(:[0-9]+)?|idx:.+|shards:.+|(urn:uuid:)?\\{?[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\\}?)$";

const U32: i128 = u32::MAX as i128;
const U64: i128 = u64::MAX as i128;

/// `placement` of a job spec: what `ringtrain_core::spec::Placement` parses.
fn placement() -> Value {
    json!({"anyOf": [
        {"type": "object", "additionalProperties": false, "properties": {
            "cuts": {"type": "array", "maxItems": MAX_DEVICES_PER_WORKER - 1,
                     "items": {"type": "string", "maxLength": 64},
                     "description": "A built-in ResNet: the layers each worker's model is cut after, in the network's order: layerL (a whole layer) or layerL.B (a block); one fewer than devices_per_worker."},
            "stages": {"type": "array", "maxItems": MAX_DEVICES_PER_WORKER,
                       "items": {"type": "array", "maxItems": ringtrain_core::composite::MAX_MODULES,
                                 "items": {"type": "string", "maxLength": 64}},
                       "description": "A composite uploaded model: the modules each stage (device) of a worker runs, one list per device; each module in one stage, none before a module whose output it takes."}}},
        {"type": "null"}],
      "description": "Where each worker's model is split into its devices_per_worker pipeline stages."})
}

fn job_spec() -> Value {
    let lr_value = json!({"type": "number", "exclusiveMinimum": 0, "maximum": MAX_LR});
    let mut spec = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["model", "dataset"],
        "description": "A training job: what to train, on what, with which recipe (Goyal et al. 2017 defaults).",
        "properties": {
            "name": {"type": ["string", "null"], "maxLength": MAX_NAME_CHARS, "pattern": NO_CONTROL,
                     "description": "Free-form label shown in the run history (not blank)."},
            "model": {
                "type": "object", "additionalProperties": false,
                "description": "A built-in model by name, or an uploaded TorchScript model of the team by id: exactly one.",
                "oneOf": [{"required": ["name"]}, {"required": ["uploaded"]}],
                "properties": {
                    "name": {"type": "string", "enum": ["mlp", "lenet5", "resnet8", "resnet20", "resnet56", "resnet50"]},
                    "hidden": {"type": ["array", "null"], "maxItems": MAX_MLP_LAYERS,
                               "items": {"type": "integer", "minimum": 1, "maximum": MAX_MLP_WIDTH},
                               "description": "mlp only: the hidden layer widths (default [256, 128])."},
                    "init": {"type": ["string", "null"], "enum": ["goyal", "pytorch", "tch", null],
                             "description": "mlp and lenet5 only: how the weights start. goyal (default): He-normal, the last layer N(0, 0.01), biases 0; pytorch: PyTorch's layer defaults; tch: ringtrain's before 2026-12-06."},
                    "uploaded": {"type": "string", "format": "uuid",
                                 "description": "An uploaded model's id (POST /v1/models); it trains on an uploaded dataset holding its inputs, or a sharded data set of named tensors (shards:...)."}
                }
            },
            "loss": {"type": ["string", "null"], "enum": ["cross_entropy", "mse", "huber", null],
                     "description": "Default: cross_entropy for class labels, mse for value labels (reported as RMSE); the built-in models classify."},
            "dataset": {"type": "string", "pattern": DATASET,
                        "description": "fashion-mnist, synthetic[:N] (N from 1 to 10,000,000), idx:PATH, shards:PATH or shards:s3://BUCKET/PREFIX (a packed data set's folder or bucket prefix, streamed), or the id of an uploaded dataset."},
            "image_size": {"type": ["integer", "null"], "minimum": 8, "maximum": 1024,
                           "description": "shards: data sets only: the side images are cropped and resized to (default 224)."},
            "augment": {"type": ["string", "null"], "enum": ["goyal", "none", null],
                        "description": "shards: data sets only: training images get Goyal's random-resized crop and flip (goyal, the default) or kept whole for training and test alike (none)."},
            "train_samples": {"type": ["integer", "null"], "minimum": 1, "maximum": U64,
                              "description": "Use only the first N training samples."},
            "test_samples": {"type": ["integer", "null"], "minimum": 1, "maximum": U64,
                             "description": "Evaluate on only the first N test samples."},
            "workers": integer(1, i128::from(MAX_WORKERS), Some(1), "k: ranks trained in data parallel (the run's math: global batch k·n, lr, BatchNorm over n)."),
            "devices": {"anyOf": [
                            {"type": "integer", "minimum": 1, "maximum": MAX_WORKERS},
                            {"type": "object", "additionalProperties": false, "properties": {
                                "min": {"type": "integer", "minimum": 1, "maximum": MAX_WORKERS, "default": 1},
                                "max": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_WORKERS}}},
                            {"type": "null"}],
                        "description": "Devices the job holds (default: workers); must divide workers, each device's process playing workers/devices virtual ranks. A range {min, max} (max: workers by default) makes the job elastic: it runs on any divisor of workers within it, shrinking, growing and surviving a lost node at the same k, batch and schedule."},
            "per_worker_batch": integer(1, i128::from(MAX_PER_WORKER_BATCH), Some(32),
                "n: samples per rank per iteration; k·n must not exceed the training samples."),
            "epochs": integer(1, i128::from(MAX_EPOCHS), Some(90),
                "At most 10^9 iterations in all (iterations per epoch × epochs)."),
            "lr": {
                "type": "object", "additionalProperties": false,
                "properties": {
                    "base": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_LR, "default": 0.1,
                             "description": "The lr at reference_batch."},
                    "reference_batch": integer(1, U32, Some(256), "The batch `base` is for."),
                    "scaling": one_of(&["linear", "sqrt", "none"], "linear", "How the lr grows with k·n."),
                    "multiplier": {"anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": MAX_LR_MULTIPLIER},
                                             {"type": "null"}],
                                   "description": "In place of the scaling rule: lr = base × multiplier (a scaling search's answer)."},
                    "max": {"anyOf": [lr_value, {"type": "null"}], "description": "A cap on the scaled lr."},
                    "warmup": {
                        "type": "object", "additionalProperties": false,
                        "properties": {
                            "kind": one_of(&["none", "constant", "gradual"], "gradual", "Goyal's gradual warmup by default."),
                            "epochs": {"type": ["number", "null"], "minimum": 0,
                                       "description": "Fewer than `epochs` (default 5; 0 or absent with kind none)."}
                        }
                    },
                    "decay": {
                        "type": "object", "additionalProperties": false,
                        "properties": {
                            "kind": one_of(&["step", "cosine", "none"], "step", "Step decay at the milestones by default."),
                            "milestones": {"type": ["array", "null"], "items": {"type": "integer", "minimum": 0, "maximum": U32},
                                           "description": "step only: strictly increasing epochs, after the warmup, before `epochs`."},
                            "factor": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 0.1}
                        }
                    }
                }
            },
            "optimizer": {
                "type": "object", "additionalProperties": false,
                "properties": {
                    "momentum": {"type": "number", "minimum": 0, "exclusiveMaximum": 1, "default": 0.9},
                    "nesterov": {"type": "boolean", "default": true, "description": "Needs momentum > 0."},
                    "momentum_form": one_of(&["pytorch", "goyal"], "goyal", "Goyal's form applies momentum correction."),
                    "weight_decay": {"type": "number", "minimum": 0, "exclusiveMaximum": 1, "default": 0.0001},
                    "bn_weight_decay": {"type": "boolean", "default": false},
                    "bias_weight_decay": {"type": "boolean", "default": true}
                }
            },
            "bn_zero_init_last": {"type": "boolean", "default": true},
            "seed": integer(0, U64, Some(0), "Seeds weights and the per-epoch shuffle."),
            "checkpoint_every_epochs": integer(0, i128::from(MAX_EPOCHS), Some(1),
                "Every this many epochs, at most `epochs` (0: only the final one)."),
            "log_every_iterations": integer(1, 1_000_000, Some(20), "A metrics line every this many iterations."),
            "max_restarts": integer(0, i128::from(MAX_RESTARTS), Some(3), "Retries of a failed attempt."),
            "priority": integer(-i128::from(MAX_PRIORITY), i128::from(MAX_PRIORITY), Some(0), "Higher first, within a team's queue."),
            "device": one_of(&["cpu", "gpu"], "cpu", "The kind of device every rank gets."),
            "precision": one_of(&["fp32", "bf16"], "fp32", "bf16: autocast with float32 master weights."),
            "init_from": {
                "type": ["object", "null"], "additionalProperties": false, "required": ["checkpoint"],
                "description": "A fork: start from the weights (and BatchNorm statistics) of a checkpoint of a job of the team that trains the same model, at iteration 0 of this spec's schedule, with fresh momentum.",
                "properties": {
                    "checkpoint": {"type": "string", "format": "uuid", "description": "The checkpoint's id (GET /v1/jobs/{id}/checkpoints)."}
                }
            },
            "guard": {
                "type": "object", "additionalProperties": false,
                "properties": {
                    "collapse": {"type": "boolean", "default": true,
                        "description": "Stop (failed) when an epoch of at least 50 iterations, wholly after the warmup, ends with the training error at chance level."},
                    "reference_job": {"type": ["string", "null"], "format": "uuid",
                        "description": "A job of the same team whose training error per epoch this run must stay within `tolerance` of."},
                    "tolerance": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.02,
                        "description": "How much worse (absolute) than the reference's training error an epoch may end."},
                    "after_warmup": {"type": "boolean", "default": true,
                        "description": "Compare only epochs that end after the warmup."}
                }
            }
        }
    });
    // beside the rest: one json! of them all passes the macro's recursion limit
    spec["properties"]["devices_per_worker"] = integer(1, i128::from(MAX_DEVICES_PER_WORKER), Some(1),
        "Devices each worker's process spans: more than 1 splits the model into that many pipeline stages where placement says (cuts for a built-in ResNet, stages for a composite uploaded model); the job holds devices × devices_per_worker devices.");
    spec["properties"]["placement"] = placement();
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_an_openapi_schema_and_names_every_field_of_the_spec() {
        let schema: RefOr<Schema> = serde_json::from_value(job_spec()).expect("an OpenAPI schema");
        let text = serde_json::to_string(&schema).unwrap();
        // every field the parser knows, so the document cannot fall behind a new one
        let full = ringtrain_core::JobSpec::parse(r#"{"model": {"name": "mlp"}, "dataset": "synthetic"}"#).unwrap();
        let fields = serde_json::to_value(&full).unwrap();
        for field in fields.as_object().unwrap().keys() {
            assert!(text.contains(&format!("\"{field}\"")), "{field} is not in the schema");
        }
    }
}
