//! How a rank's ending reaches the server: the attempt's outcome (retried through a server restart, since
//! the assignment is reported ended only afterwards) and the assignment's final state.

use std::time::Duration;

use ringtrain_client::CallError;
use ringtrain_core::{AssignmentId, AssignmentState, JobId};
use ringtrain_protocol::{ResultAck, ResultReport, Work};

use crate::rank::AgentContext;

/// Reports the assignment ended (from `running`, or `delivered` if its rank never started); retried later,
/// from the poll, when the server cannot be reached now.
pub async fn end_assignment(ctx: &AgentContext, assignment: AssignmentId, to: AssignmentState) {
    let mut last = None;
    for from in [AssignmentState::Running, AssignmentState::Delivered] {
        match ctx.client.set_assignment_state(assignment, from, to).await {
            Ok(()) => return,
            Err(err) => last = Some(err),
        }
    }
    if let Some(err) = last {
        tracing::warn!(%assignment, error = %err, "cannot report the assignment {to} yet");
    }
}

/// Reports an attempt's outcome, retrying for a while when the server cannot be reached (or answers 5xx):
/// the assignment is reported ended only afterwards, so a lost report must not be given up early.
pub async fn report_outcome(ctx: &AgentContext, job: JobId, report: &ResultReport) -> Result<ResultAck, CallError> {
    through_outage(|| ctx.client.report_result(job, report)).await
}

/// Calls `call` until it is answered, refused (4xx other than 429/408), or [`OUTCOME_TRIES`] tries 2 s
/// apart have failed: rides out a server restart.
pub async fn through_outage<T, F, Fut>(mut call: F) -> Result<T, CallError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CallError>>,
{
    let mut tries = 0;
    loop {
        match call().await {
            Err(err) if !err.is_final() && tries < OUTCOME_TRIES => {
                tries += 1;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            outcome => return outcome,
        }
    }
}

/// Tries of an outcome report, 2 s apart: rides out a server restart.
pub const OUTCOME_TRIES: u32 = 60;

pub async fn report_failure(ctx: &AgentContext, work: &Work, error: &str, retryable: bool) {
    let a = &work.assignment;
    match report_outcome(ctx, a.job_id, &ResultReport::failed(a.attempt, error, retryable)).await {
        Ok(answer) => tracing::info!(job_state = %answer.state, "reported failed"),
        // Another rank's agent reported first, or the placement is already over.
        Err(err) if err.is_final() => {}
        Err(err) => tracing::warn!(error = %err, "cannot report the failure"),
    }
}
