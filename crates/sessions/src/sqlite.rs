//! The SQLite store: one file, write-ahead logging, the schema made and migrated by version.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tower_agent_core::{Session, new_id};

use crate::known::{KnownHistories, prefix_end};
use crate::rows::{Columns, backend, json, session, version};
use crate::{BoxFuture, ListQuery, Page, SessionStore, StoreError, Stored, Version, check_id};

/// The schema, one migration per version: the database's `user_version` says how many ran.
const MIGRATIONS: &[&str] = &[
    // 1: a row per session, a row per message.
    "CREATE TABLE sessions (
        id TEXT PRIMARY KEY NOT NULL,
        version INTEGER NOT NULL,
        incarnation TEXT NOT NULL,
        len INTEGER NOT NULL,
        state TEXT NOT NULL,
        interrupts TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE messages (
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;",
    // 2: one counter numbers every save of the file, so a session deleted and made again never
    // gets a version it had before; it starts above every version stored.
    "CREATE TABLE last_version (version INTEGER NOT NULL);
    INSERT INTO last_version (version) SELECT coalesce(max(version), 0) FROM sessions;",
    // 3: the write-ahead record of calls that started and have no result (`Session::started`).
    "ALTER TABLE sessions ADD COLUMN started TEXT NOT NULL DEFAULT '[]';",
];

/// Sessions in one SQLite file: the embedded default. SQLite is compiled in (no system
/// library); the file is made, put in write-ahead-log mode and its schema migrated on
/// [`open`](SqliteSessions::open).
///
/// Each save is one transaction that appends the messages added since this store last saved
/// or loaded the session (a round writes its new messages, not the whole history) and rewrites
/// the session's small row (version, state, pending interrupts). Saves from several processes
/// on one file are safe: the version check and the write happen in one write transaction.
///
/// A transaction commits with `synchronous = NORMAL`, SQLite's advice for write-ahead logging:
/// a killed process loses nothing committed; a power cut may lose the last commits (never
/// half of one). [`from_connection`](SqliteSessions::from_connection) takes a connection the
/// host set up (another `synchronous`, an in-memory database, a size limit).
///
/// Versions are numbered by one counter for the whole file (a table of one row, written in
/// each save's transaction), so a session deleted and made again never gets a version of the
/// one before (see [`Version`]).
///
/// # What reaches the disk
///
/// A commit writes every page it changed to the write-ahead log (`<file>-wal`) first; a
/// checkpoint copies the log's pages into the database file. SQLite checkpoints by itself when
/// the log passes 1,000 pages, and when the last connection to the file closes (it then
/// removes the log).
///
/// - **The database file**: the store turns on `secure_delete`, so the text of a message that
///   was deleted or rewritten (an edited or redacted history, a deleted session) is
///   overwritten with zeros in the page that held it, and a page freed whole is zeroed. The
///   file holds none of it once the change is checkpointed into it.
/// - **The write-ahead log**: until then, and after it, the log holds the pages as each
///   commit wrote them, the old text among them: a checkpoint does not shorten the log, later
///   commits write over it from its start. To erase a deleted text now, run
///   `PRAGMA wal_checkpoint(TRUNCATE)` on a connection to the file (it copies the log into
///   the file and truncates the log to zero bytes), as `tests/sqlite.rs` does.
/// - **Not in SQLite's reach**: copies of the file (backups, snapshots), and what the file
///   system or the drive keep of blocks they remapped; `secure_delete` zeroes bytes in the
///   file, not the medium. A connection that does not turn `secure_delete` on (a program of
///   its own writing the same file) leaves what it deletes in the file.
///
/// ```
/// use tower_agent_core::{Message, Session};
/// use tower_agent_sessions::{SessionStore, SqliteSessions};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_agent_sessions::StoreError> {
/// let dir = std::env::temp_dir().join(format!("doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let store = SqliteSessions::open(dir.join("sessions.db")).await?;
/// let mut session = Session::with_id("chat-1");
/// session.history.push(Message::user("hi"));
/// let v1 = store.save(&session, None).await?;
/// session.history.push(Message::assistant("hello"));
/// store.save(&session, Some(v1)).await?; // writes one message
///
/// let again = SqliteSessions::open(dir.join("sessions.db")).await?; // another process, say
/// let stored = again.load("chat-1").await?.expect("saved");
/// assert_eq!(stored.session, session);
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteSessions {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    connection: Mutex<Connection>,
    known: KnownHistories,
}

impl SqliteSessions {
    /// Open (or make) the database file at `path`, in write-ahead-log mode, and bring its
    /// schema to this version.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when the file cannot be opened or written;
    /// [`StoreError::Schema`] when a newer version of this crate made it.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_owned();
        let connection = blocking(move || {
            let connection = Connection::open(&path).map_err(backend)?;
            connection
                .pragma_update(None, "journal_mode", "WAL")
                .map_err(backend)?;
            connection
                .pragma_update(None, "synchronous", "NORMAL")
                .map_err(backend)?;
            Ok(connection)
        })
        .await?;
        Self::from_connection(connection).await
    }

    /// A store over a connection the host opened and set up; its schema is brought to this
    /// version. Foreign keys are turned on, deleted content is zeroed (`secure_delete`, see
    /// [`SqliteSessions`]) and a busy timeout of 5 s set (several processes may write one
    /// file).
    ///
    /// # Errors
    ///
    /// As [`open`](SqliteSessions::open).
    pub async fn from_connection(connection: Connection) -> Result<Self, StoreError> {
        let connection = blocking(move || {
            let mut connection = connection;
            connection
                .pragma_update(None, "foreign_keys", true)
                .map_err(backend)?;
            connection
                .pragma_update(None, "secure_delete", true)
                .map_err(backend)?;
            connection
                .busy_timeout(std::time::Duration::from_secs(5))
                .map_err(backend)?;
            migrate(&mut connection)?;
            Ok(connection)
        })
        .await?;
        Ok(Self {
            inner: Arc::new(Inner {
                connection: Mutex::new(connection),
                known: KnownHistories::default(),
            }),
        })
    }

    /// The schema version this crate writes.
    pub const SCHEMA: u32 = MIGRATIONS.len() as u32;

    /// Run `f` on the connection, on a thread that may block.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection, &KnownHistories) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let mut connection = inner
                .connection
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            f(&mut connection, &inner.known)
        })
        .await
    }
}

