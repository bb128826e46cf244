//! The files a rank needs before it starts: the uploaded dataset it trains on and the uploaded model it
//! trains, if any (each downloaded once per node into the [`crate::cache`], checked against the sha256 the
//! server sent, the cached copy too) and, for rank 0 of a resumed placement,
//! the checkpoint it resumes from, unpacked strictly: only the trainer's own folder and file names, regular
//! files and folders, nothing that could write outside the placement's folder.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};
use ringtrain_core::DatasetRef;
use ringtrain_protocol::rank::{checkpoint_files, CheckpointName};
use ringtrain_protocol::{Checkpoint, Work};
use sha2::{Digest, Sha256};

use crate::cache::{CachedFile, FileCache};
use crate::rank::AgentContext;
use crate::streaming::RankStream;

/// What a rank trains on that the agent brings: an uploaded data set's file, or a bucket's sharded data
/// set's folder, whose shards stream in while the rank reads.
pub(crate) enum DatasetFile {
    Cached(CachedFile),
    Streamed(RankStream),
}

impl DatasetFile {
    pub fn path(&self) -> &Path {
        match self {
            DatasetFile::Cached(file) => file.path(),
            DatasetFile::Streamed(stream) => stream.path(),
        }
    }

    /// The stream the rank's requests go to, for a bucket's data set.
    pub fn stream(&self) -> Option<&RankStream> {
        match self {
            DatasetFile::Streamed(stream) => Some(stream),
            DatasetFile::Cached(_) => None,
        }
    }
}

/// The file of an uploaded dataset, downloaded once per node (a cached copy whose sha256 is not the one
/// the server sent is downloaded again), or the folder of a bucket's sharded data set, streamed. What it
/// says as it starts goes to `say`: the job's logs.
pub(crate) async fn dataset_file(
    ctx: &AgentContext,
    work: &Work,
    dataset: &DatasetRef,
    say: &mut (dyn FnMut(String) + Send),
) -> Result<Option<DatasetFile>> {
    if let Some(url) = dataset.bucket_url() {
        return Ok(Some(DatasetFile::Streamed(ctx.buckets.stream(&ctx.cache, url, say).await?)));
    }
    let DatasetRef::Uploaded(id) = dataset else { return Ok(None) };
    let route = format!("/v1/agent/datasets/{id}");
    let expected = work.dataset_sha256.as_deref();
    let path = cached_download(ctx, &route, "datasets", &format!("{id}.safetensors"), expected).await?;
    Ok(Some(DatasetFile::Cached(path)))
}

/// The TorchScript file of the uploaded model the job trains, downloaded once per node like a dataset.
pub(crate) async fn model_file(ctx: &AgentContext, work: &Work) -> Result<Option<CachedFile>> {
    let Some(model) = &work.model else { return Ok(None) };
    let route = format!("/v1/agent/jobs/{}/model", work.assignment.job_id);
    Ok(Some(cached_download(ctx, &route, "models", &format!("{}.pt", model.id), Some(&model.sha256)).await?))
}

/// `route` kept as `work_dir/kind/file`, held for the rank: a cached copy whose sha256 is not `expected` is
/// downloaded again. Then the cache is brought back under its limit.
async fn cached_download(
    ctx: &AgentContext,
    route: &str,
    kind: &str,
    file: &str,
    expected: Option<&str>,
) -> Result<CachedFile> {
    let dir = ctx.cache.dir(kind);
    tokio::fs::create_dir_all(&dir).await?;
    let held = ctx.cache.pin(dir.join(file));
    let path = held.path().to_path_buf();
    let cached_ok = match (path.exists(), expected) {
        (false, _) => false,
        (true, None) => true,
        (true, Some(expected)) => {
            let cached = path.clone();
            let digest = tokio::task::spawn_blocking(move || sha256_of(&cached)).await??;
            let ok = digest.eq_ignore_ascii_case(expected);
            if !ok {
                tracing::warn!(%kind, %file, "the cached file's sha256 is not the server's: downloading it again");
            }
            ok
        }
    };
    if cached_ok {
        FileCache::touch(&held).with_context(|| format!("cannot mark {} used", path.display()))?;
    } else {
        // just written, so the most recently used; and the cache grows only here
        ctx.client.download(route, &path, expected).await?;
        make_room(ctx.cache.clone()).await;
    }
    Ok(held)
}

