//! `ringtrain-bench data`: ringtrain's input pipeline against PyTorch's DataLoader with torchvision, on the
//! same images, in one run. Both read the training split of a sharded data set by offset, decode each JPEG,
//! draw a random-resized crop and a flip, resize to `size` and collate uint8 batches; the figure is images
//! per second per core, each side pinned to as many cores as it has threads or workers (`taskset`).
//! Without `--shards` it makes ImageNet-sized synthetic photographs (about 400×350, quality 90, 4:2:0 by
//! default: `ringtrain_data::synthetic`) and packs them twice: as `datasets pack` does, for ringtrain, and
//! stored as they are, for PyTorch (the restart markers ringtrain's pack adds put libjpeg-turbo's Huffman
//! decoding on its slower path, and a PyTorch user's JPEGs have none). The loader is ringtrain-data's own
//! (no libtorch here); `--train` runs the product's `ringtrain bench train` as a process on the shards and on
//! the same images decoded once into a safetensors file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ringtrain_data::index::DatasetIndex;
use ringtrain_data::loader::{Batches, CropMode, SplitReader, Transform};
use ringtrain_data::order::{EpochOrder, WINDOW_SHARDS};
use ringtrain_data::synthetic::Chroma;
use serde_json::{json, Value};

use ringtrain_bench::python::{check_python, json_lines};
use ringtrain_data::safetensors::Named;

#[derive(Debug, clap::Args)]
pub struct DataArgs {
    /// A sharded data set (its folder, with index.json). Default: synthetic photographs, made and packed here.
    #[arg(long)]
    shards: Option<PathBuf>,
    /// The shards PyTorch's side reads, when not --shards: the same images stored as they were, without the
    /// restart markers `datasets pack` writes (libjpeg-turbo decodes a JPEG with markers on its slower path,
    /// and a PyTorch user's JPEGs have none). Made beside the synthetic photographs' shards.
    #[arg(long, requires = "shards")]
    reference_shards: Option<PathBuf>,
    /// Keep the synthetic photographs' shards here (made if missing) instead of in a temporary folder: a
    /// later `--shards` or a `shards:` job can use them (the device check trains ResNet-50 on them).
    #[arg(long, conflicts_with = "shards")]
    keep: Option<PathBuf>,
    /// How the synthetic photographs store their chroma: at half resolution each way (420, as cameras write
    /// it and most of ImageNet is) or at full resolution (444).
    #[arg(long, default_value = "420", value_parser = ["420", "444"], conflicts_with = "shards")]
    chroma: String,
    /// How many synthetic photographs to make when no --shards is given (10 classes).
    #[arg(long, default_value_t = 2000)]
    images: u32,
    /// Output side of the crop.
    #[arg(long, default_value_t = 224)]
    size: u32,
    /// Images per batch.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Timed batches per figure (after two warm-up batches).
    #[arg(long, default_value_t = 25)]
    batches: usize,
    /// Decoding threads of ringtrain's loader, and worker processes of PyTorch's DataLoader: a figure each.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    cores: Vec<usize>,
    /// A Python with torch and torchvision (scripts/bench/pytorch-venv.sh; `pip install torchvision` in it).
    #[arg(long, env = "RINGTRAIN_PYTORCH_PYTHON", default_value = "python3")]
    python: PathBuf,
    /// The PyTorch side.
    #[arg(long, default_value = "scripts/bench/pytorch_data.py")]
    script: PathBuf,
    /// Only ringtrain's figures.
    #[arg(long)]
    no_pytorch: bool,
    /// One JSON object per figure instead of a table.
    #[arg(long)]
    json: bool,
    /// Also train this built-in model (e.g. resnet20) on one rank from the shards and from the same images
    /// held in memory (decoded once, centre-cropped), and compare samples/s.
    #[arg(long)]
    train: Option<String>,
    /// The side of the training images (--train).
    #[arg(long, default_value_t = 64)]
    train_size: u32,
    /// Timed training steps (--train), after 3 warm-up steps, at --batch.
    #[arg(long, default_value_t = 20)]
    train_steps: u32,
    /// (Internal) measure ringtrain's loader alone with this many threads and print one JSON object: how
    /// the bench runs its own side under `taskset`, as it runs PyTorch's.
    #[arg(long, hide = true)]
    loader_only: Option<usize>,
}

