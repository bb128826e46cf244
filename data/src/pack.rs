//! `ringtrain datasets pack`: an image folder (one sub-folder per class, the torchvision and ImageNet
//! layout) into shards and their index (a safetensors data set of named tensors: [`crate::pack_tensors`]).
//!
//! Every file is decoded once, on every core, so a file that is not a readable JPEG or PNG is reported by
//! name and left out rather than failing a job later. The kept images are shuffled (a fixed seed) before
//! they are cut into shards, so a window of shards already mixes the classes (`order`). A baseline JPEG is
//! stored rewritten losslessly with restart markers every few MCUs (the same coefficients, so the same
//! pixels; never re-encoded), so that the loader decodes only the restart intervals a crop covers
//! (`image::restart`); other files are stored as they were. The per-channel mean and std come from a
//! sample of the decoded training images. The index is written last, atomically: a folder with an
//! `index.json` is a whole data set.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use ringtrain_core::random::SplitMix64;
use sha2::{Digest, Sha256};

use crate::image::decode;
use crate::index::{DatasetIndex, Normalize, SampleKind, ShardInfo, SplitIndex, FORMAT};
use crate::shard::{ImageFormat, ShardWriter};

#[derive(Debug, Clone)]
pub struct PackOptions {
    /// A shard is closed once it holds this many bytes (64 MiB: a few hundred ImageNet images).
    pub shard_bytes: u64,
    /// Seeds the shuffle before sharding.
    pub seed: u64,
    /// Training images whose pixels estimate the per-channel mean and std.
    pub stats_images: usize,
    /// Decoding threads (default: every core).
    pub threads: usize,
    /// Rewrite baseline JPEGs with restart markers (default), or store every file as it is (what another
    /// tool's loader reads best: `bench data` packs its reference's shards so).
    pub restart_markers: bool,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            shard_bytes: 64 << 20,
            seed: 0,
            stats_images: 2000,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            restart_markers: true,
        }
    }
}

/// A file left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Skipped {
    pub path: PathBuf,
    pub why: String,
}

/// What a pack kept and left out.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PackReport {
    pub index: PathBuf,
    pub classes: usize,
    pub train_samples: u64,
    pub train_shards: usize,
    pub test_samples: u64,
    pub test_shards: usize,
    pub bytes: u64,
    pub skipped: Vec<Skipped>,
    /// JPEGs stored rewritten with restart markers (the same pixels; see the module's doc); the other
    /// images as they were.
    pub restart_marked: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("{0}")]
    Input(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PackError + '_ {
    move |source| PackError::Io { path: path.to_path_buf(), source }
}

/// One image to pack.
struct Candidate {
    path: PathBuf,
    class: u32,
}

/// A decoded-and-kept image: where it is and its format (its bytes are read again when its shard is
/// written, so packing ImageNet does not hold it in memory).
struct Kept {
    path: PathBuf,
    class: u32,
    format: ImageFormat,
    /// Channel sums and sums of squares (pixels in [0, 1]) and the pixel count, for the statistics.
    stats: Option<([f64; 3], [f64; 3], f64)>,
}

/// Packs `train` (and `test`, with the same class folders or a subset of them) into `out`.
pub fn pack(train: &Path, test: Option<&Path>, out: &Path, options: &PackOptions) -> Result<PackReport, PackError> {
    let classes = class_folders(train)?;
    if classes.is_empty() {
        return Err(PackError::Input(format!("{} has no class folders (one sub-folder per class)", train.display())));
    }
    std::fs::create_dir_all(out).map_err(io(out))?;
    let (mut skipped, mut marked) = (Vec::new(), 0);
    let (train_split, stats) = pack_split("train", train, &classes, out, options, &mut skipped, &mut marked)?;
    let test_split = match test {
        Some(dir) => {
            let theirs = class_folders(dir)?;
            if let Some(unknown) = theirs.iter().find(|c| !classes.contains(c)) {
                return Err(PackError::Input(format!(
                    "{}: class folder {unknown:?} is not among the training classes",
                    dir.display()
                )));
            }
            Some(pack_split("test", dir, &classes, out, options, &mut skipped, &mut marked)?.0)
        }
        None => None,
    };
    let index = DatasetIndex {
        format: FORMAT.into(),
        kind: SampleKind::Images,
        classes: classes.clone(),
        normalize: Some(stats),
        inputs: Vec::new(),
        values: None,
        train: train_split,
        test: test_split,
    };
    let mut report = write_index(&index, out, classes.len(), skipped)?;
    report.restart_marked = marked;
    Ok(report)
}

