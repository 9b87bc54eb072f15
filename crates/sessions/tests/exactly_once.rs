//! Tool effects exactly once, proven with real processes killed at random points: the agent's
//! process pays and refunds into a ledger (a file of effects by call key, the system a real
//! payment tool writes to), and is killed with SIGKILL after a random delay, again and again,
//! each next process going on from the store (SQLite, and Postgres when `POSTGRES_URL` names
//! one: `.ci/run` starts it). In the mix: two payments and a read at once, a tool retry after
//! a transient failure (same key), and a refund gated by a human's approval (an interrupt,
//! resumed by the next process). Every session must end completed with every effect in the
//! ledger once and in the session (recorded, or recovered by the tool's reconcile step), and no
//! effect in the session that is not in the ledger.
//!
//! Real processes: this test runs itself as the agent's process (`EXACTLY_ONCE_CHILD`).
//! `EXACTLY_ONCE_KILLS` sets the kill points per store (default 400 for SQLite, 300 for
//! Postgres); `EXACTLY_ONCE_SEED` replays a run.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tower::ServiceExt;
use tower_agent_core::{
    AgentInput, AgentRequest, Decision, Decisions, Error, ErrorKind, Event, Flow, Message,
    ModelResponse, Outcome, Recovery, Role, Session, ToolCall, ToolRequest, before_tool,
};
use tower_agent_layers::approval::{ApprovalLayer, Gate};
use tower_agent_layers::retry::{RetryLayer, RetryPolicy};
use tower_agent_loop::Agent;
use tower_agent_sessions::{SessionStore, SqliteSessions, StoreLayer};
use tower_agent_test::{EventRecorder, ScriptedModel};
use tower_agent_tools::{ToolContext, ToolSet, tool_fn};

fn main() {
    match std::env::var("EXACTLY_ONCE_CHILD") {
        Ok(_) => child(),
        Err(_) => parent(),
    }
}

/// A small random generator (xorshift), seeded: a run is replayed from its seed.
struct Random(AtomicU64);

impl Random {
    fn new(seed: u64) -> Self {
        Self(AtomicU64::new(seed.max(1)))
    }

    fn below(&self, n: u64) -> u64 {
        let mut x = self.0.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0.store(x, Ordering::Relaxed);
        x % n.max(1)
    }
}

/// One effect in the ledger: `<key> <kind> <order> <cents>`.
#[derive(Debug, Clone, PartialEq)]
struct Effect {
    key: String,
    kind: String,
    order: String,
    cents: u64,
}

fn ledger(path: &Path) -> Vec<Effect> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut words = line.split(' ');
            Some(Effect {
                key: words.next()?.to_owned(),
                kind: words.next()?.to_owned(),
                order: words.next()?.to_owned(),
                cents: words.next()?.parse().ok()?,
            })
        })
        .collect()
}

/// The effect's text, as the tool answers it and the reconcile step recovers it.
fn receipt(kind: &str, order: &str, cents: u64) -> String {
    format!("{kind} {cents} cents on {order}")
}

#[derive(Deserialize, JsonSchema)]
struct Money {
    order: String,
    cents: u64,
}

/// A tool that writes an effect to the ledger, with its reconcile step: a pause of a few
/// milliseconds before and after the effect spreads the kill points around it.
fn money_tool(
    kind: &'static str,
    path: PathBuf,
    random: Arc<Random>,
) -> impl tower_agent_tools::Tool {
    let looked = path.clone();
    tool_fn(kind, "Moves money.", move |args: Money, cx: ToolContext| {
        let (path, random) = (path.clone(), random.clone());
        async move {
            let key = cx
                .key()
                .ok_or_else(|| Error::bad_request("a call without a key"))?;
            tokio::time::sleep(Duration::from_millis(random.below(4))).await;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| Error::other(e.to_string()))?;
            // One write of one line: whole or not at all when the process is killed.
            file.write_all(format!("{key} {kind} {} {}\n", args.order, args.cents).as_bytes())
                .map_err(|e| Error::other(e.to_string()))?;
            tokio::time::sleep(Duration::from_millis(random.below(4))).await;
            Ok::<_, Error>(receipt(kind, &args.order, args.cents))
        }
    })
    .reconcile(move |_: Money, cx: ToolContext| {
        let path = looked.clone();
        async move {
            let key = cx.key().map(|key| key.to_string()).unwrap_or_default();
            match ledger(&path).into_iter().find(|effect| effect.key == key) {
                Some(effect) => Recovery::done(receipt(kind, &effect.order, effect.cents)),
                None => Recovery::NotRun,
            }
        }
    })
}

