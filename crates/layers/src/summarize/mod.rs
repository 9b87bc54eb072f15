//! Summarization: when the history passes a budget, older messages are replaced by a summary
//! that a (cheap) model writes, committed to the session; when the provider says the context
//! is too long, shrink the request until it fits.
//!
//! On the model service, outside the user's `before_model` and the patch (position 6 of the
//! canonical stack in `docs/ordering.md`). Before each model call it counts the request's
//! tokens (see [Counting](#counting)) and checks its [`Trigger`]s. When any fires:
//!
//! 1. With [`SummarizeLayer::truncate_arguments`], long string values in the tool-call
//!    arguments of the older messages (a file written in full) are cut, with a marker. If
//!    that alone brings the request under every trigger, that is all (unless the history is
//!    not valid: it is then summarized, which folds the broken part).
//! 2. The older messages (all but those [`Keep`] keeps) go to the summarizer, the previous
//!    summary first (clipped to the summary bound), and are replaced by one
//!    [`summary_message`]. The cut never separates an assistant message from the results of
//!    its calls (a batch of ten parallel calls is kept or summarized whole) and never splits a
//!    message, so reasoning stays with its message. A batch only partly answered (a result
//!    never came, or came after another message) is summarized whole, with what came of it:
//!    the cut moves past it, and the kept part is always a valid history on its own (its last
//!    calls aside, which may still wait for a decision or a tool still running; a batch that
//!    ends the history is kept whole). When there is nothing to summarize, nothing is; when no
//!    cut leaves a valid kept part (the newest messages are broken themselves), an
//!    [`Event::Warning`] says so and nothing is summarized. Under [`SummarizeLayer::max_input_tokens`], messages that do not fit one
//!    summarizer call are summarized in turn, each call folding the next ones into the summary
//!    so far; a summarizer that answers "context too long" gets its input in halves.
//! 3. The summarizer's answer is bounded: its request carries `max_tokens`
//!    ([`SummarizeLayer::max_summary_tokens`]; by default half of what it replaces, between
//!    64 and 4,096). A summary that is not smaller than what it replaces is **never
//!    committed**: an [`Event::Warning`] says so and the history stays as it was.
//! 4. The new history is committed to the session in the response
//!    ([`ModelResponse::history`]; in the error, [`Error::history`], when the call fails): the
//!    next round sends it as it is, and the next summarization summarizes this summary and
//!    the newer messages, not the archive again. A [`Summarized`] event tells observers.
//! 5. With [`SummarizeLayer::offload`], the summarized messages are first appended, whole,
//!    to `/conversation_history/{session}.md` in a storage backend, so nothing is lost; a
//!    storage failure is an [`Event::Warning`], and the run goes on.
//!
//! A summarization that saved little (under a tenth of the request) or was not committed is
//! not tried again every round: the triggers rest until the request has grown by a tenth.
//!
//! **Context overflow.** When the call fails with [`ErrorKind::ContextTooLong`] (tower's
//! `Retry` with `RetryPolicy` returns that kind at once, for this layer), the request is shrunk
//! step by step and tried again after each step, whatever the triggers say:
//!
//! 1. the older messages are summarized keeping half as much, then half of that, down to the
//!    newest message (or the newest call with its results);
//! 2. then the tool results and call arguments of the kept messages are clipped, to 2,000,
//!    then 500, then 100 characters;
//! 3. then the summary is cut in half, up to three times, and at last dropped (an
//!    [`Event::Warning`] says so), leaving only the newest messages;
//! 4. when even that does not fit, the call fails with a `ContextTooLong` error that says
//!    what does not fit (the system prompt, the tool specs and the newest messages, with their
//!    estimated tokens).
//!
//! Each step is committed, and the session remembers the size that overflowed
//! (`overflow_at_tokens` in its state under `tower_agent.summarization`): a later request that
//! large is shrunk the same way before it is sent, instead of being refused again. The size
//! stays with the session: a host that moves it to a model with a larger window removes that
//! entry. A run on
//! this layer therefore either completes or fails with that error; it never leaves a session
//! that fails the same way on every later turn. ([`SummarizeLayer::recover_overflow`] turns
//! the recovery off.)
//!
//! # Counting
//!
//! The layer counts with its [`TokenCounter`] ([`CharEstimate`] by default: a quarter token
//! per ASCII character, one per other character). That estimate can be far off a real
//! tokenizer: against SmolLM2's it counts 17% low on English prose, 53% low on JSON, 38% low on
//! Chinese (the table in [`tokens`](crate::tokens)). So when the provider reported the usage of
//! the previous call of the run, the layer counts that call's request and answer as the
//! provider did (`input_tokens + output_tokens`; a reasoning model's hidden reasoning is in
//! its output tokens, so this errs on the side of summarizing early) and estimates only the
//! messages added since. The first call of a run, and a history a layer rewrote, are
//! estimated.
//!
//! # The summarizer: apart, or in the stack
//!
//! [`SummarizeLayer::new`] takes a model of its own (a cheaper one will do), asked with the
//! messages rendered as text. [`SummarizeLayer::in_stack`] asks the model below the layer,
//! with the request's own prefix (system prompt, tools, the messages to summarize as sent)
//! and the prompt as a last user message: the provider's prompt cache serves that prefix,
//! which was sent for the rounds before (see the facade's `docs/cost.md`).
//!
//! # Retrying the summarizer
//!
//! The summarizer is any model service: give it the same retry as the agent's model, so a
//! connection refused or a 429 does not fail the run at once (one line):
//!
//! ```
//! # #[cfg(feature = "retry")]
//! # {
//! use tower::ServiceBuilder;
//! use tower_agent_layers::RetryLayer;
//! use tower_agent_layers::retry::RetryPolicy;
//! use tower_agent_layers::summarize::SummarizeLayer;
//! # let cheap_model = tower_agent_test::ScriptedModel::new([]);
//!
//! let layer =
//!     SummarizeLayer::new(ServiceBuilder::new().layer(RetryLayer::new(RetryPolicy::new())).service(cheap_model));
//! # let _ = layer;
//! # }
//! ```
//!
//! ```
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_agent_core::{Error, Message, ModelRequest, ModelResponse};
//! use tower_agent_layers::summarize::{is_summary, Keep, SummarizeLayer, Trigger};
//! use tower_agent_test::ScriptedModel;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let summarizer = ScriptedModel::new([ModelResponse::text("The user asked about cats.")]);
//! let model = ScriptedModel::new([ModelResponse::text("Cats sleep a lot.")]);
//! let mut service = ServiceBuilder::new()
//!     .layer(
//!         SummarizeLayer::new(summarizer.clone())
//!             .trigger(Trigger::messages(6))
//!             .keep(Keep::messages(2)),
//!     )
//!     .service(model.clone());
//!
//! let history: Vec<Message> = (0..6)
//!     .map(|i| if i % 2 == 0 { Message::user(format!("question {i} about cats and dogs")) } else { Message::assistant(format!("answer {i}: they differ")) })
//!     .collect();
//! let req = ModelRequest::new(history);
//! let res = service.ready().await?.call(req).await?;
//!
//! // The model saw the summary and the two newest messages; the response commits the same.
//! let seen = &model.requests()[0].messages;
//! assert_eq!(seen.len(), 3);
//! assert!(is_summary(&seen[0]));
//! assert_eq!(seen[1].text(), "question 4 about cats and dogs");
//! assert_eq!(res.history.as_deref(), Some(seen.as_slice()));
//! // The summarizer's answer was bounded: with its frame, the summary message must be
//! // smaller than the four messages (44 estimated tokens) it replaces.
//! let bound = summarizer.requests()[0].options.max_tokens.expect("bounded");
//! assert!(bound < 44, "{bound}");
//! # Ok(())
//! # }
//! ```
//!
//! # Errors
//!
//! A summarizer that fails (or answers with no text) does not fail the call: an
//! [`Event::Warning`] says "summarization failed: ...", nothing is committed, the call goes
//! on with the history as it was, and the triggers rest until the request has grown by a
//! tenth (a summarizer that refuses every request, say an o-series model refusing
//! `max_tokens`, would otherwise fail every round). If the provider then says the context is
//! too long, the recovery goes on without summaries (clipping, cutting, dropping), and its
//! error says the summarizer failed. An overflow that no shrinking cures is a
//! `ContextTooLong` error naming what does not fit. A cancelled run, a failing observer and
//! the inner service's own errors pass through.
//!
//! # Panics
//!
//! [`SummarizeLayer::trigger`] panics on a trigger that would fire on every call or never
//! (`Trigger::tokens(0)`, `Trigger::messages(0)`, a fraction outside `(0, 1]`, a window of 0):
//! a programming error, found when the layer is built.
//!
//! [`ModelResponse::history`]: tower_agent_core::ModelResponse::history
//! [`Error::history`]: tower_agent_core::Error::history
//! [`Event::Warning`]: tower_agent_core::Event::Warning
//! [`ErrorKind::ContextTooLong`]: tower_agent_core::ErrorKind::ContextTooLong

