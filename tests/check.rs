//! The test kit's stack check on the full stack of built-ins, as a host app would run it on
//! its own: patching, call limits, summarization, retry, approval by interrupt, eviction.

use std::time::Duration;
use tower_agent::layers::PatchDanglingLayer;
use tower_agent::layers::RetryLayer;
use tower_agent::sessions::StoreLayer;

use tower_agent::layers::approval::{ApprovalLayer, Gate};
use tower_agent::layers::evict::EvictLayer;
use tower_agent::layers::limits::{CallLimitsLayer, Limit};
use tower_agent::layers::retry::RetryPolicy;
use tower_agent::layers::summarize::{Keep, SummarizeLayer, Trigger};
use tower_agent::prelude::*;
use tower_agent::storage::InMemory;
use tower_agent_test::check::StackCheck;

#[tokio::test(flavor = "current_thread")]
async fn the_built_in_stack_keeps_every_invariant() {
    let report = StackCheck::new()
        .seed(7)
        .cases(200)
        .run(|model, tools| {
            Agent::builder()
                .max_rounds(8)
                .with(PatchDanglingLayer::new())
                .with(CallLimitsLayer::new().tool_calls(Limit::per_run(6)))
                .with(
                    SummarizeLayer::in_stack()
                        .trigger(Trigger::messages(12))
                        .keep(Keep::messages(4)),
                )
                .with(RetryLayer::new(
                    RetryPolicy::new()
                        .max_attempts(3)
                        .jitter(Duration::ZERO)
                        .max_delay(Duration::ZERO),
                ))
                .with(
                    ApprovalLayer::builder()
                        .gate("write", Gate::new())
                        .build()
                        .expect("valid"),
                )
                .with(EvictLayer::new(InMemory::new()).limit(1_000))
                .build(model, tools)
        })
        .await;
    println!("{report}");
    for (what, count) in [
        ("completed", report.completed),
        ("stopped", report.stopped),
        ("cancelled", report.cancelled),
        ("interrupted", report.interrupted),
        ("leftovers", report.leftovers),
        ("summaries", report.summaries),
        ("large results", report.large_results),
    ] {
        assert!(count > 0, "no {what}: {report}");
    }
}

/// Every built-in at once, in its canonical slot, with early tool starts: thousands of cases
/// of generated sessions, crashed leftovers, runs killed at random points (the case goes on
/// from what they saved), cancellations, interrupts decided at random, failures and resumes.
/// Besides the check's own invariants: a secret (an email address the redaction removes)
/// reaches no saved version, event or error; an input the guardrail trips on never stays; a
/// call answered in a saved version is never answered otherwise; no call runs twice; and a
/// saved version drawn at random from each case resumes. The check plays the store: it gives
/// each run the saver `.with(StoreLayer::new(..))` would, and keeps every version.
#[tokio::test(flavor = "current_thread")]
async fn every_built_in_at_once_keeps_every_invariant() {
    // Every span and log line of the runs is read for the secret as it is recorded (the layer
    // finds it where it is: a control first).
    let control = Spans::default();
    let subscriber = tracing_subscriber::layer::SubscriberExt::with(
        tracing_subscriber::Registry::default(),
        control.clone(),
    );
    tracing::subscriber::with_default(subscriber, || tracing::info!(to = SECRET, "a control"));
    assert!(control.0.lock().expect("not poisoned").is_some());
    let spans = Spans::default();
    let subscriber = tracing_subscriber::layer::SubscriberExt::with(
        tracing_subscriber::Registry::default(),
        spans.clone(),
    );
    let recording = tracing::subscriber::set_default(subscriber);
    every_built_in_at_once(32, 2_000, false).await;
    drop(recording);
    let found = spans.0.lock().expect("not poisoned").clone();
    assert_eq!(found, None, "the secret reached a span or a log line");
}

/// A tracing layer that looks for the secret in every field of every span and event.
#[derive(Clone, Default)]
struct Spans(std::sync::Arc<std::sync::Mutex<Option<String>>>);

impl Spans {
    fn read(&self, fields: impl FnOnce(&mut dyn tracing::field::Visit)) {
        let mut seen = Seen(None);
        fields(&mut seen);
        if let Some(found) = seen.0 {
            self.0.lock().expect("not poisoned").get_or_insert(found);
        }
    }
}

struct Seen(Option<String>);

impl tracing::field::Visit for Seen {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if text.contains(SECRET) {
            self.0.get_or_insert(format!("{}: {text}", field.name()));
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        self.read(|visit| attrs.record(visit));
    }

