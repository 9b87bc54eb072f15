//! The model service's request and response.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::context::RunContext;
use crate::decision::Interrupt;
use crate::error::Error;
use crate::history::History;
use crate::message::{ContentPart, Message, Role, ToolCall};
use crate::session::StopReason;
pub use crate::session::Usage;
use crate::stream::{Delta, Deltas};

/// A tool offered to the model: its name, what it does, and its parameters as JSON Schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments (an object schema).
    pub parameters: Value,
    /// The tool only reads: running it again, or running it and dropping the result, changes
    /// nothing. An agent built with `early_tool_start(true)` may start a call to it while the
    /// model is still streaming. Not sent to providers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// A second call with the same arguments has no effect the first did not have (an MCP
    /// tool's `idempotentHint`): a call whose answer was lost on the way may be sent again.
    /// A read-only tool is idempotent whatever this says ([`ToolSpec::may_repeat`]). Not sent
    /// to providers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idempotent: bool,
}

impl ToolSpec {
    /// A spec; not read-only.
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            parameters,
            read_only: false,
            idempotent: false,
        }
    }

    /// Mark the tool as one that only reads ([`ToolSpec::read_only`]).
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::ToolSpec;
    ///
    /// let spec = ToolSpec::new("search", "Search the docs.", json!({"type": "object"})).read_only();
    /// assert!(spec.read_only);
    /// ```
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Mark the tool as idempotent ([`ToolSpec::idempotent`]).
    pub fn idempotent(mut self) -> Self {
        self.idempotent = true;
        self
    }

    /// Whether a call of the tool may be sent again when its outcome is unknown (its answer
    /// was lost): it only reads, or a second call changes nothing.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::ToolSpec;
    ///
    /// let spec = |name| ToolSpec::new(name, "", json!({"type": "object"}));
    /// assert!(spec("search").read_only().may_repeat());
    /// assert!(spec("set_title").idempotent().may_repeat());
    /// assert!(!spec("pay").may_repeat());
    /// ```
    pub fn may_repeat(&self) -> bool {
        self.read_only || self.idempotent
    }
}

/// How the model may use tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No tool calls.
    None,
    /// At least one tool call.
    Required,
    /// This tool.
    Tool(String),
}

/// The form the model's answer must take: [`GenerationOptions::response_format`].
///
/// Each provider sends it natively: OpenAI-compatible servers as `response_format` with a
/// `json_schema`, Anthropic as `output_config.format`, Gemini as a JSON `responseMimeType`
/// with a `responseJsonSchema`. The answer's text is then the JSON value.
///
/// ```
/// use serde_json::json;
/// use tower_agent_core::{GenerationOptions, ResponseFormat};
///
/// let verdict = ResponseFormat::json_schema(
///     "verdict",
///     json!({
///         "type": "object",
///         "properties": { "done": { "type": "boolean" }, "reason": { "type": "string" } },
///         "required": ["done", "reason"],
///         "additionalProperties": false
///     }),
/// )
/// .strict(true);
/// let options = GenerationOptions::new().response_format(verdict);
/// assert!(options.response_format.is_some());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ResponseFormat {
    /// A JSON value matching a JSON Schema.
    JsonSchema {
        /// A name for the schema (OpenAI asks for one): letters, digits, `_` and `-`.
        name: String,
        /// The JSON Schema (for a Rust type: `serde_json::to_value(schemars::schema_for!(T))`).
        schema: Value,
        /// Ask the provider to hold the answer to the schema exactly (OpenAI's `strict`;
        /// its schemas then need `additionalProperties: false` and every property required).
        #[serde(default)]
        strict: bool,
    },
}

impl ResponseFormat {
    /// A JSON value matching `schema`, named `name`; not strict.
    pub fn json_schema(name: impl Into<String>, schema: Value) -> Self {
        ResponseFormat::JsonSchema {
            name: name.into(),
            schema,
            strict: false,
        }
    }

    /// Whether the provider should hold the answer to the schema exactly.
    pub fn strict(mut self, strict: bool) -> Self {
        match &mut self {
            ResponseFormat::JsonSchema { strict: s, .. } => *s = strict,
        }
        self
    }
}

/// Sampling and length settings. Providers map what they support and ignore the rest.
///
/// Built with its setters (the type is `non_exhaustive`: fields may be added):
///
/// ```
/// use tower_agent_core::{GenerationOptions, ToolChoice};
///
/// let options = GenerationOptions::new()
///     .temperature(0.2)
///     .max_tokens(1_024)
///     .stop(["\n\nUser:"])
///     .tool_choice(ToolChoice::Required);
/// assert_eq!(options.max_tokens, Some(1_024));
/// assert_eq!(options.tool_choice, Some(ToolChoice::Required));
/// ```
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GenerationOptions {
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// The most tokens to generate.
    pub max_tokens: Option<u32>,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Tool use policy; `None` leaves the provider's default.
    pub tool_choice: Option<ToolChoice>,
    /// The form the answer must take; `None` for free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
}