mod cut;
mod history;
mod service;
mod shorten;

use std::fmt;
use std::sync::Arc;

use tower_agent_core::{Error, ModelRequest, ModelResponse, SideModel};
use tower_agent_storage::Storage;
use tower_layer::Layer;
use tower_service::Service;

use crate::tokens::{CharEstimate, TokenCounter};

use history::Slots;
pub use history::{SUMMARY_CLOSE, SUMMARY_OPEN, is_summary, summary_message, summary_text};
pub use service::{ResponseFuture, Summarize};

/// Older messages of the history were replaced by a summary, committed to the session: an
/// event of this layer ([`Event::Layer`](tower_agent_core::Event::Layer), read with
/// [`Event::downcast_ref`](tower_agent_core::Event::downcast_ref)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Summarized {
    /// The round whose model call triggered it.
    pub round: u32,
    /// The messages replaced by the summary (a previous summary among them).
    pub summarized: usize,
    /// The recent messages kept as they were.
    pub kept: usize,
    /// The estimated tokens of the request before.
    pub tokens_before: usize,
    /// The estimated tokens of the request after.
    pub tokens_after: usize,
}

impl tower_agent_core::LayerEvent for Summarized {
    const NAME: &'static str = "summarized";
}

impl std::fmt::Display for Summarized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("older messages were summarized")
    }
}

