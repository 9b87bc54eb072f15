//! The Postgres store: sessions shared by processes on many machines.

use std::fmt;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Transaction};
use tokio_postgres::{NoTls, Statement};
use tower_agent_core::{Session, new_id};

use crate::known::{KnownHistories, prefix_end};
use crate::rows::{Columns, backend, corrupt, json, session, version};
use crate::{BoxFuture, ListQuery, Page, SessionStore, StoreError, Stored, Version, check_id};

/// The schema, one migration per version; `tower_agent_schema` holds how many ran. Ids compare
/// byte by byte (`COLLATE "C"`), as in every store, so listing by prefix is one index range.
const MIGRATIONS: &[&str] = &[
    // 1: a row per session, a row per message.
    "CREATE TABLE tower_agent_sessions (
        id TEXT COLLATE \"C\" PRIMARY KEY,
        version BIGINT NOT NULL,
        incarnation TEXT NOT NULL,
        len BIGINT NOT NULL,
        state TEXT NOT NULL,
        interrupts TEXT NOT NULL
    );
    CREATE TABLE tower_agent_messages (
        session_id TEXT COLLATE \"C\" NOT NULL
            REFERENCES tower_agent_sessions (id) ON DELETE CASCADE,
        seq BIGINT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    );",
    // 2: one sequence numbers every save, so a session deleted and made again never gets a
    // version it had before; it starts above every version stored.
    "CREATE SEQUENCE tower_agent_versions;
    SELECT setval('tower_agent_versions',
        (SELECT coalesce(max(version), 0) + 1 FROM tower_agent_sessions), false);",
    // 3: the write-ahead record of calls that started and have no result (`Session::started`).
    "ALTER TABLE tower_agent_sessions ADD COLUMN started TEXT NOT NULL DEFAULT '[]';",
];

/// Sessions in Postgres, for processes on many machines: two tables (`tower_agent_sessions`,
/// `tower_agent_messages`) made and migrated on [`connect`](PostgresSessions::connect), a
/// pool of connections (deadpool).
///
/// Each save is one transaction that locks the session's row, checks its version, appends
/// the messages added since this store last saved or loaded the session in one statement and
/// rewrites the small row; a lost connection rolls it back whole. Versions are numbered by one
/// sequence (`tower_agent_versions`) for all sessions, so a session deleted and made again
/// never gets a version of the one before (see [`Version`]). Messages and state are
/// stored as JSON text (`TEXT`, not `JSONB`: a text with a NUL character is stored as it is).
///
/// ```no_run
/// use tower_agent_sessions::{PostgresSessions, SessionStore};
///
/// # async fn run() -> Result<(), tower_agent_sessions::StoreError> {
/// let store = PostgresSessions::connect("postgres://agent@127.0.0.1:5432/agent").await?;
/// let stored = store.load("chat-1").await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresSessions {
    pool: Pool,
    known: std::sync::Arc<KnownHistories>,
}

impl fmt::Debug for PostgresSessions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The pool's configuration holds the password: show only its size.
        f.debug_struct("PostgresSessions")
            .field("pool_size", &self.pool.status().max_size)
            .finish_non_exhaustive()
    }
}

/// Column `index` of a row of session `id`: a column of another type is a corrupt row.
fn column<'r, T: tokio_postgres::types::FromSql<'r>>(
    id: &str,
    row: &'r tokio_postgres::Row,
    index: usize,
) -> Result<T, StoreError> {
    row.try_get(index)
        .map_err(|e| corrupt(id, format!("column {index}: {e}")))
}

impl PostgresSessions {
    /// The schema version this crate writes.
    pub const SCHEMA: u32 = MIGRATIONS.len() as u32;

