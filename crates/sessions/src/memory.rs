//! The in-memory store.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, PoisonError, RwLock};

use tower_agent_core::Session;

use crate::{BoxFuture, ListQuery, Page, SessionStore, StoreError, Stored, Version, check_id};

/// Sessions in memory, shared by clones: for tests and short-lived hosts. A session's
/// history is shared with the caller copy-on-write, so a save copies no message.
///
/// Versions are numbered by one counter for the whole store, so a session deleted and made
/// again never gets a version of the one before (see [`Version`]), and nothing is kept of a
/// deleted session.
#[derive(Debug, Clone, Default)]
pub struct InMemorySessions {
    sessions: Arc<RwLock<Sessions>>,
}

/// The sessions, and the last version the store gave.
#[derive(Debug, Default)]
struct Sessions {
    by_id: BTreeMap<String, Stored>,
    last: u64,
}

impl InMemorySessions {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl SessionStore for InMemorySessions {
    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        Box::pin(async move {
            check_id(id)?;
            let sessions = self.sessions.read().unwrap_or_else(PoisonError::into_inner);
            Ok(sessions.by_id.get(id).cloned())
        })
    }

    fn save<'a>(
        &'a self,
        session: &'a Session,
        expected: Option<Version>,
    ) -> BoxFuture<'a, Result<Version, StoreError>> {
        Box::pin(async move {
            check_id(&session.id)?;
            let mut sessions = self
                .sessions
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let found = sessions.by_id.get(&session.id).map(|stored| stored.version);
            if found != expected {
                return Err(StoreError::Conflict {
                    id: session.id.clone(),
                    expected,
                    found,
                });
            }
            sessions.last += 1;
            let version = Version(sessions.last);
            let stored = Stored {
                session: session.clone(),
                version,
            };
            sessions.by_id.insert(session.id.clone(), stored);
            Ok(version)
        })
    }

    fn list<'a>(&'a self, query: &'a ListQuery) -> BoxFuture<'a, Result<Page, StoreError>> {
        Box::pin(async move {
            let sessions = self.sessions.read().unwrap_or_else(PoisonError::into_inner);
            let start = match &query.after {
                Some(after) if after.as_str() >= query.prefix.as_str() => {
                    Bound::Excluded(after.as_str())
                }
                _ => Bound::Included(query.prefix.as_str()),
            };
            let limit = query.page_size();
            let matching = sessions
                .by_id
                .range::<str, _>((start, Bound::Unbounded))
                .take_while(|(id, _)| id.starts_with(&query.prefix))
                .map(|(id, stored)| (id.clone(), stored.version));
            let sessions = matching.take(limit + 1).collect();
            Ok(Page::of_one_more(sessions, limit))
        })
    }

    fn delete<'a>(
        &'a self,
        id: &'a str,
        expected: Version,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            check_id(id)?;
            let mut sessions = self
                .sessions
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            match sessions.by_id.get(id).map(|stored| stored.version) {
                None => Ok(false),
                Some(found) if found == expected => {
                    sessions.by_id.remove(id);
                    Ok(true)
                }
                found => Err(StoreError::Conflict {
                    id: id.to_owned(),
                    expected: Some(expected),
                    found,
                }),
            }
        })
    }
}
