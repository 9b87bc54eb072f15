//! Record a real run's model calls (and tool calls) to a cassette, and replay them without a
//! network.
//!
//! A [`Cassette`] is a JSON-lines file: one line per model call, the request as the provider
//! is asked it (system, messages, tool specs, options: not the run's context) and the response
//! it gave; and, with [`tool_layer`](Cassette::tool_layer) around the tool service, one line
//! per tool call, the tool's name and arguments and its response. Its
//! [`layer`](Cassette::layer) goes around a model service:
//!
//! | [`Mode`] | a request on the cassette | a request not on it |
//! |---|---|---|
//! | `Record` (the file starts empty) | — | the inner model is called; the pair is written |
//! | `Replay` | its response, the inner model never called | an error with a diff against the nearest recorded request |
//! | `RecordMissing` | its response | the inner model is called; the pair is written |
//!
//! Requests are keyed by a SHA-256 of their JSON. The same request made twice (a judge asked
//! again, say) gets its recorded responses in the order they were recorded; past the last,
//! `Replay` answers the last again and `RecordMissing` asks the model. A tool call is keyed by
//! its tool's name and arguments (not its id), and its replayed result answers the call's id.
//!
//! **Where it goes:** right around the provider, inside every layer that edits requests
//! (instructions, memory, summarization, redaction). It then records what the provider was
//! really asked; on replay the same layers run over the cassette and make the same requests
//! again, so a cassette survives them. Above them, a recorded request would be what the loop
//! asked, and the replay would skip what the layers do.
//!
//! **Secrets:** API keys travel in the provider's headers, never in a request; text in the
//! requests and responses that looks like a key (a word starting `sk-`, `sk-ant-`, `AIza`,
//! `ghp_`, `xoxb-`, `xoxp-` or `Bearer `, then 16 or more key characters) is written as
//! `[REDACTED]` all the same, and requests are keyed as written.
//!
//! ```
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_agent_core::{Message, ModelRequest, ModelResponse};
//! use tower_agent_test::ScriptedModel;
//! use tower_agent_test::cassette::{Cassette, Mode};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let path = std::env::temp_dir().join(format!("cassette-doc-{}.jsonl", std::process::id()));
//! // Record: the real model (here a scripted one) answers, the pair is written.
//! let real = ScriptedModel::new([ModelResponse::text("Paris.")]);
//! let recording = Cassette::open(&path, Mode::Record)?;
//! let model = ServiceBuilder::new().layer(recording.layer()).service(real);
//! let ask = || ModelRequest::new(vec![Message::user("Capital of France?")]);
//! assert_eq!(model.oneshot(ask()).await?.message.text(), "Paris.");
//!
//! // Replay: no model behind it at all.
//! let replay = Cassette::open(&path, Mode::Replay)?.model();
//! assert_eq!(replay.clone().oneshot(ask()).await?.message.text(), "Paris.");
//!
//! // A request that was never recorded: an error saying what differs.
//! let other = ModelRequest::new(vec![Message::user("Capital of Spain?")]);
//! let miss = replay.oneshot(other).await.unwrap_err();
//! let diff = miss.to_string();
//! assert!(diff.lines().any(|l| l.starts_with('-') && l.contains("Capital of France?")), "{diff}");
//! assert!(diff.lines().any(|l| l.starts_with('+') && l.contains("Capital of Spain?")), "{diff}");
//! # std::fs::remove_file(&path)?;
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{
    BoxError, DescribeTools, Error, ErrorKind, GenerationOptions, History, ModelRequest,
    ModelResponse, ToolRequest, ToolResponse, ToolSpec,
};
use tower_layer::Layer;
use tower_service::Service;

use crate::lock;

/// What a cassette does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Call the inner model every time and write each pair; the file starts empty.
    Record,
    /// Answer from the cassette only; a request not on it is an error with a diff.
    Replay,
    /// Answer from the cassette; call the inner model for a request not on it, and write it.
    RecordMissing,
}

/// One recorded call: a line of the file.
#[derive(Debug, Clone)]
struct Entry {
    key: String,
    answer: Answer,
    /// The line as written: its request is read again only for the diff of a miss.
    line: String,
}

/// What a recorded call answered.
#[derive(Debug, Clone)]
enum Answer {
    Model(ModelResponse),
    Tool(ToolResponse),
}

