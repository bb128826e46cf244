//! Sharded data sets in an S3-compatible bucket (`shards:s3://BUCKET/PREFIX`): the agent copies one whole
//! into its node's cache (`work_dir/shards/KEY/`, [`crate::cache`]) before the rank starts, and passes the
//! rank the folder open. The store's credentials are the agent's (its environment: `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`): a rank never sees them, nor the store
//! (its sandbox allows TCP only to its ring's ports); it reads files the agent checked.
//!
//! A copy is trusted only whole: every shard is checked against the size and sha256 its index gives while
//! it is written, into a folder named `KEY.part-UUID` that becomes `KEY` only once the last shard is in. The
//! key is a digest of the URL and of the index's bytes, so a data set packed again under the same prefix is
//! a new entry, and the old one leaves the cache as it ages. Ranks of one node wait for one copy.
//!
//! Copying whole before training is SageMaker's File mode: a data set larger than this node's cache limit
//! cannot run here (refused at once, saying so). Streaming shards into a bounded cache as the ranks need
//! them is not built yet.

use std::path::Path;

use anyhow::{Context, Result};
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use object_store::aws::AmazonS3;
use object_store::path::Path as Key;
use object_store::ObjectStore;
use ringtrain_data::bucket::{self, object_key, IndexReadError};
use ringtrain_data::index::DatasetIndex;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::cache::{CachedFile, FileCache, SHARDS};
use crate::rank::NotRunnable;

/// How this node reaches buckets: the endpoint of an S3-compatible store (None: AWS's, from the region).
#[derive(Debug, Default)]
pub struct Buckets {
    endpoint: Option<String>,
    /// One copy at a time on this node: two ranks of a placement wait for the first one's copy.
    copying: tokio::sync::Mutex<()>,
}

impl Buckets {
    pub fn new(endpoint: Option<String>) -> Buckets {
        Buckets { endpoint: endpoint.filter(|e| !e.is_empty()), copying: Default::default() }
    }

    /// The cached copy of the data set at `url` (`s3://BUCKET/PREFIX`), copied now unless the cache holds
    /// it; held for the rank until it ends. Its progress is said to `say` (the job's logs): a copy of
    /// ImageNet takes minutes, and a job that shows nothing meanwhile looks stuck.
    pub(crate) async fn cached_copy(
        &self,
        cache: &FileCache,
        url: &str,
        say: &mut (dyn FnMut(String) + Send),
    ) -> Result<CachedFile> {
        let (bucket, prefix) = ringtrain_core::dataset::parse_bucket_url(url).map_err(NotRunnable)?;
        let store = bucket::client(bucket, self.endpoint.as_deref())
            .with_context(|| format!("cannot make a client of bucket {bucket}"))?;
        let (index, index_bytes) = match bucket::read_index(&store, url, prefix).await {
            Ok(read) => read,
            Err(IndexReadError::Invalid(why)) => return Err(NotRunnable(why).into()),
            Err(err) => return Err(err.into()),
        };
        let total: u64 = index.splits().flat_map(|(_, split)| split.shards.iter()).map(|s| s.bytes).sum();
        if let Some(max) = cache.max_bytes().filter(|max| total > *max) {
            return Err(NotRunnable(format!(
                "{url} is {:.1} GiB, more than this node's cache may hold ({:.1} GiB, --cache-max-gib): a data set \
                 in a bucket is copied whole onto each node that trains on it",
                gib(total),
                gib(max)
            ))
            .into());
        }
        let name = ringtrain_core::hex(
            &Sha256::new().chain_update(url).chain_update(b"\n").chain_update(&index_bytes).finalize(),
        );
        let folder = cache.dir(SHARDS).join(&name[..32]);
        let held = cache.pin(folder.clone());
        let _one_at_a_time = match self.copying.try_lock() {
            Ok(guard) => guard,
            Err(_) => {
                say(format!("agent: waiting for this node's copy in progress before copying {url}"));
                self.copying.lock().await
            }
        };
        if folder.is_dir() {
            FileCache::touch(&held).with_context(|| format!("cannot mark {} used", folder.display()))?;
            say(format!("agent: {url} is in this node's cache"));
            return Ok(held);
        }
        check_free_space(&cache.dir(SHARDS), url, total).await?;
        let shards = index.splits().map(|(_, split)| split.shards.len()).sum::<usize>();
        say(format!("agent: copying {url} into this node's cache: {shards} shards, {:.2} GiB", gib(total)));
        let started = std::time::Instant::now();
        let partial = folder.with_extension(format!("part-{}", uuid::Uuid::new_v4().simple()));
        let mut progress = Progress { url, shards, total, done: 0, bytes: 0, started, said: started, say };
        let copied = copy(&store, url, prefix, &index, &index_bytes, &partial, &mut progress).await;
        match copied {
            Ok(()) => tokio::fs::rename(&partial, &folder).await?,
            Err(err) => {
                let _ = tokio::fs::remove_dir_all(&partial).await;
                return Err(err);
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        let rate = total as f64 / 1048576.0 / seconds.max(1e-3);
        say(format!("agent: copied {url}: {shards} shards, {:.2} GiB in {seconds:.1} s ({rate:.0} MiB/s)", gib(total)));
        tracing::info!(%url, bytes = total, seconds, mib_per_s = rate, "copied the data set into this node's cache");
        crate::files::make_room(cache.clone()).await;
        Ok(held)
    }
}

/// Copies the index and every shard of `index` into `folder`, [`COPY_STREAMS`] shards at a time, checking
/// each shard's size and sha256 as it is written (the first to fail ends the copy); readable by the rank's account (which reaches the folder only through the open handle it is
/// passed: the cache above it is the agent's alone).
async fn copy(
    store: &AmazonS3,
    url: &str,
    prefix: &str,
    index: &DatasetIndex,
    index_bytes: &[u8],
    folder: &Path,
    progress: &mut Progress<'_>,
) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    tokio::fs::create_dir_all(folder).await?;
    tokio::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o755)).await?;
    // boxed as `Send` futures: the agent's task must be `Send`, which rustc cannot prove through a stream
    // of unboxed borrowing futures
    let copies: Vec<BoxFuture<'_, Result<u64>>> = index
        .splits()
        .flat_map(|(_, split)| split.shards.iter())
        .map(|shard| -> BoxFuture<'_, Result<u64>> {
            Box::pin(async move {
                let (key, path) = (object_key(prefix, &shard.name), folder.join(&shard.name));
                copy_shard(store, url, &key, &path, shard.bytes, &shard.sha256).await.map(|()| shard.bytes)
            })
        })
        .collect();
    let mut copies = futures_util::stream::iter(copies).buffer_unordered(COPY_STREAMS);
    while let Some(copied) = copies.next().await {
        progress.shard_done(copied?);
    }
    write_readable(&folder.join("index.json"), index_bytes).await
}

