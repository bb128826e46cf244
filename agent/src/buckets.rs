//! Sharded data sets in an S3-compatible bucket (`shards:s3://BUCKET/PREFIX`): the agent streams one into
//! its node's cache (`work_dir/shards/KEY/`, [`crate::cache`]) while the ranks train, shards fetched in the
//! order the ranks will open them ([`crate::streaming`]), and passes the rank the folder open. The store's
//! credentials are the agent's (its environment: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, `AWS_REGION`): a rank never sees them, nor the store (its sandbox allows TCP only
//! to its ring's ports); it reads files the agent checked.
//!
//! The folder's key is a digest of the URL and of the index's bytes, so a data set packed again under the
//! same prefix is a new entry, and the old one leaves the cache as it ages. The ranks of a node that read
//! one data set share its folder and its stream.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use anyhow::{Context, Result};
use futures_util::StreamExt;
use object_store::aws::AmazonS3;
use object_store::ObjectStore;
use ringtrain_data::bucket::{self, object_key, IndexReadError};
use ringtrain_data::index::DatasetIndex;
use ringtrain_data::ShardInfo;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::cache::{FileCache, SHARDS};
use crate::rank::NotRunnable;
use crate::streaming::{RankStream, Share, Stream};

/// How this node reaches buckets: the endpoint of an S3-compatible store (None: AWS's, from the region).
#[derive(Debug, Default)]
pub struct Buckets {
    endpoint: Option<String>,
    /// The data sets streaming into this node's cache, by folder: ranks of one data set share its stream.
    streams: std::sync::Mutex<HashMap<PathBuf, Weak<Stream>>>,
    /// One stream started at a time: two ranks of a placement starting together share the first's.
    starting: tokio::sync::Mutex<()>,
    /// What each stream holds in the cache now: streams share the cache's bound ([`crate::streaming::Share`]).
    streamed: Arc<std::sync::Mutex<HashMap<PathBuf, u64>>>,
}

impl Buckets {
    pub fn new(endpoint: Option<String>) -> Buckets {
        Buckets { endpoint: endpoint.filter(|e| !e.is_empty()), ..Default::default() }
    }

    /// The data set at `url` (`s3://BUCKET/PREFIX`) as one rank reads it: its folder in this node's cache
    /// (the index in it; the shards arrive as the rank says it will open them), held until the rank ends.
    /// What it starts with is said to `say` (the job's logs).
    pub(crate) async fn stream(
        &self,
        cache: &FileCache,
        url: &str,
        say: &mut (dyn FnMut(String) + Send),
    ) -> Result<RankStream> {
        let (bucket, prefix) = ringtrain_core::dataset::parse_bucket_url(url).map_err(NotRunnable)?;
        let store = bucket::client(bucket, self.endpoint.as_deref())
            .with_context(|| format!("cannot make a client of bucket {bucket}"))?;
        let (index, index_bytes) = match bucket::read_index(&store, url, prefix).await {
            Ok(read) => read,
            Err(IndexReadError::Invalid(why)) => return Err(NotRunnable(why).into()),
            Err(err) => return Err(err.into()),
        };
        let name = ringtrain_core::hex(
            &Sha256::new().chain_update(url).chain_update(b"\n").chain_update(&index_bytes).finalize(),
        );
        let folder = cache.dir(SHARDS).join(&name[..32]);
        let held = cache.pin(folder.clone());
        let starting = self.starting.lock().await;
        let running = self.lock().get(&folder).and_then(Weak::upgrade);
        let stream = match running {
            Some(stream) => stream,
            None => {
                let streamed = self.streamed.clone();
                let started =
                    start_stream(cache, url, prefix, store, &folder, &index, &index_bytes, streamed, say).await?;
                self.lock().insert(folder.clone(), Arc::downgrade(&started));
                started
            }
        };
        drop(starting);
        FileCache::touch(&held).with_context(|| format!("cannot mark {} used", folder.display()))?;
        let (here, shards) = stream.held();
        say(format!(
            "agent: {url} streams into this node's cache as the ranks read it: {here} of its {shards} shards are here"
        ));
        Ok(stream.reader(held))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Weak<Stream>>> {
        crate::cache::lock(&self.streams)
    }
}

/// Opens the data set's folder in the cache (its index written, what an earlier agent left half done or
/// failed removed, the shards already there counted) and starts its stream, with the share of the cache
/// the other entries leave it.
#[allow(clippy::too_many_arguments)]
async fn start_stream(
    cache: &FileCache,
    url: &str,
    prefix: &str,
    store: AmazonS3,
    folder: &Path,
    index: &DatasetIndex,
    index_bytes: &[u8],
    streamed: Arc<std::sync::Mutex<HashMap<PathBuf, u64>>>,
    say: &mut (dyn FnMut(String) + Send),
) -> Result<Arc<Stream>> {
    use std::os::unix::fs::PermissionsExt;
    tokio::fs::create_dir_all(folder).await?;
    tokio::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o755)).await?;
    let (mut present, mut here) = (Vec::new(), 0);
    let mut entries = tokio::fs::read_dir(folder).await?;
    let shards: HashMap<&str, (&str, u32, u64)> = index
        .splits()
        .flat_map(|(split, s)| {
            s.shards.iter().enumerate().map(move |(i, info)| (info.name.as_str(), (split, i as u32, info.bytes)))
        })
        .collect();
    while let Some(entry) = entries.next_entry().await? {
        let file = entry.file_name().to_string_lossy().into_owned();
        match shards.get(file.as_str()) {
            // written whole and checked by an agent of this node (renamed into place only then)
            Some(&(split, shard, bytes)) if entry.metadata().await?.len() == bytes => {
                present.push((split.to_string(), shard));
                here += bytes;
            }
            _ if file == "index.json" => {}
            _ => tokio::fs::remove_file(entry.path()).await?,
        }
    }
    write_readable(&folder.join("index.json"), index_bytes).await?;
    let total: u64 = index.splits().flat_map(|(_, split)| split.shards.iter()).map(|s| s.bytes).sum();
    // room for the whole data set where the limit allows, from entries no rank uses (least recent first)
    let evicting = cache.clone();
    let _ = tokio::task::spawn_blocking(move || evicting.evict_for(total - here)).await;
    let others: u64 =
        crate::cache::lock(&streamed).iter().filter(|(f, _)| f.as_path() != folder).map(|(_, b)| *b).sum();
    let fixed = cache.bytes_outside(folder)?.saturating_sub(others);
    let share = Share::new(cache.max_bytes(), fixed, streamed, folder.to_path_buf());
    let budget = cache.max_bytes().map(|max| max.saturating_sub(fixed + others));
    let largest = index.splits().flat_map(|(_, split)| split.shards.iter()).map(|s| s.bytes).max().unwrap_or(0);
    // what it will still write here: what is missing, at most its share of the cache
    let to_write = budget.unwrap_or(u64::MAX).saturating_sub(here).min(total - here).max(largest);
    check_free_space(folder, url, to_write).await?;
    if let Some(budget) = budget.filter(|b| *b < total) {
        say(format!(
            "agent: {url} is {:.2} GiB; this node's cache keeps {:.2} GiB of it at most (--cache-max-gib), so shards \
             are fetched again each epoch",
            gib(total),
            gib(budget)
        ));
    }
    Ok(Stream::start(url, prefix, store, cache.pin(folder.to_path_buf()), index, present, share))
}

