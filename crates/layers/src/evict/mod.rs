//! Large-result eviction: a tool result over a token limit is written whole to a storage
//! backend and replaced by a preview; a read tool lets the model page through it.
//!
//! [`EvictLayer`] goes on the **tool service** (`after_tool`). When a tool's result is
//! estimated at **more than** the limit ([`EvictLayer::limit`], default 20,000 tokens, counted
//! by [`CharEstimate`] or [`EvictLayer::counter`]), and the tool is not excluded
//! ([`EvictLayer::exclude`]; the read tool always is, so the model cannot loop evicting its own
//! reads):
//!
//! 1. the whole result is written to the backend at
//!    `/large_tool_results/{session}/{tool}_{call_id}`: a directory per session (the run's
//!    session id; none when it is empty, as for a layer used outside an agent), so sessions
//!    sharing a backend never overwrite or read each other's results. Each part is mapped to
//!    `[A-Za-z0-9_.-]` and shortened with a stable hash when it had to change or is long, so a
//!    name a model wrote never leaves the directory nor fails the write; within a session,
//!    call ids are unique, so two calls of a tool never share a path. The read tool reads only
//!    its own session's directory;
//! 2. the result's content becomes a preview: its first and last lines
//!    ([`EvictLayer::preview_lines`], default 10 and 10) numbered like `cat -n`, lines clipped
//!    at [`EvictLayer::max_line_chars`] characters (default 500), what was left out, the path,
//!    and how to read it with the read tool. The call id, tool name, error flag and action are
//!    kept;
//! 3. a [`ResultEvicted`] event is emitted, and the response is a *replacement*: the user's
//!    `after_tool` callbacks further out skip it (the "built-in first" rule of
//!    `docs/ordering.md`).
//!
//! A result at the limit or under it passes through untouched: the layer counts its tokens
//! and allocates nothing. So does a paused call's result (it is never shown to the model).
//!
//! A preview, for a tool `logs` that returned 5,000 lines (`event 1` to `event 5000`):
//!
//! ```text
//! [This result is too large for the context: about 13474 tokens, over the limit of 1000. It was saved whole to /large_tool_results/logs_call_1 (5000 lines, 53893 characters). Its first 10 and last 10 lines follow, numbered; lines longer than 500 characters are clipped.]
//!      1    event 1
//!      2    event 2
//! (lines 3 to 9)
//!     10    event 10
//! [... 4980 lines (53702 characters) left out: lines 11 to 4990 ...]
//!   4991    event 4991
//! (lines 4992 to 4999)
//!   5000    event 5000
//! [To read it, call `read_large_result` with {"path": "/large_tool_results/logs_call_1", "offset": 11, "limit": 200}: `offset` is the first line to show (1-based), `limit` how many lines (default 200). Each reply says which lines it shows and the offset of the next slice.]
//! ```
//!
//! (A tab, shown here as spaces, separates each number from its line.) A clipped line ends
//! with `[... line clipped: N more characters, from column C]`: the read tool's `column`
//! argument reads on from there.
//!
//! The read tool ([`EvictLayer::read_tool`], named [`READ_TOOL`]) takes `path`, `offset`
//! (1-based, default 1), `limit` (lines, default 200) and `column` (the character of the first
//! line to start at, default 1: a line of compact JSON is read on piece by piece) and answers
//! with the lines in the same format; see [`ReadLargeResult`]. The layer serves it itself and
//! reports it with the inner service's tools ([`DescribeTools`]), so the agent offers it to
//! the model; nothing is to be added to the `ToolSet`.
//!
//! Stored results stay until the host deletes them: [`EvictLayer::forget_session`] deletes a
//! session's when the session is closed or expires.
//!
//! # Where it goes
//!
//! The outermost built-in on the tool service in the canonical stack of `docs/ordering.md`,
//! outside in:
//!
//! ```text
//! tool service
//!     .observe(..)                 1. sees every result: the preview of an evicted one
//!     .layer(evict.clone())        2. this layer: what it returns is what the model sees
//!     .layer(limits)               3. before_tool layers: a result any of them answers with
//!     .layer(checkpoint)              is kept small too
//!     .layer(approval)
//!     user after_tool              4. sees the tool's own result
//!     user before_tool
//!     ToolSet
//! ```
//!
//! # Memory
//!
//! A large result is not copied: its `String` is moved into the [`Bytes`](bytes::Bytes) given
//! to the backend, the preview is built from it in place, and when the write fails the same
//! buffer becomes the content again. Peak memory stays near one copy of the result (see the
//! test `evict_peak.rs`).
//!
//! # Example
//!
//! ```
//! use serde_json::json;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_agent_core::{DescribeTools, Error, RunContext, ToolCall, ToolRequest};
//! use tower_agent_layers::evict::{EvictLayer, READ_TOOL};
//! use tower_agent_storage::InMemory;
//! use tower_agent_test::StubTool;
//! use tower_agent_tools::ToolSet;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let log: String = (1..=5000).map(|i| format!("event {i}\n")).collect();
//! let evict = EvictLayer::new(InMemory::new()).limit(1_000);
//! let tools = ToolSet::new().tool(StubTool::returning("logs", log));
//! // The layer serves its read tool and reports it with the set's tools.
//! let mut tools = ServiceBuilder::new().layer(evict).service(tools);
//! assert_eq!(tools.tool_specs().len(), 2);
//!
//! let call = ToolCall::new("call_1", "logs", json!({}));
//! let res = tools.ready().await?.call(ToolRequest::new(call, RunContext::new())).await?;
//! let preview = &res.result.content;
//! assert!(preview.starts_with("[This result is too large for the context: about 13474 tokens"));
//! assert!(preview.contains("saved whole to /large_tool_results/logs_call_1 (5000 lines"));
//! assert!(preview.contains("     1\tevent 1\n"));
//! assert!(preview.contains("[... 4980 lines (53702 characters) left out"));
//! assert!(preview.contains("  5000\tevent 5000\n"));
//!
//! // The model reads lines 11 and 12.
//! let args = json!({"path": "/large_tool_results/logs_call_1", "offset": 11, "limit": 2});
//! let call = ToolCall::new("call_2", READ_TOOL, args);
//! let res = tools.ready().await?.call(ToolRequest::new(call, RunContext::new())).await?;
//! assert!(res.result.content.starts_with("    11\tevent 11\n    12\tevent 12\n[Lines 11 to 12"));
//! # Ok(())
//! # }
//! ```
//!
//! # Errors
//!
//! The layer adds no failure of its own: a backend that cannot write keeps the full result
//! inline, unchanged, with an [`Event::Warning`] (source `"evict"`), and the run goes on. The
//! inner service's errors pass through untouched. An observer that fails on the emitted event
//! fails the call with its error, as everywhere in a run.
//!
//! [`CharEstimate`]: crate::tokens::CharEstimate
//! [`Event::Warning`]: tower_agent_core::Event::Warning

