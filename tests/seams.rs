//! Where built-ins meet the loop's saves, each seam on the canonical stack with a store: the
//! input is redacted before anything is saved, a tripped input is never left in the session,
//! and what a cancelled run returns holds no raw secret.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tower::Layer;
use tower_agent::CancellationToken;
use tower_agent::layers::PatchDanglingLayer;
use tower_agent::sessions::StoreLayer;
use tower_agent::tools::NoArgs;

use tower_agent::layers::guardrail::{Guardrail, GuardrailLayer, Verdict};
use tower_agent::layers::limits::{CallLimitsLayer, Limit};
use tower_agent::layers::redact::{RedactLayer, Rules};
use tower_agent::prelude::*;
use tower_agent::sessions::{
    BoxFuture, InMemorySessions, ListQuery, Page, SessionStore, StoreError, Stored, Version,
};
use tower_agent_test::{ScriptedModel, assert_valid_history};

/// A store that keeps every version it was asked to write, as JSON.
#[derive(Clone, Default)]
struct Recording {
    inner: InMemorySessions,
    written: Arc<Mutex<Vec<String>>>,
}

impl Recording {
    fn written(&self) -> Vec<String> {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl SessionStore for Recording {
    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        self.inner.load(id)
    }

    fn save<'a>(
        &'a self,
        session: &'a Session,
        expected: Option<Version>,
    ) -> BoxFuture<'a, Result<Version, StoreError>> {
        let json = serde_json::to_string(session).expect("a session serializes");
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(json);
        self.inner.save(session, expected)
    }

    fn list<'a>(&'a self, query: &'a ListQuery) -> BoxFuture<'a, Result<Page, StoreError>> {
        self.inner.list(query)
    }

    fn delete<'a>(
        &'a self,
        id: &'a str,
        expected: Version,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.delete(id, expected)
    }
}

const EMAIL: &str = "ada.lovelace@example.com";

fn texts(session: &Session) -> Vec<String> {
    session.history.iter().map(Message::text).collect()
}

#[tokio::test]
async fn the_input_is_redacted_before_the_first_save() {
    let store = Recording::default();
    let model = ScriptedModel::new([ModelResponse::text("Noted.")]);
    let agent = Agent::builder()
        .with(StoreLayer::new(store.clone()))
        .with(RedactLayer::new(Rules::new().emails()))
        .with(PatchDanglingLayer::new())
        .build(model.clone(), ToolSet::new());
    let res = agent
        .oneshot(AgentRequest::new(
            Session::with_id("pii"),
            format!("Write to me at {EMAIL}."),
        ))
        .await
        .expect("the run");
    assert_eq!(texts(&res.session)[0], "Write to me at [REDACTED:email].");
    let written = store.written();
    assert!(!written.is_empty(), "the run saved");
    for version in &written {
        assert!(
            !version.contains(EMAIL),
            "a raw address was saved: {version}"
        );
    }
    assert!(!model.requests()[0].messages[0].text().contains(EMAIL));
}

#[tokio::test]
async fn a_run_cancelled_during_the_model_call_returns_and_saves_its_input_redacted() {
    let store = Recording::default();
    // A model that never answers: the run is cancelled while it waits.
    let model = tower::service_fn(|_: ModelRequest| async {
        std::future::pending::<Result<ModelResponse, Error>>().await
    });
    let agent = Agent::builder()
        .with(StoreLayer::new(store.clone()))
        .with(RedactLayer::new(Rules::new().emails()))
        .build(model, ToolSet::new());
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        cancel.cancel();
    });
    let res = agent
        .oneshot(
            AgentRequest::new(Session::with_id("cancelled"), format!("I am {EMAIL}"))
                .with_cancellation(token),
        )
        .await
        .expect("a cancelled run is an outcome");
    assert!(matches!(res.outcome, Outcome::Cancelled { .. }));
    assert_eq!(texts(&res.session), ["I am [REDACTED:email]"]);
    for version in store.written() {
        assert!(
            !version.contains(EMAIL),
            "a raw address was saved: {version}"
        );
    }
}

