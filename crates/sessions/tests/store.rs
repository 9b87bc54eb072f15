//! The conformance checks on the in-memory and SQLite stores (Postgres: `tests/postgres.rs`).

mod conformance;

use std::sync::Arc;

use conformance::conformance;
use tower_agent_sessions::InMemorySessions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_store() {
    let store = InMemorySessions::new();
    conformance(Arc::new(store.clone()), Arc::new(store)).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store() {
    use tower_agent_sessions::SqliteSessions;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("sessions.db");
    let store = SqliteSessions::open(&path).await.expect("opens");
    let other = SqliteSessions::open(&path).await.expect("opens again");
    conformance(Arc::new(store), Arc::new(other)).await;
}
