//! Rank logs through the routes: an agent relays a rank's lines (each stored once), the team reads them
//! with filters, in pages and as a following SSE stream, a failed job's view carries its last lines, and
//! the per-job rate and total bound what is stored.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{placed_job, TestApp};
use ringtrain_store::Store;
use serde_json::{json, Value};

fn lines(from: i64, n: i64, stream: &str, text: &str) -> Value {
    json!((from..from + n)
        .map(|seq| json!({"seq": seq, "at": "2026-12-01T00:00:00Z", "stream": stream, "text": format!("{text} {seq}")}))
        .collect::<Vec<_>>())
}

async fn a_ranks_lines_are_stored_once_read_with_filters_and_shown_when_it_fails(app: TestApp) {
    let team = app.team("alpha").await;
    let (id, agent, attempt) = placed_job(&app, &team, 4, Duration::from_secs(60), true).await;
    let uri = format!("/v1/agent/jobs/{id}/logs");
    let mut batch = lines(0, 3, "stdout", "loading data");
    batch.as_array_mut().unwrap().extend(lines(3, 2, "stderr", "Traceback: bad label").as_array().unwrap().clone());
    let body = json!({"attempt": attempt, "rank": 0, "lines": batch});
    let sent = app.post(&uri, &agent, &body).await;
    assert_eq!(
        (sent.status.as_u16(), &sent.body["stored"], &sent.body["dropped"]),
        (200, &json!(5), &json!(0)),
        "{}",
        sent.text
    );
    let again = app.post(&uri, &agent, &body).await;
    assert_eq!(again.body["stored"], 0, "a batch sent again stores nothing twice: {}", again.text);

    let page = app.get(&format!("/v1/jobs/{id}/logs"), &team.viewer).await;
    assert_eq!(page.status, 200, "{}", page.text);
    let all = page.body["lines"].as_array().unwrap();
    let texts: Vec<&str> = all.iter().map(|l| l["line"].as_str().unwrap()).collect();
    assert_eq!(
        texts,
        ["loading data 0", "loading data 1", "loading data 2", "Traceback: bad label 3", "Traceback: bad label 4"]
    );
    let next = page.body["next_since"].as_i64().unwrap();
    assert_eq!(next, all[4]["id"].as_i64().unwrap());
    let found = app.get(&format!("/v1/jobs/{id}/logs?q=Traceback&rank=0&attempt={attempt}"), &team.viewer).await.body;
    assert_eq!(found["lines"].as_array().unwrap().len(), 2, "{found}");
    let case = app.get(&format!("/v1/jobs/{id}/logs?q=traceback"), &team.viewer).await.body;
    assert_eq!(case["lines"], json!([]), "the search is case-sensitive on both databases: {case}");
    let after = app.get(&format!("/v1/jobs/{id}/logs?since={next}"), &team.viewer).await.body;
    assert_eq!((after["lines"].clone(), after["next_since"].as_i64()), (json!([]), Some(next)));
    let paged = app.get(&format!("/v1/jobs/{id}/logs?limit=2"), &team.viewer).await.body;
    assert_eq!(paged["lines"].as_array().unwrap().len(), 2);

    // bad input is refused with the field named; another team sees nothing
    let refused = app.post(&uri, &agent, &json!({"attempt": attempt, "rank": 3, "lines": []})).await;
    assert_eq!(refused.status, 422, "{}", refused.text);
    assert!(refused.text.contains("rank"), "{}", refused.text);
    let odd = json!({"attempt": attempt, "rank": 0, "lines": lines(9, 1, "stdin", "x")});
    let refused = app.post(&uri, &agent, &odd).await;
    assert!(refused.status == 422 && refused.text.contains("lines[0].stream"), "{}", refused.text);
    assert_eq!(app.get(&format!("/v1/jobs/{id}/logs?limit=0"), &team.viewer).await.status, 400);
    let other = app.team("beta").await;
    app.get(&format!("/v1/jobs/{id}/logs"), &other.viewer).await.problem(404);

    // the job fails: its view carries the last stderr lines, and a following stream sends every line and
    // ends (the job is over)
    let failure = json!({"attempt": attempt, "outcome": "failed", "error": "rank 0 exited with 1", "retryable": false});
    let failed = app.post(&format!("/v1/agent/jobs/{id}/result"), &agent, &failure).await;
    assert_eq!(failed.status, 200, "{}", failed.text);
    let view = app.get(&format!("/v1/jobs/{id}"), &team.viewer).await.body;
    assert_eq!(view["state"], "failed");
    let last: Vec<&str> =
        view["last_log_lines"].as_array().unwrap().iter().map(|l| l["line"].as_str().unwrap()).collect();
    assert_eq!(last, ["Traceback: bad label 3", "Traceback: bad label 4"], "{view}");
    let stream =
        tokio::time::timeout(Duration::from_secs(10), sse(&app, &format!("/v1/jobs/{id}/logs?since=2"), &team.viewer))
            .await
            .expect("the stream of a finished job ends");
    let sent: Vec<&str> = stream.lines().filter(|l| l.starts_with("event: ")).collect();
    assert_eq!(sent, ["event: line"; 3], "{stream}");
    assert!(stream.contains("Traceback: bad label 4"), "{stream}");

    // deleting the job's artifacts deletes its lines too
    let deleted =
        app.call(axum::http::Method::DELETE, &format!("/v1/jobs/{id}/artifacts"), Some(&team.member), None).await;
    assert_eq!(deleted.body["log_lines"], 5, "{}", deleted.text);
}

