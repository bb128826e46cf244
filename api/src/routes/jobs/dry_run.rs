//! `POST /v1/jobs?dry_run=true`: what the scheduler would do with a submission now, with nothing stored.
//! The policy plans the loop's own view of the cluster with the job added (`ringtrain_scheduler::dry_run`),
//! so the answer is what the next pass would decide for that view.

use ringtrain_core::{Effective, JobId, JobSpec};
use ringtrain_scheduler::{DeviceSlot, QueuedJob, Verdict, WaitReason};

use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::queue::{self, pending_reason};
use crate::state::AppState;

pub use ringtrain_views::jobs::waiting::{DryRunView, PlannedDevice, PlannedPreemption};

fn devices(slots: &[DeviceSlot]) -> Vec<PlannedDevice> {
    slots.iter().map(|s| PlannedDevice { node_id: s.node.0, index: s.index }).collect()
}

/// Answers a dry run of `spec` (already validated) for `user`'s team.
pub async fn answer(
    state: &AppState,
    user: &User,
    spec: &JobSpec,
    effective: Option<Effective>,
) -> ApiResult<DryRunView> {
    let insight = state.queue_insight().await?;
    let mut counts = spec.allowed_total_device_counts();
    let job = QueuedJob {
        id: JobId::new(),
        team: user.team_id,
        priority: spec.priority,
        kind: spec.device,
        // an elastic job needs its smallest count, and starts on the largest that fits
        devices: if counts.is_empty() { spec.total_devices() } else { counts.remove(0) },
        // submitted after every job already queued
        submit_seq: u64::MAX,
        larger: counts,
        node_group: spec.stages(),
    };
    let mut view = DryRunView {
        dry_run: true,
        verdict: "wait".into(),
        message: String::new(),
        devices: Vec::new(),
        within_guarantee: None,
        borrowed: None,
        preempts: Vec::new(),
        queue_position: None,
        pending_reason: None,
        estimated_start: None,
        delays: Vec::new(),
        effective,
        stages: crate::submission::checks::stage_memory(state, user, spec).await?,
    };
    let held_back = match insight.read.over_budget.get(&user.team_id) {
        Some(reason) => Some(reason.clone()),
        None => insight
            .beyond_window(user.team_id, spec.device)
            .then_some(WaitReason::BeyondQueueWindow { window: insight.read.config.queue_window }),
    };
    if let Some(reason) = held_back {
        view.message = reason.to_string();
        view.pending_reason = Some(pending_reason(&reason));
        return Ok(view);
    }
    let (cluster, planned_job) = (insight.read.view.clone(), job.clone());
    let planned = tokio::task::spawn_blocking(move || ringtrain_scheduler::dry_run(&cluster, planned_job))
        .await
        .map_err(ApiError::internal)?
        .ok_or_else(|| ApiError::internal_msg("the policy did not plan the job"))?;
    view.verdict = planned.verdict.name().into();
    view.delays = planned.delays;
    match planned.verdict {
        Verdict::Start { devices: slots, nodes, within_guarantee, borrowed } => {
            view.message = format!(
                "starts now on {} {} device{} of {} node{} ({} within the team's guarantee, {} borrowed)",
                slots.len(),
                spec.device.as_str(),
                if slots.len() == 1 { "" } else { "s" },
                nodes.len(),
                if nodes.len() == 1 { "" } else { "s" },
                within_guarantee,
                borrowed
            );
            let most = spec.device_count() as usize;
            if spec.is_elastic() && slots.len() < most {
                view.message += &format!(
                    "; elastic: {} of its up to {most}, it grows when devices stay idle with nobody waiting",
                    slots.len()
                );
            }
            view.devices = devices(&slots);
            view.within_guarantee = Some(within_guarantee);
            view.borrowed = Some(borrowed);
        }
        Verdict::Reclaim { held, awaiting, position, reason } => {
            if let WaitReason::Reclaiming { victims, .. } = &reason {
                view.preempts = victims.iter().map(|v| PlannedPreemption { job_id: v.job, team_id: v.team }).collect();
            }
            view.devices = devices(&[held, awaiting].concat());
            view.queue_position = position;
            view.message = reason.to_string();
            view.pending_reason = Some(pending_reason(&reason));
        }
        Verdict::Wait { position, reason } => {
            view.queue_position = position;
            view.message = reason.to_string();
            view.pending_reason = Some(pending_reason(&reason));
        }
    }
    if view.verdict != "start" {
        let mut cluster = insight.read.view.clone();
        let id = job.id;
        cluster.queued.push(job);
        view.estimated_start = Some(queue::estimate(state, &insight, cluster, id).await?);
    }
    Ok(view)
}
