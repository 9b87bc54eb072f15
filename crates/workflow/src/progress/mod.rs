//! Progress summaries: a cheap model writes a one-line summary of what the agent is doing, every
//! N seconds or N events (whichever comes first), for a UI's progress bar.
//!
//! [`ProgressLayer`] goes on an agent service (an [`Agent`], a workflow). For each run it adds
//! an observer to the run's context that turns the events saying what the agent does (rounds,
//! the model's text, tools started and finished, retries, warnings, nested agents and
//! iterations) into short lines, the last [`ProgressLayer::max_events`] of them kept. An
//! event of a nested agent ([`Event::Nested`]) makes a line prefixed with its path, e.g.
//! ``[coding_loop/2/reviewer] tool `grep` started``.
//!
//! When [`ProgressLayer::every`] has passed or [`ProgressLayer::every_events`] new lines
//! have come since the last summary, and something happened since, the summarizer gets the
//! prompt ([`DEFAULT_PROMPT`] unless replaced) as its system instructions and the lines (and
//! the last summary) as one user message. The first non-empty line of its answer goes to the
//! host's [`ProgressLayer::on_summary`] callback, then as a [`ProgressSummary`](crate::events::ProgressSummary) event to the
//! run's observers and stream.
//!
//! - **It never blocks the run.** The observer returns at once; summaries are written by a
//!   task spawned for the run, one at a time: events that come while a summary is written
//!   wait for the next one. A slow or hanging summarizer delays summaries, never the run.
//! - **A failure is a warning.** A summarizer error, or an answer without text, is an
//!   [`Event::Warning`] with source [`SOURCE`]; the next summary is tried as usual.
//! - **It stops with the run.** When the run's response is ready (or its future is dropped)
//!   the task is aborted, a summarizer call in flight with it, and the response is returned
//!   once the task is gone: no summary comes after it. The task also stops when the run is
//!   cancelled.
//!
//! The summarizer runs with a context of its own (its events are not the run's), the run's
//! session id and a child of its cancellation token. The task needs a tokio runtime: without
//! one the run goes on without summaries.
//!
//! Put the layer on the outermost agent service: the events of the agents nested in it reach
//! its observer. The observer is added with [`RunContext::with_observer`], so a clone of the
//! request's context that the caller kept does not see it; the cancellation token and the
//! event stream stay shared.
//!
//! # Example
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//!
//! use serde_json::json;
//! use tower::{service_fn, Layer, Service, ServiceExt};
//! use tower_agent_core::{
//!     AgentRequest, Error, ModelResponse, Session, ToolCall, ToolRequest, ToolResponse, ToolSpec,
//! };
//! use tower_agent_loop::Agent;
//! use tower_agent_test::ScriptedModel;
//! use tower_agent_tools::ToolSet;
//! use tower_agent_workflow::progress::ProgressLayer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! // An agent with a slow tool.
//! let build = service_fn(|req: ToolRequest| async move {
//!     tokio::time::sleep(Duration::from_millis(20)).await;
//!     Ok::<_, Error>(ToolResponse::success(&req.call, "built"))
//! });
//! let spec = ToolSpec::new("build", "Build the project.", json!({ "type": "object" }));
//! let model = ScriptedModel::new([
//!     ModelResponse::tool_calls([ToolCall::new("c1", "build", json!({}))]),
//!     ModelResponse::text("Built."),
//! ]);
//! let agent = Agent::new(model, ToolSet::new().service(spec, build));
//!
//! // A cheap model writes the progress lines (here a stub), for the host's UI.
//! let summarizer = ScriptedModel::from_fn(|_| Ok(ModelResponse::text("Building the project")));
//! let lines = Arc::new(Mutex::new(Vec::new()));
//! let ui = Arc::clone(&lines);
//! let progress = ProgressLayer::new(summarizer.clone())
//!     .every(Duration::from_secs(10))
//!     .every_events(2) // here: round 1 started, tool `build` started
//!     .on_summary(move |line| ui.lock().unwrap().push(line.to_owned()));
//!
//! let mut agent = progress.layer(agent);
//! let res = agent.ready().await?.call(AgentRequest::new(Session::new(), "build it")).await?;
//! assert_eq!(res.text().as_deref(), Some("Built."));
//! assert_eq!(lines.lock().unwrap()[0], "Building the project");
//! let digest = summarizer.requests()[0].messages[0].text();
//! assert!(digest.contains("tool `build` started"), "{digest}");
//! # Ok(())
//! # }
//! ```
//!
//! [`Agent`]: https://docs.rs/tower-agent-loop/latest/tower_agent_loop/struct.Agent.html
//! [`Event::Nested`]: tower_agent_core::Event::Nested
//! [`Event::Warning`]: tower_agent_core::Event::Warning
//! [`RunContext::with_observer`]: tower_agent_core::RunContext::with_observer

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_agent_core::{
    AgentRequest, AgentResponse, BoxError, Error, ModelRequest, ModelResponse, SideModel,
};
use tower_layer::Layer;
use tower_service::Service;

mod digest;
mod task;

use digest::{Collect, Digest};
use task::{Background, Summaries};

/// The source of this layer's [`Event::Warning`](tower_agent_core::Event::Warning)s.
pub const SOURCE: &str = "progress";

/// The summarizer's instructions unless replaced with [`ProgressLayer::prompt`].
pub const DEFAULT_PROMPT: &str = "You write the progress line of an AI agent for a user \
interface. From the events of its run, write ONE short line (at most 12 words), in the present \
tense, saying what the agent is doing now, as for a progress bar: e.g. \"Running the test \
suite\". Answer with the line only: no preamble, no quotes.";

