//! Run any [tower-agent](https://docs.rs/tower-agent) agent service on
//! [Restate](https://restate.dev), when one machine is not enough: every model call and every
//! tool call a journaled step, approvals durable promises, the session in the object's state.
//!
//! - [`JournalLayer`] goes innermost on the model stack (around the provider) and on the tool
//!   stack (around the tools): under a durable run each call becomes a step of the
//!   invocation's journal (`ctx.run`), so a replay after a crash takes finished steps from
//!   the journal and never calls the model or the tool again.
//! - [`DurableAgent`] is the virtual object `Agent`, keyed by session id, that runs the agent:
//!   `run`, `pending` and `session` handlers. Bind it to a Restate endpoint and register the
//!   endpoint with the server.
//!
//! ```no_run
//! use tower_agent::prelude::*;
//! use tower_agent::layers::approval::{ApprovalLayer, Gate};
//! use tower_agent_restate::restate_sdk::prelude::{Endpoint, HttpServer};
//! use tower_agent_restate::{DurableAgent, JournalLayer};
//! use tower_agent_test::{ScriptedModel, StubTool};
//!
//! # async fn serve() {
//! let model = ScriptedModel::new([]); // a provider, in a real service
//! let tools = ToolSet::new().tool(StubTool::returning("deploy", "deployed"));
//! let agent = Agent::builder()
//!     .with(ApprovalLayer::builder().gate("deploy", Gate::new()).build().expect("valid"))
//!     .provider_layer(JournalLayer) // each model call a journaled step
//!     .tool_layer(JournalLayer) // each tool call a journaled step
//!     .build(model, tools);
//! HttpServer::new(Endpoint::builder().bind(DurableAgent::new(agent)).build())
//!     .listen_and_serve("127.0.0.1:9080".parse().expect("an address"))
//!     .await;
//! # }
//! ```
//!
//! [The guide](guide) says how to run the server, register the service, start a run, approve a
//! call and read the result with curl, and what is exactly once.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod journal;
mod object;

pub use journal::{Journal, JournalLayer, JournaledRequest};
pub use object::{BoxAgent, DurableAgent, Pending, RunOutcome, RunRequest, RunResult};
pub use restate_sdk;

/// The guide: durable runs on Restate (`crates/restate/docs/durable.md`). Its examples are compiled.
#[doc = include_str!("../docs/durable.md")]
pub mod guide {}