impl GenerationOptions {
    /// No setting: every provider's default.
    pub fn new() -> Self {
        Self::default()
    }

    /// The sampling temperature.
    pub fn temperature(mut self, temperature: f32) -> Self {
        self.temperature = Some(temperature);
        self
    }

    /// Nucleus sampling.
    pub fn top_p(mut self, top_p: f32) -> Self {
        self.top_p = Some(top_p);
        self
    }

    /// The most tokens to generate.
    pub fn max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }

    /// Stop sequences.
    pub fn stop<I: IntoIterator<Item = S>, S: Into<String>>(mut self, stop: I) -> Self {
        self.stop = stop.into_iter().map(Into::into).collect();
        self
    }

    /// How the model may use tools.
    pub fn tool_choice(mut self, choice: ToolChoice) -> Self {
        self.tool_choice = Some(choice);
        self
    }

    /// The form the answer must take.
    pub fn response_format(mut self, format: ResponseFormat) -> Self {
        self.response_format = Some(format);
        self
    }
}

/// What the model service receives: system instructions, the history, the tools, options and
/// the run context.
///
/// Cloning is cheap: the history, the system prompt, the tool specs and the options are
/// shared. Editing any of them in a layer affects this request only (see [`History`];
/// [`ModelRequest::options_mut`] copies the options first when another request shares them).
#[derive(Debug, Clone)]
pub struct ModelRequest {
    /// System instructions.
    pub system: Option<Arc<str>>,
    /// The conversation so far.
    pub messages: History,
    /// The tools the model may call.
    pub tools: Arc<[ToolSpec]>,
    /// Sampling and length settings, shared by every request of the agent's runs that keeps
    /// them: change them with [`ModelRequest::options_mut`].
    pub options: Arc<GenerationOptions>,
    /// The run this call belongs to.
    pub ctx: RunContext,
    /// The way up for the call's streamed deltas: the filters layers put on, then the run's
    /// readers (see [`stream`](crate::stream)).
    pub deltas: Deltas,
    /// What the layers said about the system prompt's blocks, for the provider's prompt
    /// cache: which stay the same from call to call ([`ModelRequest::append_system`]) and
    /// whether one changes ([`ModelRequest::append_system_volatile`]).
    pub cache: PromptCache,
}

/// What a request's layers said about its system prompt, for the provider's prompt cache.
///
/// Providers cache a prompt's prefix (tools, system prompt, early history) when it is
/// byte-identical from call to call. A provider that takes cache markers (Anthropic) places
/// them from this, after every layer ran: at the ends of the last stable blocks of the system
/// prompt, and at the end of the history unless a block that changes from call to call sits
/// in the system prompt (it would make every history after it new).
///
/// With no marks and no volatile block, the whole system prompt counts as one stable block.
///
/// ```
/// use tower_agent_core::ModelRequest;
///
/// let mut req = ModelRequest::new(vec![]);
/// req.system = Some("You help.".into());
/// req.append_system("Prefer metric units."); // static instructions
/// req.append_system_volatile("Today is Tuesday."); // changes from call to call
/// assert_eq!(req.cache.stable, [9, 31]);
/// assert!(req.cache.volatile);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PromptCache {
    /// The ends of the system prompt's blocks that stay the same from call to call, as byte
    /// offsets into [`ModelRequest::system`], in order.
    pub stable: Vec<usize>,
    /// A block that changes from call to call was appended after them.
    pub volatile: bool,
    /// The name of a resource on the provider's side that holds this request's system
    /// prompt, tools and tool choice, sent instead of them (Gemini's `cachedContents/...`,
    /// set by its `ContextCacheLayer`). A provider without such resources sends the request
    /// whole.
    pub stored: Option<Arc<str>>,
}

impl ModelRequest {
    /// A request for `messages` with no system prompt, no tools, default options and a fresh
    /// context.
    pub fn new(messages: impl Into<History>) -> Self {
        Self {
            system: None,
            messages: messages.into(),
            tools: Arc::from(Vec::new()),
            options: Arc::default(),
            ctx: RunContext::new(),
            deltas: Deltas::default(),
            cache: PromptCache::default(),
        }
    }

