//! One shared memory segment per placement whose ranks all run on this node: its CPU ranks
//! all-reduce through it instead of the TCP ring. The first of the placement's ranks to start here makes it
//! (an empty `memfd`; the ranks size and map it themselves), the others get the same one, and it lives as
//! long as one of them holds it. Only that placement's ranks ever see it: no path names it.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, Weak};

use ringtrain_core::JobId;

/// The live segments, by placement (job and attempt).
#[derive(Debug, Default)]
pub(crate) struct PlacementSegments {
    live: Mutex<HashMap<(JobId, i32), Weak<OwnedFd>>>,
}

impl PlacementSegments {
    /// The placement's segment: the one its other ranks here hold, or a new one. Hold it until the rank
    /// has ended, so a rank that starts later gets the same.
    pub(crate) fn of(&self, job: JobId, attempt: i32) -> std::io::Result<Arc<OwnedFd>> {
        let mut live = self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        live.retain(|_, segment| segment.strong_count() > 0);
        if let Some(segment) = live.get(&(job, attempt)).and_then(Weak::upgrade) {
            return Ok(segment);
        }
        let segment = Arc::new(ringtrain_sandbox::shared_memory_file(false)?);
        live.insert((job, attempt), Arc::downgrade(&segment));
        Ok(segment)
    }
}

#[cfg(test)]
mod tests {
    use super::PlacementSegments;
    use ringtrain_core::JobId;
    use std::sync::Arc;

    #[test]
    fn a_placements_ranks_share_one_segment_and_other_placements_get_their_own() {
        let segments = PlacementSegments::default();
        let job = JobId(uuid::Uuid::new_v4());
        let rank0 = segments.of(job, 1).unwrap();
        let rank1 = segments.of(job, 1).unwrap();
        assert!(Arc::ptr_eq(&rank0, &rank1));
        let next_attempt = segments.of(job, 2).unwrap();
        assert!(!Arc::ptr_eq(&rank0, &next_attempt));
        // once every rank let go, a rank of the same placement starting later gets a new one
        drop((rank0, rank1));
        assert_eq!(segments.live.lock().unwrap()[&(job, 1)].strong_count(), 0);
    }
}
