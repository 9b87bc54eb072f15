//! Every effect of a call travels in its response: a run whose model and tool responses are
//! each sent through JSON (as a journal or a recording would) ends with the same session,
//! outcome and usage as the live run.

use serde_json::json;
use tower_agent::ModelNext;
use tower_agent::ToolNext;
use tower_agent::Usage;
use tower_agent::layers::approval::{ApprovalLayer, Gate, ReviewRequest, human_fn};
use tower_agent::layers::limits::{CallLimitsLayer, Limit};
use tower_agent::layers::summarize::{Keep, SummarizeLayer, Trigger, is_summary};
use tower_agent::prelude::*;
use tower_agent_test::{ScriptedModel, StubTool, assert_valid_history};

/// A JSON round trip, as a durable engine's journal would store the response.
fn through_json<T: serde::Serialize + serde::de::DeserializeOwned>(value: T) -> T {
    let text = serde_json::to_string(&value).expect("serializes");
    serde_json::from_str(&text).expect("deserializes")
}

/// A run with every kind of effect: a summary committed by the model stack, a summarizer's
/// tokens, arguments an approver edited, a tool's own tokens, and a stop by a call limit.
async fn run(journaled: bool) -> AgentResponse {
    let summarizer = ScriptedModel::from_fn(|_| {
        Ok(ModelResponse::text("the gist").with_usage(Usage::new(50, 5)))
    });
    let model = ScriptedModel::from_fn(|req| {
        let n = req.ctx.round();
        let call = ToolCall::new(format!("c{n}"), "shell", json!({"cmd": "rm -rf /"}));
        Ok(ModelResponse::tool_calls([call]).with_usage(Usage::new(100, 10)))
    });
    let limits = CallLimitsLayer::new().model_calls(Limit::per_run(3));
    let approval = ApprovalLayer::builder()
        .gate("shell", Gate::new())
        .inline(human_fn(|_review: ReviewRequest, _ctx: RunContext| async {
            Ok(Decision::edit(json!({"cmd": "ls"})))
        }))
        .build()
        .expect("a valid configuration");
    let shell = StubTool::from_fn("shell", |req: &ToolRequest| {
        // A long listing: summarizing it saves much.
        ToolResponse::success(&req.call, "file.txt\n".repeat(200)).with_usage(Usage::new(7, 3))
    });

    let model = ServiceBuilder::new()
        .around_model(move |req: ModelRequest, mut next: ModelNext| async move {
            let res = next.run(req).await?;
            Ok(if journaled { through_json(res) } else { res })
        })
        .layer(limits.clone())
        .layer(
            SummarizeLayer::new(summarizer)
                .trigger(Trigger::messages(4))
                .keep(Keep::messages(2)),
        )
        .service(model);
    let tools = ServiceBuilder::new()
        .around_tool(move |req: ToolRequest, mut next: ToolNext| async move {
            let res = next.run(req).await?;
            Ok(if journaled { through_json(res) } else { res })
        })
        .layer(limits)
        .layer(approval)
        .service(ToolSet::new().tool(shell));
    let request = AgentRequest::new(Session::with_id("s1"), "clean up");
    let request = AgentRequest {
        ctx: request.ctx.with_run_id("r1"),
        ..request
    };
    Agent::new(model, tools)
        .oneshot(request)
        .await
        .expect("the run ends")
}

#[tokio::test]
async fn a_run_through_json_has_the_same_effects() {
    let live = run(false).await;
    let journaled = run(true).await;

    // The live run has every effect the test is about.
    let history = &live.session.history;
    assert!(is_summary(&history[0]), "a summary was committed");
    let arguments: Vec<&str> = history
        .iter()
        .flat_map(|m| m.tool_calls())
        .map(|c| c.arguments.as_str())
        .collect();
    assert!(
        !arguments.is_empty() && arguments.iter().all(|a| *a == r#"{"cmd":"ls"}"#),
        "the edited arguments are in the history: {arguments:?}"
    );
    assert!(
        matches!(
            &live.outcome,
            Outcome::Stopped {
                reason: StopReason::Limit { .. },
                ..
            }
        ),
        "{:?}",
        live.outcome
    );
    // Two model calls, one blocked, two tool calls, summarizer calls.
    assert!(
        live.usage.input_tokens > 2 * 100 + 2 * 7,
        "{:?}",
        live.usage
    );
    assert_valid_history(history);

    // The same with every response through JSON.
    assert_eq!(journaled.session, live.session);
    assert_eq!(journaled.outcome, live.outcome);
    assert_eq!(journaled.usage, live.usage);
    assert_eq!(journaled.rounds, live.rounds);
}