    /// Connect to the database at `url` (`postgres://user:password@host:port/db`, without
    /// TLS: use [`from_pool`](PostgresSessions::from_pool) for TLS) with a pool of up to 16
    /// connections, and bring the schema to this version.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when the url is not one or the database cannot be reached;
    /// [`StoreError::Schema`] when a newer version of this crate made the tables.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let config: tokio_postgres::Config = url.parse().map_err(backend)?;
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(16)
            .build()
            .map_err(backend)?;
        Self::from_pool(pool).await
    }

    /// A store over a pool the host made (TLS, another size, a statement timeout); the schema
    /// is brought to this version.
    ///
    /// # Errors
    ///
    /// As [`connect`](PostgresSessions::connect).
    pub async fn from_pool(pool: Pool) -> Result<Self, StoreError> {
        let store = Self {
            pool,
            known: Default::default(),
        };
        store.migrate().await?;
        Ok(store)
    }

    /// A pooled connection, not one the server closed meanwhile.
    async fn client(&self) -> Result<Object, StoreError> {
        loop {
            let client = self.pool.get().await.map_err(backend)?;
            if !client.is_closed() {
                return Ok(client);
            }
            drop(Object::take(client));
        }
    }

    /// Bring the schema to [`MIGRATIONS`]' version, under a lock other processes wait on.
    async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(backend)?;
        // One migrating process at a time (the key: "tower-agent" in ASCII).
        tx.execute("SELECT pg_advisory_xact_lock(7741247711)", &[])
            .await
            .map_err(backend)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS tower_agent_schema (version INTEGER NOT NULL)",
        )
        .await
        .map_err(backend)?;
        let found: i32 = match tx
            .query_opt("SELECT version FROM tower_agent_schema", &[])
            .await
            .map_err(backend)?
        {
            Some(row) => column("tower_agent_schema", &row, 0)?,
            None => {
                tx.execute("INSERT INTO tower_agent_schema (version) VALUES (0)", &[])
                    .await
                    .map_err(backend)?;
                0
            }
        };
        let found = u32::try_from(found)
            .map_err(|_| backend(format!("the schema version {found} is not a version")))?;
        if found > Self::SCHEMA {
            return Err(StoreError::Schema {
                found,
                supported: Self::SCHEMA,
            });
        }
        for migration in MIGRATIONS.iter().skip(found as usize) {
            tx.batch_execute(migration).await.map_err(backend)?;
        }
        tx.execute(
            "UPDATE tower_agent_schema SET version = $1",
            &[&(Self::SCHEMA as i32)],
        )
        .await
        .map_err(backend)?;
        tx.commit().await.map_err(backend)
    }
}

impl SessionStore for PostgresSessions {
    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        Box::pin(async move {
            check_id(id)?;
            let mut client = self.client().await?;
            let loaded = self.load_on(&mut client, id).await;
            settle(client, &loaded);
            loaded
        })
    }

    fn save<'a>(
        &'a self,
        session: &'a Session,
        expected: Option<Version>,
    ) -> BoxFuture<'a, Result<Version, StoreError>> {
        Box::pin(async move {
            let id = session.id.as_str();
            check_id(id)?;
            let mut client = self.client().await?;
            let saved = self.save_on(&mut client, session, expected).await;
            settle(client, &saved);
            saved
        })
    }

    fn list<'a>(&'a self, query: &'a ListQuery) -> BoxFuture<'a, Result<Page, StoreError>> {
        Box::pin(async move {
            let client = self.client().await?;
            let listed = list_on(&client, query).await;
            settle(client, &listed);
            listed
        })
    }

    fn delete<'a>(
        &'a self,
        id: &'a str,
        expected: Version,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            check_id(id)?;
            let mut client = self.client().await?;
            let deleted = self.delete_on(&mut client, id, expected).await;
            settle(client, &deleted);
            deleted
        })
    }
}

/// The statement `sql`, prepared once per connection (one round trip less per query).
async fn prepared(tx: &Transaction<'_>, sql: &str) -> Result<Statement, StoreError> {
    tx.prepare_cached(sql).await.map_err(backend)
}

