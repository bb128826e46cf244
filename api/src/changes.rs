//! "Something changed": a version counter that jobs and assignments bump when they change, so the scheduler
//! loop runs a pass at once and agents' long polls answer at once, instead of both polling the database.
//! On Postgres the bump is also sent as a NOTIFY, and every server's listener bumps its own counter, so a
//! change made through one replica wakes the loop and the agents of all of them.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, Notify};

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

/// Announcing a change costs a database statement that updates a single row every announcement locks (the
/// change version; on Postgres the same statement sends the NOTIFY, which was a second one before). Under a
/// burst of submissions each waited for the previous one's commit on that row: at 16 concurrent submitters
/// the announcement was most of a submission's latency.
/// Callers that arrive while an announcement is under way now share the next one, as a database groups
/// commits: each caller still returns only after an announcement that started after it called.
#[derive(Debug, Default)]
pub struct Announcements {
    /// Calls so far; a call's ticket is this count just after it.
    requested: AtomicU64,
    /// Every ticket up to this one has been announced.
    announced: AtomicU64,
    /// One announcement at a time; the queue is fair, so a caller waits for at most two.
    turn: Mutex<()>,
}

impl Announcements {
    /// Runs `announce` for this call and every call waiting with it, unless an announcement that started after
    /// this call has already finished. Cancelling a call is safe: the next caller announces instead.
    pub async fn announce<F: Future<Output = ()>>(&self, announce: impl FnOnce() -> F) {
        let ticket = self.requested.fetch_add(1, Ordering::SeqCst) + 1;
        let _turn = self.turn.lock().await;
        if self.announced.load(Ordering::SeqCst) >= ticket {
            return;
        }
        // every call counted now made its change before counting, so this announcement covers it
        let covered = self.requested.load(Ordering::SeqCst);
        announce().await;
        self.announced.store(covered, Ordering::SeqCst);
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

    #[tokio::test]
    async fn concurrent_announcements_share_one_and_none_returns_before_its_own() {
        let announcements = Arc::new(Announcements::default());
        let runs = Arc::new(AtomicU64::new(0));
        let mut callers = Vec::new();
        for _ in 0..32 {
            let (announcements, runs) = (announcements.clone(), runs.clone());
            callers.push(tokio::spawn(async move {
                let before = runs.load(Ordering::SeqCst);
                announcements
                    .announce(|| async {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        runs.fetch_add(1, Ordering::SeqCst);
                    })
                    .await;
                // an announcement that started after this call has finished
                assert!(runs.load(Ordering::SeqCst) > before);
            }));
        }
        for caller in callers {
            caller.await.unwrap();
        }
        let runs = runs.load(Ordering::SeqCst);
        assert!((1..=3).contains(&runs), "32 concurrent callers took {runs} announcements");
        // a lone call later still announces
        let again = Arc::new(AtomicU64::new(0));
        announcements
            .announce(|| async {
                again.fetch_add(1, Ordering::SeqCst);
            })
            .await;
        assert_eq!(again.load(Ordering::SeqCst), 1);
    }
}
