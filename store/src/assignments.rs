//! Assignments: one rank of one placement on one device. Created with the placement
//! ([`LifecycleStore::start_job`](crate::LifecycleStore::start_job)); moved along by the agents' reports; a
//! live one (pending, delivered or running) holds its device, which a unique index enforces.

use async_trait::async_trait;
use ringtrain_core::{AssignmentId, AssignmentState, DeviceId, JobId, NodeId};
pub use ringtrain_protocol::Assignment;

use crate::error::StoreResult;

#[derive(Debug, Clone)]
pub struct NewAssignment {
    pub node_id: NodeId,
    pub device_id: DeviceId,
    pub rank: i32,
}

#[async_trait]
pub trait AssignmentStore: Send + Sync {
    /// A node's assignments in any of `states`.
    async fn node_assignments(&self, node_id: NodeId, states: &[AssignmentState]) -> StoreResult<Vec<Assignment>>;
    /// Every live assignment: the devices in use.
    async fn live_assignments(&self) -> StoreResult<Vec<Assignment>>;
    async fn get_assignment(&self, id: AssignmentId) -> StoreResult<Option<Assignment>>;
    /// The ranks of one placement, by rank.
    async fn job_assignments(&self, job: JobId, attempt: i32) -> StoreResult<Vec<Assignment>>;
    /// The secret the ranks of this placement prove to each other (None for placements older than it).
    async fn rendezvous_secret(&self, job: JobId, attempt: i32) -> StoreResult<Option<String>>;
    /// Guarded state change; false when it was not in `from`.
    async fn set_assignment_state(
        &self,
        id: AssignmentId,
        from: AssignmentState,
        to: AssignmentState,
    ) -> StoreResult<bool>;
    /// Records rank 0's rendezvous address on its assignment; false when it is not delivered or running.
    async fn set_assignment_endpoint(&self, id: AssignmentId, endpoint: &str) -> StoreResult<bool>;
    /// Cancels the job's assignments no agent has picked up yet. Delivered and running ones stay live (their
    /// devices busy) until their agent, told to stop them by its next poll, reports them ended.
    async fn cancel_pending_assignments(&self, job: JobId) -> StoreResult<u64>;
    /// Ends every live assignment on a node as `to` (the node was lost, so its ranks are gone).
    async fn end_node_assignments(&self, node_id: NodeId, to: AssignmentState) -> StoreResult<u64>;
    /// Records, once, where rank 0's placement resumed (`resumed_from`: the checkpoint's iteration, 0 for a
    /// fresh start) and the newest iteration reported before it; false when already recorded.
    async fn record_resume(
        &self,
        id: AssignmentId,
        resumed_from: i64,
        reached_before: Option<i64>,
    ) -> StoreResult<bool>;
}

