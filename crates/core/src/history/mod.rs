//! The conversation history: shared copy-on-write, checked and repaired for tool-call
//! validity, and able to say what changed since a mark.

mod repair;

use std::collections::{HashMap, HashSet};
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::message::{Message, Role, ToolCall};

pub use repair::{Repair, RepairReport, Unanswered};

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

/// Which histories share a start: every `History` with the same `id` holds the very same
/// messages (one `Arc`, or a copy made when another clone was alive, which gets a new `id`);
/// `parent` says which history this one was copied or edited from, and how many of its first
/// messages were kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lineage {
    id: u64,
    parent: Option<(u64, usize)>,
}

impl Lineage {
    fn new(parent: Option<(u64, usize)>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Lineage {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            parent,
        }
    }
}

impl Inner {
    fn new(messages: Vec<Message>) -> Self {
        Inner {
            messages,
            lineage: Lineage::new(None),
        }
    }
}

/// Where a history stood when [`History::mark`] was called: enough to tell later how much of
/// it another history still starts with. Small and `Copy`; it holds no message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryMark {
    lineage: Lineage,
    len: usize,
}

impl HistoryMark {
    /// How many messages the marked history held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the marked history was empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The mark of the marked history's first `len` messages (all of them when it held
    /// fewer): for work done on a part of a history.
    pub fn up_to(self, len: usize) -> HistoryMark {
        HistoryMark {
            len: len.min(self.len),
            ..self
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

    /// Where this history stands now; see [what changed since a mark](History#what-changed-since-a-mark).
    pub fn mark(&self) -> HistoryMark {
        HistoryMark {
            lineage: self.0.lineage,
            len: self.len(),
        }
    }

    /// How many of the marked history's first messages this history starts with, as far as
    /// its edits tell (never more than either holds; 0 when they share nothing known).
    pub fn kept(&self, mark: &HistoryMark) -> usize {
        let (this, that) = (self.0.lineage, mark.lineage);
        let shared = if this.id == that.id {
            usize::MAX
        } else {
            match (this.parent, that.parent) {
                (Some((parent, kept)), _) if parent == that.id => kept,
                (_, Some((parent, kept))) if parent == this.id => kept,
                (Some((a, kept_a)), Some((b, kept_b))) if a == b => kept_a.min(kept_b),
                _ => 0,
            }
        };
        shared.min(mark.len).min(self.len())
    }

    /// The messages added since `mark`, when this history still starts with all of the
    /// marked one; `None` when it was edited before the mark's end (or shares nothing known).
    pub fn since(&self, mark: &HistoryMark) -> Option<&[Message]> {
        (self.kept(mark) == mark.len).then(|| &self[mark.len..])
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
        if how.check(self, start, &mut HashSet::new()) {
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

/// An assistant message that asks for tool calls, and the tool messages right after it.
#[derive(Debug, Clone, Copy)]
pub struct CallBlock<'a> {
    /// The index of the assistant message in the history.
    pub index: usize,
    /// The assistant message.
    pub message: &'a Message,
    /// The tool messages right after it (its results, unless the history is broken).
    pub results: &'a [Message],
    /// Whether the history ends with these results: calls without one may still wait for a
    /// decision here, nowhere else.
    pub at_end: bool,
}

impl<'a> CallBlock<'a> {
    /// Whether one of the tool messages right after the assistant message answers `call`.
    pub fn answers(&self, call: &ToolCall) -> bool {
        self.results
            .iter()
            .flat_map(Message::tool_results)
            .any(|result| result.call_id == call.id)
    }

    /// The calls no tool message right after the assistant message answers, in call order.
    pub fn unanswered(self) -> impl Iterator<Item = &'a ToolCall> {
        self.message
            .tool_calls()
            .filter(move |call| !self.answers(call))
    }
}

/// The call blocks of `messages` from index `start` on.
fn call_blocks(messages: &[Message], start: usize) -> impl Iterator<Item = CallBlock<'_>> {
    messages
        .iter()
        .enumerate()
        .skip(start)
        .filter(|(_, m)| m.role == Role::Assistant && m.has_tool_calls())
        .map(|(index, message)| {
            let rest = &messages[index + 1..];
            let results = &rest[..rest.iter().take_while(|m| m.role == Role::Tool).count()];
            CallBlock {
                index,
                message,
                results,
                at_end: results.len() == rest.len(),
            }
        })
}

/// Where `message`'s first result stands among the calls of `calls` (last if nowhere).
fn call_position(message: &Message, calls: &Message) -> usize {
    message
        .tool_results()
        .next()
        .and_then(|r| calls.tool_calls().position(|c| c.id == r.call_id))
        .unwrap_or(usize::MAX)
}

/// Why a history is not valid to send to a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// Two tool calls share an id.
    #[error("tool call id `{id}` is used twice (message {index})")]
    DuplicateCallId {
        /// The id.
        id: String,
        /// The index of the second message using it.
        index: usize,
    },
    /// A tool call has no result before the next non-tool message (or the end).
    #[error("tool call `{id}` ({name}) in message {index} has no result")]
    UnansweredCall {
        /// The call's id.
        id: String,
        /// The tool's name.
        name: String,
        /// The index of the assistant message holding the call.
        index: usize,
    },
    /// A tool result answers no call of the assistant message right before it.
    #[error("tool result for `{call_id}` in message {index} answers no open call")]
    OrphanResult {
        /// The id the result names.
        call_id: String,
        /// The index of the tool message.
        index: usize,
    },
    /// A call is answered twice.
    #[error("tool call `{call_id}` is answered twice (message {index})")]
    DuplicateResult {
        /// The call's id.
        call_id: String,
        /// The index of the second result.
        index: usize,
    },
    /// A tool message holds no tool result, or a non-tool message holds one.
    #[error("message {index} mixes roles and tool results")]
    MisplacedResult {
        /// The index of the message.
        index: usize,
    },
}

/// Check that a history is valid to send to any provider: the results of an assistant
/// message's tool calls follow it directly, as tool messages, each call answered exactly once;
/// no result answers a call that is not open; no call id is used twice.
///
/// `pending` names calls of the *last* assistant message that may stay unanswered because
/// they wait for a human decision (an interrupted run).
///
/// # Errors
///
/// The first [`HistoryError`] found.
pub fn validate(messages: &[Message], pending: &[&str]) -> Result<(), HistoryError> {
    let mut seen_ids: HashSet<&str> = HashSet::new();
    // Calls of the latest assistant message that still wait for a result: id -> (name, index).
    let mut open: HashMap<&str, (&str, usize)> = HashMap::new();
    let mut answered: HashSet<&str> = HashSet::new();

    let close = |open: &mut HashMap<&str, (&str, usize)>, at_end: bool| {
        let mut left: Vec<_> = open
            .drain()
            .filter(|(id, _)| !(at_end && pending.contains(id)))
            .collect();
        left.sort_by_key(|(_, (_, index))| *index);
        match left.into_iter().next() {
            Some((id, (name, index))) => Err(HistoryError::UnansweredCall {
                id: id.to_owned(),
                name: name.to_owned(),
                index,
            }),
            None => Ok(()),
        }
    };

    for (index, message) in messages.iter().enumerate() {
        match message.role {
            Role::Tool => {
                let mut any = false;
                for result in message.tool_results() {
                    any = true;
                    let id = result.call_id.as_str();
                    if open.remove(id).is_some() {
                        answered.insert(id);
                    } else if answered.contains(id) {
                        return Err(HistoryError::DuplicateResult {
                            call_id: id.to_owned(),
                            index,
                        });
                    } else {
                        return Err(HistoryError::OrphanResult {
                            call_id: id.to_owned(),
                            index,
                        });
                    }
                }
                if !any {
                    return Err(HistoryError::MisplacedResult { index });
                }
            }
            _ => {
                if message.tool_results().next().is_some() {
                    return Err(HistoryError::MisplacedResult { index });
                }
                close(&mut open, false)?;
                answered.clear();
                if message.role == Role::Assistant {
                    for call in message.tool_calls() {
                        if !seen_ids.insert(call.id.as_str()) {
                            return Err(HistoryError::DuplicateCallId {
                                id: call.id.clone(),
                                index,
                            });
                        }
                        open.insert(call.id.as_str(), (call.name.as_str(), index));
                    }
                }
            }
        }
    }
    close(&mut open, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{ToolCall, ToolResult};
    use serde_json::json;

    fn call(id: &str) -> ToolCall {
        ToolCall::new(id, "t", json!({}))
    }

    fn answer(id: &str) -> Message {
        Message::tool_result(ToolResult::success(&call(id), "ok"))
    }

    #[test]
    fn answered_calls_are_valid() {
        let h = vec![
            Message::user("go"),
            Message::assistant_with_calls("", [call("a"), call("b")]),
            answer("b"),
            answer("a"),
            Message::assistant("done"),
        ];
        assert_eq!(validate(&h, &[]), Ok(()));
    }

    #[test]
    fn each_defect_is_named() {
        let unanswered = vec![
            Message::assistant_with_calls("", [call("a"), call("b")]),
            answer("a"),
            Message::user("next"),
        ];
        assert!(matches!(
            validate(&unanswered, &[]),
            Err(HistoryError::UnansweredCall { id, .. }) if id == "b"
        ));

        let orphan = vec![Message::user("x"), answer("z")];
        assert!(matches!(
            validate(&orphan, &[]),
            Err(HistoryError::OrphanResult { call_id, index: 1 }) if call_id == "z"
        ));

        let twice = vec![
            Message::assistant_with_calls("", [call("a")]),
            answer("a"),
            answer("a"),
        ];
        assert!(matches!(
            validate(&twice, &[]),
            Err(HistoryError::DuplicateResult { .. })
        ));

        let dup_ids = vec![
            Message::assistant_with_calls("", [call("a")]),
            answer("a"),
            Message::assistant_with_calls("", [call("a")]),
            answer("a"),
        ];
        assert!(matches!(
            validate(&dup_ids, &[]),
            Err(HistoryError::DuplicateCallId { index: 2, .. })
        ));

        let late = vec![
            Message::assistant_with_calls("", [call("a")]),
            Message::user("interrupting"),
            answer("a"),
        ];
        assert!(matches!(
            validate(&late, &[]),
            Err(HistoryError::UnansweredCall { .. })
        ));
    }

    #[test]
    fn pending_calls_may_wait_only_at_the_end() {
        let h = vec![
            Message::assistant_with_calls("", [call("a"), call("b")]),
            answer("a"),
        ];
        assert!(validate(&h, &[]).is_err());
        assert_eq!(validate(&h, &["b"]), Ok(()));
        let mut later = h.clone();
        later.push(Message::user("moved on"));
        assert!(validate(&later, &["b"]).is_err());
    }

    fn ids(message: &Message) -> Vec<&str> {
        message
            .tool_results()
            .map(|r| r.call_id.as_str())
            .chain(message.tool_calls().map(|c| c.id.as_str()))
            .collect()
    }

    #[test]
    fn unanswered_calls_are_answered_in_place_and_in_call_order() {
        let mut h = History::from(vec![
            Message::user("go"),
            Message::assistant_with_calls("", [call("a"), call("b"), call("c")]),
            answer("b"),
            Message::user("later"),
            Message::assistant_with_calls("", [call("d")]),
        ]);
        let answered = h
            .repair(&Repair::new().answer(&ToolResult::cancelled))
            .answered;
        assert_eq!(answered, 3);
        let shape: Vec<Vec<&str>> = h.iter().map(ids).collect();
        assert_eq!(
            shape,
            [
                vec![],
                vec!["a", "b", "c"],
                vec!["a"],
                vec!["b"],
                vec!["c"],
                vec![],
                vec!["d"],
                vec!["d"],
            ]
        );
        assert_eq!(h[3].tool_results().next().map(|r| r.is_error), Some(false));
        assert_eq!(h.validate(), Ok(()));
    }

    #[test]
    fn calls_that_wait_stay_open_only_at_the_end() {
        let mut h = History::from(vec![
            Message::assistant_with_calls("", [call("a")]),
            Message::user("moved on"),
            Message::assistant_with_calls("", [call("b"), call("c")]),
            answer("c"),
        ]);
        // `a` cannot wait: a message follows its results. `b` can.
        let wait = |c: &ToolCall| c.id == "a" || c.id == "b";
        let how = Repair::new().wait(&wait).answer(&ToolResult::cancelled);
        let answered = h.repair(&how).answered;
        assert_eq!(answered, 1);
        assert_eq!(ids(&h[1]), ["a"]);
        assert_eq!(
            h.open_calls()
                .iter()
                .map(|c| c.id.as_str())
                .collect::<Vec<_>>(),
            ["b"]
        );
        assert_eq!(validate(&h, &["b"]), Ok(()));
    }

    #[test]
    fn the_last_message_only_when_asked() {
        let mut h = History::from(vec![
            Message::assistant_with_calls("", [call("a")]),
            Message::user("x"),
            Message::assistant_with_calls("", [call("b")]),
            Message::user("y"),
        ]);
        let last = Repair::new().last_message_only();
        assert_eq!(h.repair(&last.answer(&ToolResult::cancelled)).answered, 1);
        assert_eq!(ids(&h[3]), ["b"], "b answered right after its message");
        assert!(h.validate().is_err(), "`a` was not looked at");
        assert_eq!(h.repair(&Repair::new()).answered, 1);
        assert_eq!(h.validate(), Ok(()));
    }

    #[test]
    fn a_valid_history_is_not_copied() {
        let mut h = History::from(vec![
            Message::assistant_with_calls("", [call("a")]),
            answer("a"),
        ]);
        let shared = h.clone();
        assert!(h.repair(&Repair::new()).is_empty());
        h.order_results();
        assert!(h.ptr_eq(&shared), "nothing to repair: no copy");
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

    fn texts(n: usize) -> History {
        (0..n).map(|i| Message::user(i.to_string())).collect()
    }

    #[test]
    fn appending_keeps_a_mark_in_place_or_through_a_copy() {
        let mut h = texts(3);
        let mark = h.mark();
        h.push(Message::user("in place"));
        assert!(h.ptr_eq(&h.clone()));
        assert_eq!(h.since(&mark).map(<[Message]>::len), Some(1));
        let request = h.clone();
        let mark = h.mark();
        h.extend([Message::user("a"), Message::user("b")]); // copies: `request` is alive
        assert!(!h.ptr_eq(&request));
        assert_eq!(h.since(&mark).map(<[Message]>::len), Some(2));
        assert_eq!(request.kept(&h.mark()), 4, "the older one is a prefix");
        assert_eq!(request.since(&mark).map(<[Message]>::len), Some(0));
    }

    #[test]
    fn diverging_clones_keep_only_what_they_share() {
        let mut a = texts(2);
        let mut b = a.clone();
        a.push(Message::user("a")); // copies: `b` is alive
        b.push(Message::user("b")); // in place: `b` is alone now
        assert_eq!(a.kept(&b.mark()), 2);
        assert_eq!(b.kept(&a.mark()), 2);
        assert!(a.since(&b.mark()).is_none());
        let mut c = b.clone();
        let mut d = b.clone();
        c.push(Message::user("c"));
        d.push(Message::user("d"));
        assert_eq!(
            c.kept(&d.mark()),
            3,
            "siblings share their parent's messages"
        );
    }

    #[test]
    fn edits_keep_what_stands_before_them() {
        let mut h = texts(5);
        let mark = h.mark();
        h.tail_mut(3)[0] = Message::user("edited");
        assert_eq!(h.kept(&mark), 3);
        assert!(h.since(&mark).is_none());
        let mark = h.mark();
        h.make_mut().push(Message::user("any edit"));
        assert_eq!(h.kept(&mark), 0, "make_mut may have changed anything");
        let fresh = History::from(h.to_vec());
        assert_eq!(fresh.kept(&h.mark()), 0, "built anew: nothing known");
        let back: History = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!((back == h, back.kept(&h.mark())), (true, 0));
        let (mut x, mut y) = (History::new(), History::new());
        x.push(Message::user("x"));
        let mark = x.mark();
        y.push(Message::user("y"));
        assert_eq!(y.kept(&mark), 0, "two new histories share nothing");
    }

    #[test]
    fn a_repair_keeps_the_messages_before_the_first_it_changed() {
        let mut h = texts(4);
        h.push(Message::assistant_with_calls("", [call("a")]));
        h.push(Message::user("moved on"));
        let mark = h.mark();
        assert_eq!(h.repair(&Repair::new()).answered, 1);
        assert_eq!(h.kept(&mark), 5, "the answer goes in after message 4");
        h.order_results();
        let mut waiting = History::from(vec![
            Message::assistant_with_calls("", [call("a"), call("b")]),
            answer("b"),
            answer("a"),
        ]);
        let mark = waiting.mark();
        waiting.order_results();
        assert_eq!(waiting.kept(&mark), 1);
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
