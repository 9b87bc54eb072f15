//! Each logical call's key (`ToolCall::key`): minted by the agent as the model's message comes
//! in, saved with the session, the same for every try of the call (a retry by a tool layer, a
//! resume in another process, a replay of the run under its id, an early start and its
//! adoption) and another for every other call, even with the same arguments.

use std::time::Duration;

use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentRequest, AgentResponse, CallKey, Message, ModelResponse, RunContext, Session, ToolCall,
    ToolRequest, around_tool,
};
use tower_agent_loop::Agent;
use tower_agent_test::{ScriptedModel, StubTool};
use tower_agent_tools::ToolSet;

fn pay(id: &str) -> ModelResponse {
    ModelResponse::tool_calls([ToolCall::new(id, "pay", json!({"amount": 10}))])
}

/// The keys of the calls in `res`'s session, in order.
fn keys_in(res: &AgentResponse) -> Vec<CallKey> {
    res.session
        .history
        .iter()
        .flat_map(Message::tool_calls)
        .map(|call| call.key.expect("every call the model made has a key"))
        .collect()
}

fn keys_seen(tool: &StubTool) -> Vec<CallKey> {
    tool.requests()
        .into_iter()
        .map(|r| r.call.key.expect("the tool is given the key"))
        .collect()
}

#[tokio::test]
async fn each_call_gets_its_own_key_the_tool_reads_and_the_session_keeps() {
    // The same call twice, and a provider that reuses its ids every turn.
    let tool = StubTool::returning("pay", "paid");
    let model = ScriptedModel::new([pay("call_0"), pay("call_0"), ModelResponse::text("Done.")]);
    let agent = Agent::builder().build(model.clone(), ToolSet::new().tool(tool.clone()));
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "pay twice"))
        .await
        .expect("the run ends");
    let keys = keys_in(&res);
    assert_eq!(keys.len(), 2);
    assert!(
        keys.iter().all(|key| key.to_string().len() == 36),
        "{keys:?}"
    );
    assert_ne!(
        keys[0], keys[1],
        "the same arguments, another call: another key"
    );
    assert_eq!(
        keys_seen(&tool),
        keys,
        "the tool reads the key the session keeps"
    );
    // The session keeps the keys through JSON; the model never reads them.
    let saved: Session =
        serde_json::from_str(&serde_json::to_string(&res.session).expect("serializes"))
            .expect("deserializes");
    assert_eq!(saved.history, res.session.history);
    let last = model.requests().pop().expect("three model calls");
    let shown: Vec<Option<CallKey>> = last
        .messages
        .iter()
        .flat_map(Message::tool_calls)
        .map(|c| c.key)
        .collect();
    assert_eq!(shown, [Some(keys[0]), Some(keys[1])]);
}

#[tokio::test]
async fn a_replay_of_the_run_under_its_id_gives_the_same_keys() {
    // What a durable runtime does: the run again, under the same run id, with the journaled
    // answers of the model.
    let run = |run_id: &'static str| async move {
        let tool = StubTool::returning("pay", "paid");
        let model = ScriptedModel::new([pay("c1"), pay("c2"), ModelResponse::text("Done.")]);
        let agent = Agent::builder().build(model, ToolSet::new().tool(tool.clone()));
        let mut req = AgentRequest::new(Session::with_id("s1"), "pay");
        req.ctx = RunContext::new().with_run_id(run_id);
        let res = agent.oneshot(req).await.expect("the run ends");
        (keys_in(&res), keys_seen(&tool))
    };
    let (first, first_seen) = run("inv_1").await;
    let (replay, replay_seen) = run("inv_1").await;
    assert_eq!(first, replay);
    assert_eq!(first_seen, replay_seen);
    let (other, _) = run("inv_2").await;
    assert!(
        other.iter().all(|key| !first.contains(key)),
        "another run's calls are other calls"
    );
}

