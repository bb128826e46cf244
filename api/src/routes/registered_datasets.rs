//! /v1/datasets/sharded: a sharded data set registered by reference, where it already lies: a prefix of an
//! S3-compatible bucket or a folder every node mounts, inside the data roots the team was granted. The
//! server reads its `index.json` (so the samples, classes and size are known, and an index that does not
//! check is refused now rather than when a job starts) and reads a sample of its shards whole, comparing
//! their sizes and sha256 with the index's. Jobs then name it by id; it is resolved to its source when a
//! job is stored (`resolve_registered`), so agents and ranks read it exactly as a `shards:` data set. Its
//! bytes are not the server's: they count against no quota and deleting the registration leaves them.

use std::path::PathBuf;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use futures_util::StreamExt;
use ringtrain_core::dataset::{check_idx_path, parse_bucket_url};
use ringtrain_core::{DatasetId, DatasetRef, FieldError, JobSpec};
use ringtrain_data::index::{DatasetIndex, ShardInfo};
use ringtrain_store::{Dataset, DatasetInput, NewDataset};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use utoipa::ToSchema;

use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::extract::JsonBody;
use crate::state::AppState;
use crate::submission::checks::data_roots;

/// A data set to register.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewRegistration {
    /// The data set's name: 1 to 200 characters, not only spaces, no control characters.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\s\\u0000-\\u001f\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    pub name: String,
    /// Where `ringtrain datasets pack`'s output lies: `s3://BUCKET/PREFIX`, or an absolute folder every node
    /// mounts; inside one of the team's data roots.
    pub source: String,
}

/// Shards of the index read whole at registration: the first and the last of the training split.
const SAMPLED_SHARDS: usize = 2;

fn refuse(field: &str, reason: impl Into<String>) -> ApiError {
    ApiError::validation(vec![FieldError::new(field, reason)])
}

/// Register a sharded data set by reference (see the module's doc): its index read and checked, a sample of
/// its shards read whole and compared with the index.
#[utoipa::path(post, path = "/v1/datasets/sharded", tag = "datasets", request_body = NewRegistration,
    responses((status = 201, body = Dataset), (status = 403),
        (status = 422, description = "A source outside the team's data roots, one the server cannot read, an index that does not check, or a shard that is not its index's")),
    security(("bearer" = [])))]
pub async fn register_dataset(
    State(state): State<AppState>,
    user: User,
    JsonBody(body): JsonBody<NewRegistration>,
) -> ApiResult<(StatusCode, Json<Dataset>)> {
    user.require_write()?;
    if let Some(reason) = ringtrain_core::validate::name_problems(&body.name).into_iter().next() {
        return Err(refuse("name", reason));
    }
    let source = body.source.trim_end_matches('/').to_string();
    let roots = data_roots(&state, user.team_id).await?;
    check_idx_path(&source, &roots).map_err(|reason| refuse("source", reason))?;
    let reader = Reader::new(&state, &source, &roots).await?;
    let (index, index_sha256) = reader.index().await?;
    let shards = &index.train.shards;
    let sampled: Vec<&ShardInfo> = match shards.as_slice() {
        [] => Vec::new(),
        [one] => vec![one],
        [first, .., last] => vec![first, last],
    };
    for shard in sampled.into_iter().take(SAMPLED_SHARDS) {
        reader.check_shard(shard).await?;
    }
    let all = index.train.shards.iter().chain(index.test.iter().flat_map(|t| t.shards.iter()));
    let size_bytes: u64 = all.map(|s| s.bytes).sum();
    let dataset = state
        .store
        .add_dataset(NewDataset {
            id: DatasetId::new(),
            team_id: user.team_id,
            name: body.name,
            path: format!("shards:{source}"),
            size_bytes: size_bytes.min(i64::MAX as u64) as i64,
            sha256: index_sha256,
            train_samples: index.train.samples.min(i64::MAX as u64) as i64,
            sample_shape: Vec::new(),
            num_classes: index.classes.len().min(i32::MAX as usize) as i32,
            // a data set of named tensors shows its inputs and labels as an upload of them does
            inputs: index
                .inputs
                .iter()
                .map(|input| DatasetInput {
                    name: input.name.clone(),
                    dtype: input.dtype.safetensors_name().into(),
                    shape: input.shape.iter().map(|&d| d.min(i64::MAX as u64) as i64).collect(),
                })
                .collect(),
            labels: if index.values.is_some() { "values" } else { "classes" }.into(),
            source: Some(source),
        })
        .await?;
    Ok((StatusCode::CREATED, Json(dataset)))
}

/// Reads a source's files: from the bucket with the server's credentials, or from the folder as the server
/// sees it (resolved, and still inside a data root once links are followed).
struct Reader {
    place: Place,
    source: String,
}

enum Place {
    Bucket { store: object_store::aws::AmazonS3, prefix: String },
    Folder(PathBuf),
}

