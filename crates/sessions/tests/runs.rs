//! Runs on stored sessions: every step saved, other writers refused, a failed run saved, an
//! approval pause resumed by another process from the session id alone.

use std::sync::{Arc, Mutex};

use serde_json::json;
use tower::{Layer, ServiceExt};
use tower_agent_core::{
    AgentRequest, Error, ErrorKind, Message, ModelResponse, Session, ToolCall, ToolResponse,
};
use tower_agent_loop::Agent;
use tower_agent_sessions::{
    BoxFuture, InMemorySessions, ListQuery, Page, SessionStore, StoreError, StoreLayer, Stored,
    Version,
};
use tower_agent_test::{ScriptedModel, StubTool};
use tower_agent_tools::ToolSet;

/// An in-memory store that records what each save held: messages, interrupts.
#[derive(Clone, Default)]
struct Recording {
    store: InMemorySessions,
    saves: Arc<Mutex<Vec<(usize, usize)>>>,
}

impl Recording {
    fn saves(&self) -> Vec<(usize, usize)> {
        self.saves.lock().expect("not poisoned").clone()
    }
}

impl SessionStore for Recording {
    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        self.store.load(id)
    }
    fn save<'a>(
        &'a self,
        session: &'a Session,
        expected: Option<Version>,
    ) -> BoxFuture<'a, Result<Version, StoreError>> {
        let held = (session.history.len(), session.interrupts.len());
        self.saves.lock().expect("not poisoned").push(held);
        self.store.save(session, expected)
    }
    fn list<'a>(&'a self, query: &'a ListQuery) -> BoxFuture<'a, Result<Page, StoreError>> {
        self.store.list(query)
    }
    fn delete<'a>(&'a self, id: &'a str, v: Version) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.store.delete(id, v)
    }
}

fn call(id: &str, name: &str) -> ToolCall {
    ToolCall::new(id, name, json!({}))
}

#[tokio::test]
async fn every_step_is_saved_and_the_next_run_goes_on_from_the_store() {
    let store = Recording::default();
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "clock")]),
        ModelResponse::text("It is noon."),
        ModelResponse::text("Still noon."),
    ]);
    let tools = ToolSet::new().tool(StubTool::returning("clock", "12:00"));
    let agent = StoreLayer::new(store.clone()).layer(Agent::new(model, tools));

    let res = agent
        .clone()
        .oneshot(AgentRequest::new(Session::with_id("s"), "time?"))
        .await
        .expect("runs");
    assert_eq!(res.text().as_deref(), Some("It is noon."));
    // The input; the model's call before it runs; its result; the end of the run.
    assert_eq!(store.saves(), [(1, 0), (2, 0), (3, 0), (4, 0)]);
    let stored = store.load("s").await.expect("loads").expect("stored");
    assert_eq!((stored.session, stored.version), (res.session, Version(4)));

    let again = agent
        .oneshot(AgentRequest::new(Session::with_id("s"), "and now?"))
        .await
        .expect("runs");
    assert_eq!(again.session.history.len(), 6, "it went on from the store");
    assert_eq!(
        store
            .load("s")
            .await
            .expect("loads")
            .expect("stored")
            .version,
        Version(6)
    );
}

#[tokio::test]
async fn a_workflow_is_saved_at_each_step_of_its_agents() {
    use tower_agent_workflow::Sequential;
    let store = Recording::default();
    let model = ScriptedModel::new([ModelResponse::text("one"), ModelResponse::text("two")]);
    let step = Agent::new(model, ToolSet::new());
    let workflow = Sequential::new("pipeline").step("answer", step);
    let agent = StoreLayer::new(store.clone()).layer(workflow);
    agent
        .clone()
        .oneshot(AgentRequest::new(Session::with_id("w"), "first"))
        .await
        .expect("runs");
    // The step saves into the workflow's session as it goes (the input, the answer, each with
    // the workflow standing at that step), and the workflow's end is saved (its position
    // cleared).
    assert_eq!(store.saves(), [(1, 0), (2, 0), (2, 0)]);
    let res = agent
        .oneshot(AgentRequest::new(Session::with_id("w"), "second"))
        .await
        .expect("runs");
    assert_eq!(
        res.session.history.len(),
        4,
        "the second run went on from the first"
    );
    let stored = store.load("w").await.expect("loads").expect("stored");
    assert_eq!(stored.session, res.session);
}

