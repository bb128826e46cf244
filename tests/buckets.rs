//! Sharded data sets in an S3-compatible bucket: a real S3 server (s3s-fs, the s3s project's
//! file-backed server, which scripts/test.sh installs) holds Fashion-MNIST packed into JPEG shards, uploaded
//! with S3 PUTs. Through the API (`ringtrain up` with the store's endpoint and credentials in its
//! environment), a team granted a prefix trains from it: the agent streams the shards into its cache as the
//! ranks say they will read them (saying so in the job's logs) and the ranks read them there, their
//! environment free of the credentials, to the very same result as the same shards read from a folder,
//! also when the data set is larger than the node's cache. A prefix not granted, or one that holds no data
//! set, is refused (422), and a shard whose bytes are not its index's fails the job naming the shard.

use std::path::{Path, PathBuf};
use std::time::Duration;

use object_store::aws::AmazonS3;
use object_store::{ObjectStore, PutPayload};
use serde_json::{json, Value};
use support::s3::{S3Server, SECRET_KEY};
use support::shards::{open_to_ranks, packed};

mod support;

const BUCKET: &str = "datasets";

/// Every file of `folder` PUT under `prefix`, except those `replace` gives other bytes for.
async fn upload(store: &AmazonS3, folder: &Path, prefix: &str, replace: &[(String, Vec<u8>)]) {
    for entry in std::fs::read_dir(folder).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = match replace.iter().find(|(n, _)| *n == name) {
            Some((_, bytes)) => bytes.clone(),
            None => std::fs::read(&path).unwrap(),
        };
        let key = object_store::path::Path::from(format!("{prefix}/{name}"));
        store.put(&key, PutPayload::from(bytes)).await.unwrap_or_else(|e| panic!("PUT {key}: {e}"));
    }
}

/// A built-in ResNet, 3 epochs of the 2,400 images on 2 workers (about 2 s an epoch here).
fn spec(name: &str, dataset: &str) -> Value {
    json!({
        "name": name, "model": {"name": "resnet8"}, "dataset": dataset, "image_size": 28, "workers": 2,
        "per_worker_batch": 32, "epochs": 3, "seed": 5,
        "lr": {"base": 0.1, "reference_batch": 64, "warmup": {"kind": "gradual", "epochs": 1}, "decay": {"kind": "none"}}
    })
}

/// Grants team "vision" the data root `root`.
async fn grant(cluster: &support::Cluster, root: &str) {
    let teams = cluster.api.get("/v1/teams").await;
    let team = teams["teams"].as_array().or(teams.as_array()).unwrap().iter().find(|t| t["name"] == "vision").unwrap();
    let granted = json!({"data_roots": [root]});
    let (status, body) = cluster
        .api
        .request(reqwest::Method::PATCH, &format!("/v1/teams/{}", team["id"].as_str().unwrap()), Some(granted))
        .await;
    assert_eq!(status, 200, "{body}");
}