#[tokio::test]
async fn a_call_tried_again_by_a_tool_layer_keeps_its_key() {
    let tool = StubTool::failing("pay", "the gateway timed out");
    // A layer that tries each call twice.
    let twice = around_tool(|req: ToolRequest, mut next| async move {
        let _ = next.run(req.clone()).await;
        next.run(req).await
    });
    let tools = ServiceBuilder::new()
        .layer(twice)
        .service(ToolSet::new().tool(tool.clone()));
    let model = ScriptedModel::new([pay("c1"), ModelResponse::text("Failed.")]);
    let res = Agent::builder()
        .build(model, tools)
        .oneshot(AgentRequest::new(Session::new(), "pay"))
        .await
        .expect("the run ends");
    let seen = keys_seen(&tool);
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0], seen[1]);
    assert_eq!(keys_in(&res), [seen[0]]);
}

#[tokio::test]
async fn a_paused_call_resumed_in_another_process_keeps_its_key() {
    let tool = StubTool::interrupting("pay", json!("Pay 10?"));
    let model = ScriptedModel::new([pay("c1"), ModelResponse::text("Paid.")]);
    let agent = Agent::builder().build(model.clone(), ToolSet::new().tool(tool.clone()));
    let paused = agent
        .oneshot(AgentRequest::new(Session::new(), "pay"))
        .await
        .expect("the run pauses");
    let key = keys_seen(&tool)[0];
    assert_eq!(paused.session.interrupts[0].call.key, Some(key));
    // Another process: the session from its JSON, another agent, another run id.
    let stored = serde_json::to_string(&paused.session).expect("serializes");
    let session: Session = serde_json::from_str(&stored).expect("deserializes");
    let other = Agent::builder().build(model, ToolSet::new().tool(tool.clone()));
    let done = other
        .oneshot(AgentRequest::resume_all(session, json!("yes")))
        .await
        .expect("the run ends");
    let seen = keys_seen(&tool);
    assert_eq!(seen.len(), 2, "asked, then resumed");
    assert_eq!(seen[1], key, "the resumed call is the same call");
    assert_eq!(keys_in(&done), [key]);
}

#[tokio::test(start_paused = true)]
async fn an_early_start_and_the_call_it_becomes_share_the_key() {
    let tool = StubTool::returning("lookup", "found").read_only();
    let model = ScriptedModel::new([
        ModelResponse::new(Message::assistant_with_calls(
            "Looking two things up.",
            [
                ToolCall::new("c1", "lookup", json!({"q": "x"})),
                ToolCall::new("c2", "lookup", json!({"q": "y"})),
            ],
        )),
        ModelResponse::text("Done."),
    ])
    .streaming(4, Duration::from_millis(50));
    let agent = Agent::builder()
        .early_tool_start(true)
        .build(model, ToolSet::new().tool(tool.clone()));
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "look"))
        .await
        .expect("the run ends");
    let requests = tool.requests();
    assert_eq!(
        requests.len(),
        2,
        "the early runs were adopted, not run again"
    );
    assert!(
        requests.iter().all(|r| r.early.is_some()),
        "both started early"
    );
    let early: Vec<CallKey> = requests.iter().filter_map(|r| r.call.key).collect();
    assert_eq!(keys_in(&res), early);
    assert_ne!(early[0], early[1]);
}

/// A typed tool reads its call's key from its context, and sends it with the effect.
#[tokio::test]
async fn a_typed_tool_reads_the_key_from_its_context() {
    use std::sync::{Arc, Mutex};
    use tower_agent_tools::{NoArgs, ToolContext, tool_fn};

    let sent: Arc<Mutex<Vec<CallKey>>> = Arc::default();
    let ledger = Arc::clone(&sent);
    let pay = tool_fn("pay", "Pay.", move |_: NoArgs, cx: ToolContext| {
        let ledger = Arc::clone(&ledger);
        async move {
            // What an HTTP tool would send as its `Idempotency-Key` header.
            let key = cx.key().expect("a call the model made has a key");
            ledger.lock().expect("the ledger").push(key);
            Ok::<_, tower_agent_core::Error>("paid")
        }
    });
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "pay", json!({}))]),
        ModelResponse::text("Paid."),
    ]);
    let res = Agent::builder()
        .build(model, ToolSet::new().tool(pay))
        .oneshot(AgentRequest::new(Session::new(), "pay"))
        .await
        .expect("the run ends");
    let sent = sent.lock().expect("the ledger").clone();
    assert_eq!(sent, keys_in(&res));
}
