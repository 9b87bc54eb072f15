//! The one repair of a history: a pure function from a history to a valid one.
//!
//! A check ([`Repair::check`]) runs first and allocates nothing but its id set: a valid
//! history comes out as it went in, the same `Arc`. Only a history that fails it is rebuilt.

use std::fmt;

use super::CallIds;
use crate::message::{ContentPart, Message, Role, ToolCall, ToolResult};

/// What becomes of a tool call that has no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Unanswered {
    /// Answer it with a synthetic error result ([`ToolResult::unanswered`] unless
    /// [`Repair::answer`] says otherwise): the model learns that the call did not complete.
    /// The default.
    #[default]
    Answer,
    /// Remove the call from its assistant message, and the message when nothing else is left
    /// in it: the model never sees that it asked.
    Drop,
}

/// What a repair changed. All zero when the history was valid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RepairReport {
    /// Calls given a synthetic result.
    pub answered: usize,
    /// Calls removed ([`Unanswered::Drop`]).
    pub dropped_calls: usize,
    /// Results dropped because no call was waiting for them: before their call, answering an
    /// id no call has, or answering a call a second time.
    pub orphans: usize,
    /// Results moved up to right after their call (they came later in the history).
    pub moved: usize,
    /// Calls given a new id because theirs was empty or used by an earlier call.
    pub renamed: usize,
    /// Messages left empty by the repair and removed.
    pub removed_messages: usize,
    /// Assistant messages whose calls wait for a decision moved to the end of the history,
    /// with their results, after the messages added since ([`Repair::keep_waiting`]).
    pub moved_to_end: usize,
}

/// What was repaired, the counts that are not zero: `1 call answered, 2 orphan results
/// dropped`.
impl fmt::Display for RepairReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counts = [
            (self.answered, "call", "calls", "answered"),
            (self.dropped_calls, "call", "calls", "dropped"),
            (self.orphans, "orphan result", "orphan results", "dropped"),
            (self.moved, "result", "results", "moved to its call"),
            (self.renamed, "call id", "call ids", "renamed"),
            (
                self.removed_messages,
                "empty message",
                "empty messages",
                "removed",
            ),
            (
                self.moved_to_end,
                "batch waiting for a decision",
                "batches waiting for a decision",
                "moved to the end",
            ),
        ];
        let mut first = true;
        for (n, one, many, what) in counts {
            if n == 0 {
                continue;
            }
            let (noun, what) = match (n, what) {
                (1, what) => (one, what),
                (_, "moved to its call") => (many, "moved to their call"),
                (_, what) => (many, what),
            };
            write!(f, "{}{n} {noun} {what}", if first { "" } else { ", " })?;
            first = false;
        }
        if first {
            f.write_str("nothing")?;
        }
        Ok(())
    }
}

impl RepairReport {
    /// Whether the repair changed nothing.
    pub fn is_empty(&self) -> bool {
        *self == RepairReport::default()
    }
}

/// How [`History::repair`](crate::History::repair) repairs: what becomes of calls without a result, which of them may
/// stay open, and what answers the others.
///
/// The rules, whatever the options:
///
/// - every call is answered exactly once, right after its assistant message, one tool message
///   per result in call order; a call without a result is answered ([`Repair::answer`]) or
///   dropped ([`Unanswered::Drop`]);
/// - results are matched to calls *in order*: a result answers the latest call with its id
///   that stands before it and has no result yet. A later answer (after another assistant
///   message, say) still counts and moves up; a result before its call, a second answer, or an
///   answer to an id no call has is an orphan and is dropped, keeping any other content of its
///   message (as a user message when no result is left in a tool message);
/// - a call whose id is empty or reused gets a new one (`{id}_2`, ...), with its result:
///   Anthropic rejects a request whose `tool_use` ids repeat;
/// - a message emptied by the repair is removed, never sent empty.
///
/// Deterministic and idempotent: repairing twice equals repairing once.
///
/// ```
/// use serde_json::json;
/// use tower_agent_core::{History, Message, Repair, ToolCall, ToolResult, Unanswered};
///
/// let (a, b) = (ToolCall::new("a", "t", json!({})), ToolCall::new("b", "t", json!({})));
/// let history = History::from(vec![
///     Message::user("go"),
///     Message::assistant_with_calls("", [a, b]),
/// ]);
/// // A run that waits for a decision about `b`: `a` gets an answer, `b` stays open.
/// let wait = |call: &ToolCall| call.id == "b";
/// let mut waiting = history.clone();
/// assert_eq!(waiting.repair(&Repair::new().wait(&wait)).answered, 1);
/// assert_eq!(waiting.open_calls().len(), 1);
///
/// // A model request: nothing may wait, and the calls are dropped rather than answered.
/// let mut dropped = history.clone();
/// let report = dropped.repair(&Repair::new().unanswered(Unanswered::Drop));
/// assert_eq!((report.dropped_calls, report.removed_messages), (2, 1));
/// assert_eq!(dropped.len(), 1);
/// ```
#[derive(Clone, Copy, Default)]
pub struct Repair<'a> {
    unanswered: Unanswered,
    keep_frontier: bool,
    keep_waiting: bool,
    last_only: bool,
    wait: Option<&'a dyn Fn(&ToolCall) -> bool>,
    answer: Option<&'a dyn Fn(&ToolCall) -> ToolResult>,
}

