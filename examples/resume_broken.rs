//! Resume a broken session: a process crashed while a tool ran, and a host's storage kept a
//! result without its call. The session is loaded from JSON, the patching layer repairs it
//! (committed to the session at the agent, checked again at the model), and the run completes.
//!
//! Offline: the model is scripted.
//!
//! ```sh
//! cargo run --example resume_broken
//! ```

use serde_json::json;
use tower_agent::layers::PatchDanglingLayer;
use tower_agent::prelude::*;
use tower_agent_test::{ScriptedModel, StubTool, dump};

/// What the crashed process left: `c2` never got its result, and an orphan result (for a
/// call `c9` that is nowhere) sits before the calls.
const SAVED: &str = r#"{
  "id": "session-42",
  "history": [
    {"role": "user", "content": [{"type": "text", "text": "How big is the repo?"}]},
    {"role": "tool", "content": [{"type": "tool_result", "call_id": "c9", "name": "ls", "content": "stale"}]},
    {"role": "assistant", "content": [
      {"type": "tool_call", "id": "c1", "name": "ls", "arguments": "{}"},
      {"type": "tool_call", "id": "c2", "name": "wc", "arguments": "{\"path\": \"src\"}"}
    ]},
    {"role": "tool", "content": [{"type": "tool_result", "call_id": "c1", "name": "ls", "content": "src tests"}]}
  ]
}"#;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let session: Session = serde_json::from_str(SAVED)
        .map_err(|e| Error::bad_request(format!("cannot load the session: {e}")))?;
    println!("loaded:\n{}", dump(&session.history));

    // The model sees the repaired history: it calls `wc` again, then answers.
    let model = ScriptedModel::from_fn(|req: &ModelRequest| {
        Ok(match req.ctx.round() {
            1 => ModelResponse::tool_calls([ToolCall::new("c3", "wc", json!({ "path": "src" }))]),
            _ => {
                let lines = req
                    .messages
                    .iter()
                    .flat_map(Message::tool_results)
                    .filter(|r| r.call_id == "c3")
                    .map(|r| r.content.clone())
                    .next()
                    .unwrap_or_default();
                ModelResponse::text(format!("The repo has {lines} lines of code."))
            }
        })
    });
    let tools = ToolSet::new()
        .tool(StubTool::returning("ls", "src tests"))
        .tool(StubTool::returning("wc", "1200"));

    // The same layer at both places of the canonical stack (docs/ordering.md).
    let model = ServiceBuilder::new()
        .layer(PatchDanglingLayer::new())
        .service(model);
    let agent = ServiceBuilder::new()
        .layer(PatchDanglingLayer::new())
        .service(Agent::new(model, tools));

    let res = agent
        .oneshot(AgentRequest::new(session, AgentInput::Continue))
        .await?;
    println!("after the run:\n{}", dump(&res.session.history));
    res.session
        .history
        .validate()
        .map_err(|e| Error::bad_request(e.to_string()))?;
    println!("answer: {}", res.text().unwrap_or_default());
    Ok(())
}