/// Why a shard did not arrive.
#[derive(Debug)]
pub(crate) enum FetchError {
    /// The store did not give it (worth trying again).
    Unreadable(String),
    /// It is missing, or its bytes are not what the index says (the same for every node, every try).
    NotTheIndexs(String),
}

/// Room left on the disk beside a streamed data set: the ranks' folders and checkpoints share it.
const DISK_RESERVE: u64 = 2 << 30;

/// Refuses a data set the disk under `folder` has no room for (`bytes`: the most it will hold there, with
/// [`DISK_RESERVE`] left), before it starts rather than when the disk is full: another node may have the
/// room, so the job is tried elsewhere.
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

/// One shard into `folder`, checked against its index's size and sha256 as it is written (into
/// `NAME.part-UUID`, renamed into place once whole and right).
pub(crate) async fn fetch_shard(
    store: &AmazonS3,
    url: &str,
    prefix: &str,
    shard: &ShardInfo,
    folder: &Path,
) -> Result<(), FetchError> {
    let name = &shard.name;
    let path = folder.join(name);
    let partial = folder.join(format!("{name}.part-{}", uuid::Uuid::new_v4().simple()));
    let fetched = write_checked(store, url, prefix, shard, &partial).await;
    let renamed = match fetched {
        Ok(()) => tokio::fs::rename(&partial, &path)
            .await
            .map_err(|e| FetchError::Unreadable(format!("cannot keep {}: {e}", path.display()))),
        Err(err) => Err(err),
    };
    if renamed.is_err() {
        let _ = tokio::fs::remove_file(&partial).await;
    }
    renamed
}

async fn write_checked(
    store: &AmazonS3,
    url: &str,
    prefix: &str,
    shard: &ShardInfo,
    path: &Path,
) -> Result<(), FetchError> {
    let (name, bytes) = (&shard.name, shard.bytes);
    // the shard's place in the bucket: what a rank's failure names after the shard
    let object = format!("{}/{name}", url.trim_end_matches('/'));
    let unreadable = |what: String| FetchError::Unreadable(what);
    let found = match store.get(&object_key(prefix, name)).await {
        Ok(found) => found,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(FetchError::NotTheIndexs(format!("{object} is missing from the bucket")))
        }
        Err(err) => return Err(unreadable(format!("cannot read {object}: {err}"))),
    };
    let local = |e: std::io::Error| unreadable(format!("cannot write {}: {e}", path.display()));
    let mut file = tokio::fs::File::create(path).await.map_err(local)?;
    let mut hasher = Sha256::new();
    let mut written: u64 = 0;
    let mut stream = found.into_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| unreadable(format!("reading {object} broke off: {e}")))?;
        written += chunk.len() as u64;
        if written > bytes {
            break;
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(local)?;
    }
    file.flush().await.map_err(local)?;
    if written != bytes {
        return Err(FetchError::NotTheIndexs(format!(
            "{object} is {written}{} bytes, its index says {bytes}",
            if written > bytes { "+" } else { "" }
        )));
    }
    let digest = ringtrain_core::hex(&hasher.finalize());
    if !digest.eq_ignore_ascii_case(&shard.sha256) {
        return Err(FetchError::NotTheIndexs(format!("{object} has sha256 {digest}, its index says {}", shard.sha256)));
    }
    readable(path).await.map_err(|e| unreadable(format!("{e:#}")))
}

async fn write_readable(path: &Path, bytes: &[u8]) -> Result<()> {
    tokio::fs::write(path, bytes).await?;
    readable(path).await
}

/// `bytes` into `path`, readable by the ranks (a shard's failure, which they read).
pub(crate) fn write_readable_sync(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, bytes)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
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
