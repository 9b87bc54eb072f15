//! The patching layer on a real agent: loaded sessions, the frontier, pending interrupts, the
//! incremental check at the model, and the warning.

#![cfg(feature = "patch")]

use std::sync::{Arc, Mutex};

use serde_json::json;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, BoxError, Error, Event, Flow, History, Message,
    ModelRequest, ModelResponse, Session, ToolCall, ToolResult, before_model,
};
use tower_agent_layers::patch::{PatchDanglingLayer, UNANSWERED, Unanswered};
use tower_agent_loop::Agent;
use tower_agent_test::{EventRecorder, ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;
use tower_layer::Layer;

fn call(id: &str, name: &str) -> ToolCall {
    ToolCall::new(id, name, json!({}))
}

fn result(id: &str, name: &str, content: &str) -> Message {
    Message::tool_result(ToolResult::success(&call(id, name), content))
}

/// The agent with the layer at both places of the canonical stack.
fn agent(
    model: ScriptedModel,
    tools: ToolSet,
    layer: PatchDanglingLayer,
) -> impl Service<AgentRequest, Response = AgentResponse, Error = Error> {
    let model = ServiceBuilder::new().layer(layer.clone()).service(model);
    ServiceBuilder::new()
        .layer(layer)
        .service(Agent::new(model, tools))
}

/// A session saved by a crashed process: a dangling call, an orphan result, a reused id.
fn broken_session() -> Session {
    let mut session = Session::with_id("s1");
    session.history = History::from(vec![
        Message::user("list and count"),
        result("c0", "ls", "an orphan: no call before it"),
        Message::assistant_with_calls("", [call("c1", "ls"), call("c2", "wc")]),
        result("c1", "ls", "a.txt"),
        Message::user("and now?"),
        Message::assistant_with_calls("", [call("c1", "ls")]),
        result("c1", "ls", "b.txt"),
        Message::assistant("done"),
    ]);
    session
}

#[tokio::test]
async fn a_broken_session_is_committed_repaired_and_the_run_completes() {
    let model = ScriptedModel::new([ModelResponse::text("all good")]);
    let recorder = EventRecorder::new();
    let req = AgentRequest::new(broken_session(), "go on").with_observer(recorder.clone());
    let res = agent(model.clone(), ToolSet::new(), PatchDanglingLayer::new())
        .oneshot(req)
        .await
        .expect("the run completes");
    assert_eq!(res.text().as_deref(), Some("all good"));

    let history = &res.session.history;
    assert_valid_history(history);
    // The orphan is gone; c2 is answered right after its message, before "and now?".
    assert!(
        history
            .iter()
            .all(|m| m.tool_results().all(|r| r.call_id != "c0"))
    );
    let c2 = history
        .iter()
        .position(|m| m.tool_results().any(|r| r.call_id == "c2"));
    let later = history.iter().position(|m| m.text() == "and now?");
    assert!(c2.is_some() && c2 < later, "{history:?}");
    let synthetic = history
        .iter()
        .flat_map(Message::tool_results)
        .find(|r| r.call_id == "c2")
        .expect("answered");
    assert_eq!(
        (synthetic.content.as_str(), synthetic.is_error),
        (UNANSWERED, true)
    );
    // The reused id was renamed, with its result.
    let ids: Vec<_> = history
        .iter()
        .flat_map(Message::tool_calls)
        .map(|c| c.id.clone())
        .collect();
    assert_eq!(ids, ["c1", "c2", "c1_2"]);
    // The model saw exactly the committed history (plus nothing): the model side had nothing
    // to do.
    let seen = &model.requests()[0].messages;
    assert_eq!(&seen[..], &history[..seen.len()]);

    let warnings: Vec<String> = recorder
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Warning {
                source: "patch_dangling",
                message,
            } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(warnings.len(), 1, "one repair, at the agent: {warnings:?}");
    assert!(
        warnings[0].contains(": 1 call answered, 1 orphan result dropped"),
        "{}",
        warnings[0]
    );
    assert!(!warnings[0].contains(" 0 "), "{}", warnings[0]);
}

#[tokio::test]
async fn the_drop_strategy_removes_unanswered_calls() {
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let layer = PatchDanglingLayer::new().unanswered(Unanswered::Drop);
    let res = agent(model, ToolSet::new(), layer)
        .oneshot(AgentRequest::new(broken_session(), "go on"))
        .await
        .expect("completes");
    let history = &res.session.history;
    assert_valid_history(history);
    assert!(
        history
            .iter()
            .flat_map(Message::tool_calls)
            .all(|c| c.id != "c2")
    );
    assert!(
        history
            .iter()
            .flat_map(Message::tool_results)
            .all(|r| !r.is_error)
    );
}

#[tokio::test]
async fn pending_interrupts_and_the_frontier_are_left_to_the_agent() {
    let ask = StubTool::interrupting("deploy", json!({"question": "prod?"}));
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "ls"), call("c2", "deploy")]),
        ModelResponse::text("deployed"),
    ]);
    let tools = ToolSet::new()
        .tool(StubTool::returning("ls", "a.txt"))
        .tool(ask.clone());
    let res = agent(model.clone(), tools.clone(), PatchDanglingLayer::new())
        .oneshot(AgentRequest::new(Session::new(), "ship it"))
        .await
        .expect("interrupted");
    assert_eq!(res.session.interrupts.len(), 1);

    // Resumed: the call that waited runs for real, not patched.
    let res = agent(model, tools, PatchDanglingLayer::new())
        .oneshot(AgentRequest::resume_all(res.session, json!("yes")))
        .await
        .expect("resumed");
    assert_eq!(res.text().as_deref(), Some("deployed"));
    assert_eq!(ask.requests().len(), 2, "asked, then run on resume");
    let c2 = res
        .session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .find(|r| r.call_id == "c2")
        .expect("answered");
    assert_eq!(c2.content, "resumed with \"yes\"");
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn a_frontier_without_interrupts_is_answered_by_the_agent_not_patched_twice() {
    // A process stopped while c1 ran: the last message is the call, nothing waits.
    let mut session = Session::new();
    session.history = History::from(vec![
        Message::user("go"),
        Message::assistant_with_calls("", [call("c1", "ls")]),
    ]);
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let res = agent(model, ToolSet::new(), PatchDanglingLayer::new())
        .oneshot(AgentRequest::new(session, AgentInput::Continue))
        .await
        .expect("completes");
    let results: Vec<&ToolResult> = res
        .session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .collect();
    assert_eq!(results.len(), 1, "one result, from the agent's own repair");
    assert_eq!(results[0].content, ToolResult::UNANSWERED);
}