/// A line as written: a model call (`request`, `response`) or a tool call (`call`, `result`).
#[derive(Serialize)]
struct Line<'a> {
    key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    request: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<&'a ModelResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    call: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a ToolResponse>,
}

/// A line as read back for replay: the request is skipped, not decoded.
#[derive(Deserialize)]
struct Stored {
    key: String,
    #[serde(default)]
    response: Option<ModelResponse>,
    #[serde(default)]
    result: Option<ToolResponse>,
}

impl Stored {
    fn answer(self) -> Option<(String, Answer)> {
        let answer = match (self.response, self.result) {
            (Some(response), None) => Answer::Model(response),
            (None, Some(result)) => Answer::Tool(result),
            _ => return None,
        };
        Some((self.key, answer))
    }
}

/// The request of a line, for a diff: a model call's `request` or a tool call's `call`.
#[derive(Deserialize)]
struct StoredRequest {
    #[serde(default)]
    request: Option<Value>,
    #[serde(default)]
    call: Option<Value>,
}

/// A cassette file: the recorded model calls of a run, and what it records next. Cheap to
/// clone: clones share the file and the entries.
#[derive(Clone)]
pub struct Cassette {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    mode: Mode,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    /// For each key, the next of its entries to serve.
    served: HashMap<String, usize>,
    file: Option<File>,
}

