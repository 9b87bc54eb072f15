//! The run's tool-call allowance, and the calls that wait at the checkpoint.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tower_agent_core::{ExtensionKey, Progress, RunContext, ToolResponse};

use super::STATE_KEY;
use crate::ask::After;

/// The run's allowance, in the run context.
#[derive(Clone, Default)]
pub(super) struct Allowance(pub(super) Arc<Shared>);

#[derive(Default)]
pub(super) struct Shared {
    /// Calls since the allowance was last given: counted without the lock.
    pub(super) calls: AtomicU32,
    pub(super) counts: Mutex<Counts>,
    /// Held while the checkpoint is asked, so concurrent calls ask once.
    pub(super) asking: tokio::sync::Mutex<()>,
}

#[derive(Default)]
pub(super) struct Counts {
    /// How many times a allowance was given: a call that waited sees whether another one got
    /// the answer first.
    pub(super) generation: u64,
    /// The checkpoint stopped the run: calls that waited to ask are not run.
    pub(super) stopped: bool,
    /// The run's calls (recording one allocates nothing after a tool's first call).
    pub(super) progress: Progress,
}

impl Allowance {
    /// The run's allowance of the layer whose key is `key`.
    pub(super) fn of(ctx: &RunContext, key: &ExtensionKey<Allowance>) -> Self {
        ctx.extension_at_or_insert_with(key, Allowance::default)
    }

    /// Give back a call taken from the allowance of generation `generation` (an early call the
    /// loop discarded); nothing when a fresh allowance was given since.
    pub(super) fn give_back(&self, generation: u64) {
        let counts = self.counts();
        if counts.generation == generation {
            let _ = self
                .0
                .calls
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |calls| {
                    calls.checked_sub(1)
                });
        }
    }

    pub(super) fn counts(&self) -> MutexGuard<'_, Counts> {
        self.0.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Take one call of the allowance, if any is left.
    pub(super) fn take(&self, every: u32) -> bool {
        self.0
            .calls
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |calls| {
                (calls < every).then_some(calls + 1)
            })
            .is_ok()
    }

    /// A fresh allowance, of which the calling call takes one.
    pub(super) fn renew(&self) {
        let mut counts = self.counts();
        counts.generation += 1;
        self.0.calls.store(1, Ordering::Release);
    }
}

pub(super) fn not_executed(calls: u32) -> String {
    format!("not executed: the run was stopped at the checkpoint after {calls} tool calls")
}

/// Whether the call waited at this layer's checkpoint (it is in the session's list); takes it
/// off the list. A list that cannot be read holds no call.
pub(super) fn take_waiting(ctx: &RunContext, call_id: &str) -> bool {
    let taken = ctx.update(&STATE_KEY, |waiting| {
        let before = waiting.waiting.len();
        waiting.waiting.retain(|id| id != call_id);
        waiting.waiting.len() != before
    });
    taken.unwrap_or(false)
}

/// Put the call on the session's list of calls that wait at the checkpoint; a list that cannot
/// be read is replaced.
pub(super) fn add_waiting(ctx: &RunContext, call_id: &str) {
    ctx.update_or_reset(&STATE_KEY, |waiting| {
        waiting.waiting.push(call_id.to_owned())
    });
}

/// Count a call that ran (not one that waits).
impl After for Allowance {
    fn after(self, response: ToolResponse) -> ToolResponse {
        if !response.is_interrupt() {
            self.counts()
                .progress
                .push(&response.result.name, !response.result.is_error);
        }
        response
    }
}
