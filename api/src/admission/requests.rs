//! Admission: what one caller may ask of the server at a time. Every limit is answered 429 with a
//! `Retry-After`, never by queueing (a queue behind a hostile caller is itself the starvation), and is
//! decided from the request alone, before any database lookup: a limit that cost a lookup per request would
//! let a flood of invented tokens spend the database instead.
//!
//! A request comes from one of three kinds of caller:
//!
//! - an **agent**: a request to `/v1/agent/*` whose bearer token authenticated as an agent's token within
//!   the last [`PROVEN_FOR`] (the hashes of such tokens are kept in memory, filled where requests are
//!   authenticated: [`Admission::prove`]);
//! - a **user**: any other request whose token authenticated within [`PROVEN_FOR`];
//! - a **stranger**: no token, or one not seen to authenticate (invented, revoked, or not used yet).
//!
//! Whether a token is proven only picks the pool and the limits: every request is still authenticated by
//! its handler, so a revoked token fails at once (and that failure takes it out of the proven ones).
//!
//! The limits:
//!
//! - **two pools of request slots**: agents take theirs from `max_agent_in_flight`, everyone else from
//!   `max_in_flight` (a stream counts until its headers are sent, a long poll until it answers). Agents'
//!   heartbeats keep their nodes alive: a node unheard for the node timeout (15 s) is lost, and every job
//!   on it loses its placement. In one shared pool, anyone holding slots long enough (slow bodies, uploads
//!   drained after their refusal) starved the heartbeats and failed every running job (finding A1); no
//!   user or stranger can take an agent's slot now.
//! - **per source address, for strangers**: at most `max_in_flight_per_address` of the users' slots, and a
//!   rate bucket per address (`address_rate_per_second`, bursts of `address_rate_burst`), so a caller
//!   without a valid token neither fills the users' pool from one address nor has invented tokens looked up
//!   as fast as it can send them. The address is the TCP peer's: **behind a reverse proxy every caller
//!   shares the proxy's address**, and with it these limits. (A refused upload of a stranger is also
//!   drained only briefly, see [`crate::unread_body`], so it does not hold its slot long.)
//! - a **per-token rate limit**: a token bucket per bearer token, keyed by the token's hash, so a flood of
//!   requests with one token (valid or not) costs a hash each;
//! - **event streams per token**: at most `max_streams_per_token` open at once, each ending after
//!   `max_stream_lifetime` (the client reconnects with `Last-Event-ID` and misses nothing).
//!
//! Over 450 lines because every limit is decided here, from the request alone, with its reason beside it:
//! one place to read what a caller may do at once.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ringtrain_core::TokenId;
use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{ApiError, ProblemType};
use crate::state::AppState;

/// The limits' settings (see [`crate::ApiConfig`] for the defaults).
#[derive(Debug, Clone, Copy)]
pub struct AdmissionConfig {
    /// Requests handled at once for users and strangers, over all of them.
    pub max_in_flight: usize,
    /// Requests of proven agents handled at once, apart from everyone else's.
    pub max_agent_in_flight: usize,
    /// Requests one source address may have in flight without a proven token.
    pub max_in_flight_per_address: usize,
    /// Sustained requests per second one source address may make without a proven token (0: no limit).
    pub address_rate_per_second: f64,
    /// Requests one source address may make at once without a proven token after being idle.
    pub address_rate_burst: f64,
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
            max_agent_in_flight: 1024,
            max_in_flight_per_address: 64,
            address_rate_per_second: 50.0,
            address_rate_burst: 200.0,
            rate_per_second: 50.0,
            rate_burst: 200.0,
            max_streams_per_token: 8,
            max_stream_lifetime: Duration::from_secs(3600),
        }
    }
}

/// Rate buckets beyond this many are pruned of the idle (full) ones: random invalid tokens cannot grow
/// the map without bound.
const MAX_BUCKETS: usize = 50_000;

/// How long a token that authenticated counts as proven. Agents authenticate every few seconds (each
/// heartbeat), so theirs stay proven while they run; after a restart a token is a stranger's until its
/// first request authenticates.
pub const PROVEN_FOR: Duration = Duration::from_secs(120);

/// Proven tokens kept at most. Only tokens that authenticated get in, so this bounds the map against a
/// very large fleet, not against attackers; one that finds it full just stays a stranger.
const MAX_PROVEN: usize = 100_000;

/// A bearer token's key: the first half of its sha256, so no map holds a secret.
type TokenKey = [u8; 16];

/// A stranger's source address as limited: `None` where the request came without one (in-process calls,
/// such as tests driving the router through `oneshot`, have no `ConnectInfo`): all of those share one key.
type AddressKey = Option<IpAddr>;