pub fn run(args: &DataArgs) -> Result<()> {
    if let (Some(threads), Some(shards)) = (args.loader_only, &args.shards) {
        let index = read_index(shards)?;
        println!("{}", ringtrain_rate(args, shards, &index, threads)?);
        return Ok(());
    }
    if !args.no_pytorch {
        check_python(&args.python)?;
    }
    let scratch = tempfile::Builder::new().prefix("ringtrain-bench-data-").tempdir()?;
    let (shards, reference) = match (&args.shards, &args.keep) {
        (Some(dir), _) => (dir.clone(), args.reference_shards.clone().unwrap_or_else(|| dir.clone())),
        (None, Some(keep)) => make_shards(args, keep)?,
        (None, None) => make_shards(args, scratch.path())?,
    };
    let index = read_index(&shards)?;
    let needed = (args.batches + 2) * args.batch;
    if (index.train.samples as usize) < needed {
        bail!(
            "{} holds {} training images; {} batches of {} need {needed}",
            shards.display(),
            index.train.samples,
            args.batches + 2,
            args.batch
        );
    }
    let mut rows = Vec::new();
    for &cores in &args.cores {
        let ours = ringtrain_pinned(args, &shards, cores)?;
        let theirs = match args.no_pytorch {
            true => None,
            false => Some((
                pytorch_rate(args, &reference, cores, "torchvision")?,
                pytorch_rate(args, &reference, cores, "pil")?,
            )),
        };
        rows.push((cores, ours, theirs));
    }
    print(args, &rows);
    if let Some(model) = &args.train {
        train_from_shards_and_memory(args, model, &shards, &index, scratch.path())?;
    }
    Ok(())
}

/// One rank training `model` from the shards (its images decoded and augmented by one loader thread beside
/// the step) and from the same images decoded once and held in memory: samples/s of each, from the
/// product's `ringtrain bench train` (one compute thread) run as a process.
fn train_from_shards_and_memory(
    args: &DataArgs,
    model: &str,
    shards: &Path,
    index: &DatasetIndex,
    scratch: &Path,
) -> Result<()> {
    let samples = (args.train_steps + 3) as usize * args.batch;
    anyhow::ensure!(samples <= index.train.samples as usize, "--train needs {samples} training images");
    eprintln!("decoding {samples} images once into memory ...");
    let file = scratch.join("in-memory.safetensors");
    write_decoded(shards, index, samples, args.train_size, &file)?;
    let train = |dataset: &[&std::ffi::OsStr], what: &str| -> Result<f64> {
        let mut command = Command::new(super::product());
        command.args(["bench", "train", "--model", model, "--world", "1", "--threads", "1", "--loader-threads", "1"]);
        command.args(["--batch", &args.batch.to_string(), "--steps", &args.train_steps.to_string(), "--json"]);
        command.args(dataset);
        let printed = json_lines(&mut command, what)?;
        let row = printed.iter().find(|row| row["bench"] == "train").context("bench train printed no row")?;
        row["samples_per_s"].as_f64().context("bench train printed no samples_per_s")
    };
    let on_shards = format!("shards:{}", shards.display());
    let size = args.train_size.to_string();
    let from_shards: [&std::ffi::OsStr; 4] =
        ["--dataset".as_ref(), on_shards.as_ref(), "--image-size".as_ref(), size.as_ref()];
    let from_memory: [&std::ffi::OsStr; 4] =
        ["--dataset".as_ref(), "synthetic".as_ref(), "--dataset-file".as_ref(), file.as_os_str()];
    // alternately, twice each: the machine's state moves between runs, and a figure is the better of two
    let (mut shards_rates, mut memory_rates) = (Vec::new(), Vec::new());
    for round in 1..=2 {
        shards_rates.push(train(&from_shards, &format!("training {model} from the shards (round {round} of 2)"))?);
        memory_rates.push(train(&from_memory, &format!("training {model} from memory (round {round} of 2)"))?);
    }
    let best = |rates: &[f64]| rates.iter().copied().fold(0.0, f64::max);
    let (shards_rate, memory_rate) = (best(&shards_rates), best(&memory_rates));
    if args.json {
        println!(
            "{}",
            json!({"bench": "data", "train": model, "size": args.train_size, "batch": args.batch,
            "from_shards_samples_per_s": shards_rates, "from_memory_samples_per_s": memory_rates})
        );
    } else {
        println!(
            "training {model} at {size}×{size}, batch {batch}, one rank (one compute thread; one loader thread \
             beside it), the better of two alternate runs each: {shards_rate:.1} samples/s from the shards, \
             {memory_rate:.1} from memory ({change:+.1}%); runs {shards_rates:.1?} and {memory_rates:.1?}",
            size = args.train_size,
            batch = args.batch,
            change = 100.0 * (shards_rate / memory_rate - 1.0)
        );
    }
    Ok(())
}

