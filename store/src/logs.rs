//! What ranks print: their agents relay each rank's stderr (and stdout lines that are not metric reports);
//! stored once per (job, placement, rank, line number), read in arrival order with filters, and deleted
//! with the job's artifacts or after the platform's retention.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use ringtrain_core::JobId;
use ringtrain_protocol::LogLine;

use crate::error::StoreResult;

pub use ringtrain_views::jobs::records::RankLogLine;

/// Which lines to read; every field narrows.
#[derive(Debug, Clone, Default)]
pub struct LogQuery {
    pub rank: Option<i32>,
    pub attempt: Option<i32>,
    /// Lines with an id above this.
    pub after: Option<i64>,
    /// Lines containing this text (case-sensitive).
    pub contains: Option<String>,
    pub limit: i64,
}

/// Lines written per INSERT.
pub(crate) const LOGS_CHUNK: usize = 500;

#[async_trait]
pub trait LogStore: Send + Sync {
    /// Stores one rank's lines; a line already stored (same placement, rank and number) is skipped. Returns
    /// how many were new.
    async fn append_logs(&self, job: JobId, attempt: i32, rank: i32, lines: &[LogLine]) -> StoreResult<u64>;
    /// How many lines the job has stored.
    async fn count_logs(&self, job: JobId) -> StoreResult<i64>;
    /// Lines in arrival order.
    async fn query_logs(&self, job: JobId, query: &LogQuery) -> StoreResult<Vec<RankLogLine>>;
    /// The last `n` stderr lines of placement `attempt`, oldest first.
    async fn last_stderr_lines(&self, job: JobId, attempt: i32, n: i64) -> StoreResult<Vec<RankLogLine>>;
    /// Deletes the job's lines; how many.
    async fn delete_logs(&self, job: JobId) -> StoreResult<u64>;
    /// Deletes the lines of jobs that ended before `before`; how many.
    async fn delete_logs_ended_before(&self, before: DateTime<Utc>) -> StoreResult<u64>;
}

macro_rules! impl_log_store {
    ($store:ty) => {
        const _: () = {
            use chrono::{DateTime, Utc};
            use ringtrain_core::JobId;
            use ringtrain_protocol::LogLine;

            use crate::backend::SqlBackend;
            use crate::logs::{LogQuery, LogStore, RankLogLine, LOGS_CHUNK};
            use crate::StoreResult;

            type Builder<'a> = sqlx::QueryBuilder<'a, <$store as SqlBackend>::Db>;
            type Row = (i64, i32, i32, i64, DateTime<Utc>, String, String);

            const COLUMNS: &str = "id, attempt, rank, seq, at, stream, line";

            fn lines(rows: Vec<Row>) -> Vec<RankLogLine> {
                rows.into_iter()
                    .map(|(id, attempt, rank, seq, at, stream, line)| RankLogLine {
                        id,
                        attempt,
                        rank,
                        seq,
                        at,
                        stream,
                        line,
                    })
                    .collect()
            }

            #[async_trait::async_trait]
            impl LogStore for $store {
                async fn append_logs(
                    &self,
                    job: JobId,
                    attempt: i32,
                    rank: i32,
                    lines: &[LogLine],
                ) -> StoreResult<u64> {
                    // Behind any heartbeat waiting for SQLite's one writer (see write_gate).
                    let _turn = match self.write_gate() {
                        Some(gate) => Some(gate.bulk().await),
                        None => None,
                    };
                    let mut tx = self.pool().begin().await?;
                    let mut written = 0;
                    for chunk in lines.chunks(LOGS_CHUNK) {
                        let mut q =
                            Builder::new("INSERT INTO rank_logs (job_id, attempt, rank, seq, at, stream, line) ");
                        q.push_values(chunk, |mut row, l| {
                            let stream = if l.stream == "stdout" { "stdout" } else { "stderr" };
                            row.push_bind(job.0)
                                .push_bind(attempt)
                                .push_bind(rank)
                                .push_bind(l.seq)
                                .push_bind(l.at)
                                .push_bind(stream)
                                .push_bind(l.text.clone());
                        });
                        q.push(" ON CONFLICT (job_id, attempt, rank, seq) DO NOTHING");
                        written += q.build().execute(&mut *tx).await?.rows_affected();
                    }
                    tx.commit().await?;
                    Ok(written)
                }

                async fn count_logs(&self, job: JobId) -> StoreResult<i64> {
                    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM rank_logs WHERE job_id = $1")
                        .bind(job.0)
                        .fetch_one(self.pool())
                        .await?;
                    Ok(n)
                }

                async fn query_logs(&self, job: JobId, query: &LogQuery) -> StoreResult<Vec<RankLogLine>> {
                    let mut q = Builder::new(format!("SELECT {COLUMNS} FROM rank_logs WHERE job_id = "));
                    q.push_bind(job.0);
                    if let Some(rank) = query.rank {
                        q.push(" AND rank = ").push_bind(rank);
                    }
                    if let Some(attempt) = query.attempt {
                        q.push(" AND attempt = ").push_bind(attempt);
                    }
                    if let Some(after) = query.after {
                        q.push(" AND id > ").push_bind(after);
                    }
                    if let Some(text) = &query.contains {
                        q.push(format!(" AND {}(line, ", <Self as SqlBackend>::FIND_TEXT))
                            .push_bind(text.clone())
                            .push(") > 0");
                    }
                    q.push(" ORDER BY id LIMIT ").push_bind(query.limit);
                    Ok(lines(q.build_query_as().fetch_all(self.pool()).await?))
                }

                async fn last_stderr_lines(&self, job: JobId, attempt: i32, n: i64) -> StoreResult<Vec<RankLogLine>> {
                    let sql = format!(
                        "SELECT {COLUMNS} FROM rank_logs WHERE job_id = $1 AND attempt = $2 AND stream = 'stderr' \
                         ORDER BY id DESC LIMIT $3"
                    );
                    let rows: Vec<Row> =
                        sqlx::query_as(&sql).bind(job.0).bind(attempt).bind(n).fetch_all(self.pool()).await?;
                    let mut found = lines(rows);
                    found.reverse();
                    Ok(found)
                }

                async fn delete_logs(&self, job: JobId) -> StoreResult<u64> {
                    let done =
                        sqlx::query("DELETE FROM rank_logs WHERE job_id = $1").bind(job.0).execute(self.pool()).await?;
                    Ok(done.rows_affected())
                }

                async fn delete_logs_ended_before(&self, before: DateTime<Utc>) -> StoreResult<u64> {
                    let done = sqlx::query(
                        "DELETE FROM rank_logs WHERE job_id IN \
                         (SELECT id FROM jobs WHERE finished_at IS NOT NULL AND finished_at < $1)",
                    )
                    .bind(before)
                    .execute(self.pool())
                    .await?;
                    Ok(done.rows_affected())
                }
            }
        };
    };
}

pub(crate) use impl_log_store;
