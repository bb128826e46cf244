//! Sharded data sets registered by reference: a folder inside the team's data roots is read and
//! checked when registered (its index counted, a sample of its shards compared with the index), a job names
//! it by id and is stored naming its source, the registration cannot go while a job uses it and leaves the
//! bytes when it goes; a source outside the roots (by name or through a link), without an index, or with a
//! shard that is not its index's is refused naming the problem.

mod common;

use std::path::Path;

use axum::http::Method;
use common::{spec, TestApp, ADMIN};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// A folder of three training shards of made-up bytes and an index that describes them; returns the
/// shards' names.
fn shards(dir: &Path) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    let mut listed = Vec::new();
    for i in 0..3u8 {
        let name = format!("train-{i:06}.tar");
        let bytes = vec![i; 20_480 + usize::from(i)];
        std::fs::write(dir.join(&name), &bytes).unwrap();
        let sha256: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        listed.push(json!({"name": name, "bytes": bytes.len(), "samples": 10, "sha256": sha256}));
    }
    let index = json!({
        "format": "ringtrain-shards/1", "kind": "images", "classes": ["a", "b", "c"],
        "normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
        "train": {"samples": 30, "shards": listed},
    });
    std::fs::write(dir.join("index.json"), index.to_string()).unwrap();
    (0..3).map(|i| format!("train-{i:06}.tar")).collect()
}

fn reasons(reply: &common::Reply, field: &str) -> String {
    let errors = reply.body["errors"].as_array().cloned().unwrap_or_default();
    errors.iter().filter(|e| e["path"] == field).map(|e| e["reason"].as_str().unwrap_or("").to_string()).collect()
}

async fn a_registered_data_set_is_checked_named_by_id_and_resolved_to_its_source(app: TestApp) {
    let roots = tempfile::Builder::new().prefix("roots").tempdir().unwrap();
    let granted = roots.path().join("alpha");
    let team = app.team("alpha").await;
    let patch = app.patch(&format!("/v1/teams/{}", team.id), ADMIN, &json!({"data_roots": [granted]})).await;
    assert_eq!(patch.status, 200, "{}", patch.text);
    let source = granted.join("fashion");
    let names = shards(&source);
    let register = |body: Value| {
        let app = &app;
        let member = team.member.clone();
        async move { app.post("/v1/datasets/sharded", &member, &body).await }
    };

    let registered = register(json!({"name": "fashion", "source": source})).await;
    assert_eq!(registered.status, 201, "{}", registered.text);
    assert_eq!(
        (&registered.body["train_samples"], &registered.body["num_classes"], &registered.body["size_bytes"]),
        (&json!(30), &json!(3), &json!(3 * 20_480 + 3))
    );
    assert_eq!(registered.body["source"], json!(source));
    let id = registered.body["id"].as_str().unwrap().to_string();
    let storage = app.get(&format!("/v1/teams/{}/storage", team.id), &team.viewer).await;
    assert_eq!(storage.body["datasets_bytes"], 0, "its bytes are not the server's: {}", storage.text);

    // a job names it by id and is stored naming its source
    let mut on_it = spec("on the registered shards");
    on_it["model"] = json!({"name": "resnet8"});
    on_it["image_size"] = json!(28);
    on_it["dataset"] = json!(id);
    let job = app.submit(&team.member, &on_it).await;
    let stored = app.get(&format!("/v1/jobs/{job}"), &team.viewer).await;
    assert_eq!(stored.body["spec"]["dataset"], format!("shards:{}", source.display()), "{}", stored.text);
    let refused = app.call(Method::DELETE, &format!("/v1/datasets/{id}"), Some(&team.member), None).await;
    refused.problem(409);
    assert!(refused.text.contains(&job), "{}", refused.text);
    let cancelled = app.post(&format!("/v1/jobs/{job}/cancel"), &team.member, &json!({})).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.text);
    let deleted = app.call(Method::DELETE, &format!("/v1/datasets/{id}"), Some(&team.member), None).await;
    assert_eq!(deleted.status, 204, "{}", deleted.text);
    assert!(names.iter().all(|n| source.join(n).is_file()), "the shards are the team's and stay");

    // refusals, each naming the problem at `source`
    let outside = register(json!({"name": "x", "source": roots.path().join("beta")})).await;
    outside.problem(422);
    assert!(reasons(&outside, "source").contains("inside"), "{}", outside.text);
    let empty = granted.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let no_index = register(json!({"name": "x", "source": empty})).await;
    no_index.problem(422);
    assert!(reasons(&no_index, "source").contains("index.json"), "{}", no_index.text);
    let elsewhere = roots.path().join("beta/secret");
    shards(&elsewhere);
    std::os::unix::fs::symlink(&elsewhere, granted.join("link")).unwrap();
    let linked = register(json!({"name": "x", "source": granted.join("link")})).await;
    linked.problem(422);
    assert!(reasons(&linked, "source").contains("outside the team's data roots"), "{}", linked.text);
    let damaged = granted.join("damaged");
    let names = shards(&damaged);
    std::fs::write(damaged.join(&names[2]), vec![9u8; 20_482]).unwrap();
    let bad = register(json!({"name": "x", "source": damaged})).await;
    bad.problem(422);
    assert!(reasons(&bad, "source").contains(&format!("shard {} of", names[2])), "{}", bad.text);
    assert!(reasons(&bad, "source").contains("its index says"), "{}", bad.text);
    assert_eq!(app.get("/v1/datasets", &team.viewer).await.body["datasets"], json!([]), "nothing was registered");
}

ringtrain_store::on_both_backends!(
    setup = crate::common::TestApp::new;
    a_registered_data_set_is_checked_named_by_id_and_resolved_to_its_source,
);
