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

/// The longest a self-test may take: a node slower than this is reported as failing it.
const SELF_TEST_LIMIT: Duration = Duration::from_secs(120);

/// Runs `exe self-test --json` as a rank would start (its exit status says only whether a check failed: the
/// report says which). A test that cannot run, or runs past its limit, is a failed check of its own.
pub async fn run(exe: &Path) -> SelfTestReport {
    match ask(exe).await {
        Ok(report) => report,
        Err(err) => SelfTestReport {
            checks: vec![SelfTestCheck { name: "self-test".into(), passed: false, detail: format!("{err:#}") }],
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

/// Sends the report; logs what the server made of it.
pub async fn report(client: &Client, node: NodeId, report: &SelfTestReport) {
    match (client.self_test(node, report).await, report.failure()) {
        (Ok(node), _) if node.quarantine.is_some() => {
            tracing::warn!(reason = node.quarantine.as_deref().unwrap_or_default(), "this node is in quarantine")
        }
        (Ok(_), None) => tracing::info!("self-test passed"),
        (Ok(_), Some(failure)) => tracing::warn!(%failure, "self-test failed"),
        (Err(err), _) => tracing::warn!(error = %err, "the self-test's report did not get through"),
    }
}
