//! `jobs submit`, `jobs list`, `jobs show`, `jobs cancel`: the job routes as commands.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::{json, Value};
use uuid::Uuid;

use super::watch::{watch, WatchArgs};
use crate::commands::connection::{encode, Connection};
use crate::commands::ids::{resolve, IdArg, Kind};

#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    /// The job spec, a JSON file (see examples/).
    file: PathBuf,
    #[command(flatten)]
    connection: Connection,
    /// Store nothing: print what the scheduler would do with the job now.
    #[arg(long)]
    dry_run: bool,
    /// Follow the job until it ends (exit status 0 only when it succeeded).
    #[arg(long, conflicts_with = "dry_run")]
    watch: bool,
    /// Print the server's answer as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    connection: Connection,
    /// Only jobs in this state: queued, scheduled, running, succeeded, failed, cancelled, stopped.
    #[arg(long)]
    state: Option<String>,
    /// Only jobs whose name starts with this.
    #[arg(long)]
    name: Option<String>,
    /// Only jobs with this tag.
    #[arg(long)]
    tag: Option<String>,
    /// Only jobs whose name or note holds this text (ASCII case ignored).
    #[arg(long)]
    search: Option<String>,
    /// At most this many (1 to 500).
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Print the server's answer as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// The job's id, or the start of it (`76acc08f`).
    pub(super) id: IdArg,
    #[command(flatten)]
    pub(super) connection: Connection,
    /// Print the server's answer as JSON.
    #[arg(long)]
    pub(super) json: bool,
}

/// Submits the file; true unless `--watch` saw the job end other than succeeded.
pub async fn submit(args: &SubmitArgs) -> Result<bool> {
    let text = std::fs::read_to_string(&args.file).with_context(|| format!("cannot read {}", args.file.display()))?;
    let spec: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", args.file.display()))?;
    let api = args.connection.client()?;
    let path = if args.dry_run { "/v1/jobs?dry_run=true" } else { "/v1/jobs" };
    let answer: Value = api.post(path, &spec).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
    } else if args.dry_run {
        println!("{}: {}", answer["verdict"].as_str().unwrap_or("?"), answer["message"].as_str().unwrap_or(""));
        if let Some(basis) = answer["estimated_start"]["basis"].as_str() {
            println!("estimated start: {basis}");
        }
    } else {
        let effective = &answer["effective"];
        println!(
            "submitted {} ({}): {}; {} workers x {} = global batch {}, lr {}",
            answer["id"].as_str().unwrap_or("?"),
            answer["name"].as_str().unwrap_or("unnamed"),
            answer["state"].as_str().unwrap_or("?"),
            effective["workers"],
            effective["per_worker_batch"],
            effective["global_batch"],
            effective["scaled_lr"]
        );
    }
    if !args.watch {
        return Ok(true);
    }
    let id: Uuid = answer["id"].as_str().and_then(|id| id.parse().ok()).context("the answer has no job id")?;
    watch(&WatchArgs { id: IdArg::from(id), connection: args.connection.clone(), every_s: 1.0 }).await
}

pub async fn list(args: &ListArgs) -> Result<()> {
    let api = args.connection.client()?;
    let mut query = format!("/v1/jobs?limit={}", args.limit);
    if let Some(state) = &args.state {
        query += &format!("&state={}", encode(state));
    }
    if let Some(name) = &args.name {
        query += &format!("&name_prefix={}", encode(name));
    }
    if let Some(tag) = &args.tag {
        query += &format!("&tag={}", encode(tag));
    }
    if let Some(text) = &args.search {
        query += &format!("&q={}", encode(text));
    }
    let page: Value = api.get(&query).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    let jobs = page["jobs"].as_array().cloned().unwrap_or_default();
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|job| {
            let waits = match (job["queue_position"].as_i64(), job["pending_reason"]["code"].as_str()) {
                (Some(position), Some(code)) => format!("#{position} {code}"),
                (None, Some(code)) => code.to_string(),
                _ => outcome(job).or_else(|| progress(&job["progress"])).unwrap_or_default(),
            };
            vec![
                job["id"].as_str().unwrap_or("").to_string(),
                job["name"].as_str().unwrap_or("").to_string(),
                job["state"].as_str().unwrap_or("").to_string(),
                devices(job),
                job["created_at"].as_str().unwrap_or("").chars().take(19).collect(),
                waits,
            ]
        })
        .collect();
    print!("{}", table(&["ID", "NAME", "STATE", "DEVICES", "CREATED", "WAITING / PROGRESS / OUTCOME"], &rows));
    if jobs.is_empty() {
        println!("(no jobs)");
    }
    Ok(())
}

