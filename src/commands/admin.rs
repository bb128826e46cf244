//! `ringtrain admin`: what only the server's host can do, straight on the server's database. No token is
//! asked for: whoever can open the database (its file, or its credentials) already holds everything a
//! token guards.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

#[derive(Debug, clap::Subcommand)]
pub enum Admin {
    /// Make a new platform admin token (a lost one cannot be recovered: only its hash is stored) and
    /// revoke every other platform token. Run it on the server host; a running server accepts the new token
    /// at once.
    ResetToken(ResetTokenArgs),
}

#[derive(Debug, clap::Args)]
pub struct ResetTokenArgs {
    /// The server's database: `postgres://...` or `sqlite:PATH` (default: SQLite in the data directory).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// The server's data directory (`ringtrain up` keeps its admin token there too, and it is rewritten).
    #[arg(long, env = "RINGTRAIN_DATA_DIR", default_value = "ringtrain-data")]
    data_dir: PathBuf,
    /// Keep the other platform tokens working (by default they are revoked: a lost token may be in
    /// someone else's hands).
    #[arg(long)]
    keep_others: bool,
}

pub fn run(admin: Admin) -> ExitCode {
    match admin {
        Admin::ResetToken(args) => super::block_on("admin reset-token", reset_token(args)),
    }
}

async fn reset_token(args: ResetTokenArgs) -> Result<()> {
    let url = match &args.database_url {
        Some(url) => url.clone(),
        None => {
            let file = args.data_dir.join("ringtrain.db");
            // never a fresh, empty database where the operator mistyped the folder
            if !file.exists() {
                bail!("no database at {} (give --data-dir or --database-url of the server)", file.display());
            }
            format!("sqlite:{}", file.display())
        }
    };
    let store = ringtrain_store::connect(&url)
        .await
        .with_context(|| format!("cannot open the database {}", super::serve::redact(&url)))?;
    let reset = ringtrain_api::bootstrap::reset_admin_token(store.as_ref(), !args.keep_others).await?;
    let up_token = args.data_dir.join("admin-token");
    let rewritten = rewrite_up_token(&up_token, &reset.token)?;
    println!("platform admin token (shown once): {}", reset.token);
    if args.keep_others {
        println!("the other platform tokens still work");
    } else {
        println!("revoked {} other platform token(s)", reset.revoked);
    }
    if rewritten {
        println!("written to {} for ringtrain up", up_token.display());
    }
    Ok(())
}

/// `ringtrain up` presets its admin token from DATA_DIR/admin-token on every start: where that file is,
/// it gets the new token (else up would keep printing the revoked one).
fn rewrite_up_token(path: &Path, token: &str) -> Result<bool> {
    if !path.exists() {
        return Ok(false);
    }
    super::write_secret(path, &format!("{token}\n"))?;
    Ok(true)
}
