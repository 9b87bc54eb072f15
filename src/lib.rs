//! The middleware stack for LLM agents: every cross-cutting concern of an agent is a
//! [`tower::Layer`].
//!
//! An agent is three [`tower::Service`]s: a **model** service ([`ModelRequest`] →
//! [`ModelResponse`]), a **tool** service ([`ToolRequest`] → [`ToolResponse`]) and the
//! **agent** service ([`Agent`], [`AgentRequest`] → [`AgentResponse`]), the loop that drives
//! the other two round by round. The callback points `before_agent`, `before_model`,
//! `after_model`, `before_tool`, `after_tool` and `after_agent` are layers you build from
//! async closures, compose with [`tower::ServiceBuilder`], and unit-test against the stubs
//! of `tower-agent-test`.
//!
//! ```
//! use serde_json::json;
//! use tower_agent::prelude::*;
//! use tower_agent_test::{ScriptedModel, StubTool};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! // A model (here scripted; in production a provider) and the tools.
//! let model = ScriptedModel::new([
//!     ModelResponse::tool_calls([ToolCall::new("c1", "clock", json!({}))]),
//!     ModelResponse::text("It is noon."),
//! ]);
//! let tools = ToolSet::new().tool(StubTool::returning("clock", "12:00"));
//!
//! // Cross-cutting concerns are layers around each service.
//! let model = ServiceBuilder::new()
//!     .before_model(|mut req: ModelRequest| async move {
//!         req.append_system("Be brief.");
//!         Ok(Flow::Continue(req))
//!     })
//!     .service(model);
//! let tools = ServiceBuilder::new()
//!     .before_tool(|req: ToolRequest| async move {
//!         if req.call.name == "shutdown" {
//!             return Ok(Flow::Answer(ToolResponse::error(&req.call, "not allowed")));
//!         }
//!         Ok(Flow::Continue(req))
//!     })
//!     .service(tools.clone());
//!
//! let agent = Agent::builder()
//!     .build(model, tools);
//! let res = agent.oneshot(AgentRequest::new(Session::new(), "What time is it?")).await?;
//! assert_eq!(res.text().as_deref(), Some("It is noon."));
//! # Ok(())
//! # }
//! ```
//!
//! # Crates and features
//!
//! | crate | what | feature of this facade |
//! |---|---|---|
//! | `tower-agent-core` | types, errors, events, callback layers: what custom layers and providers depend on | always |
//! | `tower-agent-loop` | the agent service, spawn/batch/blocking runs | always |
//! | `tower-agent-tools` | [`ToolSet`] and typed tools with schemars schemas | `tools` (default) |
//! | `tower-agent-layers` | built-in layers: patching, instructions, memory, retry, approval, limits, checkpoints, eviction, summarization ([`layers`]) | one per layer; `layers` for all (default) |
//! | `tower-agent-workflow` | workflows: `Sequential`, `Loop` with a judge, progress summaries ([`workflow`]) | `workflow` (default) |
//! | `tower-agent-storage` | storage backends: in memory, local filesystem, `object_store` ([`storage`]) | `storage` (also with `evict`, `summarize`) |
//! | `tower-agent-providers` | model services over reqwest: OpenAI-compatible, Anthropic, Gemini (`tower_agent::providers`) | `openai`, `anthropic`, `gemini`; `providers` for all |
//! | `tower-agent-mcp` | MCP servers' tools as a tool service, over stdio and streamable HTTP (`tower_agent::mcp`) | `mcp` |
//! | OpenTelemetry | export of the spans and the GenAI metrics over OTLP/HTTP (`tower_agent::otel`) | `otel` |
//! | `tower-agent-test` | scripted model, stub tools, assertions (a dev-dependency) | — |
//!
//! `full` enables every feature.
//!
//! # Guides
//!
//! - [`docs::architecture`]: the three services, the run context, errors and events;
//! - [`docs::ordering`]: the onion table of callback layers, and where observers go;
//! - [`docs::custom_layer`]: writing a layer, from a closure to a hand-made service;
//! - [`docs::testing`]: testing layers and agents with the test kit;
//! - [`docs::effects`]: tool effects exactly once: a key per logical call, the hints that
//!   decide which calls may be tried again;
//! - [`docs::interrupts`]: pause a run, save it, resume it elsewhere; approval, checkpoints,
//!   stopping and cancelling;
//! - [`docs::workflows`]: sequential and loop agents with a judge, sub-agents as tools,
//!   progress lines, tool rules;
//! - [`docs::streams`]: streamed deltas through the layers, retraction, redaction on the wire,
//!   guardrails;
//! - `docs::telemetry` (features `otel`, `openai`): the GenAI spans and metrics, exported over
//!   OTLP/HTTP;
//! - [`docs::cost`]: context and cost: prompt caching planned across the stack.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
// `_layers` is the hidden feature every built-in turns on: a reader is told the built-in's own.
#![cfg_attr(docsrs, doc(auto_cfg(hide(feature = "_layers"))))]

pub use tower_agent_core::*;
pub use tower_agent_loop::stack;
pub use tower_agent_loop::{
    Agent, AgentBuilder, AgentConfig, AgentServiceExt, Blocking, Builtin, Builtins, PrefixMoved,
    ResumeError, RunHandle, SessionMark, ToolExecution,
};

/// Tools: [`ToolSet`], typed tools from async functions ([`tool_fn`]), schemas.
#[cfg(feature = "tools")]
pub mod tools {
    pub use tower_agent_tools::*;
}

