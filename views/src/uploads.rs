//! `/v1/datasets/uploads`: a data set uploaded in parts, each checksummed, an interrupted upload taken up
//! again (`ringtrain datasets upload --resume`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// An upload in progress and what has arrived of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UploadView {
    pub id: Uuid,
    pub name: String,
    pub size_bytes: i64,
    pub part_bytes: i64,
    /// How many parts make the file; part numbers run from 1.
    pub parts: i64,
    /// The parts kept so far, in order.
    pub received: Vec<i64>,
    /// The parts still to send, in order.
    pub missing: Vec<i64>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UploadList {
    pub uploads: Vec<UploadView>,
}

/// A part as kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReceivedPart {
    pub number: i64,
    pub size_bytes: i64,
    pub sha256: String,
}
