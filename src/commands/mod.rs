pub mod agent;
pub mod bench;
pub mod doctor;
pub mod jobs;
pub mod latency;
pub mod launch;
pub mod schedule;
pub mod serve;
pub mod train;
pub mod up;

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
    match runtime.block_on(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{who}: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