/// When to summarize: any trigger of a layer that is reached fires.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Trigger {
    /// The request's estimated tokens reach this many.
    Tokens(usize),
    /// The history holds this many messages.
    Messages(usize),
    /// The request's estimated tokens reach this share of the model's context window.
    Fraction {
        /// The share, e.g. `0.8`.
        fraction: f64,
        /// The model's context window, in tokens.
        window: usize,
    },
}

impl Trigger {
    /// Fire at `n` estimated tokens.
    pub fn tokens(n: usize) -> Self {
        Trigger::Tokens(n)
    }

    /// Fire at `n` messages.
    pub fn messages(n: usize) -> Self {
        Trigger::Messages(n)
    }

    /// Fire at `fraction` of a context window of `window` tokens.
    pub fn fraction(fraction: f64, window: usize) -> Self {
        Trigger::Fraction { fraction, window }
    }

    /// Why this trigger would fire on every call or never, if it would.
    fn problem(&self) -> Option<&'static str> {
        match *self {
            Trigger::Tokens(0) => Some("`Trigger::tokens(0)` would fire on every call"),
            Trigger::Messages(0) => Some("`Trigger::messages(0)` would fire on every call"),
            Trigger::Fraction { window: 0, .. } => {
                Some("`Trigger::fraction` with a window of 0 tokens would fire on every call")
            }
            Trigger::Fraction { fraction, .. } if !(fraction > 0.0 && fraction <= 1.0) => Some(
                "`Trigger::fraction` takes a share in (0, 1]: at 0 or below it would fire on \
                 every call, above 1 never",
            ),
            _ => None,
        }
    }

    fn fires(&self, tokens: usize, messages: usize) -> bool {
        match *self {
            Trigger::Tokens(n) => tokens >= n,
            Trigger::Messages(n) => messages >= n,
            Trigger::Fraction { fraction, window } => tokens as f64 >= fraction * window as f64,
        }
    }
}