/// The model: two payments and a read at once, then a refund, then the answer.
fn model() -> ScriptedModel {
    ScriptedModel::from_fn(|req| {
        let rounds = req
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant && m.has_tool_calls())
            .count();
        let money = |id: &str, tool: &str, order: &str, cents: u64| {
            ToolCall::new(id, tool, json!({ "order": order, "cents": cents }))
        };
        Ok(match rounds {
            0 => ModelResponse::tool_calls([
                money("p1", "pay", "A-1", 100),
                money("p2", "pay", "B-2", 250),
                ToolCall::new("r1", "balance", json!({})),
            ]),
            1 => ModelResponse::tool_calls([money("f1", "refund", "A-1", 40)]),
            _ => ModelResponse::text("done"),
        })
    })
}

/// The agent's process: one run of the session, from the store, with the input `EO_INPUT`
/// says (`start`, `continue`, `approve`). It prints the outcome and the calls it recovered.
fn child() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let (store_at, id, path) = (
        var("EO_STORE"),
        var("EO_SESSION"),
        PathBuf::from(var("EO_LEDGER")),
    );
    let random = Arc::new(Random::new(var("EO_SEED").parse().expect("a seed")));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let store: Arc<dyn SessionStore> = match store_at.split_once(':') {
            Some(("sqlite", file)) => Arc::new(SqliteSessions::open(file).await.expect("opens")),
            #[cfg(feature = "postgres")]
            Some(("postgres", url)) => Arc::new(
                tower_agent_sessions::PostgresSessions::connect(url)
                    .await
                    .expect("connects"),
            ),
            _ => panic!("no store {store_at}"),
        };
        let balance = tool_fn(
            "balance",
            "Reads the balance.",
            |_: tower_agent_tools::NoArgs| async { Ok::<_, Error>("1,000 cents") },
        )
        .read_only();
        let tools = ToolSet::new()
            .tool(money_tool("pay", path.clone(), random.clone()))
            .tool(money_tool("refund", path, random.clone()))
            .tool(balance);
        // A transport that fails now and then before the call reaches the tool; the retry
        // sends it again, with the same key.
        let flaky = before_tool(move |req: ToolRequest| {
            let fails = random.below(4) == 0;
            async move {
                match fails {
                    true => Err(Error::new(
                        ErrorKind::Unreachable,
                        "the payment gateway refused the connection",
                    )),
                    false => Ok(Flow::Continue(req)),
                }
            }
        });
        let retry = RetryLayer::new(
            RetryPolicy::new()
                .max_attempts(10)
                .jitter(Duration::ZERO)
                .max_delay(Duration::from_millis(1)),
        );
        let approval = ApprovalLayer::builder()
            .gate("refund", Gate::new())
            .build()
            .expect("a valid gate");
        let concurrent = id.ends_with('0') || id.ends_with('2') || id.ends_with('4');
        let builder = match concurrent {
            true => Agent::builder().concurrent_tools(4),
            false => Agent::builder().concurrent_reads(4),
        };
        let agent = builder
            .with(approval)
            .tool_layer(tower::layer::util::Stack::new(flaky, retry))
            .with(StoreLayer::shared(Arc::clone(&store)))
            .build(model(), tools);
        let input = match var("EO_INPUT").as_str() {
            "start" => AgentInput::from("settle the orders"),
            "approve" => {
                let stored = store.load(&id).await.expect("loads").expect("stored");
                AgentInput::Resume(Decisions::all(
                    &stored.session.interrupts,
                    Decision::Approve,
                ))
            }
            _ => AgentInput::Continue,
        };
        let events = EventRecorder::new();
        let request = AgentRequest::new(Session::with_id(id), input).with_observer(events.clone());
        let response = agent.oneshot(request).await.expect("the run");
        for event in events.events() {
            match event {
                Event::ToolRecovered { outcome, .. } => println!("recovered {outcome}"),
                Event::Retrying { .. } => println!("retried"),
                _ => {}
            }
        }
        let outcome = match response.outcome {
            Outcome::Completed { .. } => "completed",
            Outcome::Interrupted { .. } => "interrupted",
            _ => "other",
        };
        println!("outcome {outcome}");
    });
}

