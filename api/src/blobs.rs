//! Where the server keeps the bytes teams store (uploaded datasets and models, jobs' checkpoints, forks'
//! pinned starting points): its data folder, the default, or an S3-compatible bucket (`serve --store
//! s3://BUCKET/PREFIX`), so that server replicas on one database share no disk and a checkpoint is as safe
//! as the bucket.
//!
//! Bytes always arrive in a local partial file first (streamed under a limit, hashed, their contents
//! checked); once accepted they are *kept*: renamed into place in the folder, or uploaded to the bucket (in
//! parts past 10 MiB) and the local file removed. A row records where its bytes lie: an absolute path under
//! the data folder, or `s3://BUCKET/KEY`. A location is served only from inside its *area*
//! (`checkpoints/JOB`, `datasets`, `models`) of this server's own folder or bucket, whatever a row says, so
//! a tampered or foreign row is never followed. Rows written before a server moved to a bucket keep being
//! read from its folder.
//!
//! The server's store credentials come from its environment (`AWS_ACCESS_KEY_ID`, ...; see
//! `ringtrain_data::bucket::client`); they never pass through the API, and agents and ranks never see them:
//! agents download through the server as before.
//!
//! Over 450 lines only with its tests (386 of code).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, ObjectStore};
use ringtrain_core::dataset::{parse_bucket_url, S3_SCHEME};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::error::{ApiError, ApiResult};
use crate::files;

/// The bucket a server keeps its bytes in (`s3://BUCKET/PREFIX`), with its client.
#[derive(Debug, Clone)]
pub struct ServerBucket {
    client: Arc<dyn ObjectStore>,
    bucket: String,
    prefix: String,
}

impl ServerBucket {
    /// The bucket at `url` through `endpoint` (None: AWS's), credentials from this process's environment.
    pub fn new(url: &str, endpoint: Option<&str>) -> Result<ServerBucket, String> {
        let (bucket, prefix) = parse_bucket_url(url)?;
        let client = ringtrain_data::bucket::client(bucket, endpoint).map_err(|e| format!("{url}: {e}"))?;
        Ok(ServerBucket { client: Arc::new(client), bucket: bucket.to_string(), prefix: prefix.to_string() })
    }

    /// `s3://BUCKET/PREFIX`, for logs and messages.
    pub fn url(&self) -> String {
        format!("{S3_SCHEME}{}/{}", self.bucket, self.prefix).trim_end_matches('/').to_string()
    }

    /// Writes, reads and removes a probe object: a server that cannot use its bucket says so as it starts,
    /// not at the first checkpoint.
    pub async fn check(&self) -> Result<(), String> {
        let key = self.key(&format!("tmp/probe-{}", uuid::Uuid::new_v4()));
        let fail = |e: object_store::Error| format!("cannot use the bucket {}: {e}", self.url());
        self.client.put(&key, Bytes::from_static(b"ringtrain").into()).await.map_err(fail)?;
        self.client.get(&key).await.map_err(fail)?.bytes().await.map_err(fail)?;
        self.client.delete(&key).await.map_err(fail)
    }

    fn key(&self, name: &str) -> Key {
        ringtrain_data::bucket::object_key(&self.prefix, name)
    }

    /// The key a stored `s3://` location names, if it lies inside `area` of this bucket (`..` and empty
    /// parts refused by the key's parser).
    fn key_inside(&self, area: &str, stored: &str) -> Option<Key> {
        let rest = stored.strip_prefix(S3_SCHEME)?.strip_prefix(&self.bucket)?.strip_prefix('/')?;
        let key = Key::parse(rest).ok()?;
        let area = self.key(area);
        (key.prefix_matches(&area) && key.as_ref().len() > area.as_ref().len()).then_some(key)
    }

    fn location(&self, key: &Key) -> String {
        format!("{S3_SCHEME}{}/{key}", self.bucket)
    }
}

/// Where one stored location's bytes are.
#[derive(Debug)]
enum Place {
    File(PathBuf),
    Object(Key),
}

/// The server's store of bytes: its data folder and, when configured, its bucket.
#[derive(Debug, Clone, Copy)]
pub struct Blobs<'a> {
    data_dir: &'a Path,
    bucket: Option<&'a ServerBucket>,
}

fn gone() -> ApiError {
    ApiError::not_found("its file is gone from the server")
}

