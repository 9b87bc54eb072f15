//! The scripted model: answers from a script, records every request, streams on request.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tower_agent_core::event::BoxFuture;
use tower_agent_core::{ContentPart, Delta, Error, ModelRequest, ModelResponse};
use tower_service::Service;

use crate::lock;

type ScriptFn = Box<dyn FnMut(&ModelRequest) -> Result<ModelResponse, Error> + Send>;

/// One scripted answer.
#[allow(
    clippy::large_enum_variant,
    reason = "a script's queue holds answers: boxing each would only add a step"
)]
enum Scripted {
    Answer(Result<ModelResponse, Error>),
    /// A stream that delivers `partial`, then fails.
    Broken {
        partial: String,
        error: Error,
    },
}

enum Script {
    Queue(VecDeque<Scripted>),
    Fn(ScriptFn),
}

/// How answers are streamed: pieces of `chars` characters, `pause` before each.
#[derive(Clone, Copy)]
struct Streaming {
    chars: usize,
    pause: Duration,
}

struct ScriptState {
    script: Script,
    requests: Vec<ModelRequest>,
    served: usize,
    record: bool,
    streaming: Option<Streaming>,
}

/// A model service that answers from a script and records every request.
///
/// Clones share the script and the record, so keep a clone to inspect after the run.
///
/// Recorded requests keep their histories alive, so the agent's next append copies the
/// history once (correct, only slower); use [`ScriptedModel::without_recording`] in
/// long-running tests where that matters.
///
/// With [`ScriptedModel::streaming`] it streams its answers the way a provider does: each
/// answer's reasoning and text in pieces through
/// [`ModelRequest::send_delta`], then [`ModelRequest::end_stream`].
#[derive(Clone)]
pub struct ScriptedModel {
    state: Arc<Mutex<ScriptState>>,
}

impl ScriptedModel {
    /// A model answering with `responses`, in order.
    pub fn new(responses: impl IntoIterator<Item = ModelResponse>) -> Self {
        Self::with_results(responses.into_iter().map(Ok))
    }

    /// A model answering with `results`, in order: use `Err` to script a provider failure.
    pub fn with_results(results: impl IntoIterator<Item = Result<ModelResponse, Error>>) -> Self {
        Self::from_script(Script::Queue(
            results.into_iter().map(Scripted::Answer).collect(),
        ))
    }

    /// A model answering with whatever `f` returns for each request.
    ///
    /// ```
    /// use tower_agent_core::{ModelResponse, Role};
    /// use tower_agent_test::ScriptedModel;
    ///
    /// // Answer "done" once the last message is a tool result.
    /// let model = ScriptedModel::from_fn(|req| {
    ///     Ok(match req.messages.last().map(|m| m.role) {
    ///         Some(Role::Tool) => ModelResponse::text("done"),
    ///         _ => ModelResponse::text("nothing to do"),
    ///     })
    /// });
    /// # let _ = model;
    /// ```
    pub fn from_fn(
        f: impl FnMut(&ModelRequest) -> Result<ModelResponse, Error> + Send + 'static,
    ) -> Self {
        Self::from_script(Script::Fn(Box::new(f)))
    }

    fn from_script(script: Script) -> Self {
        Self {
            state: Arc::new(Mutex::new(ScriptState {
                script,
                requests: Vec::new(),
                served: 0,
                record: true,
                streaming: None,
            })),
        }
    }

    /// Stop recording requests.
    pub fn without_recording(self) -> Self {
        lock(&self.state).record = false;
        self
    }

