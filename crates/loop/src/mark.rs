//! What a session was when it was saved last: a saver that writes only when the session
//! changed keeps this, not a copy of the session.

use serde_json::{Map, Value};
use tower_agent_core::{CallKey, HistoryMark, Interrupt, Session};

/// A session as it was ([`SessionMark::of`]): its history's mark, its state, its interrupts
/// and its write-ahead record.
///
/// ```
/// use tower_agent_core::{Message, Session};
/// use tower_agent_loop::SessionMark;
///
/// let mut session = Session::with_id("s1");
/// session.history.push(Message::user("hi"));
/// let saved = SessionMark::of(&session);
/// assert!(saved.is(&session));
/// session.history.push(Message::assistant("hello"));
/// assert!(!saved.is(&session), "a message more");
/// ```
#[derive(Debug, Clone)]
pub struct SessionMark {
    history: HistoryMark,
    state: Map<String, Value>,
    interrupts: Vec<Interrupt>,
    started: Vec<CallKey>,
}

impl SessionMark {
    /// What `session` is now, to tell later whether a session is still the same one
    /// ([`SessionMark::is`]) without keeping a copy of its history.
    pub fn of(session: &Session) -> Self {
        Self {
            history: session.history.mark(),
            state: session.state.clone(),
            interrupts: session.interrupts.clone(),
            started: session.started.clone(),
        }
    }

    /// Whether `session` is the one marked: the same messages (none added, none edited), state,
    /// interrupts and write-ahead record.
    pub fn is(&self, session: &Session) -> bool {
        let history = &session.history;
        history.len() == self.history.len()
            && history.kept(&self.history) == history.len()
            && session.state == self.state
            && session.interrupts == self.interrupts
            && session.started == self.started
    }
}