fn store_error(err: object_store::Error) -> ApiError {
    match err {
        object_store::Error::NotFound { .. } => gone(),
        other => ApiError::internal(other),
    }
}

impl<'a> Blobs<'a> {
    pub fn new(data_dir: &'a Path, bucket: Option<&'a ServerBucket>) -> Blobs<'a> {
        Blobs { data_dir, bucket }
    }

    /// Where a partial upload of `name` for `area` is written: beside its final place in the folder (so
    /// that keeping it is a rename), or in the scratch folder when bytes are kept in a bucket.
    pub async fn partial(&self, area: &str, name: &str) -> ApiResult<PathBuf> {
        let dir = match self.bucket {
            None => self.data_dir.join(area),
            Some(_) => self.data_dir.join("tmp"),
        };
        tokio::fs::create_dir_all(&dir).await.map_err(ApiError::internal)?;
        Ok(dir.join(format!("{name}.{}.part", uuid::Uuid::new_v4())))
    }

    /// Keeps the accepted `partial` file as `name` in `area`: its stored location. The partial file is gone
    /// afterwards either way (renamed, or uploaded and removed); the caller's `PartialFile` guard removes it
    /// when keeping fails.
    pub async fn keep(&self, partial: &Path, area: &str, name: &str) -> ApiResult<String> {
        match self.bucket {
            None => {
                let path = self.data_dir.join(area).join(name);
                tokio::fs::rename(partial, &path).await.map_err(ApiError::internal)?;
                Ok(path.to_string_lossy().into_owned())
            }
            Some(bucket) => {
                let key = bucket.key(&format!("{area}/{name}"));
                let mut file = tokio::fs::File::open(partial).await.map_err(ApiError::internal)?;
                // 10 MiB parts: a checkpoint of gigabytes is never held in memory whole
                let mut writer = object_store::buffered::BufWriter::new(bucket.client.clone(), key.clone());
                if let Err(err) = tokio::io::copy(&mut file, &mut writer).await {
                    let _ = writer.abort().await;
                    return Err(ApiError::internal(err));
                }
                writer.shutdown().await.map_err(ApiError::internal)?;
                let _ = tokio::fs::remove_file(partial).await;
                Ok(bucket.location(&key))
            }
        }
    }

    /// Where `stored` lies, if inside `area` of this server's folder or bucket; else 404.
    async fn resolve(&self, area: &str, stored: &str) -> ApiResult<Place> {
        if stored.starts_with(S3_SCHEME) {
            let key = self.bucket.and_then(|bucket| bucket.key_inside(area, stored));
            if key.is_none() {
                tracing::warn!(stored, area, "refused a stored location outside this server's bucket");
            }
            return key.map(Place::Object).ok_or_else(gone);
        }
        Ok(Place::File(files::under(&self.data_dir.join(area), Path::new(stored)).await?))
    }

    fn client(&self) -> ApiResult<&'a ServerBucket> {
        self.bucket.ok_or_else(gone)
    }

    /// `length` bytes of `stored` from `offset` on (to its end when `None`), streamed as the client takes
    /// them.
    pub async fn response(&self, area: &str, stored: &str, offset: u64, length: Option<u64>) -> ApiResult<Response> {
        let key = match self.resolve(area, stored).await? {
            Place::File(path) => return files::file_range_response(&path, offset, length).await,
            Place::Object(key) => key,
        };
        let bucket = self.client()?;
        let range = match (offset, length) {
            (_, Some(0)) => return Ok(octet_stream(0, Body::empty())),
            // the whole object: no range (an empty object has none to give)
            (0, None) => None,
            (offset, None) => Some(GetRange::Offset(offset)),
            (offset, Some(length)) => Some(GetRange::Bounded(offset..offset + length)),
        };
        let found = bucket.client.get_opts(&key, GetOptions { range, ..GetOptions::default() }).await;
        let found = found.map_err(store_error)?;
        let size = found.range.end - found.range.start;
        Ok(octet_stream(size, Body::from_stream(found.into_stream().fuse())))
    }

    /// `range` of `stored`, read whole (for a few headers at a time).
    pub async fn read(&self, area: &str, stored: &str, range: Range<u64>) -> ApiResult<Bytes> {
        match self.resolve(area, stored).await? {
            Place::File(path) => {
                let mut file = tokio::fs::File::open(&path).await.map_err(|_| gone())?;
                file.seek(std::io::SeekFrom::Start(range.start)).await.map_err(ApiError::internal)?;
                let mut buffer = Vec::with_capacity((range.end - range.start) as usize);
                file.take(range.end - range.start).read_to_end(&mut buffer).await.map_err(ApiError::internal)?;
                Ok(Bytes::from(buffer))
            }
            Place::Object(key) => self.client()?.client.get_range(&key, range).await.map_err(store_error),
        }
    }

    /// The size of `stored`.
    pub async fn size(&self, area: &str, stored: &str) -> ApiResult<u64> {
        match self.resolve(area, stored).await? {
            Place::File(path) => Ok(tokio::fs::metadata(&path).await.map_err(|_| gone())?.len()),
            Place::Object(key) => Ok(self.client()?.client.head(&key).await.map_err(store_error)?.size),
        }
    }

    /// Copies `stored` (inside `from`) to `name` in `to`: its new location. In the folder a hard link where
    /// the file system allows one; in the bucket the store's own copy (no bytes through the server).
    pub async fn copy(&self, from: &str, stored: &str, to: &str, name: &str) -> ApiResult<String> {
        match (self.resolve(from, stored).await?, self.bucket) {
            (Place::Object(source), Some(bucket)) => {
                let target = bucket.key(&format!("{to}/{name}"));
                bucket.client.copy(&source, &target).await.map_err(store_error)?;
                Ok(bucket.location(&target))
            }
            (Place::File(source), _) => {
                let partial = self.partial(to, name).await?;
                let guard = files::PartialFile::new(partial.clone());
                if tokio::fs::hard_link(&source, &partial).await.is_err() {
                    tokio::fs::copy(&source, &partial).await.map_err(ApiError::internal)?;
                }
                let kept = self.keep(&partial, to, name).await?;
                guard.keep();
                Ok(kept)
            }
            (Place::Object(_), None) => Err(gone()),
        }
    }

    /// `stored` as a local file for as long as the answer lives: the file itself in the folder, a copy in
    /// the scratch folder (removed when dropped) for an object.
    pub async fn local(&self, area: &str, stored: &str) -> ApiResult<LocalFile> {
        if let Place::File(path) = self.resolve(area, stored).await? {
            return Ok(LocalFile { path, _temporary: None });
        }
        let partial = self.partial("tmp", "copy").await?;
        let guard = files::PartialFile::new(partial.clone());
        let mut file = tokio::fs::File::create(&partial).await.map_err(ApiError::internal)?;
        self.append_to(area, stored, &mut file, &mut |_| ()).await?;
        file.flush().await.map_err(ApiError::internal)?;
        Ok(LocalFile { path: partial, _temporary: Some(guard) })
    }

    /// Writes the bytes of `stored` to the end of `file`, chunk by chunk, showing each chunk to `seen`
    /// (a checksum over several parts).
    pub async fn append_to(
        &self,
        area: &str,
        stored: &str,
        file: &mut tokio::fs::File,
        seen: &mut (dyn FnMut(&[u8]) + Send),
    ) -> ApiResult<()> {
        match self.resolve(area, stored).await? {
            Place::File(path) => {
                let mut source = tokio::fs::File::open(&path).await.map_err(|_| gone())?;
                let mut buffer = vec![0u8; 1 << 20];
                loop {
                    let n = source.read(&mut buffer).await.map_err(ApiError::internal)?;
                    if n == 0 {
                        return Ok(());
                    }
                    seen(&buffer[..n]);
                    file.write_all(&buffer[..n]).await.map_err(ApiError::internal)?;
                }
            }
            Place::Object(key) => {
                let found = self.client()?.client.get(&key).await.map_err(store_error)?;
                let mut stream = found.into_stream();
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk.map_err(store_error)?;
                    seen(&chunk);
                    file.write_all(&chunk).await.map_err(ApiError::internal)?;
                }
                Ok(())
            }
        }
    }

    /// The stored location `name` in `area` has (or would have once kept).
    pub fn location(&self, area: &str, name: &str) -> String {
        match self.bucket {
            None => self.data_dir.join(area).join(name).to_string_lossy().into_owned(),
            Some(bucket) => bucket.location(&bucket.key(&format!("{area}/{name}"))),
        }
    }

    /// The names kept in `area` (partial files aside), in no particular order; none when it was never
    /// written to.
    pub async fn list(&self, area: &str) -> ApiResult<Vec<String>> {
        let Some(bucket) = self.bucket else {
            let mut names = Vec::new();
            let mut entries = match tokio::fs::read_dir(self.data_dir.join(area)).await {
                Ok(entries) => entries,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(names),
                Err(err) => return Err(ApiError::internal(err)),
            };
            while let Some(entry) = entries.next_entry().await.map_err(ApiError::internal)? {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !name.ends_with(".part") {
                    names.push(name);
                }
            }
            return Ok(names);
        };
        let prefix = bucket.key(area);
        let listed: Vec<_> = bucket.client.list(Some(&prefix)).collect().await;
        let mut names = Vec::new();
        for meta in listed {
            let meta = meta.map_err(store_error)?;
            if let Some(name) = meta.location.filename() {
                names.push(name.to_string());
            }
        }
        Ok(names)
    }

    /// Removes the bytes of locations the store has forgotten, only from inside `area` (one that leads
    /// elsewhere is left alone, like one already gone). Best effort: a failure is logged, the row is gone.
    pub async fn remove<'s>(&self, area: &str, stored: impl Iterator<Item = &'s str>) {
        for location in stored {
            let removed = match self.resolve(area, location).await {
                Ok(Place::File(path)) => tokio::fs::remove_file(&path).await.map_err(|e| e.to_string()),
                Ok(Place::Object(key)) => match self.bucket {
                    Some(bucket) => bucket.client.delete(&key).await.map_err(|e| e.to_string()),
                    None => Ok(()),
                },
                Err(_) => Ok(()),
            };
            if let Err(error) = removed {
                tracing::warn!(location, %error, "cannot remove a forgotten file");
            }
        }
    }
}

