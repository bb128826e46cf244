//! A headless Chromium driven over the W3C WebDriver protocol (Debian's `chromium` and `chromium-driver`,
//! installed by scripts/setup.sh): the few commands the page tests need, as plain HTTP JSON calls to a
//! `chromedriver` child process.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

use super::Process;

/// A browser session; the driver process and the browser end when this is dropped.
pub struct Browser {
    http: reqwest::Client,
    session: String,
    _driver: Process,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let group = format!("-{}", self._driver.0.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
    }
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    /// Starts chromedriver on a free port and opens a headless session.
    pub async fn start() -> Browser {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // its own process group: killing the group on drop ends the browser too (killing only chromedriver
        // would leave Chromium running, an orphan per test run)
        let driver = Command::new("chromedriver")
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs (scripts/setup.sh installs chromium-driver)");
        let driver = Process(driver);
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let capabilities = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,1000"]
        }}}});
        let deadline = Instant::now() + Duration::from_secs(30);
        let session = loop {
            match http.post(format!("{base}/session")).json(&capabilities).send().await {
                Ok(response) => {
                    let body: Value = response.json().await.unwrap();
                    let id = body["value"]["sessionId"].as_str();
                    break id.unwrap_or_else(|| panic!("no browser session: {body}")).to_string();
                }
                Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(err) => panic!("chromedriver did not answer: {err}"),
            }
        };
        Browser { http, session: format!("{base}/session/{session}"), _driver: driver }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.session));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request.send().await.unwrap().json().await.unwrap();
        answer["value"].clone()
    }

    pub async fn open(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({"url": url}))).await;
    }

    /// The first element matching `css`, waiting up to 10 s for it.
    pub async fn find(&self, css: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = self
                .call(reqwest::Method::POST, "/element", Some(json!({"using": "css selector", "value": css})))
                .await;
            if let Some(id) = found[ELEMENT].as_str() {
                return id.to_string();
            }
            assert!(Instant::now() < deadline, "no element {css}: {found}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn click(&self, css: &str) {
        let id = self.find(css).await;
        self.call(reqwest::Method::POST, &format!("/element/{id}/click"), Some(json!({}))).await;
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.call(reqwest::Method::POST, &format!("/element/{id}/value"), Some(json!({"text": text}))).await;
    }

    pub async fn text(&self, css: &str) -> String {
        let id = self.find(css).await;
        self.call(reqwest::Method::GET, &format!("/element/{id}/text"), None).await.as_str().unwrap_or("").to_string()
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page and returns its value.
    pub async fn run(&self, script: &str, args: Value) -> Value {
        self.call(reqwest::Method::POST, "/execute/sync", Some(json!({"script": script, "args": args}))).await
    }

    /// Waits up to `within` for the text of `css` to contain `wanted`; returns the text.
    pub async fn wait_text(&self, css: &str, wanted: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let text = self.text(css).await;
            if text.contains(wanted) {
                return text;
            }
            assert!(Instant::now() < deadline, "{css} never said {wanted:?}; last: {text:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Saves a PNG of the page.
    pub async fn screenshot(&self, path: &Path) {
        let data = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD.decode(data.as_str().unwrap_or("")).unwrap();
        std::fs::write(path, png).unwrap();
    }
}