/// Give a connection back to the pool, unless the operation failed on it: a connection that
/// failed (lost, or in a state nobody knows) is closed, and the pool makes a new one.
fn settle<T>(client: Object, result: &Result<T, StoreError>) {
    if let Err(StoreError::Backend(_)) = result {
        drop(Object::take(client));
    }
}

async fn list_on(client: &Object, query: &ListQuery) -> Result<Page, StoreError> {
    let (start, inclusive) = match &query.after {
        Some(after) if *after >= query.prefix => (after.as_str(), false),
        _ => (query.prefix.as_str(), true),
    };
    let limit = query.page_size();
    let end = prefix_end(&query.prefix);
    let rows = client
        .query(
            "SELECT id, version FROM tower_agent_sessions
                 WHERE (id > $1 OR ($2 AND id = $1)) AND ($3::TEXT IS NULL OR id < $3)
                 ORDER BY id LIMIT $4",
            &[&start, &inclusive, &end, &(limit as i64 + 1)],
        )
        .await
        .map_err(backend)?;
    let mut sessions = Vec::with_capacity(rows.len());
    for row in rows {
        let id: String = column("a listed session", &row, 0)?;
        let version = version(&id, column(&id, &row, 1)?)?;
        sessions.push((id, version));
    }
    Ok(Page::of_one_more(sessions, limit))
}

impl PostgresSessions {
    async fn load_on(&self, client: &mut Object, id: &str) -> Result<Option<Stored>, StoreError> {
        // One snapshot for the row and its messages.
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(backend)?;
        let row = tx
            .query_opt(
                &prepared(
                    &tx,
                    "SELECT version, incarnation, len, state, interrupts, started
                 FROM tower_agent_sessions WHERE id = $1",
                )
                .await?,
                &[&id],
            )
            .await
            .map_err(backend)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let stored: i64 = column(id, &row, 0)?;
        let incarnation: String = column(id, &row, 1)?;
        let len: i64 = column(id, &row, 2)?;
        let columns = Columns {
            state: column(id, &row, 3)?,
            interrupts: column(id, &row, 4)?,
            started: column(id, &row, 5)?,
        };
        let rows = tx
            .query(
                &prepared(
                    &tx,
                    "SELECT seq, body FROM tower_agent_messages WHERE session_id = $1 ORDER BY seq",
                )
                .await?,
                &[&id],
            )
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        let mut messages = Vec::with_capacity(rows.len());
        for row in &rows {
            messages.push((column::<i64>(id, row, 0)?, column::<&str>(id, row, 1)?));
        }
        let session = session(id, len, &columns, messages)?;
        let version = version(id, stored)?;
        self.known.record(&session, version, &incarnation);
        Ok(Some(Stored { session, version }))
    }

