//! The [`Store`](crate::Store) methods whose SQL is the same on Postgres and SQLite, written once and
//! instantiated for each backend by [`impl_store!`]. (A macro rather than generic code: sqlx's generic
//! executor bounds are far noisier than the SQL, and a macro keeps the SQL readable.) Each backend supplies
//! `self.pool`, its migrator and the inherent methods `claim_queued_impl`, `try_lead_impl`,
//! `notify_changes_impl` and `listen_for_changes_impl`.

/// Most metric points written per INSERT: 8 parameters each stays far under both databases' limits.
pub(crate) const METRICS_CHUNK: usize = 500;

/// Keeps the last of several points with the same (kind, iteration, rank): one INSERT may not update a row
/// twice on Postgres.
pub(crate) fn dedup_points(points: &[crate::MetricPoint]) -> Vec<&crate::MetricPoint> {
    let mut seen = std::collections::HashSet::new();
    let mut kept: Vec<&crate::MetricPoint> =
        points.iter().rev().filter(|p| seen.insert((p.kind.as_str(), p.iteration, p.rank))).collect();
    kept.reverse();
    kept
}

/// The smallest string greater than every string starting with `prefix` (its last character incremented),
/// or None when there is none.
pub(crate) fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

pub(crate) fn lease_expiry(lease: std::time::Duration) -> chrono::DateTime<chrono::Utc> {
    crate::now() + chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::days(1))
}

/// Ready means every migration this build knows was applied (an older binary against a newer schema is
/// fine; a newer binary whose migrations failed is not).
pub(crate) fn check_migrations(
    migrator: &sqlx::migrate::Migrator,
    applied: impl Iterator<Item = i64>,
) -> crate::StoreResult<()> {
    let applied: std::collections::HashSet<i64> = applied.collect();
    match migrator.iter().find(|m| !applied.contains(&m.version)) {
        Some(missing) => Err(crate::StoreError::Config(format!("migration {} is not applied", missing.version))),
        None => Ok(()),
    }
}

