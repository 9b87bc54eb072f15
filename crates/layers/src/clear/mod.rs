//! Context editing: older tool results replaced by a short placeholder in each model request,
//! once the request is large, the newest results kept whole.
//!
//! Tool results are most of a long agent's context, and most of them are read once: a file
//! the model already edited, a search it already used. [`ClearToolResultsLayer`] sends the
//! model only the newest [`keep`](ClearToolResultsLayer::keep) of them in full and a
//! placeholder for each older one, as Anthropic's context editing (`clear_tool_uses`),
//! LangChain's `ContextEditingMiddleware` and the OpenAI Agents SDK's `ToolOutputTrimmer` do.
//! The call itself stays: the model still sees what it asked, with which arguments, and the
//! placeholder tells it how to get the result back (by default: call the tool again, if the
//! call only reads).
//!
//! **Per request only.** The edit shapes what is sent; the session keeps every result whole,
//! so nothing is lost, a host can show it, and the layer can be taken out or reconfigured at
//! any time.
//!
//! **When.** Only when the request, *before* the edit, counts at least
//! [`trigger`](ClearToolResultsLayer::trigger) tokens (100,000 by default, as Anthropic's and
//! LangChain's; counted with the layer's [`TokenCounter`], [`CharEstimate`] by default). The
//! unedited size only grows as the session does, so once the layer starts clearing, it goes on
//! (it does not flip between cleared and whole from one round to the next).
//!
//! **What.** A result is cleared when all of these hold:
//! - it answers a call of the assistant message right before it, and every call of that
//!   message has its result: a call that still waits (for a human decision, or a tool still
//!   running) keeps its whole batch untouched, and a result that answers nothing (an orphan)
//!   is left to the patch layer;
//! - its tool is not [excluded](ClearToolResultsLayer::exclude);
//! - it is not among the newest `keep` results that qualify (3 by default);
//! - its content is longer than its placeholder (clearing it would save nothing otherwise).
//!
//! **The provider's prompt cache.** Clearing one more result rewrites the request from that
//! result on, so the provider's cached prefix ends there. With
//! [`batch`](ClearToolResultsLayer::batch)`(n)`, results are cleared `n` at a time: between
//! two batches the cleared part stays byte-identical and the prefix is read from the cache.
//! The default is 10: over a 50-round session priced as Anthropic's cache
//! (`tests/prompt_cache.rs`), clearing one result at a time cut the tokens sent by 25% but
//! left 56% of them cached instead of 96%, and the input cost almost three times as much as
//! no clearing at all; ten at a time cut them by 18%, kept 92% cached, and cost 8% more than
//! no clearing (results of about 100 tokens; larger results save more). `batch(1)` is for a
//! provider without a prompt cache.
//!
//! **Where it goes.** On the model service, right inside `summarize`
//! (slot `clear` of the agent builder): the summarization layer counts, folds and commits the
//! whole results, and this layer shapes only what is sent. A summary asked in the stack
//! (`SummarizeLayer::in_stack`) is a side call,
//! which this layer leaves whole: the summary is written from the whole results, and its input
//! after the first cleared result is not read from the provider's cache. Set the summarization
//! trigger above this one: results are cleared first, and the conversation is summarized when
//! clearing is not enough.
//!
//! **Encoding once.** Within a run, when a request only adds messages to the previous one and
//! clears the same results, the layer appends the new messages to the edited history it sent
//! last: a provider that keeps its encoded messages (all of ours) encodes only the new ones.
//!
//! ```
//! use serde_json::json;
//! use tower::{Service, ServiceExt};
//! use tower_agent_core::{Error, Message, ModelRequest, ModelResponse, ToolCall, ToolResult};
//! use tower_agent_layers::clear::ClearToolResultsLayer;
//! use tower_agent_test::ScriptedModel;
//! use tower_layer::Layer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let mut history = vec![Message::user("read the three files")];
//! for i in 0..3 {
//!     let call = ToolCall::new(format!("c{i}"), "read_file", json!({ "path": format!("{i}.txt") }));
//!     history.push(Message::assistant_with_calls("", [call.clone()]));
//!     history.push(Message::tool_result(ToolResult::success(&call, "a long line\n".repeat(100))));
//! }
//! let layer = ClearToolResultsLayer::new().trigger(0).keep(1).batch(1);
//! let mut model = layer.layer(ScriptedModel::new([ModelResponse::text("done")]));
//! model.ready().await?.call(ModelRequest::new(history)).await?;
//!
//! let sent = &model.get_ref().requests()[0].messages;
//! let results: Vec<_> = sent.iter().flat_map(Message::tool_results).collect();
//! assert!(results[0].content.starts_with("[cleared"));
//! assert!(results[1].content.starts_with("[cleared"));
//! assert!(results[2].content.starts_with("a long line"), "the newest stays");
//! # Ok(())
//! # }
//! ```

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tower_agent_core::{ContentPart, ExtensionKey, History, HistoryMark, ModelRequest, ToolResult};
use tower_layer::Layer;
use tower_service::Service;

