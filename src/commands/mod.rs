pub mod admin;
pub mod agent;
pub mod artifacts;
pub mod bench;
pub mod connection;
pub mod datasets;
pub mod doctor;
pub mod ids;
pub mod jobs;
pub mod launch;
pub mod limits;
pub mod login;
pub mod models;
pub mod pool;
pub mod schedule;
pub mod self_test;
pub mod serve;
pub mod serve_slurm;
pub mod study;
pub mod train;
pub mod up;
pub mod upload_parts;

use std::process::ExitCode;

/// Runs an async command on a multi-threaded runtime; an error is printed as `WHO: error: ...`.
pub fn block_on(who: &str, command: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("{who}: error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(command);
    // Dropping the runtime would wait for every blocking task still working (a long checkpoint tar, a
    // dataset parse): a stop must not hang on one.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        // `ringtrain jobs metrics ID | head`: the reader has what it wanted; saying so would be noise
        Err(err) if is_closed_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{who}: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether writing the output failed because its reader closed the pipe.
fn is_closed_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Creates `dir` (and its parents) readable by this user only (0700), and tightens it if it exists: the
/// server's data directory holds tokens, the database, datasets and weights.
pub fn private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot make {} private", dir.display()))
}

/// Writes a secret file readable by this user only, atomically: created 0600 under a temporary name, then
/// renamed, so it is never visible with wider permissions or half written.
pub fn write_secret(path: &std::path::Path, contents: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let partial = path.with_extension(format!("part-{}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .with_context(|| format!("cannot write {}", partial.display()))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&partial, path).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &std::path::Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_data_dir_is_private_and_secrets_are_0600() {
        let base = std::env::temp_dir().join(format!("ringtrain-private-{}", std::process::id()));
        let dir = base.join("data");
        super::private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        // an existing, world-readable folder is tightened
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        super::private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        let token = dir.join("admin-token");
        super::write_secret(&token, "rt_x\n").unwrap();
        assert_eq!(mode(&token), 0o600);
        assert_eq!(std::fs::read_to_string(&token).unwrap(), "rt_x\n");
        super::write_secret(&token, "rt_y\n").unwrap();
        assert_eq!(std::fs::read_to_string(&token).unwrap(), "rt_y\n");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no partial file left");
        std::fs::remove_dir_all(base).unwrap();
    }
}