type OnSummary = Arc<dyn Fn(&str) + Send + Sync>;

#[derive(Clone)]
struct Config {
    summarizer: SideModel,
    every: Duration,
    every_events: usize,
    max_events: usize,
    prompt: Arc<str>,
    on_summary: Option<OnSummary>,
}

impl Config {
    /// Whether anything can trigger a summary.
    fn enabled(&self) -> bool {
        !self.every.is_zero() || self.every_events > 0
    }
}

/// Applies [`Progress`]; see the [module docs](self).
///
/// Defaults: every 10 seconds or 20 events, the last 50 lines in the digest,
/// [`DEFAULT_PROMPT`], no host callback.
#[derive(Clone)]
pub struct ProgressLayer {
    config: Arc<Config>,
}

impl ProgressLayer {
    /// The default of [`ProgressLayer::every`]: 10 seconds.
    pub const DEFAULT_EVERY: Duration = Duration::from_secs(10);
    /// The default of [`ProgressLayer::every_events`].
    pub const DEFAULT_EVERY_EVENTS: usize = 20;
    /// The default of [`ProgressLayer::max_events`].
    pub const DEFAULT_MAX_EVENTS: usize = 50;

    /// Summaries written by `summarizer`: any model service (a cheap one will do; its calls go
    /// through whatever stack it has, a retry among them).
    pub fn new<M>(summarizer: M) -> Self
    where
        M: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
        M::Error: Into<BoxError>,
        M::Future: Send + 'static,
    {
        Self {
            config: Arc::new(Config {
                summarizer: SideModel::new(summarizer),
                every: Self::DEFAULT_EVERY,
                every_events: Self::DEFAULT_EVERY_EVENTS,
                max_events: Self::DEFAULT_MAX_EVENTS,
                prompt: DEFAULT_PROMPT.into(),
                on_summary: None,
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// Summarize when `every` has passed since the last summary (or the run's start) and
    /// something happened since. `Duration::ZERO` turns the timer off.
    pub fn every(self, every: Duration) -> Self {
        self.edit(|c| c.every = every)
    }

    /// Summarize as soon as `n` events that make a digest line came since the last summary.
    /// 0 turns the count off.
    pub fn every_events(self, n: usize) -> Self {
        self.edit(|c| c.every_events = n)
    }

    /// Keep the last `n` lines (at least one) in the digest the summarizer gets; it is told
    /// how many earlier ones were left out.
    pub fn max_events(self, n: usize) -> Self {
        self.edit(|c| c.max_events = n.max(1))
    }

    /// The summarizer's instructions.
    pub fn prompt(self, prompt: impl Into<Arc<str>>) -> Self {
        let prompt = prompt.into();
        self.edit(|c| c.prompt = prompt)
    }

    /// Call `f` with each summary, before it is emitted as an event. It runs on the summary
    /// task: keep it quick (hand the line to the UI), it must not block.
    pub fn on_summary(self, f: impl Fn(&str) + Send + Sync + 'static) -> Self {
        let f: OnSummary = Arc::new(f);
        self.edit(|c| c.on_summary = Some(f))
    }
}

impl fmt::Debug for ProgressLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.config;
        f.debug_struct("ProgressLayer")
            .field("every", &config.every)
            .field("every_events", &config.every_events)
            .field("max_events", &config.max_events)
            .field("prompt", &config.prompt)
            .field("on_summary", &config.on_summary.is_some())
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ProgressLayer {
    type Service = Progress<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Progress {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// Writes progress summaries beside each run of the inner agent service; see the
/// [module docs](self).
///
/// Readiness is the inner service's; the inner service is called in `call`.
#[derive(Clone)]
pub struct Progress<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> Progress<S> {
    /// Wrap `inner` with the configuration of `layer`.
    pub fn new(inner: S, layer: &ProgressLayer) -> Self {
        layer.layer(inner)
    }

    /// A layer writing summaries with `summarizer` (see [`ProgressLayer::new`]).
    pub fn layer<M>(summarizer: M) -> ProgressLayer
    where
        M: Service<ModelRequest, Response = ModelResponse, Error = Error>
            + Clone
            + Send
            + Sync
            + 'static,
        M::Future: Send + 'static,
    {
        ProgressLayer::new(summarizer)
    }

    tower_agent_core::inner_service_accessors!();
}

impl<S: fmt::Debug> fmt::Debug for Progress<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Progress")
            .field("inner", &self.inner)
            .field("every", &self.config.every)
            .field("every_events", &self.config.every_events)
            .finish_non_exhaustive()
    }
}

impl<S> Service<AgentRequest> for Progress<S>
where
    S: Service<AgentRequest, Response = AgentResponse, Error = Error>,
    S::Future: Send + 'static,
{
    type Response = AgentResponse;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: AgentRequest) -> Self::Future {
        if !self.config.enabled() {
            return ResponseFuture {
                inner: Box::pin(self.inner.call(req)),
            };
        }
        let config = &self.config;
        let digest = Arc::new(Digest::new(config.max_events, config.every_events));
        req.ctx = req.ctx.with_observer(Collect(Arc::clone(&digest)));
        let summaries = Summaries {
            config: Arc::clone(config),
            digest,
            events: req.ctx.events().clone(),
            token: req.ctx.cancellation_token().clone(),
            session_id: req.ctx.session_id().into(),
        };
        let run = self.inner.call(req);
        ResponseFuture {
            inner: Box::pin(async move {
                // Spawned on the first poll, on the runtime that drives the run.
                let background = Background::spawn(summaries);
                let result = run.await;
                background.stop().await;
                result
            }),
        }
    }
}

/// The response future of [`Progress`]: the run, then the end of its summaries.
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
