//! Which checkpoint a job's next placement resumes from: the newest one that every rank's reports reached.
//!
//! A rank's metric lines reach the server through its node's agent, a few hundred milliseconds behind the
//! rank; rank 0's checkpoints travel through rank 0's agent. When another rank's agent dies just after an
//! epoch ends, that rank's last lines die with it while rank 0's checkpoint of the epoch's end arrives:
//! resuming from that checkpoint would never report those lines again, and the job would succeed with a
//! gap in that rank's curve. Stepping back to a checkpoint every rank's reports reached re-trains those
//! iterations (bit for bit the same) and reports them.

use ringtrain_store::{Checkpoint, RankProgress};

/// What the rule needs to know of the job.
#[derive(Debug, Clone)]
pub struct ReportShape {
    /// The rank processes that report (the job's devices), unless `ranks_by_placement` says otherwise.
    pub ranks: i32,
    /// The rank processes of each placement (`attempt`) that wrote a checkpoint: an elastic job's
    /// placements differ, and only the writer's ranks owe the reports up to its checkpoint (ranks beyond them
    /// reported, if ever, in an earlier and larger placement).
    pub ranks_by_placement: std::collections::BTreeMap<i32, i32>,
    /// A rank reports iterations i with (i + 1) % log_every == 0, and each epoch's last.
    pub log_every: i64,
    pub iterations_per_epoch: i64,
}

impl ReportShape {
    /// The last iteration before `next` that every rank reports (-1: none).
    fn last_reported_before(&self, next: i64) -> i64 {
        let every = self.log_every.max(1);
        let ipe = self.iterations_per_epoch.max(1);
        ((next / every) * every - 1).max((next / ipe) * ipe - 1)
    }

    /// Whether every rank's reports reached checkpoint `next` (its first iteration not trained): each
    /// rank's newest iteration line is at least the last one it writes before `next`, and it reported every
    /// epoch that ended before it.
    fn reached(&self, progress: &[RankProgress], next: i64, placement: i32) -> bool {
        let line = self.last_reported_before(next);
        let epochs = next / self.iterations_per_epoch.max(1);
        let ranks = self.ranks_by_placement.get(&placement).copied().unwrap_or(self.ranks);
        (0..ranks).all(|rank| match progress.iter().find(|p| p.rank == rank) {
            Some(p) => p.newest_iteration.unwrap_or(-1) >= line && p.epochs >= epochs,
            None => line < 0 && epochs == 0,
        })
    }
}

/// The newest non-final checkpoint every rank's reports reached; when none did (reports that can never
/// arrive: refused, or thinned out by the ingestion budget), the newest, as before this rule.
pub fn resume_point(
    checkpoints: Vec<Checkpoint>,
    progress: &[RankProgress],
    shape: &ReportShape,
) -> Option<Checkpoint> {
    let mut candidates: Vec<Checkpoint> = checkpoints.into_iter().filter(|c| !c.is_final).collect();
    candidates.sort_by_key(|c| std::cmp::Reverse(c.iteration));
    match candidates.iter().position(|c| shape.reached(progress, c.iteration, c.attempt)) {
        Some(i) => Some(candidates.swap_remove(i)),
        None => candidates.into_iter().next(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(iteration: i64) -> Checkpoint {
        Checkpoint {
            id: ringtrain_core::CheckpointId::new(),
            job_id: ringtrain_core::JobId(uuid::Uuid::new_v4()),
            attempt: 1,
            epoch: iteration / 10,
            iteration,
            name: format!("c{iteration}"),
            path: String::new(),
            size_bytes: 1,
            sha256: String::new(),
            is_final: false,
            created_at: chrono::Utc::now(),
        }
    }

    fn progress(rank: i32, newest: i64, epochs: i64) -> RankProgress {
        RankProgress { rank, newest_iteration: Some(newest), epochs }
    }

    fn shape() -> ReportShape {
        ReportShape { ranks: 2, ranks_by_placement: Default::default(), log_every: 1, iterations_per_epoch: 10 }
    }

    #[test]
    fn a_rank_whose_last_lines_were_lost_makes_the_job_step_back_a_checkpoint() {
        let checkpoints = vec![checkpoint(10), checkpoint(20)];
        // both ranks reported through the end of epoch 2: the newest
        let all = [progress(0, 19, 2), progress(1, 19, 2)];
        assert_eq!(resume_point(checkpoints.clone(), &all, &shape()).unwrap().iteration, 20);
        // rank 1's lines of iterations 17..19 and its epoch-2 report died with its agent: epoch 1's end
        let behind = [progress(0, 19, 2), progress(1, 16, 1)];
        assert_eq!(resume_point(checkpoints.clone(), &behind, &shape()).unwrap().iteration, 10);
        // the iteration lines arrived but not the epoch report
        let no_epoch = [progress(0, 19, 2), progress(1, 19, 1)];
        assert_eq!(resume_point(checkpoints.clone(), &no_epoch, &shape()).unwrap().iteration, 10);
        // a rank that never reported anything while checkpoints exist: nothing qualifies, the newest wins
        assert_eq!(resume_point(checkpoints, &[progress(0, 19, 2)], &shape()).unwrap().iteration, 20);
        assert!(resume_point(Vec::new(), &all, &shape()).is_none());
    }

    #[test]
    fn only_the_ranks_of_the_placement_that_wrote_a_checkpoint_owe_its_reports() {
        // placement 1 ran on 4 devices to iteration 9; placement 2, on 2, wrote the checkpoint at 20
        let mut c = checkpoint(20);
        c.attempt = 2;
        let reports = [progress(0, 19, 2), progress(1, 19, 2), progress(2, 9, 1), progress(3, 9, 1)];
        let mut resized = shape();
        resized.ranks = 4; // the job's next placement: 4 again
        resized.ranks_by_placement.insert(2, 2);
        assert_eq!(resume_point(vec![c.clone()], &reports, &resized).unwrap().iteration, 20);
        assert!(resized.reached(&reports, 20, 2) && !resized.reached(&reports, 20, 3));
    }

    #[test]
    fn the_line_a_rank_owes_before_a_checkpoint_follows_its_logging_interval() {
        let shape =
            ReportShape { ranks: 1, ranks_by_placement: Default::default(), log_every: 4, iterations_per_epoch: 10 };
        // epoch ends are always logged
        assert_eq!(shape.last_reported_before(10), 9);
        // mid-epoch (a preemption at 17): lines at 3, 7, 9 (epoch end), 11, 15
        assert_eq!(shape.last_reported_before(17), 15);
        assert_eq!(shape.last_reported_before(13), 11);
        assert_eq!(shape.last_reported_before(12), 11);
        assert_eq!(shape.last_reported_before(2), -1);
        assert!(shape.reached(&[progress(0, 15, 1)], 17, 1));
        assert!(!shape.reached(&[progress(0, 11, 1)], 17, 1));
    }
}
