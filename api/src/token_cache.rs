//! Tokens this server has found, so that a request does not look its token up in the database each time:
//! at 16 concurrent submitters on Postgres the lookup was one of a submission's two statements. A
//! cached token must stop working when it is revoked, on every server, at once:
//!
//! - every revocation announces itself when its transaction commits (a `NOTIFY` on Postgres), and each
//!   server's listener ([`crate::AppState::listen_to_other_servers`]) then forgets every cached token;
//! - the cache is used only while that listener is listening: from its `LISTEN` being answered to the
//!   connection's loss. Before, after, and on SQLite (one server, no listener; `ringtrain admin reset-token`
//!   writes the file from another process), every request reads the database, as without a cache;
//! - a lookup that raced a revocation is not kept: each fill carries the generation it read under, and any
//!   forgetting moves the generation on, so a token read before a revocation committed is never cached after
//!   the revocation was heard;
//! - an entry lives at most [`MAX_AGE`], a bound for what no announcement reaches (a revocation written by
//!   hand in SQL). Expiry is checked on every request from the cached `expires_at`.
//!
//! Only tokens the database confirmed are kept (never unknown ones, which an attacker chooses), and at most
//! [`CAPACITY`] of them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use ringtrain_store::{Notice, TokenInfo};

/// How long a cached token is trusted without the database, announcements or not.
pub const MAX_AGE: Duration = Duration::from_secs(60);
/// The most tokens kept; beyond it requests read the database until the cache is next emptied.
pub const CAPACITY: usize = 65_536;

#[derive(Debug, Default)]
pub struct TokenCache {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The listener hears revocations now.
    listening: bool,
    /// Moves on whenever the cache forgets: a fill read under an older one may predate a revocation.
    generation: u64,
    /// By the token's hash.
    tokens: HashMap<String, Cached>,
}

#[derive(Debug)]
struct Cached {
    info: TokenInfo,
    at: Instant,
}

/// What [`TokenCache::find`] knows of a token.
#[derive(Debug)]
pub enum Found {
    Cached(TokenInfo),
    /// Read the database, and give its answer to [`TokenCache::fill`] with this.
    Unknown(Fill),
}

/// Permission to cache what the database answers, valid while nothing was forgotten since it was given.
#[derive(Debug)]
pub struct Fill {
    generation: u64,
}

impl TokenCache {
    pub fn find(&self, token_hash: &str) -> Found {
        let inner = self.lock();
        match inner.tokens.get(token_hash) {
            Some(cached) if inner.listening && cached.at.elapsed() < MAX_AGE => Found::Cached(cached.info.clone()),
            _ => Found::Unknown(Fill { generation: inner.generation }),
        }
    }

    /// Whether revocations are heard now, and so tokens cached.
    pub fn is_listening(&self) -> bool {
        self.lock().listening
    }

    /// Keeps a token the database just confirmed (live, not revoked), unless the cache forgot since `fill`
    /// was given or is not listening.
    pub fn fill(&self, fill: Fill, token_hash: &str, info: &TokenInfo) {
        let mut inner = self.lock();
        if !inner.listening || inner.generation != fill.generation || info.revoked_at.is_some() {
            return;
        }
        if inner.tokens.len() >= CAPACITY && !inner.tokens.contains_key(token_hash) {
            inner.tokens.retain(|_, cached| cached.at.elapsed() < MAX_AGE);
            if inner.tokens.len() >= CAPACITY {
                return;
            }
        }
        inner.tokens.insert(token_hash.to_string(), Cached { info: info.clone(), at: Instant::now() });
    }

    /// The token's use was recorded at `at`: the cached copy says so too, or every later request would
    /// record it again.
    pub fn used(&self, token_hash: &str, at: DateTime<Utc>) {
        if let Some(cached) = self.lock().tokens.get_mut(token_hash) {
            cached.info.last_used_at = Some(at);
        }
    }

    /// A token was revoked through this server: forgotten before the revoking request answers, without
    /// waiting for the announcement to come back.
    pub fn revoked(&self) {
        self.forget(|_| {});
    }

    /// What the listener heard.
    pub fn heard(&self, notice: Notice) {
        match notice {
            Notice::Listening => self.forget(|inner| inner.listening = true),
            Notice::Lost => self.forget(|inner| inner.listening = false),
            Notice::TokenRevoked => self.forget(|_| {}),
            Notice::Changed => {}
        }
    }