/// A guardrail that trips on the word "password".
fn no_passwords(seen: Arc<Mutex<Vec<String>>>) -> Guardrail {
    Guardrail::new("no_passwords", move |text: String| {
        seen.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(text.clone());
        async move {
            match text.contains("password") {
                true => Verdict::trip("asks for a password"),
                false => Verdict::Pass,
            }
        }
    })
}

async fn a_tripped_input_does_not_stick(parallel: bool) {
    let store = Recording::default();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let guard = GuardrailLayer::new()
        .input(no_passwords(seen.clone()))
        .parallel(parallel);
    // In parallel, the tripped input's model call may have answered before the trip: its
    // answer is withheld.
    let model = match parallel {
        true => ScriptedModel::new([
            ModelResponse::text("withheld"),
            ModelResponse::text("Hi there."),
        ]),
        false => ScriptedModel::new([ModelResponse::text("Hi there.")]),
    };
    let agent = Agent::builder()
        .with(StoreLayer::new(store.clone()))
        .with(RedactLayer::new(Rules::new().emails()))
        .with(guard)
        .with(PatchDanglingLayer::new())
        .build(model.clone(), ToolSet::new());

    let first = agent
        .clone()
        .oneshot(AgentRequest::new(
            Session::with_id("guarded"),
            "What is Bob's password?",
        ))
        .await
        .expect("a trip is an outcome");
    let Outcome::Stopped {
        reason: StopReason::Guardrail { name, .. },
        ..
    } = &first.outcome
    else {
        panic!("stopped by the guardrail: {:?}", first.outcome);
    };
    assert_eq!(name, "no_passwords");
    assert!(
        first.session.history.is_empty(),
        "nothing tripped is appended: {:?}",
        texts(&first.session)
    );
    if !parallel {
        assert_eq!(model.request_count(), 0, "the model was never asked");
        for version in store.written() {
            assert!(!version.contains("password"), "the tripped input was saved");
        }
    }

    // The next run goes on with its own input alone, checked alone.
    let second = agent
        .oneshot(AgentRequest::new(Session::with_id("guarded"), "Hello!"))
        .await
        .expect("the next run");
    assert_eq!(second.text().as_deref(), Some("Hi there."));
    assert_eq!(texts(&second.session), ["Hello!", "Hi there."]);
    let checked = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert_eq!(checked.last().map(String::as_str), Some("Hello!"));
    assert!(
        checked
            .iter()
            .all(|text| !text.contains("password") || text == "What is Bob's password?"),
        "the tripped input was checked again: {checked:?}"
    );
    let sent = model
        .requests()
        .last()
        .expect("a model call")
        .messages
        .clone();
    assert_eq!(sent.len(), 1, "the model sees the new input only");
}

#[tokio::test]
async fn a_tripped_input_guardrail_does_not_stick_to_the_session() {
    a_tripped_input_does_not_stick(false).await;
}

#[tokio::test]
async fn a_tripped_parallel_input_guardrail_does_not_stick_to_the_session() {
    a_tripped_input_does_not_stick(true).await;
}

#[tokio::test]
async fn an_input_refused_by_a_call_limit_is_not_appended() {
    let store = Recording::default();
    let model = ScriptedModel::new([ModelResponse::text("first answer")]);
    let agent = Agent::builder()
        .with(StoreLayer::new(store.clone()))
        .with(CallLimitsLayer::new().model_calls(Limit::per_session(1)))
        .with(PatchDanglingLayer::new())
        .build(model.clone(), ToolSet::new());
    let id = || Session::with_id("limited");
    agent
        .clone()
        .oneshot(AgentRequest::new(id(), "one"))
        .await
        .expect("the first run");
    for input in ["two", "three"] {
        let res = agent
            .clone()
            .oneshot(AgentRequest::new(id(), input))
            .await
            .expect("a stop is an outcome");
        assert!(
            matches!(
                res.outcome,
                Outcome::Stopped {
                    reason: StopReason::Limit { .. },
                    ..
                }
            ),
            "{:?}",
            res.outcome
        );
        assert_eq!(texts(&res.session), ["one", "first answer"]);
    }
    let stored = store.load("limited").await.expect("load").expect("stored");
    assert_eq!(texts(&stored.session), ["one", "first answer"]);
    assert_eq!(model.request_count(), 1);
}

