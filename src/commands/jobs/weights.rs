//! `jobs weights ID -o FILE`: a job's trained weights, as TorchScript (`.pt`, for an uploaded model) or as
//! a safetensors state dict (`.safetensors`, for every job), from its final checkpoint or a named one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use uuid::Uuid;

use crate::commands::connection::Connection;
use crate::commands::ids::{resolve, IdArg, Kind};

#[derive(Debug, clap::Args)]
pub struct WeightsArgs {
    /// The job's id, or the start of it (`76acc08f`).
    id: IdArg,
    /// Where to write them: `.pt` for TorchScript (an uploaded model, loaded with `torch.jit.load`), or
    /// `.safetensors` for the state dict.
    #[arg(short, long)]
    output: PathBuf,
    /// A checkpoint's id (`GET /v1/jobs/ID/checkpoints`). Default: the final weights, else the newest
    /// checkpoint of a job still training.
    #[arg(long)]
    checkpoint: Option<Uuid>,
    #[command(flatten)]
    connection: Connection,
}

/// The file of a checkpoint that an output name asks for.
fn member(output: &Path) -> Result<&'static str> {
    match output.extension().and_then(|e| e.to_str()) {
        Some("pt") => Ok("model.pt"),
        Some("safetensors") => Ok("model.safetensors"),
        _ => bail!("--output {}: name a .pt (TorchScript) or a .safetensors (state dict) file", output.display()),
    }
}

pub async fn weights(args: &WeightsArgs) -> Result<()> {
    let file = member(&args.output)?;
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?;
    let checkpoint = match args.checkpoint {
        Some(id) => id.to_string(),
        None => {
            let checkpoints = api.job_checkpoints(&id.to_string()).await?.checkpoints;
            // oldest first: the final one if the job finished, else the newest
            let chosen = checkpoints.iter().find(|c| c.is_final).or(checkpoints.last());
            chosen.with_context(|| format!("job {id} has no checkpoint yet"))?.id.to_string()
        }
    };
    let route = format!("/v1/jobs/{id}/checkpoints/{checkpoint}/weights/{file}");
    let sha256 = api.download(&route, &args.output, None, Duration::from_secs(3600)).await?;
    println!("wrote {} (checkpoint {checkpoint}, sha256 {sha256})", args.output.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_output_name_picks_the_file() {
        let member = |name: &str| super::member(std::path::Path::new(name)).map_err(|e| e.to_string());
        assert_eq!(member("trained.pt"), Ok("model.pt"));
        assert_eq!(member("out/w.safetensors"), Ok("model.safetensors"));
        assert!(member("trained.bin").unwrap_err().contains("name a .pt (TorchScript) or a .safetensors"));
    }
}