/// What a summarization keeps as it was: the most recent messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Keep {
    /// The last `n` messages (at least one, so the newest message is never summarized; more
    /// when the cut would split a call from its results).
    Messages(usize),
    /// The last messages that hold at most this many estimated tokens (at least one).
    Tokens(usize),
}

impl Keep {
    /// Keep the last `n` messages.
    pub fn messages(n: usize) -> Self {
        Keep::Messages(n)
    }

    /// Keep the last messages within `n` tokens.
    pub fn tokens(n: usize) -> Self {
        Keep::Tokens(n)
    }
}

/// The summarizer's instructions unless replaced with [`SummarizeLayer::prompt`].
pub const DEFAULT_PROMPT: &str = "You summarize the earlier part of a conversation between a \
user and an AI agent that uses tools, so that the agent can go on with the work without it. \
Keep the user's goals and requests, the decisions made, the facts learned (names, paths, \
numbers, identifiers), what each tool call did and found, the errors met and how they were \
handled, and what remains to be done. If a summary so far is given, fold it in. Do not invent \
anything. Answer with the summary only.";

#[derive(Clone)]
pub(crate) struct Config {
    /// The model that writes summaries; `None`: the model below this layer, asked with the
    /// request's own prefix ([`SummarizeLayer::in_stack`]).
    pub(crate) summarizer: Option<SideModel>,
    pub(crate) triggers: Vec<Trigger>,
    pub(crate) keep: Keep,
    pub(crate) counter: Arc<dyn TokenCounter>,
    pub(crate) prompt: Arc<str>,
    pub(crate) offload: Option<Arc<dyn Storage>>,
    pub(crate) truncate: Option<usize>,
    pub(crate) recover: bool,
    pub(crate) max_input: Option<usize>,
    pub(crate) max_summary: Option<usize>,
    /// Where this layer keeps its counts in a run: a changed configuration is another layer.
    pub(crate) slots: Slots,
}

/// Applies [`Summarize`]; see the [module docs](self).
///
/// Defaults: one trigger at 100,000 tokens (until [`SummarizeLayer::trigger`] adds the
/// first), keep the last 20 messages, [`CharEstimate`], [`DEFAULT_PROMPT`], no offload, no
/// argument truncation, overflow recovery on, no bound on one summarizer call's input, a
/// summary of at most half of what it replaces (between 64 and 4,096 tokens).
#[derive(Clone)]
pub struct SummarizeLayer {
    config: Arc<Config>,
    default_trigger: bool,
}

impl SummarizeLayer {
    /// The tokens of the default trigger.
    pub const DEFAULT_TOKENS: usize = 100_000;
    /// The messages kept by default.
    pub const DEFAULT_KEEP: usize = 20;
    /// The fewest tokens a summary may take when its bound is derived from what it replaces.
    pub const MIN_SUMMARY_TOKENS: usize = 64;
    /// The most tokens a summary may take when its bound is derived from what it replaces.
    pub const MAX_SUMMARY_TOKENS: usize = 4_096;

