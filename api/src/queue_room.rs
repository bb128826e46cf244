//! Whether a team's queue has room for one more job, without counting it each time.
//!
//! Counting a team's queued jobs is an index scan as long as its queue: at a few thousand queued jobs it was
//! the largest part of the database's work per submission. A count read less than [`FRESH`] ago, plus the
//! jobs this server queued for the team since, is enough to know that a team far below its limit has room;
//! only a team past half its limit is counted every time. The estimate misses jobs that entered the queue
//! since by other ways (another server's submissions, requeues after a failure or a preemption): for half
//! the limit to be crossed in [`FRESH`] that way, hundreds of them would be needed, and the limit is a guard
//! against a runaway client, not an accounting.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ringtrain_core::TeamId;

/// How long a count stands in for counting again.
pub const FRESH: Duration = Duration::from_secs(1);
/// Teams remembered at once; stale counts are dropped beyond it.
const MAX_TEAMS: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Estimate {
    /// Queued jobs when counted, plus those this server queued since.
    queued: i64,
    counted_at: Instant,
}

#[derive(Debug, Default)]
pub struct QueueRoom {
    estimates: Mutex<HashMap<TeamId, Estimate>>,
}

impl QueueRoom {
    /// True when `team` surely has room for `jobs` more under `limit`: a fresh estimate that stays below
    /// half of it with them.
    pub fn surely_room(&self, team: TeamId, jobs: i64, limit: i64) -> bool {
        let estimates = self.estimates.lock().unwrap_or_else(|e| e.into_inner());
        estimates.get(&team).is_some_and(|e| e.counted_at.elapsed() < FRESH && (e.queued + jobs) * 2 <= limit)
    }

    /// Records an exact count of `team`'s queued jobs.
    pub fn counted(&self, team: TeamId, queued: i64) {
        let mut estimates = self.estimates.lock().unwrap_or_else(|e| e.into_inner());
        if estimates.len() >= MAX_TEAMS {
            estimates.retain(|_, e| e.counted_at.elapsed() < FRESH);
        }
        estimates.insert(team, Estimate { queued, counted_at: Instant::now() });
    }

    /// This server queued `jobs` more jobs for `team`.
    pub fn queued(&self, team: TeamId, jobs: i64) {
        let mut estimates = self.estimates.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(estimate) = estimates.get_mut(&team) {
            estimate.queued += jobs;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_team_is_counted_again_from_half_its_limit_and_once_the_count_is_stale() {
        let room = QueueRoom::default();
        let team = TeamId::new();
        assert!(!room.surely_room(team, 1, 10), "never counted");
        room.counted(team, 3);
        assert!(room.surely_room(team, 1, 10));
        room.queued(team, 1);
        assert!(room.surely_room(team, 1, 10));
        room.queued(team, 1); // 5 of 10: half
        assert!(!room.surely_room(team, 1, 10));
        room.counted(team, 0);
        assert!(room.surely_room(team, 1, 10));
        assert!(!room.surely_room(TeamId::new(), 1, 10), "another team");
        assert!(room.surely_room(team, 5, 10), "five more make half");
        assert!(!room.surely_room(team, 6, 10), "six more, past half");
        std::thread::sleep(FRESH);
        assert!(!room.surely_room(team, 1, 10), "stale");
    }
}