use crate::tokens::{CharEstimate, RunningCount, TokenCounter};

type Placeholder = Arc<dyn Fn(&ToolResult) -> String + Send + Sync>;

/// The default placeholder of a cleared result of `tool`.
///
/// ```
/// use tower_agent_layers::clear::default_placeholder;
///
/// assert_eq!(
///     default_placeholder("search"),
///     "[cleared to save context: this result of `search` is no longer shown; if you need it \
///      again and the call only reads, call `search` again]"
/// );
/// ```
pub fn default_placeholder(tool: &str) -> String {
    format!(
        "[cleared to save context: this result of `{tool}` is no longer shown; if you need it \
         again and the call only reads, call `{tool}` again]"
    )
}

/// Applies [`ClearToolResults`]; see the [module docs](self).
#[derive(Clone)]
pub struct ClearToolResultsLayer {
    config: Arc<Config>,
}

#[derive(Clone)]
struct Config {
    trigger: usize,
    keep: usize,
    batch: usize,
    /// Clear only when it frees at least this many tokens.
    at_least: usize,
    /// Also clear the cleared results' calls' arguments.
    inputs: bool,
    exclude: HashSet<String>,
    placeholder: Placeholder,
    counter: Arc<dyn TokenCounter>,
    /// Where a run keeps what the layer sent last.
    key: ExtensionKey<Arc<Mutex<RunMemo>>>,
}

impl Default for ClearToolResultsLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl ClearToolResultsLayer {
    /// Clear all but the newest 3 results, 10 at a time, once a request counts 100,000 tokens.
    pub fn new() -> Self {
        Self {
            config: Arc::new(Config {
                trigger: 100_000,
                keep: 3,
                batch: 10,
                at_least: 0,
                inputs: false,
                exclude: HashSet::new(),
                placeholder: Arc::new(|result: &ToolResult| default_placeholder(&result.name)),
                counter: Arc::new(CharEstimate),
                key: ExtensionKey::new(),
            }),
        }
    }

    fn with(mut self, edit: impl FnOnce(&mut Config)) -> Self {
        let config = Arc::make_mut(&mut self.config);
        edit(config);
        // A reconfigured layer is another layer: it never reuses what this one sent.
        config.key = ExtensionKey::new();
        self
    }

    /// Clear only when the request, before the edit, counts at least `tokens` (0: always).
    pub fn trigger(self, tokens: usize) -> Self {
        self.with(|c| c.trigger = tokens)
    }

    /// Keep the newest `results` results that could be cleared whole (3 by default).
    pub fn keep(self, results: usize) -> Self {
        self.with(|c| c.keep = results)
    }

