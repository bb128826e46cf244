//! Where queued jobs stand: the scheduler's own policy, run on the view of the cluster its loop would read
//! now (same rows, same settings), so a job's reason and place in the queue are what the next pass decides,
//! on every server alike, with nothing written per pass. The plan is cached until something changes (the
//! change notifier moves) or for a second, so a page of jobs costs one plan, not one per job.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringtrain_core::{JobId, JobState};
use ringtrain_scheduler::{
    estimate_start, read_queue_view, ClusterView, DeviceKind, Estimate, Plan, QueueView, Timeline, Verdict, WaitReason,
};
use ringtrain_store::{Job, Store, StoreResult};
use ringtrain_views::jobs::{EstimatedStart, PendingReason};
use serde_json::Value;
use uuid::Uuid;

use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// How long a cached plan answers when nothing announced a change (heartbeats and metrics do not).
const FRESH_FOR: Duration = Duration::from_secs(1);

/// How long a preempted job is assumed to take to checkpoint and stop, in estimates.
const STOP_SECONDS: f64 = 30.0;

/// At most this many steps (policy passes) per estimate.
const ESTIMATE_STEPS: usize = 64;

/// The policy's view of the queue at one moment.
#[derive(Debug)]
pub struct QueueInsight {
    pub read: QueueView,
    pub plan: Plan,
}

#[derive(Debug, Default)]
pub struct QueueCache {
    latest: Mutex<Option<(u64, Instant, Arc<QueueInsight>)>>,
}

impl AppState {
    /// The queue as the next pass would see and decide it (cached briefly).
    pub async fn queue_insight(&self) -> ApiResult<Arc<QueueInsight>> {
        let version = self.changes.version();
        if let Some((seen, at, insight)) = self.queue.latest.lock().expect("not poisoned").as_ref() {
            if *seen == version && at.elapsed() < FRESH_FOR {
                return Ok(insight.clone());
            }
        }
        let read = read_queue_view(self.store.as_ref(), &self.config.scheduling).await?;
        let plan = ringtrain_scheduler::plan(&read.view);
        let insight = Arc::new(QueueInsight { read, plan });
        *self.queue.latest.lock().expect("not poisoned") = Some((version, Instant::now(), insight.clone()));
        Ok(insight)
    }
}

/// A queued job's standing.
#[derive(Debug, Clone)]
pub struct Standing {
    pub position: Option<u32>,
    pub reason: WaitReason,
}

impl QueueInsight {
    /// Where queued `job` stands; None for jobs that are not queued.
    pub fn standing(&self, job: &Job) -> Option<Standing> {
        if job.state != JobState::Queued {
            return None;
        }
        if let Some(reason) = self.read.over_budget.get(&job.team_id) {
            return Some(Standing { position: None, reason: reason.clone() });
        }
        if self.read.stopping.contains(&job.id) {
            return Some(Standing { position: None, reason: WaitReason::PreviousPlacementStopping });
        }
        match self.plan.verdict(job.id) {
            Some(Verdict::Start { .. }) => Some(Standing { position: None, reason: WaitReason::StartingNextPass }),
            Some(Verdict::Reclaim { position, reason, .. } | Verdict::Wait { position, reason }) => {
                Some(Standing { position, reason })
            }
            None => self.beyond_window(job.team_id, job.device).then_some(Standing {
                position: None,
                reason: WaitReason::BeyondQueueWindow { window: self.read.config.queue_window },
            }),
        }
    }

    /// Whether the pass's window of this team's queue of `kind` is full (a job outside it is not planned).
    pub fn beyond_window(&self, team: ringtrain_core::TeamId, kind: DeviceKind) -> bool {
        let listed = self.read.view.queued.iter().filter(|q| q.team == team && q.kind == kind).count();
        listed as i64 >= self.read.config.queue_window
    }

