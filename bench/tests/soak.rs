//! The fault-injection soak, shortened for CI: `ringtrain-bench soak` with 3 agents, 3 teams and 12 jobs on
//! each database, every kind of fault injected (rank and agent kill -9, server kill -9 and restart, the
//! database taken away). The soak itself checks that every job succeeded exactly once with every metric
//! once and results bit-for-bit those of undisturbed runs, and that no slot was booked twice; this test
//! runs it and checks its report. `ringtrain-bench soak` (30 jobs, more faults) is the full version. It starts
//! the `ringtrain` binary cargo built beside `ringtrain-bench` (`cargo nextest run --workspace` builds both).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The product binary the soak starts: cargo puts it beside `ringtrain-bench`.
fn ringtrain() -> PathBuf {
    let product = PathBuf::from(env!("CARGO_BIN_EXE_ringtrain-bench")).with_file_name("ringtrain");
    assert!(product.is_file(), "{} is missing: build it too (cargo build -p ringtrain)", product.display());
    product
}

fn soak(database: &str) {
    let dir = std::env::temp_dir().join(format!("ringtrain-e2e-{}-soak-{database}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut command = Command::new(env!("CARGO_BIN_EXE_ringtrain-bench"));
    command
        .arg("--ringtrain")
        .arg(ringtrain())
        .args(["soak", "--json", "--databases", database, "--jobs", "12", "--train-samples", "9000"])
        .args(["--rank-kills", "3", "--agent-kills", "1", "--server-restarts", "1", "--database-drops", "1"])
        // the faults must all land before the jobs end (the soak stops when they have): 6 faults 0.5-1.5 s
        // apart plus their outages (up to 6 s a server restart, 5 s the database drop, 4 s an agent kill)
        // take up to ~25 s; 12 jobs of 9,000 samples train longer than that here, with the restarts they cause
        .args(["--fault-every-s", "1", "--seed", "7", "--timeout-s", "900", "--work-dir"])
        .arg(&dir);
    if let Ok(server) = std::env::var("DATABASE_URL") {
        // the soak makes its own database on this server and drops it afterwards
        command.args(["--postgres-url", &server]);
    }
    let output = command.output().expect("run ringtrain-bench soak");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stderr}");
    assert!(output.status.success(), "the soak failed: {stdout}");
    let report: Value = serde_json::from_str(stdout.trim()).expect("one JSON report");
    assert_eq!(report["database"], database);
    assert_eq!(report["violations"], serde_json::json!([]), "{report}");
    assert_eq!(report["succeeded"], 12, "{report}");
    let faults = report["fault_log"].as_array().unwrap();
    assert_eq!(faults.len(), 6, "every planned fault was injected: {report}");
    for kind in ["rank_kill", "agent_kill", "server_restart", "database_drop"] {
        assert!(faults.iter().any(|f| f["kind"] == kind), "no {kind} in {report}");
    }
    // A killed rank costs its job a restart from its last checkpoint.
    assert!(report["job_restarts"].as_i64().unwrap() >= 1, "{report}");
    assert!(report["api_p99_ms"].as_f64().unwrap() > 0.0, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_soak_loses_nothing_on_sqlite() {
    soak("sqlite");
}

/// Postgres from DATABASE_URL (scripts/test.sh sets it; missing is a failure, not a skip).
#[test]
fn the_soak_loses_nothing_on_postgres() {
    assert!(std::env::var("DATABASE_URL").is_ok(), "DATABASE_URL must name a Postgres server");
    soak("postgres");
}
