//! `jobs submit`, `jobs list`, `jobs show`, `jobs cancel`: the job routes as commands.

use std::path::PathBuf;

use anyhow::{Context, Result};
use ringtrain_core::{Effective, JobState, Timeline};
use ringtrain_views::jobs::{JobResources, JobResult, JobView, LiveProgress, PlacementRecord};
use serde_json::Value;

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
    if args.dry_run {
        let answer = api.dry_run_job(&spec).await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&answer)?);
        } else {
            println!("{}: {}", answer.verdict, answer.message);
            if let Some(estimate) = &answer.estimated_start {
                println!("estimated start: {}", estimate.basis);
            }
            for (index, stage) in answer.stages.iter().enumerate() {
                let (first, last) = &stage.blocks;
                println!(
                    "pipeline stage {index} ({first} to {last}, {} micro-batch(es) at once): {} per device",
                    stage.in_flight,
                    ringtrain_core::memory::human_bytes(stage.memory.total)
                );
            }
        }
        return Ok(true);
    }
    let job = api.submit_job(&spec).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&job)?);
    } else {
        let recipe = job.effective.as_ref().map_or_else(
            || "the data set's size is not known yet".to_string(),
            |e| {
                format!(
                    "{} workers x {} = global batch {}, lr {}",
                    e.workers, e.per_worker_batch, e.global_batch, e.scaled_lr
                )
            },
        );
        println!("submitted {} ({}): {}; {recipe}", job.id, name(&job), job.state.as_str());
    }
    if !args.watch {
        return Ok(true);
    }
    watch(&WatchArgs { id: IdArg::from(job.id.0), connection: args.connection.clone(), every_s: 1.0 }).await
}

pub async fn list(args: &ListArgs) -> Result<()> {
    let api = args.connection.client()?;
    let mut query = format!("limit={}", args.limit);
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
    let page = api.jobs(&query).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = page
        .jobs
        .iter()
        .map(|job| {
            let code = job.pending_reason.as_ref().map(|reason| reason.code.as_str());
            let waits = match (job.queue_position, code) {
                (Some(position), Some(code)) => format!("#{position} {code}"),
                (None, Some(code)) => code.to_string(),
                _ => outcome(job).or_else(|| job.progress.as_ref().map(progress)).unwrap_or_default(),
            };
            vec![
                job.id.to_string(),
                job.name.clone().unwrap_or_default(),
                job.state.as_str().to_string(),
                devices(job),
                job.created_at.format("%Y-%m-%dT%H:%M:%S").to_string(),
                waits,
            ]
        })
        .collect();
    print!("{}", table(&["ID", "NAME", "STATE", "DEVICES", "CREATED", "WAITING / PROGRESS / OUTCOME"], &rows));
    if page.jobs.is_empty() {
        println!("(no jobs)");
    }
    Ok(())
}

fn name(job: &JobView) -> &str {
    job.name.as_deref().unwrap_or("unnamed")
}

