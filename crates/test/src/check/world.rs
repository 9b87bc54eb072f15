//! The model and the tools that misbehave on purpose, and what they share in a case.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use serde_json::{Value, json};
use tower_agent_core::event::BoxFuture;
use tower_agent_core::stream::Delta;
use tower_agent_core::{
    CallKey, DescribeTools, Error, ErrorKind, Message, ModelRequest, ModelResponse, Recovery, Role,
    ToolCall, ToolRequest, ToolResponse, ToolSpec,
};
use tower_service::Service;

use crate::lock;

use super::INPUT;

/// One case's shared state: its random numbers and its counters.
#[derive(Debug)]
pub(super) struct World {
    /// The case's seed.
    pub(super) seed: u64,
    pub(super) rng: Mutex<fastrand::Rng>,
    pub(super) tools: Arc<[ToolSpec]>,
    pub(super) counts: Mutex<Counts>,
    /// The text that must never be saved nor told: the model and the tools say it now and
    /// then.
    pub(super) secret: Option<String>,
}

#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) summaries: u32,
    pub(super) tool_calls: u32,
    pub(super) large_results: u32,
    pub(super) calls_made: u32,
    /// The last run: the model answers with text only.
    pub(super) finishing: bool,
    /// The call ids the tools ran, each time they ran one.
    pub(super) executed: Vec<String>,
    /// The arguments and the key each call ran with, by call id.
    pub(super) ran_with: HashMap<String, (String, Option<CallKey>)>,
    /// The calls of answers cut off at their length limit: none may run (but a read-only
    /// call started early, before the answer was known to be cut).
    pub(super) cut: Vec<String>,
    /// Calls of cut answers the tools were asked to run.
    pub(super) cut_ran: Vec<String>,
    /// The effects of tools that may not repeat: how many times each key ran (the external
    /// ledger a payment would go to). More than once is a duplicated effect.
    pub(super) effects: HashMap<CallKey, u32>,
    /// What each such call answered, when it got to answer, and the arguments it ran with:
    /// its reconcile step reads them.
    pub(super) answered: HashMap<CallKey, (String, String)>,
    /// Calls the loop asked to recover, and what the tools said: `"done"`, `"not_run"` or
    /// `"unknown"`.
    pub(super) recovered: Vec<(CallKey, &'static str)>,
}

impl World {
    pub(super) fn new(seed: u64, tools: Vec<ToolSpec>, secret: Option<String>) -> Arc<Self> {
        Arc::new(Self {
            seed,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            tools: tools.into(),
            counts: Mutex::new(Counts::default()),
            secret,
        })
    }

    /// Now and then, the secret (with a space before it); else nothing.
    pub(super) fn maybe_secret(&self) -> String {
        match &self.secret {
            Some(secret) if self.chance(20) => format!(" Write to {secret}."),
            _ => String::new(),
        }
    }

    /// A number below `n`.
    pub(super) fn below(&self, n: u32) -> u32 {
        lock(&self.rng).u32(..n.max(1))
    }

    /// True `percent` times in a hundred.
    pub(super) fn chance(&self, percent: u32) -> bool {
        self.below(100) < percent
    }
}

/// The check's model service: text, tool calls (now and then to a tool that does not exist or
/// with malformed arguments), a transient failure now and then, and a summary naming every
/// input it was shown when asked to summarize (see the [module docs](super) for how a
/// summarization request is recognized).
#[derive(Debug, Clone)]
pub struct CheckModel {
    pub(super) world: Arc<World>,
}

impl CheckModel {
    /// The seed of the case this model serves: a stack that varies from case to case (a mode
    /// on or off) draws from it, so that the case replays with the same stack.
    pub fn seed(&self) -> u64 {
        self.world.seed
    }