impl Cassette {
    /// Open the cassette at `path`: in `Record` mode it is made empty; otherwise its calls are
    /// read (a missing file is an empty cassette for `RecordMissing`).
    ///
    /// # Errors
    ///
    /// The file cannot be read or written, or a line is not a recorded call (its number is in
    /// the message).
    pub fn open(path: impl AsRef<Path>, mode: Mode) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let mut state = State::default();
        match mode {
            Mode::Record => {
                state.file = Some(File::create(&path)?);
            }
            Mode::Replay | Mode::RecordMissing => {
                match File::open(&path) {
                    Ok(file) => {
                        for (number, line) in BufReader::new(file).lines().enumerate() {
                            let line = line?;
                            if line.trim().is_empty() {
                                continue;
                            }
                            let stored = serde_json::from_str::<Stored>(&line)
                                .map_err(|error| error.to_string())
                                .and_then(|stored| {
                                    stored.answer().ok_or_else(|| {
                                        "it has neither a response nor a result".to_owned()
                                    })
                                });
                            let (key, answer) = stored.map_err(|error| {
                                io::Error::new(
                                    io::ErrorKind::InvalidData,
                                    format!(
                                        "{}: line {} is not a recorded call: {error}",
                                        path.display(),
                                        number + 1
                                    ),
                                )
                            })?;
                            state.entries.push(Entry { key, answer, line });
                        }
                    }
                    Err(error) if error.kind() == io::ErrorKind::NotFound => {
                        if mode == Mode::Replay {
                            return Err(io::Error::new(
                                error.kind(),
                                format!("no cassette at {}: record it first", path.display()),
                            ));
                        }
                    }
                    Err(error) => return Err(error),
                }
                if mode == Mode::RecordMissing {
                    state.file = Some(OpenOptions::new().create(true).append(true).open(&path)?);
                }
            }
        }
        Ok(Self {
            inner: Arc::new(Inner {
                path,
                mode,
                state: Mutex::new(state),
            }),
        })
    }

    /// The layer that records around, or replays instead of, a model service.
    pub fn layer(&self) -> CassetteLayer {
        CassetteLayer {
            cassette: self.clone(),
        }
    }

    /// A model service answering from the cassette alone (for `Replay`: nothing behind it).
    pub fn model(&self) -> CassetteModel<NoModel> {
        self.layer().layer(NoModel)
    }

    /// The layer that records around, or replays instead of, a tool service: put it right
    /// around the tools, inside approval and limits, so those decide again on replay and only
    /// the tools' work is skipped. On replay the inner service is not called (it still
    /// describes the tools to the agent).
    pub fn tool_layer(&self) -> CassetteToolLayer {
        CassetteToolLayer {
            cassette: self.clone(),
        }
    }

    /// The number of recorded calls.
    pub fn len(&self) -> usize {
        lock(&self.inner.state).entries.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The recorded answer to the request of `key`: the next one for a request made again.
    /// Past the last, `Replay` answers the last again and `RecordMissing` asks the model.
    fn find(&self, key: &str) -> Option<Answer> {
        let mut state = lock(&self.inner.state);
        let State {
            entries, served, ..
        } = &mut *state;
        let matching: Vec<&Entry> = entries.iter().filter(|e| e.key == key).collect();
        let next = served.entry(key.to_owned()).or_default();
        let entry = match matching.get(*next) {
            Some(entry) => entry,
            None if self.inner.mode == Mode::Replay => matching.last()?,
            None => return None,
        };
        *next += 1;
        Some(entry.answer.clone())
    }

    /// Write a line (`Line` with its key) and keep its answer as the file holds it.
    fn write(&self, line: &Line<'_>) -> Result<Answer, Error> {
        let line = serde_json::to_string(line)
            .map(|line| redact(&line))
            .map_err(|error| Error::other(format!("cannot encode a recorded call: {error}")))?;
        // What is replayed is what the file holds: the redacted answer.
        let (key, answer) = serde_json::from_str::<Stored>(&line)
            .ok()
            .and_then(Stored::answer)
            .ok_or_else(|| Error::other("cannot read a recorded call back"))?;
        let entry = Entry {
            key,
            answer: answer.clone(),
            line: line.clone(),
        };
        let mut state = lock(&self.inner.state);
        if let Some(file) = &mut state.file {
            writeln!(file, "{line}")
                .and_then(|()| file.flush())
                .map_err(|error| {
                    Error::backend(format!(
                        "cannot write the cassette {}: {error}",
                        self.inner.path.display()
                    ))
                })?;
        }
        // This call's answer is served: a request made again asks the model again.
        let key = entry.key.clone();
        state.entries.push(entry);
        let recorded = state.entries.iter().filter(|e| e.key == key).count();
        state.served.insert(key, recorded);
        Ok(answer)
    }

    /// The error of a request not on the cassette (`tool`: a tool call): the diff against the
    /// nearest recorded one of its kind.
    fn miss(&self, got: &Value, tool: bool) -> Error {
        let got = pretty(got);
        let state = lock(&self.inner.state);
        let nearest = state
            .entries
            .iter()
            .filter_map(|entry| {
                let stored = serde_json::from_str::<StoredRequest>(&entry.line).ok()?;
                let recorded = pretty(&if tool { stored.call } else { stored.request }?);
                let ratio = similar::TextDiff::from_lines(&recorded, &got).ratio();
                Some((ratio, recorded))
            })
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let message = match nearest {
            None => format!(
                "cassette {}: no recorded call answers this request, and none of its kind is recorded",
                self.inner.path.display()
            ),
            Some((_, recorded)) => {
                let diff = similar::TextDiff::from_lines(&recorded, &got)
                    .unified_diff()
                    .context_radius(3)
                    .header("recorded (nearest)", "requested")
                    .to_string();
                format!(
                    "cassette {}: no recorded call answers this request; the nearest of {} differs:\n{diff}",
                    self.inner.path.display(),
                    state.entries.len()
                )
            }
        };
        Error::new(ErrorKind::Other, message)
    }
}

impl fmt::Debug for Cassette {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cassette")
            .field("path", &self.inner.path)
            .field("mode", &self.inner.mode)
            .field("calls", &self.len())
            .finish()
    }
}

/// The request as the provider is asked it: system, messages, tool specs (what providers
/// send of them), options. Hashed as it is encoded, without a copy of the request.
#[derive(Serialize)]
struct Canonical<'a> {
    system: Option<&'a str>,
    messages: &'a History,
    tools: Vec<ToolWire<'a>>,
    options: &'a GenerationOptions,
}

#[derive(Serialize)]
struct ToolWire<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

impl<'a> Canonical<'a> {
    fn of(req: &'a ModelRequest) -> Self {
        Self {
            system: req.system.as_deref(),
            messages: &req.messages,
            tools: req
                .tools
                .iter()
                .map(|spec| ToolWire {
                    name: &spec.name,
                    description: &spec.description,
                    parameters: &spec.parameters,
                })
                .collect(),
            options: &req.options,
        }
    }
}

/// A tool call as the cassette keys it: the tool and its arguments, not the call's id.
#[derive(Serialize)]
struct ToolCanonical<'a> {
    tool: &'a str,
    arguments: &'a str,
}

