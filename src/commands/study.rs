//! `ringtrain study ...`: studies from the terminal. `study goyal` runs Goyal et al.'s Table 1 in miniature
//! through the API (the `goyal` template), follows it, and prints the measured table beside the paper's
//! figures, writing the error-vs-epoch plot (SVG) and the study's JSON next to it. `study scale-search`
//! finds the lr multiplier for a larger batch (the `scale_search` template) and prints the spec to submit.
//!
//! Over 450 lines only with its tests (440 of code).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use ringtrain_client::ApiClient;
use ringtrain_core::study::{StudyRequest, GOYAL_REPORTED};
use ringtrain_core::JobState;
use ringtrain_views::studies::{SearchSummary, StudyPointView, StudyView};
use serde::Deserialize;
use serde_json::{json, Value};

use super::block_on;
use crate::commands::connection::Connection;
use crate::commands::ids::{resolve, IdArg, Kind};
use crate::commands::jobs::table;

#[derive(Debug, clap::Subcommand)]
pub enum Study {
    /// Goyal et al. 2017's Table 1 in miniature (Fashion-MNIST, a small ResNet with BatchNorm, ~1 hour on
    /// 2 cores): submit, follow, print the table beside the paper's and write the plot.
    Goyal(GoyalArgs),
    /// Find the lr for a larger batch: the base spec (the small-batch reference) and lr multipliers from
    /// the square-root to the linear rule at --target-workers, the losers stopped early by successive
    /// halving; prints the best multiplier and the spec to submit.
    ScaleSearch(ScaleSearchArgs),
    /// Submit a study file ({name, base, axes | points, reference, guard_points}) and follow it.
    Submit(SubmitArgs),
    /// The team's studies, newest first: points and how many are in each state.
    List(ListArgs),
    /// A study's table.
    Show(ShowArgs),
    /// Cancel every point of a study that has not ended.
    Cancel(ShowArgs),
}

#[derive(Debug, clap::Args)]
pub struct FollowArgs {
    /// Store nothing: print every point's spec and schedule.
    #[arg(long)]
    dry_run: bool,
    /// Return once submitted instead of following the study to its end.
    #[arg(long, conflicts_with = "dry_run")]
    detach: bool,
    /// A folder to write the plot (`<name>.svg`) and the study (`<name>.json`) into when it ends; nothing
    /// is written without it.
    #[arg(long, short)]
    out: Option<PathBuf>,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, clap::Args)]
pub struct GoyalArgs {
    /// The study's name.
    #[arg(long, default_value = "goyal-miniature")]
    name: String,
    /// Guard every point against the reference (a point that falls off its curve stops early).
    #[arg(long)]
    guard: bool,
    #[command(flatten)]
    follow: FollowArgs,
}

#[derive(Debug, clap::Args)]
pub struct ScaleSearchArgs {
    /// The small-batch reference: a job spec, a JSON file (it runs first, to the end).
    #[arg(long, required_unless_present = "reference_job", conflicts_with = "reference_job")]
    base: Option<PathBuf>,
    /// Or a finished job of your team to be the reference (its id, or the start of it): its spec is the
    /// base, and it is not run again.
    #[arg(long)]
    reference_job: Option<IdArg>,
    /// The worker count k to scale it to.
    #[arg(long)]
    target_workers: u32,
    /// The devices each candidate holds (its k workers played as virtual ranks); default: what fits.
    #[arg(long)]
    devices: Option<u32>,
    /// How many multipliers to try (default 6).
    #[arg(long)]
    candidates: Option<u32>,
    /// Warmup lengths (epochs) to try with every multiplier, comma-separated.
    #[arg(long, value_delimiter = ',')]
    warmup_epochs: Vec<f64>,
    /// The study's name.
    #[arg(long)]
    name: Option<String>,
    #[command(flatten)]
    follow: FollowArgs,
}

