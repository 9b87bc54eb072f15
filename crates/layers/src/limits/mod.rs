//! Model-call and tool-call limits, per run and per session, global or per tool
//! (`before_model` + `before_tool`).
//!
//! One [`CallLimitsLayer`] value goes on both stacks (`.layer(limits.clone())` on the model
//! and on the tools): the model side counts model calls, the tool side counts tool calls.
//! "Reached" is not "exceeded": a limit of 3 allows 3 calls and blocks the 4th. A blocked
//! call is not counted. What happens to it is the limit's [`Exit`]:
//!
//! | exit | a blocked tool call | a blocked model call |
//! |---|---|---|
//! | [`Exit::Continue`] | an error result the model sees; the run goes on | as `End` (a model call has no result to give) |
//! | [`Exit::End`] (default) | a "not executed" result, then the run ends [`Outcome::Stopped`] with [`StopReason::Limit`] | not made; the run ends stopped |
//! | [`Exit::Error`] | the model's message asking for it fails the run with [`ErrorKind::LimitReached`] before any of its calls runs | the run fails with [`ErrorKind::LimitReached`] |
//!
//! Every tool call keeps a result in each case (a parallel batch included), and a failed run
//! returns its session, as any failed run does. `Exit::Error` for tool calls is checked on the
//! model side, when the model asks for the calls: put the layer on both stacks (on the tool
//! stack alone it ends the run like `End`).
//!
//! Counts per run live in the run context; counts per session in the session's JSON state
//! (key `tower_agent.calls`), so they persist with the session. A call counts when it runs to
//! a result the model sees: a call that pauses (a human's decision further in, a checkpoint)
//! is given back, and counts when it resumes ([`ToolRequest::resume`] set), in the run that
//! runs it. A call started early that the loop discards counts against nothing. Put this
//! layer outside the approval layer, so a call a limit blocks is never shown to a human.
//!
//! ```
//! use serde_json::json;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_agent_core::{AgentRequest, ModelResponse, Outcome, Session, StopReason, ToolCall};
//! use tower_agent_layers::limits::{CallLimitsLayer, Limit};
//! use tower_agent_loop::Agent;
//! use tower_agent_test::{ScriptedModel, StubTool};
//! use tower_agent_tools::ToolSet;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_agent_core::Error> {
//! let limits = CallLimitsLayer::new()
//!     .model_calls(Limit::per_run(10))
//!     .tool("search", Limit::per_run(2));
//! let search = StubTool::returning("search", "3 hits");
//! let model = ScriptedModel::from_fn(|req| {
//!     let n = req.ctx.round();
//!     Ok(ModelResponse::tool_calls([ToolCall::new(format!("c{n}"), "search", json!({}))]))
//! });
//! let model = ServiceBuilder::new().layer(limits.clone()).service(model);
//! let tools = ServiceBuilder::new().layer(limits).service(ToolSet::new().tool(search.clone()));
//!
//! let res = Agent::new(model, tools).oneshot(AgentRequest::new(Session::new(), "look")).await?;
//! let Outcome::Stopped { reason, progress } = &res.outcome else { unreachable!() };
//! assert_eq!(*reason, StopReason::Limit { name: "`search` calls per run".into(), limit: 2 });
//! assert_eq!(progress.to_string(), "search ✓ → search ✓ → search ✗");
//! assert_eq!(search.calls().len(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! [`Outcome::Stopped`]: tower_agent_core::Outcome::Stopped
//! [`ErrorKind::LimitReached`]: tower_agent_core::ErrorKind::LimitReached
//! [`StopReason::Limit`]: tower_agent_core::StopReason::Limit
//! [`ToolRequest::resume`]: tower_agent_core::ToolRequest::resume

mod count;
mod future;
mod service;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use tower_agent_core::{ExtensionKey, StateKey};
use tower_layer::Layer;

use crate::by_name::ByName;

use count::{Config, Scope};
pub use future::ResponseFuture;

/// The calls counted per session, by limit, in the session's state.
pub const STATE_KEY: StateKey<BTreeMap<String, u32>> = StateKey::new("tower_agent.calls");

