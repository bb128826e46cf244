//! The node's cache of downloaded datasets and models (`work_dir/datasets`, `work_dir/models`) and of
//! sharded data sets copied from buckets (`work_dir/shards`, one folder each), kept under
//! `--cache-max-gib`: after each download the least recently used entries are removed until the cache fits,
//! never one a rank of this agent uses (each rank holds a [`CachedFile`], which pins it until the rank has
//! ended). A file's modification time (a folder's: its `index.json`'s) is its last use: the agent sets it
//! whenever a rank takes the entry (access times are not kept on `noatime` mounts, and `relatime` updates
//! them once a day at most).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

/// The folders of the cache, under the agent's work folder.
pub(crate) const KINDS: [&str; 3] = ["datasets", "models", SHARDS];

/// The kind whose entries are folders: a bucket's sharded data set each, `index.json` beside its shards.
pub(crate) const SHARDS: &str = "shards";

/// The file of a cached folder whose modification time is the folder's last use.
const FOLDER_STAMP: &str = "index.json";

/// The agent's default `--cache-max-gib`.
pub const DEFAULT_MAX_GIB: f64 = 50.0;

#[derive(Debug, Clone)]
pub(crate) struct FileCache {
    root: PathBuf,
    max_bytes: Option<u64>,
    /// How many ranks hold each file.
    pins: Arc<Mutex<HashMap<PathBuf, usize>>>,
}

/// A cached file (or folder) a rank uses: never evicted while this lives.
#[derive(Debug)]
pub(crate) struct CachedFile {
    path: PathBuf,
    pins: Arc<Mutex<HashMap<PathBuf, usize>>>,
}

impl CachedFile {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for CachedFile {
    fn drop(&mut self) {
        let mut pins = lock(&self.pins);
        if let Some(count) = pins.get_mut(&self.path) {
            *count -= 1;
            if *count == 0 {
                pins.remove(&self.path);
            }
        }
    }
}

/// What one eviction did.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Evicted {
    /// The files removed, least recently used first, with their sizes.
    pub removed: Vec<(PathBuf, u64)>,
    /// The cache's size afterwards.
    pub bytes: u64,
    /// Still over the limit: what is left is all in use.
    pub over: bool,
}

impl FileCache {
    /// The cache under `work_dir`, bounded to `max_gib` (None or 0: unbounded).
    pub fn new(work_dir: &Path, max_gib: Option<f64>) -> FileCache {
        let max_bytes = max_gib.filter(|gib| *gib > 0.0).map(|gib| (gib * (1u64 << 30) as f64) as u64);
        FileCache { root: work_dir.to_path_buf(), max_bytes, pins: Arc::default() }
    }

    /// The folder of one kind of file ("datasets" or "models").
    pub fn dir(&self, kind: &str) -> PathBuf {
        self.root.join(kind)
    }

    /// Pins `path` (which may not exist yet: the download comes after) for a rank.
    pub fn pin(&self, path: PathBuf) -> CachedFile {
        *lock(&self.pins).entry(path.clone()).or_insert(0) += 1;
        CachedFile { path, pins: self.pins.clone() }
    }

    /// The size of the cache's entries now, finished ones only.
    #[cfg(test)]
    pub fn bytes(&self) -> std::io::Result<u64> {
        Ok(self.files()?.iter().map(|f| f.2).sum())
    }

    /// The size of the cache's finished entries other than `entry`.
    pub fn bytes_outside(&self, entry: &Path) -> std::io::Result<u64> {
        Ok(self.files()?.iter().filter(|f| f.0 != entry).map(|f| f.2).sum())
    }

    /// The cache's limit, if it has one.
    pub fn max_bytes(&self) -> Option<u64> {
        self.max_bytes
    }

    /// Marks `file` used now: the least recently used files go first.
    pub fn touch(file: &CachedFile) -> std::io::Result<()> {
        let path = file.path();
        let stamp = if path.is_dir() { path.join(FOLDER_STAMP) } else { path.to_path_buf() };
        std::fs::File::options().write(true).open(stamp)?.set_modified(SystemTime::now())
    }

