//! Stubs and the hand-written reference loop shared by the benches.

#![allow(dead_code)] // each bench uses its own part

use std::future::{Ready, ready};
use std::hint::black_box;
use std::sync::Arc;
use tower_agent::DescribeTools;
use tower_agent::DescribedTools;

use tower::{Service, service_fn};
use tower_agent::layers::{InstructionsLayer, PatchDanglingLayer};
use tower_agent::prelude::*;
use tower_agent::{Deltas, GenerationOptions, History, ModelRequest, PromptCache};

/// Rounds per run.
pub(crate) const ROUNDS: u32 = 100;

/// The stub model: one tool call per round.
pub(crate) fn model_answer(round: u32) -> ModelResponse {
    ModelResponse::tool_calls([ToolCall::raw(format!("call_{round}"), "echo", "{}")])
}

/// The stub tool.
pub(crate) fn tool_answer(call: &ToolCall) -> ToolResponse {
    ToolResponse::success(call, "ok")
}

pub(crate) fn stub_model() -> impl Service<
    ModelRequest,
    Response = ModelResponse,
    Error = Error,
    Future = Ready<Result<ModelResponse, Error>>,
> + Clone {
    service_fn(|req: ModelRequest| ready(Ok(model_answer(req.ctx.round()))))
}

pub(crate) fn stub_tools() -> impl Service<
    ToolRequest,
    Response = ToolResponse,
    Error = Error,
    Future = Ready<Result<ToolResponse, Error>>,
> + DescribeTools
+ Clone {
    DescribedTools::none(service_fn(|req: ToolRequest| {
        ready(Ok(tool_answer(&req.call)))
    }))
}

pub(crate) fn history(len: usize) -> Vec<Message> {
    (0..len)
        .map(|i| {
            if i % 2 == 0 {
                Message::user(format!(
                    "question {i} with a little text to make it realistic"
                ))
            } else {
                Message::assistant(format!(
                    "answer {i} with a little more text to make it realistic"
                ))
            }
        })
        .collect()
}

/// How a hand-written reference loop hands the history to the model.
#[derive(Clone, Copy)]
pub(crate) enum Handoff {
    /// Shared copy-on-write: O(1) per round, appended in place once the request is dropped.
    Shared,
    /// The message vector cloned into every request.
    Cloned,
}

/// A hand-written loop on the same stubs, no layers, no events, no cancellation.
pub(crate) fn reference(mut messages: History, handoff: Handoff) -> History {
    let ctx = RunContext::new();
    let tools: Arc<[ToolSpec]> = Arc::from(Vec::new());
    let options = Arc::new(GenerationOptions::default());
    let deltas = Deltas::default();
    for round in 1..=ROUNDS {
        let req = ModelRequest {
            system: None,
            messages: match handoff {
                Handoff::Shared => messages.clone(),
                Handoff::Cloned => History::from(messages.to_vec()),
            },
            tools: tools.clone(),
            options: options.clone(),
            ctx: ctx.with_round(round),
            deltas: deltas.clone(),
            cache: PromptCache::default(),
        };
        let res = black_box(model_answer(req.ctx.round()));
        drop(req);
        let call = res.message.tool_calls().next().cloned().expect("a call");
        messages.push(res.message);
        let out = tool_answer(&call);
        messages.push(Message::tool_result(out.result));
    }
    messages
}

pub(crate) fn request(len: usize) -> AgentRequest {
    AgentRequest::new(
        Session::new().with_history(history(len)),
        AgentInput::Continue,
    )
}

/// The agent with the first built-ins at their places of the canonical stack: patching at the
/// agent and (innermost) at the model, one static instruction block at the model.
pub(crate) fn with_builtins<M, T>(
    model: M,
    tools: T,
) -> impl Service<AgentRequest, Response = AgentResponse, Error = Error> + Clone
where
    M: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    M::Future: Send,
    T: Service<ToolRequest, Response = ToolResponse, Error = Error>
        + DescribeTools
        + Clone
        + Send
        + 'static,
    T::Future: Send,
{
    let model = ServiceBuilder::new()
        .layer(InstructionsLayer::from("Be brief."))
        .layer(PatchDanglingLayer::new())
        .service(model);
    ServiceBuilder::new()
        .layer(PatchDanglingLayer::new())
        .service(Agent::builder().max_rounds(ROUNDS).build(model, tools))
}

/// The agent with the history stack at its places of the canonical stack: patching at the
/// agent and the model, one instruction block, summarization that never triggers (a budget of
/// 10 million tokens) and, on the tools, eviction to memory of results that are all small.
pub(crate) fn with_history_stack<M, T>(
    model: M,
    tools: T,
) -> impl Service<AgentRequest, Response = AgentResponse, Error = Error> + Clone
where
    M: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    M::Future: Send + 'static,
    T: Service<ToolRequest, Response = ToolResponse, Error = Error>
        + DescribeTools
        + Clone
        + Send
        + 'static,
    T::Future: Send + 'static,
{
    use tower_agent::layers::evict::EvictLayer;
    use tower_agent::layers::summarize::{SummarizeLayer, Trigger};
    use tower_agent::storage::InMemory;

    let summarizer = tower::service_fn(|_: ModelRequest| {
        std::future::ready(Ok::<_, Error>(ModelResponse::text("a summary")))
    });
    let model = ServiceBuilder::new()
        .layer(InstructionsLayer::from("Be brief."))
        .layer(SummarizeLayer::new(summarizer).trigger(Trigger::tokens(10_000_000)))
        .layer(PatchDanglingLayer::new())
        .service(model);
    let tools = ServiceBuilder::new()
        .layer(EvictLayer::new(InMemory::new()))
        .service(tools);
    ServiceBuilder::new()
        .layer(PatchDanglingLayer::new())
        .service(Agent::builder().max_rounds(ROUNDS).build(model, tools))
}
