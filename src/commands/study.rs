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
use ringtrain_core::study::GOYAL_REPORTED;
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
            let view: Value = api.get(&format!("/v1/studies/{id}")).await?;
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
            let view: Value = api.post(&format!("/v1/studies/{id}/cancel"), &json!({})).await?;
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
        let plan: Value = api.post("/v1/studies?dry_run=true", &request).await?;
        let rows: Vec<Vec<String>> = plan["points"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let e = &p["schedule"]["effective"];
                vec![
                    format!("{}{}", p["point"], if p["is_reference"] == true { "*" } else { "" }),
                    p["label"].as_str().unwrap_or("").to_string(),
                    e["global_batch"].to_string(),
                    format!("{:.4}", e["scaled_lr"].as_f64().unwrap_or(0.0)),
                    e["warmup_iterations"].to_string(),
                    e["iterations_per_epoch"].to_string(),
                ]
            })
            .collect();
        print!("{}", table(&["POINT", "OVERRIDES", "KN", "LR", "WARMUP ITERS", "ITERS/EPOCH"], &rows));
        println!("(* the reference point; nothing was submitted)");
        return Ok(());
    }
    let created: Value = api.post("/v1/studies", &request).await?;
    let id = created["id"].as_str().context("the server's answer has no study id")?.to_string();
    println!("study {id}: {} points queued", created["points"].as_array().map_or(0, Vec::len));
    if let Some(out) = args.out.as_ref().filter(|_| !args.detach) {
        println!("when it ends, its plot and table are written into {}", out.display());
    }
    if args.detach {
        println!("follow it with: ringtrain study show {id}");
        return Ok(());
    }
    let mut last_line = String::new();
    let view = loop {
        let view: Value = api.get(&format!("/v1/studies/{id}")).await?;
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
pub async fn save(api: &ApiClient, view: &Value, out: &Path) -> Result<(PathBuf, PathBuf)> {
    let id = view["id"].as_str().context("the study has no id")?;
    let name = view["name"].as_str().unwrap_or("study").replace(['/', ' ', ':'], "_");
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
    let page: Value = api.get(&format!("/v1/studies?limit={}", args.limit.clamp(1, 100))).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = page["studies"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|study| {
            let states = study["states"].as_object().map_or_else(String::new, |states| {
                states.iter().map(|(state, n)| format!("{n} {state}")).collect::<Vec<_>>().join(", ")
            });
            vec![
                study["id"].as_str().unwrap_or("").to_string(),
                study["name"].as_str().unwrap_or("").to_string(),
                study["points"].to_string(),
                states,
                study["created_at"].as_str().unwrap_or("").to_string(),
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

fn ended(view: &Value) -> bool {
    let states = view["states"].as_object();
    states.is_some_and(|s| s.keys().all(|k| matches!(k.as_str(), "succeeded" | "failed" | "cancelled" | "stopped")))
}

/// "3/10 ended; running: #3 workers=16 ... epoch 2/8".
fn progress_line(view: &Value) -> String {
    let points = view["points"].as_array().cloned().unwrap_or_default();
    let done = points
        .iter()
        .filter(|p| matches!(p["state"].as_str(), Some("succeeded" | "failed" | "cancelled" | "stopped")))
        .count();
    let running: Vec<String> = points
        .iter()
        .filter(|p| p["state"] == "running")
        .map(|p| {
            let done = p["test_error"].as_array().map_or(0, Vec::len);
            format!("#{} {} ({done} epochs done)", p["point"], p["label"].as_str().unwrap_or(""))
        })
        .collect();
    format!(
        "{done}/{} ended; running: {}",
        points.len(),
        if running.is_empty() { "none".into() } else { running.join(", ") }
    )
}

fn percent(value: &Value) -> String {
    value.as_f64().map_or_else(|| "-".into(), |v| format!("{:.2}", v * 100.0))
}

/// The study's table; for the Goyal template, with the paper's figure for each point beside the measured one.
pub fn render(view: &Value) -> String {
    let points = view["points"].as_array().cloned().unwrap_or_default();
    let goyal = is_goyal(view);
    let searched = view["search"].is_object();
    let reference_paper = GOYAL_REPORTED[0].1.unwrap_or_default();
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            let i = p["point"].as_u64().unwrap_or(0) as usize;
            let mut row = vec![
                format!("{i}{}", if p["is_reference"] == true { "*" } else { "" }),
                p["global_batch"].to_string(),
                format!("{}/{}", p["workers"], p["devices"]),
                p["warmup"].as_str().unwrap_or("-").to_string(),
                p["scaling"].as_str().unwrap_or("-").to_string(),
                p["scaled_lr"].as_f64().map_or_else(|| "-".into(), |lr| format!("{lr:.4}")),
                percent(&p["train_error"].as_array().and_then(|a| a.last()).cloned().unwrap_or(Value::Null)),
                percent(&p["final_test_error"]),
                p["vs_reference"].as_f64().map_or_else(|| "-".into(), |d| format!("{:+.2}", d * 100.0)),
                p["wall_seconds"].as_f64().map_or_else(|| "-".into(), |s| format!("{s:.0}")),
                p["samples_per_s"].as_f64().map_or_else(|| "-".into(), |s| format!("{s:.0}")),
                p["state"].as_str().unwrap_or("?").to_string(),
            ];
            if searched {
                row.push(p["search"].as_str().unwrap_or("-").to_string());
                row.push(at_rungs(p));
            }
            if goyal {
                match GOYAL_REPORTED.get(i) {
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
    let mut out = format!("study {} ({})\n", view["id"].as_str().unwrap_or("?"), view["name"].as_str().unwrap_or(""));
    out += &table(&headers, &rows);
    out += "* the reference point; errors are the last epoch's (test: the finished run's); VS REF in points\n";
    if searched {
        out += "AT RUNGS: the search's metric at each rung reached, ^ promoted past it\n";
    }
    for p in points.iter().filter(|p| p["error"].is_string()) {
        out += &format!("point {}: {}\n", p["point"], p["error"].as_str().unwrap_or(""));
    }
    if searched {
        out += &search_summary(&view["search"], &points);
    }
    out
}

/// A point's figure at each rung it reached, "^" where it was promoted past it: "21.30^ 18.02".
fn at_rungs(point: &Value) -> String {
    let passed = point["rungs_passed"].as_u64().unwrap_or(0) as usize;
    let figures = point["at_rungs"].as_array().cloned().unwrap_or_default();
    if figures.is_empty() {
        return "-".into();
    }
    let marked =
        figures.iter().enumerate().map(|(rung, f)| format!("{}{}", percent(f), if rung < passed { "^" } else { "" }));
    marked.collect::<Vec<_>>().join(" ")
}

/// What the search found: the best point, its multiplier, what was spent and saved, and the spec to submit.
fn search_summary(search: &Value, points: &[Value]) -> String {
    let hours = |v: &Value| v.as_f64().map_or_else(|| "?".into(), |h| format!("{h:.3}"));
    let mut out = format!(
        "search: {}; {} device-hours spent of the full grid's {} (saved {})\n",
        if search["done"] == true { "done" } else { "running" },
        hours(&search["device_hours"]),
        hours(&search["grid_device_hours"]),
        hours(&search["saved_device_hours"]),
    );
    let Some(best) = search["best_point"].as_i64() else { return out + "no point has reached a rung yet\n" };
    let point = points.iter().find(|p| p["point"].as_i64() == Some(best)).cloned().unwrap_or_default();
    let figure = point["final_test_error"].as_f64().or_else(|| point["test_error"].as_array()?.last()?.as_f64());
    out += &format!(
        "best: point {best} ({}){}, test error {}% ({})\n",
        point["label"].as_str().unwrap_or(""),
        search["best_multiplier"].as_f64().map_or_else(String::new, |m| format!(", lr multiplier {m}")),
        percent(&figure.map_or(Value::Null, Value::from)),
        if point["final_test_error"].is_f64() { "final" } else { "so far" },
    );
    if search["best_spec"].is_object() {
        out += &format!("its spec, to submit: {}\n", search["best_spec"]);
    }
    out
}

/// Whether the study was made from the Goyal template (its points are the template's, in order).
fn is_goyal(view: &Value) -> bool {
    let template = ringtrain_core::study::goyal_template();
    serde_json::to_value(&template.points).ok().as_ref() == Some(&view["definition"]["points"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_goyal_study_is_printed_beside_the_paper() {
        let definition = serde_json::to_value(ringtrain_core::study::goyal_template()).unwrap();
        let view = json!({"id": "s", "name": "goyal-miniature", "definition": definition, "states": {"succeeded": 1},
            "points": [{"point": 0, "is_reference": true, "global_batch": 32, "workers": 1, "devices": 1,
                "warmup": "gradual", "scaling": "linear", "scaled_lr": 0.1, "train_error": [0.2, 0.1],
                "final_test_error": 0.0912, "vs_reference": 0.0, "wall_seconds": 300.0, "samples_per_s": 1500.0,
                "state": "succeeded"}]});
        let text = render(&view);
        assert!(text.contains("GOYAL (RESNET-50, IMAGENET)"), "{text}");
        assert!(text.contains("9.12") && text.contains("23.60") && text.contains("kn=256 (reference)"), "{text}");
        assert!(ended(&view));
    }

    #[test]
    fn a_search_prints_each_point_s_standing_and_the_spec_to_submit() {
        let view = json!({"id": "s", "name": "scale", "definition": {}, "states": {"succeeded": 2, "stopped": 1},
            "points": [json!({"point": 0, "is_reference": true, "label": "", "state": "succeeded",
                              "search": "the reference: trains to the end", "test_error": [0.3, 0.2],
                              "final_test_error": 0.1}),
                       json!({"point": 1, "label": "lr.multiplier=1", "state": "stopped", "test_error": [0.3],
                              "search": "stopped at rung 1 (1 epochs)", "at_rungs": [0.3], "rungs_passed": 0}),
                       json!({"point": 2, "label": "lr.multiplier=2", "state": "succeeded", "test_error": [0.25, 0.2, 0.12],
                              "search": "promoted past every rung (2)", "at_rungs": [0.25, 0.2], "rungs_passed": 2,
                              "final_test_error": 0.12})],
            "search": {"done": true, "best_point": 2, "best_multiplier": 5.657, "device_hours": 0.5,
                       "grid_device_hours": 1.25, "saved_device_hours": 0.75, "best_spec": {"workers": 32}}});
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
