//! The agent service: the loop, split by role.
//!
//! | module | role |
//! |---|---|
//! | `mod.rs` | [`Agent`] and its `Service` impl |
//! | `builder` | [`AgentBuilder`], [`AgentConfig`], [`ToolExecution`], [`Truncation`] |
//! | `state` | one run's state, what the modules below work on |
//! | `rounds` | one run: the round state machine, history commits, the end of a run |
//! | `input` | checking the input against the session, before anything changes |
//! | `resume` | applying the input (new messages, continue, resume) |
//! | `tools` | executing the tool calls of one round, sequentially or concurrently |
//! | `call` | calling a service: readiness, panics, cancellation, spans |
//! | `early` | read-only tools started while the model still streams |
//! | `saving` | where a run saves, and the saves its tool calls ask for |
//! | `truncated` | a model answer cut off at its length limit |

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
#[cfg(doc)]
use tower_agent_core::Outcome;
use tower_agent_core::{
    AgentRequest, AgentResponse, BoxError, Deltas, DescribeTools, Error, ModelRequest,
    ModelResponse, ToolRequest, ToolResponse, Usage,
};
use tower_service::Service;
use tracing::Instrument;

/// Build and emit an event only when something listens (evaluates to the emit's result).
/// Observers are awaited; a full stream is waited on only until the run is cancelled (see
/// `RunContext::emit`).
macro_rules! emit {
    ($ctx:expr, $event:expr) => {
        if $ctx.events().is_enabled() {
            $ctx.emit($event).await
        } else {
            Ok(())
        }
    };
}

mod builder;
mod builtins;
mod call;
mod early;
mod input;
mod key;
mod resume;
mod rounds;
mod saving;
mod state;
mod tools;
mod truncated;

pub use builder::{AgentBuilder, AgentConfig, ToolExecution, Truncation};
pub use builtins::Builtins;
pub use input::ResumeError;

use state::Run;

/// Whether `input` may run on `session`: what the agent checks before a run changes anything
/// (a resume's decisions against the calls that wait, a `Continue` of an empty session). A
/// server checks a request with it before starting the run, to answer at once.
///
/// # Errors
///
/// [`ErrorKind::BadRequest`](tower_agent_core::ErrorKind::BadRequest), its source a
/// [`ResumeError`] for a resume.
///
/// ```
/// use tower_agent_core::{AgentInput, Decisions, Session};
///
/// let refused = tower_agent_loop::check_input(&Session::new(), &AgentInput::Resume(Decisions::new()));
/// assert!(refused.unwrap_err().to_string().contains("no pending interrupt"));
/// ```
pub fn check_input(
    session: &tower_agent_core::Session,
    input: &tower_agent_core::AgentInput,
) -> Result<(), Error> {
    input::check_input(session, input).map(|_| ())
}

/// The agent service: the loop that drives a model service and a tool service round by
/// round.
///
/// Each round: check cancellation; call the model with the history; append its message;
/// emit `RoundCompleted`; run its tool calls and append their results in call order. The run
/// ends when the model calls no tool ([`Outcome::Completed`]), a tool response stops the loop
/// or `max_rounds` is reached ([`Outcome::Stopped`]), the run is cancelled
/// ([`Outcome::Cancelled`]) or a tool response interrupts it ([`Outcome::Interrupted`]).
///
/// Bad input never fails the run: an unknown tool, malformed arguments, a tool error or a
/// panicking tool each become an error result the model sees. A model error fails the run
/// with `Err`; the error carries the session with every tool call answered
/// ([`Error::take_session`]).
///
/// The agent is always ready; each call clones the model and tool services and drives them
/// to readiness before every use. `Clone + Send + 'static` when the services are, so one
/// composed stack serves many sessions at once.
///
/// ```
/// use tower::{service_fn, ServiceExt};
/// use tower_agent_core::{AgentRequest, DescribedTools, Error, ModelRequest, ModelResponse, Session, ToolRequest, ToolResponse};
/// use tower_agent_loop::Agent;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let model = service_fn(|req: ModelRequest| async move {
///     Ok::<_, Error>(ModelResponse::text(format!("{} messages", req.messages.len())))
/// });
/// // A tool service says which tools it serves: a `ToolSet` does; a bare function is
/// // wrapped (here it serves none).
/// let tools = DescribedTools::none(service_fn(|req: ToolRequest| async move {
///     Ok::<_, Error>(ToolResponse::success(&req.call, "unused"))
/// }));
/// let agent = Agent::builder().build(model, tools);
///
/// let res = agent.oneshot(AgentRequest::new(Session::new(), "hello")).await?;
/// assert_eq!(res.text().as_deref(), Some("1 messages"));
/// assert_eq!(res.session.history.len(), 2);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Agent<M, T> {
    model: M,
    tools: T,
    config: Arc<AgentConfig>,
}

