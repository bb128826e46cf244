//! Typed ids: one newtype per kind of row, so a node id cannot be passed where a token id is expected.
//! Each is a UUID on the wire and in the database (`#[serde(transparent)]`; the store binds `.0`).

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

        impl From<Uuid> for $name {
            fn from(id: Uuid) -> Self {
                $name(id)
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
}
