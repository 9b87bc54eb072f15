//! Session stores for [tower-agent](https://docs.rs/tower-agent): where a host keeps its
//! sessions between runs, and between processes.
//!
//! One small async trait, [`SessionStore`]: load, save with optimistic concurrency, list by
//! prefix (paged), delete. Every save names the version it replaces: the second of two
//! writers that loaded the same version fails with [`StoreError::Conflict`], and nothing is
//! overwritten silently.
//!
//! | store | feature | for |
//! |---|---|---|
//! | [`InMemorySessions`] | | tests, short-lived hosts |
//! | [`SqliteSessions`] | `sqlite` (default) | one process or a few on one machine: one file, no setup |
//! | `PostgresSessions` | `postgres` | many processes on many machines |
//!
//! [`StoreLayer`] runs an agent on a store's sessions: a request names its session by id, and
//! the run saves it at every step, so a process that dies loses at most the step in flight.
//!
//! ```
//! use tower_agent_core::{Message, Session};
//! use tower_agent_sessions::{InMemorySessions, SessionStore, StoreError};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), StoreError> {
//! let store = InMemorySessions::new();
//! let mut session = Session::new();
//! session.id = "user-7/chat-1".into();
//! session.history.push(Message::user("hi"));
//! let first = store.save(&session, None).await?; // a new session
//!
//! let stored = store.load(&session.id).await?.expect("saved");
//! assert_eq!((stored.version, stored.session.history.len()), (first, 1));
//!
//! // Two writers loaded the first version: the second one to save is refused.
//! session.history.push(Message::assistant("hello"));
//! store.save(&session, Some(first)).await?;
//! let stale = store.save(&session, Some(first)).await;
//! assert!(matches!(stale, Err(StoreError::Conflict { .. })));
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod known;
mod layer;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod rows;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use tower_agent_core::{BoxError, Session};

pub use layer::{StoreLayer, StoreService};
pub use memory::InMemorySessions;
#[cfg(feature = "postgres")]
pub use postgres::PostgresSessions;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteSessions;

/// A boxed future, as the trait's methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The longest session id a store takes, in bytes.
pub const MAX_ID_LEN: usize = 512;

/// The version of a stored session: every save gives it a new one, above the one it replaces.
///
/// A version never repeats for an id, even after the session was deleted and made again: the
/// stores of this crate number every save with one counter of the whole store (so the versions
/// of one session grow with gaps, where other sessions were saved). A writer that holds a
/// version of a deleted session is therefore refused by the session made again under its id
/// ([`StoreError::Conflict`]), and cannot overwrite or delete it. Compare two versions of one
/// id, never of two ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub u64);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// A session as a store holds it, with its version.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Stored {
    /// The session.
    pub session: Session,
    /// Its version: name it when saving the session again.
    pub version: Version,
}

impl Stored {
    /// `session` at `version` (for a store's `load`).
    pub fn new(session: Session, version: Version) -> Self {
        Self { session, version }
    }
}

/// The most ids a page of a listing holds.
pub const MAX_PAGE: usize = 1_000;

/// What to list: the ids that start with `prefix`, in order, from after `after`, at most
/// `limit` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListQuery {
    /// The ids' common start (`""` for all). Ids of one owner share a prefix by convention
    /// (`user-7/...`).
    pub prefix: String,
    /// List the ids after this one (the `next` of the previous page).
    pub after: Option<String>,
    /// The most ids on a page (1 to [`MAX_PAGE`]; stores read it through
    /// [`ListQuery::page_size`]).
    pub limit: usize,
}

impl ListQuery {
    /// The first page of the ids starting with `prefix`, 100 per page.
    pub fn prefix(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            after: None,
            limit: 100,
        }
    }

    /// At most `limit` ids a page (1 to [`MAX_PAGE`]).
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit.clamp(1, MAX_PAGE);
        self
    }

    /// The most ids a page holds: [`limit`](ListQuery::limit) within 1 to [`MAX_PAGE`].
    pub fn page_size(&self) -> usize {
        self.limit.clamp(1, MAX_PAGE)
    }

    /// The page after the one that ended with `id`.
    pub fn after(mut self, id: impl Into<String>) -> Self {
        self.after = Some(id.into());
        self
    }
}

