//! Tool selection: each model call is offered the tools that matter for the request, not all
//! of them.
//!
//! An agent with fifty tools sends fifty specs with every call: tokens paid for, and a model
//! that picks worse among many. [`ToolSelectLayer`] keeps in the request's tools the ones a
//! selector names, plus those you always keep ([`always`](ToolSelectLayer::always)), in the
//! order the tool service gave them. **It only changes what the model is offered**: the
//! agent still routes any call to the whole tool service, so a call to a tool the model was
//! not offered (one it remembers from earlier in the conversation) still runs.
//!
//! Two selectors:
//!
//! - [`by`](ToolSelectLayer::by): a closure of yours reads the request (its system prompt,
//!   history, tools) and names the tools (by a keyword, by the user's plan, by an embedding
//!   search of your own). It is asked at every call.
//! - [`model`](ToolSelectLayer::model): a cheap model, as LangChain's `LLMToolSelector`
//!   does. It is given the tools' names, the first line of their descriptions and the user's
//!   last message (its first 4,000 characters; not the system prompt, nor earlier turns, so a
//!   bare "go ahead" tells it little), and answers with the names, as JSON (the request asks
//!   for it with a response format whose schema lists the names). It is asked once per run
//!   and user message: the run's later rounds reuse its choice, so a run of ten rounds pays
//!   for one selection; a run resumed later asks again. Its tokens are the response's side
//!   usage. A selector that fails, or answers with no name it knows, leaves every tool
//!   offered for the rest of the run (a warning is logged): a selection never ends a run.
//!
//! A tool the request forces (`ToolChoice::Tool`) is always kept; a selection that would leave
//! no tool at all leaves every tool (the calls in the history must stay defined).
//! [`max_tools`](ToolSelectLayer::max_tools) caps how many selected tools are kept (the
//! always-kept ones come on top), and a request with no more tools than that is left as it
//! is, the selector not asked; [`cap`](ToolSelectLayer::cap) is LangChain's `max_tools`, which
//! asks the selector whatever the number of tools. A call on the side of the run (a summary) is
//! left as it is.
//! Tools that layers add are selected like the others: keep eviction's read tool with
//! `.always(evict::READ_TOOL)` when results are evicted.
//!
//! **The prompt cache.** The tools come first in a provider's cached prefix: a selection that
//! changes makes the prefix new. Within a run a model's selection does not change; a closure's
//! should not either, unless it means to.
//!
//! In the agent builder it sits right inside the instructions (slot `select`), so summarization
//! counts only the tools the model is offered.
//!
//! ```
//! use serde_json::json;
//! use tower::{Layer, ServiceExt};
//! use tower_agent_core::{Message, ModelRequest, ModelResponse, ToolSpec};
//! use tower_agent_layers::select::ToolSelectLayer;
//! use tower_agent_test::ScriptedModel;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_agent_core::Error> {
//! let spec = |name: &str| ToolSpec::new(name, format!("The {name} tool."), json!({"type": "object"}));
//! let model = ScriptedModel::new([ModelResponse::text("ok")]);
//! let select = ToolSelectLayer::by(|req: &ModelRequest| {
//!     let asked = req.messages.last().map(|m| m.text()).unwrap_or_default();
//!     if asked.contains("weather") { vec!["forecast".to_string()] } else { Vec::new() }
//! })
//! .always("search");
//!
//! let mut req = ModelRequest::new(vec![Message::user("What is the weather in Oslo?")]);
//! req.tools = ["search", "forecast", "calendar", "email"].map(spec).into();
//! select.layer(model.clone()).oneshot(req).await?;
//! let offered: Vec<String> = model.requests()[0].tools.iter().map(|t| t.name.clone()).collect();
//! assert_eq!(offered, ["search", "forecast"]);
//! # Ok(())
//! # }
//! ```