#[cfg(feature = "tools")]
pub use tower_agent_tools::{FnTool, NoArgs, Tool, ToolSet, tool_fn};

/// Model services over reqwest: [`OpenAi`](providers::OpenAi) (and compatible servers),
/// [`Anthropic`](providers::Anthropic), [`Gemini`](providers::Gemini), each behind its feature
/// (`openai`, `anthropic`, `gemini`; `providers` for all).
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
pub mod providers {
    pub use tower_agent_providers::*;
}

/// The built-in layers ([`tower_agent_layers`], which lists them), each behind the feature of
/// its module's name (`patch`, `approval`, `tool_guard`, ...); `layers`, on by default, turns
/// on all but `structured` and `cache`. Each is a `tower::Layer`: `.layer(..)` on a
/// `ServiceBuilder`, or a built-in of the agent builder, which puts it in its place.
#[cfg(feature = "_layers")]
pub mod layers {
    pub use tower_agent_layers::*;
}

/// Storage backends ([`InMemory`](storage::InMemory), [`LocalFs`](storage::LocalFs), the
/// [`Storage`](storage::Storage) trait): where evicted tool results, offloaded history and
/// memory files live. With `evict`, `summarize` or `storage`.
#[cfg(feature = "storage")]
pub mod storage {
    pub use tower_agent_storage::*;
}

/// Workflows over agent services: [`Sequential`](workflow::Sequential),
/// [`Loop`](workflow::Loop) with a [`Judge`](workflow::Judge), progress summaries. With
/// `workflow` (default).
#[cfg(feature = "workflow")]
pub mod workflow {
    pub use tower_agent_workflow::*;
}

/// Session stores: the [`SessionStore`](sessions::SessionStore) trait, the
/// [`InMemorySessions`](sessions::InMemorySessions) store, and
/// [`StoreLayer`](sessions::StoreLayer), which runs an agent on stored sessions and saves each
/// at every step (it takes its slot with [`Builtins::with`]). With `sessions` (default); the SQLite store
/// with `sqlite`, the Postgres store with `postgres`.
#[cfg(feature = "sessions")]
pub mod sessions {
    pub use tower_agent_sessions::*;
}

#[cfg(feature = "otel")]
pub mod otel;

/// The tools of MCP servers as one tool service: [`McpTools`](mcp::McpTools) over stdio and
/// streamable HTTP, on the official Rust SDK. With `mcp`.
#[cfg(feature = "mcp")]
pub mod mcp {
    pub use tower_agent_mcp::*;
}

/// Serve an agent over HTTP: [`AgentServer`](server::AgentServer), an axum router for runs
/// on stored sessions, their events as resumable server-sent events, decisions, cancel and
/// steering. With `server`.
#[cfg(feature = "server")]
pub mod server {
    pub use tower_agent_server::*;
}

pub mod chat;

/// What most host applications need, in one import.
pub mod prelude {
    pub use tower::{ServiceBuilder, ServiceExt};
    pub use tower_agent_core::ServiceBuilderExt as _;
    pub use tower_agent_core::{
        AgentInput, AgentRequest, AgentResponse, BoxAgent, BoxModel, BoxTools, Decision, Error,
        ErrorKind, Event, Flow, Message, ModelRequest, ModelResponse, Outcome, RunContext, Session,
        StopReason, ToolCall, ToolRequest, ToolResponse, ToolResult, ToolSpec, after_agent,
        after_model, after_tool, around_agent, around_model, around_tool, before_agent,
        before_model, before_tool, observer_fn,
    };
    pub use tower_agent_loop::{Agent, AgentServiceExt};

    #[cfg(feature = "tools")]
    pub use tower_agent_tools::{Tool, ToolSet, tool_fn};
}

/// Long-form guides. Their code examples are compiled and run as doctests.
pub mod docs {
    #[doc = include_str!("../docs/guide.md")]
    #[cfg(all(feature = "tools", feature = "layers", feature = "workflow"))]
    pub mod guide {}

    #[doc = include_str!("../docs/architecture.md")]
    pub mod architecture {}

    #[doc = include_str!("../docs/ordering.md")]
    pub mod ordering {}

    #[doc = include_str!("../docs/custom-layer.md")]
    pub mod custom_layer {}

    #[doc = include_str!("../docs/testing.md")]
    pub mod testing {}

    #[doc = include_str!("../docs/effects.md")]
    #[cfg(feature = "tools")]
    pub mod effects {}

    #[doc = include_str!("../docs/interrupts.md")]
    #[cfg(feature = "approval")]
    pub mod interrupts {}

    #[doc = include_str!("../docs/server.md")]
    #[cfg(all(feature = "server", feature = "approval", feature = "tools"))]
    pub mod server {}

    #[doc = include_str!("../docs/workflows.md")]
    #[cfg(all(feature = "workflow", feature = "tools"))]
    pub mod workflows {}

    #[doc = include_str!("../docs/sessions.md")]
    #[cfg(all(feature = "sqlite", feature = "tools", feature = "layers"))]
    pub mod sessions {}

    #[doc = include_str!("../docs/streams.md")]
    #[cfg(all(feature = "tools", feature = "layers"))]
    pub mod streams {}

    #[doc = include_str!("../docs/cost.md")]
    #[cfg(all(
        feature = "tools",
        feature = "clear",
        feature = "budget",
        feature = "select"
    ))]
    pub mod cost {}

    #[doc = include_str!("../docs/telemetry.md")]
    #[cfg(all(feature = "otel", feature = "openai", feature = "tools"))]
    pub mod telemetry {}
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
