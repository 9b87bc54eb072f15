//! The Postgres store on a real server: `.ci/run` starts one on 127.0.0.1 (`.ci/postgres`)
//! and exports `POSTGRES_URL`. Without it each test says why it skips, and fails in CI.
#![cfg(feature = "postgres")]

mod conformance;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::NoTls;
use tower_agent_core::{Message, Session};
use tower_agent_sessions::{PostgresSessions, SessionStore, StoreError, Version};

/// The server's URL, or `None` (outside CI) when there is none.
fn server() -> Option<String> {
    let Ok(url) = std::env::var("POSTGRES_URL") else {
        assert!(
            std::env::var("CI").is_err(),
            "POSTGRES_URL is not set: .ci/run starts Postgres on 127.0.0.1 (.ci/postgres) and exports it"
        );
        eprintln!("skipped: POSTGRES_URL is not set (run `eval \"$(bash .ci/postgres start)\"`)");
        return None;
    };
    assert!(url.contains("@127.0.0.1:"), "tests talk to 127.0.0.1 only");
    Some(url)
}

/// An admin connection to the server.
async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("the server answers");
    tokio::spawn(connection);
    client
}

/// A fresh database of its own on the server; its URL.
async fn database(url: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "tower_agent_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    admin(url)
        .await
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("a database");
    let base = url.rsplit_once('/').map_or(url, |(base, _)| base);
    format!("{base}/{name}")
}

fn session(id: &str, messages: usize) -> Session {
    let mut session = Session::with_id(id);
    for n in 0..messages {
        session.history.push(Message::user(format!("message {n}")));
    }
    session
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store() {
    let Some(url) = server() else { return };
    let url = database(&url).await;
    let store = PostgresSessions::connect(&url).await.expect("connects");
    let other = PostgresSessions::connect(&url)
        .await
        .expect("connects again");
    conformance::conformance(Arc::new(store), Arc::new(other)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_creators_one_wins() {
    let Some(url) = server() else { return };
    let store = PostgresSessions::connect(&database(&url).await)
        .await
        .expect("connects");
    let writers: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.save(&session("new", 1), None).await })
        })
        .collect();
    let mut won = 0;
    for writer in writers {
        match writer.await.expect("no panic") {
            Ok(_) => won += 1,
            Err(StoreError::Conflict { found: Some(_), .. }) => {}
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(won, 1);
}

#[tokio::test]
async fn appends_write_only_the_new_messages() {
    let Some(url) = server() else { return };
    let url = database(&url).await;
    let store = PostgresSessions::connect(&url).await.expect("connects");
    let mut s = session("s", 3);
    let v1 = store.save(&s, None).await.expect("saved");
    let side = admin(&url).await;
    let first = || async {
        let row = side
            .query_one(
                "SELECT body FROM tower_agent_messages WHERE session_id = 's' AND seq = 0",
                &[],
            )
            .await
            .expect("a first message");
        row.get::<_, String>(0)
    };
    let marked = serde_json::to_string(&Message::user("marked beside the store")).expect("json");
    side.execute(
        "UPDATE tower_agent_messages SET body = $1 WHERE session_id = 's' AND seq = 0",
        &[&marked],
    )
    .await
    .expect("marked");
    s.history.push(Message::assistant("appended"));
    let v2 = store.save(&s, Some(v1)).await.expect("appended");
    assert!(first().await.contains("marked beside the store"));
    s.history.make_mut()[1] = Message::user("edited");
    store.save(&s, Some(v2)).await.expect("edited");
    assert!(
        first().await.contains("message 0"),
        "an edit rewrites the history"
    );
}

#[tokio::test]
async fn a_connection_lost_mid_save_writes_nothing_and_the_store_goes_on() {
    let Some(url) = server() else { return };
    let url = database(&url).await;
    let store = PostgresSessions::connect(&url).await.expect("connects");
    let mut s = session("s", 2);
    let v1 = store.save(&s, None).await.expect("saved");
    // Another transaction holds the messages table: the save updates the session's row, then
    // waits there; its connection is terminated while it waits.
    let mut blocker = admin(&url).await;
    let hold = blocker.transaction().await.expect("a transaction");
    hold.batch_execute("LOCK TABLE tower_agent_messages IN EXCLUSIVE MODE")
        .await
        .expect("locked");
    s.history.push(Message::assistant("never stored"));
    let saving = {
        let (store, s) = (store.clone(), s.clone());
        tokio::spawn(async move { store.save(&s, Some(v1)).await })
    };
    let side = admin(&url).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let killed = side
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE '%tower_agent_messages%'",
                &[],
            )
            .await
            .expect("queries");
        if !killed.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the save never waited on the lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lost = saving.await.expect("no panic");
    assert!(matches!(lost, Err(StoreError::Backend(_))), "{lost:?}");
    hold.rollback().await.expect("released");
    // Nothing of it was written: the first version loads whole; the next save works.
    let kept = store.load("s").await.expect("loads").expect("stored");
    assert_eq!((kept.version, kept.session.history.len()), (v1, 2));
    let v2 = store
        .save(&s, Some(v1))
        .await
        .expect("saved on a new connection");
    assert_eq!(
        store
            .load("s")
            .await
            .expect("loads")
            .expect("stored")
            .version,
        v2
    );
}

