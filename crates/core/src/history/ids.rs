//! The call ids a history has used, to tell a new id from a taken one.

use std::collections::HashSet;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::OnceLock;

use foldhash::fast::FixedState;

use crate::message::Message;

/// The call ids a history has used, each kept as a 64-bit hash of it: 8 bytes an id, not a
/// copy of it, in a set a run keeps for its whole life ([`Repair::check`](super::Repair::check),
/// the agent's check that a model's new call does not reuse an id).
///
/// The hash's seed is drawn once per process (a hash is never saved), so ids cannot be chosen
/// to collide. Two that do anyway count as one: the second is taken for a reused id, which
/// costs a needless repair or a new id, never a lost call.
///
/// ```
/// use serde_json::json;
/// use tower_agent_core::{CallIds, Message, ToolCall};
///
/// let history = [Message::assistant_with_calls("", [ToolCall::new("c1", "t", json!({}))])];
/// let mut ids = CallIds::of(&history);
/// assert!(!ids.insert("c1"), "taken");
/// assert!(ids.insert("c2"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallIds(HashSet<u64, FixedState>);

impl CallIds {
    /// No id used yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The ids of the calls in `messages`.
    pub fn of<'a>(messages: impl IntoIterator<Item = &'a Message>) -> Self {
        let mut ids = Self::new();
        for call in messages.into_iter().flat_map(Message::tool_calls) {
            ids.insert(&call.id);
        }
        ids
    }

    /// Take `id`: `false` when it was taken already.
    pub fn insert(&mut self, id: &str) -> bool {
        self.0.insert(hash(id))
    }

    /// Whether `id` is taken.
    pub fn contains(&self, id: &str) -> bool {
        self.0.contains(&hash(id))
    }

    /// Forget every id.
    pub fn clear(&mut self) {
        self.0.clear();
    }
}

fn hash(id: &str) -> u64 {
    // One seed for the process: an id hashes alike in every set, so a taken id stays taken.
    static SEED: OnceLock<FixedState> = OnceLock::new();
    SEED.get_or_init(|| FixedState::with_seed(RandomState::new().hash_one(0_u64)))
        .hash_one(id)
}
