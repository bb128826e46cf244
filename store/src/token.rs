//! Bearer tokens: random, shown once, stored only as their sha256.

use ringtrain_core::hex;
use sha2::{Digest, Sha256};

/// A fresh token: `rt_` and 64 hex digits (two v4 UUIDs, 244 random bits from the OS generator).
pub fn generate_token() -> String {
    format!("rt_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// The hex sha256 of a token: what the `tokens` table stores and looks up. A plain hash (no salt, no KDF) is
/// enough because the token itself has 244 bits of entropy; it cannot be guessed from its hash.
pub fn hash_token(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_and_hash_stably() {
        let a = generate_token();
        let b = generate_token();
        assert_ne!(a, b);
        assert_eq!(a.len(), 67);
        assert_eq!(hash_token(&a), hash_token(&a));
        assert_eq!(hash_token("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
