//! `ringtrain preview`, `nodes`, `teams`, `tokens`: the rest of the API from the terminal, human tables by
//! default and `--json` for scripts.

use std::path::PathBuf;

use anyhow::{Context, Result};
use ringtrain_views::nodes::DeviceView;
use serde_json::{json, Value};
use uuid::Uuid;

use super::connection::Connection;
use super::jobs::table;

#[derive(Debug, clap::Args)]
pub struct PreviewArgs {
    /// The job spec, a JSON file.
    file: PathBuf,
    /// Worker counts to compare, e.g. 1,8,32 (what linear scaling and warmup do at each).
    #[arg(long, default_value = "1,8,32")]
    workers: String,
    #[command(flatten)]
    connection: Connection,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Subcommand)]
pub enum Nodes {
    /// The worker pool: each node's state, devices and last heartbeat.
    List(ListArgs),
}

#[derive(Debug, clap::Subcommand)]
pub enum Teams {
    /// Teams (a platform admin: every team; a team admin: its own).
    List(ListArgs),
    /// Create a team (platform admin).
    Create(CreateTeamArgs),
}

#[derive(Debug, clap::Subcommand)]
pub enum Tokens {
    /// Make a token for a team (shown once).
    Create(CreateTokenArgs),
    /// A team's tokens: role, label, when made and last used, expiry, revoked (never the secret).
    List(TeamArgs),
    /// Revoke a token: the next request with it is refused.
    Revoke(RevokeArgs),
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    connection: Connection,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct CreateTeamArgs {
    /// 1 to 64 characters: lowercase letters, digits, `-` and `_`.
    name: String,
    /// GPUs its jobs are guaranteed.
    #[arg(long, default_value_t = 0)]
    gpus: u32,
    /// CPU slots its jobs are guaranteed.
    #[arg(long, default_value_t = 0)]
    cpus: u32,
    #[command(flatten)]
    connection: Connection,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct TeamArgs {
    /// The team's id.
    team: Uuid,
    #[command(flatten)]
    connection: Connection,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct CreateTokenArgs {
    /// The team's id.
    team: Uuid,
    /// admin, member or viewer.
    #[arg(long, default_value = "member")]
    role: String,
    /// Who or what it is for.
    #[arg(long)]
    label: Option<String>,
    #[command(flatten)]
    connection: Connection,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct RevokeArgs {
    /// The token's id (from `tokens list`).
    id: Uuid,
    #[command(flatten)]
    connection: Connection,
}

fn print_json(answer: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(answer)?);
    Ok(())
}

/// A moment to the second, as the tables show it: `2026-12-07T14:51:27`.
fn time_text(at: chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%S").to_string()
}

pub async fn preview(args: &PreviewArgs) -> Result<()> {
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(&args.file).with_context(|| format!("cannot read {}", args.file.display()))?,
    )
    .with_context(|| format!("{} is not JSON", args.file.display()))?;
    let answer = args.connection.client()?.preview_schedules(&spec, &args.workers).await?;
    if args.json {
        return print_json(&answer);
    }
    let rows: Vec<Vec<String>> = answer
        .schedules
        .iter()
        .map(|s| {
            let e = &s.schedule.effective;
            vec![
                s.workers.to_string(),
                e.global_batch.to_string(),
                e.scaled_lr.to_string(),
                match e.warmup_skipped {
                    Some(_) => "0 (skipped)".to_string(),
                    None => e.warmup_iterations.to_string(),
                },
                e.iterations_per_epoch.to_string(),
                e.total_iterations.to_string(),
            ]
        })
        .collect();
    print!("{}", table(&["WORKERS", "GLOBAL BATCH", "LR", "WARMUP ITERS", "ITERS/EPOCH", "ITERS"], &rows));
    for schedule in &answer.schedules {
        if let Some(why) = &schedule.schedule.effective.warmup_skipped {
            println!("k = {}: {why}", schedule.workers);
        }
    }
    Ok(())
}

pub async fn nodes(command: &Nodes) -> Result<()> {
    let Nodes::List(args) = command;
    let answer = args.connection.client()?.nodes().await?;
    if args.json {
        return print_json(&answer);
    }
    let rows: Vec<Vec<String>> = answer
        .nodes
        .iter()
        .map(|node| {
            let count = |kind: &str| node.devices.iter().filter(|d| d.kind == kind).count();
            vec![
                node.name.clone(),
                node.state.clone(),
                format!("{} gpu, {} cpu", count("gpu"), count("cpu")),
                node.devices.iter().filter_map(holder).collect::<Vec<_>>().join(", "),
                node.address.clone().unwrap_or_default(),
                time_text(node.last_heartbeat),
                node.id.to_string(),
            ]
        })
        .collect();
    print!("{}", table(&["NAME", "STATE", "DEVICES", "HELD BY", "ADDRESS", "LAST HEARTBEAT", "ID"], &rows));
    Ok(())
}

/// `gpu 0: alpha/resnet-8k r3` for a device of the caller's own team's job, `cpu 1: beta` for another
/// team's; None for a free device.
fn holder(device: &DeviceView) -> Option<String> {
    let held = device.held_by.as_ref()?;
    let rank = held.rank.map_or_else(String::new, |rank| rank.to_string());
    let job = match (&held.job_name, &held.job_id) {
        (Some(name), _) => format!("/{name} r{rank}"),
        (None, Some(id)) => format!("/{id} r{rank}"),
        (None, None) => String::new(),
    };
    Some(format!("{} {}: {}{job}", device.kind, device.index, held.team_name))
}

pub async fn teams(command: &Teams) -> Result<()> {
    match command {
        Teams::List(args) => {
            let answer = args.connection.client()?.teams().await?;
            if args.json {
                return print_json(&answer);
            }
            let rows: Vec<Vec<String>> = answer
                .teams
                .iter()
                .map(|t| {
                    vec![
                        t.name.clone(),
                        t.gpu_quota.to_string(),
                        t.cpu_quota.to_string(),
                        t.weight.to_string(),
                        t.budget
                            .map_or_else(String::new, |b| format!("{} device-h/{}", b.device_hours, b.period.as_str())),
                        t.id.to_string(),
                    ]
                })
                .collect();
            print!("{}", table(&["NAME", "GPUS", "CPUS", "WEIGHT", "BUDGET", "ID"], &rows));
            Ok(())
        }
        Teams::Create(args) => {
            let body = json!({"name": args.name, "gpu_quota": args.gpus, "cpu_quota": args.cpus});
            let team = args.connection.client()?.create_team(&body).await?;
            if args.json {
                return print_json(&team);
            }
            println!("created team {} ({})", team.name, team.id);
            Ok(())
        }
    }
}

pub async fn tokens(command: &Tokens) -> Result<()> {
    match command {
        Tokens::Create(args) => {
            let body = json!({"role": args.role, "label": args.label});
            let answer = args.connection.client()?.create_team_token(&args.team.to_string(), &body).await?;
            if args.json {
                return print_json(&answer);
            }
            println!("{}", answer.token);
            eprintln!("(shown once: keep it now; its id is {})", answer.info.id);
            Ok(())
        }
        Tokens::List(args) => {
            let answer = args.connection.client()?.team_tokens(&args.team.to_string()).await?;
            if args.json {
                return print_json(&answer);
            }
            let when = |at: Option<chrono::DateTime<chrono::Utc>>| at.map_or_else(String::new, time_text);
            let rows: Vec<Vec<String>> = answer
                .tokens
                .iter()
                .map(|t| {
                    vec![
                        t.id.to_string(),
                        t.role.as_str().to_string(),
                        t.label.clone().unwrap_or_default(),
                        time_text(t.created_at),
                        when(t.last_used_at),
                        if t.revoked_at.is_none() { String::new() } else { "revoked".into() },
                    ]
                })
                .collect();
            print!("{}", table(&["ID", "ROLE", "LABEL", "CREATED", "LAST USED", ""], &rows));
            Ok(())
        }
        Tokens::Revoke(args) => {
            args.connection.client()?.delete(&format!("/v1/tokens/{}", args.id)).await?;
            println!("revoked {}", args.id);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringtrain_core::{DeviceId, JobId, TeamId};
    use ringtrain_views::nodes::DeviceHolder;

    #[test]
    fn a_device_shows_its_holder_as_much_as_the_caller_may_see() {
        let device = |held_by| DeviceView {
            id: DeviceId(Uuid::nil()),
            index: 3,
            kind: "gpu".into(),
            name: "H100".into(),
            memory_bytes: None,
            held_by,
        };
        let held = |job_id, job_name: Option<&str>, rank| DeviceHolder {
            team_id: TeamId(Uuid::nil()),
            team_name: "alpha".into(),
            job_id,
            job_name: job_name.map(String::from),
            rank,
        };
        assert_eq!(holder(&device(None)), None);
        let own = held(Some(JobId(Uuid::nil())), Some("resnet-8k"), Some(2));
        assert_eq!(holder(&device(Some(own))).unwrap(), "gpu 3: alpha/resnet-8k r2");
        let unnamed = held(Some(JobId(Uuid::nil())), None, Some(0));
        assert_eq!(holder(&device(Some(unnamed))).unwrap(), format!("gpu 3: alpha/{} r0", Uuid::nil()));
        assert_eq!(holder(&device(Some(held(None, None, None)))).unwrap(), "gpu 3: alpha");
    }
}