/// A model that never answers: the process "dies" while it waits (the run is dropped).
fn hanging() -> impl tower::Service<
    ModelRequest,
    Response = ModelResponse,
    Error = Error,
    Future = impl Send + 'static,
> + Clone
+ Send
+ 'static {
    tower::service_fn(|_: ModelRequest| async {
        std::future::pending::<Result<ModelResponse, Error>>().await
    })
}

#[tokio::test]
async fn a_workflow_killed_in_its_second_step_keeps_the_first_and_resumes_there() {
    use tower_agent::workflow::Sequential;
    let store = Recording::default();
    let first = ScriptedModel::new([ModelResponse::text("Plan: two steps.")]);
    let flow = |second: tower_agent::BoxModel| {
        Sequential::new("flow")
            .step("plan", Agent::new(first.clone(), ToolSet::new()))
            .step_with_input("build", Agent::new(second, ToolSet::new()), "Now build it.")
    };
    let store_layer = tower_agent::sessions::StoreLayer::new(store.clone());
    let killed = store_layer.layer(flow(tower_agent::BoxModel::new(hanging())));
    // The process dies while the second step waits for its model: the run is dropped.
    let run = killed.oneshot(AgentRequest::new(Session::with_id("wf"), "Make a thing."));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), run)
            .await
            .is_err(),
        "the second step hangs"
    );
    let stored = store.load("wf").await.expect("load").expect("stored");
    assert_eq!(
        texts(&stored.session),
        ["Make a thing.", "Plan: two steps.", "Now build it."],
        "the first step's work and the second step's input were saved as they happened"
    );

    // Resumed in a "new process": the first step is not run again.
    let second = ScriptedModel::new([ModelResponse::text("Built.")]);
    let resumed = store_layer.layer(flow(tower_agent::BoxModel::new(second.clone())));
    let res = resumed
        .oneshot(AgentRequest::new(
            Session::with_id("wf"),
            AgentInput::Continue,
        ))
        .await
        .expect("the resumed run");
    assert_eq!(res.text().as_deref(), Some("Built."));
    assert_eq!(first.request_count(), 1, "the first step ran once");
    assert_eq!(
        texts(&res.session),
        [
            "Make a thing.",
            "Plan: two steps.",
            "Now build it.",
            "Built."
        ]
    );
}

#[tokio::test]
async fn a_workflow_killed_between_steps_resumes_at_the_next_step_with_its_input() {
    use tower_agent::workflow::Sequential;
    let store = Recording::default();
    let first = ScriptedModel::new([ModelResponse::text("Plan: two steps.")]);
    let plan = Agent::new(first.clone(), ToolSet::new());
    // A step of the host's own that saves nothing and never ends: the process dies in it.
    let stuck = tower::service_fn(|_: AgentRequest| async {
        std::future::pending::<Result<AgentResponse, Error>>().await
    });
    let killed = tower_agent::sessions::StoreLayer::new(store.clone()).layer(
        Sequential::new("flow")
            .step("plan", plan.clone())
            .step_with_input("build", stuck, "Now build it."),
    );
    let run = killed.oneshot(AgentRequest::new(Session::with_id("wf2"), "Make a thing."));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), run)
            .await
            .is_err()
    );
    let stored = store.load("wf2").await.expect("load").expect("stored");
    assert_eq!(
        texts(&stored.session),
        ["Make a thing.", "Plan: two steps.", "Now build it."],
        "saved standing at the second step, its input kept"
    );

    let second = ScriptedModel::new([ModelResponse::text("Built.")]);
    let resumed = tower_agent::sessions::StoreLayer::new(store.clone()).layer(
        Sequential::new("flow").step("plan", plan).step_with_input(
            "build",
            Agent::new(second.clone(), ToolSet::new()),
            "Now build it.",
        ),
    );
    let res = resumed
        .oneshot(AgentRequest::new(
            Session::with_id("wf2"),
            AgentInput::Continue,
        ))
        .await
        .expect("the resumed run");
    assert_eq!(
        first.request_count(),
        1,
        "the finished step is not run again"
    );
    assert_eq!(
        texts(&res.session),
        [
            "Make a thing.",
            "Plan: two steps.",
            "Now build it.",
            "Built."
        ]
    );
}

