//! Health, readiness, Prometheus metrics, the OpenAPI document, and dataset uploads.

mod common;

use axum::body::Body;
use axum::http::{header, Method, Request};
use common::{safetensors_file, spec, TestApp};
use serde_json::json;

/// Every route of the router, as (method, OpenAPI path). The test below checks each is both served and
/// documented, and that the document lists nothing else.
const ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/jobs"),
    ("get", "/v1/jobs"),
    ("get", "/v1/jobs/{id}"),
    ("post", "/v1/jobs/{id}/cancel"),
    ("post", "/v1/jobs/{id}/resume"),
    ("patch", "/v1/jobs/{id}"),
    ("get", "/v1/jobs/{id}/events"),
    ("get", "/v1/jobs/{id}/logs"),
    ("get", "/v1/jobs/{id}/metrics"),
    ("get", "/v1/jobs/{id}/schedule"),
    ("get", "/v1/jobs/{id}/checkpoints"),
    ("get", "/v1/jobs/{id}/checkpoints/{checkpoint}/archive"),
    ("post", "/v1/schedules/preview"),
    ("post", "/v1/studies"),
    ("get", "/v1/studies"),
    ("get", "/v1/studies/{id}"),
    ("get", "/v1/studies/{id}/plot.svg"),
    ("post", "/v1/studies/{id}/cancel"),
    ("post", "/v1/datasets"),
    ("get", "/v1/datasets"),
    ("post", "/v1/teams"),
    ("get", "/v1/teams"),
    ("post", "/v1/teams/{id}/tokens"),
    ("get", "/v1/teams/{id}/tokens"),
    ("post", "/v1/agent-tokens"),
    ("get", "/v1/agent-tokens"),
    ("delete", "/v1/tokens/{id}"),
    ("get", "/v1/nodes"),
    ("post", "/v1/agent/nodes"),
    ("post", "/v1/agent/nodes/{id}/heartbeat"),
    ("post", "/v1/agent/nodes/{id}/self-test"),
    ("post", "/v1/nodes/{id}/quarantine"),
    ("delete", "/v1/nodes/{id}/quarantine"),
    ("get", "/v1/agent/nodes/{id}/assignments"),
    ("post", "/v1/agent/assignments/{id}/endpoint"),
    ("put", "/v1/agent/jobs/{id}/checkpoints/{name}"),
    ("get", "/v1/agent/jobs/{id}/checkpoints/{checkpoint}/archive"),
    ("get", "/v1/agent/datasets/{id}"),
    ("get", "/v1/agent/jobs/{id}/model"),
    ("get", "/v1/agent/jobs/{id}/init"),
    ("post", "/v1/models"),
    ("get", "/v1/models"),
    ("get", "/v1/models/{id}"),
    ("delete", "/v1/models/{id}"),
    ("get", "/v1/jobs/{id}/checkpoints/{checkpoint}/weights/{file}"),
    ("post", "/v1/agent/assignments/{id}/state"),
    ("post", "/v1/agent/jobs/{id}/running"),
    ("post", "/v1/agent/jobs/{id}/metrics"),
    ("post", "/v1/agent/jobs/{id}/logs"),
    ("post", "/v1/agent/jobs/{id}/result"),
    ("delete", "/v1/datasets/{id}"),
    ("post", "/v1/datasets/uploads"),
    ("post", "/v1/datasets/sharded"),
    ("get", "/v1/datasets/uploads"),
    ("get", "/v1/datasets/uploads/{id}"),
    ("put", "/v1/datasets/uploads/{id}/parts/{number}"),
    ("post", "/v1/datasets/uploads/{id}/complete"),
    ("delete", "/v1/datasets/uploads/{id}"),
    ("delete", "/v1/jobs/{id}/artifacts"),
    ("patch", "/v1/teams/{id}"),
    ("get", "/v1/teams/{id}/storage"),
    ("get", "/v1/teams/{id}/usage"),
    ("get", "/v1/me"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
];

async fn openapi_lists_every_route(app: TestApp) {
    let reply = app.call(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(reply.status, 200);
    let doc = reply.body;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{}", doc["openapi"]);
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    // a team's data roots are folders by the schema too: what Schemathesis generates is what the API takes
    assert!(doc["components"]["schemas"]["DataRoot"]["pattern"].is_string(), "{}", doc["components"]["schemas"]);
    let mut documented = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                documented.push((method.clone(), path.clone()));
            }
        }
    }
    documented.sort();
    let mut expected: Vec<(String, String)> = ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
    expected.sort();
    assert_eq!(documented, expected);
    for (method, path) in ROUTES {
        let operation = &doc["paths"][path][method];
        assert!(operation["responses"].as_object().is_some_and(|r| !r.is_empty()), "{method} {path}");
        // Every error answer is documented as a problem document (the routes declare only the statuses).
        for (status, response) in operation["responses"].as_object().unwrap() {
            if status.starts_with('4') || status.starts_with('5') {
                let schema = &response["content"]["application/problem+json"]["schema"]["$ref"];
                assert_eq!(schema, "#/components/schemas/Problem", "{method} {path} {status}");
                assert!(!response["description"].as_str().unwrap_or("").is_empty(), "{method} {path} {status}");
            }
        }
        if path.starts_with("/v1/") {
            assert!(operation["security"].is_array(), "{method} {path} documents its auth");
        }
        // The router serves it: without a token a /v1 route answers 401, never the unknown-route 404.
        let uri = path
            .replace("{id}", "00000000-0000-0000-0000-000000000001")
            .replace("{checkpoint}", "00000000-0000-0000-0000-000000000002")
            .replace("{name}", "epoch-0001");
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let reply = app.call(method.clone(), &uri, None, None).await;
        assert_ne!(reply.body["detail"].as_str().unwrap_or("").get(..8), Some("no route"), "{method} {uri}");
        if path.starts_with("/v1/") {
            assert_eq!(reply.status, 401, "{method} {uri}: {}", reply.text);
        }
    }
    // Problem documents are described.
    assert!(doc["components"]["schemas"]["Problem"].is_object());
    assert_document_is_consistent(&doc);
}

