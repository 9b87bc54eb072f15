//! Ordered events of a run, for streams and async observers.
//!
//! The agent emits, in this order:
//!
//! ```text
//! RunStarted
//! (ToolStarted ToolFinished)*      calls resumed after an interrupt, round 0
//! ( RoundStarted  (TextDelta | ReasoningDelta | Retract | Retrying)*  Text?  RoundCompleted  (ToolStarted ToolFinished?)* )*
//! RunFinished | RunFailed
//! ```
//!
//! A call that pauses for a decision has started and not finished: its `ToolFinished` comes in
//! the run that resumes it (after a `ToolStarted` there), or in this run, as an error, when the
//! run ends otherwise (another call stopped it, it was cancelled or failed).
//!
//! Layers may add [`Event::Warning`]s anywhere, also before `RunStarted`, and events of types
//! of their own ([`Event::Layer`], [`LayerEvent`]): core names none of them.
//!
//! `RoundCompleted` comes right after the model answered and its message was appended,
//! before any tool runs: observers get the history at that point with it, so an observer can
//! persist progress there (the stream gets the event without the snapshot). Deltas come from
//! providers that stream, through the layers' filters ([`stream`](crate::stream)); the deltas
//! of a round since its last `Retract` put together are its message's text and reasoning. With concurrent tool execution, `ToolStarted`/`ToolFinished` of one
//! round may interleave; the history is still appended in call order.
//!
//! Observers are always awaited, also after the run was cancelled: keep them quick. A full
//! stream is waited on only until the run is cancelled; after that an event that does not fit
//! is dropped, so a reader that stopped reading cannot hold a cancelled run up.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, ErrorKind};
use crate::history::History;
use crate::message::Message;
use crate::session::{Outcome, Usage};