    /// The options of this request, to change: copied first when another request shares
    /// them (the agent's own stay as they are).
    ///
    /// ```
    /// use tower_agent_core::{GenerationOptions, ModelRequest};
    ///
    /// let mut req = ModelRequest::new(vec![]);
    /// req.options = GenerationOptions::new().temperature(0.2).into();
    /// let shared = req.clone();
    /// req.options_mut().max_tokens = Some(100);
    /// assert_eq!(req.options.max_tokens, Some(100));
    /// assert_eq!(shared.options.max_tokens, None);
    /// assert_eq!(shared.options.temperature, Some(0.2));
    /// ```
    pub fn options_mut(&mut self) -> &mut GenerationOptions {
        Arc::make_mut(&mut self.options)
    }

    /// Pass a streamed piece of the answer up through the layers' filters to the run's
    /// readers (a provider that streams calls this for every delta).
    ///
    /// # Errors
    ///
    /// A filter stopped the stream (a guardrail), or an observer failed: stop reading and
    /// return it.
    pub async fn send_delta(&self, delta: Delta) -> Result<(), Error> {
        self.deltas.send(&self.ctx, delta).await
    }

    /// The stream ended complete: the filters release what they held back (a provider calls
    /// this once its answer is whole, before returning it).
    ///
    /// # Errors
    ///
    /// As [`send_delta`](Self::send_delta).
    pub async fn end_stream(&self) -> Result<(), Error> {
        self.deltas.end(&self.ctx).await
    }

    /// The call is about to be made again with this request (a retry, a fallback): the
    /// filters forget what they saw, and readers given deltas get an
    /// [`Event::Retract`](crate::Event::Retract).
    ///
    /// # Errors
    ///
    /// An observer's error.
    pub async fn restart_stream(&self) -> Result<(), Error> {
        self.deltas.restart(&self.ctx).await
    }

    /// A layer calls the model again at once with this request after `error` (a fallback, a
    /// repair): the stream restarts ([`restart_stream`](Self::restart_stream)), then readers
    /// get [`Event::Retrying`](crate::Event::Retrying) naming `attempt`, the call's number
    /// from 1.
    ///
    /// # Errors
    ///
    /// An observer's error.
    pub async fn call_again(&self, attempt: u32, error: &Error) -> Result<(), Error> {
        self.restart_stream().await?;
        if !self.ctx.events().is_enabled() {
            return Ok(());
        }
        let event = crate::Event::Retrying {
            round: self.ctx.round(),
            attempt,
            delay: std::time::Duration::ZERO,
            error: error.clone(),
        };
        self.ctx.emit(event).await
    }

    /// Append a block that stays the same from call to call (static instructions, memory) to
    /// the system instructions, separated by a blank line: the provider may cache the prompt
    /// up to its end ([`PromptCache`]).
    ///
    /// ```
    /// use tower_agent_core::ModelRequest;
    ///
    /// let mut req = ModelRequest::new(vec![]);
    /// req.append_system("Be brief.");
    /// req.append_system("Answer in French.");
    /// assert_eq!(req.system.as_deref(), Some("Be brief.\n\nAnswer in French."));
    /// assert_eq!(req.cache.stable, [9, 28]);
    /// ```
    pub fn append_system(&mut self, block: &str) {
        self.append(block);
        if !self.cache.volatile {
            let end = self.system.as_deref().map_or(0, str::len);
            self.cache.stable.push(end);
        }
    }

    /// Append a block that changes from call to call (the date, a count, a reminder) to the
    /// system instructions. Nothing after it can be cached, the history included: prefer the
    /// end of the last message for facts that change often.
    pub fn append_system_volatile(&mut self, block: &str) {
        self.append(block);
        self.cache.volatile = true;
    }

    fn append(&mut self, block: &str) {
        // What came before, said or not, is a block of its own.
        let before = self.system.as_deref().map_or(0, str::len);
        if before > 0 && self.cache.stable.is_empty() && !self.cache.volatile {
            self.cache.stable.push(before);
        }
        self.system = Some(match self.system.take() {
            Some(current) if !current.is_empty() => format!("{current}\n\n{block}").into(),
            _ => Arc::from(block),
        });
    }
}

impl AsRef<RunContext> for ModelRequest {
    fn as_ref(&self) -> &RunContext {
        &self.ctx
    }
}

/// Why the model stopped generating.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// It finished its answer.
    #[default]
    Stop,
    /// It asked for tool calls.
    ToolCalls,
    /// It hit the token limit.
    Length,
    /// A content filter stopped it.
    ContentFilter,
    /// Something else, as the provider named it.
    Other(String),
}

