//! A job entering its team's queue, whichever way it comes: a submission (a fork too), a resume, a study's
//! points. [`room`] checks that the queue has room for the jobs about to enter (429 when not), and only the
//! [`Room`] it gives can [`Room::enqueue`]: the store call and what follows it (the room's estimate, a
//! fork's starting checkpoint pinned, the scheduler woken). One place, so that the ways in cannot drift
//! apart again (the study's check counted its new jobs, the submission's did not).
//!
//! A search's promotion of a stopped point (`search.rs`) is not a way in: the server resumes a job the
//! study already counted, and it must run whatever the queue holds.

use ringtrain_core::JobId;
use ringtrain_store::{IdempotencyKey, Job, NewJob, NewStudy, Study, Submitted};

use crate::auth::User;
use crate::error::{ApiError, ApiResult, ProblemType};
use crate::state::AppState;

/// What enters the queue.
#[derive(Debug)]
pub enum Entry {
    /// A new job (a fork too), with its submission's Idempotency-Key if it had one.
    Job(Box<NewJob>, Option<IdempotencyKey>),
    /// A failed, cancelled or stopped job queued again; `reason` goes into its events.
    Resume { job: JobId, reason: String },
    /// A study and its points' new jobs, stored in one transaction.
    Study(NewStudy, Vec<NewJob>),
}

impl Entry {
    fn jobs(&self) -> i64 {
        match self {
            Entry::Job(..) | Entry::Resume { .. } => 1,
            Entry::Study(_, jobs) => jobs.len() as i64,
        }
    }
}

/// What the store made of an [`Entry`].
#[derive(Debug)]
pub enum Entered {
    Job(Submitted),
    /// None when the job is gone.
    Resumed(Option<Job>),
    Study(Study, Vec<Job>),
}

impl Entered {
    /// The jobs that entered the queue now (none for a replayed submission).
    fn new_jobs(&self) -> &[Job] {
        match self {
            Entered::Job(Submitted::Created(job)) | Entered::Resumed(Some(job)) => std::slice::from_ref(job),
            Entered::Job(_) | Entered::Resumed(None) => &[],
            Entered::Study(_, jobs) => jobs,
        }
    }
}

/// Room in the team's queue for some jobs, checked: the only way to [`Room::enqueue`].
#[derive(Debug)]
#[must_use = "a room is checked to enqueue into it"]
pub struct Room<'a> {
    state: &'a AppState,
    user: &'a User,
    jobs: i64,
}

/// Checks that `user`'s team may queue `jobs` more jobs (429 with a Retry-After when not, `then` saying
/// what to do later: "submit again").
pub async fn room<'a>(state: &'a AppState, user: &'a User, jobs: i64, then: &str) -> ApiResult<Room<'a>> {
    let limit = state.config.max_queued_per_team;
    let fits = Room { state, user, jobs };
    if state.queue_room.surely_room(user.team_id, jobs, limit) {
        return Ok(fits);
    }
    let queued = state.store.count_queued(user.team_id).await?;
    state.queue_room.counted(user.team_id, queued);
    if queued + jobs <= limit {
        return Ok(fits);
    }
    let reason = match jobs {
        1 => format!("your team has {queued} queued jobs, the most it may; {then} when some have started"),
        _ => format!(
            "these {jobs} new jobs would make {} queued jobs; your team may have {limit}; {then} when some have \
             started",
            queued + jobs
        ),
    };
    Err(ApiError::too_many(ProblemType::QueueFull, reason, 60))
}

impl Room<'_> {
    /// Stores `entry` (at most as many jobs as the room was checked for), then counts its jobs into the
    /// room's estimate, pins each new fork's starting checkpoint and wakes the scheduler.
    pub async fn enqueue(self, entry: Entry) -> ApiResult<Entered> {
        let Room { state, user, jobs } = self;
        if entry.jobs() > jobs {
            return Err(ApiError::internal_msg(format!("{} jobs enqueued into room for {jobs}", entry.jobs())));
        }
        let entered = match entry {
            Entry::Job(job, key) => Entered::Job(state.store.submit_job(*job, key).await?),
            Entry::Resume { job, reason } => Entered::Resumed(state.store.resume_job(job, &reason).await?),
            Entry::Study(study, jobs) => {
                let (study, jobs) = state.store.create_study(study, jobs).await?;
                Entered::Study(study, jobs)
            }
        };
        let new_jobs = entered.new_jobs();
        if new_jobs.is_empty() {
            return Ok(entered);
        }
        state.queue_room.queued(user.team_id, new_jobs.len() as i64);
        // a resumed fork's starting checkpoint was pinned beside it when it was first stored
        if !matches!(entered, Entered::Resumed(_)) {
            for job in new_jobs {
                super::fork::pin_for(state, job).await?;
            }
        }
        state.changed().await;
        Ok(entered)
    }
}