    /// Summaries written by `summarizer`: any model service (a cheap one will do; boxed as a
    /// `BoxCloneService` or not, it need not be `Sync`). It gets the prompt as its system
    /// instructions, the messages as one user message and a `max_tokens`, with a context of
    /// its own (its text does not stream into the run's events), sharing the run's
    /// cancellation.
    pub fn new<M>(summarizer: M) -> Self
    where
        M: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
        M::Future: Send + 'static,
    {
        Self::with_summarizer(Some(SideModel::new(summarizer)))
    }

    /// Summaries written by the model below this layer, through the same stack (retry,
    /// fallback), asked with the request's own prefix: its system prompt, its tools and the
    /// messages to summarize, as the agent sent them, then the prompt as a last user message.
    /// The provider's prompt cache serves that prefix (it was sent for earlier rounds) instead
    /// of a fresh request that shares nothing with them. The summary is bounded by
    /// `max_tokens`; the model is told not to call tools (a call, or no text, fails the
    /// summary, and the history is kept).
    ///
    /// When that request is too long for the model (the summary was asked because the
    /// context overflowed), the messages are summarized as [`SummarizeLayer::new`] does,
    /// rendered as text, in turn, by the same model.
    ///
    /// What to know:
    ///
    /// - The summary request goes through every layer below this one with a context of its
    ///   own (no run state, round 0, no events): a layer there that builds request content
    ///   from the context, answers, or counts calls acts on it too.
    /// - [`max_input_tokens`](Self::max_input_tokens) and the 2,000-character clip apply to
    ///   the rendered fallback only: the prefix goes as it was sent.
    /// - The response format is dropped and a forced tool choice relaxed to none (that
    ///   costs the cached history, not the summary).
    /// - The prefix was cached when it was last sent: about `keep / 2` rounds before. Rounds
    ///   further apart than the cache's lifetime (five minutes by default at Anthropic) miss
    ///   it; a one-hour lifetime keeps it.
    /// - The summary's tokens count in the run's usage, a fallback's attempts included.
    pub fn in_stack() -> Self {
        Self::with_summarizer(None)
    }

    fn with_summarizer(summarizer: Option<SideModel>) -> Self {
        Self {
            config: Arc::new(Config {
                summarizer,
                triggers: vec![Trigger::Tokens(Self::DEFAULT_TOKENS)],
                keep: Keep::Messages(Self::DEFAULT_KEEP),
                counter: Arc::new(CharEstimate),
                prompt: DEFAULT_PROMPT.into(),
                offload: None,
                truncate: None,
                recover: true,
                max_input: None,
                max_summary: None,
                slots: Slots::default(),
            }),
            default_trigger: true,
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Config)) -> Self {
        let config = Arc::make_mut(&mut self.config);
        f(config);
        config.slots = Slots::default();
        self
    }

    /// Add a trigger (the first one replaces the default).
    ///
    /// # Panics
    ///
    /// When `trigger` would fire on every call or never: `Trigger::tokens(0)`,
    /// `Trigger::messages(0)`, a fraction outside `(0, 1]` or a window of 0.
    pub fn trigger(self, trigger: Trigger) -> Self {
        if let Some(problem) = trigger.problem() {
            panic!("SummarizeLayer::trigger: {problem}");
        }
        let first = self.default_trigger;
        let mut this = self.edit(|c| {
            if first {
                c.triggers.clear();
            }
            c.triggers.push(trigger);
        });
        this.default_trigger = false;
        this
    }

    /// What to keep as it was.
    pub fn keep(self, keep: Keep) -> Self {
        self.edit(|c| c.keep = keep)
    }

    /// Count tokens with `counter` (a tokenizer) instead of [`CharEstimate`].
    pub fn counter(self, counter: impl TokenCounter) -> Self {
        let counter: Arc<dyn TokenCounter> = Arc::new(counter);
        self.edit(|c| c.counter = counter)
    }

    /// The summarizer's instructions.
    pub fn prompt(self, prompt: impl Into<Arc<str>>) -> Self {
        let prompt = prompt.into();
        self.edit(|c| c.prompt = prompt)
    }