    /// Clear results `n` at a time (at least 1; 10 by default), so that the edited part of the
    /// request, and the provider's cached prefix, stay the same for `n` rounds of one call.
    ///
    /// **This differs from LangChain and Anthropic**, which clear every result but the newest
    /// `keep` as soon as the trigger is reached: here nothing is cleared until `keep + n`
    /// results qualify, and then `n` at a time. `batch(1)` is their behaviour (and the right
    /// one for a provider without a prompt cache); see the module docs for what batching saves.
    pub fn batch(self, n: usize) -> Self {
        self.with(|c| c.batch = n.max(1))
    }

    /// Clear only when the edit frees at least `tokens` (counted with the layer's counter):
    /// LangChain's and Anthropic's `clear_at_least`, so that a cleared prefix (and a cache
    /// write) is paid only for a real saving. 0 by default.
    pub fn clear_at_least(self, tokens: usize) -> Self {
        self.with(|c| c.at_least = tokens)
    }

    /// Also clear the arguments of the calls whose results are cleared (`{}` instead):
    /// LangChain's `clear_tool_inputs`. Off by default: the arguments tell the model what it
    /// asked, and are usually short.
    pub fn clear_inputs(self, clear: bool) -> Self {
        self.with(|c| c.inputs = clear)
    }

    /// Never clear the results of `tool`. Add once per tool.
    pub fn exclude(self, tool: impl Into<String>) -> Self {
        let tool = tool.into();
        self.with(|c| {
            c.exclude.insert(tool);
        })
    }

    /// What a cleared result says instead ([`default_placeholder`] of its tool by default).
    /// It keeps the result's call id, tool name and error flag.
    pub fn placeholder<F>(self, placeholder: F) -> Self
    where
        F: Fn(&ToolResult) -> String + Send + Sync + 'static,
    {
        self.with(|c| c.placeholder = Arc::new(placeholder))
    }

    /// Count the trigger with `counter` ([`CharEstimate`] by default).
    pub fn counter(self, counter: impl TokenCounter) -> Self {
        self.with(|c| c.counter = Arc::new(counter))
    }
}

impl fmt::Debug for ClearToolResultsLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let mut exclude: Vec<&String> = c.exclude.iter().collect();
        exclude.sort();
        f.debug_struct("ClearToolResultsLayer")
            .field("trigger", &c.trigger)
            .field("keep", &c.keep)
            .field("batch", &c.batch)
            .field("clear_at_least", &c.at_least)
            .field("clear_inputs", &c.inputs)
            .field("exclude", &exclude)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ClearToolResultsLayer {
    type Service = ClearToolResults<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClearToolResults {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// Replaces older tool results with placeholders in each model request, then calls the inner
/// model service; see the [module docs](self).
///
/// `poll_ready` and the response future are the inner service's.
#[derive(Clone)]
pub struct ClearToolResults<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> ClearToolResults<S> {
    /// Wrap `inner` with the configuration of `layer`.
    pub fn new(inner: S, layer: &ClearToolResultsLayer) -> Self {
        layer.layer(inner)
    }

    /// A layer for this service, with the defaults.
    pub fn layer() -> ClearToolResultsLayer {
        ClearToolResultsLayer::new()
    }

    tower_agent_core::inner_service_accessors!();
}

impl<S: fmt::Debug> fmt::Debug for ClearToolResults<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClearToolResults")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> Service<ModelRequest> for ClearToolResults<S>
where
    S: Service<ModelRequest>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: ModelRequest) -> Self::Future {
        if let Some(edited) = edit(&self.config, &req) {
            req.messages = edited;
        }
        self.inner.call(req)
    }
}

/// One result of a history: the message it is in, its place among the message's parts, and
/// the assistant message its call is in.
type Slot = (usize, usize, usize);

/// What the layer keeps for a run: the count of its requests, and what it sent last.
#[derive(Default)]
struct RunMemo {
    counted: RunningCount,
    sent: Option<Memo>,
}

/// What the layer sent last in a run: the history it edited (where it stood), the results it
/// cleared, and the edited history (taken out for the next round, so that appending to it
/// copies nothing once the request that held it is gone).
struct Memo {
    source: HistoryMark,
    cleared: Arc<[Slot]>,
    edited: History,
}

