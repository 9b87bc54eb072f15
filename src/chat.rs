//! For chat hosts: a message that asks to cancel the running agent.

use tower_agent_loop::RunHandle;

/// The messages [`CancelOnKeyword::cancel_on_keyword`] takes as "cancel": the whole message, any
/// case, a leading `/` and trailing punctuation ignored.
pub const CANCEL_KEYWORDS: &[&str] = &["stop", "cancel", "abort", "halt", "quit"];

/// Whether `message` asks to cancel the running agent (see [`CANCEL_KEYWORDS`]).
///
/// ```
/// use tower_agent::chat::is_cancel_keyword;
///
/// assert!(is_cancel_keyword("STOP!"));
/// assert!(is_cancel_keyword(" /cancel "));
/// assert!(!is_cancel_keyword("stop the server on port 80")); // an instruction, not a keyword
/// ```
pub fn is_cancel_keyword(message: &str) -> bool {
    let word = message
        .trim()
        .trim_start_matches('/')
        .trim_end_matches(|c: char| c.is_ascii_punctuation());
    CANCEL_KEYWORDS
        .iter()
        .any(|keyword| word.eq_ignore_ascii_case(keyword))
}

/// Cancel a spawned run when a chat message is a cancel keyword.
pub trait CancelOnKeyword {
    /// For a chat host that receives messages while the run works: cancel the run when
    /// `message` is a cancel keyword ([`is_cancel_keyword`]) and say whether it did. The run
    /// ends [`Outcome::Cancelled`](crate::Outcome::Cancelled) with what it was working on
    /// ([`Outcome::summary`](crate::Outcome::summary)); any other message is left to the host
    /// (queue it as the next input).
    fn cancel_on_keyword(&self, message: &str) -> bool;
}

impl CancelOnKeyword for RunHandle {
    fn cancel_on_keyword(&self, message: &str) -> bool {
        let cancel = is_cancel_keyword(message);
        if cancel {
            self.cancel();
        }
        cancel
    }
}
