//! The conversation history: shared copy-on-write, and checked for tool-call validity.

use std::collections::{HashMap, HashSet};
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::message::{Message, Role, ToolCall, ToolResult};

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
#[derive(Clone, Default, PartialEq, Eq)]
pub struct History(Arc<Vec<Message>>);

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append a message (copies first only if another clone is alive).
    pub fn push(&mut self, message: Message) {
        Arc::make_mut(&mut self.0).push(message);
    }

    /// Append messages.
    pub fn extend(&mut self, messages: impl IntoIterator<Item = Message>) {
        Arc::make_mut(&mut self.0).extend(messages);
    }

    /// Mutable access to the messages (copies first only if another clone is alive).
    pub fn make_mut(&mut self) -> &mut Vec<Message> {
        Arc::make_mut(&mut self.0)
    }

    /// The messages.
    pub fn as_slice(&self) -> &[Message] {
        &self.0
    }

    /// The messages as an owned vector (no copy if this is the only clone).
    pub fn into_vec(self) -> Vec<Message> {
        Arc::unwrap_or_clone(self.0)
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
    /// it, in order: what the repair, the loop and validity checks walk.
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

    /// Give every tool call that has no result a synthetic one made by `answer`, inserted
    /// right after its assistant message's tool messages (never after a later message), and
    /// keep those tool messages in call order. Calls of the history's last message for which
    /// `wait` returns true are left open (they wait for a decision). Returns how many calls
    /// were answered; copies nothing when none was.
    ///
    /// This is the one repair of unanswered calls: the agent uses it for every input, and
    /// layers use it to patch a history before a model sees it.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::{History, Message, ToolCall, ToolResult};
    ///
    /// let call = ToolCall::new("c1", "search", json!({}));
    /// let mut history = History::from(vec![
    ///     Message::user("find it"),
    ///     Message::assistant_with_calls("", [call]),
    ///     Message::user("never mind"),
    /// ]);
    /// let answered = history.answer_unanswered(|_| false, |c| ToolResult::cancelled(c));
    /// assert_eq!(answered, 1);
    /// assert!(history[2].tool_results().next().is_some(), "placed right after its call");
    /// assert_eq!(history[3].text(), "never mind");
    /// assert!(history.validate().is_ok());
    /// ```
    pub fn answer_unanswered(
        &mut self,
        wait: impl FnMut(&ToolCall) -> bool,
        answer: impl FnMut(&ToolCall) -> ToolResult,
    ) -> usize {
        self.answer_unanswered_from(0, wait, answer)
    }

    /// [`History::answer_unanswered`] for the last assistant message only: a cost in the
    /// messages after it, not in the whole history. That is all a session the agent left can
    /// need (the agent repairs every run's start, so only the last assistant message can hold
    /// calls without results); a history from elsewhere may need the whole scan.
    pub fn answer_last_unanswered(
        &mut self,
        wait: impl FnMut(&ToolCall) -> bool,
        answer: impl FnMut(&ToolCall) -> ToolResult,
    ) -> usize {
        let start = self
            .iter()
            .rposition(|m| m.role == Role::Assistant)
            .unwrap_or(self.len());
        self.answer_unanswered_from(start, wait, answer)
    }

    fn answer_unanswered_from(
        &mut self,
        start: usize,
        mut wait: impl FnMut(&ToolCall) -> bool,
        mut answer: impl FnMut(&ToolCall) -> ToolResult,
    ) -> usize {
        // (assistant index, end of its tool messages, the results to insert there)
        let mut repairs: Vec<(usize, usize, Vec<Message>)> = Vec::new();
        for block in call_blocks(self, start) {
            let missing: Vec<Message> = block
                .unanswered()
                .filter(|call| !(block.at_end && wait(call)))
                .map(|call| Message::tool_result(answer(call)))
                .collect();
            if !missing.is_empty() {
                repairs.push((block.index, block.end(), missing));
            }
        }
        let answered = repairs.iter().map(|(_, _, missing)| missing.len()).sum();
        if answered == 0 {
            return 0;
        }
        let messages = self.make_mut();
        for (start, end, missing) in repairs.into_iter().rev() {
            let added = missing.len();
            messages.splice(end..end, missing);
            order_block(messages, start, end + added);
        }
        answered
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
        let end = self.len();
        order_block(self.make_mut(), start, end);
    }

    /// Check that every tool call is answered exactly once and no result is an orphan.
    ///
    /// # Errors
    ///
    /// The first [`HistoryError`] found.
    pub fn validate(&self) -> Result<(), HistoryError> {
        validate(&self.0, &[])
    }
}

impl Deref for History {
    type Target = [Message];

    fn deref(&self) -> &[Message] {
        &self.0
    }
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl From<Vec<Message>> for History {
    fn from(messages: Vec<Message>) -> Self {
        Self(Arc::new(messages))
    }
}

impl FromIterator<Message> for History {
    fn from_iter<I: IntoIterator<Item = Message>>(iter: I) -> Self {
        Self(Arc::new(iter.into_iter().collect()))
    }
}

impl<'a> IntoIterator for &'a History {
    type Item = &'a Message;
    type IntoIter = std::slice::Iter<'a, Message>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl Serialize for History {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
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

    /// The index right after the block's tool messages.
    fn end(&self) -> usize {
        self.index + 1 + self.results.len()
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

/// Sort the tool messages `messages[start + 1..end]` by the position of their call in
/// `messages[start]` (stable: results answering no call keep their order, last).
fn order_block(messages: &mut [Message], start: usize, end: usize) {
    let (head, tail) = messages.split_at_mut(start + 1);
    let calls = &head[start];
    tail[..end - start - 1].sort_by_key(|m| call_position(m, calls));
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
        let answered = h.answer_unanswered(|_| false, ToolResult::cancelled);
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
        let answered = h.answer_unanswered(|c| c.id == "a" || c.id == "b", ToolResult::cancelled);
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
        assert_eq!(
            h.answer_last_unanswered(|_| false, ToolResult::cancelled),
            1
        );
        assert_eq!(ids(&h[3]), ["b"], "b answered right after its message");
        assert!(h.validate().is_err(), "`a` was not looked at");
        assert_eq!(h.answer_unanswered(|_| false, ToolResult::cancelled), 1);
        assert_eq!(h.validate(), Ok(()));
    }

    #[test]
    fn a_valid_history_is_not_copied() {
        let mut h = History::from(vec![
            Message::assistant_with_calls("", [call("a")]),
            answer("a"),
        ]);
        let shared = h.clone();
        assert_eq!(h.answer_unanswered(|_| false, ToolResult::cancelled), 0);
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

    #[test]
    fn serializes_as_a_plain_array() {
        let h = History::from(vec![Message::user("hi")]);
        let json = serde_json::to_value(&h).unwrap();
        assert!(json.is_array());
        let back: History = serde_json::from_value(json).unwrap();
        assert_eq!(back, h);
    }
}
