//! The write-ahead record and recovery: a call that may not repeat is saved as started before
//! it runs; a process that dies while it runs leaves it started, and the next run asks its tool
//! what became of it (done, not run, unknown) instead of running it again or calling it not
//! done. Each test kills a run (its task aborted where it stands, as a process that dies) and
//! goes on from the last version it saved, in a new agent.

mod common;

use std::sync::{Arc, Mutex, PoisonError};

use common::Saves;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;
use tower::ServiceExt;
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, CallKey, Error, Event, Message, ModelResponse,
    Recovery, Session, ToolCall, ToolResult,
};
use tower_agent_loop::{Agent, AgentBuilder};
use tower_agent_test::{EventRecorder, ScriptedModel};
use tower_agent_tools::{ToolContext, ToolSet, tool_fn};

#[derive(Deserialize, JsonSchema)]
struct Pay {
    cents: u64,
}

/// When the payment tool of a process dies: before its effect, after it, or never.
#[derive(Clone, Copy, PartialEq)]
enum Dies {
    Before,
    After,
    Never,
}

/// The world outside: a ledger of payments by key, and how many times each tool ran.
#[derive(Clone, Default)]
struct World {
    ledger: Arc<Mutex<Vec<(CallKey, u64)>>>,
    runs: Arc<Mutex<Vec<String>>>,
}

impl World {
    fn ledger(&self) -> Vec<(CallKey, u64)> {
        self.ledger
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn runs(&self, name: &str) -> usize {
        let runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        runs.iter().filter(|run| *run == name).count()
    }

    fn ran(&self, name: &str) {
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        runs.push(name.to_owned());
    }

    /// The tools of one process: `pay` (with a reconcile step that reads the ledger), `ship`
    /// (without one) and the read-only `lookup`. `pay` dies where `dies` says, the other two
    /// as they start unless `dies` is `Never` or `ship_hangs`: a tool that dies tells
    /// `reached` and hangs (the process is killed there).
    fn tools(&self, dies: Dies, ship_hangs: bool, reached: mpsc::UnboundedSender<()>) -> ToolSet {
        let (world, looked) = (self.clone(), self.clone());
        let told = reached.clone();
        let pay = tool_fn("pay", "Pay.", move |args: Pay, cx: ToolContext| {
            let (world, reached) = (world.clone(), told.clone());
            async move {
                world.ran("pay");
                if dies == Dies::Before {
                    let _ = reached.send(());
                    std::future::pending::<()>().await;
                }
                let key = cx.key().ok_or_else(|| Error::bad_request("no key"))?;
                world
                    .ledger
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((key, args.cents));
                if dies == Dies::After {
                    let _ = reached.send(());
                    std::future::pending::<()>().await;
                }
                Ok::<_, Error>(format!("paid {}", args.cents))
            }
        })
        .reconcile(move |_: Pay, cx: ToolContext| {
            let world = looked.clone();
            async move {
                let ledger = world.ledger();
                match ledger.iter().find(|(key, _)| Some(*key) == cx.key()) {
                    Some((_, cents)) => Recovery::done(format!("paid {cents}")),
                    None => Recovery::NotRun,
                }
            }
        });
        let (world, told) = (self.clone(), reached.clone());
        let ship = tool_fn("ship", "Ship.", move |_: Pay| {
            let (world, reached) = (world.clone(), told.clone());
            async move {
                world.ran("ship");
                if dies != Dies::Never || ship_hangs {
                    let _ = reached.send(());
                    std::future::pending::<()>().await;
                }
                Ok::<_, Error>("shipped")
            }
        });
        let world = self.clone();
        let lookup = tool_fn("lookup", "Look up.", move |_: Pay| {
            let (world, reached) = (world.clone(), reached.clone());
            async move {
                world.ran("lookup");
                if dies != Dies::Never {
                    let _ = reached.send(());
                    std::future::pending::<()>().await;
                }
                Ok::<_, Error>("found")
            }
        })
        .read_only();
        ToolSet::new().tool(pay).tool(ship).tool(lookup)
    }
}

/// Run `calls` in a process whose tools die as `dies` and `ship_hangs` say, killed once they
/// told `reached` times and a saved version answers the calls `answered`; return what it
/// saved last.
async fn crash(
    builder: AgentBuilder,
    world: &World,
    calls: Vec<ToolCall>,
    (dies, ship_hangs): (Dies, bool),
    reached: usize,
    answered: &[&str],
) -> Session {
    let saves = Saves::default();
    let (tell, mut told) = mpsc::unbounded_channel();
    let model = ScriptedModel::new([ModelResponse::tool_calls(calls)]);
    let agent = builder.build(model, world.tools(dies, ship_hangs, tell));
    let request =
        AgentRequest::new(Session::with_id("s"), "pay the bills").with_saver(saves.clone());
    let run = tokio::spawn(agent.oneshot(request));
    for _ in 0..reached {
        told.recv().await.expect("the tool got there");
    }
    while !saves.all().iter().any(|version| {
        answered.iter().all(|id| {
            version
                .history
                .iter()
                .flat_map(Message::tool_results)
                .any(|r| r.call_id == *id)
        })
    }) {
        tokio::task::yield_now().await;
    }
    // The process dies where it stands.
    run.abort();
    assert!(run.await.expect_err("killed").is_cancelled());
    saves.last()
}

/// The next process: it goes on with `input` from `session`, with a model that answers
/// `answers`.
async fn next(
    builder: AgentBuilder,
    world: &World,
    session: Session,
    input: impl Into<AgentInput>,
    answers: Vec<ModelResponse>,
) -> (AgentResponse, Saves, EventRecorder, ScriptedModel) {
    let (saves, events) = (Saves::default(), EventRecorder::new());
    let (tell, _told) = mpsc::unbounded_channel();
    let model = ScriptedModel::new(answers);
    let agent = builder.build(model.clone(), world.tools(Dies::Never, false, tell));
    let request = AgentRequest::new(session, input)
        .with_saver(saves.clone())
        .with_observer(events.clone());
    let response = agent.oneshot(request).await.expect("the run");
    (response, saves, events, model)
}

fn result_of<'a>(session: &'a Session, id: &str) -> &'a ToolResult {
    session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .find(|result| result.call_id == id)
        .unwrap_or_else(|| panic!("a result for `{id}`"))
}

