//! `ringtrain serve`: the REST API on Postgres or embedded SQLite.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use std::future::IntoFuture;

use anyhow::Context;
use ringtrain_api::blobs::ServerBucket;
use ringtrain_api::{app, ApiConfig, AppState, ModelChecker};
use ringtrain_scheduler::LoopConfig;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, env = "RINGTRAIN_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// `postgres://...` or `sqlite:PATH`; default: SQLite in the data directory.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Where uploads (and the default SQLite database) are kept.
    #[arg(long, env = "RINGTRAIN_DATA_DIR", default_value = "ringtrain-data")]
    pub data_dir: PathBuf,
    /// The largest dataset upload, in bytes.
    #[arg(long, env = "RINGTRAIN_MAX_DATASET_BYTES", default_value_t = 512 << 20)]
    pub max_dataset_bytes: u64,
    /// The largest model upload (a TorchScript file), in bytes.
    #[arg(long, env = "RINGTRAIN_MAX_MODEL_BYTES", default_value_t = 256 << 20)]
    pub max_model_bytes: u64,
    /// Use this token as the bootstrap admin token instead of generating (and printing) one.
    #[arg(long, env = "RINGTRAIN_BOOTSTRAP_TOKEN", hide_env_values = true)]
    pub bootstrap_token: Option<String>,
    /// A folder under which `idx:PATH` datasets may lie (repeat for several; none: `idx:` is refused).
    /// Agents check the resolved path against their own --idx-root too.
    #[arg(long = "idx-root", env = "RINGTRAIN_IDX_ROOTS", value_delimiter = ',')]
    pub idx_roots: Vec<PathBuf>,
    /// The endpoint of the S3-compatible store of `shards:s3://` data sets (default: AWS's). With store
    /// credentials in this server's environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), a submission's
    /// bucket data set is checked (its index read and counted) at once; without, only the agents read it.
    #[arg(long, env = "RINGTRAIN_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// Keep uploaded datasets and models and jobs' checkpoints in this S3-compatible bucket
    /// (`s3://BUCKET/PREFIX`, through --s3-endpoint, credentials from this server's environment) instead
    /// of under --data-dir: server replicas on one Postgres database then share no disk. The data folder
    /// still receives uploads before they are kept (scratch space).
    #[arg(long, env = "RINGTRAIN_STORE")]
    pub store: Option<String>,
    /// Serve HTTPS with this certificate chain (PEM), with --tls-key.
    #[arg(long, env = "RINGTRAIN_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "RINGTRAIN_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    #[command(flatten)]
    pub limits: super::limits::LimitArgs,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[command(flatten)]
    pub slurm: super::serve_slurm::SlurmArgs,
}

/// How tenant code (model checks here; ranks on agents) is confined (see `ringtrain_sandbox`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SandboxArgs {
    /// The account model checks (and, under `up`, ranks) run as when this process runs as root: never
    /// root itself (default ringtrain-rank, which scripts/setup.sh creates).
    #[arg(long, env = "RINGTRAIN_RANK_USER")]
    pub rank_user: Option<String>,
    /// Run tenant code even where this kernel cannot confine it (no Landlock or seccomp): only for a
    /// single-team install, where every uploaded model is trusted.
    #[arg(long, env = "RINGTRAIN_ALLOW_UNSANDBOXED")]
    pub allow_unsandboxed: bool,
}

