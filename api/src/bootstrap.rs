//! The first admin token: a platform admin (creates teams, sets quotas, mints agent tokens), and an admin of
//! the team `default`. On an empty database `ringtrain serve` creates that team and the token and prints
//! the token once; with `RINGTRAIN_BOOTSTRAP_TOKEN` set, that token is made instead (idempotently), so
//! scripted set-ups know it in advance.

use ringtrain_store::{generate_token, hash_token, NewTeam, NewToken, Role, Store, StoreError, StoreResult, Team};

pub const DEFAULT_TEAM: &str = "default";
/// The default team's quotas: large, so a single-machine set-up is limited by its devices, not its quota.
pub const DEFAULT_QUOTA: i32 = 1024;

/// A preset bootstrap token must be as hard to guess as a generated one: at least 32 characters, not a
/// repetition of a few.
pub fn check_preset(token: &str) -> Result<(), String> {
    let distinct = token.chars().collect::<std::collections::BTreeSet<_>>().len();
    if token.chars().count() < 32 || distinct < 10 {
        Err(format!(
            "RINGTRAIN_BOOTSTRAP_TOKEN must be at least 32 random characters (got {} characters, {distinct} distinct): \
             it is a platform admin's token",
            token.chars().count()
        ))
    } else {
        Ok(())
    }
}

/// Returns the token to print: Some only when a new token was generated here.
pub async fn bootstrap(store: &dyn Store, preset: Option<&str>) -> StoreResult<Option<String>> {
    match preset {
        Some(token) => {
            if store.find_token(&hash_token(token)).await?.is_none() {
                let team = default_team(store).await?;
                create_admin(store, team.id, token).await?;
            }
            Ok(None)
        }
        None => {
            if store.get_team_by_name(DEFAULT_TEAM).await?.is_some() {
                return Ok(None);
            }
            let team = default_team(store).await?;
            let token = generate_token();
            create_admin(store, team.id, &token).await?;
            Ok(Some(token))
        }
    }
}

/// What [`reset_admin_token`] did.
#[derive(Debug)]
pub struct Reset {
    /// The new platform admin token (shown once; only its hash is stored).
    pub token: String,
    /// How many other platform tokens it revoked.
    pub revoked: usize,
}

/// A new platform admin token, in team `default` (made again if it was deleted): `ringtrain admin
/// reset-token` on the server host, when the platform admin's token is lost. No token can mint one through
/// the API, so the database itself is the authority. With `revoke_others`, every other live platform token
/// is revoked (a lost token may be in someone else's hands).
pub async fn reset_admin_token(store: &dyn Store, revoke_others: bool) -> StoreResult<Reset> {
    let team = default_team(store).await?;
    let token = generate_token();
    let new = NewToken {
        token_hash: hash_token(&token),
        role: Role::Admin,
        team_id: Some(team.id),
        platform: true,
        label: Some("reset on the server host".into()),
        expires_at: None,
    };
    // made before any is revoked: a failure half way never leaves the platform without an admin
    let made = store.create_token(new).await?;
    let mut revoked = 0;
    if revoke_others {
        let now = chrono::Utc::now();
        for team in store.list_teams().await? {
            for old in store.list_tokens(Some(team.id)).await? {
                if old.id != made.id && old.platform && old.is_live(now) && store.revoke_token(old.id, now).await? {
                    revoked += 1;
                }
            }
        }
    }
    Ok(Reset { token, revoked })
}

async fn default_team(store: &dyn Store) -> StoreResult<Team> {
    if let Some(team) = store.get_team_by_name(DEFAULT_TEAM).await? {
        return Ok(team);
    }
    let new = NewTeam {
        name: DEFAULT_TEAM.into(),
        gpu_quota: DEFAULT_QUOTA,
        cpu_quota: DEFAULT_QUOTA,
        storage_quota_bytes: None,
    };
    match store.create_team(new).await {
        Ok(team) => Ok(team),
        // Another replica created it first.
        Err(StoreError::Conflict(_)) => store
            .get_team_by_name(DEFAULT_TEAM)
            .await?
            .ok_or_else(|| StoreError::Corrupt("team default vanished".into())),
        Err(err) => Err(err),
    }
}

async fn create_admin(store: &dyn Store, team_id: ringtrain_core::TeamId, token: &str) -> StoreResult<()> {
    let new = NewToken {
        token_hash: hash_token(token),
        role: Role::Admin,
        team_id: Some(team_id),
        platform: true,
        label: Some("bootstrap admin".into()),
        expires_at: None,
    };
    match store.create_token(new).await {
        Ok(_) | Err(StoreError::Conflict(_)) => Ok(()),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::check_preset;

    #[test]
    fn short_or_repetitive_preset_tokens_are_refused() {
        assert!(check_preset("admin").unwrap_err().contains("at least 32"));
        assert!(check_preset(&"a".repeat(40)).is_err());
        assert!(check_preset("rt_e2e_admin_token_0123456789abcdef").is_ok());
        assert!(check_preset(&ringtrain_store::generate_token()).is_ok());
    }
}
