//! Structured output that holds: the model's answer is checked against the request's
//! [`ResponseFormat`], and an answer that does not match is sent back with what is wrong, a
//! bounded number of times.
//!
//! A provider that supports structured output natively (every provider of
//! `tower-agent-providers` sends the format) mostly answers in shape, but a weaker model, a
//! server that ignores the format, or a schema the provider enforces only loosely (a pattern,
//! a bound) can still answer with something else. [`StructuredLayer`] validates the answer's
//! text as JSON against the format's schema (with the `jsonschema` crate). When it does not
//! match, the layer asks the model again with the invalid answer and the validation errors
//! appended to the request, up to [`StructuredLayer::repairs`] times (2 by default). The
//! loop sees only the answer that matched: the repair exchange is not in the session. When no
//! answer matched, the call fails with [`ErrorKind::InvalidResponse`] and a [`Mismatch`]
//! source naming the errors and the last answer, unless [`StructuredLayer::let_last_through`]
//! lets that last answer through (with an [`Event::Warning`]). An answer that calls tools is
//! not a final answer and is not checked against the format.
//!
//! An answer that is one JSON value in a Markdown code fence (`` ```json ... ``` ``, as many
//! models write it) is taken without a repair: its text becomes the bare JSON (stream readers
//! get it, after a retraction of the fenced text), as Vercel AI's `extractJson` and
//! LangChain's JSON parsers take it.
//!
//! With [`StructuredLayer::tool_arguments`], tool calls get the same repair: a call whose
//! arguments are not JSON or do not match its tool's parameter schema is answered with the
//! errors (and the message's other calls with "not run"), and the model asked again, before
//! any tool runs. A call to a tool the request does not offer is left to the loop.
//!
//! Before each repair the request's stream restarts: readers discard the deltas of the answer
//! that did not match ([`Event::Retract`]), then an [`Event::Retrying`] names the mismatch.
//! The tokens of the answers that did not match are added to the side usage.
//!
//! `Agent::builder().with(StructuredLayer::new())` places it inside the host's model layers,
//! outside the fallback and the retry: every repair is a model call of its own, retried and fallen back
//! like any other, and the guardrails and model layers see only the answer that matched.
//!
//! ```
//! use serde_json::json;
//! use tower::{Layer, ServiceExt};
//! use tower_agent_core::{Error, GenerationOptions, Message, ModelRequest, ModelResponse, ResponseFormat};
//! use tower_agent_layers::structured::StructuredLayer;
//! use tower_agent_test::ScriptedModel;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let model = ScriptedModel::new([
//!     ModelResponse::text(r#"{"city": "Paris"}"#),
//!     ModelResponse::text(r#"{"city": "Paris", "days": 3}"#),
//! ]);
//! let format = ResponseFormat::json_schema("trip", json!({
//!     "type": "object",
//!     "properties": { "city": { "type": "string" }, "days": { "type": "integer" } },
//!     "required": ["city", "days"]
//! }));
//! let mut req = ModelRequest::new(vec![Message::user("Plan a trip.")]);
//! req.options = GenerationOptions::new().response_format(format).into();
//!
//! let res = StructuredLayer::new().layer(model.clone()).oneshot(req).await?;
//! assert_eq!(res.message.text(), r#"{"city": "Paris", "days": 3}"#);
//! // The second call saw the first answer and what was wrong with it.
//! let repair = model.requests()[1].messages.as_slice()[2].text();
//! assert!(repair.contains("\"days\" is a required property"), "{repair}");
//! # Ok(())
//! # }
//! ```
//!
//! [`Event::Retrying`]: tower_agent_core::Event::Retrying
//! [`Event::Retract`]: tower_agent_core::Event::Retract
//! [`Event::Warning`]: tower_agent_core::Event::Warning

use std::fmt;
use std::task::{Context, Poll};

use serde_json::Value;
use tower_agent_core::{
    BoxError, ContentPart, Error, ErrorKind, Event, Message, ModelRequest, ModelResponse,
    ResponseFormat, ToolCall, ToolResult, Usage,
};
use tower_layer::Layer;
use tower_service::Service;

/// The most validation errors shown to the model (and kept in a [`Mismatch`]) per answer.
const MAX_ERRORS: usize = 8;

/// Structured output checked and repaired; see the [module docs](self).
#[derive(Debug, Clone, Copy)]
pub struct StructuredLayer {
    repairs: u32,
    tool_arguments: bool,
    let_last_through: bool,
}

impl Default for StructuredLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl StructuredLayer {
    /// Answers checked against the response format, 2 repairs, tool arguments not checked.
    pub fn new() -> Self {
        Self {
            repairs: 2,
            tool_arguments: false,
            let_last_through: false,
        }
    }

    /// How many times an answer that does not match is sent back (0: fail at once).
    pub fn repairs(mut self, repairs: u32) -> Self {
        self.repairs = repairs;
        self
    }

