//! Retry for model (and tool) calls: a [`tower::retry::Policy`], used with tower's own
//! `Retry` middleware (`ServiceBuilder::retry(RetryPolicy::new())`), not a new one.
//!
//! What is retried, and how long it waits:
//!
//! | error kind | retried | wait |
//! |---|---|---|
//! | `RateLimited`, `Overloaded` | yes | the provider's wait when it gave one, else the backoff |
//! | `Server`, `Timeout` | yes | the backoff |
//! | `EmptyResponse` (Gemini's empty candidates) | yes, with the last message nudged (a `.` appended) | the backoff |
//! | `ContextTooLong` | no: returned, for a summarize-and-retry layer outside | — |
//! | `Auth`, `BadRequest`, `QuotaExhausted`, `Cancelled`, anything else | no | — |
//!
//! The backoff doubles from [`RetryPolicy::base`] (1 s) up to [`RetryPolicy::max_delay`]
//! (60 s), plus a jitter of up to [`RetryPolicy::jitter`] (2 s); at most
//! [`RetryPolicy::max_attempts`] (10) calls in all. A [`TpsBudget`] shared by every clone
//! ([`RetryPolicy::budget`]) bounds retries to a share of successful calls, so a fleet of
//! agents does not multiply an outage. Before each wait, a [`Event::Retrying`] tells stream
//! readers to discard the deltas of the failed attempt.
//!
//! A cancelled run ends the wait at once: the agent drops the call, and with it the wait; used
//! outside an agent, the wait ends when the request's cancellation token fires and the policy
//! returns a `Cancelled` error instead of trying again.
//!
//! An interrupt is an outcome (a tool's `Ok` response), never an error: the policy never sees
//! one, so a tool that asks a human is never run twice by a retry.
//!
//! Place it innermost, right around the provider (see the canonical stack in
//! `docs/ordering.md`): everything inside a retry runs again on each attempt.
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_agent_core::{Error, ErrorKind, ModelRequest, ModelResponse};
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
//!     .retry(RetryPolicy::new())
//!     .service(model.clone());
//! let res = service.ready().await?.call(ModelRequest::new(vec![])).await?;
//! assert_eq!(res.message.text(), "ok");
//! assert_eq!(model.request_count(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! [`Event::Retrying`]: tower_agent_core::Event::Retrying

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::retry::Policy;
use tower::retry::budget::{Budget, TpsBudget};
use tower_agent_core::{
    ContentPart, Error, ErrorKind, Event, Message, ModelRequest, Role, RunContext, ToolRequest,
};

/// A request the policy can retry: it has a run context, and may be changed before an attempt.
pub trait Retryable: Clone {
    /// The run the request belongs to (for events and cancellation).
    fn ctx(&self) -> &RunContext;

    /// Change the request after the provider answered with nothing
    /// ([`ErrorKind::EmptyResponse`]); by default nothing changes.
    fn nudge(&mut self) {}
}

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
}

impl Retryable for ToolRequest {
    fn ctx(&self) -> &RunContext {
        &self.ctx
    }
}

