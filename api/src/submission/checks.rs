//! Turning a submitted spec into a validated [`JobSpec`], its effective hyperparameters and the job to store,
//! shared by job submission, studies and the schedule preview.

use ringtrain_core::composite::{Manifest, ModuleEntry};
use ringtrain_core::memory::{self, human_bytes, SampleShape};
use ringtrain_core::{read_spec, DatasetRef, Effective, FieldError, JobId, JobSpec, ModelId, SpecReading};
use ringtrain_protocol::model::{ModelMemory, ModelReport, ModuleReport};
use ringtrain_store::{NewJob, StudyPoint};
use serde_json::Value;

use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Reads a JSON body as a spec: malformed JSON is 400, and a field without a default in error is 422 at
/// once; otherwise the reading, whose structural problems (wrong types, unknown fields) its caller reports
/// with every other problem it finds ([`checked_job`]).
pub fn parse_spec(bytes: &[u8]) -> ApiResult<(SpecReading, Value)> {
    let value = crate::extract::parse_value(bytes)?;
    crate::extract::require_object(&value)?;
    let first = read_spec(&value);
    if first.as_ref().is_ok_and(SpecReading::is_clean) {
        return Ok((first.map_err(ApiError::validation)?, value));
    }
    // `"workers": 2.0` is an integer to JSON Schema: read the spec again with whole numbers as such (and
    // store it so, for the worker that parses it again)
    let mut whole = value.clone();
    if crate::extract::whole_numbers_as_integers(&mut whole) {
        return Ok((read_spec(&whole).map_err(ApiError::validation)?, whole));
    }
    Ok((first.map_err(ApiError::validation)?, value))
}

/// Problems found by several checks, reported together (422); any other failure (the store) ends the checks.
#[derive(Debug, Default)]
pub struct Problems(pub Vec<FieldError>);

impl Problems {
    /// The check's value, or None with its field problems kept.
    pub fn take<T>(&mut self, result: ApiResult<T>) -> ApiResult<Option<T>> {
        match result {
            Ok(value) => Ok(Some(value)),
            Err(err) => {
                self.0.extend(err.into_field_errors()?);
                Ok(None)
            }
        }
    }
}

/// The number of training samples of the spec's dataset: built in, or an uploaded dataset of the caller's
/// team (another team's is "no such dataset"), or None for `idx:` and `shards:` paths that only the
/// workers can read (which must lie inside the server's `idx_roots`).
pub async fn dataset_size(state: &AppState, user: &User, spec: &JobSpec) -> ApiResult<Option<u64>> {
    match &spec.dataset {
        DatasetRef::Uploaded(id) => match state.store.get_dataset(*id).await? {
            Some(dataset) if user.owns(dataset.team_id) => Ok(Some(dataset.train_samples.max(0) as u64)),
            _ => Err(ApiError::validation(vec![FieldError::new("dataset", format!("no uploaded dataset {id}"))])),
        },
        DatasetRef::Idx { path } | DatasetRef::Shards { path } => {
            let roots = data_roots(state, user.team_id).await?;
            if let Err(reason) = ringtrain_core::dataset::check_idx_path(path, &roots) {
                return Err(ApiError::validation(vec![FieldError::new("dataset", reason)]));
            }
            match spec.dataset.bucket_url() {
                Some(url) => bucket_train_samples(state, url).await,
                None => Ok(None),
            }
        }
        other => Ok(other.known_train_size()),
    }
}

/// The training samples of a bucket's data set, read from its index when the server reads buckets
/// ([`crate::state::BucketReads`]): an index missing or wrong is the submission's fault (422 at `dataset`);
/// a store that cannot be reached from here is not (the agents read it again), so the size stays unknown.
async fn bucket_train_samples(state: &AppState, url: &str) -> ApiResult<Option<u64>> {
    use ringtrain_data::bucket::{self, IndexReadError};
    let reads = &state.config.buckets;
    if !reads.read {
        return Ok(None);
    }
    let (bucket_name, prefix) = ringtrain_core::dataset::parse_bucket_url(url)
        .map_err(|why| ApiError::validation(vec![FieldError::new("dataset", why)]))?;
    let store = match bucket::client(bucket_name, reads.endpoint.as_deref()) {
        Ok(store) => store,
        Err(err) => {
            tracing::warn!(%url, error = %err, "cannot make a bucket client: the data set is checked by the agents");
            return Ok(None);
        }
    };
    match bucket::read_index(&store, url, prefix).await {
        Ok((index, _)) => Ok(Some(index.train.samples)),
        Err(IndexReadError::Invalid(why)) => Err(ApiError::validation(vec![FieldError::new("dataset", why)])),
        Err(err) => {
            tracing::warn!(%url, error = %err, "cannot read the data set's index: the agents will");
            Ok(None)
        }
    }
}

