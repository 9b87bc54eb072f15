//! A fast set of tool-call ids, for the checks every round makes: the loop gives new calls
//! unique ids with it, and the patching layer checks a history's ids with it.

/// A set of tool-call ids that keeps only their 64-bit hashes: an open-addressing set (linear
/// probing, at most half full). Ids are hashed eight bytes at a time: they come from models,
/// not from an adversary that could flood one slot. Two different ids may, very rarely, hash
/// alike: [`CallIdSet::insert`] then reports the second as present, so use it where a false
/// "seen before" only costs a rename or a slower check, never where it would lose data. A
/// general-purpose hash set costs three times as much per insert here.
///
/// ```
/// use tower_agent_core::CallIdSet;
///
/// let mut ids = CallIdSet::default();
/// assert!(ids.insert("call_1"));
/// assert!(!ids.insert("call_1"), "seen before");
/// ids.clear();
/// assert!(ids.insert("call_1"));
/// ```
#[derive(Debug, Default, Clone)]
pub struct CallIdSet {
    slots: Vec<u64>,
    len: usize,
}

impl CallIdSet {
    /// Forget every id, keeping the memory.
    pub fn clear(&mut self) {
        self.slots.fill(0);
        self.len = 0;
    }

    /// How many ids it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Add `id`; `false` when it (or an id with the same hash) was there already.
    #[inline]
    pub fn insert(&mut self, id: &str) -> bool {
        self.insert_hash(id_hash(id))
    }

    #[inline]
    fn insert_hash(&mut self, hash: u64) -> bool {
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
            self.insert_hash(key);
        }
    }
}

impl<'a> Extend<&'a str> for CallIdSet {
    fn extend<I: IntoIterator<Item = &'a str>>(&mut self, ids: I) {
        for id in ids {
            self.insert(id);
        }
    }
}

fn id_hash(id: &str) -> u64 {
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
        let mut set = CallIdSet::default();
        for n in 0..1_000_u64 {
            assert!(set.insert(&format!("call_{n}")), "{n}");
        }
        for n in 0..1_000_u64 {
            assert!(!set.insert(&format!("call_{n}")), "{n}");
        }
        assert!(
            set.insert_hash(0) && !set.insert_hash(0),
            "zero is a key too"
        );
        set.clear();
        assert!(set.insert("call_1"));
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
        let mut set = CallIdSet::default();
        for id in ids {
            assert!(set.insert(id), "{id}");
        }
        assert!(!set.insert("call_1"));
        // Padding does not make a short id equal to a longer one.
        assert_ne!(id_hash("a"), id_hash("a\0"));
    }
}