#[tokio::test]
async fn a_session_changed_after_the_loop_saved_it_is_saved_again() {
    use tower_agent_core::after_agent;
    let store = Recording::default();
    let model = ScriptedModel::new([ModelResponse::text("hello")]);
    let agent = Agent::new(model, ToolSet::new());
    // An after_agent layer between the store and the loop writes to the state.
    let tagged = after_agent(
        |mut res: tower_agent_core::AgentResponse, _: tower_agent_core::RunContext| async move {
            res.session.state.insert("tagged".into(), json!(true));
            Ok(res)
        },
    )
    .layer(agent);
    let res = StoreLayer::new(store.clone())
        .layer(tagged)
        .oneshot(AgentRequest::new(Session::with_id("t"), "hi"))
        .await
        .expect("runs");
    assert_eq!(store.saves(), [(1, 0), (2, 0), (2, 0)]);
    let stored = store.load("t").await.expect("loads").expect("stored");
    assert_eq!(stored.session, res.session);
    assert_eq!(stored.session.state.get("tagged"), Some(&json!(true)));
}

#[tokio::test]
async fn another_writer_stops_the_run_and_nothing_is_overwritten() {
    let store = InMemorySessions::new();
    let writer = store.clone();
    // While the tool runs, another writer saves the session.
    let meddle = StubTool::from_fn("meddle", move |req| {
        let writer = writer.clone();
        let handle = tokio::runtime::Handle::current();
        std::thread::spawn(move || {
            handle.block_on(async {
                let mut other = writer.load("s").await.expect("loads").expect("stored");
                other
                    .session
                    .history
                    .push(Message::user("the other writer"));
                writer
                    .save(&other.session, Some(other.version))
                    .await
                    .expect("saved");
            })
        })
        .join()
        .expect("no panic");
        ToolResponse::success(&req.call, "meddled")
    });
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "meddle")]),
        ModelResponse::text("unreachable"),
    ]);
    let agent = StoreLayer::new(store.clone())
        .layer(Agent::new(model.clone(), ToolSet::new().tool(meddle)));
    let failed = agent
        .oneshot(AgentRequest::new(Session::with_id("s"), "go"))
        .await;
    let mut error = failed.expect_err("the run stops");
    // A conflict, not an outage: the host loads the session again, it pages nobody.
    assert_eq!(error.kind(), ErrorKind::Conflict);
    assert!(!error.is_transient(), "the same save would conflict again");
    let source = std::error::Error::source(&error).expect("a source");
    assert!(
        matches!(source.downcast_ref(), Some(StoreError::Conflict { .. })),
        "{source}"
    );
    assert_eq!(
        model.request_count(),
        1,
        "no model call after the refused save"
    );
    let stored = store.load("s").await.expect("loads").expect("stored");
    assert_eq!(
        stored.session.history.last().map(Message::text).as_deref(),
        Some("the other writer")
    );
    // The error still carries the run's session, with the tool's result.
    let session = error.take_session().expect("the session");
    assert_eq!(session.history.len(), 3);
}

#[tokio::test]
async fn a_session_of_its_own_is_not_run_over_a_stored_one() {
    let store = InMemorySessions::new();
    let mut stored = Session::with_id("s");
    stored.history.push(Message::user("stored"));
    store.save(&stored, None).await.expect("saved");
    let model = ScriptedModel::new([ModelResponse::text("unreachable")]);
    let agent = StoreLayer::new(store.clone()).layer(Agent::new(model.clone(), ToolSet::new()));
    let mut own = Session::with_id("s");
    own.history.push(Message::user("mine"));
    let refused = agent.oneshot(AgentRequest::new(own, "go")).await;
    let error: Error = refused.expect_err("refused");
    assert_eq!(error.kind(), ErrorKind::BadRequest);
    assert!(
        error.message().contains("is stored (at v1): run it by id"),
        "{error}"
    );
    let source = std::error::Error::source(&error).expect("a source");
    assert!(matches!(
        source.downcast_ref(),
        Some(StoreError::Conflict { .. })
    ));
    assert_eq!(model.request_count(), 0);
    let kept = store.load("s").await.expect("loads").expect("stored");
    assert_eq!(kept.session, stored);
}