/// Checks `index` and writes it into `out`, last and atomically (a folder with an `index.json` is a whole
/// data set); what was packed.
pub(crate) fn write_index(
    index: &DatasetIndex,
    out: &Path,
    classes: usize,
    skipped: Vec<Skipped>,
) -> Result<PackReport, PackError> {
    index.check().map_err(|problems| {
        PackError::Input(problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
    })?;
    let path = out.join("index.json");
    let partial = out.join(".index.json.partial");
    std::fs::write(&partial, index.to_json()).map_err(io(&partial))?;
    std::fs::rename(&partial, &path).map_err(io(&path))?;
    let shards = |s: &SplitIndex| s.shards.iter().map(|s| s.bytes).sum::<u64>();
    Ok(PackReport {
        index: path,
        classes,
        train_samples: index.train.samples,
        train_shards: index.train.shards.len(),
        test_samples: index.test.as_ref().map_or(0, |t| t.samples),
        test_shards: index.test.as_ref().map_or(0, |t| t.shards.len()),
        bytes: shards(&index.train) + index.test.as_ref().map_or(0, shards),
        skipped,
        restart_marked: 0,
    })
}

/// 0..n in the order a split's samples are packed: shuffled by the seed (the test split by another
/// stream than the training split's), so a window of shards already mixes the classes.
pub(crate) fn shuffled(n: usize, seed: u64, split: &str) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = SplitMix64::new(seed ^ if split == "train" { 0 } else { 0x7E57 });
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    order
}

/// The sub-folders of `dir`, sorted by name (torchvision's `ImageFolder` order: class i is the i-th).
fn class_folders(dir: &Path) -> Result<Vec<String>, PackError> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        if entry.file_type().map_err(io(&entry.path()))?.is_dir() {
            let name = entry.file_name().to_string_lossy().to_string();
            if !name.starts_with('.') {
                names.push(name);
            }
        }
    }
    names.sort();
    Ok(names)
}

/// Decodes every file of one split, shuffles what it keeps and writes it as shards named `SPLIT-NNNNNN.tar`.
fn pack_split(
    split: &str,
    dir: &Path,
    classes: &[String],
    out: &Path,
    options: &PackOptions,
    skipped: &mut Vec<Skipped>,
    restart_marked: &mut u64,
) -> Result<(SplitIndex, Normalize), PackError> {
    let mut candidates = Vec::new();
    for (class, name) in classes.iter().enumerate() {
        let folder = dir.join(name);
        if !folder.is_dir() {
            continue; // a test split may lack a class
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(&folder)
            .map_err(io(&folder))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        candidates.extend(files.into_iter().map(|path| Candidate { path, class: class as u32 }));
    }
    let order: Vec<usize> = shuffled(candidates.len(), options.seed, split);
    let want_stats = if split == "train" { options.stats_images } else { 0 };
    let kept = decode_all(&candidates, &order, want_stats, options.threads.max(1), skipped);
    if kept.is_empty() {
        return Err(PackError::Input(format!("{}: no readable image in {split}", dir.display())));
    }
    let normalize = normalize(&kept);
    let mut shards = Vec::new();
    let mut writer: Option<(PathBuf, ShardWriter, u64)> = None;
    let mut n = 0usize;
    for chunk in kept.chunks(STORE_CHUNK) {
        for (image, (stored, marked)) in chunk.iter().zip(stored_bytes(chunk, options)?) {
            *restart_marked += u64::from(marked);
            if writer.is_none() {
                let name = format!("{split}-{:06}.tar", shards.len());
                let path = out.join(&name);
                writer = Some((path.clone(), ShardWriter::create(&path).map_err(io(&path))?, 0));
            }
            if let Some((path, shard, bytes)) = writer.as_mut() {
                shard.append(&format!("{n:09}"), image.format, &stored, image.class).map_err(io(path))?;
                *bytes += stored.len() as u64 + 2048;
                if *bytes >= options.shard_bytes {
                    shards.push(close(writer.take())?);
                }
            }
            n += 1;
        }
    }
    if writer.is_some() {
        shards.push(close(writer.take())?);
    }
    let samples = shards.iter().map(|s: &ShardInfo| s.samples).sum();
    Ok((SplitIndex { samples, shards }, normalize))
}

/// Images read (and rewritten) at once, on every thread, before they are written in order.
const STORE_CHUNK: usize = 256;

/// The bytes each image is stored as, read again from its file, and whether they were rewritten: a
/// baseline JPEG with restart markers (`image::jpeg::with_restarts`: the same pixels, and a crop's decoding
/// then reads only the intervals it covers), unless that made it more than 5% larger; anything else as it
/// is (everything, without `options.restart_markers`).
fn stored_bytes(images: &[Kept], options: &PackOptions) -> Result<Vec<(Vec<u8>, bool)>, PackError> {
    let stored = in_parallel(images.len(), options.threads.max(1), |at| {
        let image = &images[at];
        let bytes = std::fs::read(&image.path).map_err(io(&image.path))?;
        Ok(match image.format {
            ImageFormat::Jpeg if options.restart_markers => match crate::image::jpeg::with_restarts(&bytes) {
                Ok(Some(rewritten)) if rewritten.len() <= bytes.len() + bytes.len() / 20 => (rewritten, true),
                _ => (bytes, false),
            },
            ImageFormat::Jpeg | ImageFormat::Png => (bytes, false),
        })
    });
    stored.into_iter().map(|r| r.unwrap_or_else(|| Err(PackError::Input("an image was not read".into())))).collect()
}

/// `work(i)` for each i of 0..n on `threads` threads, the results in order (None only where a thread
/// could not record one).
fn in_parallel<T: Send>(n: usize, threads: usize, work: impl Fn(usize) -> T + Sync) -> Vec<Option<T>> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<T>>> = Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let at = next.fetch_add(1, Ordering::Relaxed);
                if at >= n {
                    break;
                }
                let result = work(at);
                if let Ok(mut all) = results.lock() {
                    all[at] = Some(result);
                }
            });
        }
    });
    results.into_inner().unwrap_or_default()
}

