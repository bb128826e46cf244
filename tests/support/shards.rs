//! Fashion-MNIST as a packed, sharded data set for the tests of sharded data
//! sets (tests/shards.rs, tests/buckets.rs).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const FASHION_MNIST: &str = "/usr/share/datasets/fashion-mnist";

/// Images (N×28×28) and labels of a gzipped Fashion-MNIST IDX pair.
pub fn fashion_mnist(images: &str, labels: &str) -> (Vec<[u8; 784]>, Vec<u8>) {
    let read = |name: &str| {
        let mut bytes = Vec::new();
        let file = std::fs::File::open(Path::new(FASHION_MNIST).join(name)).unwrap_or_else(|e| {
            panic!("{FASHION_MNIST}/{name}: {e} (scripts/setup.sh installs dataset-fashion-mnist)")
        });
        flate2::read::GzDecoder::new(file).read_to_end(&mut bytes).unwrap();
        bytes
    };
    let (x, y) = (read(images), read(labels));
    let images = x[16..].chunks_exact(784).map(|c| c.try_into().unwrap()).collect();
    (images, y[8..].to_vec())
}

/// The first `n` images of a split as `dir/CLASS/NNNNN.jpg` (grey as RGB, quality 95).
pub fn image_folder(dir: &Path, images: &[[u8; 784]], labels: &[u8], n: usize) {
    for (i, (image, label)) in images.iter().zip(labels).take(n).enumerate() {
        let folder = dir.join(format!("class-{label}"));
        std::fs::create_dir_all(&folder).unwrap();
        let rgb: Vec<u8> = image.iter().flat_map(|&g| [g, g, g]).collect();
        let jpeg = ringtrain_data::synthetic::jpeg(&rgb, 28, 28, 95).unwrap();
        std::fs::write(folder.join(format!("{i:05}.jpg")), jpeg).unwrap();
    }
}

pub fn ringtrain() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ringtrain"))
}

/// `ringtrain datasets pack` of the image folders `dir/train` and `dir/test` into `shards`, in shards of
/// about `shard_mib` MiB: its JSON report.
pub fn pack(dir: &Path, shards: &Path, shard_mib: f64) -> Value {
    let output = ringtrain()
        .args(["datasets", "pack", "--shard-mib", &shard_mib.to_string(), "--json", "--test"])
        .arg(dir.join("test"))
        .arg(dir.join("train"))
        .arg(shards)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Fashion-MNIST's first 2,400 training and 400 test images, packed into shards of ~1 MiB.
pub fn packed(dir: &Path) -> PathBuf {
    packed_from(dir, 2400, 400, 1.0)
}

/// Fashion-MNIST's first `train` training and `test` test images, packed into shards of ~`shard_mib` MiB.
pub fn packed_from(dir: &Path, train: usize, test: usize, shard_mib: f64) -> PathBuf {
    let (train_images, train_labels) = fashion_mnist("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz");
    let (test_images, test_labels) = fashion_mnist("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz");
    image_folder(&dir.join("train"), &train_images, &train_labels, train);
    image_folder(&dir.join("test"), &test_images, &test_labels, test);
    let shards = dir.join("shards");
    let report = pack(dir, &shards, shard_mib);
    assert_eq!(
        (report["train_samples"].as_u64(), report["test_samples"].as_u64()),
        (Some(train as u64), Some(test as u64))
    );
    assert!(report["train_shards"].as_u64().unwrap() >= 3, "{report}");
    shards
}

/// Readable by every user (the rank user, where the test runs as root): the shards and the folders above.
pub fn open_to_ranks(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for entry in walk(dir) {
        let mode = if entry.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            all.extend(walk(&path));
        } else {
            all.push(path);
        }
    }
    all
}
