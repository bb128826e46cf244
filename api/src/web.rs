//! The web page at `/`: `index.html` and the files of [`FILES`] (`api/web/`: CSS and native ES modules, the
//! shell `app.js` and one module per view under `views/`), embedded in the binary and served with the API on
//! the same origin, so the page needs no network beyond the server and no build step. A content security
//! policy allows only this server's own scripts, styles and API.

use axum::extract::rejection::PathRejection;
use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::state::AppState;
use crate::ApiError;

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

const INDEX: &str = include_str!("../web/index.html");

/// Every file under `/web/`: its path there (exactly: nothing else is served, so `..` or a file not listed
/// is a 404), its content type and its text. A new module is served once it is listed here.
pub const FILES: &[(&str, &str, &str)] = &[
    ("app.css", CSS, include_str!("../web/app.css")),
    ("app.js", JS, include_str!("../web/app.js")),
    ("api.js", JS, include_str!("../web/api.js")),
    ("dom.js", JS, include_str!("../web/dom.js")),
    ("charts.js", JS, include_str!("../web/charts.js")),
    ("views/cluster.js", JS, include_str!("../web/views/cluster.js")),
    ("views/compare.js", JS, include_str!("../web/views/compare.js")),
    ("views/job.js", JS, include_str!("../web/views/job.js")),
    ("views/jobs.js", JS, include_str!("../web/views/jobs.js")),
    ("views/studies.js", JS, include_str!("../web/views/studies.js")),
    ("views/submit.js", JS, include_str!("../web/views/submit.js")),
    ("views/team.js", JS, include_str!("../web/views/team.js")),
];

const POLICY: &str =
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `/web/{path}`: the file of [`FILES`] with exactly that path, or 404 problem+json.
async fn web_file(path: Result<Path<String>, PathRejection>) -> Result<Response, ApiError> {
    let path = path.map(|Path(path)| path).unwrap_or_default();
    match FILES.iter().find(|(name, ..)| *name == path) {
        Some((_, content_type, body)) => Ok(file(content_type, body)),
        None => Err(ApiError::not_found(format!("no file /web/{path}"))),
    }
}

/// `/` (the page) and `/web/{path}` (its files).
pub fn routes() -> Router<AppState> {
    router()
}

/// The routes, for any state (they use none).
fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/", get(|| async { file(HTML, INDEX) })).route("/web/{*path}", get(web_file))
}

#[cfg(test)]
mod tests {
    use axum::body::{to_bytes, Body};
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;

    async fn get(path: &str) -> (StatusCode, String, String) {
        let request = Request::get(path).body(Body::empty()).unwrap();
        let response = router::<()>().oneshot(request).await.unwrap();
        let status = response.status();
        let content_type =
            response.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, content_type, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn web_files_are_served_from_the_table_with_their_types_and_nothing_else() {
        let (status, content_type, body) = get("/").await;
        assert_eq!((status, content_type.as_str()), (StatusCode::OK, HTML));
        assert!(body.contains("/web/app.js"), "{body}");
        for (name, content_type, text) in FILES {
            let (status, served_type, body) = get(&format!("/web/{name}")).await;
            assert_eq!((status, served_type.as_str()), (StatusCode::OK, *content_type), "{name}");
            assert_eq!(body, *text, "{name}");
        }
        let request = Request::get("/web/views/job.js").body(Body::empty()).unwrap();
        let response = router::<()>().oneshot(request).await.unwrap();
        for (name, value) in [
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ] {
            assert_eq!(response.headers()[&name], value, "{name}");
        }
        for missing in [
            "/web/nope.js",
            "/web/views",
            "/web/views/",
            "/web/views/../app.js",
            "/web/views/%2e%2e/app.js",
            "/web/./app.js",
            "/web/../src/web.rs",
            "/web/%2e%2e/Cargo.toml",
            "/web/APP.JS",
            "/web/app.js/",
            "/web/",
        ] {
            let (status, content_type, body) = get(missing).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{missing}: {body}");
            // `/web/` itself matches no route here; inside the app its fallback answers problem+json
            if missing != "/web/" {
                assert_eq!(content_type, crate::error::PROBLEM_JSON, "{missing}");
            }
        }
    }

    /// Every module the page imports is in the table: a view added to `api/web/` but not to [`FILES`] would
    /// otherwise fail only in a browser.
    #[test]
    fn every_import_of_the_page_is_served() {
        let listed = |path: &str| FILES.iter().any(|(name, ..)| *name == path);
        let mut imports = 0;
        for (name, _, text) in FILES.iter().filter(|(name, ..)| name.ends_with(".js")) {
            let folder = name.rsplit_once('/').map_or("", |(folder, _)| folder);
            // `import ... from "x"`, on one line or several
            for quoted in text.split(" from \"").skip(1) {
                let target = quoted.split('"').next().unwrap();
                let parts: Vec<&str> = if let Some(absolute) = target.strip_prefix("/web/") {
                    absolute.split('/').collect()
                } else {
                    assert!(target.starts_with("./") || target.starts_with("../"), "{name} imports {target}");
                    folder.split('/').filter(|p| !p.is_empty()).chain(target.split('/')).collect()
                };
                let mut resolved = Vec::new();
                for part in parts {
                    match part {
                        "." => {}
                        ".." => assert!(resolved.pop().is_some(), "{name}: {target} leaves /web/"),
                        part => resolved.push(part),
                    }
                }
                let resolved = resolved.join("/");
                assert!(listed(&resolved), "{name} imports {target} ({resolved}), which web.rs does not serve");
                imports += 1;
            }
        }
        assert!(imports >= 8, "the shell imports every view: {imports} imports seen");
        let references: Vec<&str> =
            INDEX.split("=\"/web/").skip(1).map(|reference| reference.split('"').next().unwrap()).collect();
        assert!(references.contains(&"app.js") && references.contains(&"app.css"), "{references:?}");
        for path in references {
            assert!(listed(path), "index.html refers to /web/{path}, which web.rs does not serve");
        }
    }

    /// Every file in `api/web/` is in the table (and so in the binary), `index.html` being served at `/`.
    #[test]
    fn every_file_of_the_page_is_in_the_table() {
        fn walk(dir: &std::path::Path, prefix: &str, found: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                if entry.file_name().to_string_lossy().starts_with('.') {
                    continue; // an editor's swap file, say
                }
                let name = format!("{prefix}{}", entry.file_name().to_str().unwrap());
                if entry.file_type().unwrap().is_dir() {
                    walk(&entry.path(), &format!("{name}/"), found);
                } else {
                    found.push(name);
                }
            }
        }
        let mut found = Vec::new();
        walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("web"), "", &mut found);
        for name in found.iter().filter(|name| *name != "index.html") {
            assert!(FILES.iter().any(|(listed, ..)| listed == name), "api/web/{name} is not in web.rs's FILES");
        }
        assert_eq!(found.len(), FILES.len() + 1, "{found:?}");
    }
}