/// Shards copied at once: one S3 stream gets tens of MB/s, a node's link wants several (what `aws s3 cp`
/// does by default: 10 requests at once).
const COPY_STREAMS: usize = 8;

/// Room left on the disk after a copy: the ranks' folders and checkpoints share it.
const DISK_RESERVE: u64 = 2 << 30;

/// Refuses a copy the disk under `folder` has no room for (with [`DISK_RESERVE`] left), before it starts
/// rather than when the disk is full: another node may have the room, so the job is tried elsewhere.
async fn check_free_space(folder: &Path, url: &str, bytes: u64) -> Result<()> {
    tokio::fs::create_dir_all(folder).await?;
    let Ok(stats) = rustix::fs::statvfs(folder) else { return Ok(()) };
    let free = stats.f_bavail.saturating_mul(stats.f_frsize);
    if free < bytes.saturating_add(DISK_RESERVE) {
        anyhow::bail!(
            "this node's disk has {:.1} GiB free under its work folder; {url} needs {:.1} GiB and {:.0} GiB are \
             kept free",
            gib(free),
            gib(bytes),
            gib(DISK_RESERVE)
        );
    }
    Ok(())
}

/// How far a copy has got, said every [`SAY_EVERY`].
struct Progress<'a> {
    url: &'a str,
    shards: usize,
    total: u64,
    done: usize,
    bytes: u64,
    started: std::time::Instant,
    said: std::time::Instant,
    say: &'a mut (dyn FnMut(String) + Send),
}

/// How often a copy in progress says how far it got.
const SAY_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl Progress<'_> {
    fn shard_done(&mut self, bytes: u64) {
        self.done += 1;
        self.bytes += bytes;
        if self.said.elapsed() >= SAY_EVERY && self.done < self.shards {
            self.said = std::time::Instant::now();
            let rate = self.bytes as f64 / 1048576.0 / self.started.elapsed().as_secs_f64().max(1e-3);
            (self.say)(format!(
                "agent: copying {}: {} of {} shards, {:.2} of {:.2} GiB ({rate:.0} MiB/s)",
                self.url,
                self.done,
                self.shards,
                gib(self.bytes),
                gib(self.total)
            ));
        }
    }
}

/// One shard, streamed to `path`: a shard missing from the bucket, or whose size or sha256 is not its
/// index's, fails the job naming it (another node would find the same).
async fn copy_shard(store: &AmazonS3, url: &str, key: &Key, path: &Path, bytes: u64, sha256: &str) -> Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let found = match store.get(key).await {
        Ok(found) => found,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(NotRunnable(format!("shard {name} of {url} is missing from the bucket")).into())
        }
        Err(err) => return Err(err).with_context(|| format!("cannot read shard {name} of {url}")),
    };
    let mut file = tokio::fs::File::create(path).await?;
    let mut hasher = Sha256::new();
    let mut written: u64 = 0;
    let mut stream = found.into_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.with_context(|| format!("reading shard {name} of {url} broke off"))?;
        written += chunk.len() as u64;
        if written > bytes {
            break;
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await?;
    }
    file.flush().await?;
    if written != bytes {
        return Err(NotRunnable(format!(
            "shard {name} of {url} is {written}{} bytes in the bucket, its index says {bytes}",
            if written > bytes { "+" } else { "" }
        ))
        .into());
    }
    let digest = ringtrain_core::hex(&hasher.finalize());
    if !digest.eq_ignore_ascii_case(sha256) {
        return Err(NotRunnable(format!("shard {name} of {url} has sha256 {digest}, its index says {sha256}")).into());
    }
    readable(path).await
}

async fn write_readable(path: &Path, bytes: &[u8]) -> Result<()> {
    tokio::fs::write(path, bytes).await?;
    readable(path).await
}

async fn readable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    Ok(tokio::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).await?)
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

#[cfg(test)]
mod tests {
    use super::check_free_space;

    #[tokio::test]
    async fn a_copy_the_disk_has_no_room_for_is_refused_before_it_starts() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("shards");
        check_free_space(&folder, "s3://datasets/small", 1 << 20).await.unwrap();
        let refused = check_free_space(&folder, "s3://datasets/huge", 1 << 60).await.unwrap_err().to_string();
        assert!(refused.contains("free under its work folder") && refused.contains("s3://datasets/huge"), "{refused}");
    }
}