    fn on_record(
        &self,
        _: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        self.read(|visit| values.record(visit));
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        self.read(|visit| event.record(visit));
    }
}

const SECRET: &str = "ada.lovelace@example.com";

/// The same on two threads: early runs, the tool cache and concurrent calls meet across
/// threads (a lock taken twice shows here). A seed does not replay a case exactly there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_built_in_at_once_on_two_threads() {
    every_built_in_at_once(64, 300, false).await;
}

/// The same with a session store (`StoreLayer`): each run names its session by id, the store
/// loads and saves it, and a run killed goes on from what the store holds.
#[tokio::test(flavor = "current_thread")]
async fn every_built_in_at_once_with_a_store() {
    every_built_in_at_once(96, 1_000, true).await;
}

/// Sessions in memory that tell the check each session they write.
struct Logged {
    inner: tower_agent::sessions::InMemorySessions,
    saves: tower_agent_test::check::CheckSaves,
}

impl tower_agent::sessions::SessionStore for Logged {
    fn load<'a>(
        &'a self,
        id: &'a str,
    ) -> tower_agent::sessions::BoxFuture<
        'a,
        Result<Option<tower_agent::sessions::Stored>, tower_agent::sessions::StoreError>,
    > {
        self.inner.load(id)
    }

    fn save<'a>(
        &'a self,
        session: &'a Session,
        expected: Option<tower_agent::sessions::Version>,
    ) -> tower_agent::sessions::BoxFuture<
        'a,
        Result<tower_agent::sessions::Version, tower_agent::sessions::StoreError>,
    > {
        Box::pin(async move {
            let version = self.inner.save(session, expected).await?;
            self.saves.saved(session);
            Ok(version)
        })
    }

    fn list<'a>(
        &'a self,
        query: &'a tower_agent::sessions::ListQuery,
    ) -> tower_agent::sessions::BoxFuture<
        'a,
        Result<tower_agent::sessions::Page, tower_agent::sessions::StoreError>,
    > {
        self.inner.list(query)
    }

    fn delete<'a>(
        &'a self,
        id: &'a str,
        expected: tower_agent::sessions::Version,
    ) -> tower_agent::sessions::BoxFuture<'a, Result<bool, tower_agent::sessions::StoreError>> {
        self.inner.delete(id, expected)
    }
}

/// Conversations' spend windows, in memory, remembering every window reserved in and the holds
/// not yet settled or released.
#[derive(Clone, Default)]
struct Windows {
    inner: tower_agent::layers::budget::InMemorySpend,
    keys: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    held: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<i64>>>,
}

impl tower_agent::layers::budget::SpendStore for Windows {
    fn reserve<'a>(
        &'a self,
        window: &'a str,
        limit: tower_agent::Cost,
        amount: tower_agent::Cost,
    ) -> tower_agent::event::BoxFuture<
        'a,
        Result<Result<tower_agent::layers::budget::Hold, tower_agent::Cost>, Error>,
    > {
        self.keys.lock().expect("keys").insert(window.to_owned());
        Box::pin(async move {
            let reserved = self.inner.reserve(window, limit, amount).await?;
            if let Ok(hold) = &reserved {
                self.held.lock().expect("held").insert(hold.id);
            }
            Ok(reserved)
        })
    }

    fn settle(
        &self,
        hold: tower_agent::layers::budget::Hold,
        actual: tower_agent::Cost,
    ) -> tower_agent::event::BoxFuture<'_, Result<(), Error>> {
        self.held.lock().expect("held").remove(&hold.id);
        self.inner.settle(hold, actual)
    }

    fn release(
        &self,
        hold: tower_agent::layers::budget::Hold,
    ) -> tower_agent::event::BoxFuture<'_, Result<(), Error>> {
        self.held.lock().expect("held").remove(&hold.id);
        self.inner.release(hold)
    }

    fn spent<'a>(
        &'a self,
        window: &'a str,
    ) -> tower_agent::event::BoxFuture<'a, Result<tower_agent::Cost, Error>> {
        self.inner.spent(window)
    }
}

/// A host layer that pauses before the model call after one tool result in four
/// (`Interrupt::before_model`, keyed by the result's call id: the same key when the call is
/// asked again after a resume), counting the pauses and the calls that went on when resumed.
#[derive(Clone, Default)]
struct Pauses(std::sync::Arc<[std::sync::atomic::AtomicU32; 2]>);

