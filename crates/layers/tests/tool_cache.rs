//! The tool cache in an agent: calls across rounds and in one round, a write between them,
//! and sessions apart or shared. (A resumed call, and one that waits for another, are pinned
//! by the layer's unit tests.)
#![cfg(feature = "cache")]

use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{AgentRequest, Message, ModelResponse, Outcome, Session, ToolCall};
use tower_agent_layers::cache::ToolCacheLayer;
use tower_agent_loop::Agent;
use tower_agent_test::{ScriptedModel, StubTool};
use tower_agent_tools::ToolSet;

fn calls(calls: &[(&str, &str, serde_json::Value)]) -> ModelResponse {
    ModelResponse::tool_calls(
        calls
            .iter()
            .map(|(id, name, args)| ToolCall::new(*id, *name, args.clone())),
    )
}

#[tokio::test]
async fn an_agent_reads_once_until_it_writes() {
    let read = StubTool::returning("read_file", "fn main() {}").read_only();
    let write = StubTool::returning("write_file", "written");
    let model = ScriptedModel::new([
        // Two identical reads in one round, run concurrently.
        calls(&[
            ("c1", "read_file", json!({"path": "main.rs"})),
            ("c2", "read_file", json!({"path": "main.rs"})),
        ]),
        // The same read in the next round: a hit.
        calls(&[("c3", "read_file", json!({ "path": "main.rs" }))]),
        calls(&[("c4", "write_file", json!({"path": "main.rs", "text": "x"}))]),
        // After the write: read again.
        calls(&[("c5", "read_file", json!({"path": "main.rs"}))]),
        ModelResponse::text("Done."),
    ]);
    let tools = ServiceBuilder::new()
        .layer(ToolCacheLayer::new())
        .service(ToolSet::new().tool(read.clone()).tool(write.clone()));
    let agent = Agent::builder().concurrent_tools(4).build(model, tools);

    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "Edit main.rs."))
        .await
        .expect("the run ends");
    assert_eq!(res.text().as_deref(), Some("Done."));
    let ran: Vec<String> = read.calls().into_iter().map(|c| c.id).collect();
    assert_eq!(
        ran,
        ["c1", "c5"],
        "c2 and c3 were answered without the tool"
    );
    assert_eq!(write.calls().len(), 1);
    // Every call has its own result, in the history the session keeps.
    let answered: Vec<(String, String)> = res
        .session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .map(|result| (result.call_id.clone(), result.content.clone()))
        .collect();
    let ids: Vec<&str> = answered.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["c1", "c2", "c3", "c4", "c5"]);
    assert!(answered.iter().all(|(_, content)| !content.is_empty()));
    assert_eq!(answered[1].1, "fn main() {}");
}

#[tokio::test]
async fn sessions_do_not_share_entries_by_default() {
    let read = StubTool::returning("search", "three hits").read_only();
    let script = || {
        ScriptedModel::new([
            calls(&[("c1", "search", json!({"q": "tower"}))]),
            ModelResponse::text("Found."),
        ])
    };
    let cache = ToolCacheLayer::new();
    for shared in [false, true] {
        let cache = if shared {
            cache.clone().shared()
        } else {
            cache.clone()
        };
        let before = read.calls().len();
        for _ in 0..2 {
            let tools = ServiceBuilder::new()
                .layer(cache.clone())
                .service(ToolSet::new().tool(read.clone()));
            let res = Agent::new(script(), tools)
                .oneshot(AgentRequest::new(Session::new(), "Search."))
                .await
                .expect("the run ends");
            assert!(matches!(res.outcome, Outcome::Completed { .. }));
        }
        let expected = if shared { 1 } else { 2 };
        assert_eq!(read.calls().len() - before, expected, "shared: {shared}");
    }
}
