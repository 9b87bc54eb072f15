//! The conversation history: shared copy-on-write, checked and repaired for tool-call
//! validity, and able to say what changed since a mark.

mod blocks;
mod fold;
mod ids;
mod mark;
mod repair;
mod validate;

use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::message::{Message, Role, ToolCall};

pub use blocks::CallBlock;
pub use fold::HistoryFold;
pub use ids::CallIds;
pub use mark::HistoryMark;
pub use repair::{Repair, RepairReport, Unanswered};
pub use validate::{HistoryError, validate};

use blocks::{call_blocks, call_position};
use mark::Lineage;

/// The messages of a session, shared copy-on-write.
///
/// Cloning a `History` is O(1): it bumps a reference count. The agent hands the history to
/// the model every round this way, and appends to it with [`History::push`] once the request
/// is dropped, which then mutates in place. A layer that edits the history it received in a
/// [`ModelRequest`](crate::ModelRequest) gets its own copy (the first edit copies), so the
/// edit shapes that request only and never the session; see
/// [`ModelResponse::commit`](crate::ModelResponse::commit) for edits meant to last.
///
/// ```
/// use tower_agent_core::{History, Message};
///
/// let mut history = History::new();
/// history.push(Message::user("hi"));
/// let shared = history.clone(); // O(1)
/// history.push(Message::assistant("hello")); // copies: `shared` still holds one message
/// assert_eq!(shared.len(), 1);
/// assert_eq!(history.len(), 2);
/// ```
///
/// # What changed since a mark
///
/// A layer or a provider that keeps work per message across the rounds of a run (a token
/// count, a validity check, encoded bytes) takes a [`HistoryMark`] and asks the next round's
/// history how much of the marked one it still starts with ([`History::kept`],
/// [`History::since`]): only the rest is new. The answer comes from how the history was
/// edited, not from comparing messages: appending keeps everything, an edit through
/// [`History::tail_mut`] keeps what stands before it, any other edit (and a history built
/// anew) keeps nothing. It is never too high; it may be low (then the caller redoes work it
/// did not need to).
///
/// ```
/// use tower_agent_core::{History, Message};
///
/// let mut history = History::from(vec![Message::user("hi")]);
/// let mark = history.mark();
/// let request = history.clone(); // the model request of this round holds a clone
/// history.push(Message::assistant("hello")); // copies, and still starts like the mark
/// assert_eq!(history.since(&mark).map(<[Message]>::len), Some(1));
/// assert_eq!(request.kept(&history.mark()), 1, "the request is a prefix of the new history");
///
/// history.tail_mut(0)[0] = Message::user("hello?"); // an edit of the first message
/// assert!(history.since(&mark).is_none());
/// ```
#[derive(Clone)]
pub struct History(Arc<Inner>);

#[derive(Clone)]
struct Inner {
    messages: Vec<Message>,
    lineage: Lineage,
}

impl Inner {
    fn new(messages: Vec<Message>) -> Self {
        Inner {
            messages,
            lineage: Lineage::new(None),
        }
    }
}

impl Default for History {
    fn default() -> Self {
        Self::from(Vec::new())
    }
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append a message (copies first only if another clone is alive).
    pub fn push(&mut self, message: Message) {
        let len = self.len();
        self.edit(len).push(message);
    }

    /// Append messages.
    pub fn extend(&mut self, messages: impl IntoIterator<Item = Message>) {
        let len = self.len();
        self.edit(len).extend(messages);
    }

    /// Mutable access to the messages (copies first only if another clone is alive). A mark
    /// taken before keeps nothing of this history afterwards; to edit only the last messages,
    /// use [`History::tail_mut`].
    pub fn make_mut(&mut self) -> &mut Vec<Message> {
        self.edit(0)
    }

    /// Mutable access to the messages from `start` on (all of them when `start` is past the
    /// end, none): the ones before are known unchanged to a mark taken before.
    pub fn tail_mut(&mut self, start: usize) -> &mut [Message] {
        let start = start.min(self.len());
        &mut self.edit(start)[start..]
    }

