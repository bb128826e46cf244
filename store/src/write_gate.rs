//! Heartbeats before metrics on SQLite. SQLite has one writer at a time, and its busy handler is not a
//! queue: a writer that finds the lock taken sleeps and tries again, so a heartbeat can keep losing the
//! lock to a stream of metric inserts (each lock freed is taken again at once) until its node is declared
//! lost. The gate lets bulk writes (metric batches) through one at a time, and only while no urgent write
//! (a heartbeat, a lease renewal) is waiting or running: an urgent write waits for at most the one bulk
//! write in progress. Postgres locks rows, not the database, and has no gate.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Mutex, MutexGuard, Notify};

#[derive(Debug, Default)]
pub struct WriteGate {
    /// Urgent writes waiting for the database or running.
    urgent: AtomicUsize,
    /// One bulk write at a time.
    bulk: Mutex<()>,
    /// Told when the last urgent write ends.
    calm: Notify,
}

/// Held for an urgent write: bulk writes wait until every one is dropped.
#[derive(Debug)]
pub struct Urgent<'a>(&'a WriteGate);

impl Drop for Urgent<'_> {
    fn drop(&mut self) {
        if self.0.urgent.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.calm.notify_waiters();
        }
    }
}

impl WriteGate {
    /// An urgent write starts now; bulk writes not yet started wait for it.
    pub fn urgent(&self) -> Urgent<'_> {
        self.urgent.fetch_add(1, Ordering::SeqCst);
        Urgent(self)
    }

    /// Waits until no urgent write is waiting or running and no other bulk write holds the gate.
    pub async fn bulk(&self) -> MutexGuard<'_, ()> {
        let turn = self.bulk.lock().await;
        loop {
            let calm = self.calm.notified();
            tokio::pin!(calm);
            // Registered before the check, so an urgent write ending in between still wakes us.
            calm.as_mut().enable();
            if self.urgent.load(Ordering::SeqCst) == 0 {
                return turn;
            }
            calm.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn bulk_writes_wait_for_urgent_ones_and_go_one_at_a_time() {
        let gate = Arc::new(WriteGate::default());
        let urgent = gate.urgent();
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move {
                let _turn = gate.bulk().await;
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a bulk write went ahead of a waiting heartbeat");
        drop(urgent);
        tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();

        let first = gate.bulk().await;
        let second = tokio::spawn({
            let gate = gate.clone();
            async move {
                let _turn = gate.bulk().await;
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!second.is_finished(), "two bulk writes at once");
        // an urgent write never waits for the gate itself
        drop(gate.urgent());
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), second).await.unwrap().unwrap();
    }
}
