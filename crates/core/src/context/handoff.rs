//! What layers hand to the agent through the run context, for it to apply between calls: a
//! history to commit, a reason to stop, tokens used by nested runs, arguments a call ran with.

use std::sync::atomic::Ordering;

use super::{RunContext, lock};
use crate::history::History;
use crate::session::{StopReason, Usage};

impl RunContext {
    /// Replace the session's history with `history`, for a layer whose edit must outlast the
    /// request (summarization, patching). Edits made to a
    /// [`ModelRequest`](crate::ModelRequest) otherwise shape that request only.
    ///
    /// A commit is made *during a model call*: in a `before_model` or `after_model` layer, or
    /// in the model service. The agent applies it when the call returns (even if the call
    /// failed), before appending the model's message, so `history` should be derived from the
    /// request's `messages`. The agent checks it: a history whose tool calls are not answered
    /// exactly once fails the run with [`ErrorKind::BadRequest`](crate::ErrorKind::BadRequest)
    /// (the session is returned uncommitted). A commit made at any other point (a tool, a
    /// `before_agent` layer: edit `AgentRequest::session` there instead) is discarded.
    ///
    /// A later commit during the same call replaces an earlier one.
    pub fn commit_history(&self, history: History) {
        *lock(&self.shared.commit) = Some(history);
        self.shared.has_commit.store(true, Ordering::Release);
    }

    /// Take the pending history commit, if any. The agent calls this; layers do not need to.
    #[inline]
    pub fn take_committed_history(&self) -> Option<History> {
        if !self.shared.has_commit.load(Ordering::Acquire) {
            return None;
        }
        self.take_commit_slow()
    }

    #[cold]
    fn take_commit_slow(&self) -> Option<History> {
        let mut commit = lock(&self.shared.commit);
        self.shared.has_commit.store(false, Ordering::Release);
        commit.take()
    }

    /// Stop the run gracefully, for a layer (a call limit, a checkpoint): the agent ends it
    /// with [`Outcome::Stopped`](crate::Outcome::Stopped) and `reason` before its next model
    /// or tool call. A call already running finishes: a tool's result is kept (later calls of
    /// the round get a "not executed" result); a model's message is dropped, since its calls
    /// could not be answered. The first reason given wins.
    ///
    /// Unlike cancellation, nothing is interrupted mid-call, and the history ends valid:
    /// every tool call answered.
    ///
    /// ```
    /// use tower_agent_core::{RunContext, StopReason};
    ///
    /// let ctx = RunContext::new();
    /// ctx.stop(StopReason::Layer { reason: "budget spent".into() });
    /// ctx.stop(StopReason::Layer { reason: "second".into() });
    /// assert!(ctx.is_stopping());
    /// assert_eq!(ctx.take_stop(), Some(StopReason::Layer { reason: "budget spent".into() }));
    /// ```
    pub fn stop(&self, reason: StopReason) {
        let mut stop = lock(&self.shared.stop);
        if stop.is_none() {
            *stop = Some(reason);
            self.shared.has_stop.store(true, Ordering::Release);
        }
    }

    /// Whether a layer asked to stop the run ([`RunContext::stop`]).
    #[inline]
    pub fn is_stopping(&self) -> bool {
        self.shared.has_stop.load(Ordering::Acquire)
    }

    /// Take the reason a layer stopped the run with. The agent calls this.
    #[inline]
    pub fn take_stop(&self) -> Option<StopReason> {
        if !self.is_stopping() {
            return None;
        }
        let mut stop = lock(&self.shared.stop);
        self.shared.has_stop.store(false, Ordering::Release);
        stop.take()
    }

    /// Add `usage` to the run's: for a tool that ran model calls of its own (a sub-agent), so
    /// the run's [`AgentResponse::usage`](crate::AgentResponse::usage) counts them. The agent
    /// adds what was recorded when the run ends.
    ///
    /// ```
    /// use tower_agent_core::{RunContext, Usage};
    ///
    /// let ctx = RunContext::new();
    /// ctx.record_usage(Usage::new(10, 2));
    /// ctx.record_usage(Usage::new(5, 1));
    /// assert_eq!(ctx.take_recorded_usage(), Usage::new(15, 3));
    /// assert_eq!(ctx.take_recorded_usage(), Usage::default());
    /// ```
    pub fn record_usage(&self, usage: Usage) {
        *lock(&self.shared.usage) += usage;
        self.shared.has_usage.store(true, Ordering::Release);
    }

    /// Take the usage recorded with [`RunContext::record_usage`]. The agent calls this.
    #[inline]
    pub fn take_recorded_usage(&self) -> Usage {
        if !self.shared.has_usage.load(Ordering::Acquire) {
            return Usage::default();
        }
        self.shared.has_usage.store(false, Ordering::Release);
        std::mem::take(&mut *lock(&self.shared.usage))
    }

    /// Record that the tool call `call_id` ran with `arguments` (raw JSON) instead of the
    /// model's, for a layer that changed them (an approval that edited them, a repair). The
    /// agent writes them into the call in the history when the round's results are appended,
    /// so the history records what was executed and the model sees it. Ignored for a call
    /// that ends up waiting (interrupted) or has no result.
    pub fn record_arguments(&self, call_id: impl Into<String>, arguments: impl Into<String>) {
        lock(&self.shared.executed).push((call_id.into(), arguments.into()));
        self.shared.has_executed.store(true, Ordering::Release);
    }

    /// Whether arguments were recorded with [`RunContext::record_arguments`] and not taken
    /// yet.
    #[inline]
    pub fn has_recorded_arguments(&self) -> bool {
        self.shared.has_executed.load(Ordering::Acquire)
    }

    /// Take the arguments recorded with [`RunContext::record_arguments`]. The agent calls
    /// this.
    #[inline]
    pub fn take_recorded_arguments(&self) -> Vec<(String, String)> {
        if !self.shared.has_executed.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut executed = lock(&self.shared.executed);
        self.shared.has_executed.store(false, Ordering::Release);
        std::mem::take(&mut *executed)
    }
}