/// How an ended job ended, in one line: `test error 13.09%, 2 min 31 s` for a success, the first line of
/// the error for a failure, with how long it ran; None while it has not ended.
fn outcome(job: &JobView) -> Option<String> {
    let ran = match (job.started_at, job.finished_at) {
        (Some(start), Some(end)) => Some(duration_text((end - start).num_seconds().max(0))),
        _ => None,
    };
    let after = |text: String| match &ran {
        Some(ran) => format!("{text}, {ran}"),
        None => text,
    };
    match job.state {
        JobState::Succeeded => {
            let error = job.result.as_ref().and_then(|r| r.final_test_error);
            Some(after(error.map_or_else(|| "succeeded".into(), |e| format!("test error {:.2}%", e * 100.0))))
        }
        JobState::Failed => {
            Some(after(job.error.as_deref().and_then(|e| e.lines().next()).unwrap_or("failed").to_string()))
        }
        JobState::Cancelled => Some(after("cancelled".into())),
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
/// all-reduce`.
fn progress(progress: &LiveProgress) -> String {
    let done = progress.iterations_done;
    let mut text = format!("iteration {done}");
    if let Some(total) = progress.total_iterations.filter(|t| *t > 0) {
        text += &format!(" of {total} ({:.0}%)", done as f64 * 100.0 / total as f64);
    }
    text += &format!(", epoch {}", progress.epoch + 1);
    if let Some(loss) = progress.loss {
        text += &format!(", loss {loss:.4}");
    }
    if let Some(rate) = progress.samples_per_s {
        text += &format!(", {rate:.0} samples/s");
    }
    if let Some(share) = progress.allreduce_share {
        text += &format!(", {:.0}% all-reduce", share * 100.0);
    }
    if let Some(left) = progress.seconds_left {
        text += &format!(", about {} left", duration_text(left.round() as i64));
    }
    text
}

/// Where rank 0's time went (the result's `timeline`), as shares of its training wall time, and its
/// start-up apart: `steps 93.6%, evaluation 6.3%, checkpoints 0.0%, reporting 0.0%, other 0.1%; start-up 0.6 s`.
fn timeline(timeline: &Timeline) -> String {
    let parts = [
        ("steps", timeline.train_steps_s),
        ("evaluation", timeline.evaluation_s),
        ("checkpoints", timeline.checkpoint_s),
        ("reporting", timeline.reporting_s),
        ("other", timeline.other_s),
    ];
    let total = parts.iter().map(|(_, s)| s).sum::<f64>().max(f64::MIN_POSITIVE);
    let shares: Vec<String> = parts.iter().map(|(name, s)| format!("{name} {:.1}%", s / total * 100.0)).collect();
    let mut text = format!("{}; start-up {:.1} s", shares.join(", "), timeline.start_up_s);
    for stage in &timeline.stages {
        text += &format!(
            "; stage {} busy {:.0}%, waiting {:.0}%, sending {:.0}%",
            stage.stage,
            stage.busy_share * 100.0,
            stage.waiting_share * 100.0,
            stage.sending_share * 100.0
        );
    }
    if timeline.bubble_share > 0.0 {
        text += &format!(" (the schedule's bubble {:.0}%)", timeline.bubble_share * 100.0);
    }
    text
}

/// The device count of each placement, over time: `4 (31 s, preempted) → 2 (55 s) → 4 (running)`; None
/// before the first.
fn placements(placements: &[PlacementRecord]) -> Option<String> {
    if placements.is_empty() {
        return None;
    }
    let parts: Vec<String> = placements
        .iter()
        .map(|p| {
            let wall = duration_text(p.wall_seconds.round() as i64);
            match p.ended.as_str() {
                "running" => format!("{} (running, {wall})", p.devices),
                ended => format!("{} ({wall}, {ended})", p.devices),
            }
        })
        .collect();
    Some(parts.join(" → "))
}

/// What a job used: `41.3 device-seconds, peak memory 212 MiB per rank, 1.9 CPU cores`.
fn resources(used: &JobResources) -> String {
    let mut text = format!("{:.1} device-seconds", used.device_seconds);
    if let Some(bytes) = used.peak_rss_bytes {
        text += &format!(", peak memory {:.0} MiB per rank", bytes / f64::from(1 << 20));
    }
    if let Some(cores) = used.cpu_cores {
        text += &format!(", {cores:.1} CPU cores busy");
    }
    text
}

/// The recipe a job runs: `global batch 256, lr 0.1 (base 0.1 for 256), 0 warmup iterations, 3 epochs`.
fn recipe(effective: &Effective) -> String {
    format!(
        "global batch {}, lr {} (base {} for {}), {} warmup iterations, {} epochs",
        effective.global_batch,
        effective.scaled_lr,
        effective.base_lr,
        effective.reference_batch,
        effective.warmup_iterations,
        effective.epochs
    )
}

/// A finished run's figures: `final test error 13.09%, 151.0 s over 1 placement(s), 302.1 device-seconds`.
fn result_text(result: &JobResult) -> String {
    format!(
        "final test error {:.2}%, {:.1} s over {} placement(s), {:.1} device-seconds",
        result.final_test_error.unwrap_or(f64::NAN) * 100.0,
        result.wall_seconds.unwrap_or(f64::NAN),
        result.history.as_ref().map_or(1, Vec::len),
        result.device_seconds.unwrap_or(f64::NAN)
    )
}

pub async fn show(args: &ShowArgs) -> Result<()> {
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?;
    let job = api.job(&id.to_string()).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&job)?);
        return Ok(());
    }
    let mut lines = vec![
        ("job", format!("{} ({})", job.id, name(&job))),
        ("state", job.state.as_str().to_string()),
        ("devices", devices(&job)),
        ("attempt", format!("{} ({} preemptions)", job.attempt, job.preemptions)),
        ("recipe", job.effective.as_ref().map_or_else(|| "the data set's size is not known yet".into(), recipe)),
    ];
    if let Some(why) = &job.pending_reason {
        let position = job.queue_position.map_or_else(String::new, |p| format!("#{p} in queue: "));
        lines.push(("waiting", format!("{position}{}", why.message)));
    }
    if let Some(estimate) = &job.estimated_start {
        lines.push(("starts", estimate.basis.clone()));
    }
    if let Some(now) = &job.progress {
        lines.push(("progress", progress(now)));
    }
    if let Some(result) = &job.result {
        lines.push(("result", result_text(result)));
        if let Some(spent) = &result.timeline {
            lines.push(("time", timeline(spent)));
        }
    }
    if let Some(error) = &job.error {
        lines.push(("error", error.clone()));
    }
    if let Some(used) = &job.resources {
        lines.push(("used", resources(used)));
    }
    if let Some(placed) = job.placements.as_deref().and_then(placements) {
        lines.push(("devices", placed));
    }
    lines.push(("tags", super::annotate::tags_text(&job.tags)));
    if !job.note.is_empty() {
        lines.push(("note", job.note.clone()));
    }
    for (name, value) in lines {
        println!("{name:>8}  {value}");
    }
    if let Some(last) = job.last_log_lines.as_ref().filter(|l| !l.is_empty()) {
        println!("last lines of its ranks:");
        for line in last {
            println!("  [rank {}] {}", line.rank, line.line);
        }
    }
    Ok(())
}

