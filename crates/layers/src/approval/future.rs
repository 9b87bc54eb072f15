//! The approval layer's response future, and what follows an approved call.

use std::collections::BTreeMap;

use tower_agent_core::{RunContext, StateKey, ToolRequest, ToolResponse};

use crate::ask::{After, response_future};

/// Approved calls that then asked a question of their own (so the value they resume with is
/// theirs, not a decision), by call id, with the arguments they ran with when edited: in the
/// session's state.
pub const STATE_KEY: StateKey<BTreeMap<String, Option<String>>> =
    StateKey::new("tower_agent.approval");

/// Note that the approved call `id` (run with `edited` arguments, if any) now waits for its
/// own question; a list that cannot be read is replaced.
fn remember_approved(ctx: &RunContext, id: &str, edited: Option<&str>) {
    ctx.update_or_reset(&STATE_KEY, |approved| {
        approved.insert(id.to_owned(), edited.map(str::to_owned));
    });
}

/// Whether the call `id` was approved before it asked its own question: `Some(edited
/// arguments)`; takes it off the list.
pub(super) fn take_approved(ctx: &RunContext, id: &str) -> Option<Option<String>> {
    ctx.update(&STATE_KEY, |approved| approved.remove(id))
        .ok()
        .flatten()
}

/// What follows an approved call: the edited arguments go in the response for the history
/// ([`ToolResponse::arguments`]), or, when the tool asks a question of its own, the approval is
/// remembered for the next resume.
pub(super) struct Approved {
    ctx: RunContext,
    id: String,
    edited: Option<String>,
}

impl Approved {
    pub(super) fn new(req: &ToolRequest, edited: Option<String>) -> Self {
        Self {
            ctx: req.ctx.clone(),
            id: req.call.id.clone(),
            edited,
        }
    }
}

impl After for Approved {
    fn after(self, mut response: ToolResponse) -> ToolResponse {
        if response.is_interrupt() {
            remember_approved(&self.ctx, &self.id, self.edited.as_deref());
        } else if let Some(arguments) = self.edited {
            // A layer further in that changed them again knows better.
            response.arguments.get_or_insert(arguments);
        }
        response
    }
}

response_future! {
    /// The response future of [`Approval`](super::Approval): the inner service's future when
    /// the call passes through, a ready answer, or a boxed review (inline mode only).
    pub struct ResponseFuture<F, E>(After = Option<Approved>);
}