/// Something that happened during a run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Event {
    /// The run began.
    RunStarted {
        /// The run's id.
        run_id: Arc<str>,
        /// The session's id.
        session_id: Arc<str>,
    },
    /// A round began: the model is about to be called.
    RoundStarted {
        /// The round, from 1.
        round: u32,
    },
    /// A piece of text streamed by the provider.
    TextDelta {
        /// The round.
        round: u32,
        /// The new text.
        delta: String,
    },
    /// A piece of reasoning streamed by the provider.
    ReasoningDelta {
        /// The round.
        round: u32,
        /// The new reasoning text.
        delta: String,
    },
    /// The text of the model's message (emitted when it has any).
    Text {
        /// The round.
        round: u32,
        /// The whole text of the message.
        text: String,
    },
    /// The model answered and its message was appended; tools have not run yet.
    RoundCompleted {
        /// The round.
        round: u32,
        /// The model's message.
        message: Message,
        /// The session's history at this point, for observers that persist progress: an
        /// observer is awaited, so the run goes on only once it has saved. `None` on the event
        /// stream: a snapshot waiting in a buffer would make the loop copy the whole history at
        /// its next append. (An observer that keeps the snapshot causes that copy too.)
        history: Option<History>,
        /// Tokens of this round's model call.
        usage: Usage,
    },
    /// A tool call is about to run.
    ToolStarted {
        /// The round.
        round: u32,
        /// The call's id.
        call_id: String,
        /// The tool's name.
        name: String,
    },
    /// A tool call finished. A call that pauses for a decision has not: its `ToolFinished`
    /// comes in the run that resumes it (after a `ToolStarted` of its own there).
    ToolFinished {
        /// The round.
        round: u32,
        /// The call's id.
        call_id: String,
        /// The tool's name.
        name: String,
        /// Whether the result is an error the model will see.
        is_error: bool,
    },
    /// A running tool call reported progress (an MCP server's `notifications/progress`, say).
    /// Comes between the call's `ToolStarted` and `ToolFinished`; a tool that runs calls
    /// concurrently may send them out of order: `progress` only grows.
    ToolProgress {
        /// The round.
        round: u32,
        /// The call's id.
        call_id: String,
        /// The tool's name.
        name: String,
        /// The progress so far.
        progress: f64,
        /// The total, when known.
        total: Option<f64>,
        /// What it is doing, when said.
        message: Option<String>,
    },
    /// A call an earlier run started and did not finish (its process died) was asked what
    /// became of it instead of running again
    /// ([`ToolRequest::recover`](crate::ToolRequest::recover)): the tool's reconcile step
    /// said, or nothing could ([`Recovery::Unknown`](crate::Recovery::Unknown): the model was
    /// told to check before calling again, and the host may want to look too).
    ToolRecovered {
        /// The round.
        round: u32,
        /// The call's id.
        call_id: String,
        /// The tool's name.
        name: String,
        /// What became of it ([`Recovery::name`](crate::Recovery::name)): `"done"`,
        /// `"not_run"` or `"unknown"`. The result itself is the call's, in the history (where
        /// the layers outside the tools, redaction among them, have seen it).
        outcome: &'static str,
    },
    /// The run ended normally (completed, stopped, cancelled or interrupted).
    RunFinished {
        /// How it ended.
        outcome: Outcome,
    },
    /// The run failed with an error.
    RunFailed {
        /// The error the run returns.
        error: Error,
    },
    /// Discard the text and reasoning deltas of this round received so far: they are not
    /// part of the message. Comes before a model call is made again (a retry, a fallback) and
    /// when the message a round ends with does not go on from what was streamed (a layer
    /// replaced or withheld it; then its text follows as one delta). See
    /// [`stream`](crate::stream).
    Retract {
        /// The round.
        round: u32,
    },
    /// A call failed and is about to be tried again after `delay` (the retry layer, the
    /// fallback layer). For a model call whose deltas were streamed, an [`Event::Retract`]
    /// comes first.
    Retrying {
        /// The round.
        round: u32,
        /// The attempt about to start (2 for the first retry).
        attempt: u32,
        /// The wait before it.
        delay: std::time::Duration,
        /// The failure that is retried.
        error: Error,
    },
    /// A layer handled something the run survives but a human may want to know: a memory
    /// file that is missing, a history that had to be repaired. May come at any point, also
    /// before `RunStarted` (from a `before_agent` layer).
    Warning {
        /// Who warns: the layer's name, e.g. `"patch_dangling"` or `"memory"`.
        source: &'static str,
        /// What happened.
        message: String,
    },
    /// An event of a nested agent (a step of a workflow, a sub-agent called as a tool), as
    /// its own run emitted it, tagged with the agent's path: `coding_loop/2/reviewer`. See
    /// [`RunContext::nested`](crate::RunContext::nested).
    Nested {
        /// The nested agent's path, its names from the outermost down.
        path: Arc<str>,
        /// The event.
        event: Box<Event>,
    },
    /// An event a layer or a workflow defines, of its own type ([`LayerEvent`]): the eviction
    /// layer's `ResultEvicted`, the summarizer's `Summarized`, a workflow's steps. Core never
    /// names those types; read one with [`Event::downcast_ref`].
    Layer(AnyLayerEvent),
    /// The model's answer was cut off at its length limit
    /// ([`FinishReason::Length`](crate::FinishReason::Length)): its tool calls are not run.
    /// What the run does next (stop, fail, go on, ask again with more room) is the agent's
    /// `Truncation` setting.
    Truncated {
        /// The round.
        round: u32,
        /// The tool calls the cut answer held (none of them runs).
        calls: usize,
        /// The request's `max_tokens`, when it set one.
        max_tokens: Option<u32>,
    },
}

impl Event {
    /// The event without the history snapshot of `RoundCompleted`, as the stream carries it.
    fn without_snapshot(mut self) -> Event {
        if let Event::RoundCompleted { history, .. } = &mut self {
            *history = None;
        }
        self
    }

    /// The variant's name in snake case, e.g. `"tool_started"`: handy in logs and tests.
    pub fn name(&self) -> &'static str {
        match self {
            Event::RunStarted { .. } => "run_started",
            Event::RoundStarted { .. } => "round_started",
            Event::TextDelta { .. } => "text_delta",
            Event::ReasoningDelta { .. } => "reasoning_delta",
            Event::Text { .. } => "text",
            Event::RoundCompleted { .. } => "round_completed",
            Event::ToolStarted { .. } => "tool_started",
            Event::ToolFinished { .. } => "tool_finished",
            Event::ToolProgress { .. } => "tool_progress",
            Event::ToolRecovered { .. } => "tool_recovered",
            Event::RunFinished { .. } => "run_finished",
            Event::RunFailed { .. } => "run_failed",
            Event::Warning { .. } => "warning",
            Event::Retract { .. } => "retract",
            Event::Retrying { .. } => "retrying",
            Event::Truncated { .. } => "truncated",
            Event::Nested { .. } => "nested",
            Event::Layer(event) => event.name(),
        }
    }

    /// An event of a layer's own type.
    pub fn layer<T: LayerEvent>(event: T) -> Event {
        Event::Layer(AnyLayerEvent::new(event))
    }

    /// The layer's event of type `T`, if this is one (a [`Event::Nested`] one is read through
    /// [`Event::origin`]).
    pub fn downcast_ref<T: LayerEvent>(&self) -> Option<&T> {
        match self {
            Event::Layer(event) => event.downcast_ref(),
            _ => None,
        }
    }

    /// The event itself and the path of the agent that emitted it: a [`Event::Nested`]
    /// unwrapped, any other event with no path (the run's own agent).
    ///
    /// ```
    /// use tower_agent_core::Event;
    ///
    /// let event = Event::Nested { path: "loop/1/coder".into(), event: Box::new(Event::RoundStarted { round: 2 }) };
    /// let (path, inner) = event.origin();
    /// assert_eq!(path, Some("loop/1/coder"));
    /// assert_eq!(inner.name(), "round_started");
    /// ```
    pub fn origin(&self) -> (Option<&str>, &Event) {
        match self {
            Event::Nested { path, event } => (Some(path), event),
            event => (None, event),
        }
    }
}

