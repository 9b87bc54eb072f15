//! Retry for model (and tool) calls: tower's own `Retry` middleware with [`RetryPolicy`],
//! guarded so that nothing is called once the run is cancelled
//! (`ServiceBuilder::new().layer(RetryLayer::new(RetryPolicy::new()))`, or [`RetryLayer`]).
//!
//! What is retried, and how long it waits:
//!
//! | error kind | retried | wait |
//! |---|---|---|
//! | `RateLimited { .. }`, `Overloaded { .. }` | yes, 10 calls in all by default ([`RetryPolicy::max_attempts`]) | the provider's wait when it gave one, else the backoff |
//! | `Server`, `Timeout` | yes, 3 calls in all by default ([`RetryPolicy::server_attempts`]) | the backoff |
//! | `Unreachable` (a refused connection: nothing was sent) | yes, 2 calls in all by default ([`RetryPolicy::unreachable_attempts`]): a server that is not running fails the run in 1–3 s | the backoff |
//! | `EmptyResponse` (Gemini's empty candidates) | yes, as `Server` (3 calls), with the last message nudged (a `.` appended) | the backoff |
//! | `ContextTooLong` | no: returned, for a summarize-and-retry layer outside | — |
//! | `InvalidResponse` (an answer that arrived but cannot be read) | no: it would be paid for again | — |
//! | `Auth`, `BadRequest`, `QuotaExhausted`, `Cancelled`, anything else | no | — |
//!
//! The backoff doubles from [`RetryPolicy::base`] (1 s), plus a random jitter of up to
//! [`RetryPolicy::jitter`] (2 s), and never passes [`RetryPolicy::max_delay`] (60 s). A
//! deterministic refusal (a 400, a 422, a 5xx whose body says the request is invalid: the
//! providers classify it `BadRequest`) costs one call. The jitter is drawn anew for every
//! wait of every request, so requests that failed together do not retry in lockstep. A
//! [`TpsBudget`] shared by every clone ([`RetryPolicy::throttle`]) bounds retries to a share of
//! successful calls, so a fleet of agents does not multiply an outage. Before each wait the
//! request's stream restarts ([`Retryable::restart`]): the filters of the layers outside the
//! retry forget what they saw, and stream readers that got deltas of the failed attempt get an
//! [`Event::Retract`] telling them to discard them; then an [`Event::Retrying`] says why.
//!
//! A cancelled run ends the wait at once, and nothing is called after it: the inner service
//! is not called again once the request's cancellation token fired, and the call fails with
//! a `Cancelled` error (in an agent, the run ends `Cancelled`).
//!
//! **What is safe to replay.** The three providers' APIs (OpenAI Chat Completions and
//! compatible servers, Anthropic Messages, Gemini `generateContent`) keep no state between
//! calls: a request the provider may have run before failing (a 5xx after the body was sent, a
//! stream that broke off) changes nothing on its side when sent again, and costs its tokens
//! again. So every transient error is replayed. An API that stores what a call did (OpenAI's
//! Responses API with `store: true`, an assistant thread) is not safe to replay blindly; none
//! of the providers here speaks one. A call whose stream already reached readers is replayed
//! too, after an [`Event::Retract`] that tells them to discard what they got; a reader that
//! cannot take text back sets [`RetryPolicy::replay_streamed`] to `false`.
//!
//! An interrupt is an outcome (a tool's `Ok` response), never an error: the policy never sees
//! one, so a tool that asks a human is never run twice by a retry.
//!
//! Place it innermost, right around the provider (see the canonical stack in
//! `docs/ordering.md`): everything inside a retry runs again on each attempt.
//!
//! # Timeouts
//!
//! The providers time out a stalled stream on their own (`idle_timeout`). For a bound on a
//! whole call, put tower's `Timeout` inside the retry: the retry layer turns any error of the
//! service inside into an [`Error`] (tower's `Elapsed` into a [`ErrorKind::Timeout`]), so a
//! timed-out attempt is retried like any other timeout:
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_agent_core::{Error, ErrorKind, ModelRequest, ModelResponse};
//! use tower_agent_layers::RetryLayer;
//! use tower_agent_layers::retry::RetryPolicy;
//! use tower_agent_test::ScriptedModel;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Error> {
//! let model = ScriptedModel::with_results([
//!     Err(Error::rate_limited(Some(Duration::from_secs(3)), "slow down")),
//!     Ok(ModelResponse::text("ok")),
//! ]);
//! let mut service = ServiceBuilder::new()
//!     .layer(RetryLayer::new(RetryPolicy::new()))
//!     .timeout(Duration::from_secs(300)) // each attempt at most 5 minutes
//!     .service(model.clone());
//! let res = service.ready().await?.call(ModelRequest::new(vec![])).await?;
//! assert_eq!(res.message.text(), "ok");
//! assert_eq!(model.request_count(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! [`Event::Retrying`]: tower_agent_core::Event::Retrying
//! [`Event::Retract`]: tower_agent_core::Event::Retract