/// The folders of the data folder the server writes uploads to: its scratch space and the store's areas.
const AREAS: [&str; 5] = ["tmp", "datasets", "models", "checkpoints", "uploads"];

/// Removes the partial files (`*.part`) under `data_dir`'s areas last written more than `older_than` ago: what an
/// upload left when its server was killed mid-way (a handler's guard removes them otherwise). Partial
/// files lie in the scratch folder and, with the folder as the store, beside their final places; the age
/// spares a partial file another replica sharing the folder is still writing. Returns how many went.
pub async fn sweep_partials(data_dir: &Path, older_than: std::time::Duration) -> usize {
    let Some(cutoff) = std::time::SystemTime::now().checked_sub(older_than) else { return 0 };
    let mut removed = 0;
    // the server's own areas only: `ringtrain up` keeps its agent's work folder in the same data folder
    let mut folders: Vec<PathBuf> = AREAS.iter().map(|area| data_dir.join(area)).collect();
    while let Some(folder) = folders.pop() {
        let Ok(mut entries) = tokio::fs::read_dir(&folder).await else { continue };
        while let Ok(Some(entry)) = entries.next_entry().await {
            let Ok(kind) = entry.file_type().await else { continue };
            let path = entry.path();
            if kind.is_dir() {
                folders.push(path);
                continue;
            }
            let stale = entry.metadata().await.and_then(|m| m.modified()).is_ok_and(|at| at < cutoff);
            if kind.is_file() && path.extension().is_some_and(|e| e == "part") && stale {
                match tokio::fs::remove_file(&path).await {
                    Ok(()) => removed += 1,
                    Err(error) => tracing::warn!(path = %path.display(), %error, "cannot remove a stale partial file"),
                }
            }
        }
    }
    removed
}