fn key_of(session: &Session, id: &str) -> CallKey {
    session
        .history
        .iter()
        .flat_map(Message::tool_calls)
        .find(|call| call.id == id)
        .and_then(|call| call.key)
        .expect("a key")
}

fn recovered(events: &EventRecorder) -> Vec<(String, &'static str)> {
    events
        .events()
        .into_iter()
        .filter_map(|event| match event {
            Event::ToolRecovered {
                call_id, outcome, ..
            } => Some((call_id, outcome)),
            _ => None,
        })
        .collect()
}

fn pay(id: &str, cents: u64) -> ToolCall {
    ToolCall::new(id, "pay", json!({ "cents": cents }))
}

#[tokio::test]
async fn a_call_that_took_effect_before_the_crash_is_recovered_as_done_and_never_runs_again() {
    for builder in [Agent::builder(), Agent::builder().concurrent_tools(4)] {
        let world = World::default();
        let saved = crash(
            builder.clone(),
            &world,
            vec![pay("p1", 250)],
            (Dies::After, false),
            1,
            &[],
        )
        .await;
        let key = key_of(&saved, "p1");
        assert_eq!(saved.started, [key], "saved as started before it ran");
        assert!(
            saved
                .history
                .open_calls()
                .iter()
                .any(|call| call.id == "p1")
        );

        let (response, saves, events, model) = next(
            builder,
            &world,
            saved,
            AgentInput::Continue,
            vec![ModelResponse::text("all paid")],
        )
        .await;
        assert_eq!(response.text().as_deref(), Some("all paid"));
        assert_eq!(world.ledger(), [(key, 250)], "paid once");
        assert_eq!(world.runs("pay"), 1, "the tool never ran again");
        let result = result_of(&response.session, "p1");
        assert_eq!(
            (result.content.as_str(), result.is_error),
            ("paid 250", false)
        );
        assert_eq!(recovered(&events), [("p1".to_owned(), "done")]);
        // The model read the recovered result, and the record is gone once it is saved.
        let asked = &model.requests()[0].messages;
        assert!(
            asked
                .iter()
                .flat_map(Message::tool_results)
                .any(|r| r.content == "paid 250")
        );
        assert!(response.session.started.is_empty());
        assert!(saves.all().iter().any(|version| {
            version.started.is_empty()
                && version
                    .history
                    .iter()
                    .flat_map(Message::tool_results)
                    .any(|r| r.call_id == "p1")
        }));
    }
}

