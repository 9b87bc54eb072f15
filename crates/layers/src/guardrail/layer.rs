//! The layer that runs guardrails around model calls and tool calls.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::Either;
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, BoxError, DescribeTools, Error, Event, ExtensionKey,
    Message, ModelRequest, ModelResponse, Outcome, Progress, Role, StopReason, ToolAction,
    ToolRequest, ToolResponse, ToolSpec, Usage,
};
use tower_layer::Layer;
use tower_service::Service;

use super::ResponseFuture;
use super::check::{Guardrail, Trip, check_all};

/// Guardrails on the model's input and output and on tool results: one value for the agent
/// service, the model stack and the tool stack. See the [module docs](super).
#[derive(Clone, Default)]
pub struct GuardrailLayer {
    input: Arc<[Guardrail]>,
    output: Arc<[Guardrail]>,
    tool_results: Arc<[Guardrail]>,
    parallel: bool,
    /// Set in a run whose input the agent side checked: the model side does not check it
    /// again.
    checked: ExtensionKey<InputChecked>,
}

/// The run's input passed this layer's checks on the agent service.
#[derive(Debug, Clone, Copy)]
struct InputChecked;

impl fmt::Debug for GuardrailLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardrailLayer")
            .field("input", &self.input)
            .field("output", &self.output)
            .field("tool_results", &self.tool_results)
            .field("parallel", &self.parallel)
            .finish()
    }
}

fn with(list: &Arc<[Guardrail]>, guardrail: Guardrail) -> Arc<[Guardrail]> {
    list.iter().cloned().chain([guardrail]).collect()
}

impl GuardrailLayer {
    /// No guardrail yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Check the user's new text before the model reads it.
    pub fn input(mut self, guardrail: Guardrail) -> Self {
        self.input = with(&self.input, guardrail);
        self
    }

    /// Check the model's message (its text, then each call's arguments on a line of their
    /// own) before it goes up.
    pub fn output(mut self, guardrail: Guardrail) -> Self {
        self.output = with(&self.output, guardrail);
        self
    }

    /// Check each tool result before the model reads it.
    pub fn tool_results(mut self, guardrail: Guardrail) -> Self {
        self.tool_results = with(&self.tool_results, guardrail);
        self
    }

    /// Run the input guardrails while the model is called, not before (OpenAI's
    /// `run_in_parallel`): the answer comes sooner when nothing trips, and a trip drops the
    /// call. Off by default: a tripped input then costs no model call.
    pub fn parallel(mut self, parallel: bool) -> Self {
        self.parallel = parallel;
        self
    }
}

impl<S> Layer<S> for GuardrailLayer {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`GuardrailLayer`] makes.
#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    layer: GuardrailLayer,
}

impl<S> fmt::Debug for Guarded<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guarded")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

impl<S: DescribeTools> DescribeTools for Guarded<S> {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        self.inner.tool_specs()
    }
}

impl Trip {
    fn reason(self) -> StopReason {
        StopReason::Guardrail {
            name: self.name.to_string(),
            reason: self.reason,
        }
    }
}

/// The text of the user messages that end `messages`, or `None` when it ends otherwise (tool
/// results: a later round of the same input).
fn new_input(messages: &[Message]) -> Option<(String, usize)> {
    let start = messages
        .iter()
        .rposition(|m| m.role != Role::User)
        .map_or(0, |at| at + 1);
    let texts: Vec<String> = messages[start..].iter().map(Message::text).collect();
    (!texts.is_empty()).then(|| (texts.join("\n\n"), start))
}

/// What the output guardrails read of a message: its text, then each call's arguments.
fn output_text(message: &Message) -> String {
    let mut text = message.text();
    for call in message.tool_calls() {
        text.push('\n');
        text.push_str(&call.arguments);
    }
    text
}

/// `response` stopped by `trip`: its message dropped, what it did kept (usage, a committed
/// history). `input`: the trip was the input's (the request refused, the input withdrawn),
/// not the answer's.
fn tripped(mut response: ModelResponse, trip: Trip, input: bool) -> ModelResponse {
    response.message = Message::assistant("");
    response.stop = Some(trip.reason());
    response.refused = input;
    // A pause the call answered with does not outlive the trip.
    response.pause = None;
    response
}