/// Brings the cache back under its limit, logging what it removed.
pub(crate) async fn make_room(cache: FileCache) {
    match tokio::task::spawn_blocking(move || cache.evict()).await {
        Ok(Ok(evicted)) => {
            for (file, bytes) in &evicted.removed {
                tracing::info!(file = %file.display(), bytes, "evicted from the cache (least recently used)");
            }
            if evicted.over {
                tracing::warn!(bytes = evicted.bytes, "the cache is over --cache-max-gib with files ranks use");
            }
        }
        Ok(Err(err)) => tracing::warn!(error = %err, "cannot bring the cache under --cache-max-gib"),
        Err(err) => tracing::warn!(error = %err, "the cache's eviction task failed"),
    }
}

fn sha256_of(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(ringtrain_core::hex(&hasher.finalize()))
}

/// Downloads and unpacks the checkpoint a resumed placement starts from; returns the folder for
/// `--resume` (it holds `epoch-NNNN/` and `latest`).
pub(crate) async fn fetch_checkpoint(
    ctx: &AgentContext,
    work: &Work,
    checkpoint: &Checkpoint,
    rank_dir: &Path,
) -> Result<PathBuf> {
    let path = format!("/v1/agent/jobs/{}/checkpoints/{}/archive", work.assignment.job_id, checkpoint.id);
    let name = fetch_archive(ctx, &path, Some(&checkpoint.sha256), &rank_dir.join("resume")).await?;
    tracing::info!(checkpoint = %name, epoch = checkpoint.epoch, "resuming");
    Ok(rank_dir.join("resume"))
}

/// Downloads and unpacks a fork's starting checkpoint (its `init_from`, pinned by the server); returns the
/// folder for `--init-from`, laid out as a resume folder.
pub(crate) async fn fetch_init(ctx: &AgentContext, work: &Work, rank_dir: &Path) -> Result<PathBuf> {
    let path = format!("/v1/agent/jobs/{}/init", work.assignment.job_id);
    let target = rank_dir.join("init");
    let name = fetch_archive(ctx, &path, None, &target)
        .await
        .context("cannot fetch the starting checkpoint named by the spec's init_from")?;
    tracing::info!(checkpoint = %name, "starting from another job's weights");
    Ok(target)
}

/// Downloads the archive at `path` (checked against `sha256` when known) and unpacks it into `target`;
/// returns the checkpoint folder's name.
async fn fetch_archive(ctx: &AgentContext, path: &str, sha256: Option<&str>, target: &Path) -> Result<String> {
    let archive = target.with_extension("tar");
    ctx.client.download(path, &archive, sha256).await?;
    let unpacked = target.to_path_buf();
    tokio::task::spawn_blocking(move || -> Result<String> {
        let name = unpack_checkpoint(&archive, &unpacked)?;
        std::fs::remove_file(&archive)?;
        Ok(name)
    })
    .await?
}

/// The trainer's checkpoint folder names (`protocol::rank::CheckpointName`).
pub(crate) fn is_checkpoint_folder(name: &str) -> bool {
    CheckpointName::parse(name).is_some()
}

