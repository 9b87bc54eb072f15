//! The set of call ids of a session, so that new calls get unique ids.

use std::collections::HashSet;

/// A set of call-id hashes. The ids are hashed once with FNV-1a (they come from the model,
/// not an adversary that could flood one bucket, and a collision only renames a call), so the
/// set itself needs no second hash.
pub(super) type IdSet = HashSet<u64, std::hash::BuildHasherDefault<PassThrough>>;

pub(super) fn id_hash(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A hasher for keys that are already hashes.
#[derive(Default)]
pub(super) struct PassThrough(u64);

impl std::hash::Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 << 8) | u64::from(byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}