/// What the kills of one store came to.
#[derive(Default, Debug)]
struct Tally {
    sessions: u32,
    kills: u32,
    runs: u32,
    effects: u32,
    recovered: HashMap<String, u32>,
    approvals: u32,
    /// Kills after which the store held a call started and not finished.
    mid_call: u32,
    /// How long a run that was not killed takes, on average (ms).
    run_ms: u64,
    /// Tool calls sent again after a transient failure (runs that were not killed).
    retries: u32,
}

/// Drive `sessions` sessions on `store` to completion, killing their processes at random
/// points until `kills` kill points are spent; check each session.
fn drive(
    store: &str,
    kills: u32,
    dir: &Path,
    random: &Random,
    tally: &mut Tally,
    check: &dyn Fn(&str) -> Session,
) {
    let mut n = 0;
    while tally.kills < kills {
        let kind = store.split(':').next().unwrap_or_default();
        let id = format!("eo-{kind}-{}-{n}", std::process::id());
        let path = dir.join(format!("{id}.ledger"));
        let mut input = "start";
        loop {
            tally.runs += 1;
            let mut process = Command::new(std::env::current_exe().expect("this test"))
                .env("EXACTLY_ONCE_CHILD", "1")
                .env("EO_STORE", store)
                .env("EO_SESSION", &id)
                .env("EO_LEDGER", &path)
                .env("EO_INPUT", input)
                .env("EO_SEED", (random.below(u64::MAX - 1) + 1).to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("the agent's process starts");
            // Killed at a random point of most runs (within the time a whole run takes on
            // this store); the others run to their end.
            let window = tally.run_ms.max(5);
            let kill_after =
                (random.below(5) > 0).then(|| Duration::from_millis(random.below(window)));
            let started = Instant::now();
            let mut killed = false;
            if let Some(after) = kill_after {
                while started.elapsed() < after {
                    if process.try_wait().expect("waits").is_some() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                if process.try_wait().expect("waits").is_none() {
                    process.kill().expect("kill -9");
                    killed = true;
                    tally.kills += 1;
                }
            }
            let output = process.wait_with_output().expect("reaped");
            if killed {
                // The next process goes on from what this one saved: nothing yet (it starts
                // again), calls waiting for the approval, or anything else.
                let stored = check(&id);
                tally.mid_call += u32::from(!stored.started.is_empty());
                input = if stored.history.is_empty() {
                    "start"
                } else if !stored.interrupts.is_empty() {
                    "approve"
                } else {
                    "continue"
                };
                continue;
            }
            // The window follows how long the runs that were not killed took.
            let took = started.elapsed().as_millis() as u64;
            tally.run_ms = match tally.run_ms {
                0 => took,
                ms => (ms * 7 + took) / 8,
            };
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            assert!(
                output.status.success(),
                "session {id}: the run failed: {}\n{stdout}",
                String::from_utf8_lossy(&output.stderr)
            );
            for line in stdout.lines() {
                if let Some(outcome) = line.strip_prefix("recovered ") {
                    *tally.recovered.entry(outcome.to_owned()).or_default() += 1;
                }
                tally.retries += u32::from(line == "retried");
            }
            if stdout.contains("outcome interrupted") {
                tally.approvals += 1;
                input = "approve";
                continue;
            }
            assert!(
                stdout.contains("outcome completed"),
                "session {id}: {stdout}"
            );
            break;
        }
        let session = check(&id);
        tally.effects += verify(&id, &session, &ledger(&path));
        tally.sessions += 1;
        n += 1;
    }
}

/// The session and the ledger agree: each effect once, each in the session with its own
/// result (recorded or recovered), no result of an effect that is not in the ledger. The
/// number of effects.
fn verify(id: &str, session: &Session, effects: &[Effect]) -> u32 {
    let mut seen: HashMap<&str, u32> = HashMap::new();
    for effect in effects {
        *seen.entry(&effect.key).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "session {id}: duplicated effects {twice:?}"
    );
    session.history.validate().expect("a valid history");
    assert!(
        session.started.is_empty(),
        "session {id}: calls left started"
    );
    assert_eq!(
        session.history.last().map(Message::text).as_deref(),
        Some("done")
    );
    let results: HashMap<&str, &str> = session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .map(|r| (r.call_id.as_str(), r.content.as_str()))
        .collect();
    let mut shown = 0;
    for call in session.history.iter().flat_map(Message::tool_calls) {
        if call.name != "pay" && call.name != "refund" {
            continue;
        }
        let key = call.key.expect("a key").to_string();
        let result = results.get(call.id.as_str()).copied().unwrap_or_default();
        match effects.iter().find(|effect| effect.key == key) {
            Some(effect) => {
                shown += 1;
                assert_eq!(
                    result,
                    receipt(&effect.kind, &effect.order, effect.cents),
                    "session {id}: the effect of `{}` is lost from the session",
                    call.id
                );
            }
            None => assert!(
                !result.contains(" cents on "),
                "session {id}: `{}` says it took effect, the ledger does not have it",
                call.id
            ),
        }
    }
    assert_eq!(
        shown,
        effects.len(),
        "session {id}: an effect of no call of the session"
    );
    shown as u32
}

/// Each kind of event the proof is about happened: a proof that never recovered or retried
/// proves little.
fn assert_mixed(store: &str, tally: &Tally) {
    assert!(tally.mid_call > 0, "{store}: no kill fell within a call");
    assert!(tally.approvals > 0, "{store}: no approval");
    assert!(tally.retries > 0, "{store}: no retry");
    let recovered = |outcome: &str| tally.recovered.get(outcome).copied().unwrap_or(0);
    assert!(recovered("done") > 0, "{store}: no call recovered as done");
    assert!(
        recovered("not_run") > 0,
        "{store}: no call recovered as not run"
    );
}

fn kills(default: u32) -> u32 {
    std::env::var("EXACTLY_ONCE_KILLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

fn report(store: &str, tally: &Tally, took: Duration) {
    println!(
        "exactly once on {store}: {} kill points (SIGKILL; {} with a call started and not \
         finished) over {} runs of {} sessions, {} approvals, {} retries; {} effects, 0 duplicated, \
         0 lost; recovered {:?}; {:.1} s",
        tally.kills,
        tally.mid_call,
        tally.runs,
        tally.sessions,
        tally.approvals,
        tally.retries,
        tally.effects,
        tally.recovered,
        took.as_secs_f64()
    );
}

fn parent() {
    let seed = std::env::var("EXACTLY_ONCE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    println!("exactly once: seed {seed} (EXACTLY_ONCE_SEED={seed} replays it)");
    let random = Random::new(seed);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");

    let db = dir.path().join("sessions.db");
    let sqlite = runtime.block_on(SqliteSessions::open(&db)).expect("opens");
    let load = |id: &str| {
        runtime
            .block_on(sqlite.load(id))
            .expect("loads")
            .map(|stored| stored.session)
            .unwrap_or_else(|| Session::with_id(id))
    };
    let (mut tally, started) = (Tally::default(), Instant::now());
    let store = format!("sqlite:{}", db.display());
    drive(&store, kills(400), dir.path(), &random, &mut tally, &load);
    report("SQLite", &tally, started.elapsed());
    assert_mixed("SQLite", &tally);

    postgres(&runtime, dir.path(), &random);
}

#[cfg(feature = "postgres")]
fn postgres(runtime: &tokio::runtime::Runtime, dir: &Path, random: &Random) {
    let Ok(url) = std::env::var("POSTGRES_URL") else {
        assert!(
            std::env::var("CI").is_err(),
            "POSTGRES_URL is not set: .ci/run starts Postgres on 127.0.0.1 (.ci/postgres) and exports it"
        );
        eprintln!("skipped Postgres: POSTGRES_URL is not set");
        return;
    };
    assert!(url.contains("@127.0.0.1:"), "tests talk to 127.0.0.1 only");
    let store = runtime
        .block_on(tower_agent_sessions::PostgresSessions::connect(&url))
        .expect("connects");
    let load = |id: &str| {
        runtime
            .block_on(store.load(id))
            .expect("loads")
            .map(|stored| stored.session)
            .unwrap_or_else(|| Session::with_id(id))
    };
    let (mut tally, started) = (Tally::default(), Instant::now());
    drive(
        &format!("postgres:{url}"),
        kills(300),
        dir,
        random,
        &mut tally,
        &load,
    );
    report("Postgres", &tally, started.elapsed());
    assert_mixed("Postgres", &tally);
}

/// Without the `postgres` feature there is no Postgres store to prove (`.ci/run` runs this
/// test again with every feature).
#[cfg(not(feature = "postgres"))]
fn postgres(_: &tokio::runtime::Runtime, _: &Path, _: &Random) {
    eprintln!("skipped Postgres: built without the `postgres` feature");
}