    /// When the repairs run out, let the last answer through instead of failing the call,
    /// with an [`Event::Warning`] (source `"structured"`)
    /// naming what is wrong: LangChain's behaviour when its tool-argument repairs run out. Off
    /// by default: the caller asked for a shape, and an answer out of shape is an error.
    pub fn let_last_through(mut self, let_through: bool) -> Self {
        self.let_last_through = let_through;
        self
    }

    /// Also check every tool call's arguments against its tool's parameter schema, and repair
    /// the calls that do not match before any tool runs. Off by default: the loop already
    /// answers a call whose arguments a tool cannot read with an error the model sees.
    pub fn tool_arguments(mut self, check: bool) -> Self {
        self.tool_arguments = check;
        self
    }
}

impl<S> Layer<S> for StructuredLayer {
    type Service = Structured<S>;

    fn layer(&self, inner: S) -> Structured<S> {
        Structured {
            inner,
            layer: *self,
        }
    }
}

/// The service [`StructuredLayer`] makes.
#[derive(Debug, Clone)]
pub struct Structured<S> {
    inner: S,
    layer: StructuredLayer,
}

/// Why an answer was refused: the source of the error when no answer matched.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Mismatch {
    /// What it had to match: the response format's name, or `tool <name>`.
    pub against: String,
    /// What is wrong, one line each (at most 8), each naming where in the value.
    pub errors: Vec<String>,
    /// The answer's text, or the call's arguments.
    pub text: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "does not match {}: {}",
            self.against,
            self.errors.join("; ")
        )
    }
}

impl std::error::Error for Mismatch {}

/// The boxed future of [`Structured`].
pub type ResponseFuture = tower_agent_core::event::BoxFuture<'static, Result<ModelResponse, Error>>;

impl<S> Service<ModelRequest> for Structured<S>
where
    S: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ModelResponse;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, request: ModelRequest) -> Self::Future {
        let layer = self.layer;
        if request.options.response_format.is_none() && !layer.tool_arguments {
            // Nothing to check: straight through.
            let answer = self.inner.call(request);
            return Box::pin(async move { answer.await.map_err(|e| Error::from_boxed(e.into())) });
        }
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let mut request = request;
            let mut spent = Usage::default();
            let mut attempt = 0;
            loop {
                let mut response = inner
                    .call(request.clone())
                    .await
                    .map_err(|e| Error::from_boxed(e.into()).add_usage(spent))?;
                unfence(&request, &mut response.message);
                // A layer inside stopped or paused the run: nothing to hold to a format.
                if response.stop.is_some() || response.pause.is_some() {
                    return Ok(response.with_side_usage(spent));
                }
                let refusal = match layer.check(&request, &response) {
                    Ok(None) => return Ok(response.with_side_usage(spent)),
                    Ok(Some(refusal)) => refusal,
                    Err(e) => {
                        return Err(e.with_usage(spent + response.usage + response.side_usage));
                    }
                };
                // The tokens of the answers refused before this one.
                let before = spent;
                spent += response.usage + response.side_usage;
                let mismatch = refusal.mismatch;
                if attempt == layer.repairs {
                    let message = format!(
                        "the model's answer {mismatch} (after {} repairs)",
                        layer.repairs
                    );
                    if layer.let_last_through {
                        let warning = Event::Warning {
                            source: "structured",
                            message: format!("{message}: let through"),
                        };
                        request
                            .ctx
                            .emit(warning)
                            .await
                            .map_err(|e| e.with_usage(spent))?;
                        return Ok(response.with_side_usage(before));
                    }
                    let error = Error::new(ErrorKind::InvalidResponse, message);
                    return Err(error.with_source(mismatch).with_usage(spent));
                }
                attempt += 1;
                tracing::warn!(attempt, %mismatch, "the answer does not match; asking again");
                // The repaired answer replaces this one: readers discard what streamed.
                let error = Error::new(ErrorKind::InvalidResponse, mismatch.to_string());
                request
                    .call_again(attempt + 1, &error)
                    .await
                    .map_err(|e| e.with_usage(spent))?;
                request.messages.push(response.message);
                request.messages.extend(refusal.feedback);
            }
        })
    }
}

/// When the request asks for JSON and `message` (an answer, no tool calls) is not JSON but one
/// JSON value in a Markdown code fence, make its text the bare JSON.
fn unfence(request: &ModelRequest, message: &mut Message) {
    let Some(ResponseFormat::JsonSchema { .. }) = &request.options.response_format else {
        return;
    };
    if message.has_tool_calls() {
        return;
    }
    let text = message.text();
    if serde_json::from_str::<Value>(text.trim()).is_ok() {
        return;
    }
    let Some(inner) = fenced(&text) else { return };
    if serde_json::from_str::<Value>(inner).is_err() {
        return;
    }
    let inner = inner.to_owned();
    message
        .content
        .retain(|part| !matches!(part, ContentPart::Text { .. }));
    message.content.push(ContentPart::Text { text: inner });
}