    /// Stream every answer: its reasoning, then its text, in pieces of `chars` characters,
    /// then each tool call whole ([`Delta::ToolCall`]), waiting `pause` before each piece and
    /// each call (zero for none).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::ServiceExt;
    /// use tower_agent_core::{Event, Message, ModelRequest, ModelResponse, RunContext};
    /// use tower_agent_test::ScriptedModel;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_agent_core::Error> {
    /// let model = ScriptedModel::new([ModelResponse::text("Hello!")]).streaming(4, Duration::ZERO);
    /// let (ctx, mut events) = RunContext::new().with_event_stream(8);
    /// let mut req = ModelRequest::new(vec![Message::user("hi")]);
    /// req.ctx = ctx;
    /// model.oneshot(req).await?;
    /// let mut deltas = Vec::new();
    /// while let Some(Event::TextDelta { delta, .. }) = events.recv().await {
    ///     deltas.push(delta);
    /// }
    /// assert_eq!(deltas, ["Hell", "o!"]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn streaming(self, chars: usize, pause: Duration) -> Self {
        lock(&self.state).streaming = Some(Streaming {
            chars: chars.max(1),
            pause,
        });
        self
    }

    /// Append a response to a queue script (ignored for a closure script).
    pub fn push(&self, response: Result<ModelResponse, Error>) {
        if let Script::Queue(queue) = &mut lock(&self.state).script {
            queue.push_back(Scripted::Answer(response));
        }
    }

    /// Append a broken stream to a queue script (ignored for a closure script): a streaming
    /// model streams `partial` as text, then fails with `error`; one that does not stream
    /// fails at once.
    pub fn push_broken(&self, partial: impl Into<String>, error: Error) {
        if let Script::Queue(queue) = &mut lock(&self.state).script {
            queue.push_back(Scripted::Broken {
                partial: partial.into(),
                error,
            });
        }
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<ModelRequest> {
        lock(&self.state).requests.clone()
    }

    /// How many requests were received.
    pub fn request_count(&self) -> usize {
        lock(&self.state).served
    }

    /// How many scripted responses are left (`None` for a closure script).
    pub fn remaining(&self) -> Option<usize> {
        match &lock(&self.state).script {
            Script::Queue(queue) => Some(queue.len()),
            Script::Fn(_) => None,
        }
    }
}

impl fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedModel")
            .field("served", &self.request_count())
            .field("remaining", &self.remaining())
            .finish()
    }
}

impl Service<ModelRequest> for ScriptedModel {
    type Response = ModelResponse;
    type Error = Error;
    type Future = BoxFuture<'static, Result<ModelResponse, Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: ModelRequest) -> Self::Future {
        let mut state = lock(&self.state);
        state.served += 1;
        let served = state.served;
        let answer = match &mut state.script {
            Script::Queue(queue) => queue.pop_front().unwrap_or_else(|| {
                Scripted::Answer(Err(Error::other(format!(
                    "ScriptedModel: the script is exhausted: it held {} responses and this is request {served}",
                    served - 1
                ))))
            }),
            Script::Fn(f) => Scripted::Answer(f(&request)),
        };
        let streaming = state.streaming;
        if state.record {
            state.requests.push(request.clone());
        }
        drop(state);
        let Some(streaming) = streaming else {
            return Box::pin(std::future::ready(match answer {
                Scripted::Answer(answer) => answer,
                Scripted::Broken { error, .. } => Err(error),
            }));
        };
        Box::pin(async move {
            match answer {
                Scripted::Answer(Ok(response)) => {
                    for part in &response.message.content {
                        if let ContentPart::Reasoning { text, .. } = part {
                            stream(&request, text, streaming, Delta::Reasoning).await?;
                        }
                    }
                    stream(&request, &response.message.text(), streaming, Delta::Text).await?;
                    // Each call as the stream closes it, a pause apart.
                    for call in response.message.tool_calls() {
                        if !streaming.pause.is_zero() {
                            tokio::time::sleep(streaming.pause).await;
                        }
                        request.send_delta(Delta::ToolCall(call.clone())).await?;
                    }
                    request.end_stream().await?;
                    Ok(response)
                }
                Scripted::Answer(Err(error)) => Err(error),
                Scripted::Broken { partial, error } => {
                    stream(&request, &partial, streaming, Delta::Text).await?;
                    Err(error)
                }
            }
        })
    }
}

/// Send `text` up in pieces.
async fn stream(
    request: &ModelRequest,
    text: &str,
    streaming: Streaming,
    delta: fn(String) -> Delta,
) -> Result<(), Error> {
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(streaming.chars) {
        if !streaming.pause.is_zero() {
            tokio::time::sleep(streaming.pause).await;
        }
        request.send_delta(delta(piece.iter().collect())).await?;
    }
    Ok(())
}
