//! Reading a sharded data set's index from an S3-compatible bucket (`s3://BUCKET/PREFIX`), for the server
//! (a submission's data set checked and counted) and the agents (the copy into their caches). The client is
//! `object_store`'s (Apache Arrow's: S3's signing and retries); its credentials come from the reading
//! process's environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`).

use bytes::Bytes;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::ObjectStore;

use crate::index::DatasetIndex;

/// A client of `bucket` through `endpoint` (an S3-compatible store's URL; None: AWS's, by the region).
pub fn client(bucket: &str, endpoint: Option<&str>) -> Result<AmazonS3, object_store::Error> {
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none() {
        builder = builder.with_region("us-east-1");
    }
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint).with_allow_http(endpoint.starts_with("http://"));
    }
    builder.build()
}

/// The key of `name` under `prefix` (empty: the bucket's top).
pub fn object_key(prefix: &str, name: &str) -> Key {
    Key::from(if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") })
}

/// Why an index could not be read.
#[derive(Debug, thiserror::Error)]
pub enum IndexReadError {
    /// The data set's own fault (no index, or one that does not check): the same everywhere.
    #[error("{0}")]
    Invalid(String),
    /// The store's (unreachable, credentials refused): another reader may do better.
    #[error("cannot read {url}/index.json: {source}")]
    Store { url: String, source: object_store::Error },
}

/// The checked index of the data set at `url` (its parts `bucket`/`prefix`), and its bytes as stored.
pub async fn read_index(store: &AmazonS3, url: &str, prefix: &str) -> Result<(DatasetIndex, Bytes), IndexReadError> {
    let store_error = |source| IndexReadError::Store { url: url.to_string(), source };
    let bytes = match store.get(&object_key(prefix, "index.json")).await {
        Ok(found) => found.bytes().await.map_err(store_error)?,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(IndexReadError::Invalid(format!(
                "{url} holds no index.json (upload the folder ringtrain datasets pack wrote)"
            )))
        }
        Err(err) => return Err(store_error(err)),
    };
    let index = std::str::from_utf8(&bytes)
        .map_err(|_| "not UTF-8".to_string())
        .and_then(|text| DatasetIndex::from_json(text).map_err(|errors| join(&errors)))
        .map_err(|why| IndexReadError::Invalid(format!("{url}/index.json: {why}")))?;
    Ok((index, bytes))
}

fn join(errors: &[crate::index::IndexError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}
