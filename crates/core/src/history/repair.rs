//! The one repair of a history: a pure function from a history to a valid one.
//!
//! A check ([`Repair::check`]) runs first and allocates nothing but its id set: a valid
//! history comes out as it went in, the same `Arc`. Only a history that fails it is rebuilt.

use std::collections::{HashMap, HashSet};
use std::fmt;

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
    last_only: bool,
    wait: Option<&'a dyn Fn(&ToolCall) -> bool>,
    answer: Option<&'a dyn Fn(&ToolCall) -> ToolResult>,
}

impl fmt::Debug for Repair<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Repair")
            .field("unanswered", &self.unanswered)
            .field("keep_frontier", &self.keep_frontier)
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
    /// decision (a call anywhere else cannot wait: a message follows its results).
    pub fn wait(mut self, wait: &'a dyn Fn(&ToolCall) -> bool) -> Self {
        self.wait = Some(wait);
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
    /// use std::collections::HashSet;
    /// use serde_json::json;
    /// use tower_agent_core::{Message, Repair, ToolCall, ToolResult};
    ///
    /// let call = ToolCall::new("c1", "t", json!({}));
    /// let mut messages = vec![Message::assistant_with_calls("", [call.clone()])];
    /// messages.push(Message::tool_result(ToolResult::success(&call, "ok")));
    /// let mut ids = HashSet::new();
    /// assert!(Repair::new().check(&messages, 0, &mut ids));
    /// messages.push(Message::assistant_with_calls("", [call])); // the same id again
    /// assert!(!Repair::new().check(&messages, 2, &mut ids));
    /// ```
    pub fn check(&self, messages: &[Message], from: usize, ids: &mut HashSet<String>) -> bool {
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
                        if call.id.is_empty() || !ids.insert(call.id.clone()) {
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

    /// Rebuild `messages`: walk them in order, matching each result to the latest call with its
    /// id that stands before it and is not answered yet, then write every block back with its
    /// results right after its message.
    pub(super) fn rebuild(&self, messages: &[Message]) -> (Vec<Message>, RepairReport) {
        let mut report = RepairReport::default();
        // Every id in use, so that a new id never takes one a later call has.
        let mut taken: HashSet<String> = messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .flat_map(Message::tool_calls)
            .map(|c| c.id.clone())
            .collect();
        let mut used: HashSet<String> = HashSet::new();
        let mut open: HashMap<String, (usize, usize)> = HashMap::new();
        let mut blocks: Vec<Block> = Vec::new();
        let mut items: Vec<Item> = Vec::with_capacity(messages.len());
        // The block whose tool messages we are in.
        let mut run: Option<usize> = None;

        for message in messages {
            if message.role != Role::Tool {
                run = None;
            }
            let in_run = run.filter(|_| message.role == Role::Tool);
            let mut rest = Vec::with_capacity(message.content.len());
            let mut results = 0;
            let mut foreign = false;
            for part in &message.content {
                let ContentPart::ToolResult(result) = part else {
                    rest.push(part.clone());
                    continue;
                };
                results += 1;
                match open.remove(&result.call_id) {
                    Some((b, k)) => {
                        let slot = &mut blocks[b].slots[k];
                        let mut result = result.clone();
                        result.call_id.clone_from(&slot.call.id);
                        slot.result = Some(result);
                        if in_run != Some(b) {
                            blocks[b].clean = false;
                            report.moved += 1;
                            foreign = true;
                        }
                    }
                    None => {
                        report.orphans += 1;
                        foreign = true;
                    }
                }
            }

            if let Some(b) = in_run {
                // A tool message of block `b`'s results.
                if foreign || results == 0 {
                    blocks[b].clean = false;
                }
                blocks[b].run.push(message.clone());
                let leftover = rest;
                if !leftover.is_empty() {
                    blocks[b].leftovers = true;
                    // Kept with the results while the block stays as it was; otherwise it is
                    // what the human or host wrote there, kept as a user message after them.
                    items.push(Item::Leftover(
                        b,
                        Message {
                            role: Role::User,
                            content: leftover,
                        },
                    ));
                }
                continue;
            }

            let has_calls = message.role == Role::Assistant
                && rest.iter().any(|p| matches!(p, ContentPart::ToolCall(_)));
            if !has_calls {
                if rest.is_empty() && results > 0 {
                    report.removed_messages += 1;
                    continue;
                }
                let role = if message.role == Role::Tool {
                    Role::User
                } else {
                    message.role
                };
                if results == 0 && role == message.role {
                    items.push(Item::Message(message.clone()));
                } else {
                    items.push(Item::Message(Message {
                        role,
                        content: rest,
                    }));
                }
                continue;
            }

            // An assistant message with calls: a new block.
            let b = blocks.len();
            let mut clean = results == 0;
            let mut slots = Vec::new();
            for part in &mut rest {
                let ContentPart::ToolCall(call) = part else {
                    continue;
                };
                let original_id = call.id.clone();
                // Whether it may wait is asked of the call as it was: a pending call keeps its id.
                let waits = self.wait.is_some_and(|wait| wait(call));
                if call.id.is_empty() || used.contains(&call.id) {
                    call.id = fresh_id(&call.id, &taken);
                    taken.insert(call.id.clone());
                    report.renamed += 1;
                    clean = false;
                }
                used.insert(call.id.clone());
                // A later call with the same id shadows an earlier one still open: results after
                // this point answer the later call.
                open.insert(original_id.clone(), (b, slots.len()));
                slots.push(Slot {
                    call: call.clone(),
                    waits,
                    result: None,
                });
            }
            blocks.push(Block {
                message: Message {
                    role: Role::Assistant,
                    content: rest,
                },
                slots,
                run: Vec::new(),
                clean,
                leftovers: false,
            });
            items.push(Item::Block(b));
            run = Some(b);
        }

        // The block whose results end the history is the live frontier.
        let frontier = run;
        let mut out = Vec::with_capacity(items.len() + 4);
        for item in items {
            match item {
                Item::Message(message) => out.push(message),
                Item::Leftover(b, message) => {
                    if !blocks[b].clean {
                        out.push(message);
                    }
                }
                Item::Block(b) => {
                    // A rebuilt block's leftovers follow it as a user message: it no longer ends
                    // the history, and its calls cannot wait.
                    let at_end = frontier == Some(b) && (blocks[b].clean || !blocks[b].leftovers);
                    self.write_block(&mut blocks[b], at_end, &mut report, &mut out);
                }
            }
        }
        (out, report)
    }

    /// Write a block: as it was when clean, else its message and one tool message per result in
    /// call order, unanswered calls answered or dropped.
    fn write_block(
        &self,
        block: &mut Block,
        at_end: bool,
        report: &mut RepairReport,
        out: &mut Vec<Message>,
    ) {
        let missing =
            |slot: &Slot| slot.result.is_none() && !(at_end && (self.keep_frontier || slot.waits));
        if block.clean && !block.slots.iter().any(missing) {
            out.push(std::mem::replace(&mut block.message, Message::user("")));
            out.append(&mut block.run);
            return;
        }
        block.clean = false;
        let mut message = std::mem::replace(&mut block.message, Message::user(""));
        let mut results = Vec::with_capacity(block.slots.len());
        let mut dropped: Vec<String> = Vec::new();
        for slot in &mut block.slots {
            if let Some(result) = slot.result.take() {
                results.push(Message::tool_result(result));
            } else if missing(slot) {
                match self.unanswered {
                    Unanswered::Answer => {
                        report.answered += 1;
                        results.push(Message::tool_result(self.synthetic(&slot.call)));
                    }
                    Unanswered::Drop => {
                        report.dropped_calls += 1;
                        dropped.push(slot.call.id.clone());
                    }
                }
            }
        }
        if !dropped.is_empty() {
            message
                .content
                .retain(|p| !matches!(p, ContentPart::ToolCall(c) if dropped.contains(&c.id)));
        }
        if message.content.is_empty() {
            report.removed_messages += 1;
        } else {
            out.push(message);
        }
        out.append(&mut results);
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

/// One call of a block: the call (with its final id), whether it may wait for a decision, and
/// the result found for it.
struct Slot {
    call: ToolCall,
    waits: bool,
    result: Option<ToolResult>,
}

/// An assistant message with calls, and the tool messages right after it as they were.
struct Block {
    message: Message,
    slots: Vec<Slot>,
    run: Vec<Message>,
    /// Nothing about it changes: it is written back as it was.
    clean: bool,
    /// Its tool messages hold more than results.
    leftovers: bool,
}

enum Item {
    Message(Message),
    Block(usize),
    /// Non-result content of a tool message of block `.0`'s results; written only when the
    /// block is rebuilt (a clean block writes its tool messages whole).
    Leftover(usize, Message),
}

/// A new id for a call whose id is empty or used: `{id}_2`, `{id}_3`, ... (`call_1`, ... for
/// an empty one), the first that no call of the history has.
fn fresh_id(id: &str, taken: &HashSet<String>) -> String {
    let base = if id.is_empty() { "call" } else { id };
    (if id.is_empty() { 1 } else { 2 }..)
        .map(|n| format!("{base}_{n}"))
        .find(|candidate| !taken.contains(candidate))
        .unwrap_or_else(|| format!("{base}_"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::History;
    use crate::history::mark::tests::texts;
    use crate::history::tests::ids;
    use crate::history::validate;

    #[test]
    fn a_report_names_what_changed_in_singular_or_plural() {
        let report = RepairReport {
            answered: 1,
            moved: 3,
            renamed: 2,
            ..RepairReport::default()
        };
        assert_eq!(
            report.to_string(),
            "1 call answered, 3 results moved to their call, 2 call ids renamed"
        );
        let one = RepairReport {
            moved: 1,
            orphans: 2,
            ..RepairReport::default()
        };
        assert_eq!(
            one.to_string(),
            "2 orphan results dropped, 1 result moved to its call"
        );
        assert_eq!(RepairReport::default().to_string(), "nothing");
    }
    use serde_json::json;

    fn call(id: &str) -> ToolCall {
        ToolCall::new(id, "t", json!({}))
    }

    fn answer(id: &str) -> Message {
        Message::tool_result(ToolResult::success(&call(id), format!("ok {id}")))
    }

    fn fix(messages: Vec<Message>) -> (History, RepairReport) {
        let mut history = History::from(messages);
        let report = history.repair(&Repair::new());
        (history, report)
    }

    #[test]
    fn fresh_ids_skip_taken_ones() {
        let taken: HashSet<String> = ["a_2".to_owned()].into();
        assert_eq!(fresh_id("a", &taken), "a_3");
        assert_eq!(fresh_id("", &taken), "call_1");
    }

    #[test]
    fn a_valid_history_is_the_same_arc() {
        let messages = vec![
            Message::user("go"),
            Message::assistant_with_calls("", [call("a"), call("b")]),
            answer("b"),
            answer("a"),
            Message::assistant("done"),
        ];
        let mut history = History::from(messages);
        let before = history.clone();
        assert!(history.repair(&Repair::new()).is_empty());
        assert!(history.ptr_eq(&before));
    }

    #[test]
    fn a_result_before_its_call_is_an_orphan() {
        let (h, report) = fix(vec![
            Message::user("go"),
            answer("a"),
            Message::assistant_with_calls("", [call("a")]),
        ]);
        assert_eq!((report.orphans, report.answered), (1, 1));
        assert_eq!(h.len(), 3);
        assert_eq!(h[2].tool_results().next().map(|r| r.is_error), Some(true));
        assert_eq!(h.validate(), Ok(()));
    }

    #[test]
    fn a_late_answer_moves_up_across_an_assistant_message() {
        let (h, report) = fix(vec![
            Message::assistant_with_calls("", [call("a")]),
            Message::assistant("thinking"),
            answer("a"),
        ]);
        assert_eq!((report.moved, report.answered, report.orphans), (1, 0, 0));
        assert_eq!(
            h[1].tool_results().next().map(|r| r.content.as_str()),
            Some("ok a")
        );
        assert_eq!(h[2].text(), "thinking");
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn reused_ids_are_matched_in_order_and_renamed() {
        let (h, report) = fix(vec![
            Message::assistant_with_calls("", [call("a")]),
            answer("a"),
            Message::assistant_with_calls("", [call("a")]),
            answer("a"),
        ]);
        assert_eq!(report.renamed, 1);
        let ids: Vec<_> = h
            .iter()
            .flat_map(Message::tool_calls)
            .map(|c| c.id.clone())
            .collect();
        assert_eq!(ids, ["a", "a_2"]);
        assert_eq!(
            h[3].tool_results().next().map(|r| r.call_id.as_str()),
            Some("a_2")
        );
        assert_eq!(h.validate(), Ok(()));
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
}
