//! What only the SQLite store does: incremental saves, a file another version made, a corrupt
//! row, a full disk.
#![cfg(feature = "sqlite")]

use rusqlite::Connection;
use tower_agent_core::{Message, Session};
use tower_agent_sessions::{SessionStore, SqliteSessions, StoreError};

fn session(id: &str, messages: usize) -> Session {
    let mut session = Session::with_id(id);
    for n in 0..messages {
        session.history.push(Message::user(format!("message {n}")));
    }
    session
}

/// The first message's text as stored, read beside the store.
fn first_stored(path: &std::path::Path) -> String {
    let side = Connection::open(path).expect("opens");
    side.query_row(
        "SELECT body FROM messages WHERE session_id = 's' AND seq = 0",
        [],
        |row| row.get(0),
    )
    .expect("a first message")
}

fn mark_first(path: &std::path::Path, text: &str) {
    let side = Connection::open(path).expect("opens");
    let marked = serde_json::to_string(&Message::user(text)).expect("json");
    side.execute(
        "UPDATE messages SET body = ?1 WHERE session_id = 's' AND seq = 0",
        [marked],
    )
    .expect("marked");
}

#[tokio::test]
async fn a_save_writes_what_was_added_since_the_last_save_or_load() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("s.db");
    let store = SqliteSessions::open(&path).await.expect("opens");
    let mut s = session("s", 3);
    let v1 = store.save(&s, None).await.expect("created");
    // A message changed beside the store survives appends: they write only the new messages.
    mark_first(&path, "marked beside the store");
    s.history.push(Message::assistant("appended"));
    let v2 = store.save(&s, Some(v1)).await.expect("appended");
    assert!(first_stored(&path).contains("marked beside the store"));
    // So does a session loaded by another handle and appended to.
    let other = SqliteSessions::open(&path).await.expect("opens");
    let mut loaded = other.load("s").await.expect("loads").expect("stored");
    loaded.session.history.push(Message::user("from the other"));
    let v3 = other
        .save(&loaded.session, Some(v2))
        .await
        .expect("appended");
    assert!(first_stored(&path).contains("marked beside the store"));
    // An edit before the end of what was saved rewrites the history.
    mark_first(&path, "marked again");
    loaded.session.history.make_mut()[1] = Message::user("edited");
    other.save(&loaded.session, Some(v3)).await.expect("edited");
    let first = first_stored(&path);
    assert!(first.contains("marked beside the store"), "{first}");
}

#[tokio::test]
async fn a_file_of_a_newer_schema_is_refused_untouched() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("newer.db");
    let store = SqliteSessions::open(&path).await.expect("opens");
    store.save(&session("s", 2), None).await.expect("saved");
    drop(store);
    Connection::open(&path)
        .and_then(|c| c.pragma_update(None, "user_version", 99))
        .expect("set the version");
    let opened = SqliteSessions::open(&path).await;
    assert!(
        matches!(opened, Err(StoreError::Schema { found: 99, supported }) if supported == SqliteSessions::SCHEMA),
        "{opened:?}"
    );
    let message = opened.expect_err("refused").to_string();
    assert!(message.contains("upgrade"), "{message}");
    let count: i64 = Connection::open(&path)
        .and_then(|c| c.query_row("SELECT count(*) FROM messages", [], |r| r.get(0)))
        .expect("counts");
    assert_eq!(count, 2, "nothing changed");
}

#[tokio::test]
async fn a_corrupt_row_is_a_typed_error_naming_the_session_and_the_message() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("corrupt.db");
    let store = SqliteSessions::open(&path).await.expect("opens");
    store.save(&session("s", 3), None).await.expect("saved");
    store.save(&session("t", 1), None).await.expect("saved");
    let side = Connection::open(&path).expect("opens");
    side.execute(
        "UPDATE messages SET body = '{\"role\":' WHERE session_id = 's' AND seq = 1",
        [],
    )
    .expect("corrupted");
    let loaded = store.load("s").await;
    let Err(StoreError::Corrupt { id, source }) = &loaded else {
        panic!("{loaded:?}");
    };
    assert_eq!(id, "s");
    assert!(source.to_string().starts_with("message 1:"), "{source}");
    // A missing row, and bad state, are caught too; other sessions still load.
    side.execute(
        "DELETE FROM messages WHERE session_id = 's' AND seq = 2",
        [],
    )
    .expect("deleted");
    side.execute("UPDATE messages SET body = '{}' WHERE session_id = 's'", [])
        .expect("changed");
    assert!(matches!(
        store.load("s").await,
        Err(StoreError::Corrupt { .. })
    ));
    side.execute("UPDATE sessions SET state = '[1]' WHERE id = 't'", [])
        .expect("changed");
    let state = store.load("t").await;
    assert!(
        matches!(&state, Err(StoreError::Corrupt { source, .. }) if source.to_string().starts_with("state:")),
        "{state:?}"
    );
}