mod callback;
mod path;
mod preview;
mod read;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_agent_core::callback::{After, AfterFuture};
use tower_agent_core::{DescribeTools, Error, ToolRequest, ToolResponse, ToolSpec};
use tower_agent_storage::{Storage, StorageError};
use tower_agent_tools::Tool;
use tower_layer::Layer;
use tower_service::Service;

pub use callback::{EvictFuture, EvictLarge};
pub use read::{ReadArgs, ReadLargeResult};

use crate::tokens::{CharEstimate, TokenCounter};
use preview::Shape;

/// A tool result too large for the context was written whole to the storage backend and
/// replaced by a preview naming `path`: an event of this layer
/// ([`Event::Layer`](tower_agent_core::Event::Layer), read with
/// [`Event::downcast_ref`](tower_agent_core::Event::downcast_ref)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResultEvicted {
    /// The call's id.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// Where the whole result is, as the preview names it (`/large_tool_results/..`).
    pub path: String,
    /// The estimated tokens of the whole result.
    pub tokens: usize,
}

impl tower_agent_core::LayerEvent for ResultEvicted {
    const NAME: &'static str = "result_evicted";
}

impl fmt::Display for ResultEvicted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the result of `{}` ({} tokens) was moved to {}",
            self.name, self.tokens, self.path
        )
    }
}

/// The name of the read tool: [`EvictLayer::read_tool`].
pub const READ_TOOL: &str = "read_large_result";

/// The directory evicted results are written to, in the backend.
pub const RESULTS_DIR: &str = path::DIR;

/// What the callback and the read tool share.
#[derive(Clone)]
struct Config {
    storage: Arc<dyn Storage>,
    counter: Arc<dyn TokenCounter>,
    limit: usize,
    exclude: Vec<String>,
    shape: Shape,
}

impl Config {
    fn is_excluded(&self, tool: &str) -> bool {
        tool == READ_TOOL || self.exclude.iter().any(|name| name == tool)
    }
}

/// Applies [`Evict`]; see the [module docs](self).
#[derive(Clone)]
pub struct EvictLayer {
    config: Arc<Config>,
}