/// Unpacks a checkpoint archive into a fresh `into`: one checkpoint folder and the trainer's files in it,
/// regular files and folders only (no links, devices or other paths), then writes `latest` naming the
/// folder, refusing to follow anything already there. Returns the folder's name.
pub(crate) fn unpack_checkpoint(archive: &Path, into: &Path) -> Result<String> {
    if into.exists() {
        std::fs::remove_dir_all(into)?;
    }
    std::fs::create_dir_all(into)?;
    let mut tar = tar::Archive::new(std::fs::File::open(archive)?);
    let mut folder: Option<String> = None;
    for entry in tar.entries().context("cannot read the checkpoint archive")? {
        let mut entry = entry.context("cannot read the checkpoint archive")?;
        let path = entry.path()?.into_owned();
        let parts: Vec<String> = path
            .components()
            .map(|c| match c {
                Component::Normal(part) => Ok(part.to_string_lossy().into_owned()),
                _ => bail!("the checkpoint archive holds a path {path:?} outside its folder"),
            })
            .collect::<Result<_>>()?;
        let kind = entry.header().entry_type();
        let top = parts.first().context("the checkpoint archive holds an empty path")?;
        if !is_checkpoint_folder(top) || folder.as_ref().is_some_and(|f| f != top) {
            bail!("the checkpoint archive holds {path:?}, not one epoch-NNNN folder");
        }
        folder = Some(top.clone());
        match (parts.len(), kind) {
            (1, tar::EntryType::Directory) => std::fs::create_dir_all(into.join(top))?,
            (2, tar::EntryType::Regular) if checkpoint_files::ALL.contains(&parts[1].as_str()) => {
                std::fs::create_dir_all(into.join(top))?;
                let destination = into.join(top).join(&parts[1]);
                let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&destination)?;
                std::io::copy(&mut entry, &mut file)?;
            }
            _ => bail!("the checkpoint archive holds {path:?} ({kind:?}), which is not a checkpoint file"),
        }
    }
    let folder = folder.context("the checkpoint archive holds no epoch-NNNN folder")?;
    let mut latest =
        std::fs::OpenOptions::new().write(true).create_new(true).open(into.join(ringtrain_protocol::rank::LATEST))?;
    std::io::Write::write_all(&mut latest, folder.as_bytes())?;
    Ok(folder)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Tar = tar::Builder<std::fs::File>;
    /// Writes one hostile archive's entries.
    type Build<'a> = Box<dyn Fn(&mut Tar) + 'a>;

    fn archive(dir: &Path, build: impl FnOnce(&mut Tar)) -> PathBuf {
        let path = dir.join("a.tar");
        let mut builder = tar::Builder::new(std::fs::File::create(&path).unwrap());
        build(&mut builder);
        builder.finish().unwrap();
        path
    }

    /// A header whose name is written byte for byte (tar's own setters refuse `..`, which a hostile
    /// archive would not).
    fn header(path: &str, size: u64, kind: tar::EntryType) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        let name = &mut header.as_gnu_mut().unwrap().name;
        name[..path.len()].copy_from_slice(path.as_bytes());
        header.set_size(size);
        header.set_mode(0o644);
        header.set_entry_type(kind);
        header
    }

    fn file(builder: &mut tar::Builder<std::fs::File>, path: &str, bytes: &[u8]) {
        let mut header = header(path, bytes.len() as u64, tar::EntryType::Regular);
        header.set_cksum();
        builder.append(&header, bytes).unwrap();
    }

    fn link(builder: &mut tar::Builder<std::fs::File>, path: &str, target: &Path, kind: tar::EntryType) {
        let mut header = header(path, 0, kind);
        header.set_link_name(target).unwrap();
        header.set_cksum();
        builder.append(&header, std::io::empty()).unwrap();
    }

    #[test]
    fn a_trainer_checkpoint_unpacks_with_latest() {
        let dir = tempfile::tempdir().unwrap();
        let tar = archive(dir.path(), |b| {
            file(b, "epoch-0002/state.json", b"{}");
            file(b, "epoch-0002/model.safetensors", b"weights");
        });
        let into = dir.path().join("resume");
        assert_eq!(unpack_checkpoint(&tar, &into).unwrap(), "epoch-0002");
        assert_eq!(std::fs::read(into.join("epoch-0002/model.safetensors")).unwrap(), b"weights");
        assert_eq!(std::fs::read_to_string(into.join("latest")).unwrap(), "epoch-0002");
    }

    /// A `latest` symlink planted in the archive must not make the agent write through it, and a folder
    /// name carrying a payload is refused.
    #[test]
    fn hostile_archives_write_nothing_outside() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        let hostile: Vec<Build<'_>> = vec![
            Box::new(|b| {
                link(b, "latest", &victim, tar::EntryType::Symlink);
                file(b, "epoch-0001/state.json", b"{}");
            }),
            Box::new(|b| {
                file(b, "epoch-0001/state.json", b"{}");
                link(b, "epoch-0001/model.safetensors", &victim, tar::EntryType::Symlink);
            }),
            Box::new(|b| link(b, "epoch-0001/model.safetensors", &victim, tar::EntryType::Link)),
            Box::new(|b| file(b, "epoch-\nssh-ed25519 AAAA attacker/state.json", b"{}")),
            Box::new(|b| file(b, "epoch-0001/../../victim", b"overwritten")),
            Box::new(|b| file(b, "epoch-0001/.bashrc", b"x")),
            Box::new(|b| {
                file(b, "epoch-0001/state.json", b"{}");
                file(b, "epoch-0002/state.json", b"{}");
            }),
        ];
        for (i, build) in hostile.iter().enumerate() {
            let case = dir.path().join(format!("case{i}"));
            std::fs::create_dir_all(&case).unwrap();
            let tar = archive(&case, |b| build(b));
            assert!(unpack_checkpoint(&tar, &case.join("resume")).is_err(), "case {i} was accepted");
            assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched", "case {i}");
        }
    }
}