/// The folders a team's `idx:` and `shards:` data sets may lie under: its own grants and the server's
/// `--idx-root` folders, which every team may use.
pub async fn data_roots(state: &AppState, team: ringtrain_core::TeamId) -> ApiResult<Vec<std::path::PathBuf>> {
    let granted = state.store.get_team(team).await?.map(|t| t.data_roots).unwrap_or_default();
    Ok(state.config.idx_roots.iter().cloned().chain(granted.into_iter().map(std::path::PathBuf::from)).collect())
}

/// The job a submission stores for the spec read (as `spec_json`, its text as given), once checked against
/// the team's datasets and jobs and the pool's memory: every check a single job and a study's point share.
/// Every problem is reported at once (422): the reading's structural ones, the ranges, and the team's
/// datasets, models and reference job.
pub async fn checked_job(
    state: &AppState,
    user: &User,
    reading: SpecReading,
    spec_json: Value,
    study: Option<StudyPoint>,
) -> ApiResult<NewJob> {
    let (mut reading, mut spec_json) = (reading, spec_json);
    crate::routes::registered_datasets::resolve_registered(state, user, &mut reading.spec, &mut spec_json).await?;
    let spec = &reading.spec;
    let mut problems = Problems::default();
    let dataset_size = problems.take(dataset_size(state, user, spec).await)?.flatten();
    let effective = problems.take(effective(spec, dataset_size))?.flatten();
    problems.take(check_model_and_data(state, user, spec).await)?;
    // A study's points name their own reference point, stored with them: there is no job to look up yet.
    if study.is_none() {
        problems.take(check_reference(state, user, spec).await)?;
    }
    problems.take(super::fork::check_init(state, user, spec).await)?;
    // What a job needs of a device means something only for a spec without problems (and a zero
    // batch or worker count would divide by zero).
    if problems.0.is_empty() && reading.is_clean() {
        check_memory(state, user, spec).await?;
    }
    let spec = reading.finish(problems.0).map_err(ApiError::validation)?;
    let spec = &spec;
    Ok(NewJob {
        id: JobId::new(),
        team_id: user.team_id,
        created_by: Some(user.token.id),
        name: spec.name.clone(),
        spec_json,
        effective,
        dataset_size: dataset_size.map(|n| n as i64),
        priority: spec.priority,
        device: spec.device,
        devices: spec.total_devices() as i32,
        max_restarts: spec.max_restarts.min(i32::MAX as u32) as i32,
        study,
    })
}

/// An uploaded model must be the team's, and its data set must hold the inputs it takes and labels its loss
/// fits; a data set of named inputs is for uploaded models only. (422 at `model.uploaded`, `dataset` or
/// `loss`.)
pub async fn check_model_and_data(state: &AppState, user: &User, spec: &JobSpec) -> ApiResult<()> {
    let fail = |field: &str, reason: String| ApiError::validation(vec![FieldError::new(field, reason)]);
    let dataset = match &spec.dataset {
        DatasetRef::Uploaded(id) => state.store.get_dataset(*id).await?.filter(|d| user.owns(d.team_id)),
        _ => None,
    };
    let Some(id) = spec.model.uploaded else {
        return match dataset {
            Some(d) if !d.inputs.is_empty() => Err(fail(
                "dataset",
                format!("dataset {} holds named inputs (x.NAME): train an uploaded model on it", d.id),
            )),
            _ => Ok(()),
        };
    };
    let model = state.store.get_model(id).await?.filter(|m| user.owns(m.team_id));
    let Some(model) = model else { return Err(fail("model.uploaded", format!("no uploaded model {id}"))) };
    if let Some(stages) = spec.pipeline_modules() {
        check_module_placement(&model, stages)?;
    }
    let Some(dataset) = dataset else { return Ok(()) }; // the dataset's own check has answered
    let held: Vec<&str> = dataset.inputs.iter().map(|i| i.name.as_str()).collect();
    let plain = model.inputs == [crate::routes::models::PLAIN_INPUT];
    let missing: Vec<&String> = if plain {
        if held.is_empty() {
            Vec::new()
        } else {
            model.inputs.iter().collect()
        }
    } else {
        model.inputs.iter().filter(|name| !held.contains(&name.as_str())).collect()
    };
    if !missing.is_empty() {
        let names: Vec<String> = missing.iter().map(|n| if plain { n.to_string() } else { format!("x.{n}") }).collect();
        return Err(fail(
            "dataset",
            format!("dataset {} lacks {} that model {id} takes", dataset.id, names.join(", ")),
        ));
    }
    let values = dataset.labels == "values";
    match spec.loss {
        Some(loss) if loss.regresses() && !values => {
            Err(fail("loss", format!("dataset {}'s labels are classes: use cross_entropy", dataset.id)))
        }
        Some(ringtrain_core::spec::Loss::CrossEntropy) if values => {
            Err(fail("loss", format!("dataset {}'s labels are values: use mse or huber", dataset.id)))
        }
        _ => Ok(()),
    }
}