/// An event type a layer or a workflow defines for itself, carried by [`Event::Layer`]: core
/// never names it, so adding one touches only the layer. Its `Display` is the one line a
/// digest or a UI shows.
///
/// ```
/// use std::fmt;
/// use tower_agent_core::{Event, LayerEvent};
///
/// /// The cache of a host's layer answered a call.
/// #[derive(Debug, Clone, PartialEq)]
/// struct CacheHit { tool: String }
///
/// impl LayerEvent for CacheHit {
///     const NAME: &'static str = "cache_hit";
/// }
///
/// impl fmt::Display for CacheHit {
///     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
///         write!(f, "`{}` answered from the cache", self.tool)
///     }
/// }
///
/// let event = Event::layer(CacheHit { tool: "weather".into() });
/// assert_eq!(event.name(), "cache_hit");
/// assert_eq!(event.downcast_ref::<CacheHit>().map(|hit| hit.tool.as_str()), Some("weather"));
/// assert!(matches!(&event, Event::Layer(e) if e.to_string() == "`weather` answered from the cache"));
/// ```
pub trait LayerEvent: Any + fmt::Debug + fmt::Display + Send + Sync {
    /// The event's name in snake case, as [`Event::name`] gives it: `"summarized"`.
    const NAME: &'static str;
}

/// A layer's event, its type erased: what [`Event::Layer`] holds. Cheap to clone.
#[derive(Clone)]
pub struct AnyLayerEvent {
    name: &'static str,
    event: Arc<dyn Erased>,
}

/// A [`LayerEvent`] behind a pointer, still readable as its own type.
trait Erased: Any + fmt::Debug + fmt::Display + Send + Sync {
    fn as_any(&self) -> &dyn Any;
}

impl<T: LayerEvent> Erased for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl AnyLayerEvent {
    /// `event`, its type erased.
    pub fn new<T: LayerEvent>(event: T) -> Self {
        Self {
            name: T::NAME,
            event: Arc::new(event),
        }
    }

    /// The event's name ([`LayerEvent::NAME`]).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The event as its own type, if it is a `T`.
    pub fn downcast_ref<T: LayerEvent>(&self) -> Option<&T> {
        self.event.as_any().downcast_ref()
    }
}

impl fmt::Debug for AnyLayerEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.event, f)
    }
}

impl fmt::Display for AnyLayerEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.event, f)
    }
}

/// A boxed future, as observers return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An async consumer of events. Its error stops the run, which returns it.
///
/// Observers are awaited in order, on the run's task, also after the run was cancelled: a slow
/// observer slows the run. Write one with [`observer_fn`], or implement the trait.
pub trait Observer: Send + Sync + 'static {
    /// Handle one event.
    fn on_event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), Error>>;
}

/// An observer from a closure. The closure reads the event and returns a `'static` future.
///
/// ```
/// use tower_agent_core::{observer_fn, Event, RunContext};
///
/// # tokio_test_block_on(async {
/// let ctx = RunContext::new().with_observer(observer_fn(|event: &Event| {
///     let name = event.name();
///     async move {
///         println!("event: {name}");
///         Ok(())
///     }
/// }));
/// ctx.emit(Event::RoundStarted { round: 1 }).await.unwrap();
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
pub fn observer_fn<F, Fut>(f: F) -> ObserverFn<F>
where
    F: Fn(&Event) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Error>> + Send + 'static,
{
    ObserverFn { f }
}

