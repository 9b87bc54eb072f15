//! Dangling tool-call patching: every tool call a model sees has exactly one result, right
//! after its own assistant message, and no result stands without its call.
//!
//! Histories break in ordinary ways: a run is interrupted or crashes while a tool runs, a
//! checkpoint is saved between a call and its result, a host edits a stored session, two runs
//! reuse a call id. Providers reject such a history with an HTTP 400 ("tool_use ids were found
//! without tool_result blocks immediately after"). [`PatchDanglingLayer`] repairs it with
//! the one repair of a history, core's [`History::repair`]:
//!
//! - a call without a result gets a synthetic error result saying it did not complete and may
//!   have been cancelled or interrupted ([`UNANSWERED`]); a call whose arguments are not JSON
//!   gets one saying so ([`MALFORMED`]). Or, with [`Unanswered::Drop`], the call is removed;
//! - results are matched to calls *in order*: a result answers the latest call with its id
//!   that stands before it and has no result yet. A later answer (after another assistant
//!   message, say) still counts and moves up; a result before its call, a second answer, or an
//!   answer to an id no call has is an orphan and is dropped, keeping any other content of its
//!   message (as a user message when no result is left in a tool message);
//! - a call whose id is empty or reused gets a new one (`{id}_2`, ...), with its result:
//!   Anthropic rejects a request whose `tool_use` ids repeat;
//! - synthetic results join the tool messages right after their call, so that a provider that
//!   merges tool results into a user turn still sees alternating turns; a message emptied by
//!   dropping orphans is removed, never sent empty.
//!
//! Deterministic and idempotent: a valid history comes out as it went in (the same `Arc`, no
//! copy), repairing twice equals repairing once, and synthetic results carry no clock or
//! random id. The agent repairs its input with the same function; this layer adds the
//! options, the warnings, and the check at the model boundary.
//!
//! # Where it acts
//!
//! The same layer goes on two services (see the canonical stack in `docs/ordering.md`):
//!
//! - **agent** (`before_agent`): repairs the session itself, once per run, so a loaded session
//!   is committed repaired. The live frontier, the last assistant message when only tool
//!   messages follow it, is left alone, and so are calls waiting for a human decision
//!   (pending interrupts): the agent decides about them from the run's input (resume runs
//!   them, new input answers them as not decided). Those are never answered nor dropped,
//!   whatever [`Unanswered`] says: when a host added messages after them, their assistant
//!   message moves to the end with its results ([`Repair::keep_waiting`]), so that a resume
//!   finds them there, and the messages added stand before it.
//! - **model** (`before_model`, innermost): the guarantee at the model boundary. It checks only
//!   the messages added since the previous round of the run (it keeps a [`HistoryMark`] of
//!   how far the history was valid in the run's context), so a 1,000-message history is not
//!   rescanned every round; a history that no longer starts the same way (summarized,
//!   trimmed) is checked whole. A repair here shapes the request only: the session is patched at the agent.
//!
//! Each repair emits an [`Event::Warning`] (source `"patch_dangling"`) and a `tracing`
//! warning with what changed.
//!
//! ```
//! use serde_json::json;
//! use tower::{Service, ServiceExt};
//! use tower_agent_core::{Message, ModelRequest, ModelResponse, ToolCall, Error};
//! use tower_agent_layers::patch::PatchDanglingLayer;
//! use tower_agent_test::ScriptedModel;
//! use tower_layer::Layer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let model = ScriptedModel::new([ModelResponse::text("ok")]);
//! let mut model = PatchDanglingLayer::new().layer(model);
//!
//! // A session saved while a tool ran: the call has no result.
//! let req = ModelRequest::new(vec![
//!     Message::user("list the files"),
//!     Message::assistant_with_calls("", [ToolCall::new("c1", "ls", json!({}))]),
//!     Message::user("are you there?"),
//! ]);
//! model.ready().await?.call(req).await?;
//!
//! let seen = &model.get_ref().requests()[0].messages;
//! let result = seen[2].tool_results().next().expect("patched right after its call");
//! assert!(result.is_error && result.call_id == "c1");
//! assert_eq!(seen[3].text(), "are you there?");
//! # Ok(())
//! # }
//! ```
//!
//! [`Event::Warning`]: tower_agent_core::Event::Warning

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_agent_core::event::BoxFuture;
use tower_agent_core::history::HistoryFold;
use tower_agent_core::{
    AgentRequest, CallIds, Error, Event, ExtensionKey, History, HistoryMark, Message, ModelRequest,
    Repair, Role, RunContext, Session, ToolCall, ToolResult,
};
use tower_layer::Layer;
use tower_service::Service;