impl fmt::Debug for Repair<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Repair")
            .field("unanswered", &self.unanswered)
            .field("keep_frontier", &self.keep_frontier)
            .field("keep_waiting", &self.keep_waiting)
            .field("last_only", &self.last_only)
            .field("wait", &self.wait.is_some())
            .field("answer", &self.answer.is_some())
            .finish()
    }
}

impl<'a> Repair<'a> {
    /// Answer every call without a result with [`ToolResult::unanswered`]; nothing waits.
    pub fn new() -> Self {
        Self::default()
    }

    /// What becomes of a call without a result: answered (the default) or dropped.
    pub fn unanswered(mut self, unanswered: Unanswered) -> Self {
        self.unanswered = unanswered;
        self
    }

    /// Leave the calls of the live frontier alone: the last assistant message, when only
    /// tool messages follow it. Its calls may still get results (a run being resumed).
    pub fn keep_frontier(mut self) -> Self {
        self.keep_frontier = true;
        self
    }

    /// Leave open the calls of the frontier for which `wait` says yes: they wait for a human
    /// decision (a call anywhere else cannot wait: a message follows its results; unless
    /// [`Repair::keep_waiting`] moves it to the end).
    pub fn wait(mut self, wait: &'a dyn Fn(&ToolCall) -> bool) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Never answer nor drop a call for which [`Repair::wait`] says yes, wherever it stands,
    /// and let the calls that wait stay open at the end: the last assistant message holding
    /// one moves to the end of the history with its results, and the messages that followed it
    /// (added while it waited, by a host) now stand before it. This is the repair of a session
    /// with pending interrupts: a resume finds its calls at the end, and new input answers them
    /// as not decided. A waiting call in an earlier message (a session edited by hand) stays
    /// where it is, without a result: only the loop can decide about it.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::{History, Message, Repair, ToolCall, ToolResult, Unanswered};
    ///
    /// let (a, b) = (ToolCall::new("a", "t", json!({})), ToolCall::new("b", "t", json!({})));
    /// let mut history = History::from(vec![
    ///     Message::user("go"),
    ///     Message::assistant_with_calls("", [a.clone(), b]),
    ///     Message::tool_result(ToolResult::success(&a, "ok")),
    ///     Message::user("still there?"),
    /// ]);
    /// let wait = |call: &ToolCall| call.id == "b";
    /// let how = Repair::new().unanswered(Unanswered::Drop).wait(&wait).keep_waiting();
    /// let report = history.repair(&how);
    /// assert_eq!((report.moved_to_end, report.dropped_calls), (1, 0));
    /// assert_eq!(history[1].text(), "still there?");
    /// assert_eq!(history.open_calls().iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["b"]);
    /// ```
    pub fn keep_waiting(mut self) -> Self {
        self.keep_waiting = true;
        self
    }

    /// The synthetic result of a call left without one (default: [`ToolResult::unanswered`]).
    pub fn answer(mut self, answer: &'a dyn Fn(&ToolCall) -> ToolResult) -> Self {
        self.answer = Some(answer);
        self
    }

    /// Look at the last assistant message and what follows it only: a cost in those messages,
    /// not in the whole history. That is all a session the agent left can need (the agent
    /// repairs every run's start, so only the last assistant message can hold calls without
    /// results); a history from elsewhere may need the whole scan.
    pub fn last_message_only(mut self) -> Self {
        self.last_only = true;
        self
    }

    /// Where the repair starts in `history`.
    pub(super) fn start(&self, history: &[Message]) -> usize {
        match self.last_only {
            true => history
                .iter()
                .rposition(|m| m.role == Role::Assistant)
                .unwrap_or(history.len()),
            false => 0,
        }
    }

    /// Whether `messages[from..]` needs no repair, given that `messages[..from]` needs none
    /// and leaves no call open, and that `ids` holds its call ids (the ids seen are added):
    /// a check that can go on where the previous one stopped. The rules of
    /// [`History::validate`](crate::History::validate), plus: no empty call id, and no tool message outside the results
    /// right after a call.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::{CallIds, Message, Repair, ToolCall, ToolResult};
    ///
    /// let call = ToolCall::new("c1", "t", json!({}));
    /// let mut messages = vec![Message::assistant_with_calls("", [call.clone()])];
    /// messages.push(Message::tool_result(ToolResult::success(&call, "ok")));
    /// let mut ids = CallIds::new();
    /// assert!(Repair::new().check(&messages, 0, &mut ids));
    /// messages.push(Message::assistant_with_calls("", [call])); // the same id again
    /// assert!(!Repair::new().check(&messages, 2, &mut ids));
    /// ```
    pub fn check(&self, messages: &[Message], from: usize, ids: &mut CallIds) -> bool {
        let mut index = from;
        while index < messages.len() {
            let message = &messages[index];
            index += 1;
            if message.role == Role::Tool {
                return false;
            }
            let mut calls = 0;
            for part in &message.content {
                match part {
                    ContentPart::ToolResult(_) => return false,
                    ContentPart::ToolCall(call) if message.role == Role::Assistant => {
                        if call.id.is_empty() || !ids.insert(&call.id) {
                            return false;
                        }
                        calls += 1;
                    }
                    _ => {}
                }
            }
            if calls == 0 {
                continue;
            }
            let start = index;
            while index < messages.len() && messages[index].role == Role::Tool {
                index += 1;
            }
            let at_end = index == messages.len();
            if !self.answered_once(message, calls, &messages[start..index], at_end) {
                return false;
            }
        }
        true
    }

    /// Whether `call` may stay without a result.
    fn may_wait(&self, call: &ToolCall, at_end: bool) -> bool {
        at_end && (self.keep_frontier || self.wait.is_some_and(|wait| wait(call)))
    }

    /// The synthetic result of `call`.
    fn synthetic(&self, call: &ToolCall) -> ToolResult {
        match self.answer {
            Some(answer) => answer(call),
            None => ToolResult::unanswered(call),
        }
    }

    /// Whether `results` answer each call of `message` exactly once and nothing else; calls
    /// that may stay open (the frontier, pending decisions) may lack a result.
    fn answered_once(
        &self,
        message: &Message,
        calls: usize,
        results: &[Message],
        at_end: bool,
    ) -> bool {
        let mut answered = Marks::new(calls);
        for result_message in results {
            let mut any = false;
            for result in result_message.tool_results() {
                any = true;
                let position = message.tool_calls().position(|c| c.id == result.call_id);
                if !position.is_some_and(|p| answered.set(p)) {
                    return false;
                }
            }
            if !any {
                return false;
            }
        }
        message
            .tool_calls()
            .enumerate()
            .all(|(p, call)| answered.get(p) || self.may_wait(call, at_end))
    }
}

/// Which calls of a block have their result: bits for up to 64 calls (no allocation).
enum Marks {
    Bits(u64),
    Many(Vec<bool>),
}

impl Marks {
    fn new(calls: usize) -> Self {
        if calls <= 64 {
            Marks::Bits(0)
        } else {
            Marks::Many(vec![false; calls])
        }
    }

    /// Mark call `p`; `false` when it was marked already.
    fn set(&mut self, p: usize) -> bool {
        let was = self.get(p);
        match self {
            Marks::Bits(bits) => *bits |= 1 << p,
            Marks::Many(marks) => marks[p] = true,
        }
        !was
    }

    fn get(&self, p: usize) -> bool {
        match self {
            Marks::Bits(bits) => bits & (1 << p) != 0,
            Marks::Many(marks) => marks[p],
        }
    }
}

mod rebuild;
#[cfg(test)]
mod tests;