/// The first `samples` training images, centre-cropped to `size`, and their labels, as a safetensors data
/// set (x, y, and a one-sample test split).
fn write_decoded(shards: &Path, index: &DatasetIndex, samples: usize, size: u32, file: &Path) -> Result<()> {
    let reader = Arc::new(SplitReader::new(
        shards.to_path_buf(),
        index.train.clone(),
        ringtrain_data::shard::Layout::of(index),
        2 * WINDOW_SHARDS,
    ));
    let plan = vec![(0..samples as u64).collect()];
    let transform = Transform { size, crop: CropMode::Centre, seed: 0, epoch: 0 };
    let mut batches = Batches::start(reader, plan, transform, 2, 1);
    let batch = batches.next_batch().context("no batch")?.map_err(anyhow::Error::msg)?;
    let side = u64::from(size);
    let labels: Vec<u8> = batch.labels.iter().flat_map(|label| label.to_le_bytes()).collect();
    let image_bytes = (3 * side * side) as usize;
    let x = Named { name: "x", dtype: "U8", shape: &[samples as u64, 3, side, side], bytes: batch.images() };
    let y = Named { name: "y", dtype: "I64", shape: &[samples as u64], bytes: &labels };
    let x_test = Named { name: "x_test", shape: &[1, 3, side, side], bytes: &batch.images()[..image_bytes], ..x };
    let y_test = Named { name: "y_test", shape: &[1], bytes: &labels[..8], ..y };
    ringtrain_data::safetensors::write(file, &[x, y, x_test, y_test])
        .with_context(|| format!("cannot write {}", file.display()))
}

fn read_index(shards: &Path) -> Result<DatasetIndex> {
    let text = std::fs::read_to_string(shards.join("index.json"))
        .with_context(|| format!("{} has no index.json", shards.display()))?;
    DatasetIndex::from_json(&text).map_err(|problems| anyhow::anyhow!("{}: {}", shards.display(), problems[0]))
}

/// Both sides run confined to their first `cores` CPUs (`taskset`), every thread and process they start
/// included, so images per second per core are images per second over `cores`, whatever else the side
/// does (PyTorch's main process collating, ringtrain's consumer thread).
fn pinned(cores: usize, program: &Path) -> Command {
    let mut command = Command::new("taskset");
    command.args(["-c", &format!("0-{}", cores.max(1) - 1)]).arg(program);
    command
}

/// ringtrain's side, pinned: this binary again with `--loader-only`.
fn ringtrain_pinned(args: &DataArgs, shards: &Path, threads: usize) -> Result<Value> {
    let mut command = pinned(threads, &std::env::current_exe()?);
    command.args(["data", "--loader-only", &threads.to_string(), "--shards"]).arg(shards);
    command.args(["--size", &args.size.to_string(), "--batch", &args.batch.to_string()]);
    command.args(["--batches", &args.batches.to_string()]);
    let printed = json_lines(&mut command, &format!("ringtrain's loader, {threads} thread(s) on {threads} core(s)"))?;
    printed.last().cloned().context("the loader printed nothing")
}

/// Synthetic photographs, packed: `--images` for training and a tenth as many for the test split; as
/// `datasets pack` packs them (`shards`), and stored as they are for PyTorch's side (`shards-plain`).
fn make_shards(args: &DataArgs, scratch: &Path) -> Result<(PathBuf, PathBuf)> {
    let (train, test) = (scratch.join("train"), scratch.join("test"));
    let chroma = if args.chroma == "444" { Chroma::Full } else { Chroma::Half };
    let (shards, plain) = (scratch.join("shards"), scratch.join("shards-plain"));
    // without PyTorch's side (the device check) no copy without markers is made
    let reference = if args.no_pytorch { shards.clone() } else { plain.clone() };
    if shards.join("index.json").is_file() && reference.join("index.json").is_file() {
        return Ok((shards, reference));
    }
    let classes = 10;
    eprintln!(
        "making {} synthetic photographs of about 400×350 (4:{}) ...",
        args.images,
        if args.chroma == "444" { "4:4" } else { "2:0" }
    );
    let bytes =
        ringtrain_data::synthetic::image_folder(&train, classes, args.images.div_ceil(classes), (400, 350), chroma, 1)?;
    ringtrain_data::synthetic::image_folder(
        &test,
        classes,
        args.images.div_ceil(10 * classes).max(1),
        (400, 350),
        chroma,
        2,
    )?;
    eprintln!(
        "  {:.1} MB, {:.0} KB each; packing them ...",
        bytes as f64 / 1e6,
        bytes as f64 / 1e3 / f64::from(args.images)
    );
    let report = ringtrain_data::pack::pack(&train, Some(&test), &shards, &Default::default())?;
    eprintln!("  {} training shards ({} JPEGs with restart markers)", report.train_shards, report.restart_marked);
    if !args.no_pytorch {
        eprintln!("  packing them again as they are, for PyTorch's side ...");
        let as_they_are = ringtrain_data::pack::PackOptions { restart_markers: false, ..Default::default() };
        ringtrain_data::pack::pack(&train, Some(&test), &plain, &as_they_are)?;
    }
    Ok((shards, reference))
}

