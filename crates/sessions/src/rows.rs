//! What the SQL stores share: their errors, the JSON they store, and a session read back
//! from its row and its message rows.

use tower_agent_core::{History, Message, Session};

use crate::{BoxError, StoreError, Version};

pub(crate) fn backend(error: impl Into<BoxError>) -> StoreError {
    StoreError::Backend(error.into())
}

pub(crate) fn corrupt(id: &str, why: impl Into<BoxError>) -> StoreError {
    StoreError::Corrupt {
        id: id.to_owned(),
        source: why.into(),
    }
}

pub(crate) fn json(value: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(backend)
}

/// A stored version of session `id` (a negative one is a corrupt row).
pub(crate) fn version(id: &str, stored: i64) -> Result<Version, StoreError> {
    u64::try_from(stored)
        .map(Version)
        .map_err(|e| corrupt(id, e))
}

/// The JSON columns of a session's row: its state, interrupts and write-ahead record.
pub(crate) struct Columns {
    pub(crate) state: String,
    pub(crate) interrupts: String,
    pub(crate) started: String,
}

impl Columns {
    /// The columns of `session`.
    pub(crate) fn of(session: &Session) -> Result<Self, StoreError> {
        Ok(Self {
            state: json(&session.state)?,
            interrupts: json(&session.interrupts)?,
            started: json(&session.started)?,
        })
    }
}

/// Session `id` from its row (`len` messages, its JSON columns) and its message rows
/// (position, JSON) in order: a missing, misplaced or unreadable one is a corrupt row.
pub(crate) fn session<B: AsRef<str>>(
    id: &str,
    len: i64,
    columns: &Columns,
    rows: impl IntoIterator<Item = (i64, B)>,
) -> Result<Session, StoreError> {
    let mut messages = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    for (seq, body) in rows {
        if seq != messages.len() as i64 {
            return Err(corrupt(id, format!("message {seq} is out of place")));
        }
        let message: Message = serde_json::from_str(body.as_ref())
            .map_err(|e| corrupt(id, format!("message {seq}: {e}")))?;
        messages.push(message);
    }
    if messages.len() as i64 != len {
        let held = messages.len();
        return Err(corrupt(
            id,
            format!("{held} messages stored, {len} expected"),
        ));
    }
    Ok(Session {
        id: id.to_owned(),
        history: History::from(messages),
        state: serde_json::from_str(&columns.state)
            .map_err(|e| corrupt(id, format!("state: {e}")))?,
        interrupts: serde_json::from_str(&columns.interrupts)
            .map_err(|e| corrupt(id, format!("interrupts: {e}")))?,
        started: serde_json::from_str(&columns.started)
            .map_err(|e| corrupt(id, format!("started: {e}")))?,
    })
}
