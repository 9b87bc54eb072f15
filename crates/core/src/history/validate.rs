//! Whether a history is valid to send to a model, and why not.

use std::collections::{HashMap, HashSet};

use crate::message::{Message, Role};

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
    use crate::history::tests::{answer, call};

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
}
