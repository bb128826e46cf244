//! Admission: what one caller may ask of the server at a time. Three limits, each answered 429 with a
//! `Retry-After`, never by queueing (a queue behind a hostile caller is itself the starvation):
//!
//! - a **global concurrency limit**: at most `max_in_flight` requests are being handled at once (a stream
//!   counts until its headers are sent, a long poll until it answers);
//! - a **per-token rate limit**: a token bucket per bearer token, keyed by the token's hash before any
//!   database lookup, so a flood of requests with one token (valid or not) costs a hash each;
//! - **event streams per token**: at most `max_streams_per_token` open at once, each ending after
//!   `max_stream_lifetime` (the client reconnects with `Last-Event-ID` and misses nothing).
//!
//! Requests without a token (health, the API document, `/metrics`) pass the rate limit: they do no work
//! per caller worth limiting, and the concurrency limit still bounds them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ringtrain_core::TokenId;
use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;
use crate::state::AppState;

/// The limits' settings (see [`crate::ApiConfig`] for the defaults).
#[derive(Debug, Clone, Copy)]
pub struct AdmissionConfig {
    /// Requests handled at once, over all callers.
    pub max_in_flight: usize,
    /// Sustained requests per second one token may make (0: no per-token limit).
    pub rate_per_second: f64,
    /// Requests one token may make at once after being idle.
    pub rate_burst: f64,
    /// Event streams one token may hold open.
    pub max_streams_per_token: usize,
    /// How long one event stream lives before the server ends it.
    pub max_stream_lifetime: Duration,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            max_in_flight: 512,
            rate_per_second: 50.0,
            rate_burst: 200.0,
            max_streams_per_token: 8,
            max_stream_lifetime: Duration::from_secs(3600),
        }
    }
}

/// Token buckets beyond this many are pruned of the idle (full) ones: random invalid tokens cannot grow
/// the map without bound.
const MAX_BUCKETS: usize = 50_000;

