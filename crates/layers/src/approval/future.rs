//! The approval layer's response future, and what follows an approved call.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_agent_core::{RunContext, StateKey, ToolAction, ToolRequest, ToolResponse};

/// Approved calls that then asked a question of their own (so the value they resume with is
/// theirs, not a decision), by call id, with the arguments they ran with when edited: in the
/// session's state.
pub const STATE_KEY: StateKey<BTreeMap<String, Option<String>>> =
    StateKey::new("tower_agent.approval");

fn is_interrupt(response: &ToolResponse) -> bool {
    matches!(response.action, ToolAction::Interrupt(_))
}

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
pub(super) struct After {
    ctx: RunContext,
    id: String,
    edited: Option<String>,
}

impl After {
    pub(super) fn new(req: &ToolRequest, edited: Option<String>) -> Self {
        Self {
            ctx: req.ctx.clone(),
            id: req.call.id.clone(),
            edited,
        }
    }

    pub(super) fn done(self, mut response: ToolResponse) -> ToolResponse {
        if is_interrupt(&response) {
            remember_approved(&self.ctx, &self.id, self.edited.as_deref());
        } else if let Some(arguments) = self.edited {
            // A layer further in that changed them again knows better.
            response.arguments.get_or_insert(arguments);
        }
        response
    }
}

type BoxFuture<E> = Pin<Box<dyn Future<Output = Result<ToolResponse, E>> + Send>>;

pin_project! {
    /// The response future of [`Approval`]: the inner service's future when the call passes
    /// through, a ready answer, or a boxed review (inline mode only).
    pub struct ResponseFuture<F, E> {
        #[pin]
        kind: Kind<F, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, E> {
        Pass {
            #[pin]
            future: F,
            // Set for an approved call.
            after: Option<After>,
        },
        Ready { response: Option<ToolResponse> },
        Boxed { future: BoxFuture<E> },
    }
}

impl<F, E> ResponseFuture<F, E> {
    pub(super) fn pass(future: F) -> Self {
        Self {
            kind: Kind::Pass {
                future,
                after: None,
            },
        }
    }

    pub(super) fn after(future: F, after: After) -> Self {
        Self {
            kind: Kind::Pass {
                future,
                after: Some(after),
            },
        }
    }

    pub(super) fn ready(response: ToolResponse) -> Self {
        Self {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }

    pub(super) fn boxed(
        future: impl Future<Output = Result<ToolResponse, E>> + Send + 'static,
    ) -> Self {
        Self {
            kind: Kind::Boxed {
                future: Box::pin(future),
            },
        }
    }
}

impl<F, E> fmt::Debug for ResponseFuture<F, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, E> Future for ResponseFuture<F, E>
where
    F: Future<Output = Result<ToolResponse, E>>,
{
    type Output = Result<ToolResponse, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Pass { future, after } => match future.poll(cx) {
                Poll::Ready(Ok(response)) => Poll::Ready(Ok(match after.take() {
                    Some(after) => after.done(response),
                    None => response,
                })),
                other => other,
            },
            KindProj::Ready { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => panic!("ResponseFuture polled after completion"),
            },
            KindProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}
