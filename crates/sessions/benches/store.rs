//! What a session store costs per round: a save after a round (two messages appended) and a
//! load, for a session of 10 and of 1,000 messages. The saves append; their cost must not grow
//! with the history.
//!
//! `save_whole/1000` is the same round for a history the store knows nothing of (built anew):
//! it is written whole, as a store that is not incremental would write every round.
//!
//! - `sqlite/save_round/N`, `sqlite/load/N`: a file in a temporary directory (write-ahead log,
//!   `synchronous = NORMAL`).
//! - `postgres/save_round/N`, `postgres/load/N` (feature `postgres`, with `POSTGRES_URL` set:
//!   `eval "$(bash .ci/postgres start)"`): a server on 127.0.0.1, every commit flushed.
//!
//! Run: `cargo bench -p tower-agent-sessions --features postgres --bench store`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use serde_json::json;
use tokio::runtime::Runtime;
use tower_agent_core::{Message, Session, ToolCall, ToolResult};
use tower_agent_sessions::{SessionStore, SqliteSessions, Version};

/// The two messages of a round: the model's call and its result.
fn round(n: usize) -> [Message; 2] {
    let call = ToolCall::new(
        format!("call_{n}"),
        "read_file",
        json!({ "path": format!("src/file_{n}.rs") }),
    );
    let result = ToolResult::success(&call, "fn main() { println!(\"hello\"); }\n".repeat(8));
    [
        Message::assistant_with_calls("Let me look.", [call]),
        Message::tool_result(result),
    ]
}

fn session(id: String, len: usize) -> Session {
    let mut session = Session::with_id(id);
    session
        .history
        .push(Message::user("What is in the repository?"));
    let mut n = 0;
    while session.history.len() < len {
        session.history.extend(round(n));
        n += 1;
    }
    session
}

/// How many rounds are timed on one session before a fresh one of the same length is made.
const ROUNDS: u64 = 20;

/// The time of `iters` rounds, each appending two messages to a session of about `len`
/// messages and saving it. Untimed: making each session (then `settle`: the file's write-ahead
/// log is checkpointed, so a timed save does not pay for the setup's writes) and deleting it
/// after its rounds (the tables stay small).
fn save_rounds(
    rt: &Runtime,
    store: &dyn SessionStore,
    settle: &dyn Fn(),
    len: usize,
    whole: bool,
    iters: u64,
) -> Duration {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("bench-{}-{n}", std::process::id());
        let mut s = session(id, len);
        let mut version: Version = rt.block_on(store.save(&s, None)).expect("saved");
        settle();
        for n in 0..ROUNDS.min(iters - done) {
            s.history.extend(round(1_000_000 + n as usize));
            if whole {
                // A history the store knows nothing of: it is written whole.
                s.history = tower_agent_core::History::from(s.history.to_vec());
            }
            let start = Instant::now();
            version = rt.block_on(store.save(&s, Some(version))).expect("saved");
            total += start.elapsed();
            done += 1;
        }
        rt.block_on(store.delete(&s.id, version)).expect("deleted");
    }
    total
}

fn bench_store(
    c: &mut Criterion,
    name: &str,
    rt: &Runtime,
    store: &dyn SessionStore,
    settle: &dyn Fn(),
) {
    let mut group = c.benchmark_group(name);
    for len in [10, 1_000] {
        group.bench_with_input(BenchmarkId::new("save_round", len), &len, |b, &len| {
            b.iter_custom(|iters| save_rounds(rt, store, settle, len, false, iters));
        });
        if len > 10 {
            group.bench_with_input(BenchmarkId::new("save_whole", len), &len, |b, &len| {
                b.iter_custom(|iters| save_rounds(rt, store, settle, len, true, iters));
            });
        }
        let s = session(format!("load-{}-{len}", std::process::id()), len);
        rt.block_on(store.save(&s, None)).expect("saved");
        group.bench_with_input(BenchmarkId::new("load", len), &s.id, |b, id| {
            b.iter(|| black_box(rt.block_on(store.load(id)).expect("loads")));
        });
    }
    group.finish();
}

fn sqlite(c: &mut Criterion) {
    let rt = Runtime::new().expect("a runtime");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("bench.db");
    let store = rt.block_on(SqliteSessions::open(&path)).expect("opens");
    let side = rusqlite::Connection::open(&path).expect("opens");
    let settle = || {
        side.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .expect("checkpointed");
    };
    bench_store(c, "sqlite", &rt, &store, &settle);
}

#[cfg(feature = "postgres")]
fn postgres(c: &mut Criterion) {
    let Ok(url) = std::env::var("POSTGRES_URL") else {
        eprintln!("postgres: skipped, POSTGRES_URL is not set");
        return;
    };
    let rt = Runtime::new().expect("a runtime");
    let store = rt
        .block_on(tower_agent_sessions::PostgresSessions::connect(&url))
        .expect("connects");
    bench_store(c, "postgres", &rt, &store, &|| {});
}

#[cfg(not(feature = "postgres"))]
fn postgres(_: &mut Criterion) {}

criterion_group!(benches, sqlite, postgres);
criterion_main!(benches);
