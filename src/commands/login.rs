//! `ringtrain login --server URL`: checks a token against the server and saves both, readable by the owner
//! only, for the other commands (`RINGTRAIN_SERVER` / `RINGTRAIN_TOKEN` and the flags still win).

use std::io::BufRead;

use anyhow::{Context, Result};
use ringtrain_client::ApiClient;
use serde_json::Value;

use super::connection::{save, SavedLogin};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The server's base URL.
    #[arg(long, env = "RINGTRAIN_SERVER")]
    server: String,
    /// The token (default: read from the first line of standard input, so it stays out of the shell's
    /// history).
    #[arg(long, env = "RINGTRAIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    transport: ringtrain_client::Transport,
}

pub async fn run(args: Args) -> Result<()> {
    let token = match args.token {
        Some(token) => token,
        None => {
            eprintln!("token:");
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).context("cannot read the token")?;
            line.trim().to_string()
        }
    };
    anyhow::ensure!(!token.is_empty(), "no token given");
    let api = ApiClient::with_transport(&args.server, &token, &args.transport)?;
    // a token the server knows and that may read its team's jobs
    let _: Value = api.get("/v1/jobs?limit=1").await.context("the server refused the token")?;
    let path = save(&SavedLogin { server: args.server.clone(), token })?;
    println!("signed in to {}; saved in {}", args.server, path.display());
    Ok(())
}