/// The request's history with the results to clear replaced, or `None` when nothing is
/// cleared.
fn edit(config: &Config, req: &ModelRequest) -> Option<History> {
    // A summary asked in the stack is written from the whole results.
    if req.ctx.is_side_call() {
        return None;
    }
    let run = req
        .ctx
        .extension_at_or_insert_with(&config.key, Default::default);
    let mut run = run.lock().unwrap_or_else(PoisonError::into_inner);
    // Counted as the request came, so that the layer does not flip between whole and cleared.
    if config.trigger > 0 && run.counted.count(&*config.counter, req) < config.trigger {
        return None;
    }
    let cleared: Arc<[Slot]> = to_clear(config, &req.messages).into();
    if cleared.is_empty() {
        return None;
    }
    let reuse = run.sent.take().and_then(|memo| {
        let added = req.messages.since(&memo.source)?;
        (memo.cleared == cleared).then(|| {
            let mut edited = memo.edited;
            edited.extend(added.iter().cloned());
            edited
        })
    });
    let edited = reuse.unwrap_or_else(|| {
        let mut edited = req.messages.clone();
        let first = cleared[0].2;
        let tail = edited.tail_mut(first);
        for &(message, part, asked) in cleared.iter() {
            let Some(ContentPart::ToolResult(result)) = tail[message - first].content.get_mut(part)
            else {
                continue;
            };
            result.content = (config.placeholder)(result);
            if config.inputs {
                let id = result.call_id.clone();
                for content in &mut tail[asked - first].content {
                    match content {
                        ContentPart::ToolCall(call) if call.id == id => {
                            call.arguments = "{}".to_owned();
                        }
                        _ => {}
                    }
                }
            }
        }
        edited
    });
    tracing::debug!(cleared = cleared.len(), "tool results cleared");
    run.sent = Some(Memo {
        source: req.messages.mark(),
        cleared,
        edited: edited.clone(),
    });
    Some(edited)
}

/// The results to clear, in history order: the ones that qualify, but the newest `keep`,
/// rounded down to a whole number of batches, and only those longer than their placeholder.
fn to_clear(config: &Config, history: &History) -> Vec<Slot> {
    let mut qualify = Vec::new();
    for block in history.call_blocks() {
        if block.unanswered().next().is_some() {
            // A call of this batch still waits: the batch stays as it is.
            continue;
        }
        for (offset, message) in block.results.iter().enumerate() {
            for (part, content) in message.content.iter().enumerate() {
                let ContentPart::ToolResult(result) = content else {
                    continue;
                };
                let answers = block.message.tool_calls().any(|c| c.id == result.call_id);
                if answers && !config.exclude.contains(&result.name) {
                    qualify.push(((block.index + 1 + offset, part, block.index), result));
                }
            }
        }
    }
    let aged = qualify.len().saturating_sub(config.keep);
    let aged = aged - aged % config.batch;
    let cleared: Vec<(Slot, &ToolResult)> = qualify[..aged]
        .iter()
        .filter(|(_, result)| result.content.len() > (config.placeholder)(result).len())
        .copied()
        .collect();
    if config.at_least > 0 {
        let freed: usize = cleared
            .iter()
            .map(|(_, result)| {
                let counter = &config.counter;
                let placeholder = (config.placeholder)(result);
                counter
                    .count_text(&result.content)
                    .saturating_sub(counter.count_text(&placeholder))
            })
            .sum();
        if freed < config.at_least {
            return Vec::new();
        }
    }
    cleared.into_iter().map(|(slot, _)| slot).collect()
}

/// Clearing on the model, right inside summarization: the summarizer folds the whole results,
/// the model is sent the cleared ones.
impl tower_agent_loop::Builtin for ClearToolResultsLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::ModelSlot;
        stacks.model(ModelSlot::Clear, self);
    }
}

#[cfg(test)]
mod tests;
