//! Data set uploads in parts: parts sent in any order, each kept only when its size and checksum
//! hold; an interrupted part (a body that breaks off) leaves nothing and is sent again; the upload survives
//! a server restart and completes into the same data set as a single upload of the file; bad parts, missing
//! parts and a joined file that is not a data set are refused naming the problem; the declared size counts
//! against the quota; another team sees nothing of it; an upload abandoned for a week expires.

mod common;

use axum::body::Body;
use axum::http::{header, Method, Request};
use common::{safetensors_file, TestApp, ADMIN};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const PART: usize = 1 << 20;

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

async fn put_part(
    app: &TestApp,
    token: &str,
    upload: &str,
    number: usize,
    bytes: &[u8],
    checksum: &str,
) -> common::Reply {
    let request = Request::builder()
        .method(Method::PUT)
        .uri(format!("/v1/datasets/uploads/{upload}/parts/{number}"))
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header("x-checksum-sha256", checksum)
        .body(Body::from(bytes.to_vec()))
        .unwrap();
    app.send(request).await
}

fn parts(file: &[u8]) -> Vec<&[u8]> {
    file.chunks(PART).collect()
}

fn errors(reply: &common::Reply) -> Vec<(String, String)> {
    reply.body["errors"]
        .as_array()
        .map(|errors| {
            errors
                .iter()
                .map(|e| (e["path"].as_str().unwrap().to_string(), e["reason"].as_str().unwrap().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

async fn an_upload_in_parts_becomes_the_same_data_set_as_one_upload(app: TestApp) {
    let team = app.team("alpha").await;
    // 3 parts of 1 MiB and a short last one
    let file = safetensors_file(150_000, |i| (i % 7) as i64);
    assert!(file.len() > 3 * PART && file.len() < 4 * PART, "{}", file.len());
    let pieces = parts(&file);
    let started = app
        .post(
            "/v1/datasets/uploads",
            &team.member,
            &json!({"name": "in parts", "size_bytes": file.len(), "part_bytes": PART}),
        )
        .await;
    assert_eq!(started.status, 201, "{}", started.text);
    let id = started.body["id"].as_str().unwrap().to_string();
    assert_eq!((started.body["parts"].as_i64(), &started.body["missing"]), (Some(4), &json!([1, 2, 3, 4])));
    // the declared size counts from the start
    let storage = app.get(&format!("/v1/teams/{}/storage", team.id), &team.viewer).await;
    assert_eq!(storage.body["datasets_bytes"].as_u64(), Some(file.len() as u64), "{}", storage.text);

    // a part whose bytes are not its checksum's is not kept
    let wrong = put_part(&app, &team.member, &id, 3, pieces[2], &sha256(pieces[1])).await;
    wrong.problem(422);
    assert!(
        errors(&wrong)
            .iter()
            .any(|(f, r)| f == "x-checksum-sha256" && r.contains("part 3 has sha256") && r.contains("not kept")),
        "{}",
        wrong.text
    );
    // nor one of the wrong size, one past the last, or one without a checksum
    let short = put_part(&app, &team.member, &id, 1, &pieces[0][..1000], &sha256(&pieces[0][..1000])).await;
    short.problem(422);
    assert!(
        errors(&short).iter().any(|(_, r)| r.contains("part 1 has 1000 bytes; it must have 1048576")),
        "{}",
        short.text
    );
    let past = put_part(&app, &team.member, &id, 5, pieces[3], &sha256(pieces[3])).await;
    past.problem(422);
    assert!(errors(&past).iter().any(|(f, r)| f == "number" && r.contains("parts 1 to 4")), "{}", past.text);
    let unsigned = put_part(&app, &team.member, &id, 1, pieces[0], "").await;
    unsigned.problem(400);
    assert!(unsigned.text.contains("x-checksum-sha256"), "{}", unsigned.text);
    // a part whose body breaks off mid-way leaves nothing
    let broken = futures_util::stream::iter(vec![
        Ok::<_, std::io::Error>(axum::body::Bytes::copy_from_slice(&pieces[1][..1000])),
        Err(std::io::Error::other("the connection dropped")),
    ]);
    let request = Request::builder()
        .method(Method::PUT)
        .uri(format!("/v1/datasets/uploads/{id}/parts/2"))
        .header(header::AUTHORIZATION, format!("Bearer {}", team.member))
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header("x-checksum-sha256", sha256(pieces[1]))
        .body(Body::from_stream(broken))
        .unwrap();
    assert!(app.send(request).await.status.is_client_error());

    // parts in any order; completing early names what is missing
    for number in [4, 2] {
        let kept = put_part(&app, &team.member, &id, number, pieces[number - 1], &sha256(pieces[number - 1])).await;
        assert_eq!(kept.status, 200, "{}", kept.text);
        assert_eq!(kept.body["sha256"], sha256(pieces[number - 1]));
    }
    let early = app.post(&format!("/v1/datasets/uploads/{id}/complete"), &team.member, &json!({})).await;
    early.problem(409);
    assert!(early.text.contains("parts 1, 3 of 4 have not arrived"), "{}", early.text);

    // another team sees nothing of it
    let other = app.team("beta").await;
    assert_eq!(app.get(&format!("/v1/datasets/uploads/{id}"), &other.member).await.status, 404);
    assert_eq!(put_part(&app, &other.member, &id, 1, pieces[0], &sha256(pieces[0])).await.status, 404);

    // a restarted server (a new app on the same store and data folder) knows the upload and its parts
    let app = app.restarted().await;
    let seen = app.get(&format!("/v1/datasets/uploads/{id}"), &team.viewer).await;
    assert_eq!((&seen.body["received"], &seen.body["missing"]), (&json!([2, 4]), &json!([1, 3])), "{}", seen.text);
    for number in [1, 3] {
        let kept = put_part(&app, &team.member, &id, number, pieces[number - 1], &sha256(pieces[number - 1])).await;
        assert_eq!(kept.status, 200, "{}", kept.text);
    }
    let done = app.post(&format!("/v1/datasets/uploads/{id}/complete"), &team.member, &json!({})).await;
    assert_eq!(done.status, 201, "{}", done.text);
    assert_eq!(done.body["id"], id.as_str(), "the data set has the upload's id");
    assert_eq!(done.body["sha256"], sha256(&file));
    let whole = app.send_bytes(Method::POST, "/v1/datasets?name=whole", &team.member, file.clone()).await;
    assert_eq!(whole.status, 201, "{}", whole.text);
    for field in ["size_bytes", "sha256", "train_samples", "sample_shape", "num_classes", "labels"] {
        assert_eq!(done.body[field], whole.body[field], "{field}");
    }
    assert_eq!(app.get("/v1/datasets/uploads", &team.viewer).await.body["uploads"], json!([]));
    let leftovers = std::fs::read_dir(app.dir.path().join("uploads")).map(|d| d.count()).unwrap_or(0);
    let parts_left: usize = std::fs::read_dir(app.dir.path().join("uploads"))
        .map(|dirs| dirs.filter_map(|d| std::fs::read_dir(d.unwrap().path()).ok()).map(|d| d.count()).sum())
        .unwrap_or(0);
    assert_eq!(parts_left, 0, "the parts are removed ({leftovers} folders)");
    let storage = app.get(&format!("/v1/teams/{}/storage", team.id), &team.viewer).await;
    assert_eq!(storage.body["datasets_bytes"].as_u64(), Some(2 * file.len() as u64), "{}", storage.text);
}

async fn bad_uploads_are_refused_naming_the_problem(app: TestApp) {
    let created = app
        .post(
            "/v1/teams",
            ADMIN,
            &json!({"name": "tight", "gpu_quota": 0, "cpu_quota": 1, "storage_quota_bytes": 5 << 20}),
        )
        .await;
    let team = created.body["id"].as_str().unwrap().to_string();
    let member = app.post(&format!("/v1/teams/{team}/tokens"), ADMIN, &json!({"role": "member"})).await;
    let member = member.body["token"].as_str().unwrap().to_string();
    let start = |body: Value| {
        let app = &app;
        let member = member.clone();
        async move { app.post("/v1/datasets/uploads", &member, &body).await }
    };
    let bad = start(json!({"name": " ", "size_bytes": 4, "part_bytes": 1000})).await;
    bad.problem(422);
    let fields: Vec<String> = errors(&bad).into_iter().map(|(f, _)| f).collect();
    assert_eq!(fields, ["name", "size_bytes", "part_bytes"], "{}", bad.text);
    let over_quota = start(json!({"name": "big", "size_bytes": 6 << 20})).await;
    over_quota.problem(413);
    assert_eq!(over_quota.body["type"], "urn:ringtrain:problem:storage-quota");
    let over_limit = start(json!({"name": "huge", "size_bytes": 1u64 << 40})).await;
    over_limit.problem(413);

    // a joined file that is not a data set: refused, and the upload goes
    let junk = vec![7u8; PART + 10];
    let started = start(json!({"name": "junk", "size_bytes": junk.len(), "part_bytes": PART})).await;
    assert_eq!(started.status, 201, "{}", started.text);
    let id = started.body["id"].as_str().unwrap().to_string();
    for (i, piece) in parts(&junk).into_iter().enumerate() {
        assert_eq!(put_part(&app, &member, &id, i + 1, piece, &sha256(piece)).await.status, 200);
    }
    let refused = app.post(&format!("/v1/datasets/uploads/{id}/complete"), &member, &json!({})).await;
    refused.problem(422);
    assert_eq!(app.get(&format!("/v1/datasets/uploads/{id}"), &member).await.status, 404, "the upload is gone");
    assert_eq!(app.get("/v1/datasets", &member).await.body["datasets"], json!([]), "and no data set was made");

    // a deleted upload frees its quota
    let first = start(json!({"name": "a", "size_bytes": 4 << 20})).await;
    assert_eq!(first.status, 201, "{}", first.text);
    start(json!({"name": "b", "size_bytes": 4 << 20})).await.problem(413);
    let id = first.body["id"].as_str().unwrap();
    let deleted = app.call(Method::DELETE, &format!("/v1/datasets/uploads/{id}"), Some(&member), None).await;
    assert_eq!(deleted.status, 204, "{}", deleted.text);
    assert_eq!(start(json!({"name": "b", "size_bytes": 4 << 20})).await.status, 201);
}

/// Data sets of up to 8 MiB in one upload (the tests' default is 1 MiB), as fast as the test sends.
async fn roomy(store: std::sync::Arc<dyn ringtrain_store::Store>) -> TestApp {
    TestApp::with_config(store, |config| {
        config.admission.rate_per_second = 0.0;
        config.max_dataset_bytes = 8 << 20;
    })
    .await
}

/// An upload left unfinished past the retention (7 days) goes with its parts and frees the quota; a recent
/// one stays.
async fn an_abandoned_upload_expires_with_its_parts(app: TestApp) {
    let team = app.team("alpha").await;
    let abandoned = app.post("/v1/datasets/uploads", &team.member, &json!({"name": "old", "size_bytes": 100})).await;
    let abandoned = abandoned.body["id"].as_str().unwrap().to_string();
    let part = vec![3u8; 100];
    assert_eq!(put_part(&app, &team.member, &abandoned, 1, &part, &sha256(&part)).await.status, 200);
    let recent = app.post("/v1/datasets/uploads", &team.member, &json!({"name": "new", "size_bytes": 100})).await;
    let recent = recent.body["id"].as_str().unwrap().to_string();
    // eight days ago, as far as the store knows (the same row, started earlier)
    let id: uuid::Uuid = abandoned.parse().unwrap();
    let mut old = app.store.delete_upload(id).await.unwrap().unwrap();
    old.created_at -= chrono::Duration::days(8);
    app.store.add_upload(old).await.unwrap();
    assert_eq!(ringtrain_api::routes::dataset_uploads::expire_abandoned(&app.state).await.unwrap(), 1);
    assert_eq!(app.get(&format!("/v1/datasets/uploads/{abandoned}"), &team.member).await.status, 404);
    assert!(!app.dir.path().join(format!("uploads/{abandoned}/part-000001")).exists(), "its part is gone");
    assert_eq!(app.get(&format!("/v1/datasets/uploads/{recent}"), &team.member).await.status, 200);
    let storage = app.get(&format!("/v1/teams/{}/storage", team.id), &team.viewer).await;
    assert_eq!(storage.body["datasets_bytes"].as_u64(), Some(100), "only the recent one counts: {}", storage.text);
}

ringtrain_store::on_both_backends!(
    setup = crate::roomy;
    an_upload_in_parts_becomes_the_same_data_set_as_one_upload,
    bad_uploads_are_refused_naming_the_problem,
    an_abandoned_upload_expires_with_its_parts,
);