pub async fn cancel(args: &ShowArgs) -> Result<()> {
    let api = args.connection.client()?;
    let id = resolve(&api, &args.id, Kind::Job).await?;
    let job = api.cancel_job(&id.to_string()).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&job)?);
    } else {
        println!("{id}: {}", job.state.as_str());
    }
    Ok(())
}

/// "2 cpu", or "2 cpu (8 workers as virtual ranks)" when the job plays more ranks than it holds devices.
fn devices(job: &JobView) -> String {
    let kind = job.device.as_str();
    match (job.devices, job.workers) {
        (d, k) if k > d => format!("{d} {kind} ({k} workers as virtual ranks)"),
        (d, _) => format!("{d} {kind}"),
    }
}

/// Left-aligned columns, two spaces apart.
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
pub(crate) mod tests {
    use ringtrain_views::jobs::JobView;
    use serde_json::{json, Value};

    /// A job's view as the server answers it, with `fields` set over a queued job's.
    pub(crate) fn job_view(fields: Value) -> JobView {
        let mut view = json!({
            "id": "76acc08f-0000-4000-8000-000000000001", "name": "j", "state": "queued",
            "team_id": "76acc08f-0000-4000-8000-000000000002", "priority": 0, "device": "cpu", "workers": 2,
            "devices": 2, "study": null, "attempt": 0, "preemptions": 0, "max_restarts": 0, "spec": {},
            "effective": null, "dataset_size": null, "created_at": "2026-12-02T09:59:00Z",
            "updated_at": "2026-12-02T09:59:00Z", "started_at": null, "finished_at": null, "result": null,
            "error": null, "unplaceable": null, "pending_reason": null, "queue_position": null,
            "estimated_start": null, "last_log_lines": null, "progress": null, "resources": null,
            "placements": null, "tags": [], "note": "",
            "links": {"self": "", "schedule": "", "events": "", "metrics": "", "logs": "", "checkpoints": ""}
        });
        for (name, value) in fields.as_object().expect("fields are an object") {
            view[name] = value.clone();
        }
        serde_json::from_value(view).expect("a job view")
    }

