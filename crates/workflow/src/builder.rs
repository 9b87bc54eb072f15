//! The workflow layers as `ServiceBuilder` methods.

use tower::ServiceBuilder;
use tower::layer::util::Stack;

use crate::progress::ProgressLayer;
use crate::rules::ToolRulesLayer;

/// The layers of this crate as [`ServiceBuilder`] methods, like `tower-agent-layers`'
/// `ServiceBuilderExt` for the built-in layers.
///
/// Sealed: implemented for `ServiceBuilder` only, so methods can be added without breaking
/// anyone.
///
/// ```
/// use std::time::Duration;
/// use serde_json::json;
/// use tower::ServiceBuilder;
/// use tower_agent_core::{Error, ModelResponse};
/// use tower_agent_loop::Agent;
/// use tower_agent_test::{ScriptedModel, StubTool};
/// use tower_agent_tools::ToolSet;
/// use tower_agent_workflow::WorkflowBuilderExt;
/// use tower_agent_workflow::progress::ProgressLayer;
/// use tower_agent_workflow::rules::ToolRulesLayer;
///
/// let rules = ToolRulesLayer::new().start_with("load_context", json!({}));
/// let model = ServiceBuilder::new()
///     .tool_rules(rules.clone())
///     .service(ScriptedModel::new([ModelResponse::text("done")]));
/// let tools = ServiceBuilder::new()
///     .tool_rules(rules)
///     .service(ToolSet::new().tool(StubTool::returning("load_context", "ctx")));
/// let summarizer = ScriptedModel::new([ModelResponse::text("working")]);
/// let agent = ServiceBuilder::new()
///     .progress(ProgressLayer::new(summarizer).every(Duration::from_secs(5)))
///     .service(Agent::new(model, tools));
/// # let _ = agent;
/// ```
pub trait WorkflowBuilderExt<L>: sealed::Sealed<L> + Sized {
    /// Add a [`ToolRulesLayer`] (the same value on the model and the tool stack).
    fn tool_rules(self, rules: ToolRulesLayer) -> ServiceBuilder<Stack<ToolRulesLayer, L>>;

    /// Add a [`ProgressLayer`] (on an agent service, outermost).
    fn progress(self, progress: ProgressLayer) -> ServiceBuilder<Stack<ProgressLayer, L>>;
}

impl<L> sealed::Sealed<L> for ServiceBuilder<L> {}

impl<L> WorkflowBuilderExt<L> for ServiceBuilder<L> {
    fn tool_rules(self, rules: ToolRulesLayer) -> ServiceBuilder<Stack<ToolRulesLayer, L>> {
        self.layer(rules)
    }

    fn progress(self, progress: ProgressLayer) -> ServiceBuilder<Stack<ProgressLayer, L>> {
        self.layer(progress)
    }
}

mod sealed {
    pub trait Sealed<L> {}
}
