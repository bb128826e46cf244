//! The web page in a real headless Chromium against `ringtrain up`: sign in; check a spec (a field error at
//! its path, the schedule previewed for four worker counts) and submit it; watch the job reach `succeeded`
//! with its charts drawn, its checkpoint downloaded and its ranks' lines searched; submit it again; see a
//! running job's progress and the devices it holds, then cancel it (a second cancel's refusal shown); filter
//! and page the run history, sort it, add a column and a tag; compare two jobs; create a team and its tokens
//! from the Team view, revoke one; and see that the other team's token shows none of the first team's jobs.
//! Screenshots of each page are saved in the test's folder (or in `RINGTRAIN_SCREENSHOTS`). Each part is a
//! named step (`support::steps`): the output says which step a failure happened in and how long each took.

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::steps::Steps;
use support::webdriver::Browser;
use support::{fashion_mnist, Cluster, ADMIN_TOKEN};

const LONG: Duration = Duration::from_secs(180);
const SHORT: Duration = Duration::from_secs(10);

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

/// Runs `script` until it returns something other than null or false, for up to `within`.
async fn wait_for(browser: &Browser, script: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let value = browser.run(script, json!([])).await;
        if !value.is_null() && value != json!(false) {
            return value;
        }
        assert!(Instant::now() < deadline, "never true: {script}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How many lines a chart drew, once it has drawn `series`, and the words written on it.
async fn chart(browser: &Browser, id: &str, series: u32) -> String {
    let script = format!(
        "const c = document.getElementById('{id}'); \
         return c.dataset.series === '{series}' ? c.dataset.labels : null;"
    );
    let labels = wait_for(browser, &script, SHORT).await;
    labels.as_str().unwrap().to_string()
}

/// The points a chart drew: the corners of its lines and its dots.
async fn drawn_points(browser: &Browser, id: &str) -> u64 {
    let script = format!(
        "const c = document.getElementById('{id}'); \
         const lines = [...c.querySelectorAll('g.series path')].map(p => p.getAttribute('d').split('L').length); \
         return lines.reduce((a, b) => a + b, 0) + c.querySelectorAll('g.series circle').length;"
    );
    browser.run(&script, json!([])).await.as_u64().unwrap()
}

/// The colours of a chart's series.
async fn series_colours(browser: &Browser, id: &str) -> Value {
    let script = format!("return [...document.querySelectorAll('#{id} g.series')].map(g => g.getAttribute('stroke'));");
    browser.run(&script, json!([])).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_signs_in_submits_shows_a_job_live_and_keeps_teams_apart() {
    let mut steps = Steps::new("web");
    let cluster = Cluster::up("web", 2).await;
    let url = cluster.url.clone();
    // RINGTRAIN_SCREENSHOTS=docs/screenshots refreshes the README's and the user guide's pictures
    let shots = std::env::var_os("RINGTRAIN_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| cluster.dir.join("screenshots"));
    std::fs::create_dir_all(&shots).unwrap();
    let browser = Browser::start().await;

    steps.enter("the page itself: served from the binary, with a policy that allows only this server");
    let page = reqwest::get(format!("{url}/")).await.unwrap();
    let policy = page.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(policy.contains("default-src 'self'"), "{policy}");

    steps.enter("signing in: a wrong token is refused, the admin token accepted");
    sign_in(&browser, &url, "rt_not_a_token_0123456789abcdef0123").await;
    browser.wait_text("#signin-error", "Not signed in", SHORT).await;
    sign_in(&browser, &url, ADMIN_TOKEN).await;
    browser.wait_text("#whoami", "admin of team default", SHORT).await;
    browser.wait_text("#team-usage", "holds 0 GPU of its", SHORT).await;
    browser.screenshot(&shots.join("jobs-empty.png")).await;

    steps.enter(
        "the editor: a field error at its path, then a check with the schedule for k = 1, 2, 8, 32, and a submission",
    );
    browser.click("#nav button[data-page=submit]").await;
    let mut spec = fashion_mnist("web-short", 2, 2000, 2);
    spec["workers"] = json!(0);
    edit(&browser, &spec).await;
    browser.click("#check").await;
    let error = browser.text("#spec-errors li[data-path=workers]").await;
    assert!(error.starts_with("workers: "), "{error}");
    // every problem at once, a misspelt field with what was meant; no schedule of an earlier spec beside them
    spec["optimiser"] = json!({});
    edit(&browser, &spec).await;
    browser.click("#check").await;
    let meant = browser.wait_text("#spec-errors li[data-path=optimiser]", "did you mean `optimizer`", SHORT).await;
    assert!(meant.starts_with("optimiser: "), "{meant}");
    assert!(browser.text("#spec-errors li[data-path=workers]").await.starts_with("workers: "));
    browser.wait_text("#preview-charts", "No preview while the spec has problems", SHORT).await;
    let styled = browser.run("return document.getElementById('verdict').classList.contains('error');", json!([])).await;
    assert_eq!(styled, json!(true));
    spec.as_object_mut().unwrap().remove("optimiser");
    spec["workers"] = json!(2);
    edit(&browser, &spec).await;
    browser.click("#check").await;
    browser.wait_text("#verdict", "start: starts now on 2 cpu devices", SHORT).await;
    let previews = browser.wait_text("#preview-charts", "k = 32", SHORT).await;
    // kn = 32·32 = 1024 with the reference batch 64: the lr scales 16 times, to 1.6
    assert!(previews.contains("k = 1: batch 32") && previews.contains("k = 32: batch 1024, lr 1.6"), "{previews}");
    let drawn = browser
        .run("return [...document.querySelectorAll('#preview-charts .chart')].map(c => c.dataset.series);", json!([]))
        .await;
    assert_eq!(drawn, json!(["1", "1", "1", "1"]), "one lr curve per worker count");
    // a model split into pipeline stages: each stage's blocks and memory under the verdict
    let mut split = spec.clone();
    split["model"] = json!({"name": "resnet20"});
    split["dataset"] = json!("synthetic:320");
    split["workers"] = json!(4);
    split["devices"] = json!(2);
    split.as_object_mut().unwrap().remove("train_samples");
    split.as_object_mut().unwrap().remove("test_samples");
    split["devices_per_worker"] = json!(2);
    split["placement"] = json!({"cuts": ["layer2"]});
    edit(&browser, &split).await;
    browser.click("#check").await;
    let stages = browser.wait_text("#spec-stages", "stage 1: layer3.0 to layer3.2", SHORT).await;
    assert!(stages.contains("stage 0: layer1.0 to layer2.2, 2 micro-batches at once, about "), "{stages}");
    edit(&browser, &spec).await;
    browser.click("#check").await;
    browser.wait_text("#verdict", "start: starts now on 2 cpu devices", SHORT).await;
    assert_eq!(browser.text("#spec-stages").await, "", "an unsplit model has no stages");
    browser.screenshot(&shots.join("submit.png")).await;
    browser.click("#send").await;

    steps.enter("the job's view updates itself until the job has succeeded, with its charts and its ranks' lines");
    browser.wait_text("#job-state", "succeeded", LONG).await;
    browser.wait_text("#job-logs", "rank 1 of 2:", SHORT).await;
    chart(&browser, "loss-chart", 1).await;
    assert!(drawn_points(&browser, "loss-chart").await >= 2, "the loss line is drawn");
    // ticks at round values, percentages where the axis says %, the epochs counted from 1
    let errors = chart(&browser, "error-chart", 2).await;
    assert!(errors.contains("epoch") && errors.contains("train") && errors.contains("test"), "{errors}");
    assert!(errors.contains("error (%)") && errors.split('|').any(|l| l.ends_with('%')), "{errors}");
    assert!(errors.split('|').any(|l| l == "1") && errors.split('|').any(|l| l == "2"), "{errors}");
    let lr = chart(&browser, "lr-chart", 2).await;
    assert!(lr.contains("learning rate") && lr.contains("used") && lr.contains("planned"), "{lr}");
    // the lr on a log scale, on request
    browser.click("#lr-chart .log-toggle input").await;
    let logged = wait_for(&browser, "const c = document.getElementById('lr-chart'); return c.dataset.labels.includes('(log scale)') ? c.dataset.labels : null;", SHORT).await;
    assert!(logged.as_str().unwrap().contains("learning rate (log scale)"), "{logged}");
    assert!(chart(&browser, "speed-chart", 1).await.contains("samples/s"));
    assert!(chart(&browser, "allreduce-chart", 1).await.contains("all-reduce share (%)"));
    // each rank's CPU and memory over time, as its agent sampled them
    let cpu = chart(&browser, "cpu-chart", 2).await;
    assert!(cpu.contains("CPU cores busy") && cpu.contains("rank 0") && cpu.contains("rank 1"), "{cpu}");
    let memory = chart(&browser, "memory-chart", 2).await;
    assert!(memory.contains("resident memory") && memory.contains("MiB"), "{memory}");
    // the value under the pointer
    browser
        .run(
            "const area = document.querySelector('#loss-chart .hover-area'); const r = area.getBoundingClientRect(); \
             area.dispatchEvent(new PointerEvent('pointermove', {clientX: r.left + r.width / 2, clientY: r.top + 5, bubbles: true}));",
            json!([]),
        )
        .await;
    let hovered = browser.wait_text("#loss-chart .tooltip", "training loss", SHORT).await;
    assert!(hovered.lines().count() >= 2 || hovered.contains(':'), "an x and the loss there: {hovered}");
    // what the run is: asked beside effective, and what it used
    let config = browser.text("#config-rows").await;
    assert!(config.contains("Learning rate") && config.contains("2 × 32 = global batch 64"), "{config}");
    let used = browser.wait_text("#job-facts", "Device time", SHORT).await;
    assert!(used.contains("device-seconds") && used.contains("Peak memory of a rank"), "{used}");
    let timeline = browser.wait_text("#job-facts", "Where the time went", SHORT).await;
    assert!(timeline.contains("training steps") && timeline.contains("start-up"), "the timeline: {timeline}");
    let events = browser.text("#job-events").await;
    assert!(events.contains("scheduled: placement 1 (attempt 1)") && events.contains("succeeded"), "{events}");
    browser.screenshot(&shots.join("job.png")).await;

    steps.enter("the final weights download through the page (fetched with the token, saved from memory)");
    browser.wait_text("#checkpoint-rows", "final weights", SHORT).await;
    browser
        .run(
            "window.downloaded = []; const make = URL.createObjectURL; \
             URL.createObjectURL = (blob) => { window.downloaded.push(blob.size); return make(blob); };",
            json!([]),
        )
        .await;
    let size = browser
        .run(
            "const rows = [...document.querySelectorAll('#checkpoint-rows tr')]; \
             const last = rows.find(r => r.textContent.includes('final weights')); \
             last.querySelector('button').click(); return last.children[3].textContent;",
            json!([]),
        )
        .await;
    let downloaded = wait_for(&browser, "return window.downloaded.length ? window.downloaded[0] : null;", SHORT).await;
    assert!(downloaded.as_u64().unwrap() > 10_000, "an archive of {size} came down: {downloaded} bytes");
    // and the weights alone, as a safetensors state dict (the MLP 784-64-10: 50,890 f32 parameters)
    browser
        .run(
            "const rows = [...document.querySelectorAll('#checkpoint-rows tr')]; \
             const last = rows.find(r => r.textContent.includes('final weights')); \
             last.querySelector('button[data-weights=\"model.safetensors\"]').click();",
            json!([]),
        )
        .await;
    let weights = wait_for(&browser, "return window.downloaded.length > 1 ? window.downloaded[1] : null;", SHORT).await;
    assert!(weights.as_u64().unwrap() > 50_890 * 4, "the final weights came down: {weights} bytes");

    steps.enter("the logs: searched, and one rank's only");
    // (each keystroke reads the logs again: "rank 1" alone also shows the agent's "rank 1 runs in ..." line,
    // so wait for the page to have drawn the whole search, not merely for a line that matches it)
    browser.type_into("#log-search", "rank 1 of 2").await;
    let searched = wait_for(
        &browser,
        "const t = document.getElementById('job-logs').textContent; \
         return t && t.split('\\n').every(l => l.includes('rank 1 of 2')) ? t : null;",
        SHORT,
    )
    .await;
    assert!(searched.as_str().unwrap().contains("[rank 1] rank 1 of 2"), "{searched}");
    browser.run("document.getElementById('log-search').value = '';", json!([])).await;
    browser.type_into("#log-rank", "0").await;
    let rank0 = wait_for(
        &browser,
        "const t = document.getElementById('job-logs').textContent; \
         return t && !t.includes('[rank 1]') ? t : null;",
        SHORT,
    )
    .await;
    assert!(rank0.as_str().unwrap().contains("[rank 0]"), "{rank0}");

    steps.enter("\"Fork\" on a checkpoint opens the editor with a new job that starts from its weights");
    browser
        .run(
            "const rows = [...document.querySelectorAll('#checkpoint-rows tr')]; \
             rows.find(r => r.textContent.includes('final weights')).querySelector('button[data-fork]').click();",
            json!([]),
        )
        .await;
    let fork = wait_for(
        &browser,
        "const v = document.getElementById('spec').value; return v.includes('init_from') ? v : null;",
        SHORT,
    )
    .await;
    let fork: Value = serde_json::from_str(fork.as_str().unwrap()).unwrap();
    assert_eq!(fork["name"], "web-short-fork");
    assert!(fork["init_from"]["checkpoint"].as_str().is_some_and(|id| id.len() == 36), "{fork}");
    browser.run("history.back();", json!([])).await;
    browser.wait_text("#job-title", "Job web-short", SHORT).await;

    steps.enter("\"submit again\" opens the spec in the editor");
    browser.click("#submit-again").await;
    let again = browser.run("return document.getElementById('spec').value;", json!([])).await;
    let again: Value = serde_json::from_str(again.as_str().unwrap()).unwrap();
    assert_eq!(again["name"], "web-short-again");
    assert_eq!((&again["workers"], &again["lr"]["reference_batch"]), (&json!(2), &json!(64)), "{again}");

    steps.enter("a long job: its progress and its devices while it runs, then cancelled from its view");
    edit(&browser, &fashion_mnist("web-long", 1, 60000, 20)).await;
    browser.click("#send").await;
    browser.wait_text("#job-state", "running", LONG).await;
    browser.wait_text("#job-facts", "samples/s", LONG).await;
    browser.click("#nav button[data-page=cluster]").await;
    let nodes = browser.wait_text("#node-rows", "default web-long rank 0", SHORT).await;
    assert!(nodes.contains("up") && nodes.contains("s ago") && nodes.contains("free"), "{nodes}");
    browser.screenshot(&shots.join("cluster.png")).await;
    browser.click("#nav button[data-page=jobs]").await;
    browser.wait_text("#job-rows", "iteration ", SHORT).await;
    browser.wait_text("#team-usage", "guaranteed and 1 CPU of its", SHORT).await;
    browser.screenshot(&shots.join("jobs-running.png")).await;
    let long = browser
        .run(
            "return [...document.querySelectorAll('#job-rows a')].find(b => b.textContent === 'web-long').dataset.job;",
            json!([]),
        )
        .await;
    browser.click(&format!("#job-rows a[data-job='{}']", long.as_str().unwrap())).await;
    browser.wait_text("#job-state", "running", SHORT).await;
    // Cancel asks first; the test says yes
    browser.run("window.confirm = () => true;", json!([])).await;
    browser.click("#cancel").await;
    browser.wait_text("#job-state", "cancelled", Duration::from_secs(30)).await;
    // a refusal reaches the user: a second cancel (as when the job ended just before the click) shows the 409's
    // detail where the view shows its errors
    browser.run("document.getElementById('cancel').click();", json!([])).await;
    browser.wait_text("#job-error", "already cancelled", SHORT).await;
    steps.enter("a cancelled job resumes (from its newest checkpoint when it has one), and is cancelled again");
    browser.click("#resume").await;
    browser.wait_text("#job-events", "queued: resumed by token", SHORT).await;
    wait_for(&browser, "return !document.getElementById('cancel').hidden;", SHORT).await;
    browser.click("#cancel").await;
    browser.wait_text("#job-state", "cancelled", Duration::from_secs(30)).await;

    steps.enter("the run history: filtered by name, and paged");
    browser.click("#nav button[data-page=jobs]").await;
    // the rows shown before the page's fetch answers may be the last ones it had (web-long still running):
    // wait for the cancel to reach the list
    let rows = browser.wait_text("#job-rows", "cancelled", SHORT).await;
    assert!(rows.contains("web-long") && rows.contains("web-short") && rows.contains("succeeded"), "{rows}");
    browser.screenshot(&shots.join("jobs.png")).await;
    browser.type_into("#name-filter", "web-l").await;
    browser.click("#job-filters button[type=submit]").await;
    wait_for(&browser, "return !document.getElementById('job-rows').textContent.includes('web-short');", SHORT).await;
    browser.run("document.getElementById('name-filter').value = '';", json!([])).await;
    browser
        .run(
            "const size = document.getElementById('page-size'); size.add(new Option('1', '1')); size.value = '1'; \
             size.dispatchEvent(new Event('change'));",
            json!([]),
        )
        .await;
    let first = wait_for(
        &browser,
        "const r = document.querySelectorAll('#job-rows tr'); return r.length === 1 ? r[0].textContent : null;",
        SHORT,
    )
    .await;
    assert!(first.as_str().unwrap().contains("web-long"), "newest first: {first}");
    browser.click("#older-page").await;
    browser.wait_text("#page-number", "page 2", SHORT).await;
    browser.wait_text("#job-rows", "web-short", SHORT).await;
    browser.click("#newer-page").await;
    browser.wait_text("#job-rows", "web-long", SHORT).await;
    browser
        .run(
            "const size = document.getElementById('page-size'); size.value = '25'; size.dispatchEvent(new Event('change'));",
            json!([]),
        )
        .await;
    browser.wait_text("#job-rows", "web-short", SHORT).await;

    steps.enter("the run table: sorted by a heading (ascending, then descending), a spec field added as a column");
    let names = "const n = [...document.querySelectorAll('#job-rows td[data-column=name]')].map(t => t.textContent); \
                 return n.length === 2 ? n : null;";
    browser.click("#job-head button[data-sort=name]").await;
    wait_for(
        &browser,
        "return document.querySelector('#job-head th[data-column=name]').getAttribute('aria-sort') === 'ascending';",
        SHORT,
    )
    .await;
    assert_eq!(wait_for(&browser, names, SHORT).await, json!(["web-long", "web-short"]));
    browser.click("#job-head button[data-sort=name]").await;
    wait_for(
        &browser,
        "return document.querySelector('#job-head th[data-column=name]').getAttribute('aria-sort') === 'descending';",
        SHORT,
    )
    .await;
    assert_eq!(wait_for(&browser, names, SHORT).await, json!(["web-short", "web-long"]));
    browser.type_into("#new-column", "train_samples").await;
    browser.click("#column-form button[type=submit]").await;
    browser.wait_text("#job-head", "train_samples", SHORT).await;
    let samples = browser.text("#job-rows").await;
    assert!(samples.contains("60000") && samples.contains("2000"), "{samples}");
    steps.enter("a tag, set on the job's page, and the history filtered by it");
    browser.click("#job-rows a[data-job]:not([data-job=''])").await;
    let tagged = browser.run("return document.getElementById('job-title').textContent;", json!([])).await;
    // longer than SHORT: this page opens while web-long trains, and under a loaded CI run (the other tests'
    // ranks on the same 2 cores) it once took over 10 s
    browser.wait_text("#job-title", "Job web-", Duration::from_secs(60)).await;
    browser.type_into("#new-tag", "baseline").await;
    browser.click("#tag-form button[type=submit]").await;
    browser.wait_text("#job-tags", "baseline", SHORT).await;
    browser.type_into("#job-note", "the first try").await;
    browser.click("#save-note").await;
    browser.wait_text("#note-state", "Saved", SHORT).await;
    browser.click("#nav button[data-page=jobs]").await;
    browser.type_into("#tag-filter", "baseline").await;
    browser.click("#job-filters button[type=submit]").await;
    let filtered = wait_for(
        &browser,
        "const r = document.querySelectorAll('#job-rows tr'); return r.length === 1 ? r[0].textContent : null;",
        SHORT,
    )
    .await;
    assert!(filtered.as_str().unwrap().contains("baseline"), "only the tagged job ({tagged}): {filtered}");
    browser.run("document.getElementById('tag-filter').value = ''; document.getElementById('text-filter').value = 'FIRST TRY';", json!([])).await;
    browser.click("#job-filters button[type=submit]").await;
    let searched = wait_for(
        &browser,
        "const r = document.querySelectorAll('#job-rows tr'); return r.length === 1 ? r[0].textContent : null;",
        SHORT,
    )
    .await;
    assert!(searched.as_str().unwrap().contains("baseline"), "found by its note: {searched}");
    browser.run("document.getElementById('text-filter').value = '';", json!([])).await;
    browser.click("#job-filters button[type=submit]").await;
    browser.wait_text("#job-rows", "web-long", SHORT).await;
    browser.screenshot(&shots.join("jobs-table.png")).await;

    steps.enter("comparing needs two, and shows both recipes and curves");
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
    let table = browser.wait_text("#compare-rows", "web-long", SHORT).await;
    assert!(table.contains("web-short") && table.contains("64"), "both recipes side by side: {table}");
    chart(&browser, "compare-loss-chart", 2).await;
    let colours = series_colours(&browser, "compare-loss-chart").await;
    assert_eq!(colours.as_array().unwrap().len(), 2, "two loss curves: {colours}");
    assert_ne!(colours[0], colours[1], "in two colours");
    // every spec field that differs, and the final error against a parameter (one job has finished)
    let diff = browser.wait_text("#diff-rows", "train_samples", SHORT).await;
    assert!(diff.contains("name") && diff.contains("epochs") && !diff.contains("per_worker_batch"), "{diff}");
    chart(&browser, "compare-scatter", 1).await;
    browser.run("const s = document.getElementById('scatter-parameter'); s.value = 'effective.global_batch'; s.dispatchEvent(new Event('change'));", json!([])).await;
    assert!(chart(&browser, "compare-scatter", 1).await.contains("kn (global batch)"));
    assert!(chart(&browser, "compare-samples-chart", 2).await.contains("samples seen"));
    browser.screenshot(&shots.join("compare.png")).await;

    steps.enter("a study made over the API: its table and its plot on the Studies page");
    let base = json!({"model": {"name": "mlp", "hidden": [16]}, "dataset": "synthetic:2048", "workers": 1,
        "per_worker_batch": 32, "epochs": 2, "lr": {"base": 0.1, "reference_batch": 32, "warmup": {"kind": "none"}}});
    let study = reqwest::Client::new()
        .post(format!("{url}/v1/studies"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"name": "web-study", "base": base, "axes": {"workers": [1, 2, 4]},
            "search": {"kind": "asha", "rungs": [1]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(study.status(), 201);
    browser.click("#nav button[data-page=studies]").await;
    browser.wait_text("#study-rows", "web-study", SHORT).await;
    browser.click("#study-rows a").await;
    // of the two searched points, the one behind at the rung is stopped; the other trains to the end
    let said = browser.wait_text("#study-search-text", "Search done", LONG).await;
    assert!(said.contains("device-hours spent of the full grid's") && said.contains("Best so far: point"), "{said}");
    let title = browser.wait_text("#study-title", "2 succeeded", SHORT).await;
    assert!(title.contains("1 stopped"), "{title}");
    let table = browser.wait_text("#study-point-rows", "workers=2", SHORT).await;
    assert!(table.contains("0*") && table.contains("2 / 2"), "the reference and the devices: {table}");
    assert!(table.contains("the reference: trains to the end") && table.contains("stopped at rung 1"), "{table}");
    // the figure each searched point was judged by at rung 1, the promoted one marked
    assert_eq!(table.matches(" ↑").count(), 1, "one point promoted past rung 1: {table}");
    let plot = chart(&browser, "study-plot", 6).await;
    assert!(
        plot.contains("0* workers=1 test") && plot.contains("1 workers=2 train"),
        "test and training error of both points: {plot}"
    );
    assert!(
        browser.run("return document.getElementById('cancel-study').hidden;", json!([])).await == json!(true),
        "nothing left to cancel"
    );
    browser.screenshot(&shots.join("study.png")).await;

    steps.enter("the Team view: a new team, a viewer token for it (shown once), a second token revoked");
    browser.click("#nav button[data-page=team]").await;
    browser.wait_text("#team-rows", "default", SHORT).await;
    browser.type_into("#new-team-name", "other").await;
    browser.run("document.getElementById('new-team-cpu').value = '1';", json!([])).await;
    browser.click("#team-create button[type=submit]").await;
    browser.wait_text("#team-rows", "other", SHORT).await;
    browser.click("#team-rows tr[data-team=other] button[data-team]").await;
    browser.wait_text("#tokens-title", "Tokens of team other", SHORT).await;
    let mut tokens = Vec::new();
    for (role, label) in [("viewer", "web viewer"), ("member", "to revoke")] {
        browser.run("document.getElementById('new-token-role').value = arguments[0];", json!([role])).await;
        browser.run("document.getElementById('new-token-label').value = arguments[0];", json!([label])).await;
        browser.click("#token-create button[type=submit]").await;
        browser.wait_text("#new-token", &format!("New {role} token"), SHORT).await;
        browser.wait_text("#token-rows", label, SHORT).await;
        tokens.push(browser.text("#new-token-value").await);
        assert_eq!(browser.run("return document.getElementById('new-token-label').value;", json!([])).await, json!(""));
        browser.run("document.getElementById('new-token').textContent = '';", json!([])).await;
    }
    let revoke = browser
        .run(
            "return [...document.querySelectorAll('#token-rows tr')].find(r => r.textContent.includes('to revoke')).dataset.token;",
            json!([]),
        )
        .await;
    let revoke = format!("#token-rows button[data-revoke='{}']", revoke.as_str().unwrap());
    browser.click(&revoke).await;
    browser.wait_text(&revoke, "Click again", SHORT).await;
    browser.click(&revoke).await;
    browser.wait_text("#token-rows", "revoked", SHORT).await;
    browser.screenshot(&shots.join("team.png")).await;
    let refused = reqwest::Client::new().get(format!("{url}/v1/me")).bearer_auth(&tokens[1]).send().await.unwrap();
    assert_eq!(refused.status(), 401, "the revoked token is refused");

    steps.enter("the other team's viewer sees none of it, and no Team view");
    browser.click("#signout").await;
    sign_in(&browser, &url, &tokens[0]).await;
    browser.wait_text("#whoami", "viewer of team other", SHORT).await;
    browser.wait_text("#no-jobs", "No jobs", SHORT).await;
    assert_eq!(browser.run("return document.getElementById('team-nav').hidden;", json!([])).await, json!(true));
    eprintln!("screenshots in {}", shots.display());
}

/// Every view has an address: a job's page survives a reload, Back returns to it, a study's address opens
/// it; and with the server gone, the page says so until it answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_have_addresses_and_a_lost_server_is_said() {
    let mut steps = Steps::new("web addresses");
    let database = support::fresh_postgres_database("web_addresses").await;
    let mut cluster = Cluster::serve("web-addresses", &database, 1, 1).await;
    let url = cluster.url.clone();
    let id = cluster.api.submit(&fashion_mnist("addressed", 1, 500, 1)).await;
    let browser = Browser::start().await;
    sign_in(&browser, &url, ADMIN_TOKEN).await;
    browser.wait_text("#whoami", "admin of team default", SHORT).await;
    let hash = || browser.run("return location.hash;", json!([]));
    assert_eq!(hash().await, json!("#/jobs"), "the Jobs list is the first view");

    steps.enter("a job's page has its address, and a reload shows the same page");
    browser.click(&format!("#job-rows a[data-job='{id}']")).await;
    browser.wait_text("#job-title", "Job addressed", SHORT).await;
    assert_eq!(hash().await, json!(format!("#/jobs/{id}")));
    let facts = browser.wait_text("#job-facts", "Model", SHORT).await;
    assert!(facts.contains("mlp") && facts.contains("Submitted") && facts.contains("Seed"), "{facts}");
    browser.run("location.reload();", json!([])).await;
    browser.wait_text("#job-title", "Job addressed", SHORT).await;
    assert_eq!(wait_for(&browser, "return !document.getElementById('job').hidden;", SHORT).await, json!(true));

    steps.enter("another view, then Back: the job again; the nav marks where the page is");
    browser.click("#nav button[data-page=studies]").await;
    assert_eq!(wait_for(&browser, "return location.hash === '#/studies';", SHORT).await, json!(true));
    let current = "return document.querySelector('#nav button[aria-current=page]').dataset.page;";
    assert_eq!(browser.run(current, json!([])).await, json!("studies"));
    browser.run("history.back();", json!([])).await;
    browser.wait_text("#job-title", "Job addressed", SHORT).await;
    assert_eq!(wait_for(&browser, "return !document.getElementById('job').hidden;", SHORT).await, json!(true));
    assert_eq!(browser.run(current, json!([])).await, json!("jobs"));

    steps.enter("an address nobody clicked to: a comparison of the one job, opened directly");
    browser.open(&format!("{url}/#/compare/{id},{id}")).await;
    browser.wait_text("#compare-rows", "addressed", SHORT).await;

    steps.enter("the server goes away: the page says so until it answers again");
    // (it would otherwise go on showing the last numbers)
    browser.open(&format!("{url}/#/jobs/{id}")).await;
    browser.wait_text("#job-title", "Job addressed", SHORT).await;
    assert_eq!(browser.run("return document.getElementById('contact').hidden;", json!([])).await, json!(true));
    cluster.kill_server();
    let banner = browser.wait_text("#contact", "Lost contact with the server at", SHORT).await;
    assert!(banner.contains("retrying"), "{banner}");
    // ... until it answers again
    cluster.start_server_again();
    wait_for(&browser, "return document.getElementById('contact').hidden;", Duration::from_secs(30)).await;
}