impl EvictLayer {
    /// The default of [`EvictLayer::limit`]: 20,000 tokens.
    pub const DEFAULT_LIMIT: usize = 20_000;
    /// The default number of lines shown from the start of a result.
    pub const DEFAULT_HEAD_LINES: usize = 10;
    /// The default number of lines shown from the end of a result.
    pub const DEFAULT_TAIL_LINES: usize = 10;
    /// The default of [`EvictLayer::max_line_chars`]: 500 characters.
    pub const DEFAULT_MAX_LINE_CHARS: usize = 500;
    /// The default of [`EvictLayer::read_lines`]: 200 lines.
    pub const DEFAULT_READ_LINES: usize = 200;

    /// Evict to `storage`, with the defaults: a limit of 20,000 tokens by [`CharEstimate`],
    /// 10 lines shown from each end, lines clipped at 500 characters, no tool excluded but the
    /// read tool.
    pub fn new(storage: impl Storage) -> Self {
        Self::from_shared(Arc::new(storage))
    }

    /// Evict to a backend shared with other parts of the host.
    pub fn from_shared(storage: Arc<dyn Storage>) -> Self {
        Self {
            config: Arc::new(Config {
                storage,
                counter: Arc::new(CharEstimate),
                limit: Self::DEFAULT_LIMIT,
                exclude: Vec::new(),
                shape: Shape {
                    head: Self::DEFAULT_HEAD_LINES,
                    tail: Self::DEFAULT_TAIL_LINES,
                    max_line_chars: Self::DEFAULT_MAX_LINE_CHARS,
                    read_lines: Self::DEFAULT_READ_LINES,
                },
            }),
        }
    }

    fn update(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// Evict results of more than `tokens` tokens; a result of exactly `tokens` stays inline.
    /// A slice of the read tool stops before passing it too.
    pub fn limit(self, tokens: usize) -> Self {
        self.update(|config| config.limit = tokens)
    }

    /// Count tokens with `counter` (a real tokenizer, or any `Fn(&str) -> usize`).
    pub fn counter(self, counter: impl TokenCounter) -> Self {
        self.update(|config| config.counter = Arc::new(counter))
    }

    /// Never evict the results of the tool `tool` (the read tool is always excluded).
    pub fn exclude(self, tool: impl Into<String>) -> Self {
        let tool = tool.into();
        self.update(|config| {
            if !config.exclude.contains(&tool) {
                config.exclude.push(tool);
            }
        })
    }

    /// Show the first `head` and the last `tail` lines in the preview.
    pub fn preview_lines(self, head: usize, tail: usize) -> Self {
        self.update(|config| {
            config.shape.head = head;
            config.shape.tail = tail;
        })
    }

    /// Clip lines longer than `chars` characters (at least 1), in the preview and in the read
    /// tool's slices.
    pub fn max_line_chars(self, chars: usize) -> Self {
        self.update(|config| config.shape.max_line_chars = chars.max(1))
    }

    /// The number of lines the read tool shows when the model gives no `limit` (at least 1).
    pub fn read_lines(self, lines: usize) -> Self {
        self.update(|config| config.shape.read_lines = lines.max(1))
    }

    /// The tool the model reads evicted results with, named [`READ_TOOL`], reading from this
    /// layer's backend. The layer's service serves it already; this is for a host that wants
    /// it elsewhere (another agent reading the same backend).
    pub fn read_tool(&self) -> ReadLargeResult {
        ReadLargeResult::new(Arc::clone(&self.config))
    }

    /// The backend results are written to.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.config.storage
    }