    async fn save_on(
        &self,
        client: &mut Object,
        session: &Session,
        expected: Option<Version>,
    ) -> Result<Version, StoreError> {
        let id = session.id.as_str();
        let Columns {
            state,
            interrupts,
            started,
        } = Columns::of(session)?;
        let len = session.history.len() as i64;
        let tx = client.transaction().await.map_err(backend)?;
        let found = tx
            .query_opt(
                &prepared(&tx, "SELECT version, incarnation FROM tower_agent_sessions WHERE id = $1 FOR UPDATE").await?,
                &[&id],
            )
            .await
            .map_err(backend)?;
        let found = match found {
            Some(row) => Some((
                version(id, column(id, &row, 0)?)?,
                column::<String>(id, &row, 1)?,
            )),
            None => None,
        };
        let conflict = |found: Option<Version>| StoreError::Conflict {
            id: id.to_owned(),
            expected,
            found,
        };
        if found.as_ref().map(|(v, _)| *v) != expected {
            return Err(conflict(found.map(|(v, _)| v)));
        }
        // The row is locked (or, for a new session, the insert waits on a racing one): the
        // next number of the sequence is above every version the session had.
        let (next, incarnation, kept) = match found {
            Some((version, incarnation)) => {
                let kept = self.known.stored(session, version, &incarnation);
                let row = tx
                    .query_one(
                        &prepared(
                            &tx,
                            "UPDATE tower_agent_sessions
                     SET version = nextval('tower_agent_versions'), len = $2, state = $3,
                         interrupts = $4, started = $5
                     WHERE id = $1 RETURNING version",
                        )
                        .await?,
                        &[&id, &len, &state, &interrupts, &started],
                    )
                    .await
                    .map_err(backend)?;
                (column::<i64>(id, &row, 0)?, incarnation, kept)
            }
            None => {
                let incarnation = new_id();
                // Two writers creating one session: the second waits for the first, and
                // inserts nothing.
                let made = tx
                    .query_opt(
                        &prepared(
                            &tx,
                            "INSERT INTO tower_agent_sessions
                             (id, version, incarnation, len, state, interrupts, started)
                         VALUES ($1, nextval('tower_agent_versions'), $2, $3, $4, $5, $6)
                         ON CONFLICT (id) DO NOTHING RETURNING version",
                        )
                        .await?,
                        &[&id, &incarnation, &len, &state, &interrupts, &started],
                    )
                    .await
                    .map_err(backend)?;
                let Some(made) = made else {
                    // Read the winner's version on this connection: another one from the pool
                    // could wait for ever when every connection is in such a race.
                    drop(tx);
                    let now = client
                        .query_opt(
                            "SELECT version FROM tower_agent_sessions WHERE id = $1",
                            &[&id],
                        )
                        .await
                        .map_err(backend)?;
                    let now = now.map(|row| column(id, &row, 0)).transpose()?;
                    let now = now.map(|v| version(id, v)).transpose()?;
                    return Err(conflict(now));
                };
                (column::<i64>(id, &made, 0)?, incarnation, 0)
            }
        };
        let next = version(id, next)?;
        tx.execute(
            &prepared(
                &tx,
                "DELETE FROM tower_agent_messages WHERE session_id = $1 AND seq >= $2",
            )
            .await?,
            &[&id, &(kept as i64)],
        )
        .await
        .map_err(backend)?;
        let mut seqs = Vec::with_capacity(session.history.len() - kept);
        let mut bodies = Vec::with_capacity(seqs.capacity());
        for (seq, message) in session.history.iter().enumerate().skip(kept) {
            seqs.push(seq as i64);
            bodies.push(json(message)?);
        }
        if !seqs.is_empty() {
            tx.execute(
                &prepared(
                    &tx,
                    "INSERT INTO tower_agent_messages (session_id, seq, body)
                 SELECT $1, * FROM UNNEST($2::BIGINT[], $3::TEXT[])",
                )
                .await?,
                &[&id, &seqs, &bodies],
            )
            .await
            .map_err(backend)?;
        }
        tx.commit().await.map_err(backend)?;
        self.known.record(session, next, &incarnation);
        Ok(next)
    }

    async fn delete_on(
        &self,
        client: &mut Object,
        id: &str,
        expected: Version,
    ) -> Result<bool, StoreError> {
        let tx = client.transaction().await.map_err(backend)?;
        let found = tx
            .query_opt(
                &prepared(
                    &tx,
                    "SELECT version FROM tower_agent_sessions WHERE id = $1 FOR UPDATE",
                )
                .await?,
                &[&id],
            )
            .await
            .map_err(backend)?;
        let Some(row) = found else {
            return Ok(false);
        };
        let found = version(id, column(id, &row, 0)?)?;
        if found != expected {
            return Err(StoreError::Conflict {
                id: id.to_owned(),
                expected: Some(expected),
                found: Some(found),
            });
        }
        tx.execute(
            &prepared(&tx, "DELETE FROM tower_agent_sessions WHERE id = $1").await?,
            &[&id],
        )
        .await
        .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        self.known.forget(id);
        Ok(true)
    }
}
