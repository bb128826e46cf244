//! The routes, one module per resource, registered with their OpenAPI descriptions in one place so the
//! router and the document cannot drift apart.

pub mod agent;
pub mod dataset_uploads;
pub mod datasets;
pub mod health;
pub mod jobs;
pub mod me;
pub mod models;
pub mod nodes;
pub mod registered_datasets;
pub mod schedules;
pub mod studies;
pub mod teams;
pub mod tokens;
pub mod usage;

use axum::extract::DefaultBodyLimit;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use axum::http::StatusCode;

use crate::error::{FieldErrorDoc, Problem, ProblemType, PROBLEM_JSON};
use crate::state::AppState;

#[derive(OpenApi)]
#[openapi(
    info(title = "ringtrain",
        description = "Training as a service: Goyal et al.'s large-minibatch SGD on a shared worker pool. \
        Every error is RFC 7807 application/problem+json; validation errors list each field's JSON path in `errors`."),
    modifiers(&BearerAuth),
    components(schemas(Problem, ProblemType, FieldErrorDoc)),
    tags((name = "jobs"), (name = "studies"), (name = "schedules"), (name = "datasets"), (name = "models"), (name = "teams"), (name = "tokens"), (name = "agent"), (name = "ops"))
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Every error response (4xx, 5xx) a route declares without a body is an RFC 7807 problem: the routes say
/// only which statuses they answer (and why, where it is not obvious), and this fills in the body once.
/// It also declares what every route of a kind can answer, whatever its handler does: 429 and 503 on
/// every route (the admission limits, the request timeout), 401 and 403 where a token is needed, 400
/// where there are path or query parameters, and 400, 413, 415 and 422 where a JSON body is read.
#[derive(Debug)]
pub struct ProblemResponses;

/// The statuses every route of a kind can answer, and why.
fn common_responses(operation: &utoipa::openapi::path::Operation) -> Vec<(&'static str, &'static str)> {
    use utoipa::openapi::path::ParameterIn;
    let mut common = vec![
        ("429", "A limit was reached (requests at once, this token's rate, its event streams); see Retry-After"),
        ("503", "The request took longer than the server's timeout, or the database cannot be reached"),
    ];
    if operation.security.as_ref().is_some_and(|s| !s.is_empty()) {
        common.push(("401", "No token, or an unknown, revoked or expired one"));
        common.push(("403", "A token of the other kind (agent or user), or a role that may not do this"));
    }
    let parameters = operation.parameters.as_deref().unwrap_or_default();
    if parameters.iter().any(|p| matches!(p.parameter_in, ParameterIn::Path | ParameterIn::Query)) {
        common.push(("400", "A path or query parameter is malformed (the problem names it)"));
    }
    let json_body = operation.request_body.as_ref().is_some_and(|body| body.content.contains_key("application/json"));
    if json_body {
        common.push(("400", "The body is not JSON"));
        common.push(("413", "The body is larger than 1 MiB"));
        common.push(("415", "The body is not sent as application/json"));
        common.push(("422", "A field of the body is wrong (each listed with its JSON path)"));
    }
    common
}

impl Modify for ProblemResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{Content, Ref, RefOr, ResponseBuilder};
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.options,
                &mut item.head,
                &mut item.patch,
                &mut item.trace,
            ];
            for operation in operations.into_iter().flatten() {
                for (status, description) in common_responses(operation) {
                    operation
                        .responses
                        .responses
                        .entry(status.to_string())
                        .or_insert_with(|| ResponseBuilder::new().description(description).build().into());
                }
                for (status, response) in operation.responses.responses.iter_mut() {
                    let RefOr::T(response) = response else { continue };
                    let is_error = status.starts_with('4') || status.starts_with('5');
                    if !is_error || !response.content.is_empty() {
                        continue;
                    }
                    let problem = Content::new(Some(Ref::from_schema_name("Problem")));
                    response.content.insert(PROBLEM_JSON.to_string(), problem);
                    if response.description.is_empty() {
                        let reason = status.parse().ok().and_then(|s| StatusCode::from_u16(s).ok());
                        response.description = reason.and_then(|s| s.canonical_reason()).unwrap_or("error").into();
                    }
                }
            }
        }
    }
}

