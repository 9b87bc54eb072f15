//! Tools describe themselves: the agent offers the model what its tool stack reports, every
//! layer passes the specs on, and an explicit list overrides them.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use serde_json::json;
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
use tower_agent_core::{
    AgentRequest, DescribeTools, DescribedTools, Error, ModelResponse, ObserveLayer,
    ServiceBuilderExt, Session, ToolNext, ToolRequest, ToolResponse, ToolSpec,
};
use tower_agent_loop::Agent;
use tower_agent_test::ScriptedModel;

use common::{calculator, call};

fn offered(model: &ScriptedModel) -> Vec<Vec<String>> {
    model
        .requests()
        .iter()
        .map(|r| r.tools.iter().map(|s| s.name.clone()).collect())
        .collect()
}

#[tokio::test]
async fn the_model_is_offered_the_tools_of_the_tool_set() {
    let model = ScriptedModel::new([ModelResponse::text("hi")]);
    let agent = Agent::new(model.clone(), calculator());
    agent
        .oneshot(AgentRequest::new(Session::new(), "add"))
        .await
        .unwrap();
    assert_eq!(offered(&model), [["add"]]);
}

#[tokio::test]
async fn every_layer_passes_the_specs_on_and_an_explicit_list_wins() {
    let tools = ServiceBuilder::new()
        .layer(ObserveLayer::new())
        .after_tool(|res: ToolResponse, _ctx| async move { Ok(res) })
        .before_tool(|req: ToolRequest| async move { Ok(tower_agent_core::Flow::Continue(req)) })
        .around_tool(|req: ToolRequest, mut next: ToolNext| async move { next.run(req).await })
        .service(calculator());
    assert_eq!(tools.tool_specs().len(), 1, "reported through four layers");

    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "add", json!({"a": 1, "b": 2}))]),
        ModelResponse::text("3"),
    ]);
    let agent = Agent::new(model.clone(), tools.clone());
    agent
        .oneshot(AgentRequest::new(Session::new(), "1+2"))
        .await
        .unwrap();
    assert_eq!(offered(&model), [["add"], ["add"]]);

    // An explicit list overrides what the tool stack reports.
    let model = ScriptedModel::new([ModelResponse::text("no tools")]);
    let agent = Agent::builder()
        .tool_specs(Vec::<ToolSpec>::new())
        .build(model.clone(), tools);
    agent
        .oneshot(AgentRequest::new(Session::new(), "1+2"))
        .await
        .unwrap();
    assert_eq!(offered(&model), [Vec::<String>::new()]);
}

#[tokio::test]
async fn a_function_says_what_it_serves_with_described_tools() {
    let echo = ToolSpec::new("echo", "Says it back.", json!({"type": "object"}));
    let tools = DescribedTools::new(
        [echo],
        service_fn(|req: ToolRequest| async move {
            Ok::<_, Error>(ToolResponse::success(&req.call, "echoed"))
        }),
    );
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "echo", json!({}))]),
        ModelResponse::text("done"),
    ]);
    let res = Agent::new(model.clone(), tools)
        .oneshot(AgentRequest::new(Session::new(), "echo"))
        .await
        .unwrap();
    assert_eq!(offered(&model), [["echo"], ["echo"]]);
    assert_eq!(res.text().as_deref(), Some("done"));
}

/// A tool service that serves one more tool after each call (as an MCP server whose list
/// changed would).
#[derive(Clone)]
struct Growing(Arc<AtomicUsize>);

impl DescribeTools for Growing {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        let n = self.0.load(Ordering::SeqCst);
        (0..=n)
            .map(|i| ToolSpec::new(format!("t{i}"), "A tool.", json!({"type": "object"})))
            .collect()
    }
}

impl Service<ToolRequest> for Growing {
    type Response = ToolResponse;
    type Error = Error;
    type Future = std::future::Ready<Result<ToolResponse, Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        self.0.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(ToolResponse::success(&req.call, "ok")))
    }
}

#[tokio::test]
async fn the_specs_are_asked_for_every_round() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "t0", json!({}))]),
        ModelResponse::text("done"),
    ]);
    Agent::new(model.clone(), Growing(Arc::default()))
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    assert_eq!(offered(&model), [vec!["t0"], vec!["t0", "t1"]]);
}