#[tokio::test]
async fn a_call_the_crash_stopped_before_its_effect_is_recovered_as_not_run_and_made_again() {
    let world = World::default();
    let saved = crash(
        Agent::builder(),
        &world,
        vec![pay("p1", 250)],
        (Dies::Before, false),
        1,
        &[],
    )
    .await;
    let first = key_of(&saved, "p1");
    let (response, _, events, _) = next(
        Agent::builder(),
        &world,
        saved,
        AgentInput::Continue,
        vec![
            // The model reads "not executed" and makes the call again: a new call.
            ModelResponse::tool_calls([pay("p2", 250)]),
            ModelResponse::text("paid"),
        ],
    )
    .await;
    assert_eq!(
        result_of(&response.session, "p1").content,
        ToolResult::NOT_RUN
    );
    assert_eq!(recovered(&events), [("p1".to_owned(), "not_run")]);
    let again = key_of(&response.session, "p2");
    assert_ne!(again, first, "the new call has a key of its own");
    assert_eq!(world.ledger(), [(again, 250)], "paid once, by the new call");
}

#[tokio::test]
async fn a_call_without_a_reconcile_step_is_reported_unknown_and_the_host_hears_it() {
    let world = World::default();
    let ship = ToolCall::new("s1", "ship", json!({ "cents": 1 }));
    let saved = crash(
        Agent::builder(),
        &world,
        vec![ship],
        (Dies::After, false),
        1,
        &[],
    )
    .await;
    let (response, _, events, _) = next(
        Agent::builder(),
        &world,
        saved,
        AgentInput::Continue,
        vec![ModelResponse::text("I will check the shipment first")],
    )
    .await;
    let result = result_of(&response.session, "s1");
    assert_eq!(
        (result.content.as_str(), result.is_error),
        (ToolResult::OUTCOME_UNKNOWN, true)
    );
    assert_eq!(recovered(&events), [("s1".to_owned(), "unknown")]);
    assert_eq!(world.runs("ship"), 1, "never run again blindly");
}

#[tokio::test]
async fn a_read_only_call_in_flight_runs_again_on_continue_and_is_not_recorded() {
    let world = World::default();
    let lookup = ToolCall::new("l1", "lookup", json!({ "cents": 1 }));
    let saved = crash(
        Agent::builder(),
        &world,
        vec![lookup],
        (Dies::Before, false),
        1,
        &[],
    )
    .await;
    assert!(saved.started.is_empty(), "a read-only call is not recorded");
    let (response, _, events, _) = next(
        Agent::builder(),
        &world,
        saved,
        AgentInput::Continue,
        vec![ModelResponse::text("found it")],
    )
    .await;
    assert_eq!(result_of(&response.session, "l1").content, "found");
    assert_eq!(world.runs("lookup"), 2, "run again: it only reads");
    assert!(recovered(&events).is_empty());
}

#[tokio::test]
async fn new_input_after_a_crash_recovers_the_started_call_first() {
    let world = World::default();
    let saved = crash(
        Agent::builder(),
        &world,
        vec![pay("p1", 250)],
        (Dies::After, false),
        1,
        &[],
    )
    .await;
    let (response, _, events, model) = next(
        Agent::builder(),
        &world,
        saved,
        "did it go through?",
        vec![ModelResponse::text("yes, paid 250")],
    )
    .await;
    assert_eq!(result_of(&response.session, "p1").content, "paid 250");
    assert_eq!(recovered(&events), [("p1".to_owned(), "done")]);
    assert_eq!(world.ledger().len(), 1);
    // The model sees the recovered result, then the new input.
    let asked = &model.requests()[0].messages;
    let at = |f: &dyn Fn(&Message) -> bool| asked.iter().position(f).expect("there");
    let result = at(&|m| m.tool_results().any(|r| r.content == "paid 250"));
    let input = at(&|m| m.text() == "did it go through?");
    assert!(result < input);
}

#[tokio::test]
async fn a_concurrent_round_keeps_the_finished_result_and_recovers_the_one_in_flight() {
    let world = World::default();
    let ship = ToolCall::new("s1", "ship", json!({ "cents": 1 }));
    let builder = Agent::builder().concurrent_tools(4);
    // `pay` finishes and its result is saved; `ship` hangs; the process dies.
    let calls = vec![pay("p1", 100), ship];
    let saved = crash(
        builder.clone(),
        &world,
        calls,
        (Dies::Never, true),
        1,
        &["p1"],
    )
    .await;
    assert_eq!(
        saved.started,
        [key_of(&saved, "s1")],
        "only the call in flight"
    );
    let (response, _, events, _) = next(
        builder,
        &world,
        saved,
        AgentInput::Continue,
        vec![ModelResponse::text("paid; the shipment needs a look")],
    )
    .await;
    assert_eq!(result_of(&response.session, "p1").content, "paid 100");
    assert_eq!(
        result_of(&response.session, "s1").content,
        ToolResult::OUTCOME_UNKNOWN
    );
    assert_eq!(recovered(&events), [("s1".to_owned(), "unknown")]);
    assert_eq!((world.runs("pay"), world.runs("ship")), (1, 1));
}