    /// The messages, for an edit that keeps the first `kept`: in place when nothing else
    /// holds them and nothing is kept back, else under a new lineage that records `kept`.
    fn edit(&mut self, kept: usize) -> &mut Vec<Message> {
        let len = self.0.messages.len();
        let in_place = kept >= len && Arc::get_mut(&mut self.0).is_some();
        let parent = self.0.lineage;
        let inner = Arc::make_mut(&mut self.0);
        if !in_place {
            inner.lineage = Lineage::new(Some((parent.id, kept.min(len))));
        }
        &mut inner.messages
    }

    /// Replace the messages with `messages`, which start with the first `kept` of them.
    fn replace(&mut self, messages: Vec<Message>, kept: usize) {
        let parent = self.0.lineage;
        self.0 = Arc::new(Inner {
            messages,
            lineage: Lineage::new(Some((parent.id, kept))),
        });
    }

    /// The messages.
    pub fn as_slice(&self) -> &[Message] {
        &self.0.messages
    }

    /// The messages as an owned vector (no copy if this is the only clone).
    pub fn into_vec(self) -> Vec<Message> {
        Arc::unwrap_or_clone(self.0).messages
    }

    /// Whether `self` and `other` share the same storage (no copy happened between them).
    pub fn ptr_eq(&self, other: &History) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The calls of the last assistant message that wait for a result: the history ends with
    /// that message and tool messages, and none of those answers them. Empty when anything
    /// else follows the last assistant message.
    pub fn open_calls(&self) -> Vec<&ToolCall> {
        let Some(start) = self.iter().rposition(|m| m.role != Role::Tool) else {
            return Vec::new();
        };
        call_blocks(self, start)
            .next()
            .map(|block| block.unanswered().collect())
            .unwrap_or_default()
    }

    /// Every assistant message that asks for tool calls, with the tool messages right after
    /// it, in order: what the loop and validity checks walk.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::{History, Message, ToolCall, ToolResult};
    ///
    /// let (a, b) = (ToolCall::new("a", "t", json!({})), ToolCall::new("b", "t", json!({})));
    /// let history = History::from(vec![
    ///     Message::user("go"),
    ///     Message::assistant_with_calls("", [a.clone(), b]),
    ///     Message::tool_result(ToolResult::success(&a, "ok")),
    /// ]);
    /// let blocks: Vec<_> = history.call_blocks().collect();
    /// assert_eq!((blocks.len(), blocks[0].index, blocks[0].at_end), (1, 1, true));
    /// let open: Vec<_> = blocks[0].unanswered().map(|c| c.id.as_str()).collect();
    /// assert_eq!(open, ["b"]);
    /// ```
    pub fn call_blocks(&self) -> impl Iterator<Item = CallBlock<'_>> {
        call_blocks(self, 0)
    }

    /// Repair the history as `how` says: every call answered exactly once (or dropped), right
    /// after its assistant message and in call order, no orphan result, no call id empty or
    /// used twice. Copies nothing when there is nothing to repair. This is the one repair of
    /// a history: the agent repairs every run's input with it, and the patch layer every
    /// session and model request; see [`Repair`].
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::{History, Message, Repair, ToolCall, ToolResult};
    ///
    /// let call = ToolCall::new("c1", "search", json!({}));
    /// let mut history = History::from(vec![
    ///     Message::user("find it"),
    ///     Message::assistant_with_calls("", [call]),
    ///     Message::user("never mind"),
    /// ]);
    /// let report = history.repair(&Repair::new());
    /// assert_eq!(report.answered, 1);
    /// let result = history[2].tool_results().next().expect("placed right after its call");
    /// assert_eq!(result.content, ToolResult::UNANSWERED);
    /// assert_eq!(history[3].text(), "never mind");
    /// assert!(history.validate().is_ok());
    /// ```
    pub fn repair(&mut self, how: &Repair<'_>) -> RepairReport {
        let start = how.start(self);
        if how.check(self, start, &mut CallIds::new()) {
            return RepairReport::default();
        }
        let (repaired, report) = how.rebuild(&self[start..]);
        let kept = start
            + self[start..]
                .iter()
                .zip(&repaired)
                .take_while(|(a, b)| a == b)
                .count();
        let mut messages = Vec::with_capacity(start + repaired.len());
        messages.extend_from_slice(&self[..start]);
        messages.extend(repaired);
        self.replace(messages, kept);
        report
    }

    /// Put the tool messages after the last assistant message in the order of its calls
    /// (results of calls that waited for a decision are appended when they come). Copies
    /// nothing when they already are.
    pub fn order_results(&mut self) {
        let Some(start) = self.iter().rposition(|m| m.role != Role::Tool) else {
            return;
        };
        if self[start].role != Role::Assistant {
            return;
        }
        let calls = &self[start];
        if self[start + 1..].is_sorted_by_key(|m| call_position(m, calls)) {
            return;
        }
        let calls = calls.clone();
        self.tail_mut(start + 1)
            .sort_by_key(|m| call_position(m, &calls));
    }

    /// Check that every tool call is answered exactly once and no result is an orphan.
    ///
    /// # Errors
    ///
    /// The first [`HistoryError`] found.
    pub fn validate(&self) -> Result<(), HistoryError> {
        validate(self, &[])
    }
}

