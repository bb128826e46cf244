//! Field-level errors: every problem with a request names the JSON path it is about.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One problem with one field, e.g. `lr.warmup.epochs: must be < epochs (got 12, epochs = 10)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldError {
    /// The JSON path of the field (`lr.decay.milestones[1]`); empty for the document as a whole.
    pub path: String,
    pub reason: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        FieldError { path: path.into(), reason: reason.into() }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{}: {}", self.path, self.reason)
        }
    }
}

impl std::error::Error for FieldError {}
