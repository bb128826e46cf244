//! What a team uploaded or registered: data sets (`/v1/datasets`) and TorchScript models (`/v1/models`).

use chrono::{DateTime, Utc};
use ringtrain_core::{DatasetId, ModelId, TeamId};
pub use ringtrain_protocol::model::ModelReport;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Dataset {
    pub id: DatasetId,
    pub team_id: TeamId,
    pub name: String,
    /// Where the file lies in the server's data directory: never sent.
    #[serde(skip)]
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub train_samples: i64,
    /// The shape of one sample (`x` without its first dimension; the first named input's for a data set
    /// of named inputs).
    pub sample_shape: Vec<i64>,
    /// Classes of the labels (0 when they are values).
    pub num_classes: i32,
    /// The named inputs (`x.NAME` tensors, for uploaded models); empty for a data set of one `x`.
    pub inputs: Vec<DatasetInput>,
    /// `classes` (integer labels) or `values` (float labels, for regression).
    pub labels: String,
    pub created_at: DateTime<Utc>,
    /// A sharded data set registered by reference: where it lies (`s3://BUCKET/PREFIX` or a folder every
    /// node mounts); jobs naming the data set train from it there. None for an uploaded file.
    pub source: Option<String>,
}

/// A named input of a data set: the tensor `x.NAME` (and `x_test.NAME`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DatasetInput {
    pub name: String,
    /// The safetensors dtype, e.g. F32, I64.
    pub dtype: String,
    /// The shape of one sample (without the first dimension).
    pub shape: Vec<i64>,
}

/// An uploaded TorchScript model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Model {
    pub id: ModelId,
    pub team_id: TeamId,
    pub name: String,
    /// Where the file lies in the server's data directory: never sent.
    #[serde(skip)]
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
    /// forward's inputs in order: the data set's tensors `x.NAME` (`x`: the one input of a plain data set).
    pub inputs: Vec<String>,
    /// What the upload's check found.
    #[schema(value_type = Object)]
    pub report: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DatasetList {
    pub datasets: Vec<Dataset>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelList {
    pub models: Vec<Model>,
}

impl Model {
    /// What the upload's check found, as its type; None for a report this version cannot read.
    pub fn checked(&self) -> Option<ModelReport> {
        ModelReport::deserialize(&self.report).ok()
    }
}