impl<S> Service<ModelRequest> for Guarded<S>
where
    S: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ModelResponse;
    type Error = Error;
    type Future = ResponseFuture<ModelResponse>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, request: ModelRequest) -> Self::Future {
        let checked = request.ctx.extension_at(&self.layer.checked).is_some();
        let input = match self.layer.input.is_empty() || checked {
            true => None,
            false => new_input(&request.messages).map(|(text, from)| {
                // What stays of the history when the input trips: nothing it read.
                let kept = (request.messages.clone(), from);
                (text, Arc::clone(&self.layer.input), kept)
            }),
        };
        let parallel = self.layer.parallel;
        let output = Arc::clone(&self.layer.output);
        let ctx = request.ctx.clone();
        let call = match input.is_some() && !parallel {
            // Checked first: the ready service goes into the future, called once the input
            // passed.
            true => {
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Either::Left(async move { inner.call(request).await })
            }
            false => Either::Right(self.inner.call(request)),
        };
        let call = async move { call.await.map_err(|e| Error::from_boxed(e.into())) };
        Box::pin(async move {
            let (answer, mut spent, tripped_input) = match input {
                None => (call.await, Usage::default(), None),
                Some((text, guardrails, kept)) if !parallel => {
                    match check_all(&guardrails, text, &ctx).await? {
                        // The call was never made.
                        (Some(trip), spent) => {
                            (Ok(ModelResponse::refuse(trip.reason())), spent, Some(kept))
                        }
                        (None, spent) => (call.await, spent, None),
                    }
                }
                Some((text, guardrails, kept)) => {
                    let (answer, spent, tripped) =
                        in_parallel(call, check_all(&guardrails, text, &ctx)).await?;
                    (answer, spent, tripped.then_some(kept))
                }
            };
            let mut response = answer.map_err(|e| e.add_usage(spent))?;
            // Nothing tripped stays: the user messages the check read leave the history (the
            // loop withdraws the run's own input; this takes older ones too, as a process that
            // died before a parallel check tripped left them).
            if let Some((history, from)) = tripped_input {
                let mut kept = history;
                kept.make_mut().truncate(from);
                response.commit(kept);
            }
            if response.stop.is_some() || output.is_empty() {
                return Ok(response.with_side_usage(spent));
            }
            let own = response.usage + response.side_usage;
            let (trip, used) = check_all(&output, output_text(&response.message), &ctx)
                .await
                .map_err(|e| e.add_usage(spent + own))?;
            spent += used;
            let response = match trip {
                Some(trip) => tripped(response, trip, false),
                None => response,
            };
            Ok(response.with_side_usage(spent))
        })
    }
}

/// The call and the input checks at once: a trip drops the call (its stream stops); an
/// answer that comes first waits for the checks, and a trip withholds it. The answer (or the
/// stop of a trip), the checks' tokens, and whether the input tripped.
async fn in_parallel(
    call: impl Future<Output = Result<ModelResponse, Error>>,
    checks: impl Future<Output = Result<(Option<Trip>, Usage), Error>>,
) -> Result<(Result<ModelResponse, Error>, Usage, bool), Error> {
    tokio::pin!(call, checks);
    tokio::select! {
        checked = &mut checks => {
            let (trip, spent) = checked?;
            Ok(match trip {
                // The call is dropped here: its stream stops.
                Some(trip) => (Ok(ModelResponse::refuse(trip.reason())), spent, true),
                None => (call.await, spent, false),
            })
        }
        answer = &mut call => {
            let own = match &answer {
                Ok(response) => response.usage + response.side_usage,
                Err(error) => error.usage(),
            };
            let (trip, spent) = checks.await.map_err(|e| e.add_usage(own))?;
            Ok(match (trip, answer) {
                (Some(trip), Ok(response)) => (Ok(tripped(response, trip, true)), spent, true),
                // A trip wins over the call's failure (whose tokens still count).
                (Some(trip), Err(error)) => {
                    let refused = ModelResponse::refuse(trip.reason());
                    (Ok(refused), spent + error.usage(), true)
                }
                (None, answer) => (answer, spent, false),
            })
        }
    }
}

/// What the model side would read as the user's new text once `messages` are appended to
/// `history` ([`new_input`]): the user messages that end the history (when no call waits,
/// which the input would answer in between) and those that end the input; `None` when there
/// are none; with how many of the history's last messages it read.
fn input_text(history: &[Message], waiting: bool, messages: &[Message]) -> Option<(String, usize)> {
    let trailing = |messages: &[Message]| {
        let start = messages
            .iter()
            .rposition(|m| m.role != Role::User)
            .map_or(0, |at| at + 1);
        messages.len() - start
    };
    let own = trailing(messages);
    let earlier = match own == messages.len() && !waiting {
        true => trailing(history),
        false => 0,
    };
    let texts: Vec<String> = history[history.len() - earlier..]
        .iter()
        .chain(&messages[messages.len() - own..])
        .map(Message::text)
        .collect();
    (!texts.is_empty()).then(|| (texts.join("\n\n"), earlier))
}

