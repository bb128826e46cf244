//! "Something changed": a version counter that jobs and assignments bump when they change, so the scheduler
//! loop runs a pass at once and agents' long polls answer at once, instead of both polling the database.
//! On Postgres the bump is also sent as a NOTIFY, and every server's listener bumps its own counter, so a
//! change made through one replica wakes the loop and the agents of all of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct Changes {
    version: AtomicU64,
    notify: Notify,
}

impl Changes {
    /// The current version: changes made before this call are included in anything read after it.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    /// Records a change and wakes every waiter.
    pub fn bump(&self) {
        self.version.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Waits until the version moves past `seen`, or `timeout` passes; returns the version then.
    pub async fn wait_past(&self, seen: u64, timeout: Duration) -> u64 {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Registered before the check, so a bump between the check and the await is not missed.
            let notified = self.notify.notified();
            let now = self.version();
            if now != seen {
                return now;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.version();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_bump_wakes_a_waiter_and_a_quiet_wait_times_out() {
        let changes = Arc::new(Changes::default());
        let seen = changes.version();
        let started = std::time::Instant::now();
        assert_eq!(changes.wait_past(seen, Duration::from_millis(50)).await, seen);
        assert!(started.elapsed() >= Duration::from_millis(50));

        let waiter = tokio::spawn({
            let changes = changes.clone();
            async move { changes.wait_past(seen, Duration::from_secs(30)).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        changes.bump();
        let woke = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
        assert_eq!(woke, seen + 1);
        // Already past: no wait at all.
        assert_eq!(changes.wait_past(seen, Duration::from_secs(30)).await, seen + 1);
    }
}
