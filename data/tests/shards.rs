//! A sharded data set end to end, without libtorch: an image folder of JPEGs (and a file that is not one)
//! packed into shards, read back in an epoch's order by any number of loader threads, and damaged.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ringtrain_data::index::DatasetIndex;
use ringtrain_data::loader::{Batch, Batches, CropMode, SplitReader, Transform};
use ringtrain_data::order::EpochOrder;
use ringtrain_data::pack::{pack, PackOptions};
use ringtrain_data::shard::Layout;
use ringtrain_data::synthetic::Chroma;

const CLASSES: u32 = 4;
const PER_CLASS: u32 = 30;

struct Packed {
    _dir: tempfile::TempDir,
    out: PathBuf,
    index: DatasetIndex,
}

fn packed() -> Packed {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    ringtrain_data::synthetic::image_folder(&images, CLASSES, PER_CLASS, (64, 48), Chroma::Full, 11).unwrap();
    std::fs::write(images.join("class-001/notes.txt"), "not an image").unwrap();
    std::fs::write(images.join("class-002/broken.jpg"), b"\xFF\xD8\xFF\xE0 and then nothing").unwrap();
    let out = dir.path().join("shards");
    let options = PackOptions { shard_bytes: 40 << 10, threads: 3, ..Default::default() };
    let report = pack(&images, None, &out, &options).unwrap();
    let left_out: Vec<String> =
        report.skipped.iter().map(|s| s.path.file_name().unwrap().to_string_lossy().to_string()).collect();
    assert_eq!(left_out, ["notes.txt", "broken.jpg"], "{:?}", report.skipped);
    assert!(
        report.skipped[0].why.contains("not a JPEG or PNG") && report.skipped[1].why.contains("not a readable JPEG")
    );
    let index = DatasetIndex::from_json(&std::fs::read_to_string(out.join("index.json")).unwrap()).unwrap();
    assert_eq!(index.train.samples, u64::from(CLASSES * PER_CLASS));
    assert_eq!(report.restart_marked, index.train.samples, "every (baseline) JPEG stored with restart markers");
    assert!(index.train.shards.len() >= 4, "{} shards", index.train.shards.len());
    Packed { _dir: dir, out, index }
}

fn reader(out: &Path, index: &DatasetIndex) -> Arc<SplitReader> {
    Arc::new(SplitReader::new(out.to_path_buf(), index.train.clone(), Layout::of(index), 4))
}

/// The epoch's batches of `n`, taken in order by `threads` threads.
fn epoch(p: &Packed, threads: usize, n: usize) -> Vec<Batch> {
    let order = EpochOrder::new(&p.index.train.shard_samples(), 2, 5, 1);
    let plan: Vec<Vec<u64>> = order.samples().chunks(n).map(|c| c.iter().map(|&s| s as u64).collect()).collect();
    let transform = Transform { size: 32, crop: CropMode::RandomResized, seed: 5, epoch: 1 };
    let mut batches = Batches::start(reader(&p.out, &p.index), plan, transform, threads, 2);
    std::iter::from_fn(|| batches.next_batch()).map(Result::unwrap).collect()
}

#[test]
fn every_sample_comes_once_per_epoch_the_same_for_any_number_of_threads() {
    let p = packed();
    let one = epoch(&p, 1, 16);
    let labels: Vec<i64> = one.iter().flat_map(|b| b.labels.clone()).collect();
    assert_eq!(labels.len(), (CLASSES * PER_CLASS) as usize);
    for class in 0..i64::from(CLASSES) {
        assert_eq!(labels.iter().filter(|&&l| l == class).count(), PER_CLASS as usize, "class {class}");
    }
    assert_eq!(one, epoch(&p, 3, 16), "the same bytes, crops and flips with three threads");
    assert_eq!(one[0].images().len(), 16 * 3 * 32 * 32);
}

#[test]
fn a_damaged_shard_fails_the_loader_naming_the_shard_and_where() {
    let p = packed();
    let shard = &p.index.train.shards[1];
    let path = p.out.join(&shard.name);
    let whole = std::fs::read(&path).unwrap();
    let plan: Vec<Vec<u64>> = (0..p.index.train.samples).map(|s| vec![s]).collect();
    let transform = Transform { size: 16, crop: CropMode::Centre, seed: 1, epoch: 0 };
    let first_error = |plan: Vec<Vec<u64>>| {
        let mut batches = Batches::start(reader(&p.out, &p.index), plan, transform, 2, 2);
        std::iter::from_fn(|| batches.next_batch()).find_map(Result::err).expect("an error")
    };

    // truncated: its size is not the index's
    std::fs::write(&path, &whole[..whole.len() / 2]).unwrap();
    let error = first_error(plan.clone());
    assert!(error.contains(&format!("shard {} at byte", shard.name)) && error.contains("the index says"), "{error}");

    // the same size, but an image's bytes overwritten: the sample that does not decode is named
    let mut damaged = whole.clone();
    let first_image = 512 + 10;
    damaged[first_image..first_image + 400].fill(0);
    std::fs::write(&path, &damaged).unwrap();
    let error = first_error(plan.clone());
    assert!(error.contains(&format!("shard {} sample 0", shard.name)) && error.contains("JPEG"), "{error}");

    // missing
    std::fs::remove_file(&path).unwrap();
    let error = first_error(plan);
    assert!(error.contains(&format!("shard {}", shard.name)) && error.contains("missing"), "{error}");
}

#[test]
fn an_empty_batch_in_the_plan_comes_back_empty_and_the_rest_in_order() {
    let p = packed();
    let plan = vec![vec![0, 1], vec![], vec![2]];
    let transform = Transform { size: 8, crop: CropMode::Centre, seed: 0, epoch: 0 };
    let mut batches = Batches::start(reader(&p.out, &p.index), plan, transform, 2, 1);
    let sizes: Vec<usize> = std::iter::from_fn(|| batches.next_batch()).map(|b| b.unwrap().labels.len()).collect();
    assert_eq!(sizes, [2, 0, 1]);
}

/// Packed without restart markers (what `bench data` gives PyTorch's side), every image is stored byte for
/// byte as its file holds it, and the loader reads it all the same.
#[test]
fn without_restart_markers_every_image_is_stored_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    ringtrain_data::synthetic::image_folder(&images, 2, 5, (64, 48), Chroma::Half, 3).unwrap();
    let mut originals = std::collections::HashSet::new();
    for class in std::fs::read_dir(&images).unwrap() {
        for file in std::fs::read_dir(class.unwrap().path()).unwrap() {
            originals.insert(std::fs::read(file.unwrap().path()).unwrap());
        }
    }
    let out = dir.path().join("shards");
    let options = PackOptions { restart_markers: false, threads: 2, ..Default::default() };
    let report = pack(&images, None, &out, &options).unwrap();
    assert_eq!(report.restart_marked, 0);
    let index = DatasetIndex::from_json(&std::fs::read_to_string(out.join("index.json")).unwrap()).unwrap();
    let reader = reader(&out, &index);
    for id in 0..index.train.samples {
        let (bytes, _, _) = reader.sample(id).unwrap();
        assert!(originals.contains(&bytes), "sample {id} is not a file's bytes");
    }
    let plan = vec![(0..index.train.samples).collect()];
    let transform = Transform { size: 32, crop: CropMode::RandomResized, seed: 1, epoch: 0 };
    let batch = Batches::start(reader, plan, transform, 2, 1).next_batch().unwrap().unwrap();
    assert_eq!(batch.images().len(), 10 * 3 * 32 * 32);
}