/// How an ended job ended, in one line: `test error 13.09%, 2 min 31 s` for a success, the first line of
/// the error for a failure, with how long it ran; None while it has not ended.
fn outcome(job: &Value) -> Option<String> {
    let ran = match (job["started_at"].as_str(), job["finished_at"].as_str()) {
        (Some(start), Some(end)) => {
            let start = chrono::DateTime::parse_from_rfc3339(start).ok()?;
            let end = chrono::DateTime::parse_from_rfc3339(end).ok()?;
            Some(duration_text((end - start).num_seconds().max(0)))
        }
        _ => None,
    };
    let after = |text: String| match &ran {
        Some(ran) => format!("{text}, {ran}"),
        None => text,
    };
    match job["state"].as_str()? {
        "succeeded" => {
            let error = job["result"]["final_test_error"].as_f64();
            Some(after(error.map_or_else(|| "succeeded".into(), |e| format!("test error {:.2}%", e * 100.0))))
        }
        "failed" => Some(after(job["error"].as_str().and_then(|e| e.lines().next()).unwrap_or("failed").to_string())),
        "cancelled" => Some(after("cancelled".into())),
        _ => None,
    }
}

/// `45 s`, `2 min 31 s`, `3 h 05 min`.
fn duration_text(seconds: i64) -> String {
    match seconds {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min {:02} s", s / 60, s % 60),
        s => format!("{} h {:02} min", s / 3600, s % 3600 / 60),
    }
}

/// A running job's progress, e.g. `iteration 120 of 1875 (6%), epoch 1, loss 0.6120, 2405 samples/s, 3%
/// all-reduce`; None when the view has none.
fn progress(progress: &Value) -> Option<String> {
    let done = progress["iterations_done"].as_i64()?;
    let mut text = format!("iteration {done}");
    if let Some(total) = progress["total_iterations"].as_i64().filter(|t| *t > 0) {
        text += &format!(" of {total} ({:.0}%)", done as f64 * 100.0 / total as f64);
    }
    text += &format!(", epoch {}", progress["epoch"].as_i64().unwrap_or(0) + 1);
    if let Some(loss) = progress["loss"].as_f64() {
        text += &format!(", loss {loss:.4}");
    }
    if let Some(rate) = progress["samples_per_s"].as_f64() {
        text += &format!(", {rate:.0} samples/s");
    }
    if let Some(share) = progress["allreduce_share"].as_f64() {
        text += &format!(", {:.0}% all-reduce", share * 100.0);
    }
    if let Some(left) = progress["seconds_left"].as_f64() {
        text += &format!(", about {} left", duration_text(left.round() as i64));
    }
    Some(text)
}

/// Where rank 0's time went (the result's `timeline`), as shares of its training wall time, and its
/// start-up apart: `steps 93.6%, evaluation 6.3%, checkpoints 0.0%, reporting 0.0%, other 0.1%; start-up 0.6 s`.
/// None for a run recorded before results carried a timeline.
fn timeline(timeline: &Value) -> Option<String> {
    let parts = [
        ("steps", "train_steps_s"),
        ("evaluation", "evaluation_s"),
        ("checkpoints", "checkpoint_s"),
        ("reporting", "reporting_s"),
        ("other", "other_s"),
    ];
    let seconds: Vec<f64> = parts.iter().map(|(_, key)| timeline[*key].as_f64()).collect::<Option<_>>()?;
    let total = seconds.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    let shares: Vec<String> =
        parts.iter().zip(&seconds).map(|((name, _), s)| format!("{name} {:.1}%", s / total * 100.0)).collect();
    let start_up = timeline["start_up_s"].as_f64().map_or_else(String::new, |s| format!("; start-up {s:.1} s"));
    Some(format!("{}{start_up}", shares.join(", ")))
}