    /// Removes the least recently used files that no rank holds until the cache fits its limit. Pins are
    /// held throughout, so a rank cannot take a file while it is being removed.
    pub fn evict(&self) -> std::io::Result<Evicted> {
        self.evict_for(0)
    }

    /// The same, until `extra` more bytes fit too (a data set about to stream in).
    pub fn evict_for(&self, extra: u64) -> std::io::Result<Evicted> {
        let pins = lock(&self.pins);
        let mut files = self.files()?;
        let mut bytes: u64 = files.iter().map(|f| f.2).sum();
        let mut evicted = Evicted::default();
        if let Some(max) = self.max_bytes {
            let max = max.saturating_sub(extra);
            files.sort_by_key(|f| f.1);
            for (path, _, size) in files {
                if bytes <= max {
                    break;
                }
                if pins.contains_key(&path) {
                    continue;
                }
                remove(&path)?;
                bytes -= size;
                evicted.removed.push((path, size));
            }
            evicted.over = bytes > max;
        }
        evicted.bytes = bytes;
        Ok(evicted)
    }

    /// Removes downloads an earlier agent left half done (`NAME.part-UUID`).
    pub fn remove_partials(&self) -> std::io::Result<()> {
        for kind in KINDS {
            let Ok(entries) = std::fs::read_dir(self.dir(kind)) else { continue };
            for entry in entries {
                let entry = entry?;
                if is_partial(&entry.path()) {
                    remove(&entry.path())?;
                }
            }
        }
        Ok(())
    }

    /// Every finished entry of the cache: its path, last use and size (a folder's: its files').
    fn files(&self) -> std::io::Result<Vec<(PathBuf, SystemTime, u64)>> {
        let mut files = Vec::new();
        for kind in KINDS {
            let entries = match std::fs::read_dir(self.dir(kind)) {
                Ok(entries) => entries,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            };
            for entry in entries {
                let entry = entry?;
                let meta = entry.metadata()?;
                // a download in flight is not the cache's yet (and its rank holds the name it becomes)
                if is_partial(&entry.path()) {
                    continue;
                }
                if meta.is_file() {
                    files.push((entry.path(), meta.modified()?, meta.len()));
                } else if meta.is_dir() && kind == SHARDS {
                    let used = std::fs::metadata(entry.path().join(FOLDER_STAMP)).and_then(|m| m.modified());
                    files.push((entry.path(), used.unwrap_or(SystemTime::UNIX_EPOCH), folder_bytes(&entry.path())?));
                }
            }
        }
        Ok(files)
    }
}

/// The bytes of the files directly in `folder` (a cached data set's folder holds no folder).
fn folder_bytes(folder: &Path) -> std::io::Result<u64> {
    let mut bytes = 0;
    for entry in std::fs::read_dir(folder)? {
        let meta = entry?.metadata()?;
        if meta.is_file() {
            bytes += meta.len();
        }
    }
    Ok(bytes)
}

/// Removes a cached file, or a cached folder and what it holds.
fn remove(path: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(path)?.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    }
}

/// A download in flight, named by `ringtrain_client`'s `download` (`NAME.part-UUID`; a folder's likewise).
fn is_partial(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()).is_some_and(|e| e.starts_with("part-"))
}

