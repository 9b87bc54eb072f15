//! Compaction (summarization) and context editing (clearing old tool results) never fold or
//! edit a call that waits for a human decision or a tool still running, and one orphan never
//! wedges them (ADK #4740, #5602, #7236): on the model service alone, and in an agent run
//! interrupted for approval, saved, loaded and resumed.

#![cfg(all(feature = "summarize", feature = "clear", feature = "approval"))]

mod common;

use serde_json::json;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentRequest, Decision, Message, ModelResponse, Outcome, Session, ToolCall, ToolResult,
};
use tower_agent_layers::approval::{ApprovalLayer, Gate};
use tower_agent_layers::clear::ClearToolResultsLayer;
use tower_agent_layers::summarize::{Keep, SummarizeLayer, Trigger, is_summary};
use tower_agent_loop::Agent;
use tower_agent_test::{ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;

use common::{call, request, summarizer, talk};

fn read(id: &str) -> ToolCall {
    ToolCall::new(id, "read", json!({ "path": id }))
}

fn long(id: &str) -> String {
    format!("{id}: {}", "contents of a long file\n".repeat(40))
}

/// A long talk, then a batch whose second call waits for a decision: `a` answered, `b` not.
fn waiting_history() -> Vec<Message> {
    let mut history = talk(12);
    let (a, b) = (
        read("a"),
        ToolCall::new("b", "shell", json!({"cmd": "rm -rf /"})),
    );
    history.push(Message::assistant_with_calls("", [a.clone(), b]));
    history.push(Message::tool_result(ToolResult::success(&a, long("a"))));
    history
}

#[tokio::test]
async fn a_summary_never_folds_a_batch_with_a_waiting_call() {
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let layer = SummarizeLayer::new(summarizer("They talked."))
        .trigger(Trigger::messages(4))
        // Keep would cut between the waiting call's message and its answered result.
        .keep(Keep::messages(1));
    let (req, _, _) = request(waiting_history());
    let res = call(layer, &model, req).await.expect("ok");
    let committed = res.history.expect("summarized and committed");
    assert!(is_summary(&committed[0]));
    assert_eq!(committed.len(), 3, "the summary, then the whole batch");
    assert_eq!(committed[1].tool_calls().count(), 2);
    assert_eq!(
        committed.open_calls().len(),
        1,
        "b still waits, nothing made up for it"
    );
    assert_eq!(
        committed[2]
            .tool_results()
            .next()
            .map(|r| r.content.clone()),
        Some(long("a"))
    );
}

#[tokio::test]
async fn an_orphan_or_a_dangling_call_never_wedges_a_summary_or_an_edit() {
    // A crashed process's leftovers in the middle: a call never answered, a result that
    // answers nothing. Both sit in the part that gets summarized and cleared.
    let mut history = talk(4);
    history.push(Message::assistant_with_calls("", [read("lost")]));
    history.push(Message::user("go on"));
    history.push(Message::tool_result(ToolResult::success(
        &read("orphan"),
        "x",
    )));
    for id in ["r1", "r2", "r3"] {
        history.push(Message::assistant_with_calls("", [read(id)]));
        history.push(Message::tool_result(ToolResult::success(
            &read(id),
            long(id),
        )));
    }
    history.extend(talk(6));

    let clear = ClearToolResultsLayer::new().trigger(0).keep(1).batch(1);
    let (req, _, _) = request(history.clone());
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let mut edited = ServiceBuilder::new().layer(clear).service(model.clone());
    edited
        .ready()
        .await
        .expect("ready")
        .call(req)
        .await
        .expect("ok");
    let sent = &model.requests()[0].messages;
    let whole: Vec<&str> = sent
        .iter()
        .flat_map(Message::tool_results)
        .filter(|r| !r.content.starts_with("[cleared"))
        .map(|r| r.call_id.as_str())
        .collect();
    assert_eq!(
        whole,
        ["orphan", "r3"],
        "r1 and r2 cleared past the leftovers"
    );

    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let layer = SummarizeLayer::new(summarizer("Leftovers and reads."))
        .trigger(Trigger::messages(10))
        .keep(Keep::messages(4));
    let (req, _, _) = request(history);
    let res = call(layer, &model, req).await.expect("ok");
    let committed = res.history.expect("summarized past the leftovers");
    assert!(is_summary(&committed[0]));
    assert_eq!(committed.len(), 5);
}

/// `shell` always waits for a human; `read` does not.
fn gated() -> ApprovalLayer {
    ApprovalLayer::builder()
        .gate("shell", Gate::new().description("Runs a shell command"))
        .build()
        .expect("valid")
}

#[tokio::test]
async fn an_interrupted_run_resumes_with_compaction_and_editing_on_every_round() {
    let shell = ToolCall::new("s1", "shell", json!({"cmd": "make"}));
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([read("r1")]),
        ModelResponse::tool_calls([read("r2")]),
        ModelResponse::tool_calls([read("r3"), shell.clone()]),
        ModelResponse::text("built"),
    ]);
    let read_tool = StubTool::from_fn("read", |req: &tower_agent_core::ToolRequest| {
        tower_agent_core::ToolResponse::success(&req.call, long(&req.call.id))
    });
    let shell_tool = StubTool::returning("shell", "made");
    let agent = || {
        let model = ServiceBuilder::new()
            .layer(
                SummarizeLayer::new(summarizer("Earlier: reads."))
                    .trigger(Trigger::messages(6))
                    .keep(Keep::messages(3)),
            )
            .layer(ClearToolResultsLayer::new().trigger(0).keep(1).batch(1))
            .service(model.clone());
        let tools = ServiceBuilder::new().layer(gated()).service(
            ToolSet::new()
                .tool(read_tool.clone())
                .tool(shell_tool.clone()),
        );
        Agent::new(model, tools)
    };

    let paused = agent()
        .oneshot(AgentRequest::new(Session::new(), "build it"))
        .await
        .expect("runs");
    let Outcome::Interrupted { interrupts } = &paused.outcome else {
        panic!("expected an interrupt, got {:?}", paused.outcome);
    };
    assert_eq!(interrupts[0].call.id, "s1");
    // The waiting batch stands whole at the end of the saved session: r3 answered, s1 open.
    assert_eq!(paused.session.history.open_calls().len(), 1);
    let saved = serde_json::to_string(&paused.session).expect("saves");
    let loaded: Session = serde_json::from_str(&saved).expect("loads");

    let done = agent()
        .oneshot(AgentRequest::resume_all(loaded, Decision::Approve))
        .await
        .expect("resumes");
    assert!(
        matches!(done.outcome, Outcome::Completed { .. }),
        "{:?}",
        done.outcome
    );
    assert_eq!(shell_tool.calls().len(), 1, "the approved call ran once");
    assert_valid_history(&done.session.history);
    let results: Vec<(String, String)> = done
        .session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .map(|r| (r.call_id.clone(), r.content.clone()))
        .collect();
    assert!(
        results.contains(&("s1".into(), "made".into())),
        "the waiting call's own result: {results:?}"
    );
    assert!(
        results.iter().all(|(_, c)| !c.starts_with("[cleared")),
        "the session keeps every result whole"
    );
    // The last request: the summary, the batch whole (r3 cleared as older than s1's result).
    let last = model.requests().pop().expect("called after the resume");
    assert!(is_summary(&last.messages[0]), "summarized on the way");
    let sent: Vec<(String, bool)> = last
        .messages
        .iter()
        .flat_map(Message::tool_results)
        .map(|r| (r.call_id.clone(), r.content.starts_with("[cleared")))
        .collect();
    assert_eq!(sent, [("r3".into(), true), ("s1".into(), false)]);
}