/// What the model service returns: the assistant message, usage, why it stopped, and what the
/// layers it went through did to the run.
///
/// It holds the call's whole effect, so a response saved as JSON and applied later (a replay,
/// a journaled step) does what the live one did:
///
/// - [`history`](Self::history): the history a layer committed (a summary, a repair); the
///   session's history becomes it before the message is appended;
/// - [`stop`](Self::stop): a layer ended the run here (a call limit); the message is not
///   appended;
/// - [`side_usage`](Self::side_usage): tokens of calls a layer made for this one (a
///   summarizer), counted in the run's usage but not in [`usage`](Self::usage).
///
/// ```
/// use tower_agent_core::{History, Message, ModelResponse, StopReason, Usage};
///
/// let mut res = ModelResponse::text("hi").with_usage(Usage::new(10, 2));
/// res.commit(History::from(vec![Message::user("summary")]));
/// let json = serde_json::to_string(&res).unwrap();
/// let back: ModelResponse = serde_json::from_str(&json).unwrap();
/// assert_eq!(back, res);
/// assert_eq!(back.history.unwrap().len(), 1);
///
/// let blocked = ModelResponse::stop(StopReason::Layer { reason: "budget spent".into() });
/// assert!(blocked.stop.is_some());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// The assistant message. The agent appends it to the history as an assistant message,
    /// unless [`stop`](Self::stop) is set.
    pub message: Message,
    /// Tokens used by this call.
    #[serde(default)]
    pub usage: Usage,
    /// Why the model stopped.
    #[serde(default)]
    pub finish_reason: FinishReason,
    /// The history a layer committed during this call: the session's history becomes it
    /// before the message is appended. Set it with [`ModelResponse::commit`].
    ///
    /// The agent checks it: a history whose tool calls are not answered exactly once fails
    /// the run with [`ErrorKind::BadRequest`](crate::ErrorKind::BadRequest), the session left
    /// as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<History>,
    /// A layer ended the run at this call ([`ModelResponse::stop`]): the run ends with
    /// [`Outcome::Stopped`](crate::Outcome::Stopped) and this reason, and the message is not
    /// appended (its calls could not be answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopReason>,
    /// The request was refused before the model answered it ([`ModelResponse::refuse`]: a
    /// guardrail on the input, a call limit, a budget): at a run's first model call, the run's
    /// input is not appended, and the session stays as it was.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
    /// A layer paused the run before the model was called ([`ModelResponse::pause`]): the run
    /// ends [`Interrupted`](crate::Outcome::Interrupted) with it, and the message is not
    /// appended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<Box<Interrupt>>,
    /// Tokens used by calls a layer made for this one (a summarizer's), added to the run's
    /// usage.
    #[serde(default, skip_serializing_if = "Usage::is_zero")]
    pub side_usage: Usage,
    /// Where the response came from, when the provider said: its id and the model that
    /// answered ([`ModelResponse::response_id`], [`ModelResponse::response_model`]). Boxed: a
    /// response passes through every layer by value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Box<ResponseOrigin>>,
}