impl Agent<(), ()> {
    /// A builder.
    pub fn builder() -> AgentBuilder {
        AgentBuilder::new()
    }
}

impl<M, T> Agent<M, T> {
    /// An agent with the default configuration: the model is offered the tools `tools`
    /// reports ([`DescribeTools`]).
    ///
    /// A tool service that says nothing of its tools does not compile here (the message says
    /// how to fix it), so a model is never offered no tools by accident:
    ///
    /// ```compile_fail
    /// use tower::service_fn;
    /// use tower_agent_core::{Error, ModelRequest, ModelResponse, ToolRequest, ToolResponse};
    /// use tower_agent_loop::Agent;
    ///
    /// let model = service_fn(|_: ModelRequest| async { Ok::<_, Error>(ModelResponse::text("hi")) });
    /// let tools = service_fn(|r: ToolRequest| async move { Ok::<_, Error>(ToolResponse::success(&r.call, "")) });
    /// let _agent = Agent::new(model, tools);
    /// ```
    ///
    /// The same, saying it serves no tool, compiles:
    ///
    /// ```
    /// use tower::service_fn;
    /// use tower_agent_core::{DescribedTools, Error, ModelRequest, ModelResponse, ToolRequest, ToolResponse};
    /// use tower_agent_loop::Agent;
    ///
    /// let model = service_fn(|_: ModelRequest| async { Ok::<_, Error>(ModelResponse::text("hi")) });
    /// let tools = service_fn(|r: ToolRequest| async move { Ok::<_, Error>(ToolResponse::success(&r.call, "")) });
    /// let _agent = Agent::new(model, DescribedTools::none(tools));
    /// ```
    pub fn new(model: M, tools: T) -> Self
    where
        T: DescribeTools,
    {
        AgentBuilder::new().build(model, tools)
    }

    /// The configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// The model service.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The tool service.
    pub fn tools(&self) -> &T {
        &self.tools
    }
}

impl<M, T> fmt::Debug for Agent<M, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<M, T> Service<AgentRequest> for Agent<M, T>
where
    M: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
    M::Error: Into<BoxError>,
    M::Future: Send,
    T: Service<ToolRequest, Response = ToolResponse> + DescribeTools + Clone + Send + 'static,
    T::Error: Into<BoxError>,
    T::Future: Send,
{
    type Response = AgentResponse;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: AgentRequest) -> Self::Future {
        let AgentRequest {
            session,
            input,
            ctx,
            saver,
        } = request;
        // Its own name, or the step's that runs it (the last of its nested path).
        let path = ctx.path();
        let name = match &self.config.name {
            Some(name) => Some(&**name),
            None => path.as_deref().and_then(|path| path.rsplit('/').next()),
        };
        let otel_name = match name {
            Some(name) => format!("invoke_agent {name}"),
            None => "invoke_agent".to_owned(),
        };
        let span = tracing::info_span!(
            "invoke_agent",
            otel.name = otel_name.as_str(),
            gen_ai.operation.name = "invoke_agent",
            gen_ai.agent.name = name,
            gen_ai.conversation.id = %ctx.session_id(),
            run_id = %ctx.run_id(),
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            error.type = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let keys = key::CallKeys::of_run(ctx.run_id());
        let run = Run {
            model: self.model.clone(),
            tools: self.tools.clone(),
            config: Arc::clone(&self.config),
            session,
            ctx,
            usage: Usage::default(),
            rounds: 0,
            call_ids: Default::default(),
            start: 0,
            saving: saving::Saving::new(saver),
            before_input: None,
            deltas: Deltas::default(),
            keys,
            recovering: Vec::new(),
            steering: None,
        };
        // A combinator, not an async block around the run: the block would keep the run it
        // moved into the run's future, a second copy in every run's allocation.
        ResponseFuture {
            inner: Box::pin(run.run(input).map(record_end).instrument(span)),
        }
    }
}

/// The run's end on its span (the current one): its tokens, and the error's kind.
fn record_end(result: Result<AgentResponse, Error>) -> Result<AgentResponse, Error> {
    let span = tracing::Span::current();
    let usage = match &result {
        Ok(response) => response.usage,
        Err(error) => {
            span.record("error.type", error.kind().name());
            span.record("otel.status_code", "error");
            error.usage()
        }
    };
    // As `i64`: `tracing-opentelemetry` exports `u64` fields as text.
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    span.record("gen_ai.usage.input_tokens", int(usage.input_tokens));
    span.record("gen_ai.usage.output_tokens", int(usage.output_tokens));
    result
}

/// The response future of [`Agent`]: a run.
pub struct ResponseFuture {
    inner: Pin<Box<dyn Future<Output = Result<AgentResponse, Error>> + Send>>,
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<AgentResponse, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}