#[tokio::test]
async fn a_failed_run_is_saved_with_every_call_answered() {
    let store = InMemorySessions::new();
    let model = ScriptedModel::with_results([
        Ok(ModelResponse::tool_calls([call("c1", "clock")])),
        Err(Error::new(ErrorKind::Server, "the provider broke")),
    ]);
    let tools = ToolSet::new().tool(StubTool::returning("clock", "12:00"));
    let agent = StoreLayer::new(store.clone()).layer(Agent::new(model, tools));
    let failed = agent
        .oneshot(AgentRequest::new(Session::with_id("s"), "time?"))
        .await;
    assert_eq!(failed.expect_err("fails").kind(), ErrorKind::Server);
    let stored = store.load("s").await.expect("loads").expect("stored");
    assert_eq!(stored.session.history.len(), 3);
    stored.session.history.validate().expect("a valid history");
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn an_approval_pause_is_resumed_by_another_process_from_the_id_alone() {
    use tower_agent_core::{AgentInput, Decision, Decisions, Outcome};
    use tower_agent_layers::approval::{ApprovalLayer, Gate};
    use tower_agent_sessions::SqliteSessions;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("sessions.db");
    let agent = |store: SqliteSessions, model: ScriptedModel, deploy: StubTool| {
        let approval = ApprovalLayer::builder()
            .gate("deploy", Gate::new())
            .build()
            .expect("a valid gate");
        let tools = approval.layer(ToolSet::new().tool(deploy));
        StoreLayer::new(store).layer(Agent::new(model, tools))
    };
    // The first process: the run waits for a decision, saved in the store.
    let deploy = StubTool::returning("deploy", "deployed v2");
    let first = agent(
        SqliteSessions::open(&path).await.expect("opens"),
        ScriptedModel::new([ModelResponse::tool_calls([call("c1", "deploy")])]),
        deploy.clone(),
    );
    let paused = first
        .oneshot(AgentRequest::new(Session::with_id("ops/7"), "ship it"))
        .await
        .expect("runs");
    assert!(matches!(paused.outcome, Outcome::Interrupted { .. }));
    assert!(deploy.calls().is_empty());

    // Another process: it reads what waits from the store, and resumes by id.
    let store = SqliteSessions::open(&path).await.expect("opens");
    let waiting = store.load("ops/7").await.expect("loads").expect("stored");
    assert_eq!(waiting.session.interrupts.len(), 1);
    let call_id = waiting.session.interrupts[0].call.id.clone();
    // The approved call finds itself saved as in flight (no longer waiting, no result yet): a
    // crash now would answer it as not completed on resume, not run it again.
    let seen = Arc::new(Mutex::new(None));
    let (observer, record) = (store.clone(), Arc::clone(&seen));
    let deploy = StubTool::from_fn("deploy", move |req| {
        let (store, handle) = (observer.clone(), tokio::runtime::Handle::current());
        let stored = std::thread::spawn(move || handle.block_on(store.load("ops/7")))
            .join()
            .expect("no panic")
            .expect("loads")
            .expect("stored");
        let last_calls: Vec<String> = stored
            .session
            .history
            .last()
            .map_or(vec![], |m| m.tool_calls().map(|c| c.id.clone()).collect());
        *record.lock().expect("not poisoned") = Some((stored.session.interrupts.len(), last_calls));
        ToolResponse::success(&req.call, "deployed v2")
    });
    let second = agent(
        store.clone(),
        ScriptedModel::new([ModelResponse::text("Shipped.")]),
        deploy.clone(),
    );
    let decisions = Decisions::new().with(call_id.clone(), json!(Decision::Approve));
    let request = AgentRequest::new(Session::with_id("ops/7"), AgentInput::Resume(decisions));
    let done = second.oneshot(request).await.expect("resumes");
    assert_eq!(done.text().as_deref(), Some("Shipped."));
    assert_eq!(deploy.calls().len(), 1, "the approved call ran once");
    let seen = seen.lock().expect("not poisoned").clone();
    assert_eq!(seen, Some((0, vec![call_id.clone()])));
    let stored = store.load("ops/7").await.expect("loads").expect("stored");
    assert!(stored.session.interrupts.is_empty());
    assert_eq!(stored.session, done.session);
}

/// A store whose every operation fails as an outage.
struct Down;

impl Down {
    fn error() -> StoreError {
        StoreError::Backend("the disk is gone".into())
    }
}

impl SessionStore for Down {
    fn load<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        Box::pin(async { Err(Down::error()) })
    }
    fn save<'a>(
        &'a self,
        _: &'a Session,
        _: Option<Version>,
    ) -> BoxFuture<'a, Result<Version, StoreError>> {
        Box::pin(async { Err(Down::error()) })
    }
    fn list<'a>(&'a self, _: &'a ListQuery) -> BoxFuture<'a, Result<Page, StoreError>> {
        Box::pin(async { Err(Down::error()) })
    }
    fn delete<'a>(&'a self, _: &'a str, _: Version) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async { Err(Down::error()) })
    }
}

#[tokio::test]
async fn an_invalid_session_id_is_a_bad_request_and_the_model_is_never_called() {
    let store = Recording::default();
    let model = ScriptedModel::new([ModelResponse::text("unreachable")]);
    let agent = StoreLayer::new(store.clone()).layer(Agent::new(model.clone(), ToolSet::new()));
    for id in ["", "a\u{7}b", "line\nbreak"] {
        let failed = agent
            .clone()
            .oneshot(AgentRequest::new(Session::with_id(id), "hi"))
            .await;
        let error = failed.expect_err("refused");
        assert_eq!(error.kind(), ErrorKind::BadRequest, "{id:?}: {error}");
        let source = std::error::Error::source(&error).expect("a source");
        assert!(
            matches!(source.downcast_ref(), Some(StoreError::InvalidId { .. })),
            "{source}"
        );
    }
    assert_eq!(model.request_count(), 0);
    assert!(store.saves().is_empty(), "nothing saved");
}