/// The admission state shared by every request.
#[derive(Debug)]
pub struct Admission {
    config: AdmissionConfig,
    users: Arc<Semaphore>,
    agents: Arc<Semaphore>,
    token_rates: RateBuckets<TokenKey>,
    address_rates: RateBuckets<AddressKey>,
    per_address: Counted<AddressKey>,
    proven: Mutex<HashMap<TokenKey, Proven>>,
    streams: Counted<TokenId>,
}

/// A token that authenticated: whether it is an agent's, and when it last did.
#[derive(Debug, Clone, Copy)]
struct Proven {
    agent: bool,
    at: Instant,
}

/// Who a request comes from, as far as admission can tell without the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    Agent,
    User,
    Stranger(AddressKey),
}

/// What an admitted request holds until it is answered.
#[derive(Debug)]
struct Pass {
    _pool: OwnedSemaphorePermit,
    _address: Option<Slot<AddressKey>>,
}

impl Admission {
    pub fn new(config: AdmissionConfig) -> Self {
        Admission {
            config,
            users: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
            agents: Arc::new(Semaphore::new(config.max_agent_in_flight.max(1))),
            token_rates: RateBuckets::new(config.rate_per_second, config.rate_burst),
            address_rates: RateBuckets::new(config.address_rate_per_second, config.address_rate_burst),
            per_address: Counted::new(config.max_in_flight_per_address.max(1)),
            proven: Mutex::new(HashMap::new()),
            streams: Counted::new(config.max_streams_per_token),
        }
    }

    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    /// Records that `token` authenticated (as an agent's token or not): its next requests are an agent's or
    /// a user's, not a stranger's. Called by [`crate::auth`] on every success.
    pub fn prove(&self, token: &str, agent: bool) {
        let now = Instant::now();
        let mut proven = self.proven.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = key_of(token);
        if proven.len() >= MAX_PROVEN && !proven.contains_key(&key) {
            proven.retain(|_, p| now.duration_since(p.at) < PROVEN_FOR);
            if proven.len() >= MAX_PROVEN {
                return;
            }
        }
        proven.insert(key, Proven { agent, at: now });
    }

    /// Records that `token` failed to authenticate (revoked, expired, unknown): its next requests are a
    /// stranger's again.
    pub fn disprove(&self, token: &str) {
        self.proven.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&key_of(token));
    }

    /// Who sent a request to `path` with this token from this address.
    fn caller(&self, path: &str, token: Option<TokenKey>, address: AddressKey, now: Instant) -> Caller {
        let proven = token.and_then(|key| {
            let proven = self.proven.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            proven.get(&key).copied().filter(|p| now.duration_since(p.at) < PROVEN_FOR)
        });
        match proven {
            Some(Proven { agent: true, .. }) if path.starts_with("/v1/agent/") => Caller::Agent,
            Some(_) => Caller::User,
            None => Caller::Stranger(address),
        }
    }

    /// Every limit of one request: the rates first (a refusal there holds nothing), then its slots.
    fn admit(&self, caller: Caller, token: Option<TokenKey>, now: Instant) -> Result<Pass, ApiError> {
        if let Caller::Stranger(address) = caller {
            self.address_rates.take(address, now).map_err(|wait| {
                let (rate, burst) = (self.address_rates.rate, self.address_rates.burst);
                ApiError::too_many(
                    ProblemType::RateLimited,
                    format!(
                        "this address made more than {rate} requests per second (bursts of {burst}) without a \
                         valid token; slow down"
                    ),
                    wait,
                )
            })?;
        }
        if let Some(key) = token {
            self.token_rates.take(key, now).map_err(|wait| {
                let (rate, burst) = (self.token_rates.rate, self.token_rates.burst);
                ApiError::too_many(
                    ProblemType::RateLimited,
                    format!("this token made more than {rate} requests per second (bursts of {burst}); slow down"),
                    wait,
                )
            })?;
        }
        match caller {
            Caller::Agent => Ok(Pass { _pool: self.enter(&self.agents, "agents'")?, _address: None }),
            Caller::User => Ok(Pass { _pool: self.enter(&self.users, "users'")?, _address: None }),
            Caller::Stranger(address) => {
                let slot = self.per_address.take(address).ok_or_else(|| {
                    ApiError::too_many(
                        ProblemType::AddressBusy,
                        format!(
                            "this address has {} requests in flight without a valid token, the most it may",
                            self.config.max_in_flight_per_address
                        ),
                        1,
                    )
                })?;
                Ok(Pass { _pool: self.enter(&self.users, "users'")?, _address: Some(slot) })
            }
        }
    }

    /// A slot of `pool`, named `whose` in the refusal.
    fn enter(&self, pool: &Arc<Semaphore>, whose: &str) -> Result<OwnedSemaphorePermit, ApiError> {
        pool.clone().try_acquire_owned().map_err(|_| {
            ApiError::too_many(
                ProblemType::ServerBusy,
                format!("every one of the server's {whose} request slots is taken; try again shortly"),
                1,
            )
        })
    }

    /// A place among `token`'s open event streams, held until the stream ends (the guard is dropped).
    pub fn open_stream(&self, token: TokenId) -> Result<StreamSlot, ApiError> {
        self.streams.take(token).ok_or_else(|| {
            ApiError::too_many(
                ProblemType::TooManyStreams,
                format!(
                    "this token already follows {} event streams, the most it may; close one",
                    self.config.max_streams_per_token
                ),
                5,
            )
        })
    }

    /// The event streams `token` holds open now.
    pub fn open_streams(&self, token: TokenId) -> usize {
        self.streams.held(&token)
    }
}

