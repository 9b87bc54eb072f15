//! The in-memory store.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, PoisonError, RwLock};

use tower_agent_core::Session;

use crate::{BoxFuture, ListQuery, Page, SessionStore, StoreError, Stored, Version, check_id};

/// Sessions in memory, shared by clones: for tests and short-lived hosts. A session's
/// history is shared with the caller copy-on-write, so a save copies no message.
#[derive(Debug, Clone, Default)]
pub struct InMemorySessions {
    sessions: Arc<RwLock<BTreeMap<String, Stored>>>,
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
            Ok(sessions.get(id).cloned())
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
            let found = sessions.get(&session.id).map(|stored| stored.version);
            if found != expected {
                return Err(StoreError::Conflict {
                    id: session.id.clone(),
                    expected,
                    found,
                });
            }
            let version = Version(found.map_or(1, |v| v.0 + 1));
            let stored = Stored {
                session: session.clone(),
                version,
            };
            sessions.insert(session.id.clone(), stored);
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
            match sessions.get(id).map(|stored| stored.version) {
                None => Ok(false),
                Some(found) if found == expected => {
                    sessions.remove(id);
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