#[tokio::test]
async fn a_full_disk_fails_the_save_and_keeps_the_previous_version() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("full.db");
    let connection = Connection::open(&path).expect("opens");
    let store = SqliteSessions::from_connection(connection)
        .await
        .expect("opens");
    let mut s = session("s", 10);
    let v1 = store.save(&s, None).await.expect("saved");
    // The file may not grow past what it holds now, plus a little: the disk is full.
    let side = Connection::open(&path).expect("opens");
    let pages: i64 = side
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .expect("pages");
    drop(side);
    let limited = Connection::open(&path).expect("opens");
    limited
        .pragma_update(None, "max_page_count", pages + 2)
        .expect("limited");
    let store = SqliteSessions::from_connection(limited)
        .await
        .expect("opens");
    let big = "x".repeat(2_000);
    for n in 0..200 {
        s.history.push(Message::user(format!("{n}: {big}")));
    }
    let full = store.save(&s, Some(v1)).await;
    let Err(StoreError::Backend(source)) = &full else {
        panic!("{full:?}");
    };
    assert!(source.to_string().contains("full"), "{source}");
    // Nothing of the failed save was written: the first version loads, and saves go on.
    let kept = store.load("s").await.expect("loads").expect("stored");
    assert_eq!((kept.version, kept.session.history.len()), (v1, 10));
    let mut small = kept.session;
    small.history.push(Message::user("small"));
    store
        .save(&small, Some(v1))
        .await
        .expect("a small save fits");
}

/// Whether `marker` is in the database file at `path` or in its write-ahead log, after a
/// checkpoint from another connection copied the log into the file and truncated it.
fn on_disk(path: &std::path::Path, marker: &str) -> bool {
    let side = Connection::open(path).expect("opens");
    let (busy, _, _): (i64, i64, i64) = side
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .expect("checkpoints");
    assert_eq!(busy, 0, "the checkpoint ran to its end");
    drop(side);
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    [path.as_os_str().to_owned(), wal].iter().any(|file| {
        let bytes = std::fs::read(file).unwrap_or_default();
        bytes
            .windows(marker.len())
            .any(|window| window == marker.as_bytes())
    })
}

#[tokio::test]
async fn redacted_and_deleted_text_is_not_left_on_disk() {
    let marker = "ada-secret@example.com";
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("secret.db");
    let store = SqliteSessions::open(&path).await.expect("opens");
    let secret = |id: &str| {
        let mut s = session(id, 2);
        s.history.push(Message::user(format!(
            "{marker} asked to be called back about the March invoice: it went to the old \
             address, and the second reminder was sent there too; please fix both"
        )));
        s
    };
    // Rewritten: the history redacted in place (shorter than it was).
    let mut s = secret("redacted");
    let v1 = store.save(&s, None).await.expect("saved");
    assert!(on_disk(&path, marker), "the test can see what is on disk");
    s.history.make_mut()[2] = Message::user("[email] asked to be called back");
    store.save(&s, Some(v1)).await.expect("redacted");
    assert!(!on_disk(&path, marker), "the redacted text is gone");
    // Deleted: the whole session.
    let t = secret("deleted");
    let v1 = store.save(&t, None).await.expect("saved");
    assert!(on_disk(&path, marker));
    assert!(store.delete("deleted", v1).await.expect("deleted"));
    assert!(!on_disk(&path, marker), "the deleted text is gone");
}

#[tokio::test]
async fn a_file_of_the_first_schema_numbers_its_saves_above_every_stored_version() {
    use tower_agent_sessions::Version;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("first.db");
    let store = SqliteSessions::open(&path).await.expect("opens");
    store.save(&session("s", 1), None).await.expect("saved");
    drop(store);
    // What the first schema made: versions counted per session, no counter of the file.
    Connection::open(&path)
        .and_then(|c| {
            c.execute_batch(
                "DROP TABLE last_version; UPDATE sessions SET version = 7;
                 ALTER TABLE sessions DROP COLUMN started; PRAGMA user_version = 1;",
            )
        })
        .expect("made a first-schema file");
    let store = SqliteSessions::open(&path).await.expect("migrates");
    let stored = store.load("s").await.expect("loads").expect("stored");
    assert_eq!(stored.version, Version(7));
    let saved = store
        .save(&stored.session, Some(stored.version))
        .await
        .expect("saved");
    let made = store.save(&session("t", 1), None).await.expect("saved");
    assert_eq!((saved, made), (Version(8), Version(9)));
}