    /// What the simulation knows of the running jobs: their ends from their progress and rate, and when
    /// the protected ones become preemptible.
    pub async fn timeline(&self, store: &dyn Store) -> StoreResult<Timeline> {
        let mut timeline = Timeline { stop_seconds: STOP_SECONDS, max_steps: ESTIMATE_STEPS, ..Default::default() };
        let now = ringtrain_store::now();
        let min_run = chrono::Duration::from_std(self.read.config.min_run_before_preemption).unwrap_or_default();
        for running in self.read.view.running.iter().filter(|r| !r.preempting) {
            if let Some(seconds) = seconds_left(store, running.id).await? {
                timeline.ends_in.insert(running.id, seconds);
            }
            if let Some(placed) = self.read.placed_at.get(&running.id).filter(|_| !running.preemptible) {
                let left = (*placed + min_run - now).num_milliseconds() as f64 / 1e3;
                timeline.preemptible_in.insert(running.id, left.max(0.0));
            }
        }
        Ok(timeline)
    }
}

/// A running job's seconds left at its current rate: iterations left × global batch / rank 0's newest
/// samples per second. None until it has reported a rate.
async fn seconds_left(store: &dyn Store, id: JobId) -> StoreResult<Option<f64>> {
    let Some(job) = store.get_job(id).await? else { return Ok(None) };
    let Some(effective) = &job.effective else { return Ok(None) };
    let batch = effective.global_batch as f64;
    Ok(crate::progress::live_progress(store, &job).await?.and_then(|p| p.seconds_left(batch)))
}

/// A reason as the API shows it: its code and numbers, and a sentence.
pub fn pending_reason(reason: &WaitReason) -> PendingReason {
    let details = match serde_json::to_value(reason) {
        Ok(Value::Object(mut fields)) => {
            fields.remove("code");
            fields
        }
        _ => serde_json::Map::new(),
    };
    PendingReason { code: reason.code().to_string(), message: reason.to_string(), details }
}

/// How another team's job is named to a reader who may not see its id.
const FOREIGN_JOB: &str = "a job of another team";

/// Who reads a queue explanation, and which ids it may see there. Another team's job and team ids are
/// shown to platform admins only: to a tenant they would reveal the other team's activity and give the
/// UUIDs that name its checkpoint files and work dirs (security review 3, N-L1).
#[derive(Debug)]
pub struct Reader {
    sees_every_id: bool,
    /// The ids a tenant may see: its team, its own jobs, and the nodes (public on `/v1/nodes`). Any other
    /// uuid is hidden, so an id the view does not know is hidden rather than leaked.
    visible: HashSet<Uuid>,
}

impl Reader {
    pub fn new(user: &User, view: &ClusterView) -> Reader {
        let team = user.team_id;
        let queued = view.queued.iter().filter(|q| q.team == team).map(|q| q.id.0);
        let running = view.running.iter().filter(|r| r.team == team).map(|r| r.id.0);
        let nodes = view.nodes.iter().map(|n| n.id.0);
        let visible = std::iter::once(team.0).chain(queued).chain(running).chain(nodes).collect();
        Reader { sees_every_id: user.is_platform_admin(), visible }
    }

    fn may_see(&self, id: Uuid) -> bool {
        self.sees_every_id || self.visible.contains(&id)
    }

    pub fn may_see_job(&self, id: JobId) -> bool {
        self.may_see(id.0)
    }

    /// `reason_json` as this reader may see it.
    pub fn pending_reason(&self, reason: &WaitReason) -> PendingReason {
        self.hidden_reason(pending_reason(reason))
    }

    /// `reason` with the ids and sentences this reader may not see hidden (see [`Reader::hide_ids`]).
    pub fn hidden_reason(&self, mut reason: PendingReason) -> PendingReason {
        reason.message = self.words(&reason.message);
        reason.details.values_mut().for_each(|field| self.hide_ids(field));
        reason
    }

    /// `estimate` as this reader may see it: other teams' jobs null, and "a job of another team" in words.
    pub fn estimate(&self, mut estimate: EstimatedStart) -> EstimatedStart {
        estimate.basis = self.words(&estimate.basis);
        estimate.jobs = estimate.jobs.into_iter().map(|job| job.filter(|id| self.may_see_job(*id))).collect();
        estimate
    }