    /// Delete the results evicted in the session `session_id`, for a host that closes or
    /// expires sessions: every value right inside the session's directory. Returns how many
    /// it deleted. Other sessions' results stay. With an empty id, the results written without
    /// a session (right inside [`RESULTS_DIR`]) are deleted, and no session's directory.
    ///
    /// ```
    /// use tower_agent_layers::evict::EvictLayer;
    /// use tower_agent_storage::{InMemory, Storage, StoragePath};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_agent_storage::StorageError> {
    /// let storage = InMemory::new();
    /// let path = StoragePath::parse("/large_tool_results/s1/fetch_call_1")?;
    /// storage.put(&path, "a large result".into()).await?;
    ///
    /// let layer = EvictLayer::new(storage.clone());
    /// assert_eq!(layer.forget_session("s2").await?, 0);
    /// assert_eq!(layer.forget_session("s1").await?, 1);
    /// assert!(storage.get(&path).await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The backend's, listing or deleting; what was deleted before stays deleted.
    pub async fn forget_session(&self, session_id: &str) -> Result<usize, StorageError> {
        let storage = &self.config.storage;
        let prefix = path::session_prefix(session_id);
        let mut deleted = 0;
        for entry in storage.list(&prefix).await? {
            // Right inside: the layer writes no deeper, and a session's directory is not a
            // result of the empty session.
            let inside = entry
                .path
                .as_str()
                .strip_prefix(&prefix[1..])
                .is_some_and(|name| !name.contains('/'));
            if inside {
                storage.delete(&entry.path).await?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}

impl fmt::Debug for EvictLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.config;
        f.debug_struct("EvictLayer")
            .field("limit", &config.limit)
            .field("exclude", &config.exclude)
            .field("preview_lines", &(config.shape.head, config.shape.tail))
            .field("max_line_chars", &config.shape.max_line_chars)
            .field("read_lines", &config.shape.read_lines)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for EvictLayer {
    type Service = Evict<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Evict {
            inner: After::new(
                inner,
                EvictLarge {
                    config: Arc::clone(&self.config),
                },
            ),
            read: self.read_tool(),
            offered: Offered::default(),
        }
    }
}

/// Moves large tool results to a backend, leaving a preview, and serves the read tool
/// ([`READ_TOOL`]) itself; see the [module docs](self).
///
/// `poll_ready` is the inner service's. It reports the inner service's tools and its read
/// tool ([`DescribeTools`]).
#[derive(Clone, Debug)]
pub struct Evict<S> {
    inner: After<S, EvictLarge>,
    read: ReadLargeResult,
    offered: Offered,
}

/// The tools the layer last reported: the inner service's list (to tell when it changes) and
/// that list with the read tool. A round whose inner list did not change copies no spec.
#[derive(Clone, Debug, Default)]
struct Offered(Arc<Mutex<Option<Lists>>>);

/// The inner list, and the list reported.
type Lists = (Arc<[ToolSpec]>, Arc<[ToolSpec]>);

impl<S> Evict<S> {
    /// Wrap `inner` with the configuration of `layer`.
    pub fn new(inner: S, layer: &EvictLayer) -> Self {
        layer.layer(inner)
    }

    /// A layer evicting to `storage` ([`EvictLayer::new`]).
    pub fn layer(storage: impl Storage) -> EvictLayer {
        EvictLayer::new(storage)
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        self.inner.get_ref()
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        self.inner.get_mut()
    }

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner.into_inner()
    }
}

/// The inner service's tools and the read tool, once: the layer serves it, whatever the inner
/// service has under that name.
impl<S: DescribeTools> DescribeTools for Evict<S> {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        let inner = self.get_ref().tool_specs();
        let mut offered = self
            .offered
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((seen, all)) = &*offered {
            if Arc::ptr_eq(seen, &inner) {
                return Arc::clone(all);
            }
        }
        let all: Arc<[ToolSpec]> = if inner.iter().any(|spec| spec.name == READ_TOOL) {
            Arc::clone(&inner)
        } else {
            inner.iter().cloned().chain([self.read.spec()]).collect()
        };
        *offered = Some((inner, Arc::clone(&all)));
        all
    }
}

impl<S> Service<ToolRequest> for Evict<S>
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: From<Error>,
{
    type Response = ToolResponse;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        // The read tool answers here, never evicted: reading a large result in slices cannot
        // loop.
        let kind = if req.call.name == READ_TOOL {
            Kind::Read {
                future: self.read.call(req),
            }
        } else {
            Kind::Evict {
                future: self.inner.call(req),
            }
        };
        ResponseFuture { kind }
    }
}

pin_project! {
    /// The response future of [`Evict`]: the inner service's, then the eviction; or the read
    /// tool's.
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Evict { #[pin] future: AfterFuture<F, EvictLarge, ToolResponse> },
        Read { #[pin] future: tower_agent_tools::ResponseFuture },
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<ToolResponse, E>>,
    E: From<Error>,
{
    type Output = Result<ToolResponse, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Evict { future } => future.poll(cx),
            KindProj::Read { future } => future.poll(cx).map_err(E::from),
        }
    }
}

/// Eviction outermost on the tools: a result is stored as the model would see it (redacted),
/// and the read tool is offered with the tools.
impl tower_agent_loop::Builtin for EvictLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::ToolSlot;
        stacks.tools(ToolSlot::Evict, self);
    }
}