/// The retry policy; see the [module docs](self).
///
/// Each request gets its own copy (tower's `Retry` clones the policy per call), so attempts
/// are counted per call; the budget is shared by all copies.
#[derive(Clone)]
pub struct RetryPolicy {
    max_attempts: u32,
    base: Duration,
    max_delay: Duration,
    jitter: Duration,
    budget: Option<Arc<TpsBudget>>,
    /// Calls made so far for this request.
    attempts: u32,
    seed: u64,
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("base", &self.base)
            .field("max_delay", &self.max_delay)
            .field("jitter", &self.jitter)
            .field("budget", &self.budget.is_some())
            .field("attempts", &self.attempts)
            .finish()
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// At most 10 calls, backoff from 1 s doubling to 60 s, jitter up to 2 s, a budget of
    /// 20% of the successful calls over 10 s (at least one retry per second).
    pub fn new() -> Self {
        Self {
            max_attempts: 10,
            base: Duration::from_secs(1),
            max_delay: Duration::from_secs(60),
            jitter: Duration::from_secs(2),
            budget: Some(Arc::new(TpsBudget::new(Duration::from_secs(10), 1, 0.2))),
            attempts: 0,
            seed: std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                0_u8,
            ),
        }
    }

    /// The most calls for one request, the first included (at least 1).
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts.max(1);
        self
    }

    /// The first backoff.
    pub fn base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// The longest backoff (the provider's own wait is not capped).
    pub fn max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// The most random time added to a backoff; zero for exact waits.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// The budget shared by every clone of this policy; `None` for no budget.
    pub fn budget(mut self, budget: Option<TpsBudget>) -> Self {
        self.budget = budget.map(Arc::new);
        self
    }

    /// The wait before retry number `retry` (1 for the first) after `error`.
    fn delay(&mut self, retry: u32, error: &Error) -> Duration {
        if let Some(wait) = error.retry_after() {
            return wait;
        }
        let doubled = self
            .base
            .saturating_mul(2_u32.saturating_pow(retry.saturating_sub(1)));
        doubled.min(self.max_delay) + self.next_jitter()
    }

    fn next_jitter(&mut self) -> Duration {
        if self.jitter.is_zero() {
            return Duration::ZERO;
        }
        // xorshift64*: enough for spreading retries, no dependency.
        self.seed ^= self.seed >> 12;
        self.seed ^= self.seed << 25;
        self.seed ^= self.seed >> 27;
        let random = self.seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let fraction = (random >> 11) as f64 / (1_u64 << 53) as f64;
        self.jitter.mul_f64(fraction)
    }
}

/// Whether an error of this kind is worth another attempt.
fn retryable(kind: &ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::RateLimited { .. }
            | ErrorKind::Overloaded { .. }
            | ErrorKind::Server
            | ErrorKind::Timeout
            | ErrorKind::EmptyResponse
    )
}

impl<Req, Res> Policy<Req, Res, Error> for RetryPolicy
where
    Req: Retryable,
{
    type Future = Backoff;

    fn retry(&mut self, req: &mut Req, result: &mut Result<Res, Error>) -> Option<Backoff> {
        self.attempts += 1;
        let error = match result {
            Ok(_) => {
                if let Some(budget) = &self.budget {
                    budget.deposit();
                }
                return None;
            }
            Err(error) => error,
        };
        if req.ctx().is_cancelled() {
            *result = Err(Error::cancelled());
            return None;
        }
        if !retryable(&error.kind()) || self.attempts >= self.max_attempts {
            return None;
        }
        if let Some(budget) = &self.budget {
            if !budget.withdraw() {
                return None;
            }
        }
        if error.kind() == ErrorKind::EmptyResponse {
            req.nudge();
        }
        let delay = self.delay(self.attempts, error);
        let ctx = req.ctx().clone();
        let event = Event::Retrying {
            round: ctx.round(),
            attempt: self.attempts + 1,
            delay,
            error: error.clone(),
        };
        tracing::warn!(
            target: "tower_agent::retry",
            attempt = self.attempts + 1,
            delay_ms = delay.as_millis() as u64,
            error = %error,
            "retrying"
        );
        Some(Backoff {
            inner: Box::pin(async move {
                if ctx.events().is_enabled() {
                    // A failing observer cannot stop a wait; the run sees it on its next event.
                    let _ = ctx.emit(event).await;
                }
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = ctx.cancellation_token().cancelled() => {}
                }
            }),
        })
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

/// The wait before a retry: emits [`Event::Retrying`], then sleeps until the delay passes or
/// the run is cancelled.
///
/// [`Event::Retrying`]: tower_agent_core::Event::Retrying
pub struct Backoff {
    inner: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl fmt::Debug for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Backoff")
    }
}

impl Future for Backoff {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.inner.as_mut().poll(cx)
    }
}