    /// Replaces every hidden id in `value` by null and names hidden jobs in its sentences as "a job of
    /// another team", wherever they are (victims' jobs and teams, awaited and protected jobs, messages): a
    /// new reason's fields need no list here.
    pub fn hide_ids(&self, value: &mut Value) {
        match value {
            Value::String(text) => match text.parse::<Uuid>() {
                Ok(id) if !self.may_see(id) => *value = Value::Null,
                Ok(_) => {}
                Err(_) => *text = self.words(text),
            },
            Value::Array(items) => items.iter_mut().for_each(|item| self.hide_ids(item)),
            Value::Object(fields) => fields.values_mut().for_each(|field| self.hide_ids(field)),
            _ => {}
        }
    }

    /// `text` with each "job <id>" of a hidden job replaced by "a job of another team" (the policy's
    /// sentences name jobs only that way).
    pub fn words(&self, text: &str) -> String {
        const PREFIX: &str = "job ";
        const UUID_LEN: usize = 36;
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find(PREFIX) {
            out.push_str(&rest[..at]);
            let named = &rest[at..];
            let id = named.get(PREFIX.len()..PREFIX.len() + UUID_LEN).and_then(|id| id.parse::<Uuid>().ok());
            match id {
                Some(id) if !self.may_see(id) => {
                    out.push_str(FOREIGN_JOB);
                    rest = &named[PREFIX.len() + UUID_LEN..];
                }
                _ => {
                    out.push_str(PREFIX);
                    rest = &named[PREFIX.len()..];
                }
            }
        }
        out.push_str(rest);
        out
    }
}

/// The start an estimate of the policy's predicts, in the API's words.
pub fn estimated_start(estimate: &Estimate) -> EstimatedStart {
    match estimate {
        Estimate::Now => EstimatedStart {
            kind: "now".into(),
            seconds: Some(0.0),
            at: Some(ringtrain_store::now()),
            jobs: Vec::new(),
            basis: "devices are free for it: the next scheduler pass starts it".into(),
        },
        Estimate::At { seconds, after } => {
            let at = ringtrain_store::now() + chrono::Duration::milliseconds((seconds * 1e3) as i64);
            let basis = match after.as_slice() {
                [] => format!("in ~{}", duration_words(*seconds)),
                [one] => format!("after job {one} ends, in ~{} at its current rate", duration_words(*seconds)),
                many => format!(
                    "after {} jobs end (or stop), in ~{} at their current rates",
                    many.len(),
                    duration_words(*seconds)
                ),
            };
            EstimatedStart { kind: "at".into(), seconds: Some(*seconds), at: Some(at), jobs: named(after), basis }
        }
        Estimate::Unknown { depends_on } => EstimatedStart {
            kind: "unknown".into(),
            seconds: None,
            at: None,
            jobs: named(depends_on),
            basis: if depends_on.is_empty() {
                "it cannot be estimated: nothing known to end would let it start".into()
            } else {
                format!(
                    "it depends on {} job{} that {} not reported a rate yet",
                    depends_on.len(),
                    if depends_on.len() == 1 { "" } else { "s" },
                    if depends_on.len() == 1 { "has" } else { "have" }
                )
            },
        },
    }
}

fn named(jobs: &[JobId]) -> Vec<Option<JobId>> {
    jobs.iter().copied().map(Some).collect()
}

/// "45 s", "14 min", "3.2 h".
pub(crate) fn duration_words(seconds: f64) -> String {
    if seconds < 90.0 {
        format!("{} s", seconds.round())
    } else if seconds < 5400.0 {
        format!("{} min", (seconds / 60.0).round())
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}

/// Estimates the start of `job` in `view` (`insight`'s, or it with a dry run's job added).
pub async fn estimate(
    state: &AppState,
    insight: &QueueInsight,
    view: ringtrain_scheduler::ClusterView,
    job: JobId,
) -> ApiResult<EstimatedStart> {
    let timeline = insight.timeline(state.store.as_ref()).await?;
    let estimate =
        tokio::task::spawn_blocking(move || estimate_start(&view, job, &timeline)).await.map_err(ApiError::internal)?;
    Ok(estimated_start(&estimate))
}

/// Standing of several jobs at once (a page of the run history).
pub fn standings(insight: &QueueInsight, jobs: &[Job]) -> HashMap<JobId, Standing> {
    jobs.iter().filter_map(|job| insight.standing(job).map(|s| (job.id, s))).collect()
}
