//! `POST /v1/schedules/preview?workers=…`: a spec's schedule at several world sizes, side by side (without
//! `workers` the answer is one `ringtrain_core::ScheduleView`).

use ringtrain_core::ScheduleView;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PreviewForWorkers {
    pub workers: u32,
    /// The ScheduleView for this k (effective, epochs, change_points).
    #[schema(value_type = Object)]
    pub schedule: ScheduleView,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PreviewComparison {
    pub schedules: Vec<PreviewForWorkers>,
}