/// The bytes of the files under `folder` (a node's cache of streamed data sets) now.
fn bytes_under(folder: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(folder) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => bytes_under(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_team_trains_from_its_bucket_prefix_as_from_a_folder_and_a_bad_shard_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let shards = packed(dir.path());
    open_to_ranks(dir.path());
    let server = S3Server::start(&dir.path().join("s3"), BUCKET);
    let store = server.client(BUCKET);
    upload(&store, &shards, "team-a/fashion", &[]).await;
    let index: Value = serde_json::from_str(&std::fs::read_to_string(shards.join("index.json")).unwrap()).unwrap();
    let damaged = index["train"]["shards"][1]["name"].as_str().unwrap().to_string();
    let mut bytes = std::fs::read(shards.join(&damaged)).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    upload(&store, &shards, "team-a/damaged", &[(damaged.clone(), bytes)]).await;

    // the store's endpoint and credentials are the agent's (nextest runs each test in a process of its own);
    // the folder is the server's --idx-root, for the same shards read from a path
    server.export_to_environment();
    std::env::set_var("RINGTRAIN_IDX_ROOTS", dir.path());
    let cluster = support::Cluster::up("buckets", 2).await;
    let api = cluster.team("vision", 2).await;
    grant(&cluster, &format!("s3://{BUCKET}/team-a")).await;

    let from_bucket = api.submit(&spec("from the bucket", &format!("shards:s3://{BUCKET}/team-a/fashion"))).await;
    for environment in support::rank_environments(&from_bucket).await {
        assert!(
            !environment.contains(SECRET_KEY) && !environment.contains("AWS_"),
            "a rank's environment holds the store's credentials:\n{environment}"
        );
    }
    let job = api.wait_state(&from_bucket, "succeeded", Duration::from_secs(300)).await;
    let logs = api.get(&format!("/v1/jobs/{from_bucket}/logs?q=agent")).await.to_string();
    let streaming = format!("agent: s3://{BUCKET}/team-a/fashion streams into this node's cache as the ranks read it");
    assert!(logs.contains(&streaming), "the stream is in the job's logs: {logs}");
    let from_path = api.submit(&spec("from the folder", &format!("shards:{}", shards.display()))).await;
    let same = api.wait_state(&from_path, "succeeded", Duration::from_secs(300)).await;
    let (a, b) = (&job["result"]["final_test_error"], &same["result"]["final_test_error"]);
    assert!(a.as_f64().unwrap() < 0.75, "it learned from the bucket (chance: 0.9): {job}");
    assert_eq!(a, b, "the same shards from a bucket and from a folder train to the same result");
    eprintln!("ResNet-8, 3 epochs: final test error {a} from the bucket, {b} from the folder");
    let cache = cluster.dir.join("data/agent/shards");
    let copies: Vec<PathBuf> = std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(copies.len(), 1, "one folder in the node's cache, shared by the ranks: {copies:?}");
    assert!(copies[0].join(&damaged).is_file() && copies[0].join("index.json").is_file());

    let (status, problem) = api
        .request(reqwest::Method::POST, "/v1/jobs", Some(spec("ungranted", &format!("shards:s3://{BUCKET}/team-b/x"))))
        .await;
    assert_eq!(status, 422, "{problem}");
    assert!(problem.to_string().contains("dataset") && problem.to_string().contains("inside"), "{problem}");

    // the server reads buckets too (its environment has the credentials): a prefix without a data set is
    // refused at submission, not when the job starts
    let (status, problem) = api
        .request(
            reqwest::Method::POST,
            "/v1/jobs",
            Some(spec("missing", &format!("shards:s3://{BUCKET}/team-a/nothing"))),
        )
        .await;
    assert_eq!(status, 422, "{problem}");
    assert!(problem.to_string().contains("holds no index.json"), "{problem}");

    // registered by reference: its index read and counted, a sample of its shards checked; a job names it
    // by id and is stored naming the bucket
    let (status, registered) = api
        .request(
            reqwest::Method::POST,
            "/v1/datasets/sharded",
            Some(json!({"name": "fashion", "source": format!("s3://{BUCKET}/team-a/fashion")})),
        )
        .await;
    assert_eq!(status, 201, "{registered}");
    assert_eq!((&registered["train_samples"], &registered["num_classes"]), (&json!(2400), &json!(10)), "{registered}");
    let by_id = api.submit(&spec("by id", registered["id"].as_str().unwrap())).await;
    let stored = api.job(&by_id).await;
    assert_eq!(stored["spec"]["dataset"], format!("shards:s3://{BUCKET}/team-a/fashion"), "{stored}");
    api.post(&format!("/v1/jobs/{by_id}/cancel"), json!({})).await;

    let broken = api.submit(&spec("a damaged shard", &format!("shards:s3://{BUCKET}/team-a/damaged"))).await;
    let failed = api.wait_state(&broken, "failed", Duration::from_secs(120)).await;
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(error.contains(&format!("shard {damaged}")) && error.contains("its index says"), "{failed}");
    assert_eq!(failed["attempt"], 1, "a shard that does not match its index is not retried: {failed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_data_set_larger_than_the_nodes_cache_streams_through_it_to_the_same_result() {
    let dir = tempfile::tempdir().unwrap();
    let shards = support::shards::packed_from(dir.path(), 6000, 400, 0.05);
    open_to_ranks(dir.path());
    let index: Value = serde_json::from_str(&std::fs::read_to_string(shards.join("index.json")).unwrap()).unwrap();
    let sizes: Vec<u64> = ["train", "test"]
        .iter()
        .flat_map(|split| index[split]["shards"].as_array().unwrap().iter().map(|s| s["bytes"].as_u64().unwrap()))
        .collect();
    let (total, largest) = (sizes.iter().sum::<u64>(), *sizes.iter().max().unwrap());
    let server = S3Server::start(&dir.path().join("s3"), BUCKET);
    upload(&server.client(BUCKET), &shards, "team-a/fashion", &[]).await;
    // the node's cache holds 40 shards' worth: its 2 ranks' windows and the shards fetched ahead of them
    // (2 × (8 + 16)), less than half of the data set
    let bound = 40 * largest;
    assert!(total > 2 * bound, "{total} bytes of shards against a bound of {bound}");
    server.export_to_environment();
    std::env::set_var("RINGTRAIN_IDX_ROOTS", dir.path());
    std::env::set_var("RINGTRAIN_CACHE_MAX_GIB", (bound as f64 / (1u64 << 30) as f64).to_string());
    let cluster = support::Cluster::up("streaming", 2).await;
    let api = cluster.team("vision", 2).await;
    grant(&cluster, &format!("s3://{BUCKET}/team-a")).await;

    // the cache's size, watched while the job trains
    let cache = cluster.dir.join("data/agent/shards");
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (cache, watching) = (cache.clone(), watching.clone());
        std::thread::spawn(move || {
            let mut peak = 0;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(bytes_under(&cache));
                std::thread::sleep(Duration::from_millis(5));
            }
            peak
        })
    };
    let mut streamed = spec("streamed", &format!("shards:s3://{BUCKET}/team-a/fashion"));
    streamed["epochs"] = json!(2);
    let from_bucket = api.submit(&streamed).await;
    let job = api.wait_state(&from_bucket, "succeeded", Duration::from_secs(300)).await;
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let peak = watcher.join().unwrap();
    let logs = api.get(&format!("/v1/jobs/{from_bucket}/logs?q=agent")).await.to_string();
    assert!(logs.contains("so shards are fetched again each epoch"), "the bound is said in the job's logs: {logs}");
    // the ranks' next shards are fetched ahead within the bound; a shard a rank waits for comes past it
    // when nothing else may go (each rank waits for one at a time)
    assert!(peak <= bound + 2 * largest, "the cache held {peak} bytes at its peak, bound {bound}");
    assert!(peak < total, "the cache never held the whole data set ({peak} of {total} bytes)");
    eprintln!("streamed {total} bytes of shards through a cache of {bound}: peak {peak}");

    let mut from_folder = streamed.clone();
    from_folder["name"] = json!("from the folder");
    from_folder["dataset"] = json!(format!("shards:{}", shards.display()));
    let from_path = api.submit(&from_folder).await;
    let same = api.wait_state(&from_path, "succeeded", Duration::from_secs(300)).await;
    let (a, b) = (&job["result"]["final_test_error"], &same["result"]["final_test_error"]);
    assert!(a.as_f64().unwrap() < 0.75, "it learned from the bucket (chance: 0.9): {job}");
    assert_eq!(a, b, "streamed through a small cache or read from a folder: the same result");
}