pub fn run(args: Args) -> ExitCode {
    super::block_on("serve", serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let server = Server::start(&args).await?;
    if let Some(token) = &server.bootstrap_token {
        // Printed once, on the first start against an empty database; only its hash is stored.
        println!("bootstrap admin token (shown once): {token}");
    }
    println!("listening on {}", server.url());
    server.run(shutdown_signal()).await
}

/// A server that is bound and has its database, not yet serving.
#[derive(Debug)]
pub struct Server {
    pub address: SocketAddr,
    pub state: AppState,
    /// The admin token generated on the first start against an empty database.
    pub bootstrap_token: Option<String>,
    listener: tokio::net::TcpListener,
    /// Set when serving HTTPS.
    tls: Option<axum_server::tls_rustls::RustlsConfig>,
    /// The scheduler loop's settings besides its timing.
    limits: super::limits::LimitArgs,
    /// Pauses the scheduler loop (see [`LoopConfig::paused`]).
    pub scheduler_paused: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Server {
    pub async fn start(args: &Args) -> anyhow::Result<Server> {
        if let Some(preset) = &args.bootstrap_token {
            ringtrain_api::bootstrap::check_preset(preset).map_err(anyhow::Error::msg)?;
        }
        super::private_dir(&args.data_dir)?;
        let url = args
            .database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite:{}", args.data_dir.join("ringtrain.db").display()));
        let store = ringtrain_store::connect(&url)
            .await
            .with_context(|| format!("cannot open the database {}", redact(&url)))?;
        let bootstrap_token =
            ringtrain_api::bootstrap::bootstrap(store.as_ref(), args.bootstrap_token.as_deref()).await?;
        let mut config = ApiConfig::new(&args.data_dir);
        config.max_dataset_bytes = args.max_dataset_bytes;
        config.max_model_bytes = args.max_model_bytes;
        // uploaded models are checked by this binary's `models check`, in a confined process of its own
        config.model_checker = match std::env::current_exe() {
            Ok(exe) => ModelChecker::prepare(exe, args.sandbox.rank_user.as_deref(), args.sandbox.allow_unsandboxed),
            Err(err) => Err(format!("this server cannot check models: {err}")),
        };
        if let Err(why) = &config.model_checker {
            tracing::warn!(%why, "model uploads are refused");
        }
        config.idx_roots = args.idx_roots.clone();
        config.buckets = ringtrain_api::state::BucketReads::from_environment(args.s3_endpoint.clone());
        if let Some(url) = args.store.as_deref().filter(|url| !url.is_empty()) {
            let bucket = ServerBucket::new(url, args.s3_endpoint.as_deref())
                .map_err(anyhow::Error::msg)
                .context("--store: the server's bucket")?;
            bucket.check().await.map_err(anyhow::Error::msg)?;
            tracing::info!(store = %bucket.url(), "uploads and checkpoints are kept in the bucket");
            config.store_bucket = Some(bucket);
        }
        args.limits.apply(&mut config);
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let address = listener.local_addr()?;
        let tls = match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => {
                // one crypto provider for the process: ring (see Cargo.toml)
                let _ = rustls::crypto::ring::default_provider().install_default();
                let config =
                    axum_server::tls_rustls::RustlsConfig::from_pem_file(cert, key).await.with_context(|| {
                        format!("cannot load the TLS certificate {} and key {}", cert.display(), key.display())
                    })?;
                Some(config)
            }
            _ => None,
        };
        tracing::info!(%address, database = %redact(&url), tls = tls.is_some(), "serving");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut state = AppState::new(store, config);
        if let Some(pool) = args.slurm.config(&args.data_dir, address, &format!("{scheme}://{address}"))? {
            tracing::info!(partition = %pool.partition, agents_reach = %pool.server_url, "asking Slurm for devices");
            state = state.with_slurm_pool(pool);
        }
        Ok(Server {
            address,
            state,
            bootstrap_token,
            listener,
            tls,
            limits: args.limits.clone(),
            scheduler_paused: Default::default(),
        })
    }

    /// The base URL clients use: https:// when serving TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.address)
    }

    /// Serves the API and runs the scheduler loop until `shutdown` completes. The loop is watched: if it
    /// ever ends (a panic), the server stops with an error instead of serving on without a scheduler. After
    /// `shutdown`, requests in flight have [`SHUTDOWN_GRACE`] to finish; long polls and event streams still
    /// open then are closed (agents and followers reconnect to the next server).
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let (stopping, mut stopped) = tokio::sync::watch::channel(false);
        let shutdown = async move {
            shutdown.await;
            let _ = stopping.send(true);
        };
        let forced = async move {
            let _ = stopped.wait_for(|stopping| *stopping).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        };
        let mut loop_config = LoopConfig::starting_now(self.state.config.lease);
        self.limits.apply_to_loop(&mut loop_config);
        loop_config.view = self.state.config.scheduling;
        loop_config.paused = self.scheduler_paused.clone();
        if self.state.slurm_pool.is_some() {
            // a job the agents cannot place waits for Slurm's nodes, and the Slurm pool fails what Slurm
            // will not run (ringtrain_api::slurm_pool), not the grace period
            loop_config.unplaceable_grace = std::time::Duration::MAX;
        }
        let scheduler = self.state.scheduler(loop_config);
        let mut scheduler = tokio::spawn(scheduler.run());
        let listener = tokio::spawn(self.state.clone().listen_to_other_servers());
        let retention = tokio::spawn(self.state.clone().expire_leftovers());
        let slurm_pool = tokio::spawn(self.state.clone().run_slurm_pool());
        // with each caller's address, which admission limits callers without a valid token by
        let service = app(self.state).into_make_service_with_connect_info::<SocketAddr>();
        let serving: std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<()>> + Send>> = match self.tls {
            None => Box::pin(axum::serve(self.listener, service).with_graceful_shutdown(shutdown).into_future()),
            Some(tls) => {
                let handle = axum_server::Handle::new();
                let stopper = handle.clone();
                tokio::spawn(async move {
                    shutdown.await;
                    stopper.graceful_shutdown(Some(SHUTDOWN_GRACE));
                });
                let listener = self.listener.into_std()?;
                Box::pin(axum_server::from_tcp_rustls(listener, tls).handle(handle).serve(service))
            }
        };
        let result = tokio::select! {
            served = serving => served.context("the server failed"),
            () = forced => {
                tracing::info!("requests still open {} s after the stop: closing them", SHUTDOWN_GRACE.as_secs());
                Ok(())
            }
            ended = &mut scheduler => Err(anyhow::anyhow!("the scheduler loop ended: {ended:?}")),
        };
        scheduler.abort();
        listener.abort();
        retention.abort();
        slurm_pool.abort();
        result
    }
}

/// How long requests in flight may take to finish after a stop.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// The database URL without its password, for the log.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}://***@{}", &url[..scheme], &url[at + 1..]),
        _ => url.to_string(),
    }
}

/// Ctrl-C or SIGTERM: stop accepting, let in-flight requests finish.
pub async fn shutdown_signal() {
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
