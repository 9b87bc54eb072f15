//! A model service that prices requests as Anthropic's prompt cache would: the request body
//! is the real provider's (`Anthropic::request_body`), and its cached input tokens are those of
//! the longest prefix (tools, then system blocks, then message blocks, in that order) that an
//! earlier request wrote to the cache with a `cache_control` marker, looked up at each marker
//! and up to 20 blocks before it, as the API does; a prefix under 1,024 tokens (Sonnet's
//! minimum) is neither written nor read; what a call writes is its prefix up to its last marker,
//! less what it read. Tokens are counted as 4 bytes of each block's JSON.
//! Not modelled: the cache's lifetime (the session runs in well under five minutes), and the
//! API's checks of the markers (their number and the blocks they are on are tested in the
//! provider's unit tests).

#![allow(dead_code)] // the test and the bench use different parts

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use serde_json::{Value, json};
use tower::{Service, ServiceExt};
use tower_agent::layers::clear::ClearToolResultsLayer;
use tower_agent::layers::instructions::InstructionsLayer;
use tower_agent::layers::memory::MemoryLayer;
use tower_agent::layers::summarize::{Keep, SummarizeLayer, Trigger};
use tower_agent::prelude::*;
use tower_agent::providers::Anthropic;
use tower_agent::providers::PriceTable;
use tower_agent::providers::anthropic::CacheTtl;
use tower_agent::storage::{InMemory, Storage, StoragePath};
use tower_agent::{Cost, History, ModelPrice, Usage};
use tower_agent_test::{ScriptedModel, StubTool, assert_valid_history};

/// How far before a marker the API looks for a cached prefix, in blocks.
const LOOKBACK: usize = 20;

/// The shortest prefix Sonnet caches, in tokens.
const MIN_TOKENS: u64 = 1_024;

/// The input tokens of every call, and those read from the cache.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) calls: u64,
    pub(crate) input: u64,
    pub(crate) cached: u64,
    /// Written to the cache.
    pub(crate) written: u64,
    /// The call asked for a summary.
    pub(crate) summary: bool,
}

impl Tally {
    pub(crate) fn ratio(&self) -> f64 {
        self.cached as f64 / self.input.max(1) as f64
    }

    /// The call's usage as the provider reports it (20 output tokens each).
    pub(crate) fn usage(&self) -> Usage {
        Usage::new(self.input, 20 * self.calls)
            .with_cached(self.cached)
            .with_cache_writes(self.written)
    }
}

/// Claude Sonnet's list prices, as a price table file would give them.
pub(crate) const PRICES: &str = r#"{
    "claude-sonnet-4-5": { "input": 3.0, "cached_input": 0.3, "cache_write": 3.75, "output": 15.0 }
}"#;

/// Sonnet's price, from [`PRICES`], as the provider's model name finds it.
pub(crate) fn sonnet() -> ModelPrice {
    PriceTable::from_json(PRICES)
        .expect("a price table")
        .get("claude-sonnet-4-5-20250929")
        .expect("priced")
}

/// What `calls` cost at `price`: reads at the read price, writes at the write price, the rest
/// at the prompt price, and the output.
pub(crate) fn cost(calls: &[Tally], price: &ModelPrice) -> Cost {
    calls.iter().map(|c| price.cost(&c.usage())).sum()
}

#[derive(Default)]
struct State {
    written: HashSet<u64>,
    /// Every call's tally, in order (the first call's cannot hit).
    calls: Vec<Tally>,
}

/// See the module docs. `answer` gives each call's response (its usage is replaced).
#[derive(Clone)]
pub(crate) struct CachingServer<F> {
    provider: Anthropic,
    answer: F,
    state: Arc<Mutex<State>>,
}

impl<F> CachingServer<F>
where
    F: Fn(&ModelRequest) -> ModelResponse,
{
    pub(crate) fn new(provider: Anthropic, answer: F) -> Self {
        Self {
            provider,
            answer,
            state: Arc::default(),
        }
    }

    /// Each call's input and cached tokens, in order.
    pub(crate) fn calls(&self) -> Vec<Tally> {
        self.state.lock().expect("lock").calls.clone()
    }

    /// The tally of every call after the first.
    pub(crate) fn after_first(&self) -> Tally {
        let calls = self.calls();
        let mut total = Tally::default();
        for call in calls.iter().skip(1) {
            total.calls += 1;
            total.input += call.input;
            total.cached += call.cached;
            total.written += call.written;
        }
        total
    }

    /// Price one body: its input tokens and the cached ones; the markers' prefixes are written.
    fn price(&self, body: &[u8], summary: bool) -> Result<Tally, Error> {
        let body: Value =
            serde_json::from_slice(body).map_err(|e| Error::other(format!("not JSON: {e}")))?;
        let mut blocks: Vec<(Value, bool, u64)> = Vec::new();
        // Each block with its role (hashed), and its tokens (counted from the block alone).
        let mut push = |block: &Value, role: Option<&str>| {
            let mut block = block.clone();
            let marked = block
                .as_object_mut()
                .is_some_and(|o| o.remove("cache_control").is_some());
            let tokens = block.to_string().len() as u64 / 4;
            let block = match role {
                Some(role) => serde_json::json!({ "role": role, "block": block }),
                None => block,
            };
            blocks.push((block, marked, tokens));
        };
        for tool in body["tools"].as_array().into_iter().flatten() {
            push(tool, None);
        }
        match &body["system"] {
            Value::String(text) => push(&serde_json::json!({ "type": "text", "text": text }), None),
            Value::Array(system) => system.iter().for_each(|b| push(b, None)),
            _ => {}
        }
        for message in body["messages"].as_array().into_iter().flatten() {
            let role = message["role"].as_str();
            for block in message["content"].as_array().into_iter().flatten() {
                push(block, role);
            }
        }
        // The prefix hash and its tokens after each block.
        let mut hasher = DefaultHasher::new();
        let mut tokens = 0_u64;
        let mut prefixes = Vec::with_capacity(blocks.len());
        for (block, _, size) in &blocks {
            block.to_string().hash(&mut hasher);
            tokens += size;
            prefixes.push((hasher.finish(), tokens));
        }
        let mut state = self.state.lock().expect("lock");
        let mut cached = 0;
        for (index, (_, marked, _)) in blocks.iter().enumerate() {
            if !marked {
                continue;
            }
            for back in (index.saturating_sub(LOOKBACK)..=index).rev() {
                if prefixes[back].1 >= MIN_TOKENS && state.written.contains(&prefixes[back].0) {
                    cached = cached.max(prefixes[back].1);
                    break;
                }
            }
        }
        let mut last_marked = 0;
        for (index, (_, marked, _)) in blocks.iter().enumerate() {
            if *marked && prefixes[index].1 >= MIN_TOKENS {
                state.written.insert(prefixes[index].0);
                last_marked = prefixes[index].1;
            }
        }
        let tally = Tally {
            calls: 1,
            input: tokens,
            cached,
            written: last_marked.saturating_sub(cached),
            summary,
        };
        state.calls.push(tally);
        Ok(tally)
    }
}