/// The observer [`observer_fn`] returns.
#[derive(Clone, Copy)]
pub struct ObserverFn<F> {
    f: F,
}

impl<F> fmt::Debug for ObserverFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObserverFn").finish_non_exhaustive()
    }
}

impl<F, Fut> Observer for ObserverFn<F>
where
    F: Fn(&Event) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Error>> + Send + 'static,
{
    fn on_event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin((self.f)(event))
    }
}

/// Where a run's events go: observers (called in order, awaited) and at most one bounded
/// stream. The default sink is disabled and costs nothing.
///
/// Clones share the stream. The agent closes it when the run ends ([`EventSink::close`]), so a
/// reader's loop ends even if a layer or a stub still holds a clone of the run context.
#[derive(Clone, Default)]
pub struct EventSink {
    observers: Vec<Arc<dyn Observer>>,
    stream: Option<Arc<Mutex<Option<mpsc::Sender<Event>>>>>,
}

impl EventSink {
    /// A disabled sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add an observer.
    pub fn with_observer(mut self, observer: impl Observer) -> Self {
        self.observers.push(Arc::new(observer));
        self
    }

    /// Add a bounded stream (replacing any earlier one): when `capacity` events wait unread,
    /// emitting waits for the consumer.
    pub fn with_stream(mut self, capacity: usize) -> (Self, EventStream) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        // A new slot: a clone made earlier keeps its own stream.
        self.stream = Some(Arc::new(Mutex::new(Some(tx))));
        (self, EventStream { rx })
    }

    /// Whether anything listens. Emitters skip building events when this is false.
    pub fn is_enabled(&self) -> bool {
        !self.observers.is_empty() || self.stream.is_some()
    }

    /// End the stream for every clone: its reader gets `None` once it has read what was
    /// sent. Later events still reach the observers.
    pub fn close(&self) {
        if let Some(slot) = &self.stream {
            slot.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
        }
    }

    fn stream_sender(&self) -> Option<mpsc::Sender<Event>> {
        self.stream.as_ref().and_then(|slot| {
            slot.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        })
    }

    /// Deliver `event` to every observer in order, then to the stream (waiting for room).
    ///
    /// # Errors
    ///
    /// The first observer error. Its kind is kept if the observer set one other than
    /// `Other`; otherwise it becomes [`ErrorKind::Observer`].
    pub async fn emit(&self, event: Event) -> Result<(), Error> {
        self.notify_observers(&event).await?;
        if let Some(sender) = self.stream_sender() {
            // A dropped stream means nobody reads any more: the run goes on.
            let _ = sender.send(event.without_snapshot()).await;
        }
        Ok(())
    }

    /// Like [`EventSink::emit`], but once `token` is cancelled the stream no longer waits
    /// for room: the event is sent if it fits, else dropped. Observers are still awaited, so
    /// an observer saving progress is never cut off, and a reader that stopped reading cannot
    /// keep a cancelled run from ending.
    ///
    /// # Errors
    ///
    /// As [`EventSink::emit`].
    pub async fn emit_until_cancelled(
        &self,
        event: Event,
        token: &CancellationToken,
    ) -> Result<(), Error> {
        self.notify_observers(&event).await?;
        self.send_until_cancelled(event, token).await;
        Ok(())
    }

    /// Deliver the last event of a run (`RunFailed`): every observer is told, whatever the
    /// others answer (an error is ignored: the run already failed), then the stream gets it as
    /// in [`EventSink::emit_until_cancelled`]. So a stream reader always sees the run end, even
    /// when an observer fails on every event.
    pub async fn emit_final(&self, event: Event, token: &CancellationToken) {
        for observer in &self.observers {
            let _ = observer.on_event(&event).await;
        }
        self.send_until_cancelled(event, token).await;
    }

    async fn send_until_cancelled(&self, event: Event, token: &CancellationToken) {
        let Some(sender) = self.stream_sender() else {
            return;
        };
        let event = event.without_snapshot();
        // Waits for room unless (or until) the run is cancelled.
        let permit = token.run_until_cancelled(sender.reserve()).await;
        match permit {
            Some(Ok(permit)) => permit.send(event),
            Some(Err(_closed)) => {} // nobody reads any more
            None => {
                // Cancelled: deliver only if there is room.
                let _ = sender.try_send(event);
            }
        }
    }

    async fn notify_observers(&self, event: &Event) -> Result<(), Error> {
        for observer in &self.observers {
            if let Err(error) = observer.on_event(event).await {
                return Err(if error.kind() == ErrorKind::Other {
                    Error::new(ErrorKind::Observer, error.message().to_owned()).with_source(error)
                } else {
                    error
                });
            }
        }
        Ok(())
    }
}