macro_rules! impl_store {
    ($store:ty, $db:ty, $migrator:expr) => {
        impl $store {
            /// Writes a job's state-change event inside the caller's transaction.
            async fn insert_state_event(
                tx: &mut sqlx::Transaction<'_, $db>,
                job: ringtrain_core::JobId,
                at: chrono::DateTime<chrono::Utc>,
                change: (&str, &str),
                attempt: i32,
                reason: &str,
            ) -> $crate::StoreResult<()> {
                sqlx::query(
                    "INSERT INTO job_events (job_id, at, kind, from_state, to_state, attempt, reason) \
                     VALUES ($1, $2, 'state', $3, $4, $5, $6)",
                )
                .bind(job.0)
                .bind(at)
                .bind(change.0)
                .bind(change.1)
                .bind(attempt)
                .bind(reason)
                .execute(&mut **tx)
                .await?;
                Ok(())
            }

            /// Writes one pending assignment per rank inside the caller's transaction.
            async fn insert_assignments(
                tx: &mut sqlx::Transaction<'_, $db>,
                job: ringtrain_core::JobId,
                attempt: i32,
                ranks: &[$crate::NewAssignment],
            ) -> $crate::StoreResult<Vec<$crate::Assignment>> {
                let now = $crate::now();
                let world_size = ranks.len() as i32;
                let sql = format!(
                    "INSERT INTO assignments (id, job_id, attempt, node_id, device_id, rank, world_size, state, \
                     created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8, $8) RETURNING {}",
                    $crate::rows::ASSIGNMENT_COLUMNS
                );
                let mut placed = Vec::with_capacity(ranks.len());
                for rank in ranks {
                    let row: $crate::rows::AssignmentRow = sqlx::query_as(&sql)
                        .bind(uuid::Uuid::new_v4())
                        .bind(job.0)
                        .bind(attempt)
                        .bind(rank.node_id)
                        .bind(rank.device_id)
                        .bind(rank.rank)
                        .bind(world_size)
                        .bind(now)
                        .fetch_one(&mut **tx)
                        .await?;
                    placed.push(row.into());
                }
                Ok(placed)
            }
        }

        #[async_trait::async_trait]
        impl $crate::Store for $store {
            fn backend(&self) -> $crate::Backend {
                Self::BACKEND
            }

            async fn ready(&self) -> $crate::StoreResult<()> {
                let applied: Vec<(i64,)> = sqlx::query_as("SELECT version FROM _sqlx_migrations WHERE success")
                    .fetch_all(&self.pool)
                    .await
                    .map_err($crate::StoreError::Database)?;
                $crate::shared::check_migrations(&$migrator, applied.into_iter().map(|(v,)| v))
            }

            async fn create_team(&self, team: $crate::NewTeam) -> $crate::StoreResult<$crate::Team> {
                let sql = format!(
                    "INSERT INTO teams (id, name, gpu_quota, cpu_quota, created_at) VALUES ($1, $2, $3, $4, $5) \
                     RETURNING {}",
                    $crate::rows::TEAM_COLUMNS
                );
                let row: $crate::rows::TeamRow = sqlx::query_as(&sql)
                    .bind(uuid::Uuid::new_v4())
                    .bind(&team.name)
                    .bind(team.gpu_quota)
                    .bind(team.cpu_quota)
                    .bind($crate::now())
                    .fetch_one(&self.pool)
                    .await?;
                Ok(row.into())
            }

            async fn get_team(&self, id: uuid::Uuid) -> $crate::StoreResult<Option<$crate::Team>> {
                let sql = format!("SELECT {} FROM teams WHERE id = $1", $crate::rows::TEAM_COLUMNS);
                let row: Option<$crate::rows::TeamRow> =
                    sqlx::query_as(&sql).bind(id).fetch_optional(&self.pool).await?;
                Ok(row.map(Into::into))
            }

            async fn get_team_by_name(&self, name: &str) -> $crate::StoreResult<Option<$crate::Team>> {
                let sql = format!("SELECT {} FROM teams WHERE name = $1", $crate::rows::TEAM_COLUMNS);
                let row: Option<$crate::rows::TeamRow> =
                    sqlx::query_as(&sql).bind(name).fetch_optional(&self.pool).await?;
                Ok(row.map(Into::into))
            }

            async fn list_teams(&self) -> $crate::StoreResult<Vec<$crate::Team>> {
                let sql = format!("SELECT {} FROM teams ORDER BY name", $crate::rows::TEAM_COLUMNS);
                let rows: Vec<$crate::rows::TeamRow> = sqlx::query_as(&sql).fetch_all(&self.pool).await?;
                Ok(rows.into_iter().map(Into::into).collect())
            }

            async fn create_token(&self, token: $crate::NewToken) -> $crate::StoreResult<$crate::TokenInfo> {
                let sql = format!(
                    "INSERT INTO tokens (id, token_hash, role, team_id, label, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6) RETURNING {}",
                    $crate::rows::TOKEN_COLUMNS
                );
                let row: $crate::rows::TokenRow = sqlx::query_as(&sql)
                    .bind(uuid::Uuid::new_v4())
                    .bind(&token.token_hash)
                    .bind(token.role.as_str())
                    .bind(token.team_id)
                    .bind(&token.label)
                    .bind($crate::now())
                    .fetch_one(&self.pool)
                    .await?;
                row.try_into()
            }

            async fn find_token(&self, token_hash: &str) -> $crate::StoreResult<Option<$crate::TokenInfo>> {
                let sql = format!(
                    "SELECT {} FROM tokens WHERE token_hash = $1 AND revoked_at IS NULL",
                    $crate::rows::TOKEN_COLUMNS
                );
                let row: Option<$crate::rows::TokenRow> =
                    sqlx::query_as(&sql).bind(token_hash).fetch_optional(&self.pool).await?;
                row.map(TryInto::try_into).transpose()
            }

            async fn submit_job(
                &self,
                job: $crate::NewJob,
                key: Option<$crate::IdempotencyKey>,
            ) -> $crate::StoreResult<$crate::Submitted> {
                let now = $crate::now();
                let mut tx = self.pool.begin().await?;
                let sql = format!(
                    "INSERT INTO jobs (id, team_id, created_by, name, spec, effective, dataset_size, state, priority, \
                     device, workers, max_restarts, created_at, updated_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, 'queued', $8, $9, $10, $11, $12, $12) RETURNING {}",
                    $crate::rows::JOB_COLUMNS
                );
                let row: $crate::rows::JobRow = sqlx::query_as(&sql)
                    .bind(job.id.0)
                    .bind(job.team_id)
                    .bind(job.created_by)
                    .bind(&job.name)
                    .bind(sqlx::types::Json(&job.spec))
                    .bind(job.effective.as_ref().map(sqlx::types::Json))
                    .bind(job.dataset_size)
                    .bind(job.priority)
                    .bind(&job.device)
                    .bind(job.workers)
                    .bind(job.max_restarts)
                    .bind(now)
                    .fetch_one(&mut *tx)
                    .await?;
                if let Some(key) = &key {
                    // The first writer of (team, key) wins; a concurrent one waits for it to commit and then
                    // finds the key taken, drops its own job and replays the winner's.
                    let claimed = sqlx::query(
                        "INSERT INTO idempotency_keys (team_id, key, request_hash, job_id, created_at) \
                         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (team_id, key) DO NOTHING",
                    )
                    .bind(job.team_id)
                    .bind(&key.key)
                    .bind(&key.request_hash)
                    .bind(job.id.0)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    if claimed == 0 {
                        tx.rollback().await?;
                        let (hash, job_id): (String, uuid::Uuid) = sqlx::query_as(
                            "SELECT request_hash, job_id FROM idempotency_keys WHERE team_id = $1 AND key = $2",
                        )
                        .bind(job.team_id)
                        .bind(&key.key)
                        .fetch_one(&self.pool)
                        .await?;
                        if hash != key.request_hash {
                            return Ok($crate::Submitted::KeyReused);
                        }
                        let existing = $crate::Store::get_job(self, ringtrain_core::JobId(job_id)).await?;
                        return existing.map($crate::Submitted::Replayed).ok_or_else(|| {
                            $crate::StoreError::Corrupt(format!("idempotency key names missing job {job_id}"))
                        });
                    }
                }
                sqlx::query(
                    "INSERT INTO job_events (job_id, at, kind, from_state, to_state, attempt, reason) \
                     VALUES ($1, $2, 'state', NULL, 'queued', 0, 'submitted')",
                )
                .bind(job.id.0)
                .bind(now)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok($crate::Submitted::Created(row.try_into()?))
            }

            async fn get_job(&self, id: ringtrain_core::JobId) -> $crate::StoreResult<Option<$crate::Job>> {
                let sql = format!("SELECT {} FROM jobs WHERE id = $1", $crate::rows::JOB_COLUMNS);
                let row: Option<$crate::rows::JobRow> =
                    sqlx::query_as(&sql).bind(id.0).fetch_optional(&self.pool).await?;
                row.map(TryInto::try_into).transpose()
            }

            async fn list_jobs(
                &self,
                team_id: uuid::Uuid,
                filter: &$crate::JobFilter,
            ) -> $crate::StoreResult<Vec<$crate::Job>> {
                // Built per request so each filter combination gets a plan that uses its index
                // (team, [state,] seq DESC) instead of one generic plan full of `$n IS NULL OR ...`.
                let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                    "SELECT {} FROM jobs WHERE team_id = ",
                    $crate::rows::JOB_COLUMNS
                ));
                q.push_bind(team_id);
                if let Some(state) = filter.state {
                    q.push(" AND state = ").push_bind(state.as_str());
                }
                if let Some(prefix) = &filter.name_prefix {
                    // A byte-order range (served by the jobs_team_name index) narrows the rows; substr then
                    // checks the prefix exactly. Not LIKE: its wildcards would need escaping, and SQLite's
                    // LIKE ignores case where Postgres's does not.
                    q.push(format!(" AND name {} >= ", Self::BYTE_ORDER)).push_bind(prefix.clone());
                    if let Some(upper) = $crate::shared::prefix_upper_bound(prefix) {
                        q.push(format!(" AND name {} < ", Self::BYTE_ORDER)).push_bind(upper);
                    }
                    q.push(" AND substr(name, 1, ")
                        .push_bind(i32::try_from(prefix.chars().count()).unwrap_or(i32::MAX))
                        .push(") = ")
                        .push_bind(prefix.clone());
                }
                if let Some(after) = filter.created_after {
                    q.push(" AND created_at >= ").push_bind(after);
                }
                if let Some(before) = filter.created_before {
                    q.push(" AND created_at < ").push_bind(before);
                }
                if let Some(seq) = filter.before_seq {
                    q.push(" AND seq < ").push_bind(seq);
                }
                q.push(" ORDER BY seq DESC LIMIT ").push_bind(filter.limit);
                let rows: Vec<$crate::rows::JobRow> = q.build_query_as().fetch_all(&self.pool).await?;
                $crate::rows::jobs(rows)
            }

            async fn transition(&self, t: &$crate::Transition) -> $crate::StoreResult<Option<$crate::Job>> {
                if !t.from.can_become(t.to) {
                    return Err($crate::StoreError::InvalidTransition(format!("{} -> {}", t.from, t.to)));
                }
                let (lease_mode, lease_owner, lease_expires) = match &t.lease {
                    $crate::LeaseChange::Keep => ("keep", None, None),
                    $crate::LeaseChange::Clear => ("clear", None, None),
                    $crate::LeaseChange::Set { owner, expires } => ("set", Some(owner.as_str()), Some(*expires)),
                };
                let now = $crate::now();
                let mut tx = self.pool.begin().await?;
                // The compare-and-set: state, and optionally owner and attempt, must still be what the caller
                // saw. A stale writer matches no row and changes nothing.
                let sql = format!(
                    "UPDATE jobs SET state = $4, updated_at = $5, \
                     started_at = CASE WHEN $4 = 'running' AND started_at IS NULL THEN $5 ELSE started_at END, \
                     finished_at = CASE WHEN $4 IN ('succeeded', 'failed', 'cancelled') THEN $5 ELSE finished_at END, \
                     lease_owner = CASE WHEN $6 = 'keep' THEN lease_owner WHEN $6 = 'set' THEN $7 ELSE NULL END, \
                     lease_expires = CASE WHEN $6 = 'keep' THEN lease_expires WHEN $6 = 'set' THEN $8 ELSE NULL END, \
                     result = COALESCE($9, result), error = COALESCE($10, error) \
                     WHERE id = $1 AND state = $2 AND ($3 IS NULL OR lease_owner = $3) \
                     AND ($11 IS NULL OR attempt = $11) RETURNING {}",
                    $crate::rows::JOB_COLUMNS
                );
                let row: Option<$crate::rows::JobRow> = sqlx::query_as(&sql)
                    .bind(t.job.0)
                    .bind(t.from.as_str())
                    .bind(t.owner.as_deref())
                    .bind(t.to.as_str())
                    .bind(now)
                    .bind(lease_mode)
                    .bind(lease_owner)
                    .bind(lease_expires)
                    .bind(t.result.as_ref().map(sqlx::types::Json))
                    .bind(t.error.as_deref())
                    .bind(t.attempt)
                    .fetch_optional(&mut *tx)
                    .await?;
                let Some(row) = row else {
                    tx.rollback().await?;
                    return Ok(None);
                };
                let job: $crate::Job = row.try_into()?;
                Self::insert_state_event(&mut tx, t.job, now, (t.from.as_str(), t.to.as_str()), job.attempt, &t.reason)
                    .await?;
                tx.commit().await?;
                Ok(Some(job))
            }

            async fn claim_queued(
                &self,
                owner: &str,
                limit: i64,
                lease: std::time::Duration,
            ) -> $crate::StoreResult<Vec<$crate::Job>> {
                let mut jobs = self.claim_queued_impl(owner, limit, lease).await?;
                jobs.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.seq.cmp(&b.seq)));
                Ok(jobs)
            }

            async fn start_job(
                &self,
                id: ringtrain_core::JobId,
                owner: &str,
                lease: std::time::Duration,
                ranks: &[$crate::NewAssignment],
            ) -> $crate::StoreResult<Option<($crate::Job, Vec<$crate::Assignment>)>> {
                let now = $crate::now();
                let mut tx = self.pool.begin().await?;
                let sql = format!(
                    "UPDATE jobs SET state = 'scheduled', attempt = attempt + 1, lease_owner = $2, \
                     lease_expires = $3, updated_at = $4 WHERE id = $1 AND state = 'queued' RETURNING {}",
                    $crate::rows::JOB_COLUMNS
                );
                let row: Option<$crate::rows::JobRow> = sqlx::query_as(&sql)
                    .bind(id.0)
                    .bind(owner)
                    .bind($crate::shared::lease_expiry(lease))
                    .bind(now)
                    .fetch_optional(&mut *tx)
                    .await?;
                let Some(row) = row else {
                    tx.rollback().await?;
                    return Ok(None);
                };
                let job: $crate::Job = row.try_into()?;
                let nodes: std::collections::BTreeSet<uuid::Uuid> = ranks.iter().map(|r| r.node_id).collect();
                let reason = format!("placed on {} device(s) of {} node(s) by {owner}", ranks.len(), nodes.len());
                Self::insert_state_event(&mut tx, id, now, ("queued", "scheduled"), job.attempt, &reason).await?;
                // A busy device fails the whole start (the unique index on live assignments), and dropping
                // the transaction undoes the claim with it.
                let placed = Self::insert_assignments(&mut tx, id, job.attempt, ranks).await?;
                tx.commit().await?;
                Ok(Some((job, placed)))
            }

            async fn preempt_job(
                &self,
                id: ringtrain_core::JobId,
                attempt: i32,
                reason: &str,
            ) -> $crate::StoreResult<Option<$crate::Job>> {
                let now = $crate::now();
                let mut tx = self.pool.begin().await?;
                let current: Option<(String,)> =
                    sqlx::query_as("SELECT state FROM jobs WHERE id = $1 AND attempt = $2")
                        .bind(id.0)
                        .bind(attempt)
                        .fetch_optional(&mut *tx)
                        .await?;
                let Some((from,)) = current.filter(|(s,)| s == "scheduled" || s == "running") else {
                    tx.rollback().await?;
                    return Ok(None);
                };
                // Guarded on the state just read: a concurrent finish or cancel wins and this changes nothing.
                let sql = format!(
                    "UPDATE jobs SET state = 'queued', preemptions = preemptions + 1, lease_owner = NULL, \
                     lease_expires = NULL, updated_at = $3 \
                     WHERE id = $1 AND attempt = $2 AND state = $4 RETURNING {}",
                    $crate::rows::JOB_COLUMNS
                );
                let row: Option<$crate::rows::JobRow> = sqlx::query_as(&sql)
                    .bind(id.0)
                    .bind(attempt)
                    .bind(now)
                    .bind(&from)
                    .fetch_optional(&mut *tx)
                    .await?;
                let Some(row) = row else {
                    tx.rollback().await?;
                    return Ok(None);
                };
                let job: $crate::Job = row.try_into()?;
                let reason = format!("preempted: {reason}");
                Self::insert_state_event(&mut tx, id, now, (from.as_str(), "queued"), attempt, &reason).await?;
                sqlx::query(
                    "UPDATE assignments SET state = 'cancelled', updated_at = $2 WHERE job_id = $1 AND state = 'pending'",
                )
                .bind(id.0)
                .bind(now)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "UPDATE assignments SET preempted = TRUE, updated_at = $3 \
                     WHERE job_id = $1 AND attempt = $2 AND state IN ('delivered', 'running')",
                )
                .bind(id.0)
                .bind(attempt)
                .bind(now)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(Some(job))
            }

            async fn active_jobs(&self) -> $crate::StoreResult<Vec<$crate::Job>> {
                let sql = format!(
                    "SELECT {} FROM jobs WHERE state IN ('scheduled', 'running') ORDER BY seq",
                    $crate::rows::JOB_COLUMNS
                );
                let rows: Vec<$crate::rows::JobRow> = sqlx::query_as(&sql).fetch_all(&self.pool).await?;
                $crate::rows::jobs(rows)
            }

            async fn renew_node_leases(
                &self,
                node_id: uuid::Uuid,
                lease: std::time::Duration,
            ) -> $crate::StoreResult<u64> {
                let done = sqlx::query(
                    "UPDATE jobs SET lease_expires = $2 WHERE state IN ('scheduled', 'running') \
                     AND lease_owner IS NOT NULL AND id IN (SELECT job_id FROM assignments WHERE node_id = $1 \
                     AND attempt = jobs.attempt AND state IN ('pending', 'delivered', 'running'))",
                )
                .bind(node_id)
                .bind($crate::shared::lease_expiry(lease))
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected())
            }

            async fn set_assignment_endpoint(&self, id: uuid::Uuid, endpoint: &str) -> $crate::StoreResult<bool> {
                let done = sqlx::query(
                    "UPDATE assignments SET endpoint = $2, updated_at = $3 \
                     WHERE id = $1 AND state IN ('delivered', 'running')",
                )
                .bind(id)
                .bind(endpoint)
                .bind($crate::now())
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn try_lead(&self) -> $crate::StoreResult<bool> {
                self.try_lead_impl().await
            }

            async fn notify_changes(&self) -> $crate::StoreResult<()> {
                self.notify_changes_impl().await
            }

            async fn listen_for_changes(
                &self,
                on_change: Box<dyn Fn() + Send + Sync>,
            ) -> $crate::StoreResult<()> {
                self.listen_for_changes_impl(on_change).await
            }

            async fn list_queued(&self, limit: i64) -> $crate::StoreResult<Vec<$crate::Job>> {
                let sql = format!(
                    "SELECT {} FROM jobs WHERE state = 'queued' ORDER BY priority DESC, seq LIMIT $1",
                    $crate::rows::JOB_COLUMNS
                );
                let rows: Vec<$crate::rows::JobRow> = sqlx::query_as(&sql).bind(limit).fetch_all(&self.pool).await?;
                $crate::rows::jobs(rows)
            }

            async fn renew_lease(
                &self,
                id: ringtrain_core::JobId,
                owner: &str,
                lease: std::time::Duration,
            ) -> $crate::StoreResult<bool> {
                let done = sqlx::query(
                    "UPDATE jobs SET lease_expires = $3, updated_at = $4 \
                     WHERE id = $1 AND lease_owner = $2 AND state IN ('scheduled', 'running')",
                )
                .bind(id.0)
                .bind(owner)
                .bind($crate::shared::lease_expiry(lease))
                .bind($crate::now())
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn expired_leases(
                &self,
                now: chrono::DateTime<chrono::Utc>,
                limit: i64,
            ) -> $crate::StoreResult<Vec<$crate::Job>> {
                let sql = format!(
                    "SELECT {} FROM jobs WHERE lease_owner IS NOT NULL AND lease_expires < $1 \
                     AND state IN ('scheduled', 'running') ORDER BY lease_expires LIMIT $2",
                    $crate::rows::JOB_COLUMNS
                );
                let rows: Vec<$crate::rows::JobRow> =
                    sqlx::query_as(&sql).bind(now).bind(limit).fetch_all(&self.pool).await?;
                $crate::rows::jobs(rows)
            }

            async fn count_jobs_by_state(&self) -> $crate::StoreResult<Vec<(ringtrain_core::JobState, i64)>> {
                let rows: Vec<(String, i64)> =
                    sqlx::query_as("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetch_all(&self.pool).await?;
                rows.into_iter().map(|(s, n)| Ok(($crate::rows::parse_state(&s)?, n))).collect()
            }

            async fn list_events(
                &self,
                job: ringtrain_core::JobId,
                after_seq: i64,
                limit: i64,
            ) -> $crate::StoreResult<Vec<$crate::JobEvent>> {
                let sql = format!(
                    "SELECT {} FROM job_events WHERE job_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                    $crate::rows::EVENT_COLUMNS
                );
                let rows: Vec<$crate::rows::EventRow> =
                    sqlx::query_as(&sql).bind(job.0).bind(after_seq).bind(limit).fetch_all(&self.pool).await?;
                Ok(rows.into_iter().map(Into::into).collect())
            }

            async fn record_metrics(
                &self,
                job: ringtrain_core::JobId,
                points: &[$crate::MetricPoint],
            ) -> $crate::StoreResult<u64> {
                let points = $crate::shared::dedup_points(points);
                let now = $crate::now();
                let mut written = 0;
                let mut tx = self.pool.begin().await?;
                for chunk in points.chunks($crate::shared::METRICS_CHUNK) {
                    let mut q = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO metrics (job_id, kind, iteration, rank, epoch, attempt, fields, reported_at) ",
                    );
                    q.push_values(chunk, |mut row, p| {
                        row.push_bind(job.0)
                            .push_bind(p.kind.clone())
                            .push_bind(p.iteration)
                            .push_bind(p.rank)
                            .push_bind(p.epoch)
                            .push_bind(p.attempt)
                            .push_bind(sqlx::types::Json(p.fields.clone()))
                            .push_bind(now);
                    });
                    // A later attempt replaces what an earlier one reported for the same step (the resumed
                    // run is the one the final weights come from); an older attempt never overwrites a newer.
                    q.push(
                        " ON CONFLICT (job_id, kind, iteration, rank) DO UPDATE SET epoch = excluded.epoch, \
                         attempt = excluded.attempt, fields = excluded.fields, reported_at = excluded.reported_at \
                         WHERE metrics.attempt <= excluded.attempt",
                    );
                    written += q.build().execute(&mut *tx).await?.rows_affected();
                }
                tx.commit().await?;
                Ok(written)
            }

            async fn query_metrics(
                &self,
                job: ringtrain_core::JobId,
                query: &$crate::MetricsQuery,
            ) -> $crate::StoreResult<Vec<$crate::MetricPoint>> {
                let stride = query.stride.max(1);
                let mut q = sqlx::QueryBuilder::<$db>::new(format!("SELECT {} FROM ", $crate::rows::METRIC_COLUMNS));
                if stride > 1 {
                    // Every stride-th point of each (kind, rank) series, numbered along the iteration axis.
                    q.push(
                        "(SELECT m.*, ROW_NUMBER() OVER (PARTITION BY kind, rank ORDER BY iteration) - 1 AS rn \
                         FROM metrics m WHERE job_id = ",
                    );
                } else {
                    q.push("(SELECT m.*, 0 AS rn FROM metrics m WHERE job_id = ");
                }
                q.push_bind(job.0);
                if let Some(kind) = &query.kind {
                    q.push(" AND kind = ").push_bind(kind.clone());
                }
                if let Some(rank) = query.rank {
                    q.push(" AND rank = ").push_bind(rank);
                }
                if let Some(from) = query.from_iteration {
                    q.push(" AND iteration >= ").push_bind(from);
                }
                q.push(") s WHERE rn % ").push_bind(stride).push(" = 0");
                if let Some((kind, iteration, rank)) = &query.after {
                    q.push(" AND (kind, iteration, rank) > (")
                        .push_bind(kind.clone())
                        .push(", ")
                        .push_bind(*iteration)
                        .push(", ")
                        .push_bind(*rank)
                        .push(")");
                }
                q.push(" ORDER BY kind, iteration, rank LIMIT ").push_bind(query.limit);
                let rows: Vec<$crate::rows::MetricRow> = q.build_query_as().fetch_all(&self.pool).await?;
                Ok(rows.into_iter().map(Into::into).collect())
            }

            async fn count_metrics(
                &self,
                job: ringtrain_core::JobId,
                query: &$crate::MetricsQuery,
            ) -> $crate::StoreResult<i64> {
                let mut q = sqlx::QueryBuilder::<$db>::new("SELECT COUNT(*) FROM metrics WHERE job_id = ");
                q.push_bind(job.0);
                if let Some(kind) = &query.kind {
                    q.push(" AND kind = ").push_bind(kind.clone());
                }
                if let Some(rank) = query.rank {
                    q.push(" AND rank = ").push_bind(rank);
                }
                if let Some(from) = query.from_iteration {
                    q.push(" AND iteration >= ").push_bind(from);
                }
                let (count,): (i64,) = q.build_query_as().fetch_one(&self.pool).await?;
                Ok(count)
            }

            async fn register_node(
                &self,
                agent_token: uuid::Uuid,
                node: $crate::NodeRegistration,
            ) -> $crate::StoreResult<$crate::Node> {
                let now = $crate::now();
                let mut tx = self.pool.begin().await?;
                // Upsert by name, but only for the agent token that first registered it: another agent
                // cannot take over a node (the WHERE turns its attempt into zero rows).
                let id: Option<(uuid::Uuid,)> = sqlx::query_as(
                    "INSERT INTO nodes (id, name, agent_token_id, address, state, registered_at, last_heartbeat) \
                     VALUES ($1, $2, $3, $4, 'up', $5, $5) \
                     ON CONFLICT (name) DO UPDATE SET address = excluded.address, state = 'up', \
                     last_heartbeat = excluded.last_heartbeat WHERE nodes.agent_token_id = excluded.agent_token_id \
                     RETURNING id",
                )
                .bind(uuid::Uuid::new_v4())
                .bind(&node.name)
                .bind(agent_token)
                .bind(&node.address)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?;
                let Some((node_id,)) = id else {
                    return Err($crate::StoreError::Conflict(format!(
                        "node {:?} is registered by another agent token",
                        node.name
                    )));
                };
                for device in &node.devices {
                    sqlx::query(
                        "INSERT INTO devices (id, node_id, idx, kind, name, memory_bytes) \
                         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (node_id, idx) DO UPDATE SET \
                         kind = excluded.kind, name = excluded.name, memory_bytes = excluded.memory_bytes",
                    )
                    .bind(uuid::Uuid::new_v4())
                    .bind(node_id)
                    .bind(device.index)
                    .bind(&device.kind)
                    .bind(&device.name)
                    .bind(device.memory_bytes)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                $crate::Store::get_node(self, node_id)
                    .await?
                    .ok_or_else(|| $crate::StoreError::Corrupt(format!("node {node_id} vanished")))
            }

            async fn heartbeat(&self, node_id: uuid::Uuid, agent_token: uuid::Uuid) -> $crate::StoreResult<bool> {
                let done = sqlx::query(
                    "UPDATE nodes SET last_heartbeat = $3, state = 'up' WHERE id = $1 AND agent_token_id = $2",
                )
                .bind(node_id)
                .bind(agent_token)
                .bind($crate::now())
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn get_node(&self, id: uuid::Uuid) -> $crate::StoreResult<Option<$crate::Node>> {
                let sql = format!("SELECT {} FROM nodes WHERE id = $1", $crate::rows::NODE_COLUMNS);
                let row: Option<$crate::rows::NodeRow> =
                    sqlx::query_as(&sql).bind(id).fetch_optional(&self.pool).await?;
                let Some(row) = row else { return Ok(None) };
                let sql = format!(
                    "SELECT {} FROM devices WHERE node_id = $1 ORDER BY idx",
                    $crate::rows::DEVICE_COLUMNS
                );
                let devices: Vec<$crate::rows::DeviceRow> =
                    sqlx::query_as(&sql).bind(id).fetch_all(&self.pool).await?;
                Ok(Some(row.with_devices(devices.into_iter().map(Into::into).collect())))
            }

            async fn list_nodes(&self) -> $crate::StoreResult<Vec<$crate::Node>> {
                let sql = format!("SELECT {} FROM nodes ORDER BY name", $crate::rows::NODE_COLUMNS);
                let nodes: Vec<$crate::rows::NodeRow> = sqlx::query_as(&sql).fetch_all(&self.pool).await?;
                let sql = format!("SELECT {} FROM devices ORDER BY node_id, idx", $crate::rows::DEVICE_COLUMNS);
                let devices: Vec<$crate::rows::DeviceRow> = sqlx::query_as(&sql).fetch_all(&self.pool).await?;
                let mut by_node: std::collections::HashMap<uuid::Uuid, Vec<$crate::Device>> = Default::default();
                for device in devices {
                    by_node.entry(device.node_id).or_default().push(device.into());
                }
                Ok(nodes
                    .into_iter()
                    .map(|n| {
                        let devices = by_node.remove(&n.id).unwrap_or_default();
                        n.with_devices(devices)
                    })
                    .collect())
            }

            async fn create_assignments(
                &self,
                job: ringtrain_core::JobId,
                attempt: i32,
                ranks: &[$crate::NewAssignment],
            ) -> $crate::StoreResult<Vec<$crate::Assignment>> {
                let mut tx = self.pool.begin().await?;
                let placed = Self::insert_assignments(&mut tx, job, attempt, ranks).await?;
                tx.commit().await?;
                Ok(placed)
            }

            async fn node_assignments(
                &self,
                node_id: uuid::Uuid,
                states: &[&str],
            ) -> $crate::StoreResult<Vec<$crate::Assignment>> {
                let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                    "SELECT {} FROM assignments WHERE node_id = ",
                    $crate::rows::ASSIGNMENT_COLUMNS
                ));
                q.push_bind(node_id).push(" AND state IN (");
                let mut list = q.separated(", ");
                for state in states {
                    list.push_bind(state.to_string());
                }
                q.push(") ORDER BY created_at, rank");
                let rows: Vec<$crate::rows::AssignmentRow> = q.build_query_as().fetch_all(&self.pool).await?;
                Ok(rows.into_iter().map(Into::into).collect())
            }

            async fn live_assignments(&self) -> $crate::StoreResult<Vec<$crate::Assignment>> {
                let sql = format!(
                    "SELECT {} FROM assignments WHERE state IN ('pending', 'delivered', 'running') \
                     ORDER BY created_at, rank",
                    $crate::rows::ASSIGNMENT_COLUMNS
                );
                let rows: Vec<$crate::rows::AssignmentRow> = sqlx::query_as(&sql).fetch_all(&self.pool).await?;
                Ok(rows.into_iter().map(Into::into).collect())
            }

            async fn mark_lost_nodes(
                &self,
                before: chrono::DateTime<chrono::Utc>,
            ) -> $crate::StoreResult<Vec<uuid::Uuid>> {
                let rows: Vec<(uuid::Uuid,)> = sqlx::query_as(
                    "UPDATE nodes SET state = 'lost' WHERE state = 'up' AND last_heartbeat < $1 RETURNING id",
                )
                .bind(before)
                .fetch_all(&self.pool)
                .await?;
                Ok(rows.into_iter().map(|(id,)| id).collect())
            }

            async fn get_assignment(&self, id: uuid::Uuid) -> $crate::StoreResult<Option<$crate::Assignment>> {
                let sql = format!("SELECT {} FROM assignments WHERE id = $1", $crate::rows::ASSIGNMENT_COLUMNS);
                let row: Option<$crate::rows::AssignmentRow> =
                    sqlx::query_as(&sql).bind(id).fetch_optional(&self.pool).await?;
                Ok(row.map(Into::into))
            }

            async fn job_assignments(
                &self,
                job: ringtrain_core::JobId,
                attempt: i32,
            ) -> $crate::StoreResult<Vec<$crate::Assignment>> {
                let sql = format!(
                    "SELECT {} FROM assignments WHERE job_id = $1 AND attempt = $2 ORDER BY rank",
                    $crate::rows::ASSIGNMENT_COLUMNS
                );
                let rows: Vec<$crate::rows::AssignmentRow> =
                    sqlx::query_as(&sql).bind(job.0).bind(attempt).fetch_all(&self.pool).await?;
                Ok(rows.into_iter().map(Into::into).collect())
            }

            async fn set_assignment_state(&self, id: uuid::Uuid, from: &str, to: &str) -> $crate::StoreResult<bool> {
                let done =
                    sqlx::query("UPDATE assignments SET state = $3, updated_at = $4 WHERE id = $1 AND state = $2")
                        .bind(id)
                        .bind(from)
                        .bind(to)
                        .bind($crate::now())
                        .execute(&self.pool)
                        .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn end_job_assignments(&self, job: ringtrain_core::JobId, to: &str) -> $crate::StoreResult<u64> {
                let done = sqlx::query(
                    "UPDATE assignments SET state = $2, updated_at = $3 \
                     WHERE job_id = $1 AND state IN ('pending', 'delivered', 'running')",
                )
                .bind(job.0)
                .bind(to)
                .bind($crate::now())
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected())
            }

            async fn cancel_pending_assignments(&self, job: ringtrain_core::JobId) -> $crate::StoreResult<u64> {
                let done = sqlx::query(
                    "UPDATE assignments SET state = 'cancelled', updated_at = $2 WHERE job_id = $1 AND state = 'pending'",
                )
                .bind(job.0)
                .bind($crate::now())
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected())
            }

            async fn end_node_assignments(&self, node_id: uuid::Uuid, to: &str) -> $crate::StoreResult<u64> {
                let done = sqlx::query(
                    "UPDATE assignments SET state = $2, updated_at = $3 \
                     WHERE node_id = $1 AND state IN ('pending', 'delivered', 'running')",
                )
                .bind(node_id)
                .bind(to)
                .bind($crate::now())
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected())
            }

            async fn add_checkpoint(&self, c: $crate::NewCheckpoint) -> $crate::StoreResult<$crate::Checkpoint> {
                let sql = format!(
                    "INSERT INTO checkpoints (id, job_id, attempt, epoch, iteration, path, size_bytes, sha256, \
                     is_final, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                     ON CONFLICT (job_id, iteration, is_final) DO UPDATE SET attempt = excluded.attempt, \
                     epoch = excluded.epoch, path = excluded.path, size_bytes = excluded.size_bytes, \
                     sha256 = excluded.sha256, created_at = excluded.created_at \
                     WHERE checkpoints.attempt <= excluded.attempt RETURNING {}",
                    $crate::rows::CHECKPOINT_COLUMNS
                );
                let row: Option<$crate::rows::CheckpointRow> = sqlx::query_as(&sql)
                    .bind(uuid::Uuid::new_v4())
                    .bind(c.job_id.0)
                    .bind(c.attempt)
                    .bind(c.epoch)
                    .bind(c.iteration)
                    .bind(&c.path)
                    .bind(c.size_bytes)
                    .bind(&c.sha256)
                    .bind(c.is_final)
                    .bind($crate::now())
                    .fetch_optional(&self.pool)
                    .await?;
                // An older placement never replaces what a newer one registered for the same point.
                row.map(Into::into).ok_or_else(|| {
                    $crate::StoreError::Conflict(format!(
                        "a later attempt than {} already registered the checkpoint at iteration {}",
                        c.attempt, c.iteration
                    ))
                })
            }

            async fn list_checkpoints(
                &self,
                job: ringtrain_core::JobId,
            ) -> $crate::StoreResult<Vec<$crate::Checkpoint>> {
                let sql = format!(
                    "SELECT {} FROM checkpoints WHERE job_id = $1 ORDER BY iteration, is_final",
                    $crate::rows::CHECKPOINT_COLUMNS
                );
                let rows: Vec<$crate::rows::CheckpointRow> =
                    sqlx::query_as(&sql).bind(job.0).fetch_all(&self.pool).await?;
                Ok(rows.into_iter().map(Into::into).collect())
            }

            async fn add_dataset(&self, d: $crate::NewDataset) -> $crate::StoreResult<$crate::Dataset> {
                let sql = format!(
                    "INSERT INTO datasets (id, team_id, name, path, size_bytes, sha256, train_samples, sample_shape, \
                     num_classes, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING {}",
                    $crate::rows::DATASET_COLUMNS
                );
                let row: $crate::rows::DatasetRow = sqlx::query_as(&sql)
                    .bind(d.id)
                    .bind(d.team_id)
                    .bind(&d.name)
                    .bind(&d.path)
                    .bind(d.size_bytes)
                    .bind(&d.sha256)
                    .bind(d.train_samples)
                    .bind(sqlx::types::Json(&d.sample_shape))
                    .bind(d.num_classes)
                    .bind($crate::now())
                    .fetch_one(&self.pool)
                    .await?;
                Ok(row.into())
            }

            async fn get_dataset(&self, id: uuid::Uuid) -> $crate::StoreResult<Option<$crate::Dataset>> {
                let sql = format!("SELECT {} FROM datasets WHERE id = $1", $crate::rows::DATASET_COLUMNS);
                let row: Option<$crate::rows::DatasetRow> =
                    sqlx::query_as(&sql).bind(id).fetch_optional(&self.pool).await?;
                Ok(row.map(Into::into))
            }

            async fn list_datasets(&self, team_id: uuid::Uuid) -> $crate::StoreResult<Vec<$crate::Dataset>> {
                let sql = format!(
                    "SELECT {} FROM datasets WHERE team_id = $1 ORDER BY created_at DESC",
                    $crate::rows::DATASET_COLUMNS
                );
                let rows: Vec<$crate::rows::DatasetRow> =
                    sqlx::query_as(&sql).bind(team_id).fetch_all(&self.pool).await?;
                Ok(rows.into_iter().map(Into::into).collect())
            }
        }
    };
}

pub(crate) use impl_store;

#[cfg(test)]
mod tests {
    use super::prefix_upper_bound;

    #[test]
    fn upper_bounds_cover_exactly_the_prefix() {
        assert_eq!(prefix_upper_bound("bench-1").as_deref(), Some("bench-2"));
        assert_eq!(prefix_upper_bound("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_upper_bound("\u{10FFFF}"), None);
        // The surrogate gap is skipped.
        assert_eq!(prefix_upper_bound("\u{D7FF}").as_deref(), Some("\u{E000}"));
    }
}
