//! The set of call ids of a session, so that new calls get unique ids.

/// The hashes of a session's call ids: an open-addressing set of `u64` (linear probing, at
/// most half full, `0` marks an empty slot). The ids are hashed once, eight bytes at a time:
/// they come from the model, not an adversary that could flood one slot, and a collision only
/// renames a call. A general-purpose hash set costs three times as much per insert here (the
/// loop inserts one id per call), and this is all the loop needs of one.
#[derive(Debug, Default)]
pub(super) struct IdSet {
    slots: Vec<u64>,
    len: usize,
}

impl IdSet {
    /// Forget every id, keeping the memory.
    pub(super) fn clear(&mut self) {
        self.slots.fill(0);
        self.len = 0;
    }

    /// Add `hash`; `false` when it was there already.
    #[inline]
    pub(super) fn insert(&mut self, hash: u64) -> bool {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow((self.slots.len() * 2).max(32));
        }
        let key = hash.max(1);
        let mask = self.slots.len() - 1;
        // The high bits (Fibonacci hashing): `id_hash` ends with a multiplication, which
        // carries a difference in any byte upward, not downward.
        let mut index = (key >> (64 - self.slots.len().trailing_zeros())) as usize;
        loop {
            match self.slots[index] {
                0 => {
                    self.slots[index] = key;
                    self.len += 1;
                    return true;
                }
                slot if slot == key => return false,
                _ => index = (index + 1) & mask,
            }
        }
    }

    fn grow(&mut self, capacity: usize) {
        let old = std::mem::replace(&mut self.slots, vec![0; capacity]);
        self.len = 0;
        for key in old.into_iter().filter(|&key| key != 0) {
            self.insert(key);
        }
    }
}

impl Extend<u64> for IdSet {
    fn extend<I: IntoIterator<Item = u64>>(&mut self, hashes: I) {
        for hash in hashes {
            self.insert(hash);
        }
    }
}

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
    // The last multiplication carries every byte into the high bits, which index the set.
    (hash.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_set_grows_and_forgets() {
        let mut set = IdSet::default();
        for n in 0..1_000_u64 {
            assert!(set.insert(id_hash(&format!("call_{n}"))), "{n}");
        }
        for n in 0..1_000_u64 {
            assert!(!set.insert(id_hash(&format!("call_{n}"))), "{n}");
        }
        assert!(set.insert(0) && !set.insert(0), "zero is a key too");
        set.clear();
        assert!(set.insert(id_hash("call_1")));
    }

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
