//! The set of call ids of a session, so that new calls get unique ids.

use std::collections::HashSet;

/// A set of call-id hashes. The ids are hashed once, eight bytes at a time (they come from the
/// model, not an adversary that could flood one bucket, and a collision only renames a call),
/// so the set itself needs no second hash.
pub(super) type IdSet = HashSet<u64, std::hash::BuildHasherDefault<PassThrough>>;

pub(super) fn id_hash(id: &str) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let bytes = id.as_bytes();
    let mut hash = (bytes.len() as u64).wrapping_mul(K);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        hash = (hash.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    }
    let mut word = [0; 8];
    word[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    hash = (hash.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    // The table indexes by the low bits and filters by the high ones: mix both.
    hash ^ (hash >> 29)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_differ_anywhere_hash_apart() {
        let ids = [
            "",
            "a",
            "b",
            "call_1",
            "call_2",
            "call_12345678",
            "call_12345679",
            "toolu_01A",
        ];
        let mut set = IdSet::default();
        for id in ids {
            assert!(set.insert(id_hash(id)), "{id}");
        }
        assert!(!set.insert(id_hash("call_1")));
        // Padding does not make a short id equal to a longer one.
        assert_ne!(id_hash("a"), id_hash("a\0"));
    }
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