/// Token buckets of one kind of key: each key may make `rate` requests a second, `burst` at once.
#[derive(Debug)]
struct RateBuckets<K> {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<K, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl<K: Hash + Eq> RateBuckets<K> {
    fn new(rate: f64, burst: f64) -> Self {
        RateBuckets { rate, burst: burst.max(1.0), buckets: Mutex::new(HashMap::new()) }
    }

    /// Takes one request from `key`'s bucket; or says in how many seconds there is one.
    fn take(&self, key: K, now: Instant) -> Result<(), u64> {
        let (rate, burst) = (self.rate, self.burst);
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
            Err(((1.0 - bucket.tokens) / rate).ceil() as u64)
        }
    }
}

/// At most `max` of something held at once per key (event streams per token, requests per address).
#[derive(Debug)]
struct Counted<K> {
    max: usize,
    held: Arc<Mutex<HashMap<K, usize>>>,
}

impl<K: Hash + Eq + Clone> Counted<K> {
    fn new(max: usize) -> Self {
        Counted { max, held: Arc::new(Mutex::new(HashMap::new())) }
    }

    /// One more for `key`, held until the slot is dropped; None when `key` holds `max` already.
    fn take(&self, key: K) -> Option<Slot<K>> {
        let mut held = self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = held.entry(key.clone()).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(Slot { key, held: self.held.clone() })
    }

    fn held(&self, key: &K) -> usize {
        self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(key).copied().unwrap_or(0)
    }
}

/// One of a key's counted places; dropping it frees the place (and the key's entry with its last one, so
/// the map holds only keys that hold something).
#[derive(Debug)]
pub struct Slot<K: Hash + Eq> {
    key: K,
    held: Arc<Mutex<HashMap<K, usize>>>,
}

impl<K: Hash + Eq> Drop for Slot<K> {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = held.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.key);
            }
        }
    }
}

/// One open event stream of one token; dropping it frees the place.
pub type StreamSlot = Slot<TokenId>;

fn key_of(token: &str) -> TokenKey {
    let digest = Sha256::digest(token.as_bytes());
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest[..16]);
    key
}

/// The key of a request's bearer token (as [`crate::auth`] reads the token).
fn token_key(request: &Request) -> Option<TokenKey> {
    let value = request.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = value.split_once(' ').map_or(value, |(_, token)| token).trim();
    Some(key_of(token))
}

/// The request's source address, from the server's `ConnectInfo` (see [`AddressKey`] for requests without
/// one). An IPv6 caller is keyed by its /64, the block one host or one customer is usually given: per
/// address would let it pick a fresh one for every request.
fn address_key(request: &Request) -> AddressKey {
    let ConnectInfo(peer) = request.extensions().get::<ConnectInfo<SocketAddr>>()?;
    Some(match peer.ip().to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    })
}

