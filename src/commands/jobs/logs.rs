//! `ringtrain jobs logs ID`: what a job's ranks printed, optionally following it until it ends.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use ringtrain_core::JobState;

use crate::commands::connection::{encode, Connection};
use crate::commands::ids::{resolve, IdArg, Kind};

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// The job's id, or the start of it (`76acc08f`).
    id: IdArg,
    #[command(flatten)]
    connection: Connection,
    /// Only this rank's lines.
    #[arg(long)]
    rank: Option<u32>,
    /// Only this placement's lines (the `placement` of the job's events).
    #[arg(long)]
    placement: Option<u32>,
    /// Only lines containing this text (case-sensitive).
    #[arg(long)]
    grep: Option<String>,
    /// Keep printing new lines until the job has ended.
    #[arg(long, short)]
    follow: bool,
}

/// Prints the job's lines page by page (`[rank R, placement P] line`), and with `--follow` goes on until
/// the job has ended and no line is left.
pub async fn logs(args: &LogsArgs) -> Result<()> {
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?;
    let mut filters = String::new();
    if let Some(rank) = args.rank {
        filters += &format!("&rank={rank}");
    }
    if let Some(placement) = args.placement {
        filters += &format!("&attempt={placement}");
    }
    if let Some(text) = &args.grep {
        filters += &format!("&q={}", encode(text));
    }
    let (id, mut since) = (id.to_string(), 0);
    loop {
        // the job's state before its lines: a line stored after this read is still fetched below
        let ended = args.follow
            && matches!(api.job(&id).await?.state, JobState::Succeeded | JobState::Failed | JobState::Cancelled);
        let page = api.job_logs(&id, &format!("since={since}&limit=5000{filters}")).await?;
        let mut out = std::io::stdout().lock();
        for line in &page.lines {
            let _ = writeln!(out, "[rank {}, placement {}] {}", line.rank, line.attempt, line.line);
        }
        since = page.next_since;
        if page.lines.len() == 5000 {
            continue;
        }
        if !args.follow || ended {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
