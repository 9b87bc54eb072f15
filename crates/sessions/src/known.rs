//! What a store knows it holds already, so that a save writes only what changed: for each
//! session it saved or loaded last, the version, the row's incarnation and a mark of the
//! history.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tower_agent_core::{HistoryMark, Session};

use crate::Version;

/// How many sessions a store remembers; past that it forgets them all (a forgotten session's
/// next save rewrites its history once).
const REMEMBERED: usize = 4096;

/// A stored session as this store last wrote or read it.
#[derive(Debug, Clone)]
struct Known {
    version: Version,
    incarnation: String,
    mark: HistoryMark,
}

/// The sessions a store wrote or read last, by id.
#[derive(Debug, Default)]
pub(crate) struct KnownHistories(Mutex<HashMap<String, Known>>);

impl KnownHistories {
    /// How many of `session`'s first messages the store holds already, when its row is at
    /// `version` of `incarnation`: 0 when this store did not write or read that very row (or
    /// the history was edited before the end of what it holds).
    pub(crate) fn stored(&self, session: &Session, version: Version, incarnation: &str) -> usize {
        let known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match known.get(&session.id) {
            Some(k) if k.version == version && k.incarnation == incarnation => {
                session.history.kept(&k.mark)
            }
            _ => 0,
        }
    }

    /// The store holds `session` at `version` of `incarnation` now.
    pub(crate) fn record(&self, session: &Session, version: Version, incarnation: &str) {
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if known.len() >= REMEMBERED && !known.contains_key(&session.id) {
            known.clear();
        }
        let entry = Known {
            version,
            incarnation: incarnation.to_owned(),
            mark: session.history.mark(),
        };
        known.insert(session.id.clone(), entry);
    }

    /// The store holds no session `id` any more.
    pub(crate) fn forget(&self, id: &str) {
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        known.remove(id);
    }
}

/// The smallest string above every string that starts with `prefix` (in byte order, which is
/// code-point order in UTF-8); `None` when there is none (an empty prefix, or only
/// `char::MAX`).
pub(crate) fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (last as u32 + 1..=char::MAX as u32).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use tower_agent_core::Message;

    use super::*;

    #[test]
    fn the_end_of_a_prefix_is_above_all_its_strings_and_below_the_rest() {
        assert_eq!(prefix_end("user-7/").as_deref(), Some("user-70"));
        assert_eq!(prefix_end(""), None);
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end("\u{D7FF}").as_deref(), Some("\u{E000}"));
        let end = prefix_end("ab").expect("an end");
        for inside in ["ab", "ab\u{10FFFF}", "abz"] {
            assert!(inside < end.as_str(), "{inside}");
        }
        assert!("ac" >= end.as_str());
    }

    #[test]
    fn a_save_knows_what_it_holds_only_for_the_same_version_and_incarnation() {
        let known = KnownHistories::default();
        let mut session = Session::with_id("s");
        session.history.push(Message::user("1"));
        known.record(&session, Version(1), "i1");
        session.history.push(Message::user("2"));
        assert_eq!(known.stored(&session, Version(1), "i1"), 1);
        assert_eq!(
            known.stored(&session, Version(2), "i1"),
            0,
            "another writer"
        );
        assert_eq!(
            known.stored(&session, Version(1), "i2"),
            0,
            "deleted, made again"
        );
        session.history.make_mut()[0] = Message::user("edited");
        assert_eq!(known.stored(&session, Version(1), "i1"), 0);
        known.forget("s");
        assert_eq!(known.stored(&session, Version(1), "i1"), 0);
    }
}