#[tokio::test]
async fn a_store_that_is_down_fails_the_run_as_a_backend_failure() {
    let model = ScriptedModel::new([ModelResponse::text("unreachable")]);
    let agent = StoreLayer::new(Down).layer(Agent::new(model.clone(), ToolSet::new()));
    let error = agent
        .oneshot(AgentRequest::new(Session::with_id("s"), "hi"))
        .await
        .expect_err("fails");
    assert_eq!(error.kind(), ErrorKind::Backend, "{error}");
    let source = std::error::Error::source(&error).expect("a source");
    assert!(
        matches!(source.downcast_ref(), Some(StoreError::Backend(_))),
        "{source}"
    );
    assert_eq!(model.request_count(), 0);
}

#[test]
fn each_store_error_is_a_kind_a_host_can_act_on() {
    let conflict = StoreError::Conflict {
        id: "s".into(),
        expected: Some(Version(1)),
        found: Some(Version(2)),
    };
    let invalid = tower_agent_sessions::check_id("").expect_err("invalid");
    let corrupt = StoreError::Corrupt {
        id: "s".into(),
        source: "message 1: not JSON".into(),
    };
    let schema = StoreError::Schema {
        found: 9,
        supported: 1,
    };
    for (error, kind) in [
        (conflict, ErrorKind::Conflict),
        (invalid, ErrorKind::BadRequest),
        (corrupt, ErrorKind::Backend),
        (schema, ErrorKind::Backend),
        (Down::error(), ErrorKind::Backend),
    ] {
        let shown = error.to_string();
        let error = Error::from(error);
        assert_eq!(error.kind(), kind, "{shown}");
        assert_eq!(error.message(), shown);
        let source = std::error::Error::source(&error).expect("a source");
        assert!(source.downcast_ref::<StoreError>().is_some(), "{source}");
    }
}

#[tokio::test]
async fn continuing_a_session_that_was_never_stored_is_a_bad_request() {
    use tower_agent_core::{AgentInput, Decisions};
    let store = Recording::default();
    let model = ScriptedModel::new([ModelResponse::text("from nothing")]);
    let agent = StoreLayer::new(store.clone()).layer(Agent::new(model.clone(), ToolSet::new()));
    for input in [AgentInput::Continue, AgentInput::Resume(Decisions::new())] {
        let failed = agent
            .clone()
            .oneshot(AgentRequest::new(Session::with_id("never"), input))
            .await;
        let error = failed.expect_err("refused");
        assert_eq!(error.kind(), ErrorKind::BadRequest, "{error}");
        assert!(
            error
                .message()
                .contains("session `never` is not stored: nothing to continue"),
            "{error}"
        );
    }
    assert_eq!(model.request_count(), 0, "the model is never called");
    assert!(store.saves().is_empty(), "nothing saved");
    assert!(store.load("never").await.expect("loads").is_none());

    // A session of its own is continued as it is, and stored.
    let mut own = Session::with_id("own");
    own.history.push(Message::user("hi"));
    let res = agent
        .oneshot(AgentRequest::new(own, AgentInput::Continue))
        .await
        .expect("runs");
    assert_eq!(res.text().as_deref(), Some("from nothing"));
    let stored = store.load("own").await.expect("loads").expect("stored");
    assert_eq!(stored.session, res.session);
}

#[tokio::test]
async fn a_run_that_changes_nothing_writes_nothing() {
    use tower_agent_core::{AgentInput, Decision, Decisions};
    let store = Recording::default();
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "deploy", json!({}))]),
        ModelResponse::text("deployed"),
    ]);
    let tools = ToolSet::new().tool(StubTool::interrupting("deploy", json!({"ok?": true})));
    let agent = StoreLayer::new(store.clone()).layer(Agent::new(model, tools));
    let paused = agent
        .clone()
        .oneshot(AgentRequest::new(Session::with_id("r"), "deploy"))
        .await
        .expect("runs");
    let decisions = Decisions::all(&paused.session.interrupts, Decision::Approve);
    agent
        .clone()
        .oneshot(AgentRequest::new(
            Session::with_id("r"),
            AgentInput::Resume(decisions.clone()),
        ))
        .await
        .expect("resumes");
    let written = store.saves().len();
    // The same decisions again: a replay, nothing to do, nothing written.
    agent
        .oneshot(AgentRequest::new(
            Session::with_id("r"),
            AgentInput::Resume(decisions),
        ))
        .await
        .expect("replays");
    assert_eq!(
        store.saves().len(),
        written,
        "no version written for a replay"
    );
}