    fn answer(&self, req: &ModelRequest) -> Result<ModelResponse, Error> {
        let world = &self.world;
        let finishing = lock(&world.counts).finishing;
        // Summaries fail too: a summarization that fails half-way must lose nothing either.
        if !finishing && world.chance(5) {
            return Err(Error::new(ErrorKind::Server, "check: a transient failure"));
        }
        if is_summary_request(req) {
            lock(&world.counts).summaries += 1;
            let mut inputs = Vec::new();
            inputs_of(req.system.as_deref().unwrap_or_default(), &mut inputs);
            for message in req.messages.iter() {
                inputs_of(&message.text(), &mut inputs);
            }
            return Ok(ModelResponse::text(format!(
                "Summary: {}",
                inputs.join(" ")
            )));
        }
        if finishing || req.tools.is_empty() || world.chance(30) {
            return Ok(ModelResponse::text(format!(
                "Done.{}",
                world.maybe_secret()
            )));
        }
        let calls = (0..=world.below(3))
            .map(|_| {
                let id = {
                    let mut counts = lock(&world.counts);
                    counts.calls_made += 1;
                    format!("check_{}", counts.calls_made)
                };
                let name = if world.chance(5) {
                    "no_such_tool".to_owned()
                } else {
                    let index = world.below(req.tools.len() as u32) as usize;
                    req.tools[index].name.clone()
                };
                if world.chance(5) {
                    ToolCall::raw(id, name, "{\"n\": ")
                } else {
                    ToolCall::new(id, name, json!({ "n": world.below(100) }))
                }
            })
            .collect::<Vec<_>>();
        let mut response = ModelResponse::tool_calls(calls);
        // Now and then the answer is cut off at its length limit, in its last call.
        if world.chance(4) {
            let mut calls = response
                .message
                .content
                .iter_mut()
                .filter_map(|part| match part {
                    tower_agent_core::ContentPart::ToolCall(call) => Some(call),
                    _ => None,
                });
            if let Some(last) = calls.next_back() {
                last.arguments = "{\"n\": 4".to_owned();
            }
            let ids = response.message.tool_calls().map(|call| call.id.clone());
            lock(&world.counts).cut.extend(ids);
            response.finish_reason = tower_agent_core::FinishReason::Length;
        }
        Ok(response)
    }
}

impl Service<ModelRequest> for CheckModel {
    type Response = ModelResponse;
    type Error = Error;
    type Future = BoxFuture<'static, Result<ModelResponse, Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ModelRequest) -> Self::Future {
        let model = self.clone();
        Box::pin(async move {
            // A point where the run can be cancelled.
            tokio::task::yield_now().await;
            let response = model.answer(&req)?;
            // Now and then the stream breaks after its first call closed: a retry starts over,
            // and a call started early is discarded.
            let finishing = lock(&model.world.counts).finishing;
            let breaks = !finishing && response.message.has_tool_calls() && model.world.chance(5);
            // Its calls streamed as a provider closes them, a point apart: an agent that
            // starts read-only tools early starts them here.
            // A call cut off is never sent up as complete (the last of a cut answer).
            let cut = response.finish_reason == tower_agent_core::FinishReason::Length;
            let calls = response.message.tool_calls().count();
            let closed = if cut { calls.saturating_sub(1) } else { calls };
            for call in response.message.tool_calls().take(closed) {
                req.send_delta(Delta::ToolCall(call.clone())).await?;
                tokio::task::yield_now().await;
                if breaks {
                    return Err(Error::new(ErrorKind::Server, "check: the stream broke"));
                }
            }
            req.end_stream().await?;
            Ok(response)
        })
    }
}

fn is_summary_request(req: &ModelRequest) -> bool {
    let speaks_of = |text: &str| text.to_lowercase().contains("summar");
    // The summarization layer in the stack asks at the end of the session's own prefix.
    let asks_last = req
        .messages
        .last()
        .is_some_and(|m| m.role == Role::User && speaks_of(&m.text()));
    let apart = req.tools.is_empty()
        && (req.system.as_deref().is_some_and(speaks_of)
            || req
                .messages
                .iter()
                .any(|m| m.role == Role::User && speaks_of(&m.text())));
    asks_last || apart
}

/// The inputs named in `messages`, in order, each once.
pub(super) fn inputs_in<'a>(messages: impl Iterator<Item = &'a Message>) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for message in messages {
        inputs_of(&message.text(), &mut found);
    }
    found
}

