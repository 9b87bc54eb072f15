//! A long session kept inside a token budget: a tool returns a 200 KB log, which the eviction
//! layer moves to storage (the model gets a preview and reads a slice with the read tool);
//! then the history grows round after round past the budget, and the summarization layer
//! replaces the older messages by a summary, committed to the session, the summarized messages
//! offloaded to storage. Every model request stays under the budget.
//!
//! Offline: the model and the summarizer are scripted.
//!
//! ```sh
//! cargo run --example long_session
//! ```

use std::sync::{Arc, Mutex};

use serde_json::json;
use tower_agent::layers::evict::{EvictLayer, READ_TOOL};
use tower_agent::layers::summarize::{Keep, SummarizeLayer, Trigger, is_summary};
use tower_agent::layers::tokens::{CharEstimate, TokenCounter};
use tower_agent::prelude::*;
use tower_agent::storage::{InMemory, Storage};
use tower_agent_test::{ScriptedModel, StubTool};

/// The budget of a model request, in estimated tokens: summarization fires at it.
const BUDGET: usize = 6_000;
/// The rounds of `inspect` calls after the log was read.
const INSPECTIONS: usize = 14;

/// The 200 KB log the `fetch_log` tool returns.
fn log() -> String {
    (1..=3_000)
        .map(|i| {
            format!(
                "2026-11-24T12:{:02}:{:02}Z INFO request {i:05} served in {} ms\n",
                i / 60 % 60,
                i % 60,
                i % 97
            )
        })
        .collect()
}

/// The scripted model: fetch the log, read a slice of it, inspect a few hosts, answer.
fn model() -> ScriptedModel {
    ScriptedModel::from_fn(|req: &ModelRequest| {
        // What `fetch_log` said, when it answered last: its preview.
        let last: String = req
            .messages
            .last()
            .into_iter()
            .flat_map(Message::tool_results)
            .filter(|r| r.name == "fetch_log")
            .map(|r| r.content.as_str())
            .collect();
        let round = req.ctx.round() as usize;
        if round == 1 {
            let call = ToolCall::new("call_log", "fetch_log", json!({}));
            return Ok(ModelResponse::tool_calls([call]));
        }
        if let Some(at) = last.find("/large_tool_results/") {
            // The preview names the path: read 20 lines from line 100.
            let path: String = last[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "/_.-".contains(*c))
                .collect();
            let args = json!({"path": path, "offset": 100, "limit": 20});
            return Ok(ModelResponse::tool_calls([ToolCall::new(
                "call_read",
                READ_TOOL,
                args,
            )]));
        }
        if round < 3 + INSPECTIONS {
            let host = json!({ "host": format!("web-{round}") });
            let call = ToolCall::new(format!("call_inspect_{round}"), "inspect", host);
            return Ok(ModelResponse::tool_calls([call]));
        }
        Ok(ModelResponse::text(
            "Every request in the log was served in under 100 ms.",
        ))
    })
}

/// The summarizer: says how much it summarized (a real one would be a cheap model).
fn summarizer() -> ScriptedModel {
    ScriptedModel::from_fn(|req: &ModelRequest| {
        let input = req.messages.last().map(Message::text).unwrap_or_default();
        let calls = input.matches(" calls ").count();
        Ok(ModelResponse::text(format!(
            "The user asked for an analysis of the request log. The agent fetched it (saved to \
             storage), read lines 100-119, and inspected hosts; {calls} tool calls so far, \
             all fine."
        )))
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let storage = Arc::new(InMemory::new());

    let evict = EvictLayer::from_shared(storage.clone());
    let inspect_report = "cpu 12%, memory 41%, disk 63%, p99 latency 48 ms\n".repeat(80);
    let tools = ToolSet::new()
        .tool(StubTool::returning("fetch_log", log()))
        .tool(StubTool::returning("inspect", inspect_report));
    // The eviction layer serves its read tool itself, and the agent offers it.
    let tools = ServiceBuilder::new().layer(evict).service(tools);

    // What each model request weighs, measured where the provider would get it.
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let scripted = model();
    let model = ServiceBuilder::new()
        .layer(
            SummarizeLayer::new(summarizer())
                .trigger(Trigger::tokens(BUDGET))
                .keep(Keep::tokens(BUDGET / 3))
                .offload_shared(storage.clone()),
        )
        .before_model({
            let sizes = Arc::clone(&sizes);
            move |req: ModelRequest| {
                let sizes = Arc::clone(&sizes);
                async move {
                    let tokens: usize = req
                        .messages
                        .iter()
                        .map(|m| CharEstimate.count_message(m))
                        .sum::<usize>()
                        + req
                            .system
                            .as_deref()
                            .map_or(0, |s| CharEstimate.count_text(s))
                        + req
                            .tools
                            .iter()
                            .map(|t| {
                                CharEstimate.count_text(&t.name)
                                    + CharEstimate.count_text(&t.description)
                                    + CharEstimate.count_text(&t.parameters.to_string())
                            })
                            .sum::<usize>();
                    let mut sizes = sizes.lock().map_err(|_| Error::other("poisoned"))?;
                    sizes.push((req.ctx.round(), req.messages.len(), tokens));
                    Ok(Flow::Continue(req))
                }
            }
        })
        .service(scripted);

    let agent = Agent::builder()
        .system("You analyse logs.")
        .max_rounds(40)
        .build(model, tools);

    let printer = observer_fn(|event: &Event| {
        use tower_agent::layers::evict::ResultEvicted;
        use tower_agent::layers::summarize::Summarized;
        if let Some(ResultEvicted {
            name, path, tokens, ..
        }) = event.downcast_ref()
        {
            println!("evicted: {name} result of ~{tokens} tokens -> {path}");
        } else if let Some(summary) = event.downcast_ref::<Summarized>() {
            println!(
                "summarized at round {}: {} messages -> 1 summary, {} kept; ~{} -> ~{} tokens",
                summary.round,
                summary.summarized,
                summary.kept,
                summary.tokens_before,
                summary.tokens_after
            );
        } else if let Event::ToolFinished { name, is_error, .. } = event {
            println!("tool {name} {}", if *is_error { "✗" } else { "✓" });
        }
        async { Ok(()) }
    });
    let req = AgentRequest::new(Session::with_id("long-session"), "Analyse the request log.")
        .with_observer(printer);
    let res = agent.oneshot(req).await?;

    let sizes = sizes.lock().map_err(|_| Error::other("poisoned"))?.clone();
    let largest = sizes.iter().map(|s| s.2).max().unwrap_or(0);
    for (round, messages, tokens) in &sizes {
        println!("round {round:>2}: {messages:>2} messages, ~{tokens} tokens");
    }
    println!("largest request: ~{largest} tokens (budget {BUDGET})");
    println!(
        "session: {} messages, the first a summary: {}",
        res.session.history.len(),
        res.session.history.first().is_some_and(is_summary)
    );
    let archived = storage.list("conversation_history/").await?;
    for entry in &archived {
        println!("offloaded: /{} ({} bytes)", entry.path.as_str(), entry.size);
    }
    println!("answer: {}", res.text().unwrap_or_default());
    if largest >= BUDGET {
        return Err(Error::other(format!(
            "a request of ~{largest} tokens passed the budget of {BUDGET}"
        )));
    }
    Ok(())
}