    /// Append the summarized messages, whole, to `/conversation_history/{session}.md` in
    /// `storage` before they leave the history.
    pub fn offload(self, storage: impl Storage) -> Self {
        self.offload_shared(Arc::new(storage))
    }

    /// [`SummarizeLayer::offload`] to a backend shared with other layers.
    pub fn offload_shared(self, storage: Arc<dyn Storage>) -> Self {
        self.edit(|c| c.offload = Some(storage))
    }

    /// Before summarizing, cut string values of over `max_chars` characters in the tool-call
    /// arguments of the older messages (those not kept), with a marker; summarize only if
    /// the request still reaches a trigger.
    pub fn truncate_arguments(self, max_chars: usize) -> Self {
        self.edit(|c| c.truncate = Some(max_chars))
    }

    /// Bound what one summarizer call gets (the summary so far and the messages, counted by
    /// the layer's counter; the prompt is not counted) to `tokens`: when the messages to
    /// summarize do not fit, they are summarized in turn, oldest first, each call folding the
    /// next messages into the summary the previous call wrote. Nothing is cut: a single message
    /// over the bound goes alone, and while the summary so far alone is over it, each call
    /// takes one message. Unbounded by default: one call gets all the messages (each part
    /// clipped to 2,000 characters).
    pub fn max_input_tokens(self, tokens: usize) -> Self {
        self.edit(|c| c.max_input = Some(tokens.max(1)))
    }

    /// The most tokens one summary may take: the summarizer's `max_tokens`, and the most of a
    /// previous summary fed to the next summarizer call. By default, half of what the summary
    /// replaces, at least [`MIN_SUMMARY_TOKENS`](Self::MIN_SUMMARY_TOKENS) and at most
    /// [`MAX_SUMMARY_TOKENS`](Self::MAX_SUMMARY_TOKENS). Whatever the bound, the summarizer is
    /// never asked for more than would make the summary message as large as what it replaces,
    /// and a summary that is not smaller than that is not committed.
    pub fn max_summary_tokens(self, tokens: usize) -> Self {
        self.edit(|c| c.max_summary = Some(tokens.max(1)))
    }

    /// Whether a `ContextTooLong` error is answered by shrinking the request until it fits (on
    /// by default; see the [module docs](self)).
    pub fn recover_overflow(self, recover: bool) -> Self {
        self.edit(|c| c.recover = recover)
    }
}

impl Config {
    /// The most tokens a summary of messages holding `replaced` tokens may take.
    pub(crate) fn summary_bound(&self, replaced: usize) -> usize {
        self.max_summary.unwrap_or_else(|| {
            (replaced / 2).clamp(
                SummarizeLayer::MIN_SUMMARY_TOKENS,
                SummarizeLayer::MAX_SUMMARY_TOKENS,
            )
        })
    }

    /// How many of the last `messages` [`Keep`] keeps (at least one).
    pub(crate) fn keep_count(&self, messages: &[tower_agent_core::Message]) -> usize {
        match self.keep {
            Keep::Messages(n) => n.max(1),
            Keep::Tokens(n) => history::keep_for_tokens(messages, n, &*self.counter),
        }
    }
}

impl fmt::Debug for SummarizeLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        f.debug_struct("SummarizeLayer")
            .field("triggers", &c.triggers)
            .field("keep", &c.keep)
            .field("offload", &c.offload.is_some())
            .field("truncate_arguments", &c.truncate)
            .field("recover_overflow", &c.recover)
            .field("max_input_tokens", &c.max_input)
            .field("max_summary_tokens", &c.max_summary)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for SummarizeLayer {
    type Service = Summarize<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Summarize::from_config(inner, Arc::clone(&self.config))
    }
}

/// Summarization on the model, inside the instructions and tool selection, outside clearing.
impl tower_agent_loop::Builtin for SummarizeLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::ModelSlot;
        stacks.model(ModelSlot::Summarize, self);
    }
}