/// The admission state shared by every request.
#[derive(Debug)]
pub struct Admission {
    config: AdmissionConfig,
    in_flight: Arc<Semaphore>,
    buckets: Mutex<HashMap<[u8; 16], Bucket>>,
    streams: Arc<Mutex<HashMap<TokenId, usize>>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Admission {
    pub fn new(config: AdmissionConfig) -> Self {
        Admission {
            config,
            in_flight: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
            buckets: Mutex::new(HashMap::new()),
            streams: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    /// A slot among the requests handled at once.
    fn enter(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        self.in_flight.clone().try_acquire_owned().map_err(|_| {
            ApiError::too_many(
                "server-busy",
                format!("the server is handling {} requests; try again shortly", self.config.max_in_flight),
                1,
            )
        })
    }

    /// Takes one request from the bucket of the token with this key; or says how long until there is one.
    fn take(&self, key: [u8; 16], now: Instant) -> Result<(), ApiError> {
        let (rate, burst) = (self.config.rate_per_second, self.config.rate_burst.max(1.0));
        if rate <= 0.0 {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(&key) {
            let refill = Duration::from_secs_f64(burst / rate);
            buckets.retain(|_, b| now.duration_since(b.at) < refill);
        }
        let bucket = buckets.entry(key).or_insert(Bucket { tokens: burst, at: now });
        bucket.tokens = (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            let wait = ((1.0 - bucket.tokens) / rate).ceil() as u64;
            Err(ApiError::too_many(
                "rate-limited",
                format!("this token made more than {rate} requests per second (bursts of {burst}); slow down"),
                wait,
            ))
        }
    }

    /// A place among `token`'s open event streams, held until the stream ends (the guard is dropped).
    pub fn open_stream(&self, token: TokenId) -> Result<StreamSlot, ApiError> {
        let mut streams = self.streams.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let open = streams.entry(token).or_insert(0);
        if *open >= self.config.max_streams_per_token {
            return Err(ApiError::too_many(
                "too-many-streams",
                format!(
                    "this token already follows {} event streams, the most it may; close one",
                    self.config.max_streams_per_token
                ),
                5,
            ));
        }
        *open += 1;
        Ok(StreamSlot { token, streams: self.streams.clone() })
    }

    /// The event streams `token` holds open now.
    pub fn open_streams(&self, token: TokenId) -> usize {
        self.streams.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(&token).copied().unwrap_or(0)
    }
}

/// One open event stream of one token; dropping it frees the place.
#[derive(Debug)]
pub struct StreamSlot {
    token: TokenId,
    streams: Arc<Mutex<HashMap<TokenId, usize>>>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut streams = self.streams.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(open) = streams.get_mut(&self.token) {
            *open -= 1;
            if *open == 0 {
                streams.remove(&self.token);
            }
        }
    }
}

/// The bucket key of a request's bearer token: its hash, so the map never holds a secret.
fn token_key(request: &Request) -> Option<[u8; 16]> {
    let value = request.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = value.split_once(' ').map_or(value, |(_, token)| token).trim();
    let digest = Sha256::digest(token.as_bytes());
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest[..16]);
    Some(key)
}

/// Middleware: the global concurrency limit, then the caller's rate limit.
pub async fn admit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let admission = &state.admission;
    let permit = match admission.enter() {
        Ok(permit) => permit,
        Err(busy) => return busy.into_response(),
    };
    if let Some(key) = token_key(&request) {
        if let Err(limited) = admission.take(key, Instant::now()) {
            return limited.into_response();
        }
    }
    let response = next.run(request).await;
    drop(permit);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(rate: f64, burst: f64) -> Admission {
        Admission::new(AdmissionConfig { rate_per_second: rate, rate_burst: burst, ..Default::default() })
    }

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let limits = admission(10.0, 3.0);
        let start = Instant::now();
        for _ in 0..3 {
            limits.take([1; 16], start).unwrap();
        }
        let refused = limits.take([1; 16], start).unwrap_err();
        assert_eq!(refused.status().as_u16(), 429);
        // another token has its own bucket
        limits.take([2; 16], start).unwrap();
        // a tenth of a second later, one more
        limits.take([1; 16], start + Duration::from_millis(101)).unwrap();
        assert!(limits.take([1; 16], start + Duration::from_millis(102)).is_err());
    }

    #[test]
    fn idle_buckets_are_pruned_when_the_map_is_full() {
        let limits = admission(1000.0, 10.0);
        let start = Instant::now();
        for i in 0..MAX_BUCKETS as u32 {
            let mut key = [0u8; 16];
            key[..4].copy_from_slice(&i.to_le_bytes());
            limits.take(key, start).unwrap();
        }
        // a second later every bucket has refilled: the next new key prunes them all
        limits.take([9; 16], start + Duration::from_secs(1)).unwrap();
        assert_eq!(limits.buckets.lock().unwrap().len(), 1);
    }

    #[test]
    fn the_concurrency_limit_refuses_instead_of_queueing() {
        let limits = Admission::new(AdmissionConfig { max_in_flight: 2, ..Default::default() });
        let first = limits.enter().unwrap();
        let _second = limits.enter().unwrap();
        assert_eq!(limits.enter().unwrap_err().status().as_u16(), 429);
        drop(first);
        let _again = limits.enter().unwrap();
    }

    #[test]
    fn stream_slots_are_counted_per_token_and_freed_on_drop() {
        let limits = Admission::new(AdmissionConfig { max_streams_per_token: 2, ..Default::default() });
        let (a, b) = (TokenId(uuid::Uuid::from_u128(1)), TokenId(uuid::Uuid::from_u128(2)));
        let first = limits.open_stream(a).unwrap();
        let _second = limits.open_stream(a).unwrap();
        assert_eq!(limits.open_stream(a).unwrap_err().status().as_u16(), 429);
        let _other = limits.open_stream(b).unwrap();
        drop(first);
        assert_eq!(limits.open_streams(a), 1);
        limits.open_stream(a).unwrap();
    }
}