/// A composite model's modules, as its check listed them (empty for a model of one file).
fn modules_of(report: &Value) -> Vec<ModuleReport> {
    serde_json::from_value::<ModelReport>(report.clone()).map(|r| r.modules).unwrap_or_default()
}

/// `placement.stages` must place the uploaded model's modules so that they can run: every module once,
/// none before a module whose output it takes, the output in the last stage (422 at the stage at fault).
fn check_module_placement(model: &ringtrain_store::Model, stages: &[Vec<String>]) -> ApiResult<()> {
    let fail = |field: String, reason: String| ApiError::validation(vec![FieldError::new(field, reason)]);
    let modules = modules_of(&model.report);
    if modules.is_empty() {
        return Err(fail(
            "placement.stages".into(),
            format!(
                "model {} is one TorchScript file: only a composite model (an archive of modules) is split into stages",
                model.id
            ),
        ));
    }
    manifest_of(&modules).plan(stages).map(|_| ()).map_err(|(at, why)| match at {
        Some(s) => fail(format!("placement.stages[{s}]"), why),
        None => fail("placement.stages".into(), why),
    })
}

fn manifest_of(modules: &[ModuleReport]) -> Manifest {
    let entries = modules.iter().map(|m| ModuleEntry { name: m.name.clone(), inputs: m.inputs.clone() });
    Manifest { modules: entries.collect() }
}

/// A `guard.reference_job` must be a job of the caller's team (422 otherwise: the guard could never run).
pub async fn check_reference(state: &AppState, user: &User, spec: &JobSpec) -> ApiResult<()> {
    let Some(id) = spec.guard.reference_job else { return Ok(()) };
    match state.store.get_job(id).await? {
        Some(job) if user.owns(job.team_id) => Ok(()),
        _ => Err(ApiError::validation(vec![FieldError::new("guard.reference_job", format!("no job {id}"))])),
    }
}

pub fn effective(spec: &JobSpec, dataset_size: Option<u64>) -> ApiResult<Option<Effective>> {
    spec.validate_for_dataset(dataset_size).map_err(ApiError::validation)?;
    match dataset_size {
        Some(size) => Effective::new(spec, size).map(Some).map_err(ApiError::validation),
        None => Ok(None),
    }
}

