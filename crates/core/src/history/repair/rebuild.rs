//! The rebuild of a history the check refused: results matched to their calls, blocks written
//! back in order, unanswered calls answered or dropped, reused ids renamed.

use std::collections::{HashMap, HashSet};

use crate::message::{ContentPart, Message, Role, ToolCall, ToolResult};

use super::{Repair, RepairReport, Unanswered};

impl Repair<'_> {
    /// Rebuild `messages`: walk them in order, matching each result to the latest call with its
    /// id that stands before it and is not answered yet, then write every block back with its
    /// results right after its message.
    pub(in crate::history) fn rebuild(&self, messages: &[Message]) -> (Vec<Message>, RepairReport) {
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

        // The block whose results end the history is the live frontier; the last one with a
        // call that waits for a decision takes its place when they are kept.
        let frontier = run;
        let waiting = self
            .keep_waiting
            .then(|| blocks.iter().rposition(Block::waits))
            .flatten();
        let mut out = Vec::with_capacity(items.len() + 4);
        // Where the waiting block stood among the messages written.
        let mut stood = None;
        for item in items {
            match item {
                Item::Message(message) => out.push(message),
                Item::Leftover(b, message) => {
                    if !blocks[b].clean {
                        out.push(message);
                    }
                }
                Item::Block(b) if waiting == Some(b) => stood = Some(out.len()),
                Item::Block(b) => {
                    // A rebuilt block's leftovers follow it as a user message: it no longer ends
                    // the history, and its calls cannot wait.
                    let at_end = waiting.is_none()
                        && frontier == Some(b)
                        && (blocks[b].clean || !blocks[b].leftovers);
                    self.write_block(&mut blocks[b], at_end, &mut report, &mut out);
                }
            }
        }
        if let (Some(b), Some(stood)) = (waiting, stood) {
            if out.len() > stood {
                report.moved_to_end += 1;
            }
            self.write_block(&mut blocks[b], true, &mut report, &mut out);
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
        let missing = |slot: &Slot| {
            slot.result.is_none()
                && !(at_end && (self.keep_frontier || slot.waits))
                && !(self.keep_waiting && slot.waits)
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

impl Block {
    /// Whether a call of it waits for a decision and has no result.
    fn waits(&self) -> bool {
        self.slots.iter().any(|s| s.waits && s.result.is_none())
    }
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
pub(super) fn fresh_id(id: &str, taken: &HashSet<String>) -> String {
    let base = if id.is_empty() { "call" } else { id };
    (if id.is_empty() { 1 } else { 2 }..)
        .map(|n| format!("{base}_{n}"))
        .find(|candidate| !taken.contains(candidate))
        .unwrap_or_else(|| format!("{base}_"))
}