/// A layer outside the patching one that breaks the request in the round given.
fn breaking(
    round: u32,
    mut edit: impl FnMut(&mut Vec<Message>) + Clone + Send + 'static,
) -> impl Clone
+ FnMut(ModelRequest) -> std::future::Ready<Result<Flow<ModelRequest, ModelResponse>, Error>> {
    move |mut req: ModelRequest| {
        if req.ctx.round() == round {
            edit(req.messages.make_mut());
        }
        std::future::ready(Ok(Flow::Continue(req)))
    }
}

async fn run_with_outer(
    edit: impl FnMut(&mut Vec<Message>) + Clone + Send + Sync + 'static,
) -> Vec<ModelRequest> {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "ls")]),
        ModelResponse::tool_calls([call("c2", "ls")]),
        ModelResponse::text("done"),
    ]);
    let inner = ServiceBuilder::new()
        .layer(before_model(breaking(2, edit)))
        .layer(PatchDanglingLayer::new())
        .service(model.clone());
    let tools = ToolSet::new().tool(StubTool::returning("ls", "a.txt"));
    let mut session = Session::new();
    session.history = History::from(
        (0..200)
            .map(|i| {
                if i % 2 == 0 {
                    Message::user(format!("q{i}"))
                } else {
                    Message::assistant(format!("a{i}"))
                }
            })
            .collect::<Vec<_>>(),
    );
    Agent::new(inner, tools)
        .oneshot(AgentRequest::new(session, "go"))
        .await
        .expect("completes");
    model.requests()
}

#[tokio::test]
async fn the_model_sees_a_valid_history_when_an_outer_layer_breaks_the_end() {
    let requests = run_with_outer(|messages| {
        messages.push(result("zz", "ls", "an orphan appended by a layer"));
    })
    .await;
    for req in &requests {
        assert_valid_history(&req.messages);
    }
    assert!(
        requests[1]
            .messages
            .iter()
            .flat_map(Message::tool_results)
            .all(|r| r.call_id != "zz")
    );
}

#[tokio::test]
async fn the_model_sees_a_valid_history_when_an_outer_layer_rewrites_the_middle() {
    // Remove the result of round 1 and a message before it: the history no longer starts as
    // the part checked in round 1 did, so it is checked whole.
    let requests = run_with_outer(|messages| {
        let at = messages
            .iter()
            .position(|m| m.tool_results().next().is_some())
            .expect("a result");
        messages.remove(at);
        messages.remove(0);
    })
    .await;
    for req in &requests {
        assert_valid_history(&req.messages);
    }
    let patched = requests[1]
        .messages
        .iter()
        .flat_map(Message::tool_results)
        .find(|r| r.call_id == "c1");
    assert_eq!(patched.map(|r| r.content.as_str()), Some(UNANSWERED));
}

#[tokio::test]
async fn a_valid_request_reaches_the_model_uncopied() {
    let seen: Arc<Mutex<Vec<History>>> = Arc::default();
    let history = History::from(vec![Message::user("hi")]);
    let record = seen.clone();
    let mut model = PatchDanglingLayer::new().layer(tower::service_fn(move |req: ModelRequest| {
        record.lock().expect("lock").push(req.messages);
        async { Ok::<_, BoxError>(ModelResponse::text("ok")) }
    }));
    model
        .ready()
        .await
        .expect("ready")
        .call(ModelRequest::new(history.clone()))
        .await
        .expect("answered");
    assert!(seen.lock().expect("lock")[0].ptr_eq(&history));
}

#[tokio::test]
async fn a_failing_observer_of_the_warning_fails_the_call() {
    let model = ScriptedModel::new([ModelResponse::text("never")]);
    let failing = tower_agent_core::observer_fn(|event: &Event| {
        let warn = matches!(event, Event::Warning { .. });
        async move {
            if warn {
                Err(Error::other("observer down"))
            } else {
                Ok(())
            }
        }
    });
    let err = agent(model.clone(), ToolSet::new(), PatchDanglingLayer::new())
        .oneshot(AgentRequest::new(broken_session(), "go on").with_observer(failing))
        .await
        .expect_err("the observer failed");
    assert_eq!(err.message(), "observer down");
    let session = err.session().expect("the error carries the session");
    assert_valid_history(&session.history);
    assert_eq!(
        session.history.len(),
        broken_session().history.len(),
        "orphan out, c2 answered in"
    );
    assert_eq!(model.request_count(), 0, "the run did not start");
}
