//! The layer that applies the rules to what goes to the model, what comes back, and what tools
//! return.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_agent_core::history::HistoryFold;
use tower_agent_core::{
    AgentInput, AgentRequest, BoxError, ContentPart, DescribeTools, Error, ExtensionKey, History,
    Message, ModelRequest, ModelResponse, RunContext, ToolRequest, ToolResponse, ToolSpec,
};
use tower_layer::Layer;
use tower_service::Service;

use super::Rules;
use super::stream::RedactFilter;

/// Redaction of what the model reads and writes, and of tool results, with one set of
/// [`Rules`]: one value on the agent service, on the model stack (outermost, so the summarizer
/// and every other layer see redacted text) and on the tool stack.
///
/// - **The run's input** (on the agent service): the new messages and the session's history
///   are redacted before the run starts, so what the run saves first, what a cancelled run
///   returns and what every layer sees is redacted; nothing raw is written to a store placed
///   outside it.
/// - **Model input**: the text of the messages added since the last call (user messages, tool
///   results, the model's own) is redacted before the call, and the redacted history is
///   committed to the session: a secret a user typed never reaches the model, nor the session
///   that is saved. Only the new messages are scanned, and the ones before keep their place, so
///   a provider's cache of encoded messages holds.
/// - **Model output**: the response's text, reasoning and tool-call arguments (each JSON string
///   value) are redacted before the session gets them: a tool is called with the redacted
///   arguments.
/// - **Tool results**: redacted before the model sees them, and so are the arguments a call
///   ran with when they are not the model's (an approval's edit): both go into the session.
///
/// - **Streamed output**: the deltas of the model's text and reasoning are redacted on their
///   way up ([`stream`](tower_agent_core::stream)), holding back only the tail in which a
///   match could still be growing (on prose, the word being written; see
///   [`RedactStream`](super::RedactStream)), so a secret split across two deltas never reaches
///   a reader, not even in part; what the readers put together is the redacted message.
///
/// ```
/// use tower::{Layer, ServiceExt};
/// use tower_agent_core::{Error, Message, ModelRequest, ModelResponse};
/// use tower_agent_layers::redact::{RedactLayer, Rules};
/// use tower_agent_test::ScriptedModel;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let model = ScriptedModel::new([ModelResponse::text("Write to bob@example.com.")]);
/// let redacted = RedactLayer::new(Rules::new().emails()).layer(model.clone());
/// let res = redacted.oneshot(ModelRequest::new(vec![Message::user("I am ada@example.com")])).await?;
/// assert_eq!(res.message.text(), "Write to [REDACTED:email].");
/// assert_eq!(model.requests()[0].messages[0].text(), "I am [REDACTED:email]");
/// assert_eq!(res.history.expect("committed")[0].text(), "I am [REDACTED:email]");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedactLayer {
    rules: Arc<Rules>,
    /// How far, in a run, the history was redacted.
    redacted: ExtensionKey<HistoryFold<()>>,
}

impl fmt::Debug for RedactLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedactLayer")
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

impl RedactLayer {
    /// Redact with `rules`.
    pub fn new(rules: Rules) -> Self {
        Self {
            rules: Arc::new(rules),
            redacted: ExtensionKey::new(),
        }
    }

    /// The rules.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }
}

impl<S> Layer<S> for RedactLayer {
    type Service = Redact<S>;

    fn layer(&self, inner: S) -> Redact<S> {
        Redact {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`RedactLayer`] makes.
#[derive(Clone)]
pub struct Redact<S> {
    inner: S,
    layer: RedactLayer,
}

impl<S> fmt::Debug for Redact<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redact")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

impl<S: DescribeTools> DescribeTools for Redact<S> {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        self.inner.tool_specs()
    }
}

/// Whether redacting `message` changes it (nothing is changed).
fn needs(rules: &Rules, message: &Message) -> bool {
    message.content.iter().any(|part| match part {
        ContentPart::Text { text } | ContentPart::Reasoning { text, .. } => {
            matches!(rules.redact(text), Cow::Owned(_))
        }
        ContentPart::ToolCall(call) => rules.redact_arguments(&call.arguments).is_some(),
        ContentPart::ToolResult(result) => matches!(rules.redact(&result.content), Cow::Owned(_)),
    })
}

/// Redact every part of `message`.
fn redact_message(rules: &Rules, message: &mut Message) {
    for part in &mut message.content {
        match part {
            ContentPart::Text { text } | ContentPart::Reasoning { text, .. } => {
                rules.redact_in_place(text);
            }
            ContentPart::ToolCall(call) => {
                if let Some(arguments) = rules.redact_arguments(&call.arguments) {
                    call.arguments = arguments;
                }
            }
            ContentPart::ToolResult(result) => {
                rules.redact_in_place(&mut result.content);
            }
        }
    }
}

impl RedactLayer {
    /// Redact the messages of `request` added since this layer last saw the run's history;
    /// whether any changed.
    fn redact_input(&self, request: &mut ModelRequest) -> bool {
        self.redact_since(&request.ctx, &mut request.messages)
    }

