//! Ways to run an agent service: spawn with an event stream, batch, and blocking.

use std::fmt;
use std::future::Future;

use futures_util::stream::{self, StreamExt};
use tokio::task::JoinHandle;
use tower::ServiceExt;
use tower_agent_core::{
    AgentRequest, AgentResponse, BoxError, CancellationToken, Error, EventStream, Message, Steer,
};
use tower_service::Service;

/// Room for unread events in [`AgentServiceExt::spawn`]'s stream before the run waits.
const EVENT_CAPACITY: usize = 64;

/// Extra ways to run any agent service, layered or not.
///
/// Awaiting a run needs nothing extra: `agent.oneshot(request).await`.
pub trait AgentServiceExt: Service<AgentRequest, Response = AgentResponse> + Sized {
    /// Start a run on the tokio runtime and return its handle: the event stream, cancel and
    /// join.
    ///
    /// The stream holds up to 64 unread events; then the run waits for the reader
    /// (backpressure). Read it, or drop it: [`RunHandle::join`] drops an untaken stream.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    ///
    /// ```
    /// use tower::service_fn;
    /// use tower_agent_core::{AgentRequest, DescribedTools, Error, Event, ModelRequest, ModelResponse, Session, ToolRequest, ToolResponse};
    /// use tower_agent_loop::{Agent, AgentServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Error> {
    /// let model = service_fn(|_: ModelRequest| async { Ok::<_, Error>(ModelResponse::text("hi")) });
    /// let tools = DescribedTools::none(service_fn(|r: ToolRequest| async move { Ok::<_, Error>(ToolResponse::success(&r.call, "")) }));
    /// let agent = Agent::new(model, tools);
    ///
    /// let mut run = agent.spawn(AgentRequest::new(Session::new(), "hello"));
    /// let mut events = run.take_events().expect("first take");
    /// let mut names = Vec::new();
    /// while let Some(event) = events.recv().await {
    ///     names.push(event.name());
    /// }
    /// let response = run.join().await?;
    /// assert_eq!(response.text().as_deref(), Some("hi"));
    /// assert_eq!(names.first(), Some(&"run_started"));
    /// assert_eq!(names.last(), Some(&"run_finished"));
    /// # Ok(())
    /// # }
    /// ```
    fn spawn(self, request: AgentRequest) -> RunHandle
    where
        Self: Send + 'static,
        Self::Error: Into<BoxError>,
        Self::Future: Send,
    {
        let (request, events) = request.with_event_stream(EVENT_CAPACITY);
        let (request, steer) = request.with_steering();
        let cancel = request.ctx.cancellation_token().clone();
        let task = tokio::spawn(async move {
            self.oneshot(request)
                .await
                .map_err(|e| Error::from_boxed(e.into()))
        });
        RunHandle {
            events: Some(events),
            cancel,
            steer,
            task,
        }
    }

    /// Run many requests, at most `limit` at once (0 counts as 1), each on its own tokio task.
    /// The results are in input order.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    fn run_batch<I>(
        self,
        requests: I,
        limit: usize,
    ) -> impl Future<Output = Vec<Result<AgentResponse, Error>>> + Send
    where
        I: IntoIterator<Item = AgentRequest>,
        I::IntoIter: Send,
        Self: Clone + Send + 'static,
        Self::Error: Into<BoxError>,
        Self::Future: Send,
    {
        let requests = requests.into_iter();
        async move {
            stream::iter(requests)
                .map(move |request| {
                    let service = self.clone();
                    tokio::spawn(async move {
                        service
                            .oneshot(request)
                            .await
                            .map_err(|e| Error::from_boxed(e.into()))
                    })
                })
                .buffered(limit.max(1))
                .map(|joined| joined.unwrap_or_else(|e| Err(join_error(e))))
                .collect()
                .await
        }
    }
}

impl<S> AgentServiceExt for S where S: Service<AgentRequest, Response = AgentResponse> {}

fn join_error(error: tokio::task::JoinError) -> Error {
    if error.is_panic() {
        Error::other("the run panicked")
    } else {
        Error::cancelled()
    }
}