impl<F> Service<ModelRequest> for CachingServer<F>
where
    F: Fn(&ModelRequest) -> ModelResponse,
{
    type Response = ModelResponse;
    type Error = Error;
    type Future = std::future::Ready<Result<ModelResponse, Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ModelRequest) -> Self::Future {
        let result = self
            .provider
            .request_body(&req)
            .and_then(|body| self.price(&body, asks_for_summary(&req)))
            .map(|tally| {
                let mut response = (self.answer)(&req);
                response.usage = tally.usage();
                response
            });
        std::future::ready(result)
    }
}

/// Rounds of the session.
pub(crate) const ROUNDS: u32 = 50;

/// The model: a lookup every round, then the answer; a summary when the summarization layer
/// asks for one in the stack.
fn answer(req: &ModelRequest) -> ModelResponse {
    if asks_for_summary(req) {
        return ModelResponse::text("Pages 1 to 20 were read; each had notes.");
    }
    let round = req.ctx.round();
    if round < ROUNDS {
        let id = format!("toolu_{round:03}");
        ModelResponse::tool_calls([ToolCall::new(id, "lookup", json!({ "page": round }))])
    } else {
        ModelResponse::text("Here is what I found.")
    }
}

/// Whether `req` is the summarization layer's, asked in the stack.
fn asks_for_summary(req: &ModelRequest) -> bool {
    req.messages.last().is_some_and(|m| {
        m.role == tower_agent::Role::User && m.text().contains("Write the summary")
    })
}

/// Who writes the session's summaries.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Summaries {
    /// The model below the layer, with the session's prefix (`SummarizeLayer::in_stack`).
    InStack,
    /// A model of its own, not counted here (`SummarizeLayer::new`).
    Apart,
}

/// A 50-round session (a system prompt, memory, static instructions, summarization) against
/// the caching server: the tally after its first call, each call's, and the history it ends
/// with.
pub(crate) async fn session(
    cache: Option<CacheTtl>,
    instructions: InstructionsLayer,
    summarize: Summaries,
) -> (Tally, Vec<Tally>, History) {
    session_clearing(cache, instructions, summarize, None).await
}

/// [`session`], with `clear` inside the summarization when there is one.
pub(crate) async fn session_clearing(
    cache: Option<CacheTtl>,
    instructions: InstructionsLayer,
    summarize: Summaries,
    clear: Option<ClearToolResultsLayer>,
) -> (Tally, Vec<Tally>, History) {
    let storage = InMemory::new();
    storage
        .put(
            &StoragePath::parse("/memories/AGENTS.md").expect("a path"),
            "The user is a historian of science. Prefer primary sources. "
                .repeat(20)
                .into(),
        )
        .await
        .expect("stored");
    let provider = Anthropic::new("claude-sonnet-4-5")
        .api_key("sk-ant-test")
        .prompt_cache(cache);
    let server = CachingServer::new(provider, answer);
    let summarizer = match summarize {
        Summaries::InStack => SummarizeLayer::in_stack(),
        Summaries::Apart => SummarizeLayer::new(ScriptedModel::from_fn(|_| {
            Ok(ModelResponse::text("Pages 1 to 20 were read."))
        })),
    };
    let tools = ToolSet::new().tool(StubTool::returning(
        "lookup",
        "A page of notes. ".repeat(25),
    ));
    let agent = Agent::builder()
        // About 1,150 tokens: over the shortest prefix Sonnet caches.
        .system("You are a careful research assistant. ".repeat(120))
        .max_rounds(ROUNDS + 5)
        .with(MemoryLayer::from_storage(storage, ["/memories/AGENTS.md"]))
        .with(instructions)
        .with(
            summarizer
                .trigger(Trigger::messages(60))
                .keep(Keep::messages(20)),
        );
    let agent = match clear {
        Some(clear) => agent.with(clear),
        None => agent,
    }
    .build(server.clone(), tools);
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "Read the archive."))
        .await
        .expect("the session completes");
    // The summary's call (in the stack) is a call of its own, not a round.
    assert_eq!(res.rounds, ROUNDS);
    assert_valid_history(&res.session.history);
    (server.after_first(), server.calls(), res.session.history)
}

/// Static instructions of about 135 tokens.
pub(crate) fn static_instructions() -> InstructionsLayer {
    InstructionsLayer::new().text("Cite every page you use, by number. ".repeat(15))
}