/// Where a model response came from ([`ModelResponse::origin`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseOrigin {
    /// The provider's id of the response (`gen_ai.response.id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The model that answered, as the provider named it (`gen_ai.response.model`: may be
    /// more precise than the one asked for, `gpt-4o-2024-08-06` for `gpt-4o`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl ModelResponse {
    /// A response carrying `message`; the finish reason is `ToolCalls` when it has calls.
    pub fn new(message: Message) -> Self {
        let finish_reason = if message.has_tool_calls() {
            FinishReason::ToolCalls
        } else {
            FinishReason::Stop
        };
        Self {
            message,
            usage: Usage::default(),
            finish_reason,
            history: None,
            stop: None,
            refused: false,
            pause: None,
            side_usage: Usage::default(),
            origin: None,
        }
    }

    /// The provider's id of this response, when it gave one.
    pub fn response_id(&self) -> Option<&str> {
        self.origin.as_ref()?.id.as_deref()
    }

    /// The model that answered, as the provider named it, when it did.
    pub fn response_model(&self) -> Option<&str> {
        self.origin.as_ref()?.model.as_deref()
    }

    /// Say where the response came from (nothing when neither is known).
    pub fn set_origin(&mut self, id: Option<String>, model: Option<String>) {
        self.origin =
            (id.is_some() || model.is_some()).then(|| Box::new(ResponseOrigin { id, model }));
    }

    /// A call a layer blocked: the run ends here with `reason`
    /// ([`Outcome::Stopped`](crate::Outcome::Stopped)). Its message is empty and is not
    /// appended.
    pub fn stop(reason: StopReason) -> Self {
        let mut response = Self::text("");
        response.stop = Some(reason);
        response
    }

    /// A request a layer refused before the model answered it (a guardrail on the input, a
    /// call limit, a budget): the run ends here with `reason`, as with
    /// [`ModelResponse::stop`], and when this was the run's first model call, the run's input
    /// is withdrawn: nothing refused stays in the session, and the next run goes on from the
    /// next input alone.
    ///
    /// ```
    /// use tower_agent_core::{ModelResponse, StopReason};
    ///
    /// let res = ModelResponse::refuse(StopReason::Limit { name: "model calls per run".into(), limit: 3 });
    /// assert!(res.refused && res.stop.is_some());
    /// ```
    pub fn refuse(reason: StopReason) -> Self {
        let mut response = Self::stop(reason);
        response.refused = true;
        response
    }

    /// A request a layer paused before the model answered it (a spend threshold that asks a
    /// human, a policy): the run ends [`Interrupted`](crate::Outcome::Interrupted) with
    /// `pause` ([`Interrupt::before_model`]), everything before it kept (the run's input
    /// included), and a resume by its key calls the model again, through the same layers.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::{Interrupt, ModelResponse};
    ///
    /// let res = ModelResponse::pause(Interrupt::before_model("over-budget", "budget", json!("go on?")));
    /// assert!(res.pause.is_some() && res.stop.is_none());
    /// ```
    pub fn pause(pause: Interrupt) -> Self {
        let mut response = Self::text("");
        response.pause = Some(Box::new(pause));
        response
    }

    /// Commit `history` as the session's, unless a layer further in already committed one:
    /// that one was made from the request this layer passed on, so it holds this layer's
    /// edit too. Use it in an around (or hand-written) model layer whose edit must outlast the
    /// request (summarization, patching); request edits otherwise shape that request only.
    ///
    /// ```
    /// use tower_agent_core::{History, Message, ModelResponse};
    ///
    /// let mut res = ModelResponse::text("ok");
    /// res.commit(History::from(vec![Message::user("the inner layer's")]));
    /// res.commit(History::from(vec![Message::user("an outer layer's")]));
    /// assert_eq!(res.history.unwrap()[0].text(), "the inner layer's");
    /// ```
    pub fn commit(&mut self, history: History) {
        self.history.get_or_insert(history);
    }

    /// Add `usage` to the tokens of side calls ([`ModelResponse::side_usage`]).
    pub fn add_side_usage(&mut self, usage: Usage) {
        self.side_usage += usage;
    }

    /// The response with `usage` added to the tokens of side calls (a classifier's, a
    /// rejected call's).
    ///
    /// ```
    /// use tower_agent_core::{ModelResponse, Usage};
    ///
    /// let res = ModelResponse::text("ok").with_side_usage(Usage::new(5, 1));
    /// assert_eq!(res.with_side_usage(Usage::new(1, 1)).side_usage, Usage::new(6, 2));
    /// ```
    pub fn with_side_usage(mut self, usage: Usage) -> Self {
        self.side_usage += usage;
        self
    }

    /// A text answer.
    pub fn text(text: impl Into<String>) -> Self {
        Self::new(Message::assistant(text))
    }

    /// An answer asking for `calls`.
    pub fn tool_calls(calls: impl IntoIterator<Item = ToolCall>) -> Self {
        Self::new(Message::assistant_with_calls("", calls))
    }

    /// Set the usage.
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = usage;
        self
    }

    /// Rewrite the message's text with `f`, keeping its tool calls, reasoning, usage and
    /// finish reason (see [`Message::map_text`]). Use it to redact or reformat in an
    /// `after_model` callback: building a new `ModelResponse::text` instead would drop the
    /// tool calls, and the run would stop calling tools.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::{ModelResponse, ToolCall, Usage};
    ///
    /// let usage = Usage::new(10, 5);
    /// let res = ModelResponse::tool_calls([ToolCall::new("c1", "t", json!({}))]).with_usage(usage);
    /// let res = res.map_text(|_| "checking...".into());
    /// assert_eq!(res.message.text(), "checking...");
    /// assert_eq!(res.message.tool_calls().count(), 1);
    /// assert_eq!(res.usage, usage);
    /// ```
    pub fn map_text(mut self, f: impl FnOnce(String) -> String) -> Self {
        self.message = self.message.map_text(f);
        self
    }

    /// An assistant message made of `parts`.
    pub fn from_parts(parts: Vec<ContentPart>) -> Self {
        Self::new(Message {
            role: Role::Assistant,
            content: parts,
        })
    }
}
