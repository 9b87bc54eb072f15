//! The call blocks of a history: an assistant message that asks for tool calls, and the tool
//! messages right after it.

use crate::message::{Message, Role, ToolCall};

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
pub(super) fn call_blocks(
    messages: &[Message],
    start: usize,
) -> impl Iterator<Item = CallBlock<'_>> {
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
pub(super) fn call_position(message: &Message, calls: &Message) -> usize {
    message
        .tool_results()
        .next()
        .and_then(|r| calls.tool_calls().position(|c| c.id == r.call_id))
        .unwrap_or(usize::MAX)
}