/// A lock whose holder panicked is still taken: the maps it guards stay consistent between statements.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MIB: u64 = 1 << 20;

    /// A file of `mib` MiB last used `age_s` seconds ago.
    fn cached(cache: &FileCache, name: &str, mib: u64, age_s: u64) -> PathBuf {
        let kind = if name.ends_with(".pt") { "models" } else { "datasets" };
        std::fs::create_dir_all(cache.dir(kind)).unwrap();
        let path = cache.dir(kind).join(name);
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(mib * MIB).unwrap();
        file.set_modified(SystemTime::now() - Duration::from_secs(age_s)).unwrap();
        path
    }

    fn names(evicted: &Evicted) -> Vec<String> {
        evicted.removed.iter().map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn the_least_recently_used_files_go_until_the_cache_fits() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FileCache::new(dir.path(), Some(9.0 / 1024.0)); // 9 MiB
        cached(&cache, "old.safetensors", 4, 300);
        cached(&cache, "older.pt", 4, 400);
        cached(&cache, "new.safetensors", 4, 10);
        let newest = cached(&cache, "newest.pt", 2, 0);
        let evicted = cache.evict().unwrap();
        assert_eq!(names(&evicted), ["older.pt", "old.safetensors"]);
        assert_eq!((evicted.bytes, evicted.over), (6 * MIB, false));
        assert!(newest.exists() && !dir.path().join("models/older.pt").exists());
        // within the limit: nothing more goes
        assert_eq!(cache.evict().unwrap().removed, []);
    }

    #[test]
    fn a_file_a_rank_holds_is_never_evicted_and_touching_makes_it_recent() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FileCache::new(dir.path(), Some(9.0 / 1024.0)); // 9 MiB
        let held = cache.pin(cached(&cache, "held.safetensors", 4, 1000));
        let used = cache.pin(cached(&cache, "used.pt", 4, 900));
        FileCache::touch(&used).unwrap();
        drop(used);
        cached(&cache, "middle.safetensors", 4, 500);
        // held is the oldest but a rank has it; middle is older than the one just touched
        assert_eq!(names(&cache.evict().unwrap()), ["middle.safetensors"]);
        // two ranks hold it: it stays until both let go
        let again = cache.pin(held.path().to_path_buf());
        drop(held);
        cached(&cache, "big.safetensors", 12, 0);
        let evicted = cache.evict().unwrap();
        assert_eq!(names(&evicted), ["used.pt", "big.safetensors"]);
        assert_eq!((evicted.bytes, evicted.over), (4 * MIB, false));
        // what ranks hold may alone be over the limit: kept, and said
        let huge = cache.pin(cached(&cache, "huge.safetensors", 16, 2000));
        let evicted = cache.evict().unwrap();
        assert!(evicted.removed.is_empty() && evicted.over, "{evicted:?}");
        drop((again, huge));
        assert_eq!(names(&cache.evict().unwrap()), ["huge.safetensors"]);
    }

    #[test]
    fn a_cached_folder_counts_its_files_and_goes_whole() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FileCache::new(dir.path(), Some(9.0 / 1024.0)); // 9 MiB
        let folder = cache.dir(SHARDS).join("abc");
        std::fs::create_dir_all(&folder).unwrap();
        for (name, mib) in [("index.json", 0), ("train-000000.tar", 3), ("train-000001.tar", 3)] {
            std::fs::File::create(folder.join(name)).unwrap().set_len(mib * MIB).unwrap();
        }
        let stamp = std::fs::File::options().write(true).open(folder.join("index.json")).unwrap();
        stamp.set_modified(SystemTime::now() - Duration::from_secs(600)).unwrap();
        let newer = cached(&cache, "new.safetensors", 4, 10);
        assert_eq!(cache.bytes().unwrap(), 10 * MIB);
        // held, the folder stays however old; touched, it is the most recent
        let held = cache.pin(folder.clone());
        assert_eq!(names(&cache.evict().unwrap()), ["new.safetensors"]);
        FileCache::touch(&held).unwrap();
        drop(held);
        let partial = cache.dir(SHARDS).join("def.part-1234");
        std::fs::create_dir_all(&partial).unwrap();
        cached(&cache, "newest.safetensors", 4, 0);
        assert_eq!(names(&cache.evict().unwrap()), ["abc"]);
        assert!(!folder.exists() && !newer.exists() && partial.exists());
        cache.remove_partials().unwrap();
        assert!(!partial.exists());
    }

    #[test]
    fn downloads_in_flight_are_not_counted_and_leftovers_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FileCache::new(dir.path(), Some(1.0 / 1024.0));
        let partial = cached(&cache, "a.safetensors.part-1234", 4, 100);
        assert_eq!(cache.evict().unwrap(), Evicted::default());
        assert!(partial.exists());
        cache.remove_partials().unwrap();
        assert!(!partial.exists());
        // no limit: nothing is ever removed
        let unbounded = FileCache::new(dir.path(), Some(0.0));
        cached(&unbounded, "b.safetensors", 4, 100);
        assert_eq!(unbounded.evict().unwrap().removed, []);
    }
}
