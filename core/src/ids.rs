//! Typed ids: one newtype per kind of row, so a node id cannot be passed where a token id is expected.
//! Each is a UUID on the wire, in the OpenAPI document and in the database (`#[serde(transparent)]`; the
//! store binds `.0`).

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! id_type {
    ($($(#[$doc:meta])* $name:ident;)+) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A fresh random (v4) id.
            pub fn new() -> Self {
                $name(Uuid::new_v4())
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = uuid::Error;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                text.parse().map($name)
            }
        }

        impl From<Uuid> for $name {
            fn from(id: Uuid) -> Self {
                $name(id)
            }
        }

        /// A UUID in the OpenAPI document.
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {
            // Registered as a component of its own, so a `$ref` to it always resolves.
            fn schemas(
                schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>)>,
            ) {
                schemas.push((stringify!($name).to_string(), <Self as utoipa::PartialSchema>::schema()));
            }
        }
    )+};
}

id_type! {
    /// A job (`jobs.id`).
    JobId;
    /// A team (`teams.id`).
    TeamId;
    /// A node of the worker pool (`nodes.id`).
    NodeId;
    /// One device of a node (`devices.id`).
    DeviceId;
    /// One rank of one placement (`assignments.id`).
    AssignmentId;
    /// A bearer token (`tokens.id`; never the token itself).
    TokenId;
    /// A study: jobs made from one base spec (`studies.id`).
    StudyId;
    /// A team's uploaded dataset (`datasets.id`).
    DatasetId;
    /// A team's uploaded TorchScript model (`models.id`).
    ModelId;
    /// One checkpoint archive of a job (`checkpoints.id`).
    CheckpointId;
}
