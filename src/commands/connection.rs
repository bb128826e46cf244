//! Where the command-line client finds its server and token: the flags, else `RINGTRAIN_SERVER` /
//! `RINGTRAIN_TOKEN`, else the file `ringtrain login` wrote (`RINGTRAIN_CONFIG`, or
//! `$XDG_CONFIG_HOME/ringtrain/config.json`, or `~/.config/ringtrain/config.json`), readable by its owner
//! only. The saved token goes only to the server it was saved for: a `--server` (or `RINGTRAIN_SERVER`)
//! naming another needs its own `--token`, so a pasted command or a stray variable cannot send it elsewhere.

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
        let (server, token) = server_and_token(self.server.as_deref(), self.token.as_deref(), load()?)?;
        Ok(ApiClient::with_transport(&server, &token, &self.transport)?)
    }
}

/// The server to call and the token to call it with. A token given explicitly goes to whichever server is
/// named; the saved one only to the server it was saved for.
fn server_and_token(server: Option<&str>, token: Option<&str>, saved: Option<SavedLogin>) -> Result<(String, String)> {
    let server = server.or(saved.as_ref().map(|s| s.server.as_str())).unwrap_or(DEFAULT_SERVER).to_string();
    if let Some(token) = token {
        return Ok((server, token.to_string()));
    }
    let saved = saved.context("no token: run `ringtrain login --server URL`, or give --token (or RINGTRAIN_TOKEN)")?;
    anyhow::ensure!(
        same_server(&server, &saved.server),
        "no token for {server} (the saved login is for {}): ringtrain login --server {server}",
        saved.server
    );
    Ok((server, saved.token))
}

/// Whether two base URLs name the same server: scheme, host and port, as a URL parser reads them (so case,
/// default ports and trailing slashes do not matter). Anything unparseable is no match.
fn same_server(a: &str, b: &str) -> bool {
    match (reqwest::Url::parse(a), reqwest::Url::parse(b)) {
        (Ok(a), Ok(b)) => a.origin().is_tuple() && a.origin() == b.origin(),
        _ => false,
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
    // created afresh, so the mode below applies; `create_new` (O_EXCL) also refuses a file or symlink that
    // someone put there between the removal and the open, so the token is never written through a link
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
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

#[cfg(test)]
mod tests {
    use super::{server_and_token, SavedLogin};

    fn saved(server: &str) -> Option<SavedLogin> {
        Some(SavedLogin { server: server.into(), token: "rt_saved".into() })
    }

    #[test]
    fn the_saved_token_goes_only_to_its_own_server() {
        let here = "https://ringtrain.example:8443";
        let to = |server| server_and_token(server, None, saved(here));
        assert_eq!(to(None).unwrap(), (here.to_string(), "rt_saved".to_string()));
        // the same server written differently is still the same server
        assert_eq!(to(Some("HTTPS://Ringtrain.Example:8443/")).unwrap().1, "rt_saved");
        let elsewhere = "https://attacker.example";
        let err = to(Some(elsewhere)).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("no token for {elsewhere} (the saved login is for {here}): ringtrain login --server {elsewhere}")
        );
        for other in ["https://ringtrain.example", "http://ringtrain.example:8443", "not a url"] {
            assert!(to(Some(other)).is_err(), "{other}");
        }
    }

    #[test]
    fn an_explicit_token_goes_where_it_is_told() {
        let chosen = server_and_token(Some("https://other.example"), Some("rt_given"), saved("https://a.example"));
        assert_eq!(chosen.unwrap(), ("https://other.example".to_string(), "rt_given".to_string()));
        let err = server_and_token(None, None, None).unwrap_err().to_string();
        assert!(err.starts_with("no token: run `ringtrain login"), "{err}");
    }
}