#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    /// The study request, a JSON file.
    file: PathBuf,
    #[command(flatten)]
    follow: FollowArgs,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// At most this many (the newest).
    #[arg(long, default_value_t = 20)]
    limit: u32,
    #[command(flatten)]
    connection: Connection,
    /// Print the server's answer as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// The study's id, or the start of it.
    id: IdArg,
    #[command(flatten)]
    connection: Connection,
    /// Print the server's answer as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(study: Study) -> std::process::ExitCode {
    match study {
        Study::Goyal(args) => {
            let request = json!({"template": "goyal", "name": args.name, "guard_points": args.guard});
            block_on("study goyal", submit_and_follow(request, &args.follow))
        }
        Study::ScaleSearch(args) => block_on("study scale-search", async {
            let mut request = json!({"template": "scale_search", "target_workers": args.target_workers});
            if let Some(path) = &args.base {
                let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
                request["base"] =
                    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
            }
            if let Some(job) = &args.reference_job {
                let api = args.follow.connection.client()?;
                request["reference_job"] = resolve(&api, job, Kind::Job).await?.to_string().into();
            }
            for (field, value) in [
                ("name", args.name.clone().map(Value::from)),
                ("devices", args.devices.map(Value::from)),
                ("candidates", args.candidates.map(Value::from)),
                ("warmup_epochs", (!args.warmup_epochs.is_empty()).then(|| json!(args.warmup_epochs))),
            ] {
                if let Some(value) = value {
                    request[field] = value;
                }
            }
            submit_and_follow(request, &args.follow).await
        }),
        Study::Submit(args) => block_on("study submit", async {
            let text =
                std::fs::read_to_string(&args.file).with_context(|| format!("cannot read {}", args.file.display()))?;
            let request: Value =
                serde_json::from_str(&text).with_context(|| format!("{} is not JSON", args.file.display()))?;
            submit_and_follow(request, &args.follow).await
        }),
        Study::List(args) => block_on("study list", list(&args)),
        Study::Show(args) => block_on("study show", async {
            let api = args.connection.client()?;
            let id = resolve(&api, &args.id, Kind::Study).await?;
            let view = api.study(&id.to_string()).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&view)?);
            } else {
                print!("{}", render(&view));
            }
            Ok(())
        }),
        Study::Cancel(args) => block_on("study cancel", async {
            let api = args.connection.client()?;
            let id = resolve(&api, &args.id, Kind::Study).await?;
            let view = api.cancel_study(&id.to_string()).await?;
            print!("{}", render(&view));
            Ok(())
        }),
    }
}

/// How often a followed study is read again.
const POLL: Duration = Duration::from_secs(10);

async fn submit_and_follow(request: Value, args: &FollowArgs) -> Result<()> {
    let api = args.connection.client()?;
    if args.dry_run {
        let plan = api.plan_study(&request).await?;
        let rows: Vec<Vec<String>> = plan
            .points
            .iter()
            .map(|p| {
                let mut row = vec![format!("{}{}", p.point, if p.is_reference { "*" } else { "" }), p.label.clone()];
                match p.schedule.as_ref().map(|s| &s.effective) {
                    Some(e) => row.extend([
                        e.global_batch.to_string(),
                        format!("{:.4}", e.scaled_lr),
                        e.warmup_iterations.to_string(),
                        e.iterations_per_epoch.to_string(),
                    ]),
                    // the data set's size is not known before a job reads it (`idx:`)
                    None => row.extend(["?".to_string(), "?".into(), "?".into(), "?".into()]),
                }
                row
            })
            .collect();
        print!("{}", table(&["POINT", "OVERRIDES", "KN", "LR", "WARMUP ITERS", "ITERS/EPOCH"], &rows));
        println!("(* the reference point; nothing was submitted)");
        return Ok(());
    }
    let created = api.create_study(&request).await?;
    let id = created.id.to_string();
    println!("study {id}: {} points queued", created.points.len());
    if let Some(out) = args.out.as_ref().filter(|_| !args.detach) {
        println!("when it ends, its plot and table are written into {}", out.display());
    }
    if args.detach {
        println!("follow it with: ringtrain study show {id}");
        return Ok(());
    }
    let mut last_line = String::new();
    let view = loop {
        let view = api.study(&id).await?;
        let line = progress_line(&view);
        if line != last_line {
            println!("{line}");
            last_line = line;
        }
        if ended(&view) {
            break view;
        }
        tokio::time::sleep(POLL).await;
    };
    print!("{}", render(&view));
    let Some(out) = &args.out else {
        println!("its plot: GET /v1/studies/{id}/plot.svg, or the web page's Studies view (--out DIR saves it)");
        return Ok(());
    };
    let (svg_path, json_path) = save(&api, &view, out).await?;
    println!("wrote {} and {}", svg_path.display(), json_path.display());
    Ok(())
}