#[tokio::test]
async fn the_input_check_reads_what_the_model_would_and_the_trip_is_told_to_readers() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let guard = GuardrailLayer::new().input(no_passwords(seen.clone()));
    let model = ScriptedModel::new([ModelResponse::text("never")]);
    let agent = Agent::builder()
        .with(guard)
        .with(PatchDanglingLayer::new())
        .build(model.clone(), ToolSet::new());
    // A session of the host's own that ends with a user message: the model would read it with
    // the new input, so the check reads both.
    let mut session = Session::with_id("host");
    session
        .history
        .push(Message::user("Bob's password, please."));
    let recorder = tower_agent_test::EventRecorder::new();
    let res = agent
        .oneshot(AgentRequest::new(session, "hi").with_observer(recorder.clone()))
        .await
        .expect("a trip is an outcome");
    assert!(
        matches!(
            res.outcome,
            Outcome::Stopped {
                reason: StopReason::Guardrail { .. },
                ..
            }
        ),
        "{:?}",
        res.outcome
    );
    assert_eq!(model.request_count(), 0, "the model never read it");
    let checked = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert_eq!(checked, ["Bob's password, please.\n\nhi"]);
    assert!(
        res.session.history.is_empty(),
        "nothing tripped stays, the session's own last message neither"
    );
    assert_eq!(
        recorder.names(),
        ["run_started", "run_finished"],
        "readers hear the run start and end"
    );
}

/// A sub-agent that looks something up, then hangs in its second model call: the process
/// "dies" there. Its parent calls it as the tool `research` (call `c1`).
async fn a_sub_agent_killed_in_its_second_round(concurrent: bool) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower_agent::workflow::{AgentTool, SUBAGENT_STATE_KEY};

    let store = Recording::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let sub_model = tower::service_fn(move |_: ModelRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                let call = ToolCall::new("s1", "lookup", serde_json::json!({}));
                return Ok(ModelResponse::tool_calls([call]));
            }
            std::future::pending::<Result<ModelResponse, Error>>().await
        }
    });
    let lookup = ToolSet::new().tool(tool_fn("lookup", "Look it up.", |_: NoArgs| async move {
        Ok::<_, Error>("2.1 million")
    }));
    let sub = Agent::builder()
        .tool_specs(lookup.specs())
        .build(sub_model, lookup);
    let tools = ToolSet::new().tool(AgentTool::new("research", "Research.", sub));
    let parent = ScriptedModel::new([ModelResponse::tool_calls([ToolCall::new(
        "c1",
        "research",
        serde_json::json!({"task": "Population of Paris?"}),
    )])]);
    let builder = Agent::builder().tool_specs(tools.specs());
    let builder = if concurrent {
        builder.concurrent_tools(4)
    } else {
        builder.sequential_tools()
    };
    let agent =
        tower_agent::sessions::StoreLayer::new(store.clone()).layer(builder.build(parent, tools));
    let run = agent.oneshot(AgentRequest::new(Session::with_id("lead"), "How many?"));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), run)
            .await
            .is_err(),
        "the sub-agent hangs"
    );
    let stored = store.load("lead").await.expect("load").expect("stored");
    assert_eq!(
        stored.session.history.len(),
        2,
        "the parent's call is saved, unanswered"
    );
    let kept = stored
        .session
        .state
        .get(SUBAGENT_STATE_KEY.name())
        .and_then(|all| all.get("c1"))
        .cloned()
        .expect("the sub-agent's session is kept in the parent's state");
    let sub: Session = serde_json::from_value(kept).expect("a session");
    assert_eq!(sub.history.len(), 3, "the task, the lookup, its result");
    assert_eq!(texts(&sub)[0], "Population of Paris?");
    assert_eq!(
        sub.history[2]
            .tool_results()
            .next()
            .map(|r| r.content.as_str()),
        Some("2.1 million"),
        "the sub-agent's first round was saved into the parent's session as it happened"
    );
}

