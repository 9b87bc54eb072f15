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

    #[cold]
    fn grow(&mut self, capacity: usize) {
        let old = std::mem::replace(&mut self.slots, vec![0; capacity]);
        let (mask, shift) = (capacity - 1, 64 - capacity.trailing_zeros());
        // Every key is new to the larger table: no growth check, no comparison.
        for key in old.into_iter().filter(|&key| key != 0) {
            let mut index = (key >> shift) as usize;
            while self.slots[index] != 0 {
                index = (index + 1) & mask;
            }
            self.slots[index] = key;
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

#[inline]
fn id_hash(id: &str) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let bytes = id.as_bytes();
    let len = bytes.len();
    let mut hash = (len as u64).wrapping_mul(K);
    // Whole words, then the last word read again overlapping the one before (the length is
    // in the hash, so the overlap cannot make two ids alike): no copy of a variable-length
    // tail, which costs a `memcpy` call.
    let last = if len >= 8 {
        let mut rest = bytes;
        while rest.len() > 8 {
            hash = (hash.rotate_left(5) ^ word(&rest[..8])).wrapping_mul(K);
            rest = &rest[8..];
        }
        word(&bytes[len - 8..])
    } else if len >= 4 {
        // The first and the last four bytes cover all of them.
        (u64::from(half(&bytes[..4])) << 32) | u64::from(half(&bytes[len - 4..]))
    } else if len > 0 {
        // The first, middle and last byte cover all of them.
        (u64::from(bytes[0]) << 16) | (u64::from(bytes[len / 2]) << 8) | u64::from(bytes[len - 1])
    } else {
        0
    };
    // The last multiplication carries every byte into the high bits, which index the set.
    (hash.rotate_left(5) ^ last).wrapping_mul(K)
}

/// Eight bytes as a word.
#[inline]
fn word(bytes: &[u8]) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(word)
}

/// Four bytes as a half word.
#[inline]
fn half(bytes: &[u8]) -> u32 {
    let mut half = [0; 4];
    half.copy_from_slice(&bytes[..4]);
    u32::from_le_bytes(half)
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
        // Every byte of every length counts: ids that differ in one place only.
        let mut hashes = std::collections::HashSet::new();
        for len in 0..=24 {
            let base = vec![b'a'; len];
            assert!(hashes.insert(id_hash(std::str::from_utf8(&base).unwrap())));
            for at in 0..len {
                let mut id = base.clone();
                id[at] = b'b';
                let id = String::from_utf8(id).unwrap();
                assert!(hashes.insert(id_hash(&id)), "{id}");
            }
        }
        // Padding does not make a short id equal to a longer one.
        assert_ne!(id_hash("a"), id_hash("a\0"));
    }
}