impl PartialEq for History {
    fn eq(&self, other: &Self) -> bool {
        self.ptr_eq(other) || self.0.messages == other.0.messages
    }
}

impl Eq for History {}

impl Deref for History {
    type Target = [Message];

    fn deref(&self) -> &[Message] {
        &self.0.messages
    }
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.messages.iter()).finish()
    }
}

impl From<Vec<Message>> for History {
    fn from(messages: Vec<Message>) -> Self {
        Self(Arc::new(Inner::new(messages)))
    }
}

impl FromIterator<Message> for History {
    fn from_iter<I: IntoIterator<Item = Message>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> IntoIterator for &'a History {
    type Item = &'a Message;
    type IntoIter = std::slice::Iter<'a, Message>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.messages.iter()
    }
}

impl Serialize for History {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.messages.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for History {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<Message>::deserialize(deserializer).map(History::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{ToolCall, ToolResult};
    use serde_json::json;

    /// A call of tool `t` with id `id`, no arguments.
    pub(super) fn call(id: &str) -> ToolCall {
        ToolCall::new(id, "t", json!({}))
    }

    /// A successful result of call `id`.
    pub(super) fn answer(id: &str) -> Message {
        Message::tool_result(ToolResult::success(&call(id), "ok"))
    }

    pub(super) fn ids(message: &Message) -> Vec<&str> {
        message
            .tool_results()
            .map(|r| r.call_id.as_str())
            .chain(message.tool_calls().map(|c| c.id.as_str()))
            .collect()
    }

    #[test]
    fn open_calls_are_those_of_the_last_message_only() {
        let waiting = History::from(vec![
            Message::assistant_with_calls("", [call("a"), call("b")]),
            answer("b"),
        ]);
        assert_eq!(
            waiting
                .open_calls()
                .iter()
                .map(|c| c.id.as_str())
                .collect::<Vec<_>>(),
            ["a"]
        );
        let moved_on = History::from(vec![
            Message::assistant_with_calls("", [call("a")]),
            Message::user("x"),
        ]);
        assert!(moved_on.open_calls().is_empty());
        let mut unordered = History::from(vec![
            Message::assistant_with_calls("", [call("a"), call("b")]),
            answer("b"),
            answer("a"),
        ]);
        unordered.order_results();
        assert_eq!(ids(&unordered[1]), ["a"]);
        assert_eq!(ids(&unordered[2]), ["b"]);
    }

    #[test]
    fn serializes_as_a_plain_array() {
        let h = History::from(vec![Message::user("hi")]);
        let json = serde_json::to_value(&h).unwrap();
        assert!(json.is_array());
        let back: History = serde_json::from_value(json).unwrap();
        assert_eq!(back, h);
    }
}
