//! `ringtrain serve`: the REST API on Postgres or embedded SQLite.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use ringtrain_api::{app, ApiConfig, AppState};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, env = "RINGTRAIN_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// `postgres://...` or `sqlite:PATH`; default: SQLite in the data directory.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Where uploads (and the default SQLite database) are kept.
    #[arg(long, env = "RINGTRAIN_DATA_DIR", default_value = "ringtrain-data")]
    data_dir: PathBuf,
    /// The largest dataset upload, in bytes.
    #[arg(long, env = "RINGTRAIN_MAX_DATASET_BYTES", default_value_t = 512 << 20)]
    max_dataset_bytes: u64,
    /// Use this token as the bootstrap admin token instead of generating (and printing) one.
    #[arg(long, env = "RINGTRAIN_BOOTSTRAP_TOKEN", hide_env_values = true)]
    bootstrap_token: Option<String>,
}

pub fn run(args: Args) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create the data directory {}", args.data_dir.display()))?;
    let url =
        args.database_url.clone().unwrap_or_else(|| format!("sqlite:{}", args.data_dir.join("ringtrain.db").display()));
    let store = ringtrain_store::connect(&url).await.with_context(|| format!("cannot open the database {url}"))?;
    if let Some(token) = ringtrain_api::bootstrap::bootstrap(store.as_ref(), args.bootstrap_token.as_deref()).await? {
        // Printed once, on the first start against an empty database; only its hash is stored.
        println!("bootstrap admin token (shown once): {token}");
    }
    let mut config = ApiConfig::new(&args.data_dir);
    config.max_dataset_bytes = args.max_dataset_bytes;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr()?;
    println!("listening on http://{address}");
    tracing::info!(%address, database = %redact(&url), "serving");
    axum::serve(listener, app(AppState::new(store, config))).with_graceful_shutdown(shutdown_signal()).await?;
    Ok(())
}

/// The database URL without its password, for the log.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}://***@{}", &url[..scheme], &url[at + 1..]),
        _ => url.to_string(),
    }
}

/// Ctrl-C or SIGTERM: stop accepting, let in-flight requests finish.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