/// Refuses (422) a job whose estimated memory per rank (`ringtrain_core::memory`) exceeds every device of
/// its kind that reports its memory, naming the field most to blame and every part of the estimate. Passes
/// when it cannot tell: no device of the kind says how much memory it has, the data's shape is known
/// only to the worker (`idx:`), or an uploaded model's check did not measure its steps. An uploaded
/// model's need is extrapolated from the two steps its check measured (`ModelMemory`).
pub async fn check_memory(state: &AppState, user: &User, spec: &JobSpec) -> ApiResult<()> {
    let Some((shape, data_bytes)) = sample_data(state, user, spec).await? else { return Ok(()) };
    let batch = u64::from(spec.per_worker_batch);
    // where the model is not cut yet but could be: the spec field that would split it
    let mut split_by = None;
    let (need, source) = match spec.model.uploaded {
        Some(model) => {
            let Some(report) = model_report(state, user, model).await? else { return Ok(()) };
            if !report.modules.is_empty() && spec.pipeline_modules().is_none() {
                split_by = Some("placement.stages");
            }
            match (largest_module_stage(spec, &report, data_bytes), &report.memory) {
                (Some(stage), _) => stage,
                (None, Some(memory)) if spec.pipeline_modules().is_none() => (
                    memory::measured(
                        memory.weights_bytes,
                        memory.trainable_bytes,
                        memory.step_bytes(batch),
                        data_bytes,
                    ),
                    ", from its steps the model's check measured".to_string(),
                ),
                (None, _) => return Ok(()),
            }
        }
        None => {
            if spec.pipeline_cuts().is_none() && spec.model.name.and_then(ringtrain_core::pipeline::blocks).is_some() {
                split_by = Some("placement.cuts");
            }
            match (largest_stage(spec, &shape, data_bytes), memory::estimate(&spec.model, &shape, batch, data_bytes)) {
                (Some(stage), _) => stage,
                (None, Some(need)) => (need, String::new()),
                (None, None) => return Ok(()),
            }
        }
    };
    let Some(largest) = state.largest_memory.of(state.store.as_ref(), spec.device).await? else { return Ok(()) };
    let largest = largest.max(0) as u64;
    if need.total <= largest {
        return Ok(());
    }
    let split = split_by.map_or(String::new(), |field| {
        format!(
            "; a worker may span several devices, each holding a part of the model and its activations \
             (devices_per_worker with {field})"
        )
    });
    let reason = format!(
        "one rank needs about {} (parameters {}, gradients {}, momentum {}, activations {} at a batch of {batch}{source}, \
         data {}); the largest {} device offers {}{split}",
        human_bytes(need.total),
        human_bytes(need.parameters),
        human_bytes(need.gradients),
        human_bytes(need.momentum),
        human_bytes(need.activations),
        human_bytes(need.data),
        spec.device.as_str(),
        human_bytes(largest),
    );
    Err(ApiError::validation(vec![FieldError::new(need.largest_part(), reason)]))
}

/// The shape of one sample and the bytes each rank holds of the spec's data set, where the server knows
/// them (a built-in data set, or the team's upload); None otherwise.
async fn sample_data(state: &AppState, user: &User, spec: &JobSpec) -> ApiResult<Option<(SampleShape, u64)>> {
    Ok(match &spec.dataset {
        DatasetRef::Uploaded(id) => match state.store.get_dataset(*id).await? {
            Some(dataset) if user.owns(dataset.team_id) => Some((
                SampleShape {
                    dims: dataset.sample_shape.iter().map(|&d| d.max(0) as u64).collect(),
                    classes: dataset.num_classes.max(1) as u64,
                },
                dataset.size_bytes.max(0) as u64,
            )),
            _ => None,
        },
        other => memory::builtin_data(other),
    })
}

/// Each pipeline stage's memory for a job split into stages (the dry run shows it); empty for one that is
/// not, or whose data's shape (or uploaded model's measured steps) the server does not know.
pub async fn stage_memory(state: &AppState, user: &User, spec: &JobSpec) -> ApiResult<Vec<memory::StageEstimate>> {
    let Some((shape, data_bytes)) = sample_data(state, user, spec).await? else { return Ok(Vec::new()) };
    if let Some(model) = spec.model.uploaded {
        let Some(report) = model_report(state, user, model).await? else { return Ok(Vec::new()) };
        return Ok(module_stage_estimates(spec, &report, data_bytes).unwrap_or_default());
    }
    let Some(cuts) = spec.pipeline_cuts() else { return Ok(Vec::new()) };
    let (batch, micro_batches) = (u64::from(spec.per_worker_batch), u64::from(spec.virtual_ranks()));
    Ok(memory::stage_estimates(&spec.model, &shape, batch, micro_batches, data_bytes, cuts).unwrap_or_default())
}

