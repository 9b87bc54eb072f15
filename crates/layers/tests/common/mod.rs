//! What the summarization tests share: histories, a request with a recorder, a windowed
//! model, a summarizer that always answers the same.

#![allow(dead_code, unreachable_pub)]

use serde_json::json;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent_core::{
    Error, ErrorKind, Message, ModelRequest, ModelResponse, RunContext, ToolCall, ToolResult,
};
use tower_agent_layers::summarize::SummarizeLayer;
use tower_agent_layers::tokens::{CharEstimate, TokenCounter};
use tower_agent_test::{EventRecorder, ScriptedModel};

/// `n` alternating user / assistant text messages, `q0`, `a1`, ...
pub fn chat(n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            if i % 2 == 0 {
                Message::user(format!("q{i}"))
            } else {
                Message::assistant(format!("a{i}"))
            }
        })
        .collect()
}

/// `n` alternating user / assistant messages of about 30 tokens each, `q0: ...`, `a1: ...`:
/// long enough that a short summary is smaller than any of them.
pub fn talk(n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            let words = "lorem ipsum ".repeat(10);
            if i % 2 == 0 {
                Message::user(format!("q{i}: {words}"))
            } else {
                Message::assistant(format!("a{i}: {words}"))
            }
        })
        .collect()
}

/// An assistant message asking for `ids` at once, and the results.
pub fn batch(ids: &[&str]) -> Vec<Message> {
    let calls: Vec<ToolCall> = ids
        .iter()
        .map(|id| ToolCall::new(*id, "search", json!({"q": id})))
        .collect();
    let mut out = vec![Message::assistant_with_calls("", calls.clone())];
    out.extend(
        calls
            .iter()
            .map(|c| Message::tool_result(ToolResult::success(c, format!("found {}", c.id)))),
    );
    out
}

pub fn request(messages: Vec<Message>) -> (ModelRequest, RunContext, EventRecorder) {
    let recorder = EventRecorder::new();
    let mut req = ModelRequest::new(messages);
    req.ctx = RunContext::new()
        .with_session_id("s1")
        .with_observer(recorder.clone());
    let ctx = req.ctx.clone();
    (req, ctx, recorder)
}

pub async fn call(
    layer: SummarizeLayer,
    model: &ScriptedModel,
    req: ModelRequest,
) -> Result<ModelResponse, Error> {
    let mut service = ServiceBuilder::new().layer(layer).service(model.clone());
    service.ready().await?.call(req).await
}

pub fn summarizer(text: &str) -> ScriptedModel {
    ScriptedModel::from_fn({
        let text = text.to_owned();
        move |_| Ok(ModelResponse::text(text.clone()))
    })
}

/// A model with a context window of `window` tokens (as the layer estimates them): longer
/// requests fail with `ContextTooLong`, naming their size.
pub fn windowed(window: usize) -> ScriptedModel {
    ScriptedModel::from_fn(move |req: &ModelRequest| {
        let tokens: usize = req
            .messages
            .iter()
            .map(|m| CharEstimate.count_message(m))
            .sum::<usize>()
            + req
                .system
                .as_deref()
                .map_or(0, |s| CharEstimate.count_text(s));
        if tokens > window {
            return Err(Error::new(
                ErrorKind::ContextTooLong,
                format!("{tokens} tokens > {window}"),
            ));
        }
        Ok(ModelResponse::text("ok"))
    })
}