/// Middleware: every admission limit (see the module's documentation), held until the response is made.
pub async fn admit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let now = Instant::now();
    let token = token_key(&request);
    let caller = state.admission.caller(request.uri().path(), token, address_key(&request), now);
    match state.admission.admit(caller, token, now) {
        Ok(pass) => {
            let response = next.run(request).await;
            drop(pass);
            response
        }
        Err(refused) => refused.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOME: AddressKey = Some(IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1)));

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let buckets = RateBuckets::new(10.0, 3.0);
        let start = Instant::now();
        for _ in 0..3 {
            buckets.take([1; 16], start).unwrap();
        }
        assert_eq!(buckets.take([1; 16], start), Err(1));
        // another token has its own bucket
        buckets.take([2; 16], start).unwrap();
        // a tenth of a second later, one more
        buckets.take([1; 16], start + Duration::from_millis(101)).unwrap();
        assert!(buckets.take([1; 16], start + Duration::from_millis(102)).is_err());
    }

    #[test]
    fn idle_buckets_are_pruned_when_the_map_is_full() {
        let buckets = RateBuckets::new(1000.0, 10.0);
        let start = Instant::now();
        for i in 0..MAX_BUCKETS as u32 {
            let mut key = [0u8; 16];
            key[..4].copy_from_slice(&i.to_le_bytes());
            buckets.take(key, start).unwrap();
        }
        // a second later every bucket has refilled: the next new key prunes them all
        buckets.take([9; 16], start + Duration::from_secs(1)).unwrap();
        assert_eq!(buckets.buckets.lock().unwrap().len(), 1);
    }

    #[test]
    fn the_concurrency_limit_refuses_instead_of_queueing() {
        let limits = Admission::new(AdmissionConfig { max_in_flight: 2, ..Default::default() });
        let now = Instant::now();
        limits.prove("user", false);
        let user = limits.caller("/v1/jobs", Some(key_of("user")), HOME, now);
        assert_eq!(user, Caller::User);
        let first = limits.admit(user, None, now).unwrap();
        let _second = limits.admit(user, None, now).unwrap();
        assert_eq!(limits.admit(user, None, now).unwrap_err().status().as_u16(), 429);
        drop(first);
        let _again = limits.admit(user, None, now).unwrap();
    }

    #[test]
    fn proven_agents_on_agent_routes_have_their_own_pool() {
        let limits = Admission::new(AdmissionConfig { max_in_flight: 1, max_agent_in_flight: 1, ..Default::default() });
        let now = Instant::now();
        limits.prove("agent", true);
        let agent = Some(key_of("agent"));
        assert_eq!(limits.caller("/v1/agent/nodes/x/heartbeat", agent, HOME, now), Caller::Agent);
        // an agent's token elsewhere, or an unknown token on an agent route, is not an agent's request
        assert_eq!(limits.caller("/v1/jobs", agent, HOME, now), Caller::User);
        let unknown = limits.caller("/v1/agent/nodes/x/heartbeat", Some(key_of("invented")), HOME, now);
        assert_eq!(unknown, Caller::Stranger(HOME));
        let _stranger = limits.admit(unknown, None, now).unwrap();
        assert_eq!(limits.admit(Caller::User, None, now).unwrap_err().status().as_u16(), 429, "users' pool full");
        let _heartbeat = limits.admit(Caller::Agent, None, now).unwrap();
        // proven only for a while, and no longer once it failed to authenticate
        let later = now + PROVEN_FOR + Duration::from_secs(1);
        assert_eq!(limits.caller("/v1/agent/nodes/x/heartbeat", agent, HOME, later), Caller::Stranger(HOME));
        limits.disprove("agent");
        assert_eq!(limits.caller("/v1/agent/nodes/x/heartbeat", agent, HOME, now), Caller::Stranger(HOME));
    }

    #[test]
    fn strangers_are_limited_per_address() {
        let limits = Admission::new(AdmissionConfig {
            max_in_flight_per_address: 2,
            address_rate_per_second: 1.0,
            address_rate_burst: 3.0,
            ..Default::default()
        });
        let now = Instant::now();
        let other = Some(IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 7)));
        let first = limits.admit(Caller::Stranger(HOME), None, now).unwrap();
        let _second = limits.admit(Caller::Stranger(HOME), None, now).unwrap();
        let busy = limits.admit(Caller::Stranger(HOME), None, now).unwrap_err();
        assert_eq!(busy.status().as_u16(), 429);
        let _elsewhere = limits.admit(Caller::Stranger(other), None, now).unwrap();
        drop(first);
        // the slot is free again, but the address has made its burst of three
        assert_eq!(limits.admit(Caller::Stranger(HOME), None, now).unwrap_err().status().as_u16(), 429);
        limits.admit(Caller::Stranger(HOME), None, now + Duration::from_secs(1)).unwrap();
        // a user behind the same address is not a stranger's request
        limits.admit(Caller::User, None, now).unwrap();
    }

    #[test]
    fn an_ipv6_caller_is_keyed_by_its_64_block() {
        let request = |ip: &str| {
            let mut request = Request::new(axum::body::Body::empty());
            let peer: SocketAddr = format!("[{ip}]:443").parse().unwrap();
            request.extensions_mut().insert(ConnectInfo(peer));
            address_key(&request)
        };
        assert_eq!(request("2001:db8:1:2::1"), request("2001:db8:1:2:ffff::9"));
        assert_ne!(request("2001:db8:1:2::1"), request("2001:db8:1:3::1"));
        assert_eq!(request("::ffff:192.0.2.1"), HOME);
        assert_eq!(address_key(&Request::new(axum::body::Body::empty())), None);
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