    fn forget(&self, also: impl FnOnce(&mut Inner)) {
        let mut inner = self.lock();
        inner.generation += 1;
        inner.tokens.clear();
        also(&mut inner);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // the map is consistent after every statement: a panic elsewhere never leaves it half-written
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use ringtrain_core::{TeamId, TokenId};
    use ringtrain_store::Role;
    use uuid::Uuid;

    use super::*;

    fn token() -> TokenInfo {
        TokenInfo {
            id: TokenId(Uuid::new_v4()),
            role: Role::Member,
            team_id: Some(TeamId(Uuid::new_v4())),
            platform: false,
            label: None,
            created_at: Utc::now(),
            expires_at: None,
            last_used_at: None,
            revoked_at: None,
        }
    }

    fn fill_from_database(cache: &TokenCache, hash: &str, info: &TokenInfo) {
        match cache.find(hash) {
            Found::Unknown(fill) => cache.fill(fill, hash, info),
            Found::Cached(_) => panic!("{hash} was cached already"),
        }
    }

    fn is_cached(cache: &TokenCache, hash: &str) -> bool {
        matches!(cache.find(hash), Found::Cached(_))
    }

    #[test]
    fn nothing_is_cached_until_the_listener_listens_nor_after_it_is_lost() {
        let (cache, info) = (TokenCache::default(), token());
        fill_from_database(&cache, "a", &info);
        assert!(!is_cached(&cache, "a"), "cached with nobody listening for revocations (SQLite, or not yet)");

        cache.heard(Notice::Listening);
        fill_from_database(&cache, "a", &info);
        match cache.find("a") {
            Found::Cached(found) => assert_eq!(found.id, info.id),
            Found::Unknown(_) => panic!("a confirmed token was not cached while listening"),
        }

        cache.heard(Notice::Lost);
        assert!(!is_cached(&cache, "a"), "a lost listener may have missed a revocation");
        fill_from_database(&cache, "a", &info);
        assert!(!is_cached(&cache, "a"));
    }

    #[test]
    fn a_revocation_heard_or_made_here_forgets_every_token() {
        let cache = TokenCache::default();
        cache.heard(Notice::Listening);
        fill_from_database(&cache, "a", &token());
        fill_from_database(&cache, "b", &token());
        cache.heard(Notice::Changed);
        assert!(is_cached(&cache, "a") && is_cached(&cache, "b"), "a job's change is no token's");
        cache.heard(Notice::TokenRevoked);
        assert!(!is_cached(&cache, "a") && !is_cached(&cache, "b"));

        fill_from_database(&cache, "a", &token());
        cache.revoked();
        assert!(!is_cached(&cache, "a"));
    }

    #[test]
    fn a_lookup_that_raced_a_revocation_is_not_kept() {
        let (cache, info) = (TokenCache::default(), token());
        cache.heard(Notice::Listening);
        // the request read the database before the revocation committed, and fills after it was heard
        let Found::Unknown(fill) = cache.find("a") else { panic!("cached") };
        cache.heard(Notice::TokenRevoked);
        cache.fill(fill, "a", &info);
        assert!(!is_cached(&cache, "a"), "a token read before its revocation outlived it in the cache");
        // a reconnect in between is a forgetting too
        let Found::Unknown(fill) = cache.find("a") else { panic!("cached") };
        cache.heard(Notice::Lost);
        cache.heard(Notice::Listening);
        cache.fill(fill, "a", &info);
        assert!(!is_cached(&cache, "a"));
    }

    #[test]
    fn a_use_recorded_is_remembered_and_a_revoked_token_is_never_kept() {
        let (cache, info) = (TokenCache::default(), token());
        cache.heard(Notice::Listening);
        fill_from_database(&cache, "a", &info);
        let at = Utc::now();
        cache.used("a", at);
        let Found::Cached(found) = cache.find("a") else { panic!("not cached") };
        assert_eq!(found.last_used_at, Some(at));

        let revoked = TokenInfo { revoked_at: Some(at), ..token() };
        fill_from_database(&cache, "r", &revoked);
        assert!(!is_cached(&cache, "r"));
    }
}