/// The device count of each placement, over time: `4 (31 s, preempted) → 2 (55 s) → 4 (running)`; None
/// before the first.
fn placements(placements: &Value) -> Option<String> {
    let list = placements.as_array().filter(|l| !l.is_empty())?;
    let parts: Vec<String> = list
        .iter()
        .map(|p| {
            let ended = p["ended"].as_str().unwrap_or("?");
            let wall = duration_text(p["wall_seconds"].as_f64().unwrap_or(0.0).round() as i64);
            match ended {
                "running" => format!("{} (running, {wall})", p["devices"]),
                _ => format!("{} ({wall}, {ended})", p["devices"]),
            }
        })
        .collect();
    Some(parts.join(" → "))
}

/// What a job used: `41.3 device-seconds, peak memory 212 MiB per rank, 1.9 CPU cores`; None before it
/// was placed.
fn resources(used: &Value) -> Option<String> {
    let mut text = format!("{:.1} device-seconds", used["device_seconds"].as_f64()?);
    if let Some(bytes) = used["peak_rss_bytes"].as_f64() {
        text += &format!(", peak memory {:.0} MiB per rank", bytes / f64::from(1 << 20));
    }
    if let Some(cores) = used["cpu_cores"].as_f64() {
        text += &format!(", {cores:.1} CPU cores busy");
    }
    Some(text)
}

pub async fn show(args: &ShowArgs) -> Result<()> {
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?;
    let job: Value = api.get(&format!("/v1/jobs/{id}")).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&job)?);
        return Ok(());
    }
    let field = |name: &str| job[name].as_str().unwrap_or("").to_string();
    let effective = &job["effective"];
    let mut lines = vec![
        ("job", format!("{} ({})", field("id"), job["name"].as_str().unwrap_or("unnamed"))),
        ("state", field("state")),
        ("devices", devices(&job)),
        ("attempt", format!("{} ({} preemptions)", job["attempt"], job["preemptions"])),
        (
            "recipe",
            format!(
                "global batch {}, lr {} (base {} for {}), {} warmup iterations, {} epochs",
                effective["global_batch"],
                effective["scaled_lr"],
                effective["base_lr"],
                effective["reference_batch"],
                effective["warmup_iterations"],
                effective["epochs"]
            ),
        ),
    ];
    if let Some(why) = job["pending_reason"]["message"].as_str() {
        let position = job["queue_position"].as_i64().map_or_else(String::new, |p| format!("#{p} in queue: "));
        lines.push(("waiting", format!("{position}{why}")));
    }
    if let Some(basis) = job["estimated_start"]["basis"].as_str() {
        lines.push(("starts", basis.to_string()));
    }
    if let Some(progress) = progress(&job["progress"]) {
        lines.push(("progress", progress));
    }
    let result = &job["result"];
    if result.is_object() {
        lines.push((
            "result",
            format!(
                "final test error {:.2}%, {:.1} s over {} placement(s), {:.1} device-seconds",
                result["final_test_error"].as_f64().unwrap_or(f64::NAN) * 100.0,
                result["wall_seconds"].as_f64().unwrap_or(f64::NAN),
                result["history"].as_array().map_or(1, Vec::len),
                result["device_seconds"].as_f64().unwrap_or(f64::NAN)
            ),
        ));
    }
    if let Some(spent) = timeline(&result["timeline"]) {
        lines.push(("time", spent));
    }
    if let Some(error) = job["error"].as_str() {
        lines.push(("error", error.to_string()));
    }
    if let Some(used) = resources(&job["resources"]) {
        lines.push(("used", used));
    }
    if let Some(placed) = placements(&job["placements"]) {
        lines.push(("devices", placed));
    }
    lines.push(("tags", super::annotate::tags_text(&job)));
    if let Some(note) = job["note"].as_str().filter(|n| !n.is_empty()) {
        lines.push(("note", note.to_string()));
    }
    for (name, value) in lines {
        println!("{name:>8}  {value}");
    }
    if let Some(last) = job["last_log_lines"].as_array().filter(|l| !l.is_empty()) {
        println!("last lines of its ranks:");
        for line in last {
            println!("  [rank {}] {}", line["rank"], line["line"].as_str().unwrap_or(""));
        }
    }
    Ok(())
}

