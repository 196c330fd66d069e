//! Pool and lease UUIDs are bearer credentials: at rest only their SHA-256
//! digests are stored, and in logs only a short prefix appears.

use std::fmt;

use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::domain::LeaseDigest;

/// The client-chosen pool UUID.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PoolId(pub Uuid);

/// A lease UUID: chosen by the client (which makes a borrow idempotent and
/// its wait cancellable) or else by the server.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(pub Uuid);

/// What the store is keyed by: the first 16 bytes of the SHA-256 of the pool
/// UUID's 16 bytes (128 bits: no two pools ever share one, and the UUID
/// cannot be found from it).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey(pub [u8; 16]);

impl PoolId {
    pub fn key(&self) -> PoolKey {
        let full = Sha256::digest(self.0.as_bytes());
        let mut key = [0u8; 16];
        key.copy_from_slice(&full[..16]);
        PoolKey(key)
    }

    /// The form the API echoes: hyphenated lowercase.
    pub fn to_hyphenated(&self) -> String {
        self.0.hyphenated().to_string()
    }
}

impl LeaseId {
    pub fn new_random() -> Self {
        LeaseId(Uuid::new_v4())
    }

    pub fn digest(&self) -> LeaseDigest {
        let full = Sha256::digest(self.0.as_bytes());
        let mut short = [0u8; 8];
        short.copy_from_slice(&full[..8]);
        LeaseDigest(short)
    }
}

impl PoolKey {
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

pub use semaphore_wire::short;

fn redacted(f: &mut fmt::Formatter<'_>, uuid: &Uuid) -> fmt::Result {
    write!(f, "{}…", short(uuid))
}

impl fmt::Debug for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        redacted(f, &self.0)
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        redacted(f, &self.0)
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        redacted(f, &self.0)
    }
}

impl fmt::Debug for PoolKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}…", &self.to_hex()[..8])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01";

    #[test]
    fn key_is_sha256_of_uuid_bytes_and_case_insensitive() {
        let lower = PoolId(Uuid::parse_str(ID).unwrap());
        let upper = PoolId(Uuid::parse_str(&ID.to_uppercase()).unwrap());
        assert_eq!(lower.key(), upper.key());
        assert_eq!(lower.key().to_hex().len(), 32);
        assert!(!lower.key().to_hex().contains("9f1c2e7a"));
    }

    #[test]
    fn logs_never_show_the_whole_uuid() {
        let id = PoolId(Uuid::parse_str(ID).unwrap());
        assert_eq!(format!("{id}"), "9f1c2e7a…");
        assert_eq!(format!("{id:?}"), "9f1c2e7a…");
        let lease = LeaseId(Uuid::parse_str(ID).unwrap());
        assert_eq!(format!("{lease:?}"), "9f1c2e7a…");
    }

    #[test]
    fn lease_digests_differ_per_lease() {
        let a = LeaseId::new_random();
        let b = LeaseId::new_random();
        assert_ne!(a.digest(), b.digest());
        assert_eq!(a.digest(), LeaseId(a.0).digest());
    }
}
