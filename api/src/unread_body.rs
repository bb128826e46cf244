//! Uploads refused before their body is read (a bad token, a missing query parameter, an unknown data set)
//! must still reach the client as the refusal. HTTP/1.1 lets a server answer early, but hyper closes the
//! connection when the handler drops an unread body, and a client still sending it then sees a reset
//! ("connection closed before message completed") instead of the 4xx that names the problem. So the upload
//! routes read what is left of a refused request's body, within bounds, before the refusal goes out.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::header::{CONTENT_LENGTH, EXPECT};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;

/// At most this much of a refused body is read and thrown away; past it the connection is closed as
/// before (a refused multi-gigabyte upload is not worth receiving).
pub const MAX_DRAINED_BYTES: u64 = 64 << 20;
/// ... and for at most this long.
pub const MAX_DRAIN_TIME: Duration = Duration::from_secs(10);
/// ... or this long when the caller is not authenticated (401) or not allowed (403): the request holds its
/// admission slot while it is drained, and a caller without a valid token must not hold one for long
/// (trickling bodies to be drained was a way to fill the request slots, see [`crate::admission::requests`]). A client
/// that really sends its body still finishes well within it: 64 MiB over loopback take milliseconds.
pub const MAX_UNAUTHENTICATED_DRAIN_TIME: Duration = Duration::from_secs(2);

/// The request body, shared between the handler and this middleware, which takes what is left afterwards.
struct Shared {
    body: Mutex<Body>,
    /// Whether the handler began reading: with `Expect: 100-continue` an unread body was never sent.
    polled: AtomicBool,
}

struct SharedBody(Arc<Shared>);

impl HttpBody for SharedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        self.0.polled.store(true, Ordering::Relaxed);
        let mut body = self.0.body.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Pin::new(&mut *body).poll_frame(cx)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.0.body.lock().map(|b| b.size_hint()).unwrap_or_default()
    }

    fn is_end_stream(&self) -> bool {
        self.0.body.lock().map(|b| b.is_end_stream()).unwrap_or(false)
    }
}

/// Middleware for the upload routes: after a refusal (4xx/5xx), reads the rest of the body (bounded by
/// [`MAX_DRAINED_BYTES`] and [`drain_time`]) so the client finishes sending and reads the answer.
pub async fn drain_after_refusal(request: Request, next: Next) -> Response {
    let expects_continue = request.headers().get(EXPECT).is_some();
    // A body declared larger than what would be read is not worth starting on: its connection closes.
    let declared = request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let worth_reading = declared.is_none_or(|bytes| bytes <= MAX_DRAINED_BYTES);
    let (parts, body) = request.into_parts();
    let shared = Arc::new(Shared { body: Mutex::new(body), polled: AtomicBool::new(false) });
    let response = next.run(Request::from_parts(parts, Body::new(SharedBody(shared.clone())))).await;
    // A client that waits for 100 Continue before sending never sends an unread body: nothing to read.
    let refused = response.status().is_client_error() || response.status().is_server_error();
    if refused && worth_reading && (shared.polled.load(Ordering::Relaxed) || !expects_continue) {
        let rest = std::mem::take(&mut *shared.body.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
        let _ = tokio::time::timeout(drain_time(response.status()), drain(rest)).await;
    }
    response
}

/// How long a refused body is read for: briefly when the refusal is about who is asking.
fn drain_time(refusal: StatusCode) -> Duration {
    if matches!(refusal, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
        MAX_UNAUTHENTICATED_DRAIN_TIME
    } else {
        MAX_DRAIN_TIME
    }
}

/// Reads and drops up to [`MAX_DRAINED_BYTES`] of a body.
async fn drain(body: Body) {
    let mut stream = body.into_data_stream();
    let mut read = 0u64;
    while let Some(Ok(chunk)) = stream.next().await {
        read += chunk.len() as u64;
        if read > MAX_DRAINED_BYTES {
            return;
        }
    }
}
