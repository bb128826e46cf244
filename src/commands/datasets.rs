//! `ringtrain datasets upload | list | delete`: the team's uploaded data sets (safetensors), as
//! `POST /v1/datasets`, `GET /v1/datasets` and `DELETE /v1/datasets/{id}` handle them; and
//! `ringtrain datasets pack`, which makes a sharded data set from an image folder on this machine.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use ringtrain_views::artifacts::Dataset;

use crate::commands::artifacts::{self, created, size, Column, DeleteArgs, ListArgs, UploadArgs};
use crate::commands::{block_on, upload_parts};

#[derive(Debug, clap::Subcommand)]
pub enum Datasets {
    /// Upload a safetensors data set: `x` (or named inputs `x.NAME`) and labels `y`, optionally `x_test`
    /// and `y_test`. The server checks every tensor and prints what it found. A file larger than one part
    /// goes in parts, each checked by its sha256 and sent again when it fails; an upload that stopped goes
    /// on with `--resume ID`.
    Upload(DatasetUploadArgs),
    /// Register a sharded data set where it lies (`s3://BUCKET/PREFIX`, or a folder every node mounts, inside
    /// the team's data roots): the server reads its index and checks a sample of its shards; jobs then name
    /// it by id.
    Register(RegisterArgs),
    /// The team's data sets, newest first.
    List(ListArgs),
    /// Delete a data set that no queued or running job trains on.
    Delete(DeleteArgs),
    /// Pack an image folder (one sub-folder per class: the torchvision and ImageNet layout) into shards and
    /// their index.json (the shard format: docs/user-guide.md, "Your own data at scale"). Every image is
    /// decoded once; a file that is not a readable JPEG or PNG is named and left out. A safetensors file of
    /// named inputs (an upload's layout: x.NAME, y, optionally x_test.NAME and y_test) packs into shards of
    /// named tensors, for uploaded models.
    Pack(PackArgs),
}

#[derive(Debug, clap::Args)]
pub struct DatasetUploadArgs {
    #[command(flatten)]
    upload: UploadArgs,
    /// Send files larger than this many MiB in parts of this size (1 to 1024).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    part_mib: u64,
    /// Go on with this upload in parts (its id, printed when it started): only the parts the server does
    /// not hold are sent.
    #[arg(long)]
    resume: Option<uuid::Uuid>,
}

impl DatasetUploadArgs {
    async fn run(&self) -> Result<()> {
        let upload = &self.upload;
        let part_bytes = self.part_mib << 20;
        let size = std::fs::metadata(&upload.file).map(|m| m.len()).unwrap_or(0);
        if self.resume.is_none() && size <= part_bytes {
            return upload.upload("/v1/datasets", summary).await;
        }
        let api = upload.connection.client()?;
        let name = upload.name.clone().unwrap_or_else(|| artifacts::default_name(&upload.file));
        let stored = upload_parts::upload_in_parts(&api, &upload.file, &name, part_bytes, self.resume).await?;
        if upload.json {
            println!("{}", serde_json::to_string_pretty(&stored)?);
        } else {
            println!("{}", summary(&stored));
        }
        Ok(())
    }
}

#[derive(Debug, clap::Args)]
pub struct RegisterArgs {
    /// Where `ringtrain datasets pack`'s output lies: s3://BUCKET/PREFIX or an absolute folder.
    source: String,
    /// Its name (default: the source's last part).
    #[arg(long)]
    name: Option<String>,
    #[command(flatten)]
    connection: crate::commands::connection::Connection,
    /// Print the server's answer as JSON.
    #[arg(long)]
    json: bool,
}

impl RegisterArgs {
    async fn run(&self) -> Result<()> {
        let source = self.source.trim_end_matches('/');
        let name = self.name.clone().unwrap_or_else(|| source.rsplit('/').next().unwrap_or(source).to_string());
        let body = serde_json::json!({"name": name, "source": source});
        let stored = self.connection.client()?.register_sharded_dataset(&body).await?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&stored)?);
        } else {
            println!(
                "registered dataset {} ({}): {} training samples, {}, {} in its shards at {source}",
                stored.id,
                stored.name,
                stored.train_samples,
                labels(&stored),
                size(stored.size_bytes)
            );
        }
        Ok(())
    }
}

