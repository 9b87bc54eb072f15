//! The policy tower's `Retry` applies to one request: its attempts, its waits.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::retry::Policy;
use tower::retry::budget::Budget;
use tower_agent_core::{Error, ErrorKind, Event};

use super::{RetryPolicy, Retryable};

/// [`RetryPolicy`] for one request: tower's `Retry` clones it per request, so attempts are
/// counted per request; the throttle and the jitter's source are shared.
#[derive(Clone, Debug)]
pub(super) struct Attempts {
    pub(super) policy: RetryPolicy,
    /// Calls made so far for this request.
    pub(super) made: u32,
    /// Calls so far that the provider failed (`Server`, `Timeout`, `EmptyResponse`), and
    /// that could not reach it (`Unreachable`): each kind has its own bound.
    pub(super) failed: u32,
    pub(super) unreached: u32,
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1 for the first) after `error`.
    fn delay(&self, retry: u32, error: &Error) -> Duration {
        if let Some(wait) = error.retry_after() {
            return wait;
        }
        let doubled = self
            .base
            .saturating_mul(2_u32.saturating_pow(retry.saturating_sub(1)));
        // The jitter within the cap, so that waits at the cap still differ.
        let jitter = self.jitter.min(self.max_delay);
        doubled.min(self.max_delay - jitter) + self.next_jitter(jitter)
    }

    /// A random share of the jitter, drawn from the state every clone shares, so no two waits
    /// draw the same.
    fn next_jitter(&self, jitter: Duration) -> Duration {
        if jitter.is_zero() {
            return Duration::ZERO;
        }
        // splitmix64 over a shared counter: enough to spread retries, no dependency.
        let mut x = self
            .random
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        let fraction = (x >> 11) as f64 / (1_u64 << 53) as f64;
        jitter.mul_f64(fraction)
    }
}

/// Whether an error of this kind is worth another attempt.
fn retryable(kind: &ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::RateLimited { .. }
            | ErrorKind::Overloaded { .. }
            | ErrorKind::Server
            | ErrorKind::Unreachable
            | ErrorKind::Timeout
            | ErrorKind::EmptyResponse
    )
}

impl<Req, Res> Policy<Req, Res, Error> for Attempts
where
    Req: Retryable,
{
    type Future = Backoff;

    fn retry(&mut self, req: &mut Req, result: &mut Result<Res, Error>) -> Option<Backoff> {
        self.made += 1;
        let policy = &self.policy;
        let error = match result {
            Ok(_) => {
                if let Some(throttle) = &policy.throttle {
                    throttle.deposit();
                }
                return None;
            }
            Err(error) => error,
        };
        if req.ctx().is_cancelled() {
            *result = Err(Error::cancelled());
            return None;
        }
        // Each kind of failure has its own bound, within the bound of all calls.
        let bounded = match error.kind() {
            ErrorKind::Server | ErrorKind::Timeout | ErrorKind::EmptyResponse => {
                self.failed += 1;
                self.failed >= policy.server_attempts
            }
            ErrorKind::Unreachable => {
                self.unreached += 1;
                self.unreached >= policy.unreachable_attempts
            }
            _ => false,
        };
        if !retryable(&error.kind()) || bounded || self.made >= policy.max_attempts {
            return None;
        }
        // A failure that may have reached a tool that may not repeat: not again.
        if !req.may_try_again(&error.kind()) {
            return None;
        }
        if !policy.replay_streamed && req.delivered() {
            return None;
        }
        if let Some(throttle) = &policy.throttle {
            if !throttle.withdraw() {
                return None;
            }
        }
        if error.kind() == ErrorKind::EmptyResponse {
            req.nudge();
        }
        let delay = policy.delay(self.made, error);
        let restart = req.restart();
        let ctx = req.ctx().clone();
        let event = Event::Retrying {
            round: ctx.round(),
            attempt: self.made + 1,
            delay,
            error: error.clone(),
        };
        tracing::warn!(
            target: "tower_agent::retry",
            attempt = self.made + 1,
            delay_ms = delay.as_millis() as u64,
            error = %error,
            "retrying"
        );
        Some(Backoff {
            inner: Box::pin(async move {
                let _ = restart.await;
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

/// The wait before a retry: restarts the stream ([`Retryable::restart`]), emits
/// [`Event::Retrying`], then sleeps until the delay passes or
/// the run is cancelled.
///
/// [`Event::Retrying`]: tower_agent_core::Event::Retrying
pub(super) struct Backoff {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_draw_their_own_jitter() {
        let policy = RetryPolicy::new();
        let error = Error::new(ErrorKind::Server, "500");
        let mut waits: Vec<Duration> = (0..1_000)
            .map(|_| policy.clone().delay(1, &error))
            .collect();
        assert!(
            waits
                .iter()
                .all(|w| *w >= Duration::from_secs(1) && *w < Duration::from_secs(3))
        );
        waits.sort();
        waits.dedup();
        assert_eq!(waits.len(), 1_000, "every draw differs");
    }
}