#[tokio::test]
async fn a_newer_schema_and_a_corrupt_row_are_typed_errors() {
    let Some(url) = server() else { return };
    let url = database(&url).await;
    let store = PostgresSessions::connect(&url).await.expect("connects");
    store.save(&session("s", 3), None).await.expect("saved");
    let side = admin(&url).await;
    side.batch_execute(
        "UPDATE tower_agent_messages SET body = '{\"role\":' WHERE session_id = 's' AND seq = 1",
    )
    .await
    .expect("corrupted");
    let loaded = store.load("s").await;
    assert!(
        matches!(&loaded, Err(StoreError::Corrupt { id, source }) if id == "s" && source.to_string().starts_with("message 1:")),
        "{loaded:?}"
    );
    side.batch_execute("UPDATE tower_agent_schema SET version = 99")
        .await
        .expect("set");
    let newer = PostgresSessions::connect(&url).await;
    assert!(
        matches!(newer, Err(StoreError::Schema { found: 99, supported }) if supported == PostgresSessions::SCHEMA),
        "{newer:?}"
    );
}

#[tokio::test]
async fn the_password_shows_nowhere() {
    let Some(url) = server() else { return };
    let url = database(&url).await;
    let password = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(user, _)| user.split_once(':'))
        .map(|(_, password)| password.to_owned())
        .expect("a password in the url");
    let store = PostgresSessions::connect(&url).await.expect("connects");
    assert!(!format!("{store:?}").contains(&password));
    let wrong = url.replace(&password, "wrong-secret-42");
    let refused = PostgresSessions::connect(&wrong)
        .await
        .expect_err("refused");
    let shown = format!("{refused} {refused:?}");
    assert!(!shown.contains("wrong-secret-42"), "{shown}");
}

#[tokio::test]
async fn tables_of_the_first_schema_number_their_saves_above_every_stored_version() {
    let Some(url) = server() else { return };
    let url = database(&url).await;
    let store = PostgresSessions::connect(&url).await.expect("connects");
    store.save(&session("s", 1), None).await.expect("saved");
    drop(store);
    // What the first schema made: versions counted per session, no sequence.
    admin(&url)
        .await
        .batch_execute(
            "DROP SEQUENCE tower_agent_versions;
             ALTER TABLE tower_agent_sessions DROP COLUMN started;
             UPDATE tower_agent_sessions SET version = 7;
             UPDATE tower_agent_schema SET version = 1;",
        )
        .await
        .expect("made first-schema tables");
    let store = PostgresSessions::connect(&url).await.expect("migrates");
    let stored = store.load("s").await.expect("loads").expect("stored");
    assert_eq!(stored.version, Version(7));
    let saved = store
        .save(&stored.session, Some(stored.version))
        .await
        .expect("saved");
    let made = store.save(&session("t", 1), None).await.expect("saved");
    assert_eq!((saved, made), (Version(8), Version(9)));
}