/// A stored file readable on this machine (see [`Blobs::local`]).
#[derive(Debug)]
pub struct LocalFile {
    pub path: PathBuf,
    /// Removes a temporary copy when dropped; the folder's own file has none and stays.
    _temporary: Option<files::PartialFile>,
}

fn octet_stream(length: u64, body: Body) -> Response {
    (
        [(header::CONTENT_TYPE, "application/octet-stream".to_string()), (header::CONTENT_LENGTH, length.to_string())],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket() -> ServerBucket {
        ServerBucket::new("s3://store/ringtrain", Some("http://127.0.0.1:1")).unwrap()
    }

    #[test]
    fn a_stored_object_is_read_only_from_inside_its_area_of_this_bucket() {
        let bucket = bucket();
        let inside = "s3://store/ringtrain/checkpoints/j1/epoch-0001-attempt-1.tar";
        assert_eq!(bucket.key_inside("checkpoints/j1", inside).unwrap().as_ref(), &inside["s3://store/".len()..]);
        for outside in [
            "s3://store/ringtrain/checkpoints/j2/epoch-0001-attempt-1.tar",
            "s3://store/ringtrain/checkpoints/j1",
            "s3://store/ringtrain/checkpoints/j1/../j2/x.tar",
            "s3://store/other/checkpoints/j1/x.tar",
            "s3://elsewhere/ringtrain/checkpoints/j1/x.tar",
            "s3://storeX/ringtrain/checkpoints/j1/x.tar",
            "/srv/ringtrain/checkpoints/j1/x.tar",
        ] {
            assert!(bucket.key_inside("checkpoints/j1", outside).is_none(), "{outside}");
        }
        assert_eq!(bucket.url(), "s3://store/ringtrain");
    }

    #[tokio::test]
    async fn an_object_location_without_a_bucket_is_gone_and_a_file_outside_its_area_too() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::new(dir.path(), None);
        let object = blobs.size("datasets", "s3://store/ringtrain/datasets/x.safetensors").await;
        assert_eq!(object.unwrap_err().status().as_u16(), 404);
        std::fs::create_dir_all(dir.path().join("models")).unwrap();
        std::fs::write(dir.path().join("models/m.pt"), b"weights").unwrap();
        let outside = dir.path().join("models/m.pt").to_string_lossy().into_owned();
        assert_eq!(blobs.size("datasets", &outside).await.unwrap_err().status().as_u16(), 404);
        assert_eq!(blobs.size("models", &outside).await.unwrap(), 7);
        assert_eq!(&blobs.read("models", &outside, 2..5).await.unwrap()[..], b"igh");
    }

    #[tokio::test]
    async fn stale_partial_files_are_swept_and_fresh_ones_and_kept_files_stay() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::new(dir.path(), None);
        let stale = blobs.partial("checkpoints/j1", "a.tar").await.unwrap();
        let fresh = blobs.partial("tmp", "b").await.unwrap();
        let kept = dir.path().join("checkpoints/j1/old.tar");
        let agents = dir.path().join("agent/x.part");
        std::fs::create_dir_all(dir.path().join("agent")).unwrap();
        for path in [&stale, &fresh, &kept, &agents] {
            std::fs::write(path, b"bytes").unwrap();
        }
        let long_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 86_400);
        for path in [&stale, &kept, &agents] {
            std::fs::File::options().write(true).open(path).unwrap().set_modified(long_ago).unwrap();
        }
        assert_eq!(sweep_partials(dir.path(), std::time::Duration::from_secs(86_400)).await, 1);
        assert!(!stale.exists() && fresh.exists() && kept.exists() && agents.exists());
    }

    #[tokio::test]
    async fn kept_files_are_renamed_into_their_area_and_copies_are_kept_beside() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::new(dir.path(), None);
        let partial = blobs.partial("checkpoints/j1", "a.tar").await.unwrap();
        assert!(partial.starts_with(dir.path().join("checkpoints/j1")));
        std::fs::write(&partial, b"archive").unwrap();
        let kept = blobs.keep(&partial, "checkpoints/j1", "a.tar").await.unwrap();
        assert_eq!(Path::new(&kept), dir.path().join("checkpoints/j1/a.tar"));
        assert!(!partial.exists());
        let copy = blobs.copy("checkpoints/j1", &kept, "checkpoints/j2", "init.tar").await.unwrap();
        assert_eq!(std::fs::read(&copy).unwrap(), b"archive");
        let local = blobs.local("checkpoints/j2", &copy).await.unwrap();
        assert_eq!(local.path, Path::new(&copy));
        drop(local);
        assert!(Path::new(&copy).exists(), "the folder's own file stays");
        blobs.remove("checkpoints/j1", [kept.as_str(), copy.as_str()].into_iter()).await;
        assert!(!Path::new(&kept).exists());
        assert!(Path::new(&copy).exists(), "only from inside the area");
    }
}