/// The structural rules of OpenAPI 3.1 that a generated document can break: every `$ref` resolves, operation
/// ids are unique, and every `{param}` of a path is declared as a required path parameter.
fn assert_document_is_consistent(doc: &serde_json::Value) {
    fn refs<'a>(value: &'a serde_json::Value, out: &mut Vec<&'a str>) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(target)) = map.get("$ref") {
                    out.push(target);
                }
                map.values().for_each(|v| refs(v, out));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut targets = Vec::new();
    refs(doc, &mut targets);
    assert!(!targets.is_empty());
    for target in targets {
        let pointer = target.strip_prefix('#').unwrap_or_else(|| panic!("external $ref {target}"));
        assert!(doc.pointer(pointer).is_some(), "dangling $ref {target}");
    }
    let mut operation_ids = std::collections::HashSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let id = operation["operationId"].as_str().unwrap_or_else(|| panic!("{method} {path} has no operationId"));
            assert!(operation_ids.insert(id.to_string()), "duplicate operationId {id}");
            let declared: Vec<&str> = operation["parameters"]
                .as_array()
                .map(|ps| ps.iter().filter(|p| p["in"] == "path" && p["required"] == true))
                .into_iter()
                .flatten()
                .map(|p| p["name"].as_str().unwrap())
                .collect();
            let in_path: Vec<&str> =
                path.split('/').filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}'))).collect();
            assert_eq!(declared, in_path, "{method} {path}: path parameters");
        }
    }
}