/// The input guardrails on the run's new messages (and the user messages that end the session,
/// which the model would read with them), before the run starts (unless they run in parallel
/// with the model call): a trip answers the run, stopped, with the session as it came but for
/// what tripped (the input is not appended, the session's last user messages the check read
/// leave it, nothing else changes); the model side does not check that input again.
impl<S> Service<AgentRequest> for Guarded<S>
where
    S: Service<AgentRequest, Response = AgentResponse> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = AgentResponse;
    type Error = Error;
    type Future = ResponseFuture<AgentResponse>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, request: AgentRequest) -> Self::Future {
        let text = match &request.input {
            AgentInput::Messages(messages)
                if !self.layer.input.is_empty() && !self.layer.parallel =>
            {
                let session = &request.session;
                input_text(&session.history, !session.interrupts.is_empty(), messages)
            }
            _ => None,
        };
        let Some((text, earlier)) = text else {
            let call = self.inner.call(request);
            return Box::pin(async move { call.await.map_err(|e| Error::from_boxed(e.into())) });
        };
        // Checked first: the ready service goes into the future, called once the input passed.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let guardrails = Arc::clone(&self.layer.input);
        let checked = self.layer.checked.clone();
        Box::pin(async move {
            let ctx = request.ctx.clone();
            let (trip, spent) = match check_all(&guardrails, text, &ctx).await {
                Ok(checked) => checked,
                Err(error) => return Err(error.with_session(request.session)),
            };
            if let Some(trip) = trip {
                // The session as it came, but valid: calls a crash left in flight are answered
                // as the loop would answer them; calls waiting for a decision keep waiting.
                let mut session = request.session;
                session.answer_dangling_calls();
                if earlier > 0 {
                    let len = session.history.len();
                    session.history.make_mut().truncate(len - earlier);
                }
                ctx.absorb_state(std::mem::take(&mut session.state));
                session.state = ctx.state_snapshot();
                let outcome = Outcome::Stopped {
                    reason: trip.reason(),
                    progress: Progress::default(),
                };
                // The run ends here: its readers hear it start and end, as from the loop.
                if ctx.events().is_enabled() {
                    let started = Event::RunStarted {
                        run_id: ctx.run_id().into(),
                        session_id: ctx.session_id().into(),
                    };
                    let finished = Event::RunFinished {
                        outcome: outcome.clone(),
                    };
                    let told = match ctx.emit(started).await {
                        Ok(()) => ctx.emit(finished).await,
                        Err(error) => Err(error),
                    };
                    if let Err(error) = told {
                        ctx.events().close();
                        return Err(error.with_session(session).add_usage(spent));
                    }
                }
                ctx.events().close();
                let mut response = AgentResponse::new(session, outcome);
                response.usage = spent;
                return Ok(response);
            }
            ctx.insert_extension_at(&checked, InputChecked);
            let mut response = inner
                .call(request)
                .await
                .map_err(|e| Error::from_boxed(e.into()).add_usage(spent))?;
            response.usage += spent;
            Ok(response)
        })
    }
}

impl<S> Service<ToolRequest> for Guarded<S>
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ToolResponse;
    type Error = Error;
    type Future = ResponseFuture<ToolResponse>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, request: ToolRequest) -> Self::Future {
        let guardrails = Arc::clone(&self.layer.tool_results);
        let ctx = request.ctx.clone();
        let call = self.inner.call(request);
        Box::pin(async move {
            let mut response = call.await.map_err(|e| Error::from_boxed(e.into()))?;
            if guardrails.is_empty() || response.is_interrupt() {
                return Ok(response);
            }
            let text = response.result.content.clone();
            let (trip, spent) = check_all(&guardrails, text, &ctx)
                .await
                .map_err(|e| e.add_usage(response.usage))?;
            response.usage += spent;
            if let Some(trip) = trip {
                response.result.content = format!(
                    "Withheld: the guardrail `{}` tripped on this result.",
                    trip.name
                );
                response.result.is_error = true;
                response.action = ToolAction::Stop(trip.reason());
            }
            Ok(response)
        })
    }
}

/// Guardrails on every stack, inside the redaction: the input checked on the agent before the
/// run saves anything; the model's output and tool results before they are redacted.
impl tower_agent_loop::Builtin for GuardrailLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::{AgentSlot, ModelSlot, ToolSlot};
        stacks.agent(AgentSlot::Guardrail, self.clone());
        stacks.model(ModelSlot::Guardrail, self.clone());
        stacks.tools(ToolSlot::Guardrail, self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_agent_core::{ToolCall, ToolResult};

    #[test]
    fn the_input_is_the_user_text_that_ends_the_history() {
        let call = ToolCall::new("c1", "ls", serde_json::json!({}));
        let history = vec![
            Message::user("first"),
            Message::assistant_with_calls("", vec![call.clone()]),
            Message::tool_result(ToolResult::success(&call, "a b")),
        ];
        assert_eq!(new_input(&history), None);
        let mut history = history;
        history.push(Message::user("second"));
        history.push(Message::user("third"));
        assert_eq!(new_input(&history), Some(("second\n\nthird".into(), 3)));
        assert_eq!(
            new_input(&[Message::user("only")]),
            Some(("only".into(), 0))
        );
        assert_eq!(new_input(&[]), None);
    }

    #[test]
    fn the_output_text_holds_the_calls_arguments() {
        let call = ToolCall::new("c1", "send", serde_json::json!({"to": "x"}));
        let message = Message::assistant_with_calls("Sending.", vec![call]);
        assert_eq!(output_text(&message), "Sending.\n{\"to\":\"x\"}");
    }
}