/// The SHA-256 of `request`'s JSON as the cassette writes it (key-like text redacted: a
/// replayed request that carries a redacted answer has the recorded request's key), in hex.
fn key_of(request: &impl Serialize) -> Result<String, Error> {
    let json = serde_json::to_string(request)
        .map_err(|error| Error::other(format!("cannot encode the request: {error}")))?;
    Ok(Sha256::digest(redact(&json).as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect())
}

fn to_value(request: &impl Serialize) -> Result<Value, Error> {
    serde_json::to_value(request)
        .map_err(|error| Error::other(format!("cannot encode the request: {error}")))
}

fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

/// Text that looks like a credential, replaced: a known prefix at the start of a word, then
/// at least 16 characters of a key.
fn redact(text: &str) -> String {
    const PREFIXES: [&str; 8] = [
        "sk-ant-", "sk-", "AIza", "ghp_", "xoxb-", "xoxp-", "Bearer ", "bearer ",
    ];
    const MIN: usize = 16;
    let is_key = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        let boundary = i == 0 || !is_key(bytes[i - 1]);
        if boundary && matches!(bytes[i], b's' | b'A' | b'g' | b'x' | b'B' | b'b') {
            let found = PREFIXES.iter().find_map(|prefix| {
                let tail = text[i..].strip_prefix(prefix)?;
                let secret = tail.bytes().take_while(|b| is_key(*b)).count();
                (secret >= MIN).then_some(prefix.len() + secret)
            });
            if let Some(length) = found {
                out.push_str(&text[copied..i]);
                out.push_str("[REDACTED]");
                i += length;
                copied = i;
                continue;
            }
        }
        i += 1;
    }
    out.push_str(&text[copied..]);
    out
}

/// Records around, or replays instead of, a model service. See [`Cassette`].
#[derive(Debug, Clone)]
pub struct CassetteLayer {
    cassette: Cassette,
}

impl<M> Layer<M> for CassetteLayer {
    type Service = CassetteModel<M>;

    fn layer(&self, inner: M) -> Self::Service {
        CassetteModel {
            inner,
            cassette: self.cassette.clone(),
        }
    }
}

/// The model service of a [`CassetteLayer`].
#[derive(Debug, Clone)]
pub struct CassetteModel<M> {
    inner: M,
    cassette: Cassette,
}

impl<M> Service<ModelRequest> for CassetteModel<M>
where
    M: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
    M::Error: Into<BoxError>,
    M::Future: Send,
{
    type Response = ModelResponse;
    type Error = Error;
    type Future = BoxFuture<'static, Result<ModelResponse, Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        // The inner model is made ready in `call`, only when it is called.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ModelRequest) -> Self::Future {
        let cassette = self.cassette.clone();
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let key = key_of(&Canonical::of(&req))?;
            if cassette.inner.mode != Mode::Record {
                if let Some(Answer::Model(response)) = cassette.find(&key) {
                    return Ok(response);
                }
                if cassette.inner.mode == Mode::Replay {
                    return Err(cassette.miss(&to_value(&Canonical::of(&req))?, false));
                }
            }
            // The request is encoded again for the file after the call: it moves into it.
            let recorded = req.clone();
            let response = ask(&mut inner, req).await?;
            cassette.write(&Line {
                key: &key,
                request: Some(&to_value(&Canonical::of(&recorded))?),
                response: Some(&response),
                call: None,
                result: None,
            })?;
            Ok(response)
        })
    }
}

/// Records around, or replays instead of, a tool service. See [`Cassette::tool_layer`].
#[derive(Debug, Clone)]
pub struct CassetteToolLayer {
    cassette: Cassette,
}

impl<T> Layer<T> for CassetteToolLayer {
    type Service = CassetteTools<T>;

    fn layer(&self, inner: T) -> Self::Service {
        CassetteTools {
            inner,
            cassette: self.cassette.clone(),
        }
    }
}

/// The tool service of a [`CassetteToolLayer`]: it describes the inner service's tools.
#[derive(Debug, Clone)]
pub struct CassetteTools<T> {
    inner: T,
    cassette: Cassette,
}

impl<T: DescribeTools> DescribeTools for CassetteTools<T> {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        self.inner.tool_specs()
    }
}

