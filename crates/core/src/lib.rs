//! The core of [tower-agent](https://docs.rs/tower-agent): the types of the three agent
//! services and the callback layers. Custom layers and providers depend on this crate only.
//!
//! | service | request | response |
//! |---|---|---|
//! | model | [`ModelRequest`] | [`ModelResponse`] |
//! | tool | [`ToolRequest`] | [`ToolResponse`] |
//! | agent | [`AgentRequest`] | [`AgentResponse`] |
//!
//! Every request carries a [`RunContext`]: ids, round, state shared across callback points,
//! the event sink and the cancellation token. Every service fails with one [`Error`] whose
//! [`ErrorKind`] a retry policy can classify.
//!
//! The callback points `before_agent`, `before_model`, `after_model`, `before_tool`,
//! `after_tool` and `after_agent` are layers built from async closures or from strategy
//! types; see [`callback`].
//!
//! ```
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_agent_core::{before_model, Error, Flow, Message, ModelRequest, ModelResponse};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! // A model service: here a stub that echoes the last message.
//! let model = service_fn(|req: ModelRequest| async move {
//!     let last = req.messages.last().map(|m| m.text()).unwrap_or_default();
//!     Ok::<_, Error>(ModelResponse::text(format!("echo: {last}")))
//! });
//!
//! // A callback that answers some requests itself: the model is not called for them.
//! let model = ServiceBuilder::new()
//!     .layer(before_model(|req: ModelRequest| async move {
//!         if req.messages.is_empty() {
//!             return Ok(Flow::Answer(ModelResponse::text("say something")));
//!         }
//!         Ok(Flow::Continue(req))
//!     }))
//!     .service(model);
//!
//! let res = model.clone().oneshot(ModelRequest::new(vec![])).await?;
//! assert_eq!(res.message.text(), "say something");
//! let res = model.oneshot(ModelRequest::new(vec![Message::user("hi")])).await?;
//! assert_eq!(res.message.text(), "echo: hi");
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod agent;
#[cfg(feature = "tower")]
pub mod boxed;
#[cfg(feature = "tower")]
mod builder;
pub mod callback;
pub mod context;
pub mod cost;
pub mod decision;
pub mod error;
pub mod event;
pub mod history;
mod macros;
pub mod message;
pub mod model;
pub mod price;
mod saver;
pub mod session;
#[cfg(feature = "tower")]
mod side;
mod state;
mod steer;
pub mod stream;
pub mod tool;

pub use agent::{AgentInput, AgentRequest, AgentResponse, Outcome, Session, StopReason};
#[cfg(feature = "tower")]
pub use boxed::{BoxAgent, BoxModel, BoxTools, Shared};
#[cfg(feature = "tower")]
pub use builder::ServiceBuilderExt;
pub use callback::{
    AfterCallback, AfterLayer, AgentNext, AroundCallback, AroundLayer, BeforeCallback, BeforeLayer,
    BoxNext, Flow, ModelNext, Next, NextFuture, ObserveLayer, ToolNext, after_agent, after_model,
    after_tool, around_agent, around_model, around_tool, before_agent, before_model, before_tool,
};
pub use context::{ExtensionKey, RunContext, new_id};
pub use cost::Cost;
pub use decision::{Decision, DecisionKind, Decisions, UnknownDecision};
pub use error::{BoxError, Error, ErrorKind};
pub use event::{AnyLayerEvent, Event, EventSink, EventStream, LayerEvent, Observer, observer_fn};
pub use history::{
    CallBlock, CallIds, History, HistoryError, HistoryMark, Repair, RepairReport, Unanswered,
};
pub use message::{CallKey, ContentPart, Message, NotACallKey, Role, ToolCall, ToolResult};
pub use model::{
    FinishReason, GenerationOptions, ModelRequest, ModelResponse, PromptCache, ResponseFormat,
    ResponseOrigin, ToolChoice, ToolSpec, Usage,
};
pub use price::ModelPrice;
pub use saver::{RunSaves, SaveReply, Saver};
pub use session::{Progress, Step};
#[cfg(feature = "tower")]
pub use side::SideModel;
pub use state::StateKey;
pub use steer::{Steer, Steering};
pub use stream::{Delta, Deltas, StreamFilter};
pub use tokio_util::sync::CancellationToken;

/// The schema of the OpenTelemetry semantic conventions whose GenAI names the spans of the
/// agent and of the providers use (`invoke_agent`, `chat`, `execute_tool`,
/// `gen_ai.usage.input_tokens`, ...): 1.41.0, the last release of the core conventions that
/// defines them. 1.42.0 marks every `gen_ai.*` name deprecated there because the GenAI
/// conventions moved to a repository of their own, with the same names and no release yet.
/// They are still marked in development; a version of tower-agent follows one version of them.
pub const SEMCONV_SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.41.0";
pub use tool::{
    DescribeTools, DescribedTools, Interrupt, Pause, Recovery, RunTools, Tentative, ToolAction,
    ToolRequest, ToolResponse,
};