mod policy;
mod service;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tower::retry::budget::TpsBudget;
use tower_agent_core::{
    ContentPart, ErrorKind, Message, ModelRequest, Role, RunContext, ToolRequest,
};

#[cfg(doc)]
use tower_agent_core::Error;

pub use service::{ResponseFuture, Retry, RetryLayer};

/// A request the policy can retry: it has a run context, and may be changed before an attempt.
pub trait Retryable: Clone {
    /// The run the request belongs to (for events and cancellation).
    fn ctx(&self) -> &RunContext;

    /// Change the request after the provider answered with nothing
    /// ([`ErrorKind::EmptyResponse`]); by default nothing changes.
    fn nudge(&mut self) {}

    /// Get ready for the call to be made again, before the wait: a model request restarts
    /// its stream ([`ModelRequest::restart_stream`]: the layers' filters forget, readers given
    /// deltas get an [`Event::Retract`]). By default nothing.
    ///
    /// [`Event::Retract`]: tower_agent_core::Event::Retract
    fn restart(&self) -> Restart {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Whether the failed call had already given readers part of its answer (a model
    /// request's [`Deltas::delivered`]). By default no.
    ///
    /// [`Deltas::delivered`]: tower_agent_core::stream::Deltas::delivered
    fn delivered(&self) -> bool {
        false
    }

    /// Whether a call that failed with `kind` may be made again: by default yes. A tool
    /// request says no after a failure that may have reached the tool (a timeout, a server
    /// error, an empty answer) when its tool may not repeat ([`RunTools`]): a second call could
    /// repeat its effect. A failure that never reached it (unreachable, rate-limited,
    /// overloaded) is always tried again, and so is a recovery
    /// ([`ToolRequest::recover`]: it only asks).
    ///
    /// [`RunTools`]: tower_agent_core::RunTools
    fn may_try_again(&self, kind: &ErrorKind) -> bool {
        let _ = kind;
        true
    }
}

/// What [`Retryable::restart`] returns.
pub type Restart = Pin<Box<dyn Future<Output = Result<(), tower_agent_core::Error>> + Send>>;

impl Retryable for ModelRequest {
    fn ctx(&self) -> &RunContext {
        &self.ctx
    }

    /// Append a `.` to the text of the last message (a known cure for Gemini's empty
    /// candidates); the session is not changed.
    fn nudge(&mut self) {
        let Some(last) = self.messages.make_mut().last_mut() else {
            return;
        };
        match last.content.iter_mut().rev().find_map(|p| match p {
            ContentPart::Text { text } => Some(text),
            _ => None,
        }) {
            Some(text) => text.push('.'),
            None if last.role == Role::User => {
                last.content.push(ContentPart::Text { text: ".".into() })
            }
            None => self.messages.push(Message::user(".")),
        }
    }

    fn restart(&self) -> Restart {
        let (deltas, ctx) = (self.deltas.clone(), self.ctx.clone());
        Box::pin(async move { deltas.restart(&ctx).await })
    }

    fn delivered(&self) -> bool {
        self.deltas.delivered()
    }
}

impl Retryable for ToolRequest {
    fn ctx(&self) -> &RunContext {
        &self.ctx
    }

    fn may_try_again(&self, kind: &ErrorKind) -> bool {
        let reached = matches!(
            kind,
            ErrorKind::Server | ErrorKind::Timeout | ErrorKind::EmptyResponse
        );
        // A recovery only asks what became of a call: asking again repeats nothing.
        !reached
            || self.recover
            || tower_agent_core::RunTools::of(&self.ctx)
                .and_then(|tools| tools.may_repeat(&self.call.name))
                .unwrap_or(true)
    }
}

/// How to retry: attempts, backoff, jitter, a throttle; see the [module docs](self). Apply it with
/// [`RetryLayer`] (`.layer(RetryLayer::new(policy))`).
///
/// Cloning is cheap; clones share the throttle and the source of the jitter.
#[derive(Clone)]
pub struct RetryPolicy {
    max_attempts: u32,
    server_attempts: u32,
    unreachable_attempts: u32,
    base: Duration,
    max_delay: Duration,
    jitter: Duration,
    throttle: Option<Arc<TpsBudget>>,
    /// Whether a call whose stream delivered deltas is called again.
    replay_streamed: bool,
    /// The state of the jitter's random numbers, advanced by every draw of every clone.
    random: Arc<AtomicU64>,
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("server_attempts", &self.server_attempts)
            .field("unreachable_attempts", &self.unreachable_attempts)
            .field("base", &self.base)
            .field("max_delay", &self.max_delay)
            .field("jitter", &self.jitter)
            .field("throttle", &self.throttle.is_some())
            .field("replay_streamed", &self.replay_streamed)
            .finish_non_exhaustive()
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// At most 10 calls when the provider is rate limited or overloaded (it says when to come
    /// back), 3 when it failed (a 5xx, a timeout, an empty answer), 2 when it could not be
    /// reached; backoff from 1 s doubling, jitter up to 2 s, every wait at most 60 s, a throttle
    /// of retries at 20% of the successful calls over 10 s (at least one retry per second).
    pub fn new() -> Self {
        Self {
            max_attempts: 10,
            server_attempts: 3,
            unreachable_attempts: 2,
            base: Duration::from_secs(1),
            max_delay: Duration::from_secs(60),
            jitter: Duration::from_secs(2),
            throttle: Some(Arc::new(TpsBudget::new(Duration::from_secs(10), 1, 0.2))),
            replay_streamed: true,
            random: Arc::new(AtomicU64::new(std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                0_u8,
            ))),
        }
    }

    /// The most calls for one request, the first included (at least 1), whatever the error:
    /// sets [`server_attempts`](Self::server_attempts) and
    /// [`unreachable_attempts`](Self::unreachable_attempts) too (set them after it to differ).
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts.max(1);
        self.server_attempts = self.max_attempts;
        self.unreachable_attempts = self.max_attempts;
        self
    }