impl<T> Service<ToolRequest> for CassetteTools<T>
where
    T: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    T::Error: Into<BoxError>,
    T::Future: Send,
{
    type Response = ToolResponse;
    type Error = Error;
    type Future = BoxFuture<'static, Result<ToolResponse, Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        // The inner service is made ready in `call`, only when it is called.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        let cassette = self.cassette.clone();
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let call = ToolCanonical {
                tool: &req.call.name,
                arguments: &req.call.arguments,
            };
            let key = key_of(&call)?;
            let request = to_value(&call)?;
            if cassette.inner.mode != Mode::Record {
                if let Some(Answer::Tool(mut response)) = cassette.find(&key) {
                    // The recorded result answers this call.
                    response.result.call_id.clone_from(&req.call.id);
                    return Ok(response);
                }
                if cassette.inner.mode == Mode::Replay {
                    return Err(cassette.miss(&request, true));
                }
            }
            let response = ask(&mut inner, req).await?;
            cassette.write(&Line {
                key: &key,
                request: None,
                response: None,
                call: Some(&request),
                result: Some(&response),
            })?;
            Ok(response)
        })
    }
}

/// Ready `inner`, then call it with `req`; its errors as the core's.
async fn ask<S, Req>(inner: &mut S, req: Req) -> Result<S::Response, Error>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    std::future::poll_fn(|cx| inner.poll_ready(cx))
        .await
        .map_err(|e| Error::from_boxed(e.into()))?;
    inner
        .call(req)
        .await
        .map_err(|e| Error::from_boxed(e.into()))
}

/// The model behind a replay-only cassette ([`Cassette::model`]): never called.
#[derive(Debug, Clone, Copy)]
pub struct NoModel;

