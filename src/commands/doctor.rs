//! `ringtrain doctor`: what this binary and machine can do (libtorch, CUDA devices, cuDNN, NCCL, CPU threads,
//! data sets), as a table or `--json`. Node agents run it at start to check the GPUs they are asked to offer.

use std::process::ExitCode;

use ringtrain_protocol::doctor::DoctorReport;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> ExitCode {
    let report = ringtrain_worker::doctor::probe();
    let sandbox = ringtrain_sandbox::probe();
    if args.json {
        let mut json = serde_json::to_value(&report).unwrap_or_default();
        json["sandbox"] = serde_json::to_value(&sandbox).unwrap_or_default();
        match serde_json::to_string_pretty(&json) {
            Ok(text) => println!("{text}"),
            Err(err) => {
                eprintln!("doctor: error: {err}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", table(&report));
        print!("{}", sandbox_table(&sandbox));
    }
    ExitCode::SUCCESS
}

/// What confines tenant code here (see `ringtrain_sandbox`), and what an operator must do where it cannot.
fn sandbox_table(s: &ringtrain_sandbox::Support) -> String {
    let mut rows: Vec<(String, String)> = vec![("sandbox".into(), s.to_string())];
    if !s.can_confine() {
        rows.push((
            "  tenant code".into(),
            format!("REFUSED: lacks {}; --allow-unsandboxed runs it unconfined", s.missing().join(" and ")),
        ));
    }
    if s.can_confine() && !s.can_scope_sockets() {
        rows.push(("  GPU ranks".into(), format!("REFUSED: {}", ringtrain_sandbox::support::NO_SOCKET_SCOPE)));
    }
    rows.push(("  Unix sockets".into(), unix_socket_rule(s).into()));
    if s.root {
        let user = ringtrain_sandbox::user::DEFAULT_RANK_USER;
        let found = ringtrain_sandbox::RankUser::lookup(user);
        rows.push((
            "  rank user".into(),
            match found {
                Ok(u) => format!("{} (uid {}, gid {})", u.name, u.uid, u.gid),
                Err(why) => why,
            },
        ));
    }
    let denied: Vec<&str> = ringtrain_sandbox::syscalls::denied_names().collect();
    rows.push(("  system calls refused".into(), format!("{} ({}, ...)", denied.len(), denied[..6].join(", "))));
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0).max(24);
    rows.iter().map(|(k, v)| format!("{k:width$}  {v}\n")).collect()
}

/// What tenant code may do with Unix sockets here (see `ringtrain_sandbox::syscalls`).
fn unix_socket_rule(s: &ringtrain_sandbox::Support) -> &'static str {
    match (s.seccomp, s.can_scope_sockets()) {
        (false, _) => "NOT confined (no seccomp)",
        (true, true) => "none for CPU ranks and checks; GPU ranks: NCCL's datagram kind, scoped to the rank",
        (true, false) => "none for CPU ranks and checks; GPU ranks refused (abstract sockets cannot be scoped)",
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// The report as aligned `what  value` lines.
pub fn table(r: &DoctorReport) -> String {
    let mut rows: Vec<(String, String)> = vec![
        ("ringtrain".into(), r.ringtrain_version.clone()),
        ("libtorch (built against)".into(), r.libtorch.version.clone()),
        ("libtorch CUDA build".into(), yes_no(r.libtorch.cuda_build).into()),
        ("CUDA available".into(), yes_no(r.cuda.available).into()),
        ("CUDA devices (libtorch)".into(), r.cuda.device_count.to_string()),
    ];
    for gpu in &r.cuda.devices {
        rows.push((
            format!("  GPU {}", gpu.index),
            format!("{}, {:.1} GiB", gpu.name, gpu.memory_bytes as f64 / f64::from(1u32 << 30)),
        ));
    }
    rows.push(("driver CUDA".into(), r.cuda.driver_cuda.clone().unwrap_or_else(|| "-".into())));
    rows.push(("cuDNN".into(), r.cuda.cudnn_version.map_or("-".into(), |v| v.to_string())));
    if let Some(v) = &r.cuda.visible_devices {
        rows.push(("CUDA_VISIBLE_DEVICES".into(), v.clone()));
    }
    if let Some(why) = &r.cuda.why_not {
        rows.push(("why no CUDA".into(), why.clone()));
    }
    let nccl = match (&r.nccl.version, &r.nccl.error) {
        (Some(v), _) => format!("yes, {v}"),
        (None, Some(e)) => format!("no: {e}"),
        (None, None) => yes_no(r.nccl.loadable).into(),
    };
    rows.push(("NCCL".into(), nccl));
    rows.push(("CPU threads".into(), format!("{} (libtorch uses {})", r.cpu_threads, r.libtorch_threads)));
    for d in &r.datasets {
        rows.push((
            format!("dataset {}", d.name),
            format!("{} ({})", if d.present { "present" } else { "missing" }, d.path),
        ));
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter().map(|(k, v)| format!("{k:width$}  {v}\n")).collect()
}
