//! `PATCH /v1/jobs/{id}`: what a team writes about a run beside its spec — tags to filter the run history
//! by (`GET /v1/jobs?tag=`) and a note searched with the name (`GET /v1/jobs?q=`). Any job, in any state:
//! a run is often worth a word only once it has ended.

use axum::extract::State;
use axum::Json;
use ringtrain_core::{FieldError, JobId};
use ringtrain_store::Annotations;
use serde::Deserialize;
use utoipa::ToSchema;

use super::JobView;
use crate::access::team_job;
use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiPath, JsonBody};
use crate::state::AppState;

/// Tags a job may carry.
pub const MAX_TAGS: usize = 20;
/// Characters of a tag.
pub const MAX_TAG_CHARS: usize = 40;
/// Characters of a note.
pub const MAX_NOTE_CHARS: usize = 10_000;

/// The tags and note to set; a field left out stays as it is.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobAnnotations {
    /// Replaces the job's tags (see [`tags_schema`]).
    #[schema(schema_with = tags_schema)]
    pub tags: Option<Vec<String>>,
    /// Replaces the job's note: free text of at most 10,000 characters (lines and tabs, no other control
    /// characters); empty removes it.
    #[schema(max_length = 10000, pattern = "^[^\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f]*$")]
    pub note: Option<String>,
}

/// A tag as the API document states it (what [`tag_problem`] accepts).
const TAG_PATTERN: &str = "^[A-Za-z0-9_.:/=+-]{1,40}$";

/// `tags` in the API document: the array's bound and each item's pattern (an attribute would put the
/// pattern on the array, where it means nothing).
fn tags_schema() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
    let tag = ObjectBuilder::new().schema_type(Type::String).pattern(Some(TAG_PATTERN));
    ArrayBuilder::new()
        .items(tag)
        .max_items(Some(MAX_TAGS))
        .description(Some(
            "Replaces the job's tags: at most 20, each 1 to 40 letters, digits or `_ . : / = + -` (no spaces or \
             quotes); a repeated tag is kept once, in the order first given.",
        ))
        .build()
}

/// Why a tag is refused, if it is.
pub fn tag_problem(tag: &str) -> Option<String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_.:/=+-".contains(c);
    match tag.chars().count() {
        0 => Some("must not be empty".into()),
        n if n > MAX_TAG_CHARS => Some(format!("must be at most {MAX_TAG_CHARS} characters (got {n})")),
        _ if !tag.chars().all(allowed) => {
            Some(format!("{tag:?}: only letters, digits and _ . : / = + - (no spaces or quotes)"))
        }
        _ => None,
    }
}

fn checked(body: JobAnnotations) -> ApiResult<Annotations> {
    let mut errors = Vec::new();
    let tags = body.tags.map(|tags| {
        if tags.len() > MAX_TAGS {
            errors.push(FieldError::new("tags", format!("at most {MAX_TAGS} tags (got {})", tags.len())));
        }
        let mut kept: Vec<String> = Vec::with_capacity(tags.len());
        for (i, tag) in tags.into_iter().enumerate() {
            if let Some(problem) = tag_problem(&tag) {
                errors.push(FieldError::new(format!("tags[{i}]"), problem));
            } else if !kept.contains(&tag) {
                kept.push(tag);
            }
        }
        kept
    });
    if let Some(note) = &body.note {
        let chars = note.chars().count();
        if chars > MAX_NOTE_CHARS {
            errors.push(FieldError::new("note", format!("must be at most {MAX_NOTE_CHARS} characters (got {chars})")));
        }
        if note.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
            errors.push(FieldError::new("note", "must hold no control characters but line breaks and tabs"));
        }
    }
    match errors.is_empty() {
        true => Ok(Annotations { tags, note: body.note }),
        false => Err(ApiError::validation(errors)),
    }
}

/// Set a job's tags and note (every field given replaces what was there).
#[utoipa::path(patch, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = Uuid, Path)), request_body = JobAnnotations,
    responses((status = 200, body = JobView), (status = 403), (status = 404), (status = 422)),
    security(("bearer" = [])))]
pub async fn annotate_job(
    State(state): State<AppState>,
    user: User,
    ApiPath(id): ApiPath<JobId>,
    JsonBody(body): JsonBody<JobAnnotations>,
) -> ApiResult<Json<JobView>> {
    let job = team_job(&state, &user, id).await?;
    user.require_write()?;
    let annotations = checked(body)?;
    let job = state.store.annotate_job(job.id, &annotations).await?;
    let job = job.ok_or_else(|| ApiError::not_found(format!("no job {id}")))?;
    Ok(Json(super::job_view(&job)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_short_plain_words_kept_once_and_notes_keep_their_lines() {
        assert_eq!(tag_problem("lr-sweep"), None);
        assert_eq!(tag_problem("kn=1024"), None);
        assert!(tag_problem("").is_some());
        assert!(tag_problem("with space").unwrap().contains("no spaces"));
        assert!(tag_problem("\"quoted\"").is_some());
        assert!(tag_problem(&"x".repeat(41)).unwrap().contains("at most 40"));
        let body = JobAnnotations {
            tags: Some(vec!["a".into(), "b".into(), "a".into()]),
            note: Some("first line\n\tsecond".into()),
        };
        let annotations = checked(body).unwrap();
        assert_eq!(annotations.tags, Some(vec!["a".to_string(), "b".to_string()]));
        let bad = JobAnnotations { tags: Some(vec!["ok".into(), "no good".into()]), note: Some("bell\u{7}".into()) };
        let err = checked(bad).unwrap_err().into_field_errors().unwrap();
        let paths: Vec<&str> = err.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["tags[1]", "note"]);
    }
}