/// The inside of `text` when it is one Markdown code fence (` ``` ` or ` ```json `, blank
/// space around it), trimmed.
fn fenced(text: &str) -> Option<&str> {
    let text = text.trim();
    let body = text.strip_prefix("```")?.strip_suffix("```")?;
    let (info, body) = body.split_once('\n')?;
    match info.trim() {
        "" | "json" | "JSON" => Some(body.trim()),
        _ => None,
    }
}

/// An answer refused, and the messages that tell the model why.
struct Refusal {
    mismatch: Mismatch,
    feedback: Vec<Message>,
}

impl StructuredLayer {
    /// Why `response` does not answer `request`, if it does not.
    ///
    /// # Errors
    ///
    /// A schema that is not a valid JSON Schema ([`ErrorKind::BadRequest`]): no repair can fix
    /// it.
    fn check(
        &self,
        request: &ModelRequest,
        response: &ModelResponse,
    ) -> Result<Option<Refusal>, Error> {
        let has_calls = response.message.tool_calls().next().is_some();
        match &request.options.response_format {
            Some(format) if !has_calls => check_answer(format, response),
            _ if self.tool_arguments && has_calls => {
                check_calls(request, response.message.tool_calls())
            }
            _ => Ok(None),
        }
    }
}

/// The answer's text against the response format.
fn check_answer(
    format: &ResponseFormat,
    response: &ModelResponse,
) -> Result<Option<Refusal>, Error> {
    let ResponseFormat::JsonSchema { name, schema, .. } = format else {
        return Ok(None);
    };
    let text = response.message.text();
    let errors = match serde_json::from_str::<Value>(text.trim()) {
        Ok(value) => validate(schema, &value, || format!("the response format `{name}`"))?,
        Err(error) => vec![format!("the answer is not JSON ({error})")],
    };
    if errors.is_empty() {
        return Ok(None);
    }
    let feedback = Message::user(format!(
        "Your answer does not match the response format `{name}`:\n- {}\nAnswer again with \
         only a JSON value that matches its schema.",
        errors.join("\n- ")
    ));
    Ok(Some(Refusal {
        mismatch: Mismatch {
            against: format!("the response format `{name}`"),
            errors,
            text,
        },
        feedback: vec![feedback],
    }))
}

/// Every call's arguments against its tool's parameters: the first call that does not match
/// is the mismatch; every call is answered (the invalid ones with their errors).
fn check_calls<'c>(
    request: &ModelRequest,
    calls: impl Iterator<Item = &'c ToolCall>,
) -> Result<Option<Refusal>, Error> {
    let mut first: Option<Mismatch> = None;
    let mut results = Vec::new();
    for call in calls {
        let errors = match request.tools.iter().find(|spec| spec.name == call.name) {
            Some(spec) => match serde_json::from_str::<Value>(&call.arguments) {
                Ok(value) => {
                    validate(&spec.parameters, &value, || format!("tool `{}`", call.name))?
                }
                Err(error) => vec![format!("the arguments are not JSON ({error})")],
            },
            // The loop answers a call to a tool it does not serve.
            None => Vec::new(),
        };
        if errors.is_empty() {
            results.push(ToolResult::error(
                call,
                "Not run: another call of this message has invalid arguments. Make this call \
                 again if you still need it.",
            ));
            continue;
        }
        results.push(ToolResult::error(
            call,
            format!(
                "Invalid arguments:\n- {}\nCall the tool again with arguments that match its \
                 schema.",
                errors.join("\n- ")
            ),
        ));
        first.get_or_insert_with(|| Mismatch {
            against: format!("tool `{}`", call.name),
            errors,
            text: call.arguments.clone(),
        });
    }
    Ok(first.map(|mismatch| Refusal {
        mismatch,
        feedback: results.into_iter().map(Message::tool_result).collect(),
    }))
}

/// What is wrong with `value` under `schema`, one line per error (at most [`MAX_ERRORS`]);
/// empty when it matches.
///
/// # Errors
///
/// `schema` (of what `whose` names) is not a valid JSON Schema: [`ErrorKind::BadRequest`].
fn validate(
    schema: &Value,
    value: &Value,
    whose: impl FnOnce() -> String,
) -> Result<Vec<String>, Error> {
    let validator = jsonschema::validator_for(schema).map_err(|error| {
        let message = format!(
            "the schema of {} is not a valid JSON Schema: {error}",
            whose()
        );
        Error::new(ErrorKind::BadRequest, message)
    })?;
    Ok(validator
        .iter_errors(value)
        .take(MAX_ERRORS)
        .map(|error| {
            let at = error.instance_path().to_string();
            if at.is_empty() {
                error.to_string()
            } else {
                format!("at {at}: {error}")
            }
        })
        .collect())
}

/// Structured output on the model, inside the patch, outside the budget, the fallback and the
/// retry: each repair is a call of its own; the host's model layers see only the answer that
/// matched.
impl tower_agent_loop::Builtin for StructuredLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::ModelSlot;
        stacks.model(ModelSlot::Structured, self);
    }
}