#[derive(Debug, clap::Args)]
pub struct PackArgs {
    /// The training images: DIR/CLASS/*.jpg|png; or a safetensors data set of named inputs.
    train: PathBuf,
    /// Where the shards and index.json go (made if missing).
    out: PathBuf,
    /// The test images, in class folders named as the training ones (e.g. ImageNet's val/ sorted into them).
    /// (A safetensors file holds its own test split, x_test and y_test, or has its last tenth held out.)
    #[arg(long)]
    test: Option<PathBuf>,
    /// Close a shard once it holds this many MiB (fractions allowed: small data sets in many shards).
    #[arg(long, default_value_t = 64.0)]
    shard_mib: f64,
    /// Seeds the shuffle of the images before they are cut into shards.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Decoding threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(datasets: Datasets) -> ExitCode {
    match datasets {
        Datasets::Upload(args) => block_on("datasets upload", args.run()),
        Datasets::Register(args) => block_on("datasets register", args.run()),
        Datasets::List(args) => block_on("datasets list", list(&args)),
        Datasets::Delete(args) => block_on("datasets delete", artifacts::delete(&args, "/v1/datasets", "dataset")),
        Datasets::Pack(args) => pack(&args),
    }
}

fn pack(args: &PackArgs) -> ExitCode {
    let mut options = ringtrain_data::pack::PackOptions {
        // at least 4 KiB: a shard is at least one sample whatever the size
        shard_bytes: (args.shard_mib * f64::from(1u32 << 20)).max(4096.0) as u64,
        seed: args.seed,
        ..Default::default()
    };
    if let Some(threads) = args.threads {
        options.threads = threads.max(1);
    }
    let packed = if args.train.is_file() {
        if args.test.is_some() {
            eprintln!("datasets pack: error: --test: a safetensors file holds its own test split (x_test, y_test)");
            return ExitCode::from(2);
        }
        eprintln!("packing the named tensors of {} into {}...", args.train.display(), args.out.display());
        ringtrain_data::pack_tensors::pack_tensors(&args.train, &args.out, &options)
    } else {
        eprintln!(
            "packing {} into {} (every image is decoded once, on {} threads)...",
            args.train.display(),
            args.out.display(),
            options.threads
        );
        ringtrain_data::pack::pack(&args.train, args.test.as_deref(), &args.out, &options)
    };
    match packed {
        Ok(report) if args.json => {
            println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Ok(report) => {
            for skipped in &report.skipped {
                println!("left out {}: {}", skipped.path.display(), skipped.why);
            }
            println!(
                "packed {} classes: {} training samples in {} shards, {} test samples in {} shards, {:.1} MiB; {} JPEG(s) \
                 stored with restart markers (the same pixels, decoded faster); {} file(s) left out; index {}",
                report.classes,
                report.train_samples,
                report.train_shards,
                report.test_samples,
                report.test_shards,
                report.bytes as f64 / f64::from(1u32 << 20),
                report.restart_marked,
                report.skipped.len(),
                report.index.display()
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("datasets pack: error: {err}");
            ExitCode::from(2)
        }
    }
}

/// What the server found in the data set.
fn summary(dataset: &Dataset) -> String {
    format!(
        "uploaded dataset {} ({}): {} training samples, {}, {}",
        dataset.id,
        dataset.name,
        dataset.train_samples,
        inputs(dataset),
        labels(dataset)
    )
}

async fn list(args: &ListArgs) -> Result<()> {
    let answer = args.connection.client()?.datasets().await?;
    let columns: [Column<Dataset>; 7] = [
        ("ID", |d| d.id.to_string()),
        ("NAME", |d| d.name.clone()),
        ("SAMPLES", |d| d.train_samples.to_string()),
        ("INPUTS", inputs),
        ("LABELS", labels),
        ("SIZE", |d| size(d.size_bytes)),
        ("CREATED", |d| created(d.created_at)),
    ];
    artifacts::print_list(args, &answer, &answer.datasets, "datasets", &columns)
}

/// Its inputs: `x [1, 28, 28]`, or the named ones.
fn inputs(dataset: &Dataset) -> String {
    match dataset.inputs.as_slice() {
        [] if dataset.source.is_some() => "images (shards)".to_string(),
        [] => format!("x {:?}", dataset.sample_shape),
        named => named.iter().map(|input| format!("x.{}", input.name)).collect::<Vec<_>>().join(" "),
    }
}

/// `3 classes`, or `values`.
fn labels(dataset: &Dataset) -> String {
    match dataset.num_classes {
        classes if classes > 0 => format!("{classes} classes"),
        _ => "values".to_string(),
    }
}