macro_rules! impl_assignment_store {
    ($store:ty) => {
        const _: () = {
            use ringtrain_core::{AssignmentId, AssignmentState, JobId, NodeId};

            use crate::assignments::AssignmentStore;
            use crate::backend::SqlBackend;
            use crate::rows::{AssignmentRow, ASSIGNMENT_COLUMNS};
            use crate::{now, Assignment, StoreResult};

            fn assignments(rows: Vec<AssignmentRow>) -> StoreResult<Vec<Assignment>> {
                rows.into_iter().map(TryInto::try_into).collect()
            }

            #[async_trait::async_trait]
            impl AssignmentStore for $store {
                async fn node_assignments(
                    &self,
                    node_id: NodeId,
                    states: &[AssignmentState],
                ) -> StoreResult<Vec<Assignment>> {
                    let mut q = sqlx::QueryBuilder::<<Self as SqlBackend>::Db>::new(format!(
                        "SELECT {ASSIGNMENT_COLUMNS} FROM assignments WHERE node_id = "
                    ));
                    q.push_bind(node_id.0).push(" AND state IN (");
                    let mut list = q.separated(", ");
                    for state in states {
                        list.push_bind(state.as_str());
                    }
                    q.push(") ORDER BY created_at, rank");
                    assignments(q.build_query_as().fetch_all(self.pool()).await?)
                }

                async fn live_assignments(&self) -> StoreResult<Vec<Assignment>> {
                    let sql = format!(
                        "SELECT {ASSIGNMENT_COLUMNS} FROM assignments \
                         WHERE state IN ('pending', 'delivered', 'running') ORDER BY created_at, rank"
                    );
                    assignments(sqlx::query_as(&sql).fetch_all(self.pool()).await?)
                }

                async fn get_assignment(&self, id: AssignmentId) -> StoreResult<Option<Assignment>> {
                    let sql = format!("SELECT {ASSIGNMENT_COLUMNS} FROM assignments WHERE id = $1");
                    let row: Option<AssignmentRow> =
                        sqlx::query_as(&sql).bind(id.0).fetch_optional(self.pool()).await?;
                    row.map(TryInto::try_into).transpose()
                }

                async fn rendezvous_secret(&self, job: JobId, attempt: i32) -> StoreResult<Option<String>> {
                    let row: Option<(Option<String>,)> = sqlx::query_as(
                        "SELECT rendezvous_secret FROM assignments WHERE job_id = $1 AND attempt = $2 LIMIT 1",
                    )
                    .bind(job.0)
                    .bind(attempt)
                    .fetch_optional(self.pool())
                    .await?;
                    Ok(row.and_then(|(secret,)| secret))
                }

                async fn job_assignments(&self, job: JobId, attempt: i32) -> StoreResult<Vec<Assignment>> {
                    let sql = format!(
                        "SELECT {ASSIGNMENT_COLUMNS} FROM assignments WHERE job_id = $1 AND attempt = $2 ORDER BY rank"
                    );
                    assignments(sqlx::query_as(&sql).bind(job.0).bind(attempt).fetch_all(self.pool()).await?)
                }

                async fn set_assignment_state(
                    &self,
                    id: AssignmentId,
                    from: AssignmentState,
                    to: AssignmentState,
                ) -> StoreResult<bool> {
                    let done =
                        sqlx::query("UPDATE assignments SET state = $3, updated_at = $4 WHERE id = $1 AND state = $2")
                            .bind(id.0)
                            .bind(from.as_str())
                            .bind(to.as_str())
                            .bind(now())
                            .execute(self.pool())
                            .await?;
                    Ok(done.rows_affected() == 1)
                }

                async fn set_assignment_endpoint(&self, id: AssignmentId, endpoint: &str) -> StoreResult<bool> {
                    let done = sqlx::query(
                        "UPDATE assignments SET endpoint = $2, updated_at = $3 \
                         WHERE id = $1 AND state IN ('delivered', 'running')",
                    )
                    .bind(id.0)
                    .bind(endpoint)
                    .bind(now())
                    .execute(self.pool())
                    .await?;
                    Ok(done.rows_affected() == 1)
                }

                async fn cancel_pending_assignments(&self, job: JobId) -> StoreResult<u64> {
                    let done = sqlx::query(
                        "UPDATE assignments SET state = 'cancelled', updated_at = $2 \
                         WHERE job_id = $1 AND state = 'pending'",
                    )
                    .bind(job.0)
                    .bind(now())
                    .execute(self.pool())
                    .await?;
                    Ok(done.rows_affected())
                }

                async fn record_resume(
                    &self,
                    id: AssignmentId,
                    resumed_from: i64,
                    reached_before: Option<i64>,
                ) -> StoreResult<bool> {
                    let done = sqlx::query(
                        "UPDATE assignments SET resumed_from = $2, reached_before = $3 \
                         WHERE id = $1 AND resumed_from IS NULL",
                    )
                    .bind(id.0)
                    .bind(resumed_from)
                    .bind(reached_before)
                    .execute(self.pool())
                    .await?;
                    Ok(done.rows_affected() == 1)
                }

                async fn end_node_assignments(&self, node_id: NodeId, to: AssignmentState) -> StoreResult<u64> {
                    let done = sqlx::query(
                        "UPDATE assignments SET state = $2, updated_at = $3 \
                         WHERE node_id = $1 AND state IN ('pending', 'delivered', 'running')",
                    )
                    .bind(node_id.0)
                    .bind(to.as_str())
                    .bind(now())
                    .execute(self.pool())
                    .await?;
                    Ok(done.rows_affected())
                }
            }
        };
    };
}

pub(crate) use impl_assignment_store;
