//! The selection service: choose, filter, call.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::Either;
use serde_json::{Value, json};
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{
    Error, GenerationOptions, Message, ModelRequest, ModelResponse, ResponseFormat, Role,
    SideModel, ToolChoice, ToolSpec, Usage,
};
use tower_service::Service;

use super::{Config, Memo, Selector, ToolSelectLayer};

/// Offers each model call the tools its selector chose; see the [module docs](super).
#[derive(Clone)]
pub struct ToolSelect<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> ToolSelect<S> {
    /// Wrap `inner` with the selector of `layer`.
    pub fn new(inner: S, layer: &ToolSelectLayer) -> Self {
        tower_layer::Layer::layer(layer, inner)
    }

    pub(super) fn from_config(inner: S, config: Arc<Config>) -> Self {
        Self { inner, config }
    }

    tower_agent_core::inner_service_accessors!();
}

impl<S: fmt::Debug> fmt::Debug for ToolSelect<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolSelect")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> Service<ModelRequest> for ToolSelect<S>
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = ModelResponse;
    type Error = Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: ModelRequest) -> Self::Future {
        let config = &self.config;
        let applies = !req.ctx.is_side_call()
            && (config.capped || config.max_tools.is_none_or(|max| req.tools.len() > max));
        if applies {
            match &config.selector {
                Selector::Closure(select) => {
                    let names = select(&req);
                    req.tools = config.keep(&req, &names);
                }
                Selector::Model(model) => {
                    let Some(asked) = last_user_text(&req) else {
                        return Either::Left(self.inner.call(req));
                    };
                    match req.ctx.extension_at(&config.memo) {
                        Some(memo) if *memo.asked == *asked => {
                            if let Some(names) = &memo.names {
                                req.tools = config.keep(&req, names);
                            }
                        }
                        _ => {
                            let clone = self.inner.clone();
                            let inner = std::mem::replace(&mut self.inner, clone);
                            let future = select_then_call(
                                Arc::clone(config),
                                model.clone(),
                                inner,
                                req,
                                asked.into(),
                            );
                            return Either::Right(Box::pin(future));
                        }
                    }
                }
            }
        }
        Either::Left(self.inner.call(req))
    }
}

/// The response future of [`ToolSelect`]: the inner service's, or a boxed one that selects
/// and then calls the inner service.
pub type ResponseFuture<F> = Either<F, BoxFuture<'static, Result<ModelResponse, Error>>>;

/// Ask the model which tools, remember its choice for the run, filter, call.
async fn select_then_call<S>(
    config: Arc<Config>,
    model: SideModel,
    mut inner: S,
    mut req: ModelRequest,
    asked: Arc<str>,
) -> Result<ModelResponse, Error>
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error>,
{
    let (names, spent) = ask(&config, &model, &req, &asked).await;
    if let Some(names) = &names {
        req.tools = config.keep(&req, names);
    }
    req.ctx
        .insert_extension_at(&config.memo, Memo { asked, names });
    let response = inner.call(req).await;
    match response {
        Ok(response) => Ok(response.with_side_usage(spent)),
        Err(error) => Err(error.add_usage(spent)),
    }
}

/// The names the model chose, or `None` when it failed or named no tool it was offered (every
/// tool is then kept); and what it spent.
async fn ask(
    config: &Config,
    model: &SideModel,
    req: &ModelRequest,
    asked: &str,
) -> (Option<Arc<[String]>>, Usage) {
    let mut request = ModelRequest::new(vec![Message::user(prompt(config, &req.tools, asked))]);
    request.system = Some(SYSTEM.into());
    let format = ResponseFormat::json_schema("tool_selection", schema(&req.tools));
    request.options = GenerationOptions::new().response_format(format).into();
    request.ctx = req.ctx.side_call();
    let answer = match model.ask(request).await {
        Ok(answer) => answer,
        Err(error) => {
            tracing::warn!(%error, "tool selection failed: every tool is offered");
            return (None, error.usage());
        }
    };
    let spent = answer.usage + answer.side_usage;
    let text = answer.message.text();
    let names = read_names(&text).filter(|names| {
        names.is_empty() || names.iter().any(|n| req.tools.iter().any(|t| t.name == *n))
    });
    if names.is_none() {
        // The answer may quote the user: only its length is logged.
        tracing::warn!(
            answer_bytes = text.len(),
            "tool selection unreadable: every tool is offered"
        );
    }
    (names.map(Into::into), spent)
}