/// A pipelined job's stage that needs the most memory (each stage is a device of its own), and where it is
/// in the pipeline; None for a job that is not cut into stages.
fn largest_stage(spec: &JobSpec, shape: &SampleShape, data_bytes: u64) -> Option<(memory::MemoryEstimate, String)> {
    let cuts = spec.pipeline_cuts()?;
    let (batch, micro_batches) = (u64::from(spec.per_worker_batch), u64::from(spec.virtual_ranks()));
    let stages = memory::stage_estimates(&spec.model, shape, batch, micro_batches, data_bytes, cuts).ok()?;
    let (index, stage) = stages.into_iter().enumerate().max_by_key(|(_, stage)| stage.memory.total)?;
    let (first, last) = &stage.blocks;
    let micro = if stage.in_flight == 1 { "" } else { "es" };
    let at = format!(" in pipeline stage {index} ({first} to {last}, {} micro-batch{micro} at once)", stage.in_flight);
    Some((stage.memory, at))
}

/// Each stage's memory for a composite model placed by `placement.stages`, from what its check measured of
/// each module alone: a stage holds its modules' weights, their gradients and momentum, and (under 1F1B,
/// stage s of S) the steps of min(S − s, v) micro-batches at once. None for a job that does not place
/// modules, or a placement or model the check did not measure (refused, or not measured, elsewhere).
fn module_stage_estimates(spec: &JobSpec, report: &ModelReport, data_bytes: u64) -> Option<Vec<memory::StageEstimate>> {
    let stages = spec.pipeline_modules()?;
    let plans = manifest_of(&report.modules).plan(stages).ok()?;
    let (batch, micro_batches) = (u64::from(spec.per_worker_batch), u64::from(spec.virtual_ranks()));
    let count = plans.len() as u64;
    let mut estimates = Vec::with_capacity(plans.len());
    for (s, plan) in plans.iter().enumerate() {
        let in_flight = (count - s as u64).min(micro_batches).max(1);
        let (mut weights, mut trainable, mut steps) = (0u64, 0u64, 0u64);
        for &i in &plan.modules {
            let measured: &ModelMemory = report.modules[i].memory.as_ref()?;
            weights = weights.saturating_add(measured.weights_bytes);
            trainable = trainable.saturating_add(measured.trainable_bytes);
            steps = steps.saturating_add(measured.step_bytes(batch));
        }
        estimates.push(memory::StageEstimate {
            blocks: module_span(report, &plan.modules),
            in_flight,
            memory: memory::measured(weights, trainable, steps.saturating_mul(in_flight), data_bytes),
        });
    }
    Some(estimates)
}

/// A stage's modules as its first and last (manifest indices `modules`, in order), or, when they are not
/// next to each other in the manifest, every name (the same list twice): "a to c" would claim b too.
fn module_span(report: &ModelReport, modules: &[usize]) -> (String, String) {
    let name = |i: usize| report.modules[i].name.clone();
    let (first, last) = (modules[0], modules[modules.len() - 1]);
    if last - first + 1 == modules.len() {
        return (name(first), name(last));
    }
    let all = modules.iter().map(|&i| name(i)).collect::<Vec<_>>().join(", ");
    (all.clone(), all)
}

/// The composite model's stage that needs the most memory, and where it is (see [`largest_stage`]).
fn largest_module_stage(
    spec: &JobSpec,
    report: &ModelReport,
    data_bytes: u64,
) -> Option<(memory::MemoryEstimate, String)> {
    let stages = module_stage_estimates(spec, report, data_bytes)?;
    let (index, stage) = stages.into_iter().enumerate().max_by_key(|(_, stage)| stage.memory.total)?;
    let (first, last) = &stage.blocks;
    let modules = match (first == last, first.contains(", ")) {
        (true, false) => format!("module {first}"),
        (true, true) => format!("modules {first}"),
        (false, _) => format!("modules {first} to {last}"),
    };
    let micro = if stage.in_flight == 1 { "" } else { "es" };
    let at = format!(
        ", from the steps the model's check measured, in pipeline stage {index} ({modules}, {} micro-batch{micro} at once)",
        stage.in_flight
    );
    Some((stage.memory, at))
}

/// What the check of the team's uploaded model `id` found; None when it is not the team's (refused
/// elsewhere) or its report cannot be read.
async fn model_report(state: &AppState, user: &User, id: ModelId) -> ApiResult<Option<ModelReport>> {
    let Some(model) = state.store.get_model(id).await?.filter(|m| user.owns(m.team_id)) else { return Ok(None) };
    Ok(serde_json::from_value::<ModelReport>(model.report).ok())
}
