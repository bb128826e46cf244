//! The web page at `/`: four files embedded in the binary (`api/web/`), served with the API on the same
//! origin, so the page needs no network beyond the server and no build step. A content security policy
//! allows only this server's own scripts, styles and API.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::state::AppState;

const INDEX: &str = include_str!("../web/index.html");
const SCRIPT: &str = include_str!("../web/app.js");
const CHARTS: &str = include_str!("../web/charts.js");
const STYLE: &str = include_str!("../web/app.css");

const POLICY: &str =
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

fn file(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

/// `/`, `/web/app.js`, `/web/charts.js`, `/web/app.css`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { file("text/html; charset=utf-8", INDEX) }))
        .route("/web/app.js", get(|| async { file("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/web/charts.js", get(|| async { file("text/javascript; charset=utf-8", CHARTS) }))
        .route("/web/app.css", get(|| async { file("text/css; charset=utf-8", STYLE) }))
}
