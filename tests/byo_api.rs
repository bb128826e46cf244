//! Bring your own model through the API, on `ringtrain up`: the worked example (examples/multi-input)
//! uploaded, checked by the server's `ringtrain models check` process, trained by real rank processes,
//! and downloaded as TorchScript that gives the test error the job reported; bad uploads are refused naming
//! the problem, and another team can neither see nor use the model.

#[path = "support/hostile.rs"]
mod hostile;
mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use sha2::Digest;
use support::Cluster;
use tch::{CModule, Kind, Tensor};

const LONG: Duration = Duration::from_secs(600);
const INPUTS: &str = "numeric,tokens,tokens_mask,set,set_mask";

fn repo(path: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

/// A safetensors file of the given tensors, as bytes.
fn safetensors(dir: &Path, tensors: &[(&str, Tensor)]) -> Vec<u8> {
    let path = dir.join("upload.safetensors");
    let named: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    Tensor::write_safetensors(&named, &path).unwrap();
    std::fs::read(path).unwrap()
}

/// Sends only the head of an upload that declares `length` bytes, and returns the answer as text.
fn declare_upload(base: &str, path: &str, length: u64) -> String {
    use std::io::{Read, Write};
    let address = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n",
        support::ADMIN_TOKEN
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

fn field_errors(body: &Value) -> Vec<(String, String)> {
    body["errors"]
        .as_array()
        .map(|errors| {
            errors
                .iter()
                .map(|e| (e["path"].as_str().unwrap_or("").to_string(), e["reason"].as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts a 422 with an error at `field` whose reason contains `reason`.
fn assert_refused(answer: &(u16, Value), field: &str, reason: &str) {
    let errors = field_errors(&answer.1);
    assert!(
        answer.0 == 422 && errors.iter().any(|(f, r)| f == field && r.contains(reason)),
        "expected 422 at {field} ({reason}): {} {}",
        answer.0,
        answer.1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uploaded_model_trains_through_the_api_and_comes_back_as_torchscript() {
    let cluster = Cluster::up("byo", 2).await;
    let api = &cluster.api;
    let data = repo("examples/multi-input/data.safetensors");
    let (status, dataset) = api.upload("/v1/datasets?name=multi-input", data.clone()).await;
    assert_eq!(status, 201, "{dataset}");
    let names: Vec<&str> = dataset["inputs"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["numeric", "set", "set_mask", "tokens", "tokens_mask"], "{dataset}");
    assert_eq!((dataset["labels"].as_str(), dataset["num_classes"].as_i64()), (Some("classes"), Some(3)));
    let dataset_id = dataset["id"].as_str().unwrap().to_string();

    // bad uploads: each refused, naming the problem; nothing is stored
    let model = repo("examples/multi-input/model.pt");
    let upload = |inputs: &str| format!("/v1/models?name=example&dataset={dataset_id}&inputs={inputs}");
    assert_refused(
        &api.upload(&upload(INPUTS), b"not a TorchScript file".to_vec()).await,
        "body",
        "not a loadable TorchScript file",
    );
    assert_refused(&api.upload(&upload("numeric"), model.clone()).await, "inputs", "forward");
    assert_refused(&api.upload(&upload("numeric,colour"), model.clone()).await, "inputs", "has no x.colour");
    assert_refused(
        &api.upload(&format!("/v1/models?name=example&dataset={dataset_id}"), model.clone()).await,
        "inputs",
        "missing",
    );
    let two_outputs = repo("tests/fixtures/byo/two_outputs.pt");
    assert_refused(&api.upload(&upload("numeric"), two_outputs).await, "body", "not one tensor");
    let regressor = repo("tests/fixtures/byo/regressor.pt");
    assert_refused(&api.upload(&upload("numeric"), regressor).await, "body", "output has shape [2]");
    let hog = repo("tests/fixtures/byo/memory_hog.pt");
    assert_refused(&api.upload(&upload("numeric"), hog).await, "body", "can't allocate memory");
    let no_parameters = repo("tests/fixtures/byo/no_parameters.pt");
    assert_refused(&api.upload(&upload("numeric"), no_parameters).await, "body", "no trainable parameters");
    let dir = cluster.dir.join("uploads");
    std::fs::create_dir_all(&dir).unwrap();
    let x = Tensor::zeros([4, 3], (Kind::Float, tch::Device::Cpu));
    let bad_labels = safetensors(&dir, &[("x.a", x.shallow_clone()), ("y", Tensor::from_slice(&[0i64, 1, -1, 2]))]);
    assert_refused(&api.upload("/v1/datasets?name=bad", bad_labels).await, "y", "label -1 at index 2");
    let short = safetensors(&dir, &[("x.a", x.narrow(0, 0, 3)), ("y", Tensor::from_slice(&[0i64, 1, 1, 2]))]);
    assert_refused(&api.upload("/v1/datasets?name=bad", short).await, "x.a", "has 3 samples where the labels have 4");
    // too large: a declared length past the limit (256 MiB) is refused before any of the body is read
    let answer = declare_upload(&cluster.url, &upload(INPUTS), (256 << 20) + 1);
    assert!(answer.starts_with("HTTP/1.1 413") && answer.contains("models may be at most 256 MiB"), "{answer}");
    assert_eq!(api.get("/v1/models").await["models"], serde_json::json!([]), "no refused model was stored");

    let (status, stored) = api.upload(&upload(INPUTS), model).await;
    assert_eq!(status, 201, "{stored}");
    let model_id = stored["id"].as_str().unwrap().to_string();
    assert_eq!(stored["inputs"], serde_json::json!(INPUTS.split(',').collect::<Vec<_>>()));
    assert_eq!(stored["report"]["output_shape"], serde_json::json!([2, 3]));
    assert!(stored["report"]["parameters"].as_u64().unwrap() > 10_000, "{stored}");

    // another team sees nothing of it and cannot train it, even on its own copy of the data
    let other = cluster.team("byo-other", 2).await;
    assert_eq!(other.request(reqwest::Method::GET, &format!("/v1/models/{model_id}"), None).await.0, 404);
    assert_eq!(other.get("/v1/models").await["models"], serde_json::json!([]));
    let (_, their_dataset) = other.upload("/v1/datasets?name=copy", data).await;
    let spec_text = String::from_utf8(repo("examples/multi-input/spec.json")).unwrap();
    let spec_for = |model: &str, dataset: &str| -> Value {
        serde_json::from_str(&spec_text.replace("MODEL_ID", model).replace("DATASET_ID", dataset)).unwrap()
    };
    let theirs = spec_for(&model_id, their_dataset["id"].as_str().unwrap());
    assert_refused(
        &other.request(reqwest::Method::POST, "/v1/jobs", Some(theirs)).await,
        "model.uploaded",
        "no uploaded model",
    );
    assert_eq!(
        other.request(reqwest::Method::DELETE, &format!("/v1/models/{model_id}"), None).await.0,
        404,
        "nor delete it"
    );
    // a built-in model cannot train on named inputs
    let mut builtin = spec_for(&model_id, &dataset_id);
    builtin["model"] = serde_json::json!({"name": "mlp"});
    assert_refused(&api.request(reqwest::Method::POST, "/v1/jobs", Some(builtin)).await, "dataset", "named inputs");

    // submitted as the user guide does it, trained on 2 rank processes
    let id = api.submit(&spec_for(&model_id, &dataset_id)).await;
    let (status, _) = api.request(reqwest::Method::DELETE, &format!("/v1/models/{model_id}"), None).await;
    assert_eq!(status, 409, "a model a queued or running job trains stays");
    let job = api.wait_state(&id, "succeeded", LONG).await;
    let reported = job["result"]["final_test_error"].as_f64().unwrap();
    assert!(reported < 0.2, "the example learns: test error {reported} (chance is about 0.65)");

    // the trained model back: TorchScript that gives the reported error, and the state dict
    let checkpoints = api.get(&format!("/v1/jobs/{id}/checkpoints")).await;
    let last = checkpoints["checkpoints"].as_array().unwrap().iter().find(|c| c["is_final"] == true).unwrap().clone();
    let weights = format!("/v1/jobs/{id}/checkpoints/{}/weights", last["id"].as_str().unwrap());
    let (status, script) = api.download(&format!("{weights}/model.pt")).await;
    assert_eq!(status, 200);
    let path = dir.join("trained.pt");
    std::fs::write(&path, script).unwrap();
    let mut trained = CModule::load(&path).unwrap();
    trained.set_eval();
    let split =
        Tensor::read_safetensors(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/multi-input/data.safetensors"))
            .unwrap();
    let take = |name: &str| split.iter().find(|(n, _)| n == name).unwrap().1.shallow_clone();
    let inputs: Vec<Tensor> = INPUTS.split(',').map(|n| take(&format!("x_test.{n}"))).collect();
    let logits = tch::no_grad(|| trained.forward_ts(&inputs)).unwrap();
    let error =
        logits.argmax(-1, false).ne_tensor(&take("y_test")).to_kind(Kind::Double).mean(Kind::Double).double_value(&[]);
    assert!((error - reported).abs() < 1e-6, "the downloaded model gives {error}, the job reported {reported}");
    let (status, state_dict) = api.download(&format!("{weights}/model.safetensors")).await;
    assert_eq!(status, 200);
    let state_path = dir.join("trained.safetensors");
    std::fs::write(&state_path, state_dict).unwrap();
    let names: Vec<String> = Tensor::read_safetensors(&state_path).unwrap().into_iter().map(|(n, _)| n).collect();
    assert!(names.iter().any(|n| n == "gru.weight_hh_l0") && names.iter().any(|n| n == "head.2.bias"), "{names:?}");
    assert_eq!(api.download(&format!("{weights}/model.onnx")).await.0, 404);

    // once nothing trains it, it can go
    let (status, _) = api.request(reqwest::Method::DELETE, &format!("/v1/models/{model_id}"), None).await;
    assert_eq!(status, 204);
    assert_eq!(api.request(reqwest::Method::GET, &format!("/v1/models/{model_id}"), None).await.0, 404);
}

/// A refusal that comes before the body is read (a bad token, a missing parameter, an unknown data set)
/// still reaches a client that is sending a large body: the server reads the rest of it first, instead of
/// closing the connection under the client (which then saw a reset, not the reason).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_refused_before_its_body_is_read_is_answered_not_reset() {
    let cluster = Cluster::up("byo-refused", 1).await;
    let junk = vec![7u8; 32 << 20];
    let unknown = "00000000-0000-4000-8000-000000000000";
    let stranger = support::Api::new(&cluster.url, "not-a-token");
    for _ in 0..3 {
        let answer = cluster.api.upload(&format!("/v1/models?name=m&dataset={unknown}&inputs=x"), junk.clone()).await;
        assert_refused(&answer, "dataset", "no uploaded dataset");
        let (status, body) = cluster.api.upload("/v1/models?name=m", junk.clone()).await;
        assert_eq!(status, 400, "{body}");
        let (status, body) = stranger.upload("/v1/datasets?name=d", junk.clone()).await;
        assert_eq!(status, 401, "{body}");
    }
}

/// `ringtrain` as a client, on the example: upload the data set and the model, train, download the weights
/// in both forms, list, delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_uploads_trains_and_downloads_the_example() {
    let cluster = Cluster::up("byo-cli", 2).await;
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringtrain"))
            .args(args)
            .args(["--server", &cluster.url, "--token", support::ADMIN_TOKEN])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let example = |file: &str| Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/multi-input").join(file);
    let data = example("data.safetensors");
    let (ok, out, err) = cli(&["datasets", "upload", data.to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    let dataset: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(dataset["name"], "data", "the name defaults to the file's stem: {out}");
    let dataset_id = dataset["id"].as_str().unwrap();

    // the same file in parts of 1 MiB (3 parts), and an upload in parts that stopped, taken up again
    let in_parts = ["datasets", "upload", data.to_str().unwrap(), "--part-mib", "1", "--name", "in-parts", "--json"];
    let (ok, out, err) = cli(&in_parts);
    assert!(ok && err.contains("3 of 3 parts to send"), "{err}");
    let joined: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((&joined["sha256"], &joined["train_samples"]), (&dataset["sha256"], &dataset["train_samples"]));
    let bytes = std::fs::read(&data).unwrap();
    let started = cluster
        .api
        .post(
            "/v1/datasets/uploads",
            serde_json::json!({"name": "resumed", "size_bytes": bytes.len(), "part_bytes": 1 << 20}),
        )
        .await;
    let upload = started["id"].as_str().unwrap();
    let second = &bytes[1 << 20..2 << 20];
    let checksum: String = sha2::Sha256::digest(second).iter().map(|b| format!("{b:02x}")).collect();
    let path = format!("/v1/datasets/uploads/{upload}/parts/2");
    assert_eq!(cluster.api.put_bytes(&path, &[("x-checksum-sha256", &checksum)], second.to_vec()).await.0, 200);
    let (ok, out, err) = cli(&["datasets", "upload", data.to_str().unwrap(), "--resume", upload, "--json"]);
    assert!(ok && err.contains("2 of 3 parts to send"), "only the missing parts are sent: {err}");
    let resumed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((&resumed["id"].as_str(), &resumed["sha256"]), (&Some(upload), &dataset["sha256"]));

    let model = example("model.pt");
    let (ok, _, err) = cli(&["models", "upload", model.to_str().unwrap(), "--dataset", dataset_id]);
    assert!(!ok && err.contains("422") && err.contains("inputs: missing"), "{err}");
    let upload = ["models", "upload", model.to_str().unwrap(), "--dataset", dataset_id, "--inputs", INPUTS];
    let (ok, out, err) = cli(&[&upload[..], &["--name", "example"]].concat());
    assert!(ok, "{err}");
    assert!(out.starts_with("uploaded model ") && out.contains("15139 parameters"), "{out}");
    let model_id = out.split_whitespace().nth(2).unwrap().to_string();
    let (ok, out, err) = cli(&["models", "list"]);
    assert!(ok && out.contains(&model_id) && out.contains("numeric, tokens"), "{out}{err}");
    let (ok, out, err) = cli(&["datasets", "list"]);
    assert!(ok && out.contains(dataset_id) && out.contains("x.numeric") && out.contains("3 classes"), "{out}{err}");

    let spec = std::fs::read_to_string(example("spec.json")).unwrap();
    let spec =
        spec.replace("MODEL_ID", &model_id).replace("DATASET_ID", dataset_id).replace("\"epochs\": 6", "\"epochs\": 2");
    let spec_path = cluster.dir.join("spec.json");
    std::fs::write(&spec_path, spec).unwrap();
    let (ok, out, err) = cli(&["jobs", "submit", spec_path.to_str().unwrap(), "--watch"]);
    assert!(ok, "the job succeeds: {out}{err}");
    let job = out.split_whitespace().nth(1).unwrap().to_string();

    let script = cluster.dir.join("trained.pt");
    let (ok, out, err) = cli(&["jobs", "weights", &job, "-o", script.to_str().unwrap()]);
    assert!(ok && out.starts_with("wrote "), "{out}{err}");
    let trained = CModule::load(&script).expect("the download is TorchScript");
    assert!(!trained.named_parameters().unwrap().is_empty());
    let state = cluster.dir.join("trained.safetensors");
    let (ok, out, err) = cli(&["jobs", "weights", &job, "-o", state.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(!Tensor::read_safetensors(&state).unwrap().is_empty());
    let (ok, _, err) = cli(&["jobs", "weights", &job, "-o", "trained.bin"]);
    assert!(!ok && err.contains("name a .pt (TorchScript) or a .safetensors"), "{err}");

    let (ok, out, err) = cli(&["models", "delete", &model_id]);
    assert!(ok && out.contains("deleted model"), "{out}{err}");
    let (ok, out, err) = cli(&["datasets", "delete", dataset_id]);
    assert!(ok && out.contains("deleted dataset"), "{out}{err}");
    let (ok, out, _) = cli(&["models", "list"]);
    assert!(ok && out.contains("(no models)"), "{out}");
}

/// The attacks of a hostile member of another team on `ringtrain up`: a model whose forward maps
/// the data folder's agent token and raises its bytes, one that saves a file on the server's host, and one
/// that behaves for the two-sample check and attacks on a training batch. Each upload is refused naming the
/// operator and where; no byte of the token comes back; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_model_is_refused_at_upload_and_reads_and_writes_nothing_on_the_server() {
    let cluster = Cluster::up("hostile", 2).await;
    let attacker = cluster.team("attackers", 2).await;
    let (status, dataset) =
        attacker.upload("/v1/datasets?name=mine", repo("examples/multi-input/data.safetensors")).await;
    assert_eq!(status, 201, "{dataset}");
    let upload = format!("/v1/models?name=hostile&dataset={}&inputs=numeric", dataset["id"].as_str().unwrap());
    let data_dir = cluster.dir.join("data");
    let token_file = data_dir.join("agent-token");
    let token = std::fs::read_to_string(&token_file).unwrap();
    let planted = cluster.dir.join("planted-by-a-model");
    let models = cluster.dir.join("hostile");
    std::fs::create_dir_all(&models).unwrap();
    let cases = [
        ("raise", hostile::raise_file(&token_file, 16), "aten::from_file"),
        ("save", hostile::save_file(&planted), "aten::save"),
        ("delayed", hostile::delayed(&token_file, 16, &planted), "aten::from_file"),
    ];
    for (name, body, operator) in cases {
        let file = std::fs::read(hostile::model(&models, name, &body)).unwrap();
        let answer = attacker.upload(&upload, file).await;
        assert_refused(&answer, "body", operator);
        assert!(answer.1.to_string().contains("__torch__.BatchNormMlp.forward"), "{name}: {}", answer.1);
        assert!(!answer.1.to_string().contains(&token[..16]), "{name}: the token came back: {}", answer.1);
        assert!(!planted.exists(), "{name} wrote on the server's host");
    }
    // a composite model: the allow-list applies to each of its modules
    let raise = std::fs::read(hostile::model(&models, "raise", &hostile::raise_file(&token_file, 16))).unwrap();
    let composite = composite_with(&repo("examples/multi-input/composite.tar"), "encode_set.pt", &raise);
    let answer = attacker.upload(&upload.replace("&inputs=numeric", ""), composite).await;
    assert_refused(&answer, "body", "aten::from_file");
    assert!(answer.1.to_string().contains("module encode_set"), "the module is named: {}", answer.1);
    assert!(!answer.1.to_string().contains(&token[..16]), "the token came back: {}", answer.1);
    assert_eq!(attacker.get("/v1/models").await["models"], serde_json::json!([]), "no hostile model was stored");
}

/// A composite model's archive with one member's bytes replaced.
fn composite_with(archive: &[u8], member: &str, bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut builder = tar::Builder::new(Vec::new());
    for entry in tar::Archive::new(archive).entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry.path().unwrap().to_string_lossy().into_owned();
        let mut content = Vec::new();
        entry.read_to_end(&mut content).unwrap();
        if name == member {
            content = bytes.to_vec();
        }
        let mut header = tar::Header::new_ustar();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, &name, content.as_slice()).unwrap();
    }
    builder.into_inner().unwrap()
}

/// The check measures what a training step of an uploaded model takes (here forward makes a 16 MiB
/// temporary per sample), and admission extrapolates it to the job's per-worker batch: a batch that no
/// device can hold is refused at submission, naming the batch and the measure; a small one passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uploaded_models_step_memory_is_measured_and_a_batch_that_cannot_fit_is_refused() {
    let cluster = Cluster::up("byo-memory", 2).await;
    let api = &cluster.api;
    let (status, dataset) = api.upload("/v1/datasets?name=multi", repo("examples/multi-input/data.safetensors")).await;
    assert_eq!(status, 201, "{dataset}");
    let dataset_id = dataset["id"].as_str().unwrap();
    let models = cluster.dir.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let body = "big = torch.ones([(numeric).size(0), 4194304])\n\
                numeric = torch.add(numeric, torch.mul(torch.sum(big, [1], True), 0.))";
    let file = std::fs::read(hostile::model(&models, "wide", body)).unwrap();
    let (status, model) = api.upload(&format!("/v1/models?name=wide&dataset={dataset_id}&inputs=numeric"), file).await;
    assert_eq!(status, 201, "{model}");
    let memory = &model["report"]["memory"];
    let per_sample = memory["step_per_sample_bytes"].as_u64().unwrap();
    assert!((15 << 20..20 << 20).contains(&per_sample), "16 MiB a sample: {memory}");
    assert_eq!(memory["measured"].as_array().unwrap().len(), 2, "{memory}");
    assert!(memory["trainable_bytes"].as_u64().unwrap() > 0 && memory["weights_bytes"].as_u64().unwrap() > 0);

    let spec = |batch: u32| {
        serde_json::json!({"model": {"uploaded": model["id"]}, "dataset": dataset_id, "workers": 1,
            "per_worker_batch": batch, "epochs": 2, "lr": {"warmup": {"kind": "gradual", "epochs": 1}}})
    };
    // 4,000 samples of 16 MiB: about 62 GiB, past any CPU slot's share of this machine
    let refused = api.request(reqwest::Method::POST, "/v1/jobs", Some(spec(4000))).await;
    assert_refused(&refused, "per_worker_batch", "from its steps the model's check measured");
    let (status, planned) = api.request(reqwest::Method::POST, "/v1/jobs?dry_run=true", Some(spec(8))).await;
    assert_eq!(status, 200, "{planned}");
}

/// Every iteration's (iteration, loss, lr) as rank 0 reported it.
fn iteration_losses(points: &[Value]) -> Vec<(i64, f64, f64)> {
    let mut losses: Vec<_> = points
        .iter()
        .filter(|p| p["rank"] == 0)
        .map(|p| {
            let field = |name: &str| p["fields"][name].as_f64().unwrap();
            (p["iteration"].as_i64().unwrap(), field("loss"), field("lr"))
        })
        .collect();
    losses.sort_by_key(|l| l.0);
    losses
}

/// The seed's model through the API: a composite model (the worked example's three encoders and head, four
/// TorchScript modules in one archive) uploaded and checked module by module; a placement of its modules
/// checked against them, stage by stage; the dry run showing each stage's modules and memory; and a job of
/// 2 workers × 2 stages (two encoders on one device, the set encoder and the head on the other), 2
/// micro-batches each, whose every iteration's loss agrees with the same job unsplit (one device per
/// worker) within 1e-5 relative.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composite_model_placed_on_two_devices_per_worker_trains_the_unsplit_job() {
    let cluster = Cluster::up("composite", 4).await;
    let api = &cluster.api;
    let (status, dataset) =
        api.upload("/v1/datasets?name=multi-input", repo("examples/multi-input/data.safetensors")).await;
    assert_eq!(status, 201, "{dataset}");
    let dataset_id = dataset["id"].as_str().unwrap().to_string();
    let composite = repo("examples/multi-input/composite.tar");
    let upload = format!("/v1/models?name=composite&dataset={dataset_id}");
    assert_refused(
        &api.upload(&format!("{upload}&inputs={INPUTS}"), composite.clone()).await,
        "inputs",
        "composite.json",
    );
    let (status, stored) = api.upload(&upload, composite).await;
    assert_eq!(status, 201, "{stored}");
    let model_id = stored["id"].as_str().unwrap().to_string();
    assert_eq!(stored["inputs"], serde_json::json!(INPUTS.split(',').collect::<Vec<_>>()), "from its manifest");
    let modules = stored["report"]["modules"].as_array().unwrap();
    let names: Vec<&str> = modules.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["encode_numeric", "encode_sequence", "encode_set", "head"], "{stored}");
    assert!(modules
        .iter()
        .all(|m| m["parameters"].as_u64().unwrap() > 0 && m["memory"]["weights_bytes"].as_u64().unwrap() > 0));
    let (_, single) = api.upload(&format!("{upload}&inputs={INPUTS}"), repo("examples/multi-input/model.pt")).await;

    let unsplit = serde_json::json!({
        "name": "composite",
        "model": {"uploaded": model_id},
        "dataset": dataset_id,
        "workers": 4,
        "devices": 2,
        "per_worker_batch": 16,
        "train_samples": 512,
        "epochs": 1,
        "lr": {"base": 0.05, "reference_batch": 32, "warmup": {"kind": "gradual", "epochs": 0.5}, "decay": {"kind": "none"}},
        "optimizer": {"momentum": 0.9, "weight_decay": 0.0001},
        "seed": 3,
        "log_every_iterations": 1
    });
    let mut split = unsplit.clone();
    split["devices_per_worker"] = 2.into();
    split["placement"] = serde_json::json!({"stages": [["encode_numeric", "encode_sequence"], ["encode_set", "head"]]});
    // what is wrong with a placement is named at its stage, and nothing is stored
    let single_file = serde_json::json!({"model": {"uploaded": single["id"]}});
    for (change, field, words) in [
        (
            serde_json::json!({"placement": {"stages": [["head"], ["encode_numeric", "encode_sequence", "encode_set"]]}}),
            "placement.stages[0]",
            "computes after it",
        ),
        (
            serde_json::json!({"placement": {"stages": [["encode_numeric"], ["encode_sequence", "encode_set", "heads"]]}}),
            "placement.stages[1]",
            "no module heads",
        ),
        (
            serde_json::json!({"placement": {"stages": [["encode_numeric"], ["encode_sequence", "head"]]}}),
            "placement.stages",
            "encode_set is in no stage",
        ),
        (
            serde_json::json!({"placement": {"stages": [["encode_numeric", "encode_sequence", "encode_set", "head"]]}}),
            "placement.stages",
            "1 stage for 2 devices per worker",
        ),
        (serde_json::json!({"placement": {"cuts": ["layer2"]}}), "placement.cuts", "an uploaded model is not cut"),
        (single_file, "placement.stages", "one TorchScript file"),
    ] {
        let mut bad = split.clone();
        for (key, value) in change.as_object().unwrap() {
            bad[key] = value.clone();
        }
        assert_refused(&api.request(reqwest::Method::POST, "/v1/jobs", Some(bad)).await, field, words);
    }
    assert_eq!(api.get("/v1/jobs").await["jobs"], serde_json::json!([]), "a refused spec stores nothing");

    // the dry run: each stage's modules and its memory, from what the check measured of each module
    let (status, dry) = api.request(reqwest::Method::POST, "/v1/jobs?dry_run=true", Some(split.clone())).await;
    assert_eq!(status, 200, "{dry}");
    let stages = dry["stages"].as_array().unwrap();
    assert_eq!(stages[0]["blocks"], serde_json::json!(["encode_numeric", "encode_sequence"]), "{dry}");
    assert_eq!(stages[1]["blocks"], serde_json::json!(["encode_set", "head"]), "{dry}");
    assert_eq!((stages[0]["in_flight"].as_u64(), stages[1]["in_flight"].as_u64()), (Some(2), Some(1)), "{dry}");
    assert!(stages.iter().all(|s| s["memory"]["total"].as_u64().unwrap() > 0), "{dry}");
    // a stage of modules not next to each other in the manifest names each
    let mut apart = split.clone();
    apart["placement"] = serde_json::json!({"stages": [["encode_numeric", "encode_set"], ["encode_sequence", "head"]]});
    let (status, dry) = api.request(reqwest::Method::POST, "/v1/jobs?dry_run=true", Some(apart)).await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["stages"][0]["blocks"][0], "encode_numeric, encode_set", "{dry}");

    let unsplit_id = api.submit(&unsplit).await;
    api.wait_state(&unsplit_id, "succeeded", LONG).await;
    let split_id = api.submit(&split).await;
    let job = api.wait_state(&split_id, "succeeded", LONG).await;
    let events = api.get(&format!("/v1/jobs/{split_id}/events")).await;
    assert!(events.to_string().contains("4 device(s)"), "2 workers × 2 stages: {events}");
    let split_losses = iteration_losses(&api.metrics(&split_id, "iteration").await);
    let unsplit_losses = iteration_losses(&api.metrics(&unsplit_id, "iteration").await);
    assert_eq!(
        split_losses.len() as u64,
        job["effective"]["total_iterations"].as_u64().unwrap(),
        "every iteration once"
    );
    assert_eq!(split_losses.len(), unsplit_losses.len());
    for (s, u) in split_losses.iter().zip(&unsplit_losses) {
        assert_eq!((s.0, s.2), (u.0, u.2), "the same iteration and lr");
        assert!((s.1 - u.1).abs() <= 1e-5 * u.1.abs(), "iteration {}: loss {} split, {} unsplit", s.0, s.1, u.1);
    }

    // the trained composite model comes back as its weights, named by module; there is no TorchScript file
    let checkpoints = api.get(&format!("/v1/jobs/{split_id}/checkpoints")).await;
    let last = checkpoints["checkpoints"].as_array().unwrap().iter().find(|c| c["is_final"] == true).unwrap().clone();
    let weights = format!("/v1/jobs/{split_id}/checkpoints/{}/weights", last["id"].as_str().unwrap());
    let (status, problem) = api.request(reqwest::Method::GET, &format!("{weights}/model.pt"), None).await;
    assert!(status == 404 && problem.to_string().contains("model.safetensors"), "{status} {problem}");
    let (status, bytes) = api.download(&format!("{weights}/model.safetensors")).await;
    assert_eq!(status, 200);
    let path = cluster.dir.join("composite.safetensors");
    std::fs::write(&path, bytes).unwrap();
    let names: Vec<String> = Tensor::read_safetensors(&path).unwrap().into_iter().map(|(n, _)| n).collect();
    assert!(names.iter().any(|n| n == "encode_set.phi.0.weight"), "{names:?}");
}
