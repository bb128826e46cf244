//! The web page in a real headless Chromium against `ringtrain up`: sign in, check and submit a spec from
//! the editor, watch the job reach `succeeded` with its loss chart drawn and its ranks' lines shown, see a
//! field error at its path, cancel a running job, and see that another team's token shows none of it.
//! Screenshots of each page are saved in the test's folder.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::webdriver::Browser;
use support::{fashion_mnist, Cluster, ADMIN_TOKEN};

const LONG: Duration = Duration::from_secs(180);

/// Puts `spec` in the editor.
async fn edit(browser: &Browser, spec: &Value) {
    browser
        .run(
            "document.getElementById('spec').value = arguments[0];",
            json!([serde_json::to_string_pretty(spec).unwrap()]),
        )
        .await;
}

async fn sign_in(browser: &Browser, url: &str, token: &str) {
    browser.open(&format!("{url}/")).await;
    browser.run("sessionStorage.clear();", json!([])).await;
    browser.open(&format!("{url}/")).await;
    browser.type_into("#token", token).await;
    browser.click("#signin-form button[type=submit]").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_signs_in_submits_shows_a_job_live_and_keeps_teams_apart() {
    let cluster = Cluster::up("web", 2).await;
    let url = cluster.url.clone();
    let shots = cluster.dir.join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let browser = Browser::start().await;

    // the page itself: served from the binary, with a policy that allows only this server
    let page = reqwest::get(format!("{url}/")).await.unwrap();
    let policy = page.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(policy.contains("default-src 'self'"), "{policy}");

    // a wrong token is refused on the page
    sign_in(&browser, &url, "rt_not_a_token_0123456789abcdef0123").await;
    browser.wait_text("#signin-error", "Not signed in", Duration::from_secs(10)).await;
    sign_in(&browser, &url, ADMIN_TOKEN).await;
    browser.wait_text("#whoami", "admin of team default", Duration::from_secs(10)).await;
    browser.screenshot(&shots.join("jobs-empty.png")).await;

    // the editor: a field error at its path, then a check and a submission
    browser.click("#nav button[data-page=submit]").await;
    let mut spec = fashion_mnist("web-short", 2, 2000, 2);
    spec["workers"] = json!(0);
    edit(&browser, &spec).await;
    browser.click("#check").await;
    let error = browser.text("#spec-errors li[data-path=workers]").await;
    assert!(error.starts_with("workers: "), "{error}");
    spec["workers"] = json!(2);
    edit(&browser, &spec).await;
    browser.click("#check").await;
    browser.wait_text("#verdict", "start: starts now on 2 cpu devices", Duration::from_secs(10)).await;
    browser.screenshot(&shots.join("submit.png")).await;
    browser.click("#send").await;

    // the job's view updates itself until the job has succeeded, with its chart and its ranks' lines
    browser.wait_text("#job-state", "succeeded", LONG).await;
    browser.wait_text("#job-logs", "rank 1 of 2:", Duration::from_secs(10)).await;
    let drawn = browser
        .run(
            "const c = document.getElementById('loss-chart'); \
             const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; \
             let blue = 0; for (let i = 0; i < d.length; i += 4) { if (d[i+2] > 150 && d[i] < 100) blue++; } \
             return blue;",
            json!([]),
        )
        .await;
    assert!(drawn.as_u64().unwrap() > 200, "the loss line is drawn: {drawn} blue pixels");
    let events = browser.text("#job-events").await;
    assert!(events.contains("scheduled: placement 1 (attempt 1)") && events.contains("succeeded"), "{events}");
    browser.screenshot(&shots.join("job.png")).await;

    // a long job, cancelled from its view
    browser.click("#nav button[data-page=submit]").await;
    edit(&browser, &fashion_mnist("web-long", 1, 60000, 20)).await;
    browser.click("#send").await;
    browser.wait_text("#job-state", "running", LONG).await;
    browser.click("#cancel").await;
    browser.wait_text("#job-state", "cancelled", Duration::from_secs(30)).await;

    // the run history lists both; comparing needs two, and shows both recipes and curves
    browser.click("#nav button[data-page=jobs]").await;
    let rows = browser.wait_text("#job-rows", "web-long", Duration::from_secs(10)).await;
    assert!(rows.contains("web-short") && rows.contains("succeeded") && rows.contains("cancelled"), "{rows}");
    browser.screenshot(&shots.join("jobs.png")).await;
    browser.click("#compare-selected").await;
    browser.wait_text("#jobs-error", "Select 2 to 8 jobs", Duration::from_secs(5)).await;
    for checkbox in browser
        .run("return [...document.querySelectorAll('#job-rows input')].map(i => i.dataset.job);", json!([]))
        .await
        .as_array()
        .unwrap()
    {
        browser.click(&format!("#job-rows input[data-job='{}']", checkbox.as_str().unwrap())).await;
    }
    browser.click("#compare-selected").await;
    let table = browser.wait_text("#compare-rows", "web-long", Duration::from_secs(10)).await;
    assert!(table.contains("web-short") && table.contains("64"), "both recipes side by side: {table}");
    let coloured = browser
        .run(
            "const c = document.getElementById('compare-loss-chart'); \
             const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; \
             const seen = new Set(); for (let i = 0; i < d.length; i += 4) { if (d[i+3] > 200 && (d[i] > 150 || d[i+2] > 150) && Math.abs(d[i] - d[i+2]) > 80) seen.add(d[i] > d[i+2] ? 'red' : 'blue'); } \
             return [...seen].sort();",
            json!([]),
        )
        .await;
    assert_eq!(coloured, json!(["blue", "red"]), "two loss curves in two colours");
    browser.screenshot(&shots.join("compare.png")).await;

    // the cluster: the node and its devices, and (the long job cancelled) an empty queue
    browser.click("#nav button[data-page=cluster]").await;
    let nodes = browser.wait_text("#node-rows", "cpu 1", Duration::from_secs(10)).await;
    assert!(nodes.contains("up") && nodes.contains("s ago") && nodes.contains("cpu 0"), "{nodes}");
    browser.wait_text("#queue-empty", "Nothing is waiting", Duration::from_secs(10)).await;
    browser.screenshot(&shots.join("cluster.png")).await;

    // another team's viewer sees none of it
    let team = cluster.api.post("/v1/teams", json!({"name": "other", "gpu_quota": 0, "cpu_quota": 1})).await;
    let team = team["id"].as_str().unwrap();
    let token = cluster.api.post(&format!("/v1/teams/{team}/tokens"), json!({"role": "viewer"})).await;
    browser.click("#signout").await;
    sign_in(&browser, &url, token["token"].as_str().unwrap()).await;
    browser.wait_text("#whoami", "viewer of team other", Duration::from_secs(10)).await;
    browser.wait_text("#no-jobs", "No jobs", Duration::from_secs(10)).await;
    eprintln!("screenshots in {}", shots.display());
}
