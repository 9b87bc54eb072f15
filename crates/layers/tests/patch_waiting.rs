//! Calls waiting for a human decision through the patching layer on the agent: never dropped
//! nor answered, whatever the policy, at the end of the history or followed by messages a
//! host added; a resume then runs them, and new input answers them as not decided.

#![cfg(feature = "patch")]

use std::sync::{Arc, Mutex};

use serde_json::json;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentRequest, AgentResponse, Error, Message, ModelResponse, Outcome, Session, ToolCall,
    ToolResult,
};
use tower_agent_layers::patch::{PatchDanglingLayer, Unanswered};
use tower_agent_loop::Agent;
use tower_agent_test::{ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;
use tower_layer::Layer;

/// Where the waiting call stands when the next run starts.
#[derive(Debug, Clone, Copy)]
enum Place {
    /// As the interrupted run left it: the last message but its results.
    AtEnd,
    /// A host appended a user message to the history after it.
    Followed,
}

const PLACES: [Place; 2] = [Place::AtEnd, Place::Followed];
const POLICIES: [Unanswered; 2] = [Unanswered::Answer, Unanswered::Drop];
const LATER: &str = "are you there?";

fn call(id: &str, name: &str) -> ToolCall {
    ToolCall::new(id, name, json!({}))
}

fn tools(deploy: &StubTool) -> ToolSet {
    ToolSet::new()
        .tool(StubTool::returning("ls", "a.txt"))
        .tool(deploy.clone())
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

/// A session whose run was interrupted for a decision about `c2` (deploy), `c1` (ls) answered,
/// with the waiting call at `place`; and the model, scripted to answer `after` once resumed.
async fn waiting(place: Place, layer: PatchDanglingLayer, after: &str) -> (Session, ScriptedModel) {
    let deploy = StubTool::interrupting("deploy", json!({"question": "prod?"}));
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "ls"), call("c2", "deploy")]),
        ModelResponse::text(after),
    ]);
    let res = agent(model.clone(), tools(&deploy), layer)
        .oneshot(AgentRequest::new(Session::new(), "ship it"))
        .await
        .expect("interrupted");
    let mut session = res.session;
    assert_eq!(session.interrupts.len(), 1, "{:?}", res.outcome);
    assert_eq!(session.interrupts[0].call.id, "c2");
    if let Place::Followed = place {
        session.history.push(Message::user(LATER));
    }
    (session, model)
}

/// The session the agent-side layer hands the loop.
async fn patched(session: Session, layer: PatchDanglingLayer) -> Session {
    let seen: Arc<Mutex<Option<Session>>> = Arc::default();
    let record = seen.clone();
    let inner = tower::service_fn(move |req: AgentRequest| {
        *record.lock().expect("lock") = Some(req.session.clone());
        let message = Message::assistant("");
        async move {
            Ok::<_, Error>(AgentResponse::new(
                req.session,
                Outcome::Completed { message },
            ))
        }
    });
    layer
        .layer(inner)
        .oneshot(AgentRequest::resume_all(session, json!("yes")))
        .await
        .expect("passed on");
    let seen = seen.lock().expect("lock").take();
    seen.expect("the loop was called")
}

fn results_of<'a>(session: &'a Session, id: &str) -> Vec<&'a ToolResult> {
    session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .filter(|r| r.call_id == id)
        .collect()
}

#[tokio::test]
async fn a_waiting_call_and_its_interrupt_survive_the_patch_wherever_it_stands() {
    for unanswered in POLICIES {
        for place in PLACES {
            let layer = PatchDanglingLayer::new().unanswered(unanswered);
            let (session, _) = waiting(place, layer.clone(), "deployed").await;
            let repaired = patched(session.clone(), layer).await;
            let case = format!("{unanswered:?}, {place:?}:\n{:#?}", repaired.history);
            assert_eq!(repaired.interrupts, session.interrupts, "{case}");
            assert!(results_of(&repaired, "c2").is_empty(), "{case}");
            let open: Vec<&str> = repaired
                .history
                .open_calls()
                .iter()
                .map(|c| c.id.as_str())
                .collect();
            assert_eq!(open, ["c2"], "the call waits at the end: {case}");
            assert_eq!(results_of(&repaired, "c1").len(), 1, "{case}");
            // Nothing else is lost: every message is still there.
            assert_eq!(repaired.history.len(), session.history.len(), "{case}");
            if let Place::Followed = place {
                let later = repaired.history.iter().position(|m| m.text() == LATER);
                let calls = repaired.history.iter().position(Message::has_tool_calls);
                assert!(later < calls, "written while the call waited: {case}");
            }
        }
    }
}

#[tokio::test]
async fn a_resume_runs_a_waiting_call_the_patch_left_alone() {
    for unanswered in POLICIES {
        for place in PLACES {
            let layer = PatchDanglingLayer::new().unanswered(unanswered);
            let (session, model) = waiting(place, layer.clone(), "deployed").await;
            let deploy = StubTool::interrupting("deploy", json!({"question": "prod?"}));
            let res = agent(model.clone(), tools(&deploy), layer)
                .oneshot(AgentRequest::resume_all(session, json!("yes")))
                .await
                .unwrap_or_else(|e| panic!("{unanswered:?}, {place:?}: {e}"));
            let case = format!("{unanswered:?}, {place:?}:\n{:#?}", res.session.history);
            assert_eq!(res.text().as_deref(), Some("deployed"), "{case}");
            assert_eq!(deploy.requests().len(), 1, "run on resume: {case}");
            let c2: Vec<&str> = results_of(&res.session, "c2")
                .iter()
                .map(|r| r.content.as_str())
                .collect();
            assert_eq!(c2, ["resumed with \"yes\""], "{case}");
            assert!(res.session.interrupts.is_empty(), "{case}");
            assert_valid_history(&res.session.history);
            // The model saw the message written while the call waited.
            let last = model.requests().pop().expect("called after the resume");
            let saw = last.messages.iter().any(|m| m.text() == LATER);
            assert_eq!(saw, matches!(place, Place::Followed), "{case}");
        }
    }
}

#[tokio::test]
async fn new_input_answers_a_waiting_call_the_patch_left_alone_as_not_decided() {
    for unanswered in POLICIES {
        for place in PLACES {
            let layer = PatchDanglingLayer::new().unanswered(unanswered);
            let (session, _) = waiting(place, layer.clone(), "unused").await;
            let model = ScriptedModel::new([ModelResponse::text("ok")]);
            let deploy = StubTool::interrupting("deploy", json!({"question": "prod?"}));
            let res = agent(model, tools(&deploy), layer)
                .oneshot(AgentRequest::new(session, "never mind"))
                .await
                .unwrap_or_else(|e| panic!("{unanswered:?}, {place:?}: {e}"));
            let case = format!("{unanswered:?}, {place:?}:\n{:#?}", res.session.history);
            assert_eq!(res.text().as_deref(), Some("ok"), "{case}");
            assert!(deploy.requests().is_empty(), "{case}");
            let c2: Vec<&str> = results_of(&res.session, "c2")
                .iter()
                .map(|r| r.content.as_str())
                .collect();
            assert_eq!(c2, [ToolResult::NOT_DECIDED], "{case}");
            assert_valid_history(&res.session.history);
        }
    }
}