pub use tower_agent_core::{RepairReport, Unanswered};

/// The content of the synthetic result of a call that never got one
/// ([`ToolResult::UNANSWERED`]).
pub const UNANSWERED: &str = ToolResult::UNANSWERED;

/// The start of the content of the synthetic result of a call whose arguments are not valid
/// JSON ([`ToolResult::MALFORMED`]); the parser's message follows.
pub const MALFORMED: &str = ToolResult::MALFORMED;

/// Applies [`PatchDangling`]; see the [module docs](self).
#[derive(Debug, Clone, Default)]
pub struct PatchDanglingLayer {
    unanswered: Unanswered,
    /// Where this layer keeps, per run, how far the history was found valid.
    checked: ExtensionKey<Checked>,
}

impl PatchDanglingLayer {
    /// Answer unanswered calls with a synthetic error result.
    pub fn new() -> Self {
        Self::default()
    }

    /// What becomes of a call without a result: answered (the default) or dropped.
    pub fn unanswered(mut self, unanswered: Unanswered) -> Self {
        self.unanswered = unanswered;
        self
    }
}

impl<S> Layer<S> for PatchDanglingLayer {
    type Service = PatchDangling<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PatchDangling {
            inner,
            unanswered: self.unanswered,
            checked: self.checked.clone(),
        }
    }
}

/// Repairs the history before the inner agent or model service sees it; see the
/// [module docs](self).
///
/// `poll_ready` is the inner service's: the repair runs inside `call`, before the inner call,
/// and never waits.
#[derive(Debug, Clone)]
pub struct PatchDangling<S> {
    inner: S,
    unanswered: Unanswered,
    checked: ExtensionKey<Checked>,
}

impl<S> PatchDangling<S> {
    /// Wrap `inner`, answering unanswered calls.
    pub fn new(inner: S) -> Self {
        PatchDanglingLayer::new().layer(inner)
    }

    /// A layer for this service.
    pub fn layer() -> PatchDanglingLayer {
        PatchDanglingLayer::new()
    }

    tower_agent_core::inner_service_accessors!();
}

impl<S> Service<AgentRequest> for PatchDangling<S>
where
    S: Service<AgentRequest>,
    S::Error: From<Error>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: AgentRequest) -> Self::Future {
        let interrupts = &req.session.interrupts;
        let wait = |call: &ToolCall| interrupts.iter().any(|i| i.call.id == call.id);
        let how = Repair::new()
            .unanswered(self.unanswered)
            .keep_frontier()
            .wait(&wait)
            .keep_waiting();
        let history = &req.session.history;
        let frontier = frontier(history);
        let mut ids = CallIds::new();
        let before = Repair::new().unanswered(self.unanswered);
        let valid = before.check(&history[..frontier], 0, &mut ids)
            && how.check(&history[frontier..], 0, &mut ids.clone());
        let report = if valid {
            // The first model call of the run checks only what follows the valid prefix.
            Checked::remember(&req.ctx, &self.checked, history.mark().up_to(frontier), ids);
            RepairReport::default()
        } else {
            req.session.history.repair(&how)
        };
        // If an observer fails on the warning, the run does not start: its error carries the
        // (repaired) session, as every error of a run does.
        let session = (!report.is_empty()).then(|| req.session.clone());
        let warning = warn(&req.ctx, "the session's history", report, session);
        ResponseFuture::new(warning, self.inner.call(req))
    }
}

impl<S> Service<ModelRequest> for PatchDangling<S>
where
    S: Service<ModelRequest>,
    S::Error: From<Error>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: ModelRequest) -> Self::Future {
        let how = Repair::new().unanswered(self.unanswered);
        let checked = Checked::of(&req.ctx, &self.checked);
        let mut fold = checked.0.lock().unwrap_or_else(PoisonError::into_inner);
        let history = &req.messages;
        let valid = fold.update(history, |ids, from| how.check(history, from, ids));
        let report = if valid {
            RepairReport::default()
        } else {
            // Defects since the last round, or a history rewritten with defects: repair the
            // whole request, and check it whole next round.
            fold.forget();
            req.messages.repair(&how)
        };
        drop(fold);
        ResponseFuture::new(
            warn(&req.ctx, "the model request", report, None),
            self.inner.call(req),
        )
    }
}

