//! The API document generates a complete client: openapi-python-client (PyPI, pinned by
//! `scripts/python-client/venv.sh`) generates a Python package from a running server's `/openapi.json`
//! without leaving out any route or schema, and that package submits, lists, reads and tags a job and
//! creates and reads a study against the server (`tests/python/use_generated_client.py`).

mod support;

use std::path::Path;
use std::process::Command;

use support::{Cluster, ADMIN_TOKEN};

/// What the generator may say without failing the test: the two routes whose answers are not JSON (the
/// Prometheus text and the study's SVG plot) are generated with their bodies left as bytes.
const NOT_JSON: [&str; 2] = ["application/openmetrics-text", "image/svg+xml"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_python_client_submits_jobs_and_studies() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = Command::new(root.join("scripts/python-client/venv.sh")).output().expect("venv.sh runs");
    assert!(venv.status.success(), "{}", String::from_utf8_lossy(&venv.stderr));
    let venv = std::path::PathBuf::from(String::from_utf8(venv.stdout).unwrap().trim());

    let cluster = Cluster::up("python-client", 2).await;
    let document = reqwest::get(format!("{}/openapi.json", cluster.url)).await.unwrap().text().await.unwrap();
    let work = cluster.dir.join("python-client");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("openapi.json"), document).unwrap();

    // the package is its folder's name: `import ringtrain_client`
    let generated = Command::new(venv.join("bin/openapi-python-client"))
        .args(["generate", "--path", "openapi.json", "--output-path", "ringtrain_client", "--meta", "none"])
        .current_dir(&work)
        .output()
        .expect("openapi-python-client runs");
    let said = format!("{}{}", String::from_utf8_lossy(&generated.stdout), String::from_utf8_lossy(&generated.stderr));
    assert!(generated.status.success(), "{said}");
    for line in
        said.lines().filter(|l| l.starts_with("WARNING") || l.starts_with("Unable") || l.contains("not be generated"))
    {
        let paragraph: String = said[said.find(line).unwrap()..].lines().take(4).collect::<Vec<_>>().join("\n");
        assert!(
            line.starts_with("WARNING parsing GET") && NOT_JSON.iter().any(|kind| paragraph.contains(kind)),
            "the generator left something out:\n{said}"
        );
    }
    assert!(!said.contains("Unable to process schema"), "{said}");

    let used = Command::new(venv.join("bin/python"))
        .arg(root.join("tests/python/use_generated_client.py"))
        .args([&cluster.url, ADMIN_TOKEN])
        .env("PYTHONPATH", &work)
        .output()
        .expect("python runs");
    let out = format!("{}{}", String::from_utf8_lossy(&used.stdout), String::from_utf8_lossy(&used.stderr));
    assert!(used.status.success(), "{out}");
    assert!(out.contains("succeeded, study") && out.contains("reuses the job"), "{out}");
}