/// Writes a study's plot (`<name>.svg`, the server's) and its view (`<name>.json`) into `out`: their paths.
pub async fn save(api: &ApiClient, view: &StudyView, out: &Path) -> Result<(PathBuf, PathBuf)> {
    let id = view.id;
    let name = view.name.as_deref().unwrap_or("study").replace(['/', ' ', ':'], "_");
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let svg = api.send(api.request(reqwest::Method::GET, &format!("/v1/studies/{id}/plot.svg"))).await?;
    let svg_path = out.join(format!("{name}.svg"));
    std::fs::write(&svg_path, svg.bytes().await?).with_context(|| format!("cannot write {}", svg_path.display()))?;
    let json_path = out.join(format!("{name}.json"));
    std::fs::write(&json_path, serde_json::to_string_pretty(view)?)?;
    Ok((svg_path, json_path))
}

/// The newest studies as a table: id, name, points, states, created.
async fn list(args: &ListArgs) -> Result<()> {
    let api = args.connection.client()?;
    let page = api.studies(&format!("limit={}", args.limit.clamp(1, 100))).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = page
        .studies
        .iter()
        .map(|study| {
            let states = study.states.iter().map(|(state, n)| format!("{n} {state}")).collect::<Vec<_>>();
            vec![
                study.id.to_string(),
                study.name.clone().unwrap_or_default(),
                study.points.to_string(),
                states.join(", "),
                study.created_at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
            ]
        })
        .collect();
    if rows.is_empty() {
        println!("no studies yet: ringtrain study goyal, or ringtrain study submit FILE");
        return Ok(());
    }
    print!("{}", table(&["ID", "NAME", "POINTS", "STATES", "CREATED"], &rows));
    Ok(())
}

/// Whether every point has ended.
fn ended(view: &StudyView) -> bool {
    view.states.keys().all(|state| matches!(state.as_str(), "succeeded" | "failed" | "cancelled" | "stopped"))
}

/// "3/10 ended; running: #3 workers=16 ... epoch 2/8".
fn progress_line(view: &StudyView) -> String {
    let ended = |p: &&StudyPointView| {
        matches!(p.state, JobState::Succeeded | JobState::Failed | JobState::Cancelled | JobState::Stopped)
    };
    let done = view.points.iter().filter(ended).count();
    let running: Vec<String> = view
        .points
        .iter()
        .filter(|p| p.state == JobState::Running)
        .map(|p| format!("#{} {} ({} epochs done)", p.point, p.label, p.test_error.len()))
        .collect();
    format!(
        "{done}/{} ended; running: {}",
        view.points.len(),
        if running.is_empty() { "none".into() } else { running.join(", ") }
    )
}

/// A share as a percentage with two decimals, `-` without one.
fn percent(value: Option<f64>) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{:.2}", v * 100.0))
}

/// A figure with `decimals`, `-` without one.
fn figure(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
}