/// Run `f` where blocking is allowed.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|join| backend(format!("the store's thread failed: {join}")))?
}

/// Bring the schema to [`MIGRATIONS`]' version, each migration in its own transaction.
fn migrate(connection: &mut Connection) -> Result<(), StoreError> {
    let found: u32 = connection
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(backend)?;
    let supported = SqliteSessions::SCHEMA;
    if found > supported {
        return Err(StoreError::Schema { found, supported });
    }
    for (done, migration) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let tx = connection
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(backend)?;
        // Another process may have migrated meanwhile.
        let now: u32 = tx
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(backend)?;
        if now > done as u32 {
            continue;
        }
        tx.execute_batch(migration).map_err(backend)?;
        tx.pragma_update(None, "user_version", done as u32 + 1)
            .map_err(backend)?;
        tx.commit().map_err(backend)?;
    }
    Ok(())
}

impl SessionStore for SqliteSessions {
    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        let id = id.to_owned();
        Box::pin(async move {
            check_id(&id)?;
            self.with(move |connection, known| {
                let tx = connection.transaction().map_err(backend)?;
                let row = tx
                    .query_row(
                        "SELECT version, incarnation, len, state, interrupts, started
                         FROM sessions WHERE id = ?1",
                        [&id],
                        |row| {
                            Ok((
                                row.get::<_, i64>(0)?,
                                row.get::<_, String>(1)?,
                                row.get::<_, i64>(2)?,
                                Columns {
                                    state: row.get(3)?,
                                    interrupts: row.get(4)?,
                                    started: row.get(5)?,
                                },
                            ))
                        },
                    )
                    .optional()
                    .map_err(backend)?;
                let Some((stored, incarnation, len, columns)) = row else {
                    return Ok(None);
                };
                let mut statement = tx
                    .prepare_cached(
                        "SELECT seq, body FROM messages WHERE session_id = ?1 ORDER BY seq",
                    )
                    .map_err(backend)?;
                let rows = statement
                    .query_map([&id], |row| {
                        Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
                    })
                    .map_err(backend)?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(backend)?;
                let session = session(&id, len, &columns, rows)?;
                let version = version(&id, stored)?;
                known.record(&session, version, &incarnation);
                Ok(Some(Stored { session, version }))
            })
            .await
        })
    }

    fn save<'a>(
        &'a self,
        session: &'a Session,
        expected: Option<Version>,
    ) -> BoxFuture<'a, Result<Version, StoreError>> {
        Box::pin(async move {
            check_id(&session.id)?;
            let session = session.clone();
            self.with(move |connection, known| {
                let tx = connection
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(backend)?;
                let found = tx
                    .query_row(
                        "SELECT version, incarnation FROM sessions WHERE id = ?1",
                        [&session.id],
                        |row| Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?)),
                    )
                    .optional()
                    .map_err(backend)?;
                let found = found
                    .map(|(v, incarnation)| {
                        Ok::<_, StoreError>((version(&session.id, v)?, incarnation))
                    })
                    .transpose()?;
                if found.as_ref().map(|(v, _)| *v) != expected {
                    return Err(StoreError::Conflict {
                        id: session.id.clone(),
                        expected,
                        found: found.map(|(v, _)| v),
                    });
                }
                let Columns {
                    state,
                    interrupts,
                    started,
                } = Columns::of(&session)?;
                let len = session.history.len() as i64;
                let next: i64 = tx
                    .query_row(
                        "UPDATE last_version SET version = version + 1 RETURNING version",
                        [],
                        |row| row.get(0),
                    )
                    .map_err(backend)?;
                let (incarnation, kept) = match found {
                    Some((version, incarnation)) => {
                        let kept = known.stored(&session, version, &incarnation);
                        tx.execute(
                            "UPDATE sessions
                             SET version = ?2, len = ?3, state = ?4, interrupts = ?5, started = ?6
                             WHERE id = ?1",
                            params![session.id, next, len, state, interrupts, started],
                        )
                        .map_err(backend)?;
                        (incarnation, kept)
                    }
                    None => {
                        let incarnation = new_id();
                        tx.execute(
                            "INSERT INTO sessions
                                 (id, version, incarnation, len, state, interrupts, started)
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                            params![
                                session.id,
                                next,
                                incarnation,
                                len,
                                state,
                                interrupts,
                                started
                            ],
                        )
                        .map_err(backend)?;
                        (incarnation, 0)
                    }
                };
                let version = version(&session.id, next)?;
                tx.execute(
                    "DELETE FROM messages WHERE session_id = ?1 AND seq >= ?2",
                    params![session.id, kept as i64],
                )
                .map_err(backend)?;
                {
                    let mut insert = tx
                        .prepare_cached(
                            "INSERT INTO messages (session_id, seq, body) VALUES (?1, ?2, ?3)",
                        )
                        .map_err(backend)?;
                    for (seq, message) in session.history.iter().enumerate().skip(kept) {
                        let body = json(message)?;
                        insert
                            .execute(params![session.id, seq as i64, body])
                            .map_err(backend)?;
                    }
                }
                tx.commit().map_err(backend)?;
                known.record(&session, version, &incarnation);
                Ok(version)
            })
            .await
        })
    }

    fn list<'a>(&'a self, query: &'a ListQuery) -> BoxFuture<'a, Result<Page, StoreError>> {
        let query = query.clone();
        Box::pin(async move {
            self.with(move |connection, _| {
                let start = match &query.after {
                    Some(after) if *after >= query.prefix => after.clone(),
                    _ => query.prefix.clone(),
                };
                let inclusive = query
                    .after
                    .as_ref()
                    .is_none_or(|after| *after < query.prefix);
                let limit = query.page_size();
                let mut statement = connection
                    .prepare_cached(
                        "SELECT id, version FROM sessions
                         WHERE (id > ?1 OR (?2 AND id = ?1)) AND (?3 IS NULL OR id < ?3)
                         ORDER BY id LIMIT ?4",
                    )
                    .map_err(backend)?;
                let end = prefix_end(&query.prefix);
                let rows = statement
                    .query_map(params![start, inclusive, end, limit as i64 + 1], |row| {
                        Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
                    })
                    .map_err(backend)?;
                let mut sessions = Vec::with_capacity(limit + 1);
                for row in rows {
                    let (id, stored) = row.map_err(backend)?;
                    let version = version(&id, stored)?;
                    sessions.push((id, version));
                }
                Ok(Page::of_one_more(sessions, limit))
            })
            .await
        })
    }

    fn delete<'a>(
        &'a self,
        id: &'a str,
        expected: Version,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let id = id.to_owned();
        Box::pin(async move {
            check_id(&id)?;
            self.with(move |connection, known| {
                let tx = connection
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(backend)?;
                let found: Option<i64> = tx
                    .query_row("SELECT version FROM sessions WHERE id = ?1", [&id], |row| {
                        row.get(0)
                    })
                    .optional()
                    .map_err(backend)?;
                let Some(found) = found else {
                    return Ok(false);
                };
                let found = version(&id, found)?;
                if found != expected {
                    return Err(StoreError::Conflict {
                        id,
                        expected: Some(expected),
                        found: Some(found),
                    });
                }
                tx.execute("DELETE FROM sessions WHERE id = ?1", [&id])
                    .map_err(backend)?;
                tx.commit().map_err(backend)?;
                known.forget(&id);
                Ok(true)
            })
            .await
        })
    }
}
