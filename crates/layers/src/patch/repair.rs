//! The repair itself: a pure function from a history to a valid one.
//!
//! A check ([`scan`]) runs first and allocates nothing but its id set: a valid history comes
//! out as it went in, the same `Arc`. Only a history that fails it is rebuilt ([`rebuild`]).

use std::collections::{HashMap, HashSet};

use tower_agent_core::{ContentPart, History, Message, Role, ToolCall, ToolResult};

/// The call ids of a history.
pub(super) type CallIds = HashSet<String>;

/// What becomes of a tool call that has no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Unanswered {
    /// Answer it with a synthetic error result ([`UNANSWERED`], or [`MALFORMED`] for a call
    /// whose arguments are not JSON): the model learns that the call did not complete. The
    /// default.
    #[default]
    Answer,
    /// Remove the call from its assistant message, and the message when nothing else is left
    /// in it: the model never sees that it asked.
    Drop,
}

/// The content of the synthetic result of a call that never got one.
pub const UNANSWERED: &str = ToolResult::UNANSWERED;

/// The start of the content of the synthetic result of a call whose arguments are not valid
/// JSON; the parser's message follows.
pub const MALFORMED: &str = "error: this tool call was not executed: its arguments are not \
     valid JSON";

/// What a repair changed. All zero when the history was valid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PatchReport {
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
impl std::fmt::Display for PatchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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

impl PatchReport {
    /// Whether the repair changed nothing.
    pub fn is_empty(&self) -> bool {
        *self == PatchReport::default()
    }
}

/// How to repair: what to do with unanswered calls, and what may stay open.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Scope<'a> {
    pub(crate) unanswered: Unanswered,
    /// Leave the calls of the live frontier alone: the last assistant message, when only tool
    /// messages follow it. Its calls may still get results (a run being resumed).
    pub(crate) keep_frontier: bool,
    /// Ids of calls that wait for a human decision: never answered or dropped.
    pub(crate) pending: &'a [&'a str],
}

/// Repair `history` in place; copies nothing when it is valid.
pub(crate) fn repair(history: &mut History, scope: Scope<'_>) -> PatchReport {
    if scan(history, 0, &mut CallIds::default(), scope) {
        return PatchReport::default();
    }
    let (messages, report) = rebuild(history, scope);
    *history = History::from(messages);
    report
}

/// Whether `messages[from..]` is valid, given that `messages[..from]` is and leaves no call
/// open, and that `ids` holds its call ids (new ids are added). The rules of
/// [`History::validate`], plus: no empty call id, and no tool message outside the results
/// right after a call.
pub(crate) fn scan(messages: &[Message], from: usize, ids: &mut CallIds, scope: Scope<'_>) -> bool {
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
        if !answered_once(message, calls, &messages[start..index], at_end, scope) {
            return false;
        }
    }
    true
}

/// Whether `results` answer each call of `message` exactly once and nothing else; calls that
/// may stay open (the frontier, pending decisions) may lack a result.
fn answered_once(
    message: &Message,
    calls: usize,
    results: &[Message],
    at_end: bool,
    scope: Scope<'_>,
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
        .all(|(p, call)| answered.get(p) || may_wait(call, at_end, scope))
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

fn may_wait(call: &ToolCall, at_end: bool, scope: Scope<'_>) -> bool {
    (at_end && scope.keep_frontier) || scope.pending.contains(&call.id.as_str())
}

/// One call of a block: the call (with its final id), the result found for it, and whether
/// that result stood in the block's own tool messages.
struct Slot {
    call: ToolCall,
    original_id: String,
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

/// Rebuild `messages`: walk them in order, matching each result to the latest call with its
/// id that stands before it and is not answered yet, then write every block back with its
/// results right after its message.
pub(crate) fn rebuild(messages: &[Message], scope: Scope<'_>) -> (Vec<Message>, PatchReport) {
    let mut report = PatchReport::default();
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
                original_id,
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
                write_block(&mut blocks[b], at_end, scope, &mut report, &mut out);
            }
        }
    }
    (out, report)
}

/// Write a block: as it was when clean, else its message and one tool message per result in
/// call order, unanswered calls answered or dropped.
fn write_block(
    block: &mut Block,
    at_end: bool,
    scope: Scope<'_>,
    report: &mut PatchReport,
    out: &mut Vec<Message>,
) {
    let missing = |slot: &Slot| {
        slot.result.is_none() && !may_wait(&slot.call, at_end, scope) && {
            // `may_wait` looks at the final id; a pending call keeps its id.
            !scope.pending.contains(&slot.original_id.as_str())
        }
    };
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
            match scope.unanswered {
                Unanswered::Answer => {
                    report.answered += 1;
                    results.push(Message::tool_result(synthetic(&slot.call)));
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

/// The synthetic result of `call`, which never got one. Deterministic: no clock, no random id.
pub(crate) fn synthetic(call: &ToolCall) -> ToolResult {
    match call.parse_arguments::<serde_json::Value>() {
        Ok(_) => ToolResult::error(call, UNANSWERED),
        Err(error) => ToolResult::error(call, format!("{MALFORMED} ({error}).")),
    }
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

    #[test]
    fn a_report_names_what_changed_in_singular_or_plural() {
        let report = PatchReport {
            answered: 1,
            moved: 3,
            renamed: 2,
            ..PatchReport::default()
        };
        assert_eq!(
            report.to_string(),
            "1 call answered, 3 results moved to their call, 2 call ids renamed"
        );
        let one = PatchReport {
            moved: 1,
            orphans: 2,
            ..PatchReport::default()
        };
        assert_eq!(
            one.to_string(),
            "2 orphan results dropped, 1 result moved to its call"
        );
        assert_eq!(PatchReport::default().to_string(), "nothing");
    }
    use serde_json::json;

    fn call(id: &str) -> ToolCall {
        ToolCall::new(id, "t", json!({}))
    }

    fn answer(id: &str) -> Message {
        Message::tool_result(ToolResult::success(&call(id), format!("ok {id}")))
    }

    fn fix(messages: Vec<Message>) -> (History, PatchReport) {
        let mut history = History::from(messages);
        let report = repair(&mut history, Scope::default());
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
        assert!(repair(&mut history, Scope::default()).is_empty());
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
}
