//! Where summarization cuts a history: the kept part starts at a message that carries no
//! result, and is a valid history on its own; a batch of calls is kept or summarized whole.

use tower_agent_core::history::validate;
use tower_agent_core::{ContentPart, HistoryError, Message, Role};

use super::history::is_summary;

/// Where the kept part of a history starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cut {
    /// The messages before this index are summarized, the rest kept.
    At(usize),
    /// Nothing to summarize: no message but a previous summary stands before the cut.
    Nothing,
    /// Every cut leaves a kept part that is not a valid history on its own: its newest
    /// messages are broken themselves (this is the defect of the last cut tried).
    Broken(HistoryError),
}

/// Where the kept part of `messages` starts, for a keep that wants it at `want`: the
/// [`safe_cut`] there, unless the kept part is not a valid history on its own; then the cut
/// moves past each defect, as many times as it takes. The kept part may end with calls that
/// still wait for their results (a decision, a tool still running).
///
/// [`safe_cut`] alone misses a batch only partly answered: it never starts the kept part with
/// a result, but a batch whose results do not all stand right after its message (one never
/// came, or came after another message) is broken wherever the cut falls before its end, and
/// moving the cut back only keeps more of it. So the cut moves on instead, and the batch is
/// summarized whole with whatever of it came in; a batch that ends the history is kept whole.
pub(crate) fn choose_cut(messages: &[Message], want: usize) -> Cut {
    let Some(mut cut) = safe_cut(messages, want) else {
        return Cut::Nothing;
    };
    let pending = trailing_calls(messages);
    loop {
        let error = match validate(&messages[cut..], &pending) {
            Ok(()) => return Cut::At(cut),
            Err(error) => error,
        };
        // Every kept part that holds the defect is broken: the next cut is past it (past the
        // first use of an id used twice).
        let past = match &error {
            HistoryError::DuplicateCallId { index, .. } => *index,
            HistoryError::UnansweredCall { index, .. }
            | HistoryError::OrphanResult { index, .. }
            | HistoryError::DuplicateResult { index, .. }
            | HistoryError::MisplacedResult { index } => index + 1,
            _ => return Cut::Broken(error),
        };
        match (cut + past.max(1)..messages.len()).find(|&at| !carries_result(&messages[at])) {
            Some(next) => cut = next,
            None => return Cut::Broken(error),
        }
    }
}

/// The ids of the calls of the last assistant message, when only its results follow it: they
/// may still wait for theirs (a decision, a tool still running), whether some of the batch
/// came in already or none did.
pub(crate) fn trailing_calls(messages: &[Message]) -> Vec<&str> {
    match messages.iter().rev().find(|m| m.role != Role::Tool) {
        Some(last) if last.role == Role::Assistant => {
            last.tool_calls().map(|call| call.id.as_str()).collect()
        }
        _ => Vec::new(),
    }
}

/// Where the kept part of `messages` may start: the latest index at or before `want` whose
/// message carries no tool result (so every call before it has its results before it, and
/// every message stays whole, its reasoning with it), and after at least one message that is
/// not a previous summary. `None` when no such index exists: nothing is summarized.
pub(crate) fn safe_cut(messages: &[Message], want: usize) -> Option<usize> {
    let first = usize::from(messages.first().is_some_and(is_summary));
    let want = want.min(messages.len());
    (first + 1..=want)
        .rev()
        .find(|&cut| cut == messages.len() || !carries_result(&messages[cut]))
}

fn carries_result(message: &Message) -> bool {
    message.role == Role::Tool
        || message
            .content
            .iter()
            .any(|part| matches!(part, ContentPart::ToolResult(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summarize::summary_message;
    use serde_json::json;
    use tower_agent_core::{ToolCall, ToolResult};

    fn call(id: &str) -> ToolCall {
        ToolCall::new(id, "t", json!({}))
    }

    fn batch(ids: &[&str]) -> Vec<Message> {
        let mut out = vec![Message::assistant_with_calls(
            "",
            ids.iter().map(|id| call(id)),
        )];
        out.extend(
            ids.iter()
                .map(|id| Message::tool_result(ToolResult::success(&call(id), "ok"))),
        );
        out
    }

    #[test]
    fn cuts_never_fall_inside_a_batch() {
        let mut messages = vec![Message::user("go")];
        messages.extend(batch(&["a", "b", "c"]));
        messages.push(Message::assistant("done"));
        // [U, A(a,b,c), T, T, T, A]: cuts at 1 (before the batch) or 5 (after it).
        assert_eq!(safe_cut(&messages, 5), Some(5));
        for want in 2..=4 {
            assert_eq!(safe_cut(&messages, want), Some(1), "want {want}");
        }
        assert_eq!(safe_cut(&messages, 0), None);
        // A previous summary alone is not worth summarizing again.
        messages[0] = summary_message("earlier");
        assert_eq!(safe_cut(&messages, 1), None);
        assert_eq!(safe_cut(&messages, 3), None);
        assert_eq!(safe_cut(&messages, 5), Some(5));
    }

    fn result(id: &str) -> Message {
        Message::tool_result(ToolResult::success(&call(id), "ok"))
    }

    #[test]
    fn a_cut_moves_past_a_batch_only_partly_answered() {
        // [U, A(a,b), T(a), U, A]: `b` never answered.
        let messages = vec![
            Message::user("go"),
            Message::assistant_with_calls("", [call("a"), call("b")]),
            result("a"),
            Message::user("on"),
            Message::assistant("done"),
        ];
        // A safe cut alone would keep the batch without `b`'s result.
        assert_eq!(safe_cut(&messages, 2), Some(1));
        for want in 1..=3 {
            assert_eq!(choose_cut(&messages, want), Cut::At(3), "want {want}");
        }
        assert_eq!(choose_cut(&messages, 4), Cut::At(4));
        // [U, A(a,b), T(a), A, T(b), U]: `b`'s result apart from its call.
        let apart = vec![
            Message::user("go"),
            Message::assistant_with_calls("", [call("a"), call("b")]),
            result("a"),
            Message::assistant("reading"),
            result("b"),
            Message::user("on"),
        ];
        assert_eq!(choose_cut(&apart, 3), Cut::At(5));
        assert_eq!(choose_cut(&apart, 1), Cut::At(5));
        // Ending the history, the batch may wait: kept whole.
        let running = &apart[..3];
        assert_eq!(choose_cut(running, 2), Cut::At(1));
        // Broken at its very end: no cut helps.
        assert!(matches!(
            choose_cut(&apart[..5], 3),
            Cut::Broken(HistoryError::OrphanResult { .. })
        ));
        // An id used twice: the cut moves past its first use.
        let mut twice = vec![Message::user("go")];
        twice.extend(batch(&["a"]));
        twice.push(Message::user("again"));
        twice.extend(batch(&["a"]));
        assert_eq!(choose_cut(&twice, 1), Cut::At(4));
        assert_eq!(choose_cut(&[Message::user("go")], 0), Cut::Nothing);
    }
}