/// A store that stops answering while a job streams from it costs the job an attempt, not the job: the
/// agent tries each shard for about a minute, the ranks then fail saying the store is unavailable for now
/// (not a job error), and once the store answers again the job is tried again and succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn a_store_that_stops_answering_costs_an_attempt_not_the_job() {
    let dir = tempfile::tempdir().unwrap();
    // many small shards: the ranks still need some when the store goes
    let shards = support::shards::packed_from(dir.path(), 6000, 400, 0.05);
    open_to_ranks(dir.path());
    let mut server = S3Server::start(&dir.path().join("s3"), BUCKET);
    upload(&server.client(BUCKET), &shards, "team-a/fashion", &[]).await;
    server.export_to_environment();
    std::env::set_var("RINGTRAIN_IDX_ROOTS", dir.path());
    let cluster = support::Cluster::up("outage", 2).await;
    let api = cluster.team("vision", 2).await;
    grant(&cluster, &format!("s3://{BUCKET}/team-a")).await;
    let mut spec = spec("outage", &format!("shards:s3://{BUCKET}/team-a/fashion"));
    spec["epochs"] = json!(2);
    spec["max_restarts"] = json!(20);
    let id = api.submit(&spec).await;
    api.wait_job(&id, Duration::from_secs(120), "its first iterations", |job| {
        job["progress"]["iterations_done"].as_u64() > Some(2)
    })
    .await;
    server.stop();
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let said = loop {
        let logs = api.get(&format!("/v1/jobs/{id}/logs?q=unavailable")).await.to_string();
        if logs.contains("the store is unavailable for now") {
            break logs;
        }
        assert!(std::time::Instant::now() < deadline, "no rank said the store was unavailable: {logs}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    assert!(said.contains("shard train-"), "the shard is named: {said}");
    server.restart();
    let job = api.wait_state(&id, "succeeded", Duration::from_secs(400)).await;
    assert!(job["attempt"].as_i64().unwrap() >= 2, "tried again after the outage: {job}");
}