/// Images/s of ringtrain's loader with `threads` decoding threads over the first batches of epoch 0.
fn ringtrain_rate(args: &DataArgs, shards: &Path, index: &DatasetIndex, threads: usize) -> Result<Value> {
    let order = EpochOrder::new(&index.train.shard_samples(), WINDOW_SHARDS, 1, 0);
    let plan: Vec<Vec<u64>> = order
        .samples()
        .chunks_exact(args.batch)
        .take(args.batches + 2)
        .map(|c| c.iter().map(|&s| s as u64).collect())
        .collect();
    let reader = Arc::new(SplitReader::new(
        shards.to_path_buf(),
        index.train.clone(),
        ringtrain_data::shard::Layout::of(index),
        2 * WINDOW_SHARDS,
    ));
    let transform = Transform { size: args.size, crop: CropMode::RandomResized, seed: 1, epoch: 0 };
    let mut batches = Batches::start(reader, plan, transform, threads, 4);
    let mut started = Instant::now();
    for i in 0..args.batches + 2 {
        let batch = batches.next_batch().context("the loader ended early")?.map_err(anyhow::Error::msg)?;
        anyhow::ensure!(batch.labels.len() == args.batch);
        if i == 1 {
            started = Instant::now();
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let rate = (args.batches * args.batch) as f64 / seconds;
    Ok(
        json!({"impl": "ringtrain", "threads": threads, "seconds": seconds, "images_per_s": rate, "per_core": rate / threads as f64}),
    )
}

/// PyTorch's DataLoader with `decoder` (torchvision.io, or PIL as ImageFolder loads images), pinned.
fn pytorch_rate(args: &DataArgs, shards: &Path, workers: usize, decoder: &str) -> Result<Value> {
    let mut script = pinned(workers, &args.python);
    script.arg(&args.script).arg("--shards").arg(shards).args(["--decoder", decoder]);
    script.args(["--size", &args.size.to_string(), "--batch", &args.batch.to_string()]);
    script.args(["--workers", &workers.to_string(), "--batches", &args.batches.to_string()]);
    let what = format!("PyTorch's DataLoader ({decoder}), {workers} worker(s) on {workers} core(s)");
    let printed = json_lines(&mut script, &what)?;
    printed.last().cloned().context("the PyTorch side printed nothing")
}

/// Per cores: ringtrain's figure, and PyTorch's with torchvision.io and with PIL.
type Row = (usize, Value, Option<(Value, Value)>);

fn print(args: &DataArgs, rows: &[Row]) {
    let rate = |v: &Value| v["per_core"].as_f64().unwrap_or(f64::NAN);
    if args.json {
        for (cores, ours, theirs) in rows {
            let (torchvision, pil) = theirs.clone().unzip();
            println!(
                "{}",
                json!({"bench": "data", "cores": cores, "size": args.size, "batch": args.batch, "ringtrain": ours,
                    "pytorch_torchvision": torchvision, "pytorch_pil": pil})
            );
        }
        return;
    }
    println!(
        "decoded and augmented into batches of {} at {}×{} (random-resized crop + flip), images/s per core; \
         PyTorch's DataLoader decoding with torchvision.io (its fastest) and with PIL (ImageFolder's loader)",
        args.batch, args.size, args.size
    );
    println!("{:>6} {:>12} {:>16} {:>8} {:>12} {:>8}", "cores", "ringtrain", "torchvision.io", "lead", "PIL", "lead");
    for (cores, ours, theirs) in rows {
        let mine = rate(ours);
        match theirs {
            Some((torchvision, pil)) => println!(
                "{cores:>6} {mine:>12.0} {:>16.0} {:>7.2}× {:>12.0} {:>7.2}×",
                rate(torchvision),
                mine / rate(torchvision),
                rate(pil),
                mine / rate(pil)
            ),
            None => println!("{cores:>6} {mine:>12.0} {:>16} {:>8} {:>12} {:>8}", "-", "-", "-", "-"),
        }
    }
}