impl Pauses {
    fn layer(&self) -> impl tower_agent::stack::ModelLayer + use<> {
        use std::sync::atomic::Ordering::Relaxed;
        let counts = std::sync::Arc::clone(&self.0);
        tower_agent::before_model(move |req: ModelRequest| {
            let counts = std::sync::Arc::clone(&counts);
            async move {
                let Some(result) = req.messages.last().and_then(|m| m.tool_results().next()) else {
                    return Ok(tower_agent::Flow::Continue(req));
                };
                let key = format!("after-{}", result.call_id);
                if key.bytes().map(u32::from).sum::<u32>() % 4 != 0 {
                    return Ok(tower_agent::Flow::Continue(req));
                }
                if req.ctx.resumed(&key).is_some() {
                    counts[1].fetch_add(1, Relaxed);
                    return Ok(tower_agent::Flow::Continue(req));
                }
                counts[0].fetch_add(1, Relaxed);
                Ok(tower_agent::Flow::Answer(ModelResponse::pause(
                    tower_agent::Interrupt::before_model(key, "pause", serde_json::json!("Go on?")),
                )))
            }
        })
    }

    fn counts(&self) -> (u32, u32) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.0[0].load(Relaxed), self.0[1].load(Relaxed))
    }
}

/// The conversation window's limit in the check: a few calls' worth.
const WINDOW: u64 = 20_000_000;

