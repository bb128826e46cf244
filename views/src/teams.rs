//! Teams, their tokens, their storage and their usage (`/v1/teams`, `/v1/tokens`, `/v1/me`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use ringtrain_core::{TeamId, TokenId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Team {
    pub id: TeamId,
    pub name: String,
    /// GPUs the team's running jobs may hold at once.
    pub gpu_quota: i32,
    /// CPU devices the team's running jobs may hold at once.
    pub cpu_quota: i32,
    /// Bytes of datasets and checkpoints the team may keep; null: the server's default.
    pub storage_quota_bytes: Option<i64>,
    /// Its weight in the division of idle capacity beyond guarantees (weighted fair share).
    pub weight: i32,
    /// Device-hours its jobs may use per period; null: no budget.
    pub budget: Option<Budget>,
    /// Folders on the nodes' shared filesystems its `idx:` and `shards:` data sets may lie under (granted
    /// by a platform admin; the server's `--idx-root` folders are granted to every team).
    pub data_roots: Vec<String>,
    pub created_at: DateTime<Utc>,
}

/// A budget of device-hours per calendar period (UTC). A team whose usage in the current period reached it
/// has its queued jobs wait until the next period.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Device-hours per period, over all its jobs and kinds (a GPU-hour and a CPU-slot-hour count alike).
    #[schema(minimum = 0.0001, maximum = 1_000_000_000)]
    pub device_hours: f64,
    /// `day`, `week` (from Monday) or `month`, in UTC.
    pub period: BudgetPeriod,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BudgetPeriod {
    Day,
    Week,
    Month,
}

impl BudgetPeriod {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetPeriod::Day => "day",
            BudgetPeriod::Week => "week",
            BudgetPeriod::Month => "month",
        }
    }

    pub fn parse(text: &str) -> Option<BudgetPeriod> {
        [BudgetPeriod::Day, BudgetPeriod::Week, BudgetPeriod::Month].into_iter().find(|p| p.as_str() == text)
    }

    /// The start of the period holding `at` (weeks start on Monday), and the start of the next one.
    pub fn bounds(self, at: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        use chrono::{Datelike, Duration, NaiveDate, TimeZone};
        let day = at.date_naive();
        let (start, next): (NaiveDate, NaiveDate) = match self {
            BudgetPeriod::Day => (day, day + Duration::days(1)),
            BudgetPeriod::Week => {
                let monday = day - Duration::days(i64::from(day.weekday().num_days_from_monday()));
                (monday, monday + Duration::days(7))
            }
            BudgetPeriod::Month => {
                let first = day.with_day(1).unwrap_or(day);
                let next = if first.month() == 12 {
                    NaiveDate::from_ymd_opt(first.year() + 1, 1, 1)
                } else {
                    NaiveDate::from_ymd_opt(first.year(), first.month() + 1, 1)
                };
                (first, next.unwrap_or(first + Duration::days(31)))
            }
        };
        let midnight = |d: NaiveDate| Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).unwrap_or_default());
        (midnight(start), midnight(next))
    }
}

/// The bytes a team keeps on the server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StorageUse {
    /// Uploaded datasets and models.
    pub datasets_bytes: i64,
    pub checkpoints_bytes: i64,
}

impl StorageUse {
    pub fn total(&self) -> i64 {
        self.datasets_bytes.saturating_add(self.checkpoints_bytes)
    }
}

/// What a token may do. `Agent` tokens belong to node agents, not to a team.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Manages teams and tokens; also everything a member may do in its own team.
    Admin,
    /// Submits and cancels its team's jobs, uploads datasets.
    Member,
    /// Reads its team's jobs, metrics and datasets.
    Viewer,
    /// A node agent: only the /v1/agent routes.
    Agent,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Member => "member",
            Role::Viewer => "viewer",
            Role::Agent => "agent",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        [Role::Admin, Role::Member, Role::Viewer, Role::Agent].into_iter().find(|r| r.as_str() == text)
    }

    /// Whether this role may change its team's jobs and datasets.
    pub fn can_write(self) -> bool {
        matches!(self, Role::Admin | Role::Member)
    }
}

/// A token as the store knows it: never the token itself (nor its hash).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TokenInfo {
    pub id: TokenId,
    pub role: Role,
    /// None for agent tokens.
    pub team_id: Option<TeamId>,
    /// A platform admin: creates teams, sets quotas, mints agent tokens, manages every team's tokens.
    pub platform: bool,
    pub label: Option<String>,
    pub created_at: DateTime<Utc>,
    /// Refused from then on, like a revoked token.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was last used, to the minute.
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl TokenInfo {
    /// Whether it may be used at `now`: not revoked, not expired.
    pub fn is_live(&self, now: DateTime<Utc>) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| at > now)
    }
}

/// What a team keeps on the server against its storage quota.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TeamStorage {
    pub quota_bytes: u64,
    pub used_bytes: i64,
    pub datasets_bytes: i64,
    pub checkpoints_bytes: i64,
    /// Checkpoints kept per job besides its final weights.
    pub checkpoints_kept_per_job: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TeamList {
    pub teams: Vec<Team>,
}

/// A new token: `token` is shown this once and never again.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    pub token: String,
    pub info: TokenInfo,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    /// Newest first, revoked ones included (with `revoked_at`); never the secrets.
    pub tokens: Vec<TokenInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Me {
    pub token_id: TokenId,
    pub role: Role,
    pub team_id: TeamId,
    pub team_name: String,
    /// A platform admin (manages every team and the node agents' tokens).
    pub platform: bool,
    pub label: Option<String>,
    /// The team's guarantee: devices of each kind it may always hold (it may borrow idle ones beyond).
    pub gpu_quota: i32,
    pub cpu_quota: i32,
}

/// Device-seconds of one group.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageRow {
    /// The day (`2026-12-01`), the token id (`unknown` for jobs whose token is gone), or the kind.
    pub key: String,
    pub device_seconds: f64,
    /// The same split by how each placement's rank ended: `done`, `preempted`, `failed`, `cancelled`, or
    /// `running` (still holding its device: counted up to `to`).
    pub by_outcome: BTreeMap<String, f64>,
}

/// The budget and what the current period used of it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BudgetUse {
    pub budget: Budget,
    pub period_start: DateTime<Utc>,
    pub period_end: DateTime<Utc>,
    pub used_device_hours: f64,
    /// Its queued jobs wait (`budget_exhausted`) until `period_end`.
    pub exhausted: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TeamUsage {
    pub team_id: TeamId,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub by: String,
    pub device_seconds: f64,
    pub device_hours: f64,
    pub rows: Vec<UsageRow>,
    pub budget: Option<BudgetUse>,
}
