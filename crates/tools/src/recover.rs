//! Calls an earlier run started and did not finish ([`ToolRequest::recover`]): a tool's
//! reconcile step says what became of them, and a tool without one answers that nobody knows.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tower_agent_core::{Recovery, ToolRequest, ToolSpec};

use crate::ResponseFuture;

type Step = dyn Fn(ToolRequest) -> Pin<Box<dyn Future<Output = Recovery> + Send>> + Send + Sync;

/// A tool's reconcile step: given a call an earlier run started and did not finish (its key
/// among it, [`ToolCall::key`](tower_agent_core::ToolCall::key)), what became of it. Look the
/// effect up by the key in the system it writes to; never make the effect here.
///
/// A typed tool gets one with [`FnTool::reconcile`](crate::FnTool::reconcile); a tool written
/// by hand returns one from [`Tool::reconcile`](crate::Tool::reconcile).
#[derive(Clone)]
pub struct Reconcile(Arc<Step>);

impl Reconcile {
    /// A reconcile step from an async function of the request.
    pub fn new<F, Fut>(step: F) -> Self
    where
        F: Fn(ToolRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Recovery> + Send + 'static,
    {
        Self(Arc::new(move |req| Box::pin(step(req))))
    }

    /// Ask what became of the call `req` recovers.
    pub async fn ask(&self, req: ToolRequest) -> Recovery {
        (self.0)(req).await
    }
}

impl fmt::Debug for Reconcile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconcile").finish_non_exhaustive()
    }
}

/// The answer to `req` when it recovers a call of a tool that may not repeat: what its
/// reconcile step says, or [`Recovery::Unknown`] without one; the run hears it as an
/// [`Event::ToolRecovered`](tower_agent_core::Event::ToolRecovered). `None`: run it (a first
/// call, or a tool that may repeat).
pub(crate) fn recovered(
    spec: Option<&ToolSpec>,
    reconcile: Option<&Reconcile>,
    req: &ToolRequest,
) -> Option<ResponseFuture> {
    if !req.recover || spec.is_some_and(ToolSpec::may_repeat) {
        return None;
    }
    let (reconcile, req) = (reconcile.cloned(), req.clone());
    Some(ResponseFuture::new(async move {
        let recovery = match &reconcile {
            Some(reconcile) => reconcile.ask(req.clone()).await,
            None => Recovery::Unknown,
        };
        Ok(recovery.respond(&req).await)
    }))
}