async fn every_built_in_at_once(seed: u64, cases: u32, stored: bool) {
    use tower_agent::layers::budget::{BudgetLayer, SpendStore, SpendWindow};
    use tower_agent::layers::checkpoint::CheckpointLayer;
    use tower_agent::layers::clear::ClearToolResultsLayer;
    use tower_agent::layers::fallback::FallbackLayer;
    use tower_agent::layers::guardrail::{Guardrail, GuardrailLayer, Verdict};
    use tower_agent::layers::instructions::InstructionsLayer;
    use tower_agent::layers::memory::MemoryLayer;
    use tower_agent::layers::redact::{RedactLayer, Rules};
    use tower_agent::layers::select::ToolSelectLayer;
    use tower_agent::layers::tool_guard::{ToolGuardLayer, ToolVerdict};
    use tower_agent::storage::{Storage, StoragePath};
    use tower_agent::{Cost, ModelPrice};

    // `CHECK_CASES` and `CHECK_SEED` explore more (CI runs the defaults).
    let var = |name: &str| std::env::var(name).ok().and_then(|n| n.parse::<u64>().ok());
    let cases = var("CHECK_CASES").map_or(cases, |n| u32::try_from(n).unwrap_or(cases));
    let seed = var("CHECK_SEED").unwrap_or(seed);
    let files = InMemory::new();
    files
        .put(
            &StoragePath::parse("/memories/AGENTS.md").expect("a path"),
            "Prefer short answers.".into(),
        )
        .await
        .expect("stored");
    // About half the cases run their tool calls concurrently, and check their input in
    // parallel with the first model call (drawn from the case's seed: a replay builds the same
    // stack).
    // Every case's conversation spends from one shared store of windows.
    let windows = Windows::default();
    let check = StackCheck::new()
        .seed(seed)
        .cases(cases)
        .secret(SECRET)
        .trips_on("forbidden")
        .tool_calls_per_run(6);
    // A host's model layer pauses before some model calls that follow a tool round (the
    // check decides each pause at random, like an approval), and goes on when resumed.
    let pauses = Pauses::default();
    let every = |model: &tower_agent_test::check::CheckModel| {
        let other = model.seed() % 2 == 0;
        // A third of the cases run the reads concurrently and the writes in turn, with the
        // repeats of a message answered, not run.
        let builder = match (other, model.seed() % 3 == 0) {
            (_, true) => Agent::builder().concurrent_reads(4).dedupe_calls(true),
            (true, false) => Agent::builder().concurrent_tools(4),
            (false, false) => Agent::builder(),
        };
        let guardrail = GuardrailLayer::new()
            .input(Guardrail::new("no_forbidden", |text: String| async move {
                match text.contains("forbidden") {
                    true => Verdict::trip("a forbidden request"),
                    false => Verdict::Pass,
                }
            }))
            .parallel(other);
        let every = builder
            .max_rounds(8)
            .early_tool_start(true)
            .with(MemoryLayer::from_storage(
                files.clone(),
                ["/memories/AGENTS.md"],
            ))
            .with(PatchDanglingLayer::new())
            .with(RedactLayer::new(Rules::new().emails()))
            .with(guardrail)
            .with(
                CallLimitsLayer::new()
                    .tool_calls(Limit::per_run(6))
                    .model_calls(Limit::per_session(60)),
            )
            .with(InstructionsLayer::new().text("Be careful."))
            .with(ToolSelectLayer::by(|req| {
                req.tools.iter().map(|spec| spec.name.clone()).collect()
            }))
            .with(
                SummarizeLayer::in_stack()
                    .trigger(Trigger::messages(12))
                    .keep(Keep::messages(4)),
            )
            .with(ClearToolResultsLayer::new())
            // Small enough that a long history's request does not fit now and then.
            .with(
                BudgetLayer::new(ModelPrice::per_million(1.0, 0.1, 2.0))
                    .assume_output_tokens(1_000)
                    .per_run(Cost::from_nanodollars(8_000_000))
                    .window(
                        SpendWindow::conversation(Cost::from_nanodollars(WINDOW)),
                        windows.clone(),
                    ),
            )
            .with(RetryLayer::new(
                RetryPolicy::new()
                    .max_attempts(2)
                    .jitter(Duration::ZERO)
                    .max_delay(Duration::ZERO),
            ))
            .with(FallbackLayer::new().to("second", model.clone()))
            .with(
                ApprovalLayer::builder()
                    .gate("write", Gate::new())
                    .build()
                    .expect("valid"),
            )
            .with(CheckpointLayer::interrupting().every(5))
            .model_layer(pauses.layer())
            .with(EvictLayer::new(InMemory::new()).limit(1_000))
            // Denies a call of each tool now and then (a read-only `lookup` that started early
            // too), and revises some writes: the revised arguments run, and the session shows
            // them.
            .with(ToolGuardLayer::new(|call: ToolCall, _| async move {
                let n = serde_json::from_str::<serde_json::Value>(&call.arguments)
                    .ok()
                    .and_then(|args| args["n"].as_u64())
                    .unwrap_or(0);
                match (call.name.as_str(), n % 7) {
                    (_, 0) => ToolVerdict::deny("a multiple of seven"),
                    ("write", 1) => ToolVerdict::revise(serde_json::json!({ "n": n + 100 })),
                    _ => ToolVerdict::Allow,
                }
            }));
        #[cfg(feature = "structured")]
        let every = every.with(tower_agent::layers::structured::StructuredLayer::new());
        #[cfg(feature = "cache")]
        let every = every.with(tower_agent::layers::cache::ToolCacheLayer::new());
        every
    };
    let report = match stored {
        false => {
            check
                .run(|model, tools| every(&model).build(model, tools))
                .await
        }
        true => {
            check
                .run_stored(|model, tools, saves| {
                    let store = Logged {
                        inner: tower_agent::sessions::InMemorySessions::new(),
                        saves,
                    };
                    every(&model)
                        .with(StoreLayer::new(store))
                        .build(model, tools)
                })
                .await
        }
    };
    println!("{report}");
    // Each conversation's window, across its runs, resumes and kills: never over its limit,
    // and no hold left behind (a killed run's is released as it is dropped).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let keys = windows.keys.lock().expect("keys").clone();
    assert!(keys.len() > 1, "windows reserved in: {keys:?}");
    for key in &keys {
        let spent = windows.spent(key).await.expect("in memory");
        assert!(
            spent <= Cost::from_nanodollars(WINDOW),
            "{key} spent {spent}"
        );
    }
    let (paused, went_on) = pauses.counts();
    println!("paused before a model call: {paused}, went on when resumed: {went_on}");
    assert!(
        paused > 0 && went_on > 0,
        "paused {paused}, went on {went_on}"
    );
    let held = windows.held.lock().expect("held").clone();
    assert!(
        held.is_empty(),
        "holds never settled nor released: {held:?}"
    );
    for (what, count) in [
        ("completed", report.completed),
        ("stopped", report.stopped),
        ("cancelled", report.cancelled),
        ("interrupted", report.interrupted),
        ("killed", report.killed),
        ("tripped", report.tripped),
        ("limited", report.limited),
        ("cut calls", report.cut_calls),
        ("calls recovered as done", report.recovered[0]),
        (
            "calls recovered as not run",
            report.recovered[1] + u32::from(stored),
        ),
        ("calls recovered as unknown", report.recovered[2]),
        ("leftovers", report.leftovers),
        ("summaries", report.summaries),
        ("large results", report.large_results),
        (
            "resumed versions",
            report.resumed_versions + u32::from(stored),
        ),
    ] {
        assert!(count > 0, "no {what}: {report}");
    }
}
