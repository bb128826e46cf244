//! A job entering its team's queue, whichever way it comes: a submission (a fork too), a resume, a study's
//! points. [`room`] checks that the queue has room for the jobs about to enter (429 when not), and only the
//! [`Room`] it gives can store them ([`Room::submit`], [`Room::resume`], [`Room::study`]) and do what
//! follows (the room's estimate, a fork's starting checkpoint pinned, the scheduler woken). One place, so that the ways in cannot drift
//! apart again (the study's check counted its new jobs, the submission's did not).
//!
//! A search's promotion of a stopped point (`search.rs`) is not a way in: the server resumes a job the
//! study already counted, and it must run whatever the queue holds.

use ringtrain_core::JobId;
use ringtrain_store::{IdempotencyKey, Job, NewJob, NewStudy, Study, Submitted};

use crate::auth::User;
use crate::error::{ApiError, ApiResult, ProblemType};
use crate::state::AppState;

/// Room in the team's queue for some jobs, checked: the only way to store them.
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
    /// Stores a new job (a fork too), with its submission's Idempotency-Key if it had one.
    pub async fn submit(self, job: NewJob, key: Option<IdempotencyKey>) -> ApiResult<Submitted> {
        let submitted = self.state.store.submit_job(job, key).await?;
        // a replayed submission entered the queue when it was first made
        if let Submitted::Created(job) = &submitted {
            self.entered(std::slice::from_ref(job), true).await?;
        }
        Ok(submitted)
    }

    /// Queues a failed, cancelled or stopped job again, `reason` going into its events; None when it is gone.
    pub async fn resume(self, job: JobId, reason: &str) -> ApiResult<Option<Job>> {
        let resumed = self.state.store.resume_job(job, reason).await?;
        // a resumed fork's starting checkpoint was pinned beside it when it was first stored
        if let Some(job) = &resumed {
            self.entered(std::slice::from_ref(job), false).await?;
        }
        Ok(resumed)
    }

    /// Stores a study and its points' new jobs (at most as many as the room was checked for) in one
    /// transaction.
    pub async fn study(self, study: NewStudy, jobs: Vec<NewJob>) -> ApiResult<(Study, Vec<Job>)> {
        if jobs.len() as i64 > self.jobs {
            return Err(ApiError::internal_msg(format!("{} jobs enqueued into room for {}", jobs.len(), self.jobs)));
        }
        let (study, jobs) = self.state.store.create_study(study, jobs).await?;
        self.entered(&jobs, true).await?;
        Ok((study, jobs))
    }

    /// What follows jobs entering the queue: the room's estimate counts them, each new fork's starting
    /// checkpoint is pinned (`pin`), the scheduler is woken.
    async fn entered(&self, jobs: &[Job], pin: bool) -> ApiResult<()> {
        self.state.queue_room.queued(self.user.team_id, jobs.len() as i64);
        if pin {
            for job in jobs {
                super::fork::pin_for(self.state, job).await?;
            }
        }
        self.state.changed().await;
        Ok(())
    }
}
