//! `ringtrain-bench api`: a load generator for a running server. It measures job submissions per second with
//! their p50/p99 latency, then fills one team's history to a given size and measures `GET /v1/jobs` pages
//! (the first page, pages deep into the history through the cursor, and a filtered page).
//!
//! The client is a minimal HTTP/1.1 keep-alive client over one TCP connection per worker: it sends small
//! JSON requests and reads `Content-Length` or chunked bodies, which is all this API answers with.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// `host:port` of the server (loopback: this is a local benchmark).
    pub address: String,
    /// An admin token (to create the benchmark's own team).
    pub admin_token: String,
    /// Submissions timed for the rate and latency figures.
    pub submissions: usize,
    /// Parallel connections.
    pub concurrency: usize,
    /// Jobs in the team's history before pages are timed.
    pub history: usize,
    /// Pages timed per kind of page.
    pub pages: usize,
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub requests: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    fn of(mut samples: Vec<Duration>) -> Latency {
        samples.sort();
        let at = |q: f64| {
            let i = ((samples.len() as f64 * q).ceil() as usize).saturating_sub(1).min(samples.len().saturating_sub(1));
            samples.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
        };
        Latency { requests: samples.len(), p50_ms: at(0.50), p99_ms: at(0.99), max_ms: at(1.0) }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub concurrency: usize,
    pub submissions_per_s: f64,
    pub submit: Latency,
    pub history_jobs: usize,
    /// The rate at which the history was filled (same requests, not individually timed).
    pub fill_per_s: f64,
    pub first_page: Latency,
    pub deep_pages: Latency,
    pub filtered_page: Latency,
}

/// One keep-alive HTTP/1.1 connection.
#[derive(Debug)]
struct Conn {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    host: String,
}

impl Conn {
    async fn open(address: &str) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        let (read, writer) = stream.into_split();
        Ok(Conn { reader: BufReader::new(read), writer, host: address.to_string() })
    }

    async fn send(
        &mut self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&Value>,
    ) -> std::io::Result<(u16, Value)> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        self.writer.write_all(head.as_bytes()).await?;
        self.writer.write_all(body.as_bytes()).await?;
        let mut line = String::new();
        self.reader.read_line(&mut line).await?;
        let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| bad(&line))?;
        let (mut length, mut chunked) = (0usize, false);
        loop {
            line.clear();
            self.reader.read_line(&mut line).await?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').ok_or_else(|| bad(header))?;
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().map_err(|_| bad(header))?,
                "transfer-encoding" => chunked = value.trim().eq_ignore_ascii_case("chunked"),
                _ => {}
            }
        }
        let mut bytes = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.reader.read_line(&mut line).await?;
                let size = usize::from_str_radix(line.trim(), 16).map_err(|_| bad(&line))?;
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk).await?;
                if size == 0 {
                    break;
                }
                bytes.extend_from_slice(&chunk[..size]);
            }
        } else {
            bytes.resize(length, 0);
            self.reader.read_exact(&mut bytes).await?;
        }
        Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    }
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("unexpected HTTP response line {what:?}"))
}

fn spec(i: usize) -> Value {
    json!({"name": format!("bench-{i}"), "model": {"name": "lenet5"}, "dataset": "fashion-mnist", "workers": 2,
        "per_worker_batch": 32, "epochs": 6,
        "lr": {"warmup": {"kind": "gradual", "epochs": 1}, "decay": {"kind": "step", "milestones": [4, 5]}}})
}

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Submits `count` jobs over `concurrency` connections; returns each request's latency.
async fn submit_many(options: &BenchOptions, token: &str, first: usize, count: usize) -> BenchResult<Vec<Duration>> {
    let workers = options.concurrency.max(1);
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (address, token) = (options.address.clone(), token.to_string());
        let mine: Vec<usize> = (first..first + count).filter(|i| i % workers == w).collect();
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(&address).await?;
            let mut latencies = Vec::with_capacity(mine.len());
            for i in mine {
                let started = Instant::now();
                let (status, body) = conn.send("POST", "/v1/jobs", &token, Some(&spec(i))).await?;
                latencies.push(started.elapsed());
                if status != 201 {
                    return Err(format!("submit answered {status}: {body}").into());
                }
            }
            BenchResult::Ok(latencies)
        }));
    }
    let mut all = Vec::with_capacity(count);
    for task in tasks {
        all.extend(task.await??);
    }
    Ok(all)
}

async fn time_gets(conn: &mut Conn, token: &str, paths: &[String]) -> BenchResult<Vec<Duration>> {
    let mut latencies = Vec::with_capacity(paths.len());
    for path in paths {
        let started = Instant::now();
        let (status, body) = conn.send("GET", path, token, None).await?;
        latencies.push(started.elapsed());
        if status != 200 {
            return Err(format!("GET {path} answered {status}: {body}").into());
        }
    }
    Ok(latencies)
}

/// Runs the whole benchmark against the server at `options.address`.
pub async fn run(options: &BenchOptions) -> BenchResult<BenchReport> {
    let mut conn = Conn::open(&options.address).await?;
    let team_name = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (status, team) = conn
        .send(
            "POST",
            "/v1/teams",
            &options.admin_token,
            Some(&json!({"name": team_name, "gpu_quota": 0, "cpu_quota": 0})),
        )
        .await?;
    if status != 201 {
        return Err(format!("creating the benchmark team answered {status}: {team}").into());
    }
    let path = format!("/v1/teams/{}/tokens", team["id"].as_str().unwrap_or_default());
    let (_, token) = conn.send("POST", &path, &options.admin_token, Some(&json!({"role": "member"}))).await?;
    let token = token["token"].as_str().ok_or("no member token")?.to_string();

    let started = Instant::now();
    let submit = submit_many(options, &token, 0, options.submissions).await?;
    let submissions_per_s = options.submissions as f64 / started.elapsed().as_secs_f64();

    let fill = options.history.saturating_sub(options.submissions);
    let started = Instant::now();
    submit_many(options, &token, options.submissions, fill).await?;
    let fill_per_s = fill as f64 / started.elapsed().as_secs_f64().max(1e-9);

    let first: Vec<String> = (0..options.pages).map(|_| "/v1/jobs?limit=50".to_string()).collect();
    let first_page = Latency::of(time_gets(&mut conn, &token, &first).await?);

    // Walk the cursor from the newest job towards the oldest, timing each page.
    let stride = (options.history / 50 / options.pages.max(1)).max(1);
    let mut deep = Vec::new();
    let mut uri = "/v1/jobs?limit=50".to_string();
    let mut page = 0;
    while deep.len() < options.pages {
        let started = Instant::now();
        let (status, body) = conn.send("GET", &uri, &token, None).await?;
        let elapsed = started.elapsed();
        if status != 200 {
            return Err(format!("GET {uri} answered {status}").into());
        }
        if page % stride == 0 {
            deep.push(elapsed);
        }
        page += 1;
        match body["next_cursor"].as_str() {
            Some(cursor) => uri = format!("/v1/jobs?limit=50&cursor={cursor}"),
            None => break,
        }
    }
    let filtered: Vec<String> =
        (0..options.pages).map(|i| format!("/v1/jobs?limit=50&state=queued&name_prefix=bench-{}", i % 10)).collect();
    let filtered_page = Latency::of(time_gets(&mut conn, &token, &filtered).await?);
    Ok(BenchReport {
        concurrency: options.concurrency,
        submissions_per_s,
        submit: Latency::of(submit),
        history_jobs: options.history.max(options.submissions),
        fill_per_s,
        first_page,
        deep_pages: Latency::of(deep),
        filtered_page,
    })
}
