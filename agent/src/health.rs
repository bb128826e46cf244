//! The node's self-test (`ringtrain self-test`: a known matrix product in libtorch, a known all-reduce over
//! shared memory), run by the agent before it registers and again every `--self-test-every-min` while no
//! rank runs here (a test beside training would slow it and be slowed). The report goes to the server,
//! which sets a node that failed aside: no new placements until a platform admin lifts it.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use ringtrain_core::NodeId;
use ringtrain_protocol::{SelfTestCheck, SelfTestReport};
use tokio::process::Command;

use crate::client::Client;

/// Tries of a report the server did not take (no answer, or a 5xx).
const REPORT_TRIES: u32 = 5;

/// The longest a self-test may take (past it, it did not run: see [`SelfTestCheck::ran`]).
const SELF_TEST_LIMIT: Duration = Duration::from_secs(120);

/// Runs `exe self-test --json` as a rank would start (its exit status says only whether a check failed: the
/// report says which). A test that cannot run, or runs past its limit, is a failed check of its own.
pub async fn run(exe: &Path) -> SelfTestReport {
    match ask(exe).await {
        Ok(report) => report,
        Err(err) => SelfTestReport {
            checks: vec![SelfTestCheck {
                name: "self-test".into(),
                passed: false,
                detail: format!("{err:#}"),
                ran: false,
            }],
        },
    }
}

async fn ask(exe: &Path) -> Result<SelfTestReport> {
    let run =
        Command::new(exe).args(["self-test", "--json"]).env_remove("CUDA_VISIBLE_DEVICES").kill_on_drop(true).output();
    let output = tokio::time::timeout(SELF_TEST_LIMIT, run)
        .await
        .with_context(|| format!("`ringtrain self-test` did not finish within {} s", SELF_TEST_LIMIT.as_secs()))?
        .with_context(|| format!("cannot run {} self-test", exe.display()))?;
    serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "`ringtrain self-test` ({}) printed no report: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
    })
}

/// Sends the report (a few times through a server that does not answer: a node that computes wrong must
/// not take work because its report was lost); logs what the server made of it.
pub async fn report(client: &Client, node: NodeId, report: &SelfTestReport) {
    if let Some(why) = report.checks.iter().find(|c| !c.ran).map(|c| c.detail.clone()) {
        tracing::warn!(%why, "the self-test could not run: nothing is concluded of this node");
    }
    let mut sent = client.self_test(node, report).await;
    for _ in 0..REPORT_TRIES {
        match &sent {
            Err(err) if !err.is_final() => {
                tokio::time::sleep(Duration::from_secs(2)).await;
                sent = client.self_test(node, report).await;
            }
            _ => break,
        }
    }
    match (sent, report.failure()) {
        (Ok(node), _) if node.quarantine.is_some() => {
            tracing::warn!(reason = node.quarantine.as_deref().unwrap_or_default(), "this node is in quarantine")
        }
        (Ok(_), None) => tracing::info!("self-test passed"),
        (Ok(_), Some(failure)) => tracing::warn!(%failure, "self-test failed"),
        (Err(err), _) => tracing::warn!(error = %err, "the self-test's report did not get through"),
    }
}