/// What happens to a call a limit blocks (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Exit {
    /// The blocked tool call gets an error result the model sees; the run goes on.
    Continue,
    /// The run ends gracefully: outcome stopped, every call answered.
    #[default]
    End,
    /// The run fails with [`ErrorKind::LimitReached`](tower_agent_core::ErrorKind::LimitReached).
    Error,
}

/// A limit on a number of calls, per run, per session, or both.
///
/// ```
/// use tower_agent_layers::limits::{Exit, Limit};
///
/// let limit = Limit::per_run(20).and_per_session(200).exit(Exit::Continue);
/// # let _ = limit;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    run: Option<u32>,
    session: Option<u32>,
    exit: Exit,
}

impl Limit {
    /// At most `n` calls in one run.
    pub fn per_run(n: u32) -> Self {
        Self {
            run: Some(n),
            session: None,
            exit: Exit::End,
        }
    }

    /// At most `n` calls over the session's life.
    pub fn per_session(n: u32) -> Self {
        Self {
            run: None,
            session: Some(n),
            exit: Exit::End,
        }
    }

    /// Also at most `n` calls over the session's life.
    pub fn and_per_session(mut self, n: u32) -> Self {
        self.session = Some(n);
        self
    }

    /// Also at most `n` calls in one run.
    pub fn and_per_run(mut self, n: u32) -> Self {
        self.run = Some(n);
        self
    }

    /// What happens to a blocked call ([`Exit::End`] by default).
    pub fn exit(mut self, exit: Exit) -> Self {
        self.exit = exit;
        self
    }
}

/// Model-call and tool-call limits; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct CallLimitsLayer {
    config: Arc<Config>,
}

impl Default for CallLimitsLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl CallLimitsLayer {
    /// No limit yet.
    pub fn new() -> Self {
        Self {
            config: Arc::new(Config {
                runs: ExtensionKey::new(),
                model: None,
                tools: None,
                per_tool: ByName::default(),
                tool_errors: false,
                slots: 0,
            }),
        }
    }

    fn with(self, scope: impl FnOnce(&mut Config, usize)) -> Self {
        let mut config = Arc::unwrap_or_clone(self.config);
        // Another configuration: its own run counts.
        config.runs = ExtensionKey::new();
        let slot = config.slots;
        config.slots += 1;
        scope(&mut config, slot);
        config.tool_errors = config
            .tools
            .iter()
            .chain(config.per_tool.iter().map(|(_, scope)| scope))
            .any(|s| s.limit.exit == Exit::Error);
        Self {
            config: Arc::new(config),
        }
    }

    /// Limit the model calls.
    pub fn model_calls(self, limit: Limit) -> Self {
        self.with(|config, slot| {
            config.model = Some(Scope {
                name: "model calls".into(),
                key: "model".into(),
                limit,
                slot,
            });
        })
    }

    /// Limit the tool calls, all tools together.
    pub fn tool_calls(self, limit: Limit) -> Self {
        self.with(|config, slot| {
            config.tools = Some(Scope {
                name: "tool calls".into(),
                key: "tools".into(),
                limit,
                slot,
            });
        })
    }

    /// Limit the calls of the tool `name` (besides [`CallLimitsLayer::tool_calls`]).
    pub fn tool(self, name: impl Into<String>, limit: Limit) -> Self {
        let name = name.into();
        self.with(|config, slot| {
            let scope = Scope {
                name: format!("`{name}` calls"),
                key: format!("tool:{name}"),
                limit,
                slot,
            };
            config.per_tool.insert(name, scope);
        })
    }
}

impl<S> Layer<S> for CallLimitsLayer {
    type Service = CallLimits<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CallLimits {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`CallLimitsLayer`] makes: a model service or a tool service.
#[derive(Clone)]
pub struct CallLimits<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> CallLimits<S> {
    /// The layer.
    pub fn layer(layer: &CallLimitsLayer) -> CallLimitsLayer {
        layer.clone()
    }

    tower_agent_core::inner_service_accessors!();
}

impl<S: fmt::Debug> fmt::Debug for CallLimits<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallLimits")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

/// One set of limits on the model and the tools: a refused call reaches nothing below.
impl tower_agent_loop::Builtin for CallLimitsLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::{ModelSlot, ToolSlot};
        stacks.model(ModelSlot::Limits, self.clone());
        stacks.tools(ToolSlot::Limits, self);
    }
}