/// The inputs named in `text` (words of letters, digits and `-`), added to `found`.
fn inputs_of(text: &str, found: &mut Vec<String>) {
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
        if word.starts_with(INPUT) && !found.iter().any(|f| f == word) {
            found.push(word.to_owned());
        }
    }
}

/// The check's tool service: it serves the specs given to [`StackCheck::tools`](super::StackCheck::tools) and answers
/// each call with a short result, an error result, a result after a while, or a result of
/// 12,000 characters; an unknown tool and malformed arguments get error results.
#[derive(Debug, Clone)]
pub struct CheckTools {
    pub(super) world: Arc<World>,
}

impl DescribeTools for CheckTools {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        Arc::clone(&self.world.tools)
    }
}

impl Service<ToolRequest> for CheckTools {
    type Response = ToolResponse;
    type Error = Error;
    type Future = BoxFuture<'static, Result<ToolResponse, Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        let world = Arc::clone(&self.world);
        Box::pin(async move {
            let spec = world.tools.iter().find(|spec| spec.name == req.call.name);
            let repeats = spec.is_some_and(ToolSpec::may_repeat);
            let key = req.call.key.filter(|_| !repeats && spec.is_some());
            if req.recover && !repeats {
                // The tool's reconcile step: its ledger says what became of the call.
                let recovery = {
                    let mut counts = lock(&world.counts);
                    let recovery = match key {
                        Some(key) => match (counts.answered.get(&key), counts.effects.get(&key)) {
                            (Some((result, arguments)), _) => Recovery::Done {
                                result: result.clone(),
                                arguments: serde_json::from_str(arguments).ok(),
                            },
                            (None, Some(_)) => Recovery::Unknown,
                            (None, None) => Recovery::NotRun,
                        },
                        None => Recovery::Unknown,
                    };
                    if let Some(key) = req.call.key {
                        counts.recovered.push((key, recovery.name()));
                    }
                    recovery
                };
                return Ok(recovery.respond(&req).await);
            }
            let early = req.early.is_some();
            let call = req.call;
            let arguments = call.arguments.clone();
            if let Some(key) = key {
                *lock(&world.counts).effects.entry(key).or_default() += 1;
            }
            let response = answer(&world, call, early).await;
            if let (Some(key), Ok(response)) = (key, &response) {
                let content = response.result.content.clone();
                lock(&world.counts)
                    .answered
                    .insert(key, (content, arguments));
                // Now and then the answer takes a poll to come back: a run killed then leaves
                // a call that took effect without its result saved.
                if world.chance(30) {
                    tokio::task::yield_now().await;
                }
            }
            response
        })
    }
}

/// The check tools' answer to `call` (`early`: started while the model streamed).
async fn answer(world: &World, call: ToolCall, early: bool) -> Result<ToolResponse, Error> {
    {
        let mut counts = lock(&world.counts);
        counts.tool_calls += 1;
        counts.executed.push(call.id.clone());
        counts
            .ran_with
            .insert(call.id.clone(), (call.arguments.clone(), call.key));
        if !early && counts.cut.contains(&call.id) {
            counts.cut_ran.push(call.id.clone());
        }
    }
    if !world.tools.iter().any(|spec| spec.name == call.name) {
        return Ok(ToolResponse::unknown_tool(&call, &world.tools));
    }
    if serde_json::from_str::<Value>(&call.arguments).is_err() {
        return Ok(ToolResponse::error(&call, "check: malformed arguments"));
    }
    match world.below(100) {
        0..10 => Ok(ToolResponse::error(&call, "check: the tool failed")),
        10..20 => {
            lock(&world.counts).large_results += 1;
            Ok(ToolResponse::success(&call, "large ".repeat(2_000)))
        }
        20..35 => {
            // A while, counted in polls: the case stays the same on every run.
            for _ in 0..=world.below(5) {
                tokio::task::yield_now().await;
            }
            Ok(ToolResponse::success(&call, format!("{} done", call.name)))
        }
        _ => Ok(ToolResponse::success(
            &call,
            format!("{} done.{}", call.name, world.maybe_secret()),
        )),
    }
}
