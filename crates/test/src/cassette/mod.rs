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
//! **Secrets:** API keys travel in the provider's headers, never in a request; all the same,
//! every string of a line (in requests, responses, tool arguments and results, object keys) is
//! scrubbed as text, decoded, before it is encoded, written or hashed: a key after a line break
//! or a tab starts a word there, where in the encoded line it followed the escape `\n`.
//! Written as `[REDACTED]`:
//!
//! - a key: a word starting `sk-`, `sk-ant-`, `AIza`, `ghp_`, `xoxb-`, `xoxp-` or `Bearer `,
//!   then 16 or more key characters. A word starts at the start of the text, after a character
//!   that is not a key's (a line break, a tab, a quote, `=`), or after an escape standing for
//!   one in JSON or a URL held in a string (`\n`, `\u000a`, `%0A`);
//! - a value a name marks as a secret, 8 characters or more: in a header or a `.env`
//!   (`x-api-key: ...`, `Authorization: Basic ...`, `OPENAI_API_KEY=...`), a URL
//!   (`?key=...&api_key=...`), JSON (`"client_secret": "..."`); names are `api_key`, `apikey`,
//!   `access_key`, `secret_key`, `private_key`, `token`, `secret`, `password`, `passwd`,
//!   `authorization`, alone or ending a longer name, and `key` or `auth` before `=`.
//!
//! Requests are keyed as written; scrubbing what is scrubbed changes nothing, so a replayed
//! request that carries a scrubbed answer still matches (and one with nothing to scrub is keyed
//! as before). A secret with neither a known prefix nor a name (a bare password in prose) is
//! not recognised: keep real ones out of what a recorded run reads.
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

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tower_agent_core::{Error, ErrorKind, ModelResponse, ToolResponse};
use tower_layer::Layer;

use crate::lock;

mod key;
mod scrub;
mod service;
#[cfg(test)]
mod tests;

use key::pretty;
pub use service::{CassetteLayer, CassetteModel, CassetteToolLayer, CassetteTools, NoModel};

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
        let line = scrub::to_string(line)
            .map_err(|error| Error::other(format!("cannot encode a recorded call: {error}")))?;
        // What is replayed is what the file holds: the scrubbed answer.
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