pub(crate) fn close(writer: Option<(PathBuf, ShardWriter, u64)>) -> Result<ShardInfo, PackError> {
    let Some((path, shard, _)) = writer else { return Err(PackError::Input("no open shard".into())) };
    let samples = shard.samples;
    let bytes = shard.finish().map_err(io(&path))?;
    let mut hasher = Sha256::new();
    let mut file = std::fs::File::open(&path).map_err(io(&path))?;
    std::io::copy(&mut file, &mut hasher).map_err(io(&path))?;
    let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    Ok(ShardInfo { name, bytes, samples, sha256: ringtrain_core::hex(&hasher.finalize()) })
}

/// Decodes the candidates on `threads` threads; returns the readable ones in `order`, the first
/// `stats_images` of them with their pixel statistics, and records the others in `skipped`.
fn decode_all(
    candidates: &[Candidate],
    order: &[usize],
    stats_images: usize,
    threads: usize,
    skipped: &mut Vec<Skipped>,
) -> Vec<Kept> {
    let results = in_parallel(order.len(), threads, |at| read_one(&candidates[order[at]], at < stats_images));
    let mut kept = Vec::with_capacity(order.len());
    for (at, result) in results.into_iter().enumerate() {
        match result {
            Some(Ok(image)) => kept.push(image),
            Some(Err(why)) => skipped.push(Skipped { path: candidates[order[at]].path.clone(), why }),
            None => {}
        }
    }
    kept
}

fn read_one(candidate: &Candidate, with_stats: bool) -> Result<Kept, String> {
    let bytes = std::fs::read(&candidate.path).map_err(|e| format!("cannot be read: {e}"))?;
    let format = ImageFormat::sniff(&bytes).ok_or("not a JPEG or PNG file")?;
    let rgb = decode(&bytes, format)?;
    let stats = with_stats.then(|| {
        let (mut sums, mut squares) = ([0f64; 3], [0f64; 3]);
        for pixel in rgb.pixels.chunks_exact(3) {
            for c in 0..3 {
                let v = f64::from(pixel[c]) / 255.0;
                sums[c] += v;
                squares[c] += v * v;
            }
        }
        (sums, squares, f64::from(rgb.width) * f64::from(rgb.height))
    });
    Ok(Kept { path: candidate.path.clone(), class: candidate.class, format, stats })
}

/// The mean and std of each channel over the sampled images' pixels.
fn normalize(kept: &[Kept]) -> Normalize {
    let (mut sums, mut squares, mut count) = ([0f64; 3], [0f64; 3], 0f64);
    for (s, q, n) in kept.iter().filter_map(|k| k.stats) {
        for c in 0..3 {
            sums[c] += s[c];
            squares[c] += q[c];
        }
        count += n;
    }
    let count = count.max(1.0);
    let mean = sums.map(|s| s / count);
    let std: Vec<f64> = (0..3).map(|c| (squares[c] / count - mean[c] * mean[c]).max(0.0).sqrt().max(1e-3)).collect();
    Normalize { mean: mean.map(|m| m.clamp(0.0, 1.0) as f32), std: [std[0] as f32, std[1] as f32, std[2] as f32] }
}