    #[test]
    fn devices_say_when_workers_are_virtual_ranks() {
        let job = job_view(json!({"device": "cpu", "workers": 8, "devices": 2}));
        assert_eq!(super::devices(&job), "2 cpu (8 workers as virtual ranks)");
        assert_eq!(super::devices(&job_view(json!({"device": "gpu", "workers": 2, "devices": 2}))), "2 gpu");
    }

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![vec!["a".to_string(), "queued".to_string()], vec!["bbbb".to_string(), "ok".to_string()]];
        assert_eq!(super::table(&["ID", "STATE"], &rows), "ID    STATE\na     queued\nbbbb  ok\n");
    }

    #[test]
    fn progress_reads_as_a_sentence() {
        let progress = serde_json::from_value(json!({"iterations_done": 120, "total_iterations": 1875,
            "epoch": 0, "loss": 0.61204, "samples_per_s": 2405.4, "allreduce_share": 0.031, "seconds_left": null}))
        .unwrap();
        assert_eq!(
            super::progress(&progress),
            "iteration 120 of 1875 (6%), epoch 1, loss 0.6120, 2405 samples/s, 3% all-reduce"
        );
    }

    #[test]
    fn the_timeline_is_shown_as_shares_of_the_training_time() {
        let timeline = serde_json::from_value(json!({"start_up_s": 0.63, "train_steps_s": 44.9,
            "evaluation_s": 3.04, "checkpoint_s": 0.017, "reporting_s": 0.004, "other_s": 0.03}))
        .unwrap();
        assert_eq!(
            super::timeline(&timeline),
            "steps 93.6%, evaluation 6.3%, checkpoints 0.0%, reporting 0.0%, other 0.1%; start-up 0.6 s"
        );
        let result = job_view(json!({"result": {"final_test_error": 0.1}})).result.unwrap();
        assert!(result.timeline.is_none(), "a result from before the timeline has none");
        let pipelined = serde_json::from_value(json!({"train_steps_s": 10.0, "bubble_share": 0.3333,
            "stages": [{"stage": 0, "busy_share": 0.62, "waiting_share": 0.35, "sending_share": 0.03},
                       {"stage": 1, "busy_share": 0.58, "waiting_share": 0.41, "sending_share": 0.01}]}))
        .unwrap();
        assert!(
            super::timeline(&pipelined).ends_with(
                "; stage 0 busy 62%, waiting 35%, sending 3%; stage 1 busy 58%, waiting 41%, sending 1% \
                 (the schedule's bubble 33%)"
            ),
            "{}",
            super::timeline(&pipelined)
        );
    }

    #[test]
    fn an_ended_job_says_how_it_ended_and_how_long_it_ran() {
        let job = job_view(json!({"state": "succeeded", "started_at": "2026-12-02T10:00:00Z",
            "finished_at": "2026-12-02T10:02:31Z", "result": {"final_test_error": 0.1309, "spec": {}}}));
        assert_eq!(super::outcome(&job).unwrap(), "test error 13.09%, 2 min 31 s");
        let failed = job_view(json!({"state": "failed", "error": "rank 1 was killed\nits last lines: ..."}));
        assert_eq!(super::outcome(&failed).unwrap(), "rank 1 was killed");
        assert_eq!(super::outcome(&job_view(json!({"state": "running"}))), None);
        assert_eq!(super::duration_text(3 * 3600 + 5 * 60 + 9), "3 h 05 min");
    }
}