/// The whole body of an SSE response.
async fn sse(app: &TestApp, uri: &str, token: &str) -> String {
    use tower::ServiceExt;
    let request = axum::http::Request::builder()
        .uri(uri)
        .header("authorization", format!("Bearer {token}"))
        .header("accept", "text/event-stream")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = app.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

async fn a_jobs_lines_are_bounded_by_rate_and_total(app: TestApp) {
    let team = app.team("alpha").await;
    let (id, agent, attempt) = placed_job(&app, &team, 4, Duration::from_secs(60), true).await;
    let uri = format!("/v1/agent/jobs/{id}/logs");
    // 5 lines a second with 10 s saved up: 50 of 80 at once
    let burst =
        app.post(&uri, &agent, &json!({"attempt": attempt, "rank": 0, "lines": lines(0, 80, "stderr", "spam")})).await;
    assert_eq!((burst.body["stored"].as_u64(), burst.body["dropped"].as_u64()), (Some(50), Some(30)), "{}", burst.text);
    // and 60 in all: after two seconds (10 more of rate) only 10 fit
    tokio::time::sleep(Duration::from_secs(2)).await;
    let more =
        app.post(&uri, &agent, &json!({"attempt": attempt, "rank": 0, "lines": lines(80, 20, "stderr", "spam")})).await;
    assert_eq!((more.body["stored"].as_u64(), more.body["dropped"].as_u64()), (Some(10), Some(10)), "{}", more.text);
    let total = app.get(&format!("/v1/jobs/{id}/logs?limit=5000"), &team.viewer).await.body;
    assert_eq!(total["lines"].as_array().unwrap().len(), 60);
}

async fn bounded(store: Arc<dyn Store>) -> TestApp {
    TestApp::with_config(store, |config| {
        config.log_lines_per_second = 5.0;
        config.max_log_lines_per_job = 60;
    })
    .await
}

ringtrain_store::on_both_backends!(
    setup = crate::common::TestApp::new;
    a_ranks_lines_are_stored_once_read_with_filters_and_shown_when_it_fails,
);

ringtrain_store::on_both_backends!(
    setup = crate::bounded;
    a_jobs_lines_are_bounded_by_rate_and_total,
);
