//! Where the command-line client finds its server and token: the flags, else `RINGTRAIN_SERVER` /
//! `RINGTRAIN_TOKEN`, else the file `ringtrain login` wrote (`RINGTRAIN_CONFIG`, or
//! `$XDG_CONFIG_HOME/ringtrain/config.json`, or `~/.config/ringtrain/config.json`), readable by its owner
//! only.

use std::path::PathBuf;

use anyhow::{Context, Result};
use ringtrain_client::ApiClient;
use serde::{Deserialize, Serialize};

/// The server's URL when nothing names one: `ringtrain up`'s default.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// The server's base URL (default: the one `ringtrain login` saved, else http://127.0.0.1:8080).
    #[arg(long, env = "RINGTRAIN_SERVER")]
    server: Option<String>,
    /// A token of your team (default: the one `ringtrain login` saved).
    #[arg(long, env = "RINGTRAIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    transport: ringtrain_client::Transport,
}

/// What `ringtrain login` keeps.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedLogin {
    pub server: String,
    pub token: String,
}

impl Connection {
    /// A client for the server and token these flags, the environment or the saved login name.
    pub fn client(&self) -> Result<ApiClient> {
        let saved = load()?;
        let server = self
            .server
            .clone()
            .or_else(|| saved.as_ref().map(|s| s.server.clone()))
            .unwrap_or_else(|| DEFAULT_SERVER.to_string());
        let token = self
            .token
            .clone()
            .or_else(|| saved.map(|s| s.token))
            .context("no token: run `ringtrain login --server URL`, or give --token (or RINGTRAIN_TOKEN)")?;
        Ok(ApiClient::with_transport(&server, &token, &self.transport)?)
    }
}

/// The saved login's path.
pub fn config_path() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("RINGTRAIN_CONFIG") {
        return Ok(PathBuf::from(path));
    }
    let base = match std::env::var_os("XDG_CONFIG_HOME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            PathBuf::from(std::env::var_os("HOME").context("neither HOME nor XDG_CONFIG_HOME is set")?).join(".config")
        }
    };
    Ok(base.join("ringtrain").join("config.json"))
}

/// The saved login, if there is one.
pub fn load() -> Result<Option<SavedLogin>> {
    let path = config_path()?;
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(
            serde_json::from_slice(&bytes).with_context(|| format!("{} is not a ringtrain login", path.display()))?,
        )),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Saves a login, readable and writable by its owner only (the file is created with mode 0600, never
/// widened after the token is in it).
pub fn save(login: &SavedLogin) -> Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = config_path()?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let temporary = path.with_extension("json.tmp");
    // created afresh, so the mode below applies
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    file.write_all(&serde_json::to_vec_pretty(login)?)?;
    file.sync_all()?;
    std::fs::rename(&temporary, &path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// `text` as a URL query value.
pub fn encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}