impl Reader {
    async fn new(state: &AppState, source: &str, roots: &[PathBuf]) -> ApiResult<Reader> {
        let place = if source.starts_with(ringtrain_core::dataset::S3_SCHEME) {
            let reads = &state.config.buckets;
            if !reads.read {
                return Err(refuse(
                    "source",
                    "this server has no credentials to read buckets: name the data set in the job spec as \
                     shards:s3://... instead (the agents read it)",
                ));
            }
            let (bucket, prefix) = parse_bucket_url(source).map_err(|why| refuse("source", why))?;
            let store = ringtrain_data::bucket::client(bucket, reads.endpoint.as_deref())
                .map_err(|e| refuse("source", format!("cannot reach the bucket of {source}: {e}")))?;
            Place::Bucket { store, prefix: prefix.to_string() }
        } else {
            Place::Folder(resolved_inside(source, roots).await?)
        };
        Ok(Reader { place, source: source.to_string() })
    }

    /// The source's checked index, and the sha256 of its bytes.
    async fn index(&self) -> ApiResult<(DatasetIndex, String)> {
        let bytes = self.read_whole("index.json").await?;
        let sha256 = crate::hex(&Sha256::digest(&bytes));
        let text = String::from_utf8(bytes).map_err(|_| refuse("source", "index.json is not UTF-8"))?;
        let index = DatasetIndex::from_json(&text).map_err(|errors| {
            let why: Vec<String> = errors.iter().map(ToString::to_string).collect();
            refuse("source", format!("{}/index.json: {}", self.source, why.join("; ")))
        })?;
        Ok((index, sha256))
    }

    async fn read_whole(&self, name: &str) -> ApiResult<Vec<u8>> {
        let cannot = |e: &dyn std::fmt::Display| refuse("source", format!("cannot read {}/{name}: {e}", self.source));
        match &self.place {
            Place::Folder(folder) => tokio::fs::read(folder.join(name)).await.map_err(|e| cannot(&e)),
            Place::Bucket { store, prefix } => {
                use object_store::ObjectStore;
                let found =
                    store.get(&ringtrain_data::bucket::object_key(prefix, name)).await.map_err(|e| cannot(&e))?;
                Ok(found.bytes().await.map_err(|e| cannot(&e))?.to_vec())
            }
        }
    }

    /// Reads `shard` whole, hashing it as it comes: 422 when its size or sha256 is not its index's.
    async fn check_shard(&self, shard: &ShardInfo) -> ApiResult<()> {
        let cannot = |e: &dyn std::fmt::Display| {
            refuse("source", format!("cannot read shard {} of {}: {e}", shard.name, self.source))
        };
        let mut hasher = Sha256::new();
        let mut bytes = 0u64;
        match &self.place {
            Place::Folder(folder) => {
                let mut file = tokio::fs::File::open(folder.join(&shard.name)).await.map_err(|e| cannot(&e))?;
                let mut buffer = vec![0u8; 1 << 20];
                loop {
                    let n = file.read(&mut buffer).await.map_err(|e| cannot(&e))?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buffer[..n]);
                    bytes += n as u64;
                }
            }
            Place::Bucket { store, prefix } => {
                use object_store::ObjectStore;
                let key = ringtrain_data::bucket::object_key(prefix, &shard.name);
                let mut stream = store.get(&key).await.map_err(|e| cannot(&e))?.into_stream();
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk.map_err(|e| cannot(&e))?;
                    hasher.update(&chunk);
                    bytes += chunk.len() as u64;
                }
            }
        }
        let sha256 = crate::hex(&hasher.finalize());
        if bytes != shard.bytes || sha256 != shard.sha256 {
            return Err(refuse(
                "source",
                format!(
                    "shard {} of {} has {bytes} bytes and sha256 {sha256}; its index says {} bytes and {}",
                    shard.name, self.source, shard.bytes, shard.sha256
                ),
            ));
        }
        Ok(())
    }
}

/// The folder `source` once links are resolved, if that is still inside one of `roots` (resolved too).
async fn resolved_inside(source: &str, roots: &[PathBuf]) -> ApiResult<PathBuf> {
    let resolved = tokio::fs::canonicalize(source).await.map_err(|e| {
        refuse("source", format!("this server cannot read {source}: {e} (mount it here as on the nodes)"))
    })?;
    for root in roots {
        if let Ok(root) = tokio::fs::canonicalize(root).await {
            if resolved.starts_with(&root) {
                return Ok(resolved);
            }
        }
    }
    Err(refuse("source", format!("{source} leads outside the team's data roots once its links are followed")))
}

/// A spec naming a registered data set by id, with its source put in its place (the spec as stored, and
/// the JSON text of it): what the agents and ranks read is then a `shards:` data set as any other.
pub async fn resolve_registered(
    state: &AppState,
    user: &User,
    spec: &mut JobSpec,
    spec_json: &mut serde_json::Value,
) -> ApiResult<()> {
    let DatasetRef::Uploaded(id) = spec.dataset else { return Ok(()) };
    let Some(dataset) = state.store.get_dataset(id).await? else { return Ok(()) };
    let Some(source) = dataset.source.filter(|_| user.owns(dataset.team_id)) else { return Ok(()) };
    spec.dataset = DatasetRef::Shards { path: source.clone() };
    if let Some(object) = spec_json.as_object_mut() {
        object.insert("dataset".into(), serde_json::Value::String(format!("shards:{source}")));
    }
    Ok(())
}

/// Whether a spec trains on `dataset`: by its id, or (a registered one) by its source.
pub fn trains_on(spec: &JobSpec, dataset: &Dataset) -> bool {
    spec.dataset == DatasetRef::Uploaded(dataset.id)
        || dataset.source.as_ref().is_some_and(|source| spec.dataset == DatasetRef::Shards { path: source.clone() })
}