impl Service<ModelRequest> for NoModel {
    type Response = ModelResponse;
    type Error = Error;
    type Future = std::future::Ready<Result<ModelResponse, Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: ModelRequest) -> Self::Future {
        std::future::ready(Err(Error::other(
            "a replay-only cassette has no model to record from",
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ScriptedModel, StubTool};
    use tower::ServiceExt;
    use tower_agent_core::{AgentRequest, Message, Session, ToolCall};
    use tower_agent_loop::Agent;
    use tower_agent_tools::ToolSet;

    #[tokio::test]
    async fn tool_calls_replay_from_the_cassette_and_the_tools_do_not_run() {
        let path = std::env::temp_dir().join(format!(
            "cassette-tools-{}.jsonl",
            tower_agent_core::new_id()
        ));
        let script = || {
            ScriptedModel::new([
                ModelResponse::tool_calls([ToolCall::new(
                    "c1",
                    "weather",
                    serde_json::json!({ "city": "Oslo" }),
                )]),
                ModelResponse::text("Rainy."),
            ])
        };
        let ask = || AgentRequest::new(Session::with_id("s"), "Weather in Oslo?");

        // Record: the model and the tool answer; both are written.
        let weather = StubTool::returning("weather", "4°C, light rain");
        let recording = Cassette::open(&path, Mode::Record).expect("a new cassette");
        let tools = recording
            .tool_layer()
            .layer(ToolSet::new().tool(weather.clone()));
        let model = recording.layer().layer(script());
        let recorded = Agent::builder()
            .build(model, tools)
            .oneshot(ask())
            .await
            .expect("recorded");
        assert_eq!(weather.calls().len(), 1);
        assert_eq!(recording.len(), 3, "two model calls and one tool call");

        // Replay: no model, and a tool that would answer otherwise is never called.
        let other = StubTool::returning("weather", "sunny");
        let replay = Cassette::open(&path, Mode::Replay).expect("the cassette");
        let tools = replay
            .tool_layer()
            .layer(ToolSet::new().tool(other.clone()));
        let replayed = Agent::builder()
            .build(replay.model(), tools)
            .oneshot(ask())
            .await
            .expect("replayed");
        assert!(other.calls().is_empty(), "the tool ran on replay");
        assert_eq!(replayed.session.history, recorded.session.history);

        // The recorded result answers the call's own id; other arguments miss, with a diff.
        let replay = Cassette::open(&path, Mode::Replay).expect("the cassette");
        let mut tools = replay
            .tool_layer()
            .layer(ToolSet::new().tool(other.clone()));
        let call = ToolCall::new("c9", "weather", serde_json::json!({ "city": "Oslo" }));
        let res = tools
            .call(ToolRequest::new(call, Default::default()))
            .await
            .expect("replayed");
        assert_eq!(res.result.call_id, "c9");
        assert_eq!(res.result.content, "4°C, light rain");
        let call = ToolCall::new("c10", "weather", serde_json::json!({ "city": "Bergen" }));
        let miss = tools
            .call(ToolRequest::new(call, Default::default()))
            .await
            .expect_err("not recorded");
        let diff = miss.to_string();
        assert!(
            diff.lines()
                .any(|l| l.starts_with('-') && l.contains("Oslo")),
            "{diff}"
        );
        assert!(
            diff.lines()
                .any(|l| l.starts_with('+') && l.contains("Bergen")),
            "{diff}"
        );
        assert!(other.calls().is_empty());
        let _ = std::fs::remove_file(&path);
    }

    fn ask(text: &str) -> ModelRequest {
        ModelRequest::new(vec![Message::user(text)])
    }

    async fn text(
        model: impl Service<ModelRequest, Response = ModelResponse, Error = Error>,
        q: &str,
    ) -> String {
        model
            .oneshot(ask(q))
            .await
            .expect("an answer")
            .message
            .text()
    }

    #[tokio::test]
    async fn a_request_made_again_gets_its_answers_in_order_and_record_missing_adds_only_misses() {
        let path = std::env::temp_dir().join(format!(
            "cassette-unit-{}.jsonl",
            tower_agent_core::new_id()
        ));
        let real =
            ScriptedModel::new([ModelResponse::text("first"), ModelResponse::text("second")]);
        let cassette = Cassette::open(&path, Mode::Record).expect("a cassette");
        let model = cassette.layer().layer(real.clone());
        assert_eq!(text(model.clone(), "same").await, "first");
        assert_eq!(text(model, "same").await, "second");

        let replay = Cassette::open(&path, Mode::Replay).expect("read").model();
        assert_eq!(text(replay.clone(), "same").await, "first");
        assert_eq!(text(replay.clone(), "same").await, "second");
        // Past the recorded answers: the last one again.
        assert_eq!(text(replay, "same").await, "second");

        real.push(Ok(ModelResponse::text("new")));
        let missing = Cassette::open(&path, Mode::RecordMissing).expect("read");
        let model = missing.layer().layer(real.clone());
        assert_eq!(text(model.clone(), "same").await, "first");
        assert_eq!(text(model, "other").await, "new");
        assert_eq!(real.request_count(), 3, "only the miss reached the model");
        let lines = std::fs::read_to_string(&path).expect("the file");
        assert_eq!(lines.lines().count(), 3);
        let replay = Cassette::open(&path, Mode::Replay).expect("read").model();
        assert_eq!(text(replay, "other").await, "new");

        // A request made again past its recorded answers asks the model (and is recorded).
        real.push(Ok(ModelResponse::text("again")));
        let missing = Cassette::open(&path, Mode::RecordMissing).expect("read");
        let model = missing.layer().layer(real.clone());
        assert_eq!(text(model.clone(), "other").await, "new");
        assert_eq!(text(model, "other").await, "again");
        assert_eq!(real.request_count(), 4);
        let replay = Cassette::open(&path, Mode::Replay).expect("read").model();
        assert_eq!(text(replay.clone(), "other").await, "new");
        assert_eq!(text(replay, "other").await, "again");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_line_that_is_not_a_call_names_its_number() {
        let path =
            std::env::temp_dir().join(format!("cassette-bad-{}.jsonl", tower_agent_core::new_id()));
        std::fs::write(&path, "\n{\"key\": \"k\"}\n").expect("written");
        let error = Cassette::open(&path, Mode::Replay).expect_err("not a call");
        assert!(
            error.to_string().contains("line 2 is not a recorded call"),
            "{error}"
        );
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn keys_and_bearer_tokens_are_redacted() {
        let line = r#"{"text":"use sk-proj-abcdefghijklmnop1234 or Bearer abcdefghijklmnopqrstu, sk-short"}"#;
        assert_eq!(
            redact(line),
            r#"{"text":"use [REDACTED] or [REDACTED], sk-short"}"#
        );
        assert_eq!(
            redact("héllo AIzaSyA1234567890abcdefgh!"),
            "héllo [REDACTED]!"
        );
    }
}
