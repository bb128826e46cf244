//! The most memory a device of each kind offers, for a submission's memory check (`check_memory`), read at
//! most once per [`FRESH`] rather than once per submission (it was one of the few statements a submission
//! costs the database). A node registering through this server is seen at once; one registering through
//! another server within [`FRESH`] of a read: a job that cannot fit may be queued rather than refused, and
//! waits as one too large would, so a stale answer costs a clear error, never a placement.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use ringtrain_core::spec::DeviceKind;
use ringtrain_store::{Store, StoreResult};

/// How long a read answers for.
pub const FRESH: Duration = Duration::from_secs(1);

/// One kind's answer (None: no device reports its memory) and when it was read.
type Read = Option<(Option<i64>, Instant)>;

#[derive(Debug, Default)]
pub struct LargestMemory {
    /// Per kind (GPU, CPU).
    read: Mutex<[Read; 2]>,
}

fn slot(kind: DeviceKind) -> usize {
    match kind {
        DeviceKind::Gpu => 0,
        DeviceKind::Cpu => 1,
    }
}

impl LargestMemory {
    /// The most memory any device of `kind` in service reports; None when none reports any.
    pub async fn of(&self, store: &dyn Store, kind: DeviceKind) -> StoreResult<Option<i64>> {
        let fresh = self.lock()[slot(kind)].filter(|(_, at)| at.elapsed() < FRESH);
        if let Some((largest, _)) = fresh {
            return Ok(largest);
        }
        let largest = store.largest_device_memory(kind).await?;
        self.lock()[slot(kind)] = Some((largest, Instant::now()));
        Ok(largest)
    }

    /// A node registered (its devices may have changed): read again next time.
    pub fn forget(&self) {
        *self.lock() = [None, None];
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, [Read; 2]> {
        self.read.lock().unwrap_or_else(|e| e.into_inner())
    }
}