    /// Redact the messages of `history` added since the run's mark, and mark it; whether any
    /// changed.
    fn redact_since(&self, ctx: &RunContext, history: &mut History) -> bool {
        let mut redacted = ctx.extension_at(&self.redacted).unwrap_or_default();
        let (from, ()) = redacted.unread(history);
        let first = history[from..]
            .iter()
            .position(|m| needs(&self.rules, m))
            .map(|at| from + at);
        if let Some(first) = first {
            for message in history.tail_mut(first).iter_mut() {
                redact_message(&self.rules, message);
            }
        }
        redacted.read(history);
        ctx.insert_extension_at(&self.redacted, redacted);
        first.is_some()
    }
}

/// The run's input and the session's history redacted before the run starts: see
/// [`RedactLayer`]. The response is the inner service's.
impl<S> Service<AgentRequest> for Redact<S>
where
    S: Service<AgentRequest>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: AgentRequest) -> S::Future {
        let rules = &self.layer.rules;
        if let AgentInput::Messages(messages) = &mut request.input {
            for message in messages.iter_mut().filter(|m| needs(rules, m)) {
                redact_message(rules, message);
            }
        }
        // The model side of the run goes on from here: it scans only what comes after.
        self.layer
            .redact_since(&request.ctx, &mut request.session.history);
        self.inner.call(request)
    }
}

impl<S> Service<ModelRequest> for Redact<S>
where
    S: Service<ModelRequest, Response = ModelResponse>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ModelResponse;
    type Error = Error;
    type Future = crate::redact::ResponseFuture<ModelResponse>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, mut request: ModelRequest) -> Self::Future {
        let changed = self.layer.redact_input(&mut request);
        let committed = changed.then(|| request.messages.clone());
        let rules = Arc::clone(&self.layer.rules);
        request.deltas.filter(RedactFilter::new(Arc::clone(&rules)));
        let call = self.inner.call(request);
        Box::pin(async move {
            match call.await {
                Ok(mut response) => {
                    if let Some(history) = committed {
                        response.commit(history);
                    }
                    redact_message(&rules, &mut response.message);
                    Ok(response)
                }
                Err(error) => {
                    let error = Error::from_boxed(error.into());
                    // An inner layer's commit, if any, is kept.
                    Err(match committed {
                        Some(history) => error.with_history(history),
                        None => error,
                    })
                }
            }
        })
    }
}

impl<S> Service<ToolRequest> for Redact<S>
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ToolResponse;
    type Error = Error;
    type Future = crate::redact::ResponseFuture<ToolResponse>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, request: ToolRequest) -> Self::Future {
        let rules = Arc::clone(&self.layer.rules);
        let call = self.inner.call(request);
        Box::pin(async move {
            let mut response = call.await.map_err(|e| Error::from_boxed(e.into()))?;
            rules.redact_in_place(&mut response.result.content);
            // Arguments a call ran with instead of the model's (a human's edit) go into the
            // session too.
            if let Some(arguments) = &mut response.arguments {
                if let Some(redacted) = rules.redact_arguments(arguments) {
                    *arguments = redacted;
                }
            }
            Ok(response)
        })
    }
}

/// Redaction on every stack: on the agent right inside the store (the input is redacted before
/// the run saves it first), outermost on the model (the summarizer sees redacted text), and on
/// the tools inside the eviction (a result is stored redacted).
impl tower_agent_loop::Builtin for RedactLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::{AgentSlot, ModelSlot, ToolSlot};
        stacks.agent(AgentSlot::Redact, self.clone());
        stacks.model(ModelSlot::Redact, self.clone());
        stacks.tools(ToolSlot::Redact, self);
    }
}