impl fmt::Debug for EventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventSink")
            .field("observers", &self.observers.len())
            .field("stream", &self.stream.is_some())
            .finish()
    }
}

/// The events of one run, as a [`Stream`](futures_core::Stream). Ends when the run ends.
#[derive(Debug)]
pub struct EventStream {
    rx: mpsc::Receiver<Event>,
}

impl EventStream {
    /// The next event, or `None` once the run has ended and every event was read.
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }
}

impl futures_core::Stream for EventStream {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.rx.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn observers_run_in_order_and_errors_stop() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let first = seen.clone();
        let second = seen.clone();
        let sink = EventSink::new()
            .with_observer(observer_fn(move |e: &Event| {
                first.lock().unwrap().push(format!("1:{}", e.name()));
                async { Ok(()) }
            }))
            .with_observer(observer_fn(move |e: &Event| {
                second.lock().unwrap().push(format!("2:{}", e.name()));
                async { Err(Error::other("disk full")) }
            }));
        let err = sink
            .emit(Event::RoundStarted { round: 1 })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Observer);
        assert!(err.to_string().contains("disk full"));
        assert_eq!(
            *seen.lock().unwrap(),
            ["1:round_started", "2:round_started"]
        );
    }

    #[tokio::test]
    async fn closing_ends_the_stream_while_contexts_are_alive() {
        let (ctx, mut stream) = crate::RunContext::new().with_event_stream(4);
        let held = ctx.clone(); // e.g. a stub that recorded a request
        ctx.emit(Event::RoundStarted { round: 1 }).await.unwrap();
        ctx.events().close();
        held.emit(Event::RoundStarted { round: 2 }).await.unwrap();
        assert!(matches!(
            stream.recv().await,
            Some(Event::RoundStarted { round: 1 })
        ));
        assert!(
            stream.recv().await.is_none(),
            "closed, though `held` is alive"
        );
        drop(held);
    }

    #[tokio::test]
    async fn clones_share_the_stream_and_its_closing() {
        let (sink, mut stream) = EventSink::new().with_stream(4);
        let clone = sink.clone(); // e.g. a layer keeping `ctx.events().clone()`
        clone.emit(Event::RoundStarted { round: 1 }).await.unwrap();
        sink.close();
        clone.emit(Event::RoundStarted { round: 2 }).await.unwrap();
        assert!(matches!(
            stream.recv().await,
            Some(Event::RoundStarted { round: 1 })
        ));
        assert!(stream.recv().await.is_none(), "closing one closes all");
        drop(clone);
    }

    #[tokio::test]
    async fn once_cancelled_a_full_stream_is_not_waited_for() {
        let (sink, mut stream) = EventSink::new().with_stream(1);
        let token = CancellationToken::new();
        sink.emit_until_cancelled(Event::RoundStarted { round: 1 }, &token)
            .await
            .unwrap();
        token.cancel();
        // Full and unread: this returns at once and drops the event.
        sink.emit_until_cancelled(Event::RoundStarted { round: 2 }, &token)
            .await
            .unwrap();
        assert!(matches!(
            stream.recv().await,
            Some(Event::RoundStarted { round: 1 })
        ));
        // Room again: delivered even though cancelled.
        sink.emit_until_cancelled(Event::RoundStarted { round: 3 }, &token)
            .await
            .unwrap();
        assert!(matches!(
            stream.recv().await,
            Some(Event::RoundStarted { round: 3 })
        ));
    }

    #[tokio::test]
    async fn stream_applies_backpressure_and_tolerates_drop() {
        let (sink, mut stream) = EventSink::new().with_stream(1);
        sink.emit(Event::RoundStarted { round: 1 }).await.unwrap();
        // The buffer is full: the next emit waits until the consumer reads.
        let pending = sink.emit(Event::RoundStarted { round: 2 });
        tokio::pin!(pending);
        assert!(
            futures_util::poll!(pending.as_mut()).is_pending(),
            "a full stream must make the emitter wait"
        );
        assert!(matches!(
            stream.recv().await,
            Some(Event::RoundStarted { round: 1 })
        ));
        pending.await.unwrap();
        drop(stream);
        sink.emit(Event::RoundStarted { round: 3 }).await.unwrap();
    }
}
