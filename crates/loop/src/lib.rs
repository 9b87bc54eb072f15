//! The agent service of [tower-agent](https://docs.rs/tower-agent): the loop that drives a
//! model service and a tool service round by round, and the ways to run it (await, spawn with
//! an event stream, blocking, batch).

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod agent;
mod mark;
mod probe;
mod run;
pub mod stack;

pub use agent::{
    Agent, AgentBuilder, AgentConfig, Builtins, ResumeError, ToolExecution, Truncation, check_input,
};
pub use mark::SessionMark;
pub use probe::PrefixMoved;
pub use run::{AgentServiceExt, Blocking, RunHandle};
pub use stack::{
    AgentLayer, AgentSlot, Builtin, Inside, ModelLayer, ModelSlot, Stacks, ToolLayer, ToolSlot,
};
