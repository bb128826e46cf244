//! `GET /v1/teams/{id}/usage`: device-seconds a team used, by day, by submitting token or by device kind,
//! from its assignments' real start and end times (every placement counts: preempted, failed and cancelled
//! ones too, each marked), and its budget for the current period.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Duration, Utc};
use ringtrain_core::{AssignmentState, TeamId};
use ringtrain_store::{DeviceSpan, SpanFilter};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::User;
use crate::error::{ApiError, ApiResult, ProblemType};
use crate::extract::{ApiPath, ApiQuery};
use crate::state::AppState;

pub use ringtrain_views::teams::{BudgetUse, TeamUsage, UsageRow};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// RFC 3339; inclusive. Default: 30 days before `to`. A range that is empty or reversed sums to nothing.
    pub from: Option<DateTime<Utc>>,
    /// RFC 3339; exclusive. Default: now.
    pub to: Option<DateTime<Utc>>,
    /// `day` (UTC, the default), `token` (the token that submitted the job) or `kind` (`cpu`, `gpu`).
    #[param(pattern = "^(day|token|kind)$")]
    pub by: Option<String>,
}

/// A team's device usage (the team's own tokens, or a platform admin).
#[utoipa::path(get, path = "/v1/teams/{id}/usage", tag = "teams", params(("id" = TeamId, Path), UsageQuery),
    responses((status = 200, body = TeamUsage), (status = 400), (status = 404)),
    security(("bearer" = [])))]
pub async fn team_usage(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<TeamId>,
    ApiQuery(query): ApiQuery<UsageQuery>,
) -> ApiResult<Json<TeamUsage>> {
    let visible = user.owns(id) || user.is_platform_admin();
    let team = match state.store.get_team(id).await? {
        Some(team) if visible => team,
        _ => return Err(ApiError::not_found(format!("no team {id}"))),
    };
    let now = ringtrain_store::now();
    let to = query.to.unwrap_or(now);
    let from =
        query.from.unwrap_or_else(|| to.checked_sub_signed(Duration::days(30)).unwrap_or(DateTime::<Utc>::MIN_UTC));
    let by = query.by.unwrap_or_else(|| "day".into());
    if !matches!(by.as_str(), "day" | "token" | "kind") {
        return Err(ApiError::field(ProblemType::BadQueryParameter, "by", "must be day, token or kind"));
    }
    // a live span counts up to now, never beyond; an empty or reversed range sums to nothing
    let until = to.min(now).max(from);
    let filter = SpanFilter { teams: Some(vec![id]), from: Some(from), to: Some(until), job: None };
    let spans = state.store.device_spans(&filter).await?;
    let rows = group(&spans, &by, from, until);
    let device_seconds: f64 = rows.iter().map(|r| r.device_seconds).sum();
    let budget = match team.budget {
        None => None,
        Some(budget) => {
            let (start, end, used) = ringtrain_store::period_use(state.store.as_ref(), id, budget.period, now).await?;
            Some(BudgetUse {
                budget,
                period_start: start,
                period_end: end,
                used_device_hours: used / 3600.0,
                exhausted: used >= budget.device_hours * 3600.0,
            })
        }
    };
    Ok(Json(TeamUsage {
        team_id: id,
        from,
        to,
        by,
        device_seconds,
        device_hours: device_seconds / 3600.0,
        rows,
        budget,
    }))
}

/// How a span's rank ended.
pub fn outcome(span: &DeviceSpan) -> &'static str {
    match span.state {
        _ if span.preempted => "preempted",
        AssignmentState::Done => "done",
        AssignmentState::Failed => "failed",
        AssignmentState::Cancelled => "cancelled",
        _ => "running",
    }
}

