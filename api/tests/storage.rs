//! Storage: per-team byte quotas for datasets and checkpoints, retention of checkpoints, delete
//! routes, and the free-space reserve.

mod common;

use std::time::Duration;

use axum::http::Method;
use common::{safetensors_file, TestApp, ADMIN};
use serde_json::json;

/// Two checkpoints per job besides the final weights.
async fn keeping_two(store: std::sync::Arc<dyn ringtrain_store::Store>) -> TestApp {
    TestApp::with_config(store, |config| config.keep_checkpoints = 2).await
}

/// No upload fits: the disk's reserve is larger than any disk.
async fn full_disk(store: std::sync::Arc<dyn ringtrain_store::Store>) -> TestApp {
    TestApp::with_config(store, |config| config.min_free_bytes = u64::MAX / 2).await
}

fn upload_uri(name: &str) -> String {
    format!("/v1/datasets?name={name}")
}

/// A team's datasets count against its quota: an upload past it is 413 with the numbers, deleting a
/// dataset makes room, and the platform admin can change the quota (null: the server's default).
async fn a_teams_storage_is_bounded_by_its_quota(app: TestApp) {
    let file = safetensors_file(100, |i| (i % 3) as i64);
    let size = file.len() as u64;
    let created = app
        .post(
            "/v1/teams",
            ADMIN,
            &json!({"name": "tight", "gpu_quota": 0, "cpu_quota": 1, "storage_quota_bytes": size + size / 2}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    assert_eq!(created.body["storage_quota_bytes"], size + size / 2);
    let team = created.body["id"].as_str().unwrap().to_string();
    let member = app.post(&format!("/v1/teams/{team}/tokens"), ADMIN, &json!({"role": "member"})).await;
    let member = member.body["token"].as_str().unwrap().to_string();
    let viewer = app.post(&format!("/v1/teams/{team}/tokens"), ADMIN, &json!({"role": "viewer"})).await;
    let viewer = viewer.body["token"].as_str().unwrap().to_string();

    let first = app.send_bytes(Method::POST, &upload_uri("first"), &member, file.clone()).await;
    assert_eq!(first.status, 201, "{}", first.text);
    let first_id = first.body["id"].as_str().unwrap().to_string();
    let over = app.send_bytes(Method::POST, &upload_uri("second"), &member, file.clone()).await;
    over.problem(413);
    assert_eq!(over.body["type"], "urn:ringtrain:problem:storage-quota");
    assert!(
        over.body["detail"].as_str().unwrap().contains("does not fit in the team's storage quota"),
        "{}",
        over.text
    );
    let storage = app.get(&format!("/v1/teams/{team}/storage"), &viewer).await;
    assert_eq!(storage.status, 200, "{}", storage.text);
    assert_eq!(
        (storage.body["used_bytes"].as_u64(), storage.body["datasets_bytes"].as_u64()),
        (Some(size), Some(size))
    );
    assert_eq!(storage.body["quota_bytes"], size + size / 2);
    let files = || std::fs::read_dir(app.dir.path().join("datasets")).unwrap().count();
    assert_eq!(files(), 1, "the refused upload left no file");

    // deleting makes room; a viewer cannot, another team cannot even see it
    let other = app.team("other").await;
    let delete_uri = format!("/v1/datasets/{first_id}");
    assert_eq!(app.call(Method::DELETE, &delete_uri, Some(&viewer), None).await.status, 403);
    assert_eq!(app.call(Method::DELETE, &delete_uri, Some(&other.member), None).await.status, 404);
    assert_eq!(app.get(&format!("/v1/teams/{team}/storage"), &other.member).await.status, 404);
    assert_eq!(app.call(Method::DELETE, &delete_uri, Some(&member), None).await.status, 204);
    assert_eq!(files(), 0);
    assert_eq!(app.call(Method::DELETE, &delete_uri, Some(&member), None).await.status, 404);
    let second = app.send_bytes(Method::POST, &upload_uri("second"), &member, file.clone()).await;
    assert_eq!(second.status, 201, "{}", second.text);

    // the platform admin lifts the quota back to the default
    let patch = json!({"storage_quota_bytes": null, "cpu_quota": 2});
    assert_eq!(app.call(Method::PATCH, &format!("/v1/teams/{team}"), Some(&member), Some(&patch)).await.status, 403);
    let changed = app.call(Method::PATCH, &format!("/v1/teams/{team}"), Some(ADMIN), Some(&patch)).await;
    assert_eq!(changed.status, 200, "{}", changed.text);
    assert_eq!((changed.body["storage_quota_bytes"].is_null(), changed.body["cpu_quota"].as_i64()), (true, Some(2)));
    let storage = app.get(&format!("/v1/teams/{team}/storage"), &viewer).await;
    assert_eq!(storage.body["quota_bytes"], 100u64 << 30);
    // JSON Schema's integers include 3.0; a body is an object, never an array of field values
    let whole =
        app.call(Method::PATCH, &format!("/v1/teams/{team}"), Some(ADMIN), Some(&json!({"gpu_quota": 3.0}))).await;
    assert_eq!(whole.body["gpu_quota"], 3, "{}", whole.text);
    let array = app.call(Method::PATCH, &format!("/v1/teams/{team}"), Some(ADMIN), Some(&json!([1, 2, null]))).await;
    assert_eq!(array.problem(422), vec![""]);
    let too_big = json!({"storage_quota_bytes": 9_223_372_036_854_775_808u64});
    let too_big = app.call(Method::PATCH, &format!("/v1/teams/{team}"), Some(ADMIN), Some(&too_big)).await;
    assert_eq!(too_big.problem(422), vec!["storage_quota_bytes"]);
    assert_eq!(app.send_bytes(Method::POST, &upload_uri("third"), &member, file).await.status, 201);
}

/// A dataset a queued job trains on cannot be deleted; once the job is over, it can.
async fn a_dataset_in_use_stays(app: TestApp) {
    let team = app.team("alpha").await;
    let file = safetensors_file(100, |i| (i % 3) as i64);
    let upload = app.send_bytes(Method::POST, &upload_uri("d"), &team.member, file).await;
    let dataset = upload.body["id"].as_str().unwrap().to_string();
    let mut spec = common::spec("on it");
    spec["dataset"] = json!(dataset);
    spec["workers"] = json!(1);
    spec["per_worker_batch"] = json!(10);
    let job = app.submit(&team.member, &spec).await;
    let delete = format!("/v1/datasets/{dataset}");
    let refused = app.call(Method::DELETE, &delete, Some(&team.member), None).await;
    refused.problem(409);
    assert!(refused.body["detail"].as_str().unwrap().contains(&job), "{}", refused.text);
    app.post(&format!("/v1/jobs/{job}/cancel"), &team.member, &json!({})).await;
    assert_eq!(app.call(Method::DELETE, &delete, Some(&team.member), None).await.status, 204);
}

/// Uploads `name` as a checkpoint of the job at `iteration`.
async fn checkpoint(app: &TestApp, agent: &str, job: &str, attempt: i32, iteration: u64, is_final: bool) -> u16 {
    let name = format!("epoch-{:04}", iteration / 32);
    let uri = format!(
        "/v1/agent/jobs/{job}/checkpoints/{name}?attempt={attempt}&epoch={}&iteration={iteration}&final={is_final}",
        iteration / 32
    );
    let reply = app.send_bytes(Method::PUT, &uri, agent, vec![7u8; 1000]).await;
    assert!(reply.status.is_success(), "{}", reply.text);
    reply.status.as_u16()
}

/// Only the newest two checkpoints (and the final weights) stay, files and rows; a finished job's
/// checkpoints can be deleted, a running job's cannot.
async fn checkpoints_are_kept_to_the_newest_few(app: TestApp) {
    let team = app.team("alpha").await;
    let (job, agent, attempt) = common::placed_job(&app, &team, 8, Duration::from_secs(60), true).await;
    for epoch in 1..=4 {
        checkpoint(&app, &agent, &job, attempt, epoch * 32, false).await;
    }
    let listed = app.get(&format!("/v1/jobs/{job}/checkpoints"), &team.viewer).await;
    let iterations: Vec<i64> =
        listed.body["checkpoints"].as_array().unwrap().iter().map(|c| c["iteration"].as_i64().unwrap()).collect();
    assert_eq!(iterations, vec![96, 128]);
    let folder = app.dir.path().join("checkpoints").join(&job);
    assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 2);
    checkpoint(&app, &agent, &job, attempt, 256, true).await;
    checkpoint(&app, &agent, &job, attempt, 160, false).await;
    let listed = app.get(&format!("/v1/jobs/{job}/checkpoints"), &team.viewer).await;
    assert_eq!(listed.body["checkpoints"].as_array().unwrap().len(), 3, "{}", listed.text);
    let storage = app.get(&format!("/v1/teams/{}/storage", team.id), &team.viewer).await;
    assert_eq!(storage.body["checkpoints_bytes"], 3000);

    let delete = format!("/v1/jobs/{job}/artifacts");
    app.call(Method::DELETE, &delete, Some(&team.member), None).await.problem(409);
    let result = json!({"attempt": attempt, "outcome": "succeeded", "result": {}});
    assert_eq!(app.post(&format!("/v1/agent/jobs/{job}/result"), &agent, &result).await.status, 200);
    assert_eq!(app.call(Method::DELETE, &delete, Some(&team.viewer), None).await.status, 403);
    let deleted = app.call(Method::DELETE, &delete, Some(&team.member), None).await;
    assert_eq!(deleted.status, 200, "{}", deleted.text);
    assert_eq!((deleted.body["deleted"].as_u64(), deleted.body["freed_bytes"].as_u64()), (Some(3), Some(3000)));
    assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 0);
}

/// An upload that would leave the disk below its reserve is 507, and leaves nothing behind.
async fn a_full_disk_refuses_uploads(app: TestApp) {
    let team = app.team("alpha").await;
    let refused = app.send_bytes(Method::POST, &upload_uri("d"), &team.member, safetensors_file(10, |_| 0)).await;
    refused.problem(507);
    assert!(refused.body["detail"].as_str().unwrap().contains("in reserve"), "{}", refused.text);
    assert_eq!(app.get("/v1/datasets", &team.viewer).await.body["datasets"], json!([]));
}

ringtrain_store::on_both_backends!(
    setup = crate::common::TestApp::new;
    a_teams_storage_is_bounded_by_its_quota,
    a_dataset_in_use_stays,
);

ringtrain_store::on_both_backends!(
    setup = crate::keeping_two;
    checkpoints_are_kept_to_the_newest_few,
);

ringtrain_store::on_both_backends!(
    setup = crate::full_disk;
    a_full_disk_refuses_uploads,
);