async fn health_readiness_and_prometheus(app: TestApp) {
    assert_eq!(app.call(Method::GET, "/healthz", None, None).await.body["status"], "ok");
    assert_eq!(app.call(Method::GET, "/readyz", None, None).await.body["status"], "ready");
    let team = app.team("alpha").await;
    app.submit(&team.member, &spec("m")).await;
    app.get("/v1/jobs/00000000-0000-0000-0000-000000000001", &team.member).await;
    let reply = app.call(Method::GET, "/metrics", None, None).await;
    assert_eq!(reply.status, 200);
    assert!(reply.content_type().starts_with("application/openmetrics-text"));
    let text = reply.text;
    assert!(text.contains(r#"ringtrain_http_requests_total{method="POST",route="/v1/jobs",status="201"} 1"#), "{text}");
    assert!(
        text.contains(r#"ringtrain_http_requests_total{method="GET",route="/v1/jobs/{id}",status="404"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(
            "ringtrain_http_request_duration_seconds_bucket{le=\"+Inf\",method=\"POST\",route=\"/v1/jobs\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains("ringtrain_jobs{state=\"queued\"} 1"), "{text}");
    assert!(text.contains("ringtrain_queue_depth 1"));
}

async fn responses_carry_request_ids_and_compress(app: TestApp) {
    let team = app.team("alpha").await;
    for i in 0..5 {
        app.submit(&team.member, &spec(&format!("compress-{i}"))).await;
    }
    let request = Request::builder()
        .uri("/v1/jobs")
        .header(header::AUTHORIZATION, format!("Bearer {}", team.member))
        .header(header::ACCEPT_ENCODING, "gzip")
        .header("x-request-id", "abc-123")
        .body(Body::empty())
        .unwrap();
    let reply = app.send(request).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.headers["x-request-id"], "abc-123");
    assert_eq!(reply.headers[header::CONTENT_ENCODING], "gzip");
    let generated = app.get("/healthz", &team.member).await;
    assert!(generated.headers.contains_key("x-request-id"));
}

async fn datasets_upload_check_and_isolate(app: TestApp) {
    let team = app.team("alpha").await;
    let other = app.team("beta").await;
    let upload = |token: &str, name: &str, bytes: Vec<u8>, content_type: &str| {
        Request::builder()
            .method(Method::POST)
            .uri(format!("/v1/datasets?name={name}"))
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from(bytes))
            .unwrap()
    };
    let reply = app
        .send(upload(&team.member, "tiny", safetensors_file(100, |i| (i % 3) as i64), "application/octet-stream"))
        .await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    // without x_test/y_test the worker holds out the last 10%: the schedule counts the 90 it trains on
    assert_eq!(reply.body["train_samples"], 90);
    assert_eq!(reply.body["sample_shape"], json!([1, 2, 2]));
    assert_eq!(reply.body["num_classes"], 3);
    let id = reply.body["id"].as_str().unwrap().to_string();
    assert!(reply.body.get("path").is_none(), "no server path in an answer: {}", reply.text);
    assert!(app
        .dir
        .path()
        .join("datasets")
        .join(format!("{}.safetensors", reply.body["id"].as_str().unwrap()))
        .exists());

    // a test split is checked like the training one: both tensors, the same sample shape, labels in range
    let with_test = |test_labels: i64, shape: Vec<usize>, pair: bool| {
        use safetensors::tensor::{Dtype, TensorView};
        let x: Vec<u8> = (0..40 * 4).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let y: Vec<u8> = (0..40).flat_map(|i: i64| (i % 2).to_le_bytes()).collect();
        let test_size: usize = shape.iter().product();
        let xt: Vec<u8> = (0..test_size).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let yt: Vec<u8> = (0..shape[0]).flat_map(|_| test_labels.to_le_bytes()).collect();
        let mut tensors = vec![
            ("x", TensorView::new(Dtype::F32, vec![40, 1, 2, 2], &x).unwrap()),
            ("y", TensorView::new(Dtype::I64, vec![40], &y).unwrap()),
            ("x_test", TensorView::new(Dtype::F32, shape.clone(), &xt).unwrap()),
        ];
        if pair {
            tensors.push(("y_test", TensorView::new(Dtype::I64, vec![shape[0]], &yt).unwrap()));
        }
        safetensors::serialize(tensors, &None).unwrap()
    };
    let octets = "application/octet-stream";
    let good = app.send(upload(&team.member, "split", with_test(4, vec![8, 1, 2, 2], true), octets)).await;
    assert_eq!(good.status, 201, "{}", good.text);
    assert_eq!((good.body["train_samples"].as_i64(), good.body["num_classes"].as_i64()), (Some(40), Some(5)));
    let huge = app.send(upload(&team.member, "huge", with_test(1_000_000_000_000, vec![8, 1, 2, 2], true), octets));
    assert_eq!(huge.await.problem(422), vec!["y_test"]);
    let shape = app.send(upload(&team.member, "shape", with_test(0, vec![8, 4], true), octets)).await;
    assert_eq!(shape.problem(422), vec!["x_test"]);
    let half = app.send(upload(&team.member, "half", with_test(0, vec![8, 1, 2, 2], false), octets)).await;
    assert_eq!(half.problem(422), vec!["y_test"]);
    let one = app.send(upload(&team.member, "one", safetensors_file(1, |_| 0), octets)).await;
    assert_eq!(one.problem(422), vec!["x"]);

    let listed = app.get("/v1/datasets", &team.viewer).await;
    let names: Vec<&str> =
        listed.body["datasets"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(listed.body["datasets"].as_array().unwrap().iter().any(|d| d["id"] == id.as_str()));
    assert_eq!(app.get("/v1/datasets", &other.member).await.body["datasets"], json!([]));

    // A job on the uploaded dataset gets its size; another team cannot use it.
    let mut on_upload = spec("uploaded");
    on_upload["dataset"] = json!(id);
    on_upload["workers"] = json!(1);
    on_upload["per_worker_batch"] = json!(10);
    let job = app.post("/v1/jobs", &team.member, &on_upload).await;
    assert_eq!(job.status, 201, "{}", job.text);
    // the 90 samples the worker trains on, not the 100 uploaded
    assert_eq!(job.body["effective"]["iterations_per_epoch"], 9);
    assert_eq!(app.post("/v1/jobs", &other.member, &on_upload).await.problem(422), vec!["dataset"]);

    // Bad uploads are refused with the tensor named, and leave no file behind.
    let negative =
        app.send(upload(&team.member, "neg", safetensors_file(10, |i| i as i64 - 1), "application/octet-stream")).await;
    assert_eq!(negative.problem(422), vec!["y"]);
    let garbage = app.send(upload(&team.member, "junk", b"not safetensors".to_vec(), "application/octet-stream")).await;
    assert_eq!(garbage.problem(422), vec![""]);
    app.send(upload(&team.member, "json", b"{}".to_vec(), "application/json")).await.problem(415);
    app.send(upload(&team.viewer, "v", safetensors_file(10, |_| 0), "application/octet-stream")).await.problem(403);
    let big = app.send(upload(&team.member, "big", vec![0u8; (1 << 20) + 10], "application/octet-stream")).await;
    big.problem(413);
    let files: Vec<_> = std::fs::read_dir(app.dir.path().join("datasets")).unwrap().collect();
    assert_eq!(files.len(), 2, "only the accepted uploads stay");
}

ringtrain_store::on_both_backends!(
    setup = crate::common::TestApp::new;
    openapi_lists_every_route,
    health_readiness_and_prometheus,
    responses_carry_request_ids_and_compress,
    datasets_upload_check_and_isolate,
);