/// Repair `history` as the model side of the layer does, without a layer: every call answered
/// (or dropped) and no orphan left; nothing may wait. Copies nothing when it is valid.
///
/// ```
/// use serde_json::json;
/// use tower_agent_core::{History, Message, ToolCall, ToolResult};
/// use tower_agent_layers::patch::{repair_history, Unanswered};
///
/// let call = ToolCall::new("c1", "ls", json!({}));
/// let mut history = History::from(vec![
///     Message::tool_result(ToolResult::success(&call, "orphan: before its call")),
///     Message::assistant_with_calls("", [call]),
/// ]);
/// let report = repair_history(&mut history, Unanswered::Answer);
/// assert_eq!((report.orphans, report.answered, report.removed_messages), (1, 1, 1));
/// assert!(history.validate().is_ok());
/// ```
pub fn repair_history(history: &mut History, unanswered: Unanswered) -> RepairReport {
    history.repair(&Repair::new().unanswered(unanswered))
}

/// Where the live frontier starts: the last assistant message when only tool messages follow
/// it; the history's length when there is none.
fn frontier(history: &[Message]) -> usize {
    match history.iter().rposition(|m| m.role != Role::Tool) {
        Some(index)
            if history[index].role == Role::Assistant && history[index].has_tool_calls() =>
        {
            index
        }
        _ => history.len(),
    }
}

/// How far the history of a run was found valid (with nothing open at that point), and the
/// call ids up to there: kept in the run's context between model calls.
#[derive(Clone, Default)]
struct Checked(Arc<Mutex<HistoryFold<CallIds>>>);

impl Checked {
    fn of(ctx: &RunContext, key: &ExtensionKey<Checked>) -> Checked {
        ctx.extension_at_or_insert_with(key, Checked::default)
    }

    fn remember(ctx: &RunContext, key: &ExtensionKey<Checked>, mark: HistoryMark, ids: CallIds) {
        let checked = Checked::of(ctx, key);
        let mut fold = checked.0.lock().unwrap_or_else(PoisonError::into_inner);
        fold.set(mark, ids);
    }
}

impl fmt::Debug for Checked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Checked")
    }
}

/// The warning for a repair, to emit before the inner call; `None` when nothing changed.
fn warn(
    ctx: &RunContext,
    what: &str,
    report: RepairReport,
    session: Option<Session>,
) -> Option<BoxFuture<'static, Result<(), Error>>> {
    if report.is_empty() {
        return None;
    }
    let message = format!("repaired {what}: {report}");
    tracing::warn!(target: "tower_agent::patch_dangling", "{message}");
    let ctx = ctx.clone();
    Some(Box::pin(async move {
        ctx.emit(Event::Warning {
            source: "patch_dangling",
            message,
        })
        .await
        .map_err(|error| match session {
            Some(session) => error.with_session(session),
            None => error,
        })
    }))
}

pin_project! {
    /// The response future of [`PatchDangling`]: emits the warning of a repair, if any, then
    /// drives the inner call.
    pub struct ResponseFuture<F> {
        warning: Option<BoxFuture<'static, Result<(), Error>>>,
        #[pin]
        inner: F,
    }
}

impl<F> ResponseFuture<F> {
    fn new(warning: Option<BoxFuture<'static, Result<(), Error>>>, inner: F) -> Self {
        Self { warning, inner }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("warning", &self.warning.is_some())
            .finish()
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: From<Error>,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Some(warning) = this.warning {
            let emitted = std::task::ready!(warning.as_mut().poll(cx));
            *this.warning = None;
            emitted?;
        }
        this.inner.poll(cx)
    }
}

/// Patching on the agent (the loaded session) and on the model (innermost but for structured
/// output, the budget, the fallback and the retry).
impl tower_agent_loop::Builtin for PatchDanglingLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::{AgentSlot, ModelSlot};
        stacks.agent(AgentSlot::Patch, self.clone());
        stacks.model(ModelSlot::Patch, self);
    }
}