    /// The most calls for one request when the provider failed (`Server`: a 5xx or a broken
    /// answer; `Timeout`; `EmptyResponse`), the first included (at least 1). Default 3: a
    /// failing server rarely recovers within a few seconds, and each attempt may be paid.
    pub fn server_attempts(mut self, attempts: u32) -> Self {
        self.server_attempts = attempts.max(1);
        self
    }

    /// The most calls for one request when the provider could not be reached
    /// (`Unreachable`: a refused connection, no route), the first included (at least 1).
    /// Default 2: a server that is not running fails the run within a few seconds (one wait
    /// of the backoff), and says so, instead of minutes of silence.
    pub fn unreachable_attempts(mut self, attempts: u32) -> Self {
        self.unreachable_attempts = attempts.max(1);
        self
    }

    /// The first backoff.
    pub fn base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// The longest backoff, jitter included (the provider's own wait is not capped: it knows
    /// when it will answer again).
    pub fn max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// The most random time added to a backoff; zero for exact waits.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// Throttle retries with tower's `TpsBudget`, shared by every clone of this policy (retries
    /// stop when they pass its share of the calls); `None` for no throttle.
    pub fn throttle(mut self, throttle: Option<TpsBudget>) -> Self {
        self.throttle = throttle.map(Arc::new);
        self
    }

    /// Whether a call whose stream had given readers deltas before it failed
    /// ([`Retryable::delivered`]: text that went up, not what a filter still held back) is
    /// called again (yes by default: readers are told to discard what they got,
    /// [`Event::Retract`]). With `false` the error is returned: for a reader that cannot take
    /// text back (a terminal, a speech synthesizer).
    ///
    /// [`Event::Retract`]: tower_agent_core::Event::Retract
    pub fn replay_streamed(mut self, replay: bool) -> Self {
        self.replay_streamed = replay;
        self
    }
}