mod service;
/// Tool selection on the model, right inside the instructions, so that summarization counts
/// only the tools offered.
impl tower_agent_loop::Builtin for ToolSelectLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::ModelSlot;
        stacks.model(ModelSlot::Select, self);
    }
}

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;

use tower_agent_core::{ExtensionKey, ModelRequest, SideModel};
use tower_layer::Layer;

pub use service::{ResponseFuture, ToolSelect};

type SelectFn = Arc<dyn Fn(&ModelRequest) -> Vec<String> + Send + Sync>;

/// Applies [`ToolSelect`]; see the [module docs](self).
#[derive(Clone)]
pub struct ToolSelectLayer {
    config: Arc<Config>,
}

#[derive(Clone)]
enum Selector {
    Closure(SelectFn),
    Model(SideModel),
}

pub(crate) struct Config {
    selector: Selector,
    always: Vec<String>,
    max_tools: Option<usize>,
    /// The selector is asked even when the request has no more than `max_tools` tools.
    capped: bool,
    /// The model's choice in a run, with the message it was made for.
    memo: ExtensionKey<Memo>,
}

/// A run's selection: the user's message it was made for, and the names chosen.
#[derive(Clone)]
pub(crate) struct Memo {
    asked: Arc<str>,
    names: Option<Arc<[String]>>,
}

impl ToolSelectLayer {
    /// Offer the tools `select` names for the request (and the always-kept ones).
    pub fn by(select: impl Fn(&ModelRequest) -> Vec<String> + Send + Sync + 'static) -> Self {
        Self::with_selector(Selector::Closure(Arc::new(select)))
    }

    /// Offer the tools `model` (a cheap one) picks from the names and descriptions, for the
    /// user's last message; once per run and message.
    pub fn model(model: SideModel) -> Self {
        Self::with_selector(Selector::Model(model))
    }

    fn with_selector(selector: Selector) -> Self {
        Self {
            config: Arc::new(Config {
                selector,
                always: Vec::new(),
                max_tools: None,
                capped: false,
                memo: ExtensionKey::new(),
            }),
        }
    }

    fn edit(self, change: impl FnOnce(&mut Config)) -> Self {
        let config = &self.config;
        let mut config = Config {
            selector: config.selector.clone(),
            always: config.always.clone(),
            max_tools: config.max_tools,
            capped: config.capped,
            memo: ExtensionKey::new(),
        };
        change(&mut config);
        Self {
            config: Arc::new(config),
        }
    }

    /// Always offer `tool`, whatever the selector says.
    pub fn always(self, tool: impl Into<String>) -> Self {
        let tool = tool.into();
        self.edit(|c| c.always.push(tool))
    }

    /// Keep at most `max` of the selected tools (the first named), on top of the always-kept
    /// ones; a request with no more than `max` tools is left as it is, the selector not asked
    /// (a selection there could only drop tools, for a model call). This differs from
    /// LangChain's `max_tools`, which always selects: [`cap`](Self::cap) is theirs.
    pub fn max_tools(self, max: usize) -> Self {
        self.edit(|c| {
            c.max_tools = Some(max);
            c.capped = false;
        })
    }

    /// Keep at most `max` of the selected tools, and ask the selector for every request, however
    /// few its tools: LangChain's `LLMToolSelectorMiddleware(max_tools=..)`. A request with
    /// three tools and a cap of five is offered the ones the selector names.
    pub fn cap(self, max: usize) -> Self {
        self.edit(|c| {
            c.max_tools = Some(max);
            c.capped = true;
        })
    }
}

impl fmt::Debug for ToolSelectLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let selector = match self.config.selector {
            Selector::Closure(_) => "closure",
            Selector::Model(_) => "model",
        };
        f.debug_struct("ToolSelectLayer")
            .field("selector", &selector)
            .field("always", &self.config.always)
            .field("max_tools", &self.config.max_tools)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ToolSelectLayer {
    type Service = ToolSelect<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ToolSelect::from_config(inner, Arc::clone(&self.config))
    }
}