/// The study's table; for the Goyal template, with the paper's figure for each point beside the measured one.
pub fn render(view: &StudyView) -> String {
    let goyal = is_goyal(view);
    let searched = view.search.is_some();
    let reference_paper = GOYAL_REPORTED[0].1.unwrap_or_default();
    let rows: Vec<Vec<String>> = view
        .points
        .iter()
        .map(|p| {
            let mut row = vec![
                format!("{}{}", p.point, if p.is_reference { "*" } else { "" }),
                p.global_batch.to_string(),
                format!("{}/{}", p.workers, p.devices),
                p.warmup.clone().unwrap_or_else(|| "-".into()),
                p.scaling.clone().unwrap_or_else(|| "-".into()),
                figure(p.scaled_lr, 4),
                percent(p.train_error.last().copied()),
                percent(p.final_test_error),
                p.vs_reference.map_or_else(|| "-".into(), |d| format!("{:+.2}", d * 100.0)),
                figure(p.wall_seconds, 0),
                figure(p.samples_per_s, 0),
                p.state.as_str().to_string(),
            ];
            if searched {
                row.push(p.search.clone().unwrap_or_else(|| "-".into()));
                row.push(at_rungs(p));
            }
            if goyal {
                match usize::try_from(p.point).ok().and_then(|i| GOYAL_REPORTED.get(i)) {
                    Some((what, Some(error))) => row.extend([
                        what.to_string(),
                        format!("{error:.2}"),
                        format!("{:+.2}", error - reference_paper),
                    ]),
                    Some((what, None)) => row.extend([what.to_string(), "≈ ref".into(), "(Fig. 1)".into()]),
                    None => {}
                }
            }
            row
        })
        .collect();
    let mut headers = vec![
        "POINT",
        "KN",
        "K/DEV",
        "WARMUP",
        "SCALING",
        "LR",
        "TRAIN ERR %",
        "TEST ERR %",
        "VS REF",
        "WALL S",
        "SAMPLES/S",
        "STATE",
    ];
    if searched {
        headers.extend(["SEARCH", "AT RUNGS %"]);
    }
    if goyal {
        headers.extend(["GOYAL (RESNET-50, IMAGENET)", "ERR %", "VS REF"]);
    }
    let mut out = format!("study {} ({})\n", view.id, view.name.as_deref().unwrap_or(""));
    out += &table(&headers, &rows);
    out += "* the reference point; errors are the last epoch's (test: the finished run's); VS REF in points\n";
    if searched {
        out += "AT RUNGS: the search's metric at each rung reached, ^ promoted past it\n";
    }
    for p in &view.points {
        if let Some(error) = &p.error {
            out += &format!("point {}: {error}\n", p.point);
        }
    }
    if let Some(search) = &view.search {
        out += &search_summary(search, &view.points);
    }
    out
}

/// A point's figure at each rung it reached, "^" where it was promoted past it: "21.30^ 18.02".
fn at_rungs(point: &StudyPointView) -> String {
    let passed = point.rungs_passed.unwrap_or(0);
    let figures = point.at_rungs.as_deref().unwrap_or_default();
    if figures.is_empty() {
        return "-".into();
    }
    let marked = figures
        .iter()
        .enumerate()
        .map(|(rung, f)| format!("{}{}", percent(Some(*f)), if rung < passed { "^" } else { "" }));
    marked.collect::<Vec<_>>().join(" ")
}

/// What the search found: the best point, its multiplier, what was spent and saved, and the spec to submit.
fn search_summary(search: &SearchSummary, points: &[StudyPointView]) -> String {
    let hours = |h: Option<f64>| h.map_or_else(|| "?".into(), |h| format!("{h:.3}"));
    let mut out = format!(
        "search: {}; {} device-hours spent of the full grid's {} (saved {})\n",
        if search.done { "done" } else { "running" },
        hours(Some(search.device_hours)),
        hours(search.grid_device_hours),
        hours(search.saved_device_hours),
    );
    let Some(best) = search.best_point else { return out + "no point has reached a rung yet\n" };
    let point = points.iter().find(|p| p.point == best);
    let label = point.map_or("", |p| p.label.as_str());
    let last = point.and_then(|p| p.test_error.last().copied());
    let figure = point.and_then(|p| p.final_test_error).or(last);
    out += &format!(
        "best: point {best} ({label}){}, test error {}% ({})\n",
        search.best_multiplier.map_or_else(String::new, |m| format!(", lr multiplier {m}")),
        percent(figure),
        if point.is_some_and(|p| p.final_test_error.is_some()) { "final" } else { "so far" },
    );
    if let Some(spec) = search.best_spec.as_ref().filter(|spec| spec.is_object()) {
        out += &format!("its spec, to submit: {spec}\n");
    }
    out
}