/// Every route with its documentation.
pub fn router() -> OpenApiRouter<AppState> {
    // Uploads are streamed with their own (larger) limit; every other body is capped by the app's.
    let uploads = OpenApiRouter::new()
        .routes(routes!(datasets::upload_dataset, datasets::list_datasets))
        .routes(routes!(datasets::delete_dataset))
        .routes(routes!(dataset_uploads::put_part))
        .routes(routes!(models::upload_model, models::list_models))
        .routes(routes!(models::get_model, models::delete_model))
        .routes(routes!(agent::files::upload_checkpoint))
        .layer(axum::middleware::from_fn(crate::unread_body::drain_after_refusal))
        .layer(DefaultBodyLimit::disable());
    // A result carries every epoch's record: a long job's is megabytes, and refusing it would re-run a
    // finished job, so it has a limit of its own.
    let results = OpenApiRouter::new()
        .routes(routes!(agent::reports::report_result))
        .routes(routes!(agent::logs::report_logs))
        .layer(DefaultBodyLimit::max(MAX_RESULT_BYTES));
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(jobs::submit_job, jobs::list_jobs))
        .routes(routes!(dataset_uploads::start_upload, dataset_uploads::list_uploads))
        .routes(routes!(dataset_uploads::get_upload, dataset_uploads::delete_upload))
        .routes(routes!(dataset_uploads::complete_upload))
        .routes(routes!(registered_datasets::register_dataset))
        .routes(routes!(jobs::get_job, jobs::annotations::annotate_job))
        .routes(routes!(jobs::control::cancel_job))
        .routes(routes!(jobs::control::resume_job))
        .routes(routes!(jobs::logs::job_logs))
        .routes(routes!(jobs::events::job_events))
        .routes(routes!(jobs::metrics::job_metrics))
        .routes(routes!(jobs::metrics::job_schedule))
        .routes(routes!(jobs::artifacts::job_checkpoints))
        .routes(routes!(jobs::artifacts::delete_job_artifacts))
        .routes(routes!(jobs::artifacts::download_checkpoint))
        .routes(routes!(jobs::artifacts::download_weights))
        .routes(routes!(schedules::preview_schedule))
        .routes(routes!(studies::create_study, studies::list_studies))
        .routes(routes!(studies::get_study))
        .routes(routes!(studies::study_plot))
        .routes(routes!(studies::cancel_study))
        .routes(routes!(teams::create_team, teams::list_teams))
        .routes(routes!(teams::update_team))
        .routes(routes!(teams::team_storage))
        .routes(routes!(usage::team_usage))
        .routes(routes!(tokens::create_team_token, tokens::list_team_tokens))
        .routes(routes!(tokens::create_agent_token, tokens::list_agent_tokens))
        .routes(routes!(tokens::revoke_token))
        .routes(routes!(me::me))
        .routes(routes!(nodes::list_nodes))
        .routes(routes!(nodes::quarantine_node, nodes::lift_quarantine))
        .routes(routes!(agent::nodes::register_node))
        .routes(routes!(agent::nodes::heartbeat))
        .routes(routes!(agent::nodes::self_test))
        .routes(routes!(agent::assignments::poll_assignments))
        .routes(routes!(agent::assignments::update_assignment))
        .routes(routes!(agent::assignments::report_endpoint))
        .routes(routes!(agent::files::agent_download_checkpoint))
        .routes(routes!(agent::files::agent_download_dataset))
        .routes(routes!(agent::files::agent_download_model))
        .routes(routes!(agent::files::agent_download_init))
        .routes(routes!(agent::reports::job_running))
        .routes(routes!(agent::reports::report_metrics))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::prometheus))
        .routes(routes!(health::openapi_json))
        .merge(uploads)
        .merge(results)
}

/// The largest result an agent may report: 64 MiB holds the records of well over 100,000 epochs.
pub const MAX_RESULT_BYTES: usize = 64 << 20;
