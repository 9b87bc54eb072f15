//! Early tool starts and the layers that count calls: a call started while the model streamed
//! and then discarded (the stream restarted) counts against no limit and no checkpoint; a call
//! started early and kept counts once.

#![cfg(all(feature = "limits", feature = "checkpoint"))]

use std::time::Duration;

use serde_json::json;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentRequest, AgentResponse, Error, Message, ModelRequest, ModelResponse, Outcome, Session,
    ToolCall, around_model,
};
use tower_agent_layers::checkpoint::CheckpointLayer;
use tower_agent_layers::limits::{CallLimitsLayer, Exit, Limit};
use tower_agent_loop::AgentBuilder;
use tower_agent_test::{ScriptedModel, StubTool};
use tower_agent_tools::ToolSet;

/// A read-only lookup: `found {q}`.
fn docs() -> ToolSet {
    let tool = StubTool::from_fn("docs", |req| {
        let args: serde_json::Value = serde_json::from_str(&req.call.arguments).unwrap_or_default();
        let q = args["q"].as_str().unwrap_or_default();
        tower_agent_core::ToolResponse::success(&req.call, format!("found {q}"))
    });
    ToolSet::new().tool(tool.read_only())
}

/// A model whose first stream closes a call to `docs` and is then thrown away (as a retry
/// does), the second asking for another call, then a final answer.
fn restarting()
-> impl tower::Service<ModelRequest, Response = ModelResponse, Error = Error, Future = impl Send>
+ Clone
+ Send
+ 'static {
    let again = around_model(|req: ModelRequest, mut next| async move {
        let first = next.run(req.clone()).await?;
        if first.message.tool_calls().any(|c| c.id == "c1") {
            // A retry's pause: the early run of `c1` has started (and ended) meanwhile.
            tokio::time::sleep(Duration::from_millis(100)).await;
            req.restart_stream().await?;
            return next.run(req).await;
        }
        Ok(first)
    });
    let scripted = ScriptedModel::new([
        ModelResponse::new(Message::assistant_with_calls(
            "Looking.",
            [ToolCall::new("c1", "docs", json!({"q": "first"}))],
        )),
        ModelResponse::tool_calls([ToolCall::new("c2", "docs", json!({"q": "second"}))]),
        ModelResponse::text("Done."),
    ])
    .streaming(4, Duration::from_millis(50));
    ServiceBuilder::new().layer(again).service(scripted)
}

fn results(res: &AgentResponse) -> Vec<(String, String)> {
    res.session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .map(|r| (r.call_id.clone(), r.content.clone()))
        .collect()
}

async fn run_with<L>(layer: L) -> Result<AgentResponse, Error>
where
    L: Layer<ToolSet> + Clone,
    L::Service: tower::Service<
            tower_agent_core::ToolRequest,
            Response = tower_agent_core::ToolResponse,
            Error = Error,
        > + tower_agent_core::DescribeTools
        + Clone
        + Send
        + 'static,
    <L::Service as tower::Service<tower_agent_core::ToolRequest>>::Future: Send,
{
    let agent = AgentBuilder::new()
        .early_tool_start(true)
        .build(restarting(), layer.layer(docs()));
    agent
        .oneshot(AgentRequest::new(Session::new(), "Find it."))
        .await
}

#[tokio::test(start_paused = true)]
async fn a_discarded_early_call_uses_up_no_call_limit() {
    for exit in [Exit::Continue, Exit::End, Exit::Error] {
        let limits = CallLimitsLayer::new().tool_calls(Limit::per_run(1).exit(exit));
        // On both stacks: the model side checks the calls of a message against a limit that
        // fails the run.
        let agent = AgentBuilder::new()
            .early_tool_start(true)
            .build(limits.layer(restarting()), limits.layer(docs()));
        let res = agent
            .oneshot(AgentRequest::new(Session::new(), "Find it."))
            .await
            .expect("the run");
        assert_eq!(
            results(&res),
            [("c2".to_owned(), "found second".to_owned())],
            "{exit:?}: the only call the model made ran"
        );
        assert_eq!(res.text().as_deref(), Some("Done."), "{exit:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_discarded_early_call_uses_up_no_checkpoint_budget() {
    let checkpoint = CheckpointLayer::interrupting().every(1);
    let res = run_with(checkpoint).await.expect("the run");
    assert!(
        matches!(res.outcome, Outcome::Completed { .. }),
        "the one call the model made fits a budget of one: {:?}",
        res.outcome
    );
    assert_eq!(
        results(&res),
        [("c2".to_owned(), "found second".to_owned())]
    );
}

#[tokio::test(start_paused = true)]
async fn early_calls_kept_count_once_against_a_limit_that_fails_the_run() {
    // Two calls, both started early and kept: a limit of two allows them.
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([
            ToolCall::new("c1", "docs", json!({"q": "a"})),
            ToolCall::new("c2", "docs", json!({"q": "b"})),
        ]),
        ModelResponse::text("Done."),
    ])
    .streaming(4, Duration::from_millis(50));
    let limits = CallLimitsLayer::new().tool_calls(Limit::per_run(2).exit(Exit::Error));
    let agent = AgentBuilder::new()
        .early_tool_start(true)
        .build(limits.layer(model), limits.layer(docs()));
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "Find both."))
        .await
        .expect("two calls fit a limit of two");
    assert_eq!(results(&res).len(), 2);
    assert_eq!(res.text().as_deref(), Some("Done."));
}

/// A call that started early ran, and counted as it started: when an earlier call of its
/// message stops the run (a limit reached), it keeps its result, never "not executed".
#[tokio::test]
async fn a_call_started_early_keeps_its_result_when_an_earlier_call_stops_the_run() {
    let write = StubTool::returning("write", "written");
    let tools = docs().tool(write.clone());
    let limits = CallLimitsLayer::new().tool_calls(Limit::per_run(1));
    let scripted = ScriptedModel::new([ModelResponse::tool_calls([
        ToolCall::new("c1", "write", json!({})),
        ToolCall::new("c2", "docs", json!({"q": "early"})),
    ])])
    .streaming(4, Duration::from_millis(20));
    // The message comes a while after its stream closed the calls: the early run of `c2`
    // has taken the limit's one call by then.
    let late = around_model(|req: ModelRequest, mut next| async move {
        let res = next.run(req).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(res)
    });
    let model = ServiceBuilder::new().layer(late).service(scripted);
    let agent = AgentBuilder::new()
        .early_tool_start(true)
        .sequential_tools()
        .tool_specs(tools.specs())
        .build(model, ServiceBuilder::new().layer(limits).service(tools));
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .expect("the run");
    assert!(
        matches!(res.outcome, Outcome::Stopped { .. }),
        "{:?}",
        res.outcome
    );
    let results = results(&res);
    assert!(
        results[0].1.starts_with("not executed: the limit"),
        "the write came second to the limit: {results:?}"
    );
    assert_eq!(results[1], ("c2".into(), "found early".into()));
    assert!(write.calls().is_empty());
}