/// A spawned run: its events, a way to cancel it, and its result.
///
/// Dropping the handle does not stop the run; call [`RunHandle::cancel`] for that.
pub struct RunHandle {
    events: Option<EventStream>,
    cancel: CancellationToken,
    steer: Steer,
    task: JoinHandle<Result<AgentResponse, Error>>,
}

impl RunHandle {
    /// Take the event stream (once).
    pub fn take_events(&mut self) -> Option<EventStream> {
        self.events.take()
    }

    /// Cancel the run: it ends promptly with outcome cancelled.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Send `message` into the run while it runs ([`Steer::send`]): it goes into the session
    /// before the run's next model call.
    ///
    /// # Errors
    ///
    /// When the run has ended.
    pub fn steer(&self, message: Message) -> Result<(), Error> {
        self.steer.send(message)
    }

    /// The run's steering handle, to send from elsewhere (another task, a web handler).
    pub fn steering(&self) -> Steer {
        self.steer.clone()
    }

    /// The run's cancellation token.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Wait for the run's result. An event stream not taken is dropped first, so the run
    /// never waits for a reader that does not exist.
    ///
    /// # Errors
    ///
    /// The run's error (with the session attached), or [`ErrorKind::Other`] if the run's
    /// task panicked.
    ///
    /// [`ErrorKind::Other`]: tower_agent_core::ErrorKind::Other
    pub async fn join(mut self) -> Result<AgentResponse, Error> {
        drop(self.events.take());
        self.task.await.unwrap_or_else(|e| Err(join_error(e)))
    }
}

impl fmt::Debug for RunHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunHandle")
            .field("events_taken", &self.events.is_none())
            .field("cancelled", &self.cancel.is_cancelled())
            .field("finished", &self.task.is_finished())
            .finish()
    }
}

/// An agent for hosts without an async runtime: it owns a single-threaded tokio runtime.
///
/// ```
/// use tower::service_fn;
/// use tower_agent_core::{AgentRequest, DescribedTools, Error, ModelRequest, ModelResponse, Session, ToolRequest, ToolResponse};
/// use tower_agent_loop::{Agent, Blocking};
///
/// let model = service_fn(|_: ModelRequest| async { Ok::<_, Error>(ModelResponse::text("hi")) });
/// let tools = DescribedTools::none(service_fn(|r: ToolRequest| async move { Ok::<_, Error>(ToolResponse::success(&r.call, "")) }));
/// let agent = Blocking::new(Agent::new(model, tools))?;
/// let response = agent.run(AgentRequest::new(Session::new(), "hello"))?;
/// assert_eq!(response.text().as_deref(), Some("hi"));
/// # Ok::<(), Error>(())
/// ```
pub struct Blocking<S> {
    service: S,
    runtime: tokio::runtime::Runtime,
}

impl<S> Blocking<S>
where
    S: Service<AgentRequest, Response = AgentResponse> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    /// Wrap `service`.
    ///
    /// # Errors
    ///
    /// If the runtime cannot be built (the OS refused a thread or a timer).
    pub fn new(service: S) -> Result<Self, Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::other("could not start a tokio runtime").with_source(e))?;
        Ok(Self { service, runtime })
    }

    /// Run one request to its end.
    ///
    /// # Errors
    ///
    /// The run's error.
    ///
    /// # Panics
    ///
    /// When called from inside an async runtime (use `oneshot(..).await` there).
    pub fn run(&self, request: AgentRequest) -> Result<AgentResponse, Error> {
        self.runtime
            .block_on(self.service.clone().oneshot(request))
            .map_err(|e| Error::from_boxed(e.into()))
    }

    /// Run many requests, at most `limit` at once; results in input order.
    ///
    /// # Panics
    ///
    /// When called from inside an async runtime.
    pub fn run_batch(
        &self,
        requests: impl IntoIterator<Item = AgentRequest, IntoIter: Send>,
        limit: usize,
    ) -> Vec<Result<AgentResponse, Error>> {
        self.runtime
            .block_on(self.service.clone().run_batch(requests, limit))
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.service
    }
}

impl<S> fmt::Debug for Blocking<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blocking").finish_non_exhaustive()
    }
}
