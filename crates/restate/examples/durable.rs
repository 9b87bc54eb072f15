//! A durable agent service on Restate: a scripted model that asks to deploy, an approval gate
//! on `deploy`, the journal innermost on both stacks. Serves the virtual object `Agent` on
//! 127.0.0.1 (port 9080, or the first argument).
//!
//! ```sh
//! cargo run -p tower-agent-restate --example durable
//! ```
//!
//! `crates/restate/docs/durable.md` goes on from here with curl: register it with a Restate server, start a
//! run, approve the deploy, read the result.

use std::time::Duration;

use serde_json::json;
use tower::Layer;
use tower_agent_core::{Error, Message, ModelResponse, ToolCall};
use tower_agent_layers::approval::{ApprovalLayer, Gate};
use tower_agent_loop::Agent;
use tower_agent_restate::restate_sdk::prelude::{Endpoint, HttpServer};
use tower_agent_restate::{DurableAgent, JournalLayer};
use tower_agent_test::ScriptedModel;
use tower_agent_tools::{NoArgs, ToolContext, ToolSet, tool_fn};

#[tokio::main]
async fn main() {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(9080);
    // Stands in for a provider: asks to deploy, then reports what the tool said.
    let model = ScriptedModel::from_fn(|req| {
        let result = req.messages.iter().flat_map(Message::tool_results).last();
        Ok(match result {
            None => ModelResponse::tool_calls([ToolCall::new("deploy_1", "deploy", json!({}))]),
            Some(result) => ModelResponse::text(format!("Deploy: {}", result.content)),
        })
    })
    .without_recording();
    let deploy = tool_fn(
        "deploy",
        "Deploy the release.",
        |_: NoArgs, tc: ToolContext| {
            // The call's key is the idempotency key of the deploy: the same on a replay.
            let key = tc.key().map(|key| key.to_string()).unwrap_or_default();
            async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok::<_, Error>(format!("v2 is live (idempotency key {key})"))
            }
        },
    );
    let approval = ApprovalLayer::builder()
        .gate("deploy", Gate::new())
        .build()
        .expect("a valid gate");
    let tools = approval.layer(JournalLayer.layer(ToolSet::new().tool(deploy)));
    let agent = Agent::new(JournalLayer.layer(model), tools);
    println!("serving the durable agent on 127.0.0.1:{port}");
    HttpServer::new(Endpoint::builder().bind(DurableAgent::new(agent)).build())
        .listen_and_serve(([127, 0, 0, 1], port).into())
        .await;
}
