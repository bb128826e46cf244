//! Starvation (security finding A1): callers that hold request slots, strangers without a token trickling
//! an upload's body or a viewer trickling JSON, cannot keep an agent's heartbeat out. Over real sockets, as
//! the attack is one of connections held open, which `oneshot` cannot show.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::TestApp;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Serves the test app on a free loopback port, with the callers' addresses, as `ringtrain serve` does.
async fn serve(app: &TestApp) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let service = app.router.clone().into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await });
    address
}

/// A request's head, and its body unless it is trickled.
fn request(method: &str, path: &str, token: Option<&str>, length: usize, body: &str) -> String {
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    format!(
        "{method} {path} HTTP/1.1\r\nHost: ringtrain\r\n{authorization}Content-Type: application/json\r\n\
         Content-Length: {length}\r\nConnection: close\r\n\r\n{body}"
    )
}

/// Sends a whole request and reads the answer: its status and text.
async fn exchange(address: SocketAddr, request: String) -> (u16, String) {
    exchange_from([127, 0, 0, 1], address, request).await
}

/// A connection from this loopback address (every 127.x.y.z is this machine's): another caller to the
/// server's per-address limits.
async fn connect_from(source: [u8; 4], address: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((source, 0))).unwrap();
    socket.connect(address).await.unwrap()
}

async fn exchange_from(source: [u8; 4], address: SocketAddr, request: String) -> (u16, String) {
    let mut stream = connect_from(source, address).await;
    stream.write_all(request.as_bytes()).await.unwrap();
    answer(&mut stream).await
}

/// Reads an answer to the end of the connection.
async fn answer(stream: &mut TcpStream) -> (u16, String) {
    let mut bytes = Vec::new();
    let _ = stream.read_to_end(&mut bytes).await;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

/// Opens a request whose body is `length` bytes and sends its head and one byte of it: the server holds a
/// slot for it while it waits for the rest.
async fn stall(address: SocketAddr, method: &str, path: &str, token: Option<&str>, length: usize) -> TcpStream {
    stall_from([127, 0, 0, 1], address, method, path, token, length).await
}

async fn stall_from(
    source: [u8; 4],
    address: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    length: usize,
) -> TcpStream {
    let mut stream = connect_from(source, address).await;
    stream.write_all(request(method, path, token, length, "{").as_bytes()).await.unwrap();
    stream
}

/// Eight request slots in all.
async fn eight_slots(store: std::sync::Arc<dyn ringtrain_store::Store>) -> TestApp {
    TestApp::with_config(store, |config| {
        config.admission.max_in_flight = 8;
        config.admission.rate_per_second = 0.0;
    })
    .await
}

/// A viewer's slow previews and strangers' stalled uploads fill every one of the eight slots the users
/// have (another viewer request is refused busy), and yet the agent's heartbeat is answered 200 at once:
/// before, it was 429 like the rest, and a node without a heartbeat for 15 s is lost with its jobs. The
/// strangers' refused uploads are answered (and their slots freed) within seconds, not 10 s.
async fn a_full_pool_of_strangers_and_slow_viewers_does_not_keep_an_agents_heartbeat_out(app: TestApp) {
    let team = app.team("alpha").await;
    let agent = app.agent_token().await;
    let address = serve(&app).await;
    let devices = json!([{"index": 0, "kind": "cpu", "name": "cpu 0"}]);
    let registration = json!({"name": "n", "address": "127.0.0.1", "devices": devices}).to_string();
    let (status, text) =
        exchange(address, request("POST", "/v1/agent/nodes", Some(&agent), registration.len(), &registration)).await;
    assert_eq!(status, 200, "{text}");
    let node = text.split("\"id\":\"").nth(1).and_then(|rest| rest.split('"').next()).unwrap().to_string();
    assert_eq!(exchange(address, request("GET", "/v1/jobs", Some(&team.viewer), 0, "")).await.0, 200);

    let preview = "/v1/schedules/preview?dataset_size=1000";
    let mut previews = Vec::new();
    for _ in 0..4 {
        previews.push(stall(address, "POST", preview, Some(&team.viewer), 100_000).await);
    }
    let mut uploads = Vec::new();
    for _ in 0..12 {
        uploads.push((stall(address, "POST", "/v1/datasets?name=d", None, 1_000_000).await, Instant::now()));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, text) = exchange(address, request("GET", "/v1/jobs", Some(&team.viewer), 0, "")).await;
    assert_eq!(status, 429, "every users' slot is taken: {text}");

    let heartbeat = request("POST", &format!("/v1/agent/nodes/{node}/heartbeat"), Some(&agent), 2, "{}");
    let started = Instant::now();
    let (status, text) = tokio::time::timeout(Duration::from_secs(1), exchange(address, heartbeat))
        .await
        .expect("the heartbeat is answered within a second");
    assert_eq!(status, 200, "the heartbeat after {:?}: {text}", started.elapsed());

    let mut refused = 0;
    for (mut upload, sent) in uploads {
        let (status, text) = tokio::time::timeout(Duration::from_secs(5), answer(&mut upload))
            .await
            .expect("a stranger's stalled upload is answered within seconds");
        assert!(matches!(status, 401 | 429), "{text}");
        if status == 401 {
            refused += 1;
            assert!(sent.elapsed() < Duration::from_secs(4), "held for {:?}", sent.elapsed());
        }
    }
    assert!(refused > 0, "some uploads held a slot until refused");
    drop(previews);
}

/// Three requests in flight per address for callers without a valid token.
async fn three_per_address(store: std::sync::Arc<dyn ringtrain_store::Store>) -> TestApp {
    TestApp::with_config(store, |config| {
        config.admission.max_in_flight_per_address = 3;
        config.admission.rate_per_second = 0.0;
    })
    .await
}

/// A stranger holding three stalled uploads from one address is refused a fourth at once (429
/// `address-busy`), while a stranger from another address, and a viewer whose token is proven from the
/// same address, are answered as usual.
async fn a_stranger_holds_few_slots_and_only_those_of_its_address(app: TestApp) {
    let team = app.team("alpha").await;
    let address = serve(&app).await;
    let (home, elsewhere) = ([127, 0, 0, 2], [127, 0, 0, 3]);
    let jobs = || request("GET", "/v1/jobs", Some(&team.viewer), 0, "");
    assert_eq!(exchange_from(home, address, jobs()).await.0, 200, "the viewer's token is proven");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(stall_from(home, address, "POST", "/v1/datasets?name=d", None, 1_000_000).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fourth = request("POST", "/v1/datasets?name=d", None, 2, "{}");
    let (status, text) = exchange_from(home, address, fourth.clone()).await;
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("urn:ringtrain:problem:address-busy"), "{text}");
    let (status, text) = exchange_from(elsewhere, address, fourth).await;
    assert_eq!(status, 401, "another address has its own slots: {text}");
    let (status, text) = exchange_from(home, address, jobs()).await;
    assert_eq!(status, 200, "a proven token is not a stranger's, whatever its address: {text}");
    drop(held);
}

ringtrain_store::on_both_backends!(
    setup = crate::eight_slots;
    a_full_pool_of_strangers_and_slow_viewers_does_not_keep_an_agents_heartbeat_out,
);

ringtrain_store::on_both_backends!(
    setup = crate::three_per_address;
    a_stranger_holds_few_slots_and_only_those_of_its_address,
);