pub async fn cancel(args: &ShowArgs) -> Result<()> {
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?;
    let job: Value = api.post(&format!("/v1/jobs/{id}/cancel"), &json!({})).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&job)?);
    } else {
        println!("{id}: {}", job["state"].as_str().unwrap_or("?"));
    }
    Ok(())
}

/// Left-aligned columns, two spaces apart.
/// "2 cpu", or "2 cpu (8 workers as virtual ranks)" when the job plays more ranks than it holds devices.
fn devices(job: &Value) -> String {
    let kind = job["device"].as_str().unwrap_or("");
    match (job["devices"].as_i64(), job["workers"].as_i64()) {
        (Some(d), Some(k)) if k > d => format!("{d} {kind} ({k} workers as virtual ranks)"),
        (Some(d), _) => format!("{d} {kind}"),
        _ => format!("{} {kind}", job["workers"]),
    }
}

pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out += &line(row.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn devices_say_when_workers_are_virtual_ranks() {
        let job = serde_json::json!({"device": "cpu", "workers": 8, "devices": 2});
        assert_eq!(super::devices(&job), "2 cpu (8 workers as virtual ranks)");
        assert_eq!(super::devices(&serde_json::json!({"device": "gpu", "workers": 2, "devices": 2})), "2 gpu");
    }

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![vec!["a".to_string(), "queued".to_string()], vec!["bbbb".to_string(), "ok".to_string()]];
        assert_eq!(super::table(&["ID", "STATE"], &rows), "ID    STATE\na     queued\nbbbb  ok\n");
    }

    #[test]
    fn progress_reads_as_a_sentence() {
        let progress = serde_json::json!({"iterations_done": 120, "total_iterations": 1875, "epoch": 0,
            "loss": 0.61204, "samples_per_s": 2405.4, "allreduce_share": 0.031});
        assert_eq!(
            super::progress(&progress).unwrap(),
            "iteration 120 of 1875 (6%), epoch 1, loss 0.6120, 2405 samples/s, 3% all-reduce"
        );
        assert_eq!(super::progress(&serde_json::Value::Null), None);
    }

    #[test]
    fn the_timeline_is_shown_as_shares_of_the_training_time() {
        let timeline = serde_json::json!({"start_up_s": 0.63, "train_steps_s": 44.9, "evaluation_s": 3.04,
            "checkpoint_s": 0.017, "reporting_s": 0.004, "other_s": 0.03});
        assert_eq!(
            super::timeline(&timeline).unwrap(),
            "steps 93.6%, evaluation 6.3%, checkpoints 0.0%, reporting 0.0%, other 0.1%; start-up 0.6 s"
        );
        assert_eq!(super::timeline(&serde_json::Value::Null), None, "a result from before the timeline");
    }

    #[test]
    fn an_ended_job_says_how_it_ended_and_how_long_it_ran() {
        let at = |start: &str, end: &str| (start.to_string(), end.to_string());
        let (start, end) = at("2026-12-02T10:00:00Z", "2026-12-02T10:02:31Z");
        let job = serde_json::json!({"state": "succeeded", "started_at": start, "finished_at": end,
            "result": {"final_test_error": 0.1309}});
        assert_eq!(super::outcome(&job).unwrap(), "test error 13.09%, 2 min 31 s");
        let failed = serde_json::json!({"state": "failed", "error": "rank 1 was killed\nits last lines: ..."});
        assert_eq!(super::outcome(&failed).unwrap(), "rank 1 was killed");
        assert_eq!(super::outcome(&serde_json::json!({"state": "running"})), None);
        assert_eq!(super::duration_text(3 * 3600 + 5 * 60 + 9), "3 h 05 min");
    }
}