/// A page of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Page {
    /// The ids with their versions, in order.
    pub sessions: Vec<(String, Version)>,
    /// The query's `after` for the next page; `None` on the last one.
    pub next: Option<String>,
}

impl Page {
    /// The page of a query that asked for one id more than `limit`: the extra one, when it
    /// came, says there is a next page.
    pub(crate) fn of_one_more(mut sessions: Vec<(String, Version)>, limit: usize) -> Self {
        let next = if sessions.len() > limit {
            sessions.truncate(limit);
            sessions.last().map(|(id, _)| id.clone())
        } else {
            None
        };
        Page { sessions, next }
    }
}

/// Why a store refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Another writer saved the session since `expected` was loaded (or created it, when
    /// `expected` is `None`; or deleted it). Load it again, apply the change, save again.
    #[error("session `{id}` is at {found}, not at {expected}: another writer saved it", found = found.map_or("none".to_owned(), |v| v.to_string()), expected = expected.map_or("none".to_owned(), |v| v.to_string()))]
    Conflict {
        /// The session's id.
        id: String,
        /// The version the save replaces (`None`: a new session).
        expected: Option<Version>,
        /// The version stored (`None`: none).
        found: Option<Version>,
    },
    /// The id cannot name a session: empty, longer than [`MAX_ID_LEN`] bytes, or holding a
    /// control character.
    #[error("invalid session id: {reason}")]
    InvalidId {
        /// What is wrong with it.
        reason: String,
    },
    /// A stored session could not be read back (a corrupt row, a schema from a newer
    /// version); what was stored before is untouched.
    #[error("session `{id}` cannot be read: {source}")]
    Corrupt {
        /// The session's id.
        id: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The store was made by a newer version of this crate: its schema is at `found`, this
    /// version knows up to `supported`. Nothing was changed.
    #[error(
        "the store's schema is at version {found}, newer than this crate's {supported}: upgrade tower-agent-sessions"
    )]
    Schema {
        /// The schema version found.
        found: u32,
        /// The newest this crate knows.
        supported: u32,
    },
    /// The backend failed (a lost connection, a full disk); nothing was half-written.
    #[error("the session store failed: {0}")]
    Backend(#[source] BoxError),
}

/// Check that `id` can name a session.
///
/// # Errors
///
/// [`StoreError::InvalidId`] when it is empty, longer than [`MAX_ID_LEN`] bytes, or holds a
/// control character.
pub fn check_id(id: &str) -> Result<(), StoreError> {
    let reason = if id.is_empty() {
        "it is empty".to_owned()
    } else if id.len() > MAX_ID_LEN {
        format!("it is {} bytes long, more than {MAX_ID_LEN}", id.len())
    } else if id.chars().any(char::is_control) {
        "it holds a control character".to_owned()
    } else {
        return Ok(());
    };
    Err(StoreError::InvalidId { reason })
}

/// Where sessions are kept: load, save with optimistic concurrency, list, delete.
///
/// A save names the version it replaces (`None` for a new session) and returns the new one;
/// when the store holds another, nothing is written and the save fails with
/// [`StoreError::Conflict`]. Each save is all or nothing.
///
/// A store never gives an id a version it gave that id before, even when the session was
/// deleted in between (see [`Version`]): a store-wide counter does it without remembering the
/// deleted ids.
pub trait SessionStore: Send + Sync + 'static {
    /// The session stored under `id`, with its version; `None` when there is none.
    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>>;

    /// Store `session` under `session.id`, replacing version `expected` (`None`: a new
    /// session); returns the new version.
    fn save<'a>(
        &'a self,
        session: &'a Session,
        expected: Option<Version>,
    ) -> BoxFuture<'a, Result<Version, StoreError>>;

    /// The ids (and versions) of a query's page.
    fn list<'a>(&'a self, query: &'a ListQuery) -> BoxFuture<'a, Result<Page, StoreError>>;

    /// Remove the session stored under `id` at version `expected`; `false` when there was
    /// none.
    fn delete<'a>(
        &'a self,
        id: &'a str,
        expected: Version,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
}