#[tokio::test]
async fn the_write_ahead_record_costs_no_save_of_its_own() {
    // Two payments one after the other: the first is recorded with the model's message, the
    // second with the first one's result. As many saves as two read-only calls take.
    let run = |calls: Vec<ToolCall>| async move {
        let world = World::default();
        let saves = Saves::default();
        let model = ScriptedModel::new([
            ModelResponse::tool_calls(calls),
            ModelResponse::text("done"),
        ]);
        let tools = world.tools(Dies::Never, false, mpsc::unbounded_channel().0);
        let agent = Agent::builder().build(model, tools);
        let request = AgentRequest::new(Session::with_id("s"), "go").with_saver(saves.clone());
        agent.oneshot(request).await.expect("the run");
        saves.all()
    };
    let lookups = (1..=2)
        .map(|n| ToolCall::new(format!("l{n}"), "lookup", json!({ "cents": n })))
        .collect();
    let read_only = run(lookups).await;
    let paid = run(vec![pay("p1", 1), pay("p2", 2)]).await;
    assert_eq!(paid.len(), read_only.len(), "no save of its own");
    let calls = &paid.last().expect("saved").history;
    let (k1, k2) = {
        let mut keys = calls
            .iter()
            .flat_map(Message::tool_calls)
            .filter_map(|c| c.key);
        (keys.next().expect("a key"), keys.next().expect("a key"))
    };
    let records: Vec<Vec<CallKey>> = paid.iter().map(|v| v.started.clone()).collect();
    assert!(records.contains(&vec![k1]), "{records:?}");
    assert!(records.contains(&vec![k2]), "{records:?}");
    // Never both at once (one after the other), never a result beside its own record.
    for version in &paid {
        assert!(version.started.len() <= 1);
        for result in version.history.iter().flat_map(Message::tool_results) {
            let key = key_of(version, &result.call_id);
            assert!(
                !version.started.contains(&key),
                "a result beside its record"
            );
        }
    }
    assert!(paid.last().expect("saved").started.is_empty());
}

#[tokio::test]
async fn a_read_only_call_run_again_on_continue_may_pause_and_the_session_stays_valid() {
    let world = World::default();
    let lookup = ToolCall::new("l1", "lookup", json!({ "cents": 1 }));
    let saved = crash(
        Agent::builder(),
        &world,
        vec![lookup],
        (Dies::Before, false),
        1,
        &[],
    )
    .await;
    // The next process's lookup asks the host before it answers.
    let asks =
        tower_agent_test::StubTool::interrupting("lookup", json!("which account?")).read_only();
    let agent = Agent::builder().build(ScriptedModel::new([]), ToolSet::new().tool(asks));
    let response = agent
        .oneshot(AgentRequest::new(saved, AgentInput::Continue))
        .await
        .expect("the run");
    assert!(matches!(
        response.outcome,
        tower_agent_core::Outcome::Interrupted { .. }
    ));
    let waiting: Vec<&str> = response
        .session
        .interrupts
        .iter()
        .map(|i| i.call.id.as_str())
        .collect();
    assert_eq!(waiting, ["l1"]);
    tower_agent_core::history::validate(&response.session.history, &waiting)
        .expect("every call but the one that waits has a result");
    let answered = response
        .session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .any(|result| result.call_id == "l1");
    assert!(!answered, "the call that waits has no result");
}

#[tokio::test]
async fn a_recovery_that_fails_is_an_unknown_outcome_not_a_failed_call() {
    let world = World::default();
    let saved = crash(
        Agent::builder(),
        &world,
        vec![pay("p1", 250)],
        (Dies::After, false),
        1,
        &[],
    )
    .await;
    // The next process's tools cannot be asked (their service fails).
    let spec = tower_agent_core::ToolSpec::new("pay", "Pays.", json!({"type": "object"}));
    let failing = tower_agent_core::DescribedTools::new(
        [spec],
        tower::service_fn(|_: tower_agent_core::ToolRequest| async {
            Err::<tower_agent_core::ToolResponse, _>(Error::new(
                tower_agent_core::ErrorKind::Unreachable,
                "the ledger is down",
            ))
        }),
    );
    let model = ScriptedModel::new([ModelResponse::text("I will check")]);
    let agent = Agent::builder().build(model, failing);
    let response = agent
        .oneshot(AgentRequest::new(saved, AgentInput::Continue))
        .await
        .expect("the run");
    let result = result_of(&response.session, "p1");
    assert!(result.is_error);
    assert!(
        result.content.starts_with(ToolResult::OUTCOME_UNKNOWN)
            && result.content.contains("the ledger is down"),
        "{}",
        result.content
    );
    assert_eq!(world.ledger().len(), 1, "paid once");
}