/// The most characters of the user's message the selector is shown.
const MAX_ASKED_CHARS: usize = 4_000;

const SYSTEM: &str = "You choose the tools an assistant will be offered for a user's request. \
Name only tools from the list, the most useful first, and no tool the request does not need.";

fn prompt(config: &Config, tools: &[ToolSpec], asked: &str) -> String {
    let mut prompt = String::from("The tools:\n");
    for tool in tools {
        let description = tool.description.lines().next().unwrap_or_default();
        let description: String = description.chars().take(200).collect();
        prompt.push_str(&format!("- {}: {description}\n", tool.name));
    }
    prompt.push_str("\nThe request:\n");
    // A pasted document says little more about the tools than its start does.
    let end = asked
        .char_indices()
        .nth(MAX_ASKED_CHARS)
        .map_or(asked.len(), |(i, _)| i);
    prompt.push_str(&asked[..end]);
    prompt.push_str("\n\nAnswer with JSON: {\"tools\": [names]}");
    if let Some(max) = config.max_tools {
        prompt.push_str(&format!(", at most {max} names"));
    }
    prompt.push('.');
    prompt
}

/// `{"tools": [names]}`, the names one of the offered tools'.
fn schema(tools: &[ToolSpec]) -> Value {
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    json!({
        "type": "object",
        "properties": {"tools": {"type": "array", "items": {"type": "string", "enum": names}}},
        "required": ["tools"],
        "additionalProperties": false
    })
}

/// The names in an answer: `{"tools": [..]}` or a bare array, alone or in a code fence.
pub(crate) fn read_names(answer: &str) -> Option<Vec<String>> {
    let start = answer.find(['{', '['])?;
    let end = answer.rfind(['}', ']'])?;
    let value: Value = serde_json::from_str(answer.get(start..=end)?).ok()?;
    let list = match &value {
        Value::Object(object) => object.get("tools")?,
        list => list,
    };
    list.as_array()?
        .iter()
        .map(|name| name.as_str().map(str::to_owned))
        .collect()
}

/// The text of the last message the user wrote, if any.
fn last_user_text(req: &ModelRequest) -> Option<String> {
    req.messages
        .iter()
        .rev()
        .filter(|m| m.role == Role::User)
        .map(Message::text)
        .find(|text| !text.trim().is_empty())
}

impl Config {
    /// The request's tools named in `names` (the first `max_tools` of them that exist), kept
    /// always or forced by the request's tool choice, in their order; every tool when that
    /// leaves none.
    pub(crate) fn keep(&self, req: &ModelRequest, names: &[String]) -> Arc<[ToolSpec]> {
        let tools = &req.tools;
        let forced = match &req.options.tool_choice {
            Some(ToolChoice::Tool(name)) => Some(name.as_str()),
            _ => None,
        };
        let exists = |name: &String| tools.iter().any(|t| t.name == *name);
        let is_always = |name: &str| forced == Some(name) || self.always.iter().any(|a| a == name);
        let mut chosen: Vec<&str> = Vec::new();
        for name in names.iter().filter(|n| exists(n) && !is_always(n)) {
            if !chosen.contains(&name.as_str()) {
                chosen.push(name);
            }
        }
        chosen.truncate(self.max_tools.unwrap_or(usize::MAX));
        let kept: Vec<ToolSpec> = tools
            .iter()
            .filter(|t| is_always(&t.name) || chosen.contains(&t.name.as_str()))
            .cloned()
            .collect();
        // No tools at all would leave the calls in the history undefined (Anthropic refuses
        // that) and a `Required` choice unmeetable.
        if kept.is_empty() || kept.len() == tools.len() {
            Arc::clone(tools)
        } else {
            kept.into()
        }
    }
}