/// Sums the spans' seconds within [from, until) by `by`; days split a span at UTC midnight.
pub fn group(spans: &[DeviceSpan], by: &str, from: DateTime<Utc>, until: DateTime<Utc>) -> Vec<UsageRow> {
    let mut sums: BTreeMap<String, (f64, BTreeMap<String, f64>)> = BTreeMap::new();
    let mut add = |key: String, outcome: &str, seconds: f64| {
        if seconds <= 0.0 {
            return;
        }
        let entry = sums.entry(key).or_default();
        entry.0 += seconds;
        *entry.1.entry(outcome.to_string()).or_default() += seconds;
    };
    for span in spans {
        let outcome = outcome(span);
        match by {
            "day" => {
                // only the days this span overlaps, so a long range costs nothing by itself
                let (first, last) = (span.start.max(from), span.end.unwrap_or(until).min(until));
                let mut day = first.date_naive();
                while let Some(start) = day.and_hms_opt(0, 0, 0).map(|d| d.and_utc()) {
                    if start >= last {
                        break;
                    }
                    let Some(end) = day.succ_opt().and_then(|d| d.and_hms_opt(0, 0, 0)).map(|d| d.and_utc()) else {
                        break;
                    };
                    add(day.to_string(), outcome, span.seconds_within(start.max(from), end.min(until)));
                    day = end.date_naive();
                }
            }
            "token" => {
                let key = span.created_by.map_or_else(|| "unknown".to_string(), |t| t.to_string());
                add(key, outcome, span.seconds_within(from, until));
            }
            _ => add(span.kind.as_str().to_string(), outcome, span.seconds_within(from, until)),
        }
    }
    sums.into_iter().map(|(key, (device_seconds, by_outcome))| UsageRow { key, device_seconds, by_outcome }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringtrain_core::spec::DeviceKind;
    use ringtrain_core::JobId;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    fn span(start: &str, end: Option<&str>, state: AssignmentState, preempted: bool, kind: DeviceKind) -> DeviceSpan {
        DeviceSpan {
            job_id: JobId(uuid::Uuid::nil()),
            placement: 1,
            rank: 0,
            team_id: TeamId(uuid::Uuid::nil()),
            created_by: None,
            kind,
            start: at(start),
            end: end.map(at),
            state,
            preempted,
            resumed_from: None,
            reached_before: None,
        }
    }

    #[test]
    fn days_split_spans_at_midnight_and_clip_to_the_range() {
        let spans = [
            // 23:00 to 01:30: 1 h on the 1st, 1.5 h on the 2nd
            span("2026-12-01T23:00:00Z", Some("2026-12-02T01:30:00Z"), AssignmentState::Done, false, DeviceKind::Cpu),
            // preempted, within the 2nd: 10 min
            span(
                "2026-12-02T10:00:00Z",
                Some("2026-12-02T10:10:00Z"),
                AssignmentState::Cancelled,
                true,
                DeviceKind::Gpu,
            ),
            // still running since 23:30 on the 2nd: counted to `until` (00:15 on the 3rd)
            span("2026-12-02T23:30:00Z", None, AssignmentState::Running, false, DeviceKind::Cpu),
        ];
        let (from, until) = (at("2026-12-01T23:30:00Z"), at("2026-12-03T00:15:00Z"));
        let rows = group(&spans, "day", from, until);
        let by_day: Vec<(&str, f64)> = rows.iter().map(|r| (r.key.as_str(), r.device_seconds)).collect();
        // the first span is clipped at `from` (23:30): 30 min on the 1st
        assert_eq!(by_day, [("2026-12-01", 1800.0), ("2026-12-02", 5400.0 + 600.0 + 1800.0), ("2026-12-03", 900.0)]);
        assert_eq!(rows[1].by_outcome["preempted"], 600.0);
        assert_eq!(rows[1].by_outcome["running"], 1800.0);
        let kinds = group(&spans, "kind", from, until);
        let by_kind: Vec<(&str, f64)> = kinds.iter().map(|r| (r.key.as_str(), r.device_seconds)).collect();
        assert_eq!(by_kind, [("cpu", 1800.0 + 5400.0 + 2700.0), ("gpu", 600.0)]);
    }
}