/// Whether the study was made from the Goyal template (its points are the template's, in order).
fn is_goyal(view: &StudyView) -> bool {
    let template = ringtrain_core::study::goyal_template();
    let definition = StudyRequest::deserialize(&view.definition);
    definition.is_ok_and(|definition| definition.points == template.points)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A study's view as the server answers it, its points given by the fields that differ from a
    /// queued point's.
    fn study_view(fields: Value, points: &[Value]) -> StudyView {
        let point = |given: &Value| {
            let mut point = json!({"point": 0, "label": "", "overrides": {},
                "job_id": "76acc08f-0000-4000-8000-000000000001", "state": "queued", "is_reference": false,
                "workers": 1, "devices": 1, "global_batch": 32, "scaled_lr": null, "warmup": null, "scaling": null,
                "train_error": [], "test_error": [], "final_test_error": null, "vs_reference": null,
                "wall_seconds": null, "samples_per_s": null, "error": null, "device_seconds": 0.0,
                "reused": false, "search": null, "rungs_passed": null, "at_rungs": null});
            for (name, value) in given.as_object().unwrap() {
                point[name] = value.clone();
            }
            point
        };
        let mut view = json!({"id": "76acc08f-0000-4000-8000-000000000003", "name": "s",
            "team_id": "76acc08f-0000-4000-8000-000000000002", "created_at": "2026-12-02T09:59:00Z",
            "reference_point": 0, "states": {}, "definition": {}, "device_hours": 0.0, "max_device_hours": null,
            "search": null, "links": {"self": "", "plot": "", "cancel": ""}});
        for (name, value) in fields.as_object().unwrap() {
            view[name] = value.clone();
        }
        view["points"] = points.iter().map(point).collect();
        serde_json::from_value(view).unwrap()
    }

    #[test]
    fn a_goyal_study_is_printed_beside_the_paper() {
        let definition = serde_json::to_value(ringtrain_core::study::goyal_template()).unwrap();
        let view = study_view(
            json!({"name": "goyal-miniature", "definition": definition, "states": {"succeeded": 1}}),
            &[json!({"point": 0, "is_reference": true, "global_batch": 32, "workers": 1, "devices": 1,
                "warmup": "gradual", "scaling": "linear", "scaled_lr": 0.1, "train_error": [0.2, 0.1],
                "final_test_error": 0.0912, "vs_reference": 0.0, "wall_seconds": 300.0, "samples_per_s": 1500.0,
                "state": "succeeded"})],
        );
        let text = render(&view);
        assert!(text.contains("GOYAL (RESNET-50, IMAGENET)"), "{text}");
        assert!(text.contains("9.12") && text.contains("23.60") && text.contains("kn=256 (reference)"), "{text}");
        assert!(ended(&view));
    }

    #[test]
    fn a_search_prints_each_point_s_standing_and_the_spec_to_submit() {
        let view = study_view(
            json!({"name": "scale", "states": {"succeeded": 2, "stopped": 1},
                "search": {"spec": {}, "done": true, "best_point": 2, "best_multiplier": 5.657, "device_hours": 0.5,
                    "grid_device_hours": 1.25, "saved_device_hours": 0.75, "best_spec": {"workers": 32}}}),
            &[
                json!({"point": 0, "is_reference": true, "label": "", "state": "succeeded",
                    "search": "the reference: trains to the end", "test_error": [0.3, 0.2], "final_test_error": 0.1}),
                json!({"point": 1, "label": "lr.multiplier=1", "state": "stopped", "test_error": [0.3],
                    "search": "stopped at rung 1 (1 epochs)", "at_rungs": [0.3], "rungs_passed": 0}),
                json!({"point": 2, "label": "lr.multiplier=2", "state": "succeeded", "test_error": [0.25, 0.2, 0.12],
                    "search": "promoted past every rung (2)", "at_rungs": [0.25, 0.2], "rungs_passed": 2,
                    "final_test_error": 0.12}),
            ],
        );
        let text = render(&view);
        assert!(text.contains("SEARCH") && text.contains("stopped at rung 1 (1 epochs)"), "{text}");
        assert!(text.contains("25.00^ 20.00^"), "{text}");
        assert!(text.lines().any(|l| l.starts_with("1 ") && l.trim_end().ends_with(" 30.00")), "{text}");
        assert!(text.contains("0.500 device-hours spent of the full grid's 1.250 (saved 0.750)"), "{text}");
        assert!(
            text.contains("best: point 2 (lr.multiplier=2), lr multiplier 5.657, test error 12.00% (final)"),
            "{text}"
        );
        assert!(text.contains(r#"its spec, to submit: {"workers":32}"#), "{text}");
        assert!(ended(&view));
    }
}