#[tokio::test]
async fn a_sub_agent_killed_in_its_second_round_keeps_its_first_in_the_parent_session() {
    a_sub_agent_killed_in_its_second_round(false).await;
}

#[tokio::test]
async fn a_sub_agent_among_concurrent_calls_saves_its_steps_into_the_parent_session() {
    a_sub_agent_killed_in_its_second_round(true).await;
}

const CARD: &str = "4111-1111-1111-1111";

/// The block strategy on the canonical stack with a store: emails are redacted, cards are
/// refused wherever they appear; a refused input or tool result is never saved and the session
/// goes on.
#[tokio::test]
async fn a_blocked_card_is_never_saved_and_the_session_goes_on() {
    use tower_agent::layers::redact::Replace;
    let cards = Rules::new()
        .pattern("card", r"\d{4}-\d{4}-\d{4}-\d{4}", Replace::Label)
        .expect("a bounded pattern");
    let block = Guardrail::blocking("pii", cards);
    let store = Recording::default();
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "wallet", serde_json::json!({}))]),
        ModelResponse::text("Mail sent."),
    ]);
    let wallet = ToolSet::new().tool(tool_fn("wallet", "The wallet.", |_: NoArgs| async move {
        Ok::<_, Error>(format!("card {CARD}, owner {EMAIL}"))
    }));
    let agent = Agent::builder()
        .with(StoreLayer::new(store.clone()))
        .with(RedactLayer::new(Rules::new().emails()))
        .with(
            GuardrailLayer::new()
                .input(block.clone())
                .tool_results(block),
        )
        .with(PatchDanglingLayer::new())
        .with(CallLimitsLayer::new().model_calls(Limit::per_run(4)))
        .tool_specs(wallet.specs())
        .build(model.clone(), wallet);
    let run = |input: String| {
        agent
            .clone()
            .oneshot(AgentRequest::new(Session::with_id("cards"), input))
    };
    let stopped_by = |res: &AgentResponse| match &res.outcome {
        Outcome::Stopped {
            reason: StopReason::Guardrail { name, reason },
            ..
        } => (name.clone(), reason.clone()),
        other => panic!("stopped by the guardrail: {other:?}"),
    };

    // A card in the input: refused, nothing of it saved, the model never asked.
    let first = run(format!("Pay with {CARD}, mail {EMAIL}"))
        .await
        .expect("an outcome");
    assert_eq!(stopped_by(&first), ("pii".into(), "contains card".into()));
    assert!(
        first.session.history.is_empty(),
        "{:?}",
        texts(&first.session)
    );
    assert_eq!(model.request_count(), 0);

    // A card in a tool result: withheld, the run stops, the call is answered.
    let second = run("What is in my wallet?".into())
        .await
        .expect("an outcome");
    assert_eq!(stopped_by(&second), ("pii".into(), "contains card".into()));
    assert_valid_history(&second.session.history);
    let result = second
        .session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .next()
        .expect("the call is answered");
    assert!(
        result.is_error && result.content.starts_with("Withheld"),
        "{result:?}"
    );
    assert_eq!(model.request_count(), 1, "the model never read the card");

    // The session goes on, and no version ever saved holds the card or the raw address.
    let third = run("Mail me the receipt.".into())
        .await
        .expect("the next run");
    assert_eq!(third.text().as_deref(), Some("Mail sent."));
    assert_valid_history(&third.session.history);
    for version in store.written() {
        assert!(!version.contains(CARD), "a card was saved: {version}");
        assert!(
            !version.contains(EMAIL),
            "a raw address was saved: {version}"
        );
    }
}
