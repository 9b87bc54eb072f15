//! The tools of [MCP](https://modelcontextprotocol.io) servers as a
//! [tower-agent](https://docs.rs/tower-agent) tool service, on the official Rust SDK
//! ([`rmcp`]).
//!
//! [`McpTools`] connects to one or more servers, lists their tools (every page) into
//! [`ToolSpec`]s and routes each call to the server that has the tool. It is an ordinary tool
//! service that describes its tools ([`DescribeTools`]), so every tool-side layer (approval,
//! limits, eviction, a timeout) applies to MCP tools unchanged, and the agent offers the model
//! whatever the servers list now.
//!
//! | what happens | what the agent sees |
//! |---|---|
//! | a tool's result | its text (structured content as JSON when there is no text), `is_error` as the server said |
//! | a JSON-RPC error (an unknown tool, bad arguments) | an error result the model reads |
//! | arguments that are not a JSON object | an error result, nothing sent |
//! | the transport is lost (the process exited, the connection dropped) | `Err` of kind [`Backend`](tower_agent_core::ErrorKind::Backend) with an [`McpError`] source; the next call connects again |
//! | the HTTP server refused the call because it no longer knows the session (it restarted: HTTP 404, or a 400 that names the session), or refused the connection | a new session (the tools listed again), and the call sent once more; never a call the server may have run |
//! | a server cannot be connected at [`McpTools::connect`] | its tools left out, a `tracing` warning, [`McpTools::unavailable`]; `Err` only for a [`required`](McpServer::required) server, or when none connects |
//! | the call is dropped (the run cancelled, a timeout layer) | `notifications/cancelled` sent to the server |
//! | `notifications/progress` for a call | an [`Event::ToolProgress`](tower_agent_core::Event::ToolProgress) of the run |
//! | `notifications/tools/list_changed` | the tools listed again; the next round offers them |
//!
//! Several servers at once: a tool keeps its name unless another server has a tool of the same
//! name; then each of those is named `{server}_{tool}`. The tool's MCP annotations
//! (`readOnlyHint`, `destructiveHint`, ...) stay readable with [`McpTools::annotations`]. They
//! are the server's claims: only for a server you trust ([`McpServer::trust_hints`]) does
//! `readOnlyHint` become [`ToolSpec::read_only`] and `idempotentHint`
//! [`ToolSpec::idempotent`], and a call whose answer is lost with the connection is sent once
//! more to a tool with either hint. Each call carries its key
//! ([`ToolCall::key`](tower_agent_core::ToolCall::key)) in the request's `_meta`, as
//! `idempotencyKey`, the same on every send. `destructiveHint` changes nothing here: gate
//! such tools with an approval policy.
//!
//! ```no_run
//! use tower_agent_core::{DescribeTools, Message};
//! use tower_agent_mcp::{McpServer, McpTools};
//!
//! # async fn run() -> Result<(), tower_agent_core::Error> {
//! let tools = McpTools::connect([
//!     McpServer::stdio("files", "npx").args(["-y", "@modelcontextprotocol/server-filesystem", "."]),
//!     McpServer::http("search", "http://127.0.0.1:3001/mcp"),
//! ])
//! .await?;
//! for spec in tools.tool_specs().iter() {
//!     println!("{}: {}", spec.name, spec.description);
//! }
//! // `tools` is the agent's tool service: `Agent::new(model, tools)`.
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//!
//! - `stdio` (default): servers started as child processes. Their stderr goes to `tracing` at
//!   debug level (target `tower_agent_mcp::stderr`).
//! - `http` (default): servers at a URL, over streamable HTTP, in plain HTTP.
//! - `rustls`: HTTPS for `http`.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(not(any(feature = "stdio", feature = "http")))]
compile_error!(
    "tower-agent-mcp needs a transport: the `stdio` feature, the `http` feature, or both"
);

mod config;
mod convert;
mod handler;
#[cfg(feature = "http")]
mod http;
mod server;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};

use futures_util::future::join_all;

use tower_agent_core::{DescribeTools, Error, Recovery, ToolRequest, ToolResponse, ToolSpec};
use tower_service::Service;

pub use config::McpServer;
pub use rmcp;
pub use rmcp::model::ToolAnnotations;

use server::Conn;

/// Whether `error` (of a request) proves the server did not run the request: over HTTP, it
/// refused it because it no longer knows the session, or the connection was refused before
/// anything was sent.
fn refused(error: &rmcp::ServiceError) -> bool {
    #[cfg(feature = "http")]
    {
        http::refused(error)
    }
    #[cfg(not(feature = "http"))]
    {
        let _ = error;
        false
    }
}

/// What went wrong with an MCP server: the source of the [`Error`] a call or a connection
/// returns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server could not be started or reached, or the MCP handshake failed.
    #[error("MCP server `{server}`: cannot connect: {message}")]
    Connect {
        /// The server's name.
        server: String,
        /// Why.
        message: String,
    },
    /// The connection was lost: the process exited, the stream closed. The next call connects
    /// again.
    #[error("MCP server `{server}`: the connection was lost: {message}")]
    Lost {
        /// The server's name.
        server: String,
        /// Why.
        message: String,
    },
    /// The server answered with something that is not the result of the request.
    #[error("MCP server `{server}`: unexpected answer: {message}")]
    Protocol {
        /// The server's name.
        server: String,
        /// What came.
        message: String,
    },
    /// The server did not answer in time: connecting (see
    /// [`McpServer::connect_timeout`]) or listing its tools (see
    /// [`McpServer::list_timeout`]). The error's kind is
    /// [`Timeout`](tower_agent_core::ErrorKind::Timeout).
    #[error("MCP server `{server}`: no answer in time: {message}")]
    Timeout {
        /// The server's name.
        server: String,
        /// What was not answered.
        message: String,
    },
    /// The server refused the call before running it, on its session and again on a new one
    /// (HTTP): the call did not run. The next call connects again.
    #[error("MCP server `{server}`: the call was refused: {message}")]
    Refused {
        /// The server's name.
        server: String,
        /// Why.
        message: String,
    },
}

/// A server that could not be connected (or whose tools could not be listed) the last time
/// it was tried: see [`McpTools::unavailable`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Unavailable {
    /// The server's name.
    pub server: String,
    /// Why: of kind [`Backend`](tower_agent_core::ErrorKind::Backend) or
    /// [`Timeout`](tower_agent_core::ErrorKind::Timeout), with an [`McpError`] source.
    pub error: Error,
}

/// The tools of one or more MCP servers as one tool service.
///
/// Cheap to clone: clones share the connections. See the [crate] documentation.
#[derive(Clone)]
pub struct McpTools {
    inner: Arc<Inner>,
}

struct Inner {
    servers: Vec<Arc<Conn>>,
    routes: RwLock<Arc<Routes>>,
}

/// The tools offered, and where each goes.
#[derive(Default)]
struct Routes {
    specs: Arc<[ToolSpec]>,
    by_name: HashMap<String, Route>,
}

struct Route {
    server: usize,
    /// The tool's name on its server.
    remote: String,
    annotations: Option<ToolAnnotations>,
    /// A call whose answer was lost may be sent again: the server is trusted and says the
    /// tool only reads or is idempotent.
    may_repeat: bool,
}

impl McpTools {
    /// Connect to every server (at once) and list its tools.
    ///
    /// A server that cannot be started, reached or listed within its
    /// [`connect_timeout`](McpServer::connect_timeout) and
    /// [`list_timeout`](McpServer::list_timeout) does not fail the others: its tools are left
    /// out, a warning goes to `tracing` (target `tower_agent_mcp`), and
    /// [`McpTools::unavailable`] names it until [`McpTools::refresh`] connects it.
    ///
    /// # Errors
    ///
    /// The error of a server marked [`required`](McpServer::required) that cannot be
    /// connected, or, when no server at all can be, the first server's: of kind
    /// [`Backend`](tower_agent_core::ErrorKind::Backend) (with an [`McpError::Connect`] or
    /// [`McpError::Protocol`] source) or [`Timeout`](tower_agent_core::ErrorKind::Timeout)
    /// (with an [`McpError::Timeout`] source).
    ///
    /// # Panics
    ///
    /// When two servers have the same name (a programming error, found at start-up).
    pub async fn connect(servers: impl IntoIterator<Item = McpServer>) -> Result<Self, Error> {
        let servers: Vec<Arc<Conn>> = servers
            .into_iter()
            .enumerate()
            .map(|(index, config)| Arc::new(Conn::new(index, config)))
            .collect();
        for (i, conn) in servers.iter().enumerate() {
            assert!(
                servers[..i].iter().all(|c| c.name() != conn.name()),
                "McpTools: two servers are named `{}`",
                conn.name()
            );
        }
        let tools = Self {
            inner: Arc::new(Inner {
                servers,
                routes: RwLock::default(),
            }),
        };
        let inner = &tools.inner;
        let results = join_all(
            inner
                .servers
                .iter()
                .map(|conn| async move { conn.peer(inner).await.map(drop) }),
        )
        .await;
        inner.settle(results)?;
        Ok(tools)
    }

    /// List every server's tools again (a server that does not send
    /// `notifications/tools/list_changed`, say), connecting the servers that are not
    /// connected (those [`McpTools::unavailable`] names, among them).
    ///
    /// # Errors
    ///
    /// As [`McpTools::connect`]: only a [`required`](McpServer::required) server, or every
    /// server, failing fails it; the others are reported as [`McpTools::connect`] reports
    /// them. A server that cannot list its tools keeps offering those listed before.
    pub async fn refresh(&self) -> Result<(), Error> {
        let inner = &self.inner;
        let results = join_all(inner.servers.iter().map(|conn| conn.refresh(inner))).await;
        inner.settle(results)
    }

    /// The servers that could not be connected (or whose tools could not be listed) the last
    /// time they were tried, with why, in the order they were given. A server leaves the list
    /// when it connects: at [`McpTools::refresh`], or when a call of one of its tools (as
    /// listed before) connects again.
    pub fn unavailable(&self) -> Vec<Unavailable> {
        self.inner
            .servers
            .iter()
            .filter_map(|conn| {
                conn.unavailable().map(|error| Unavailable {
                    server: conn.name().to_owned(),
                    error,
                })
            })
            .collect()
    }

    /// The MCP annotations of the tool the model calls `name` (`readOnlyHint`,
    /// `destructiveHint`, ...), for an approval policy, say.
    pub fn annotations(&self, name: &str) -> Option<ToolAnnotations> {
        self.inner
            .routes()
            .by_name
            .get(name)
            .and_then(|route| route.annotations.clone())
    }

    /// The name of the server that has the tool the model calls `name`, and the tool's name
    /// there.
    pub fn server_of(&self, name: &str) -> Option<(&str, String)> {
        let routes = self.inner.routes();
        let route = routes.by_name.get(name)?;
        Some((
            self.inner.servers[route.server].name(),
            route.remote.clone(),
        ))
    }
}

impl Inner {
    fn routes(&self) -> Arc<Routes> {
        Arc::clone(&self.routes.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Of the outcomes of connecting (or refreshing) every server, in order: the failures are
    /// warned of; the error of a required server, or the first when every server failed.
    fn settle(&self, results: Vec<Result<(), Error>>) -> Result<(), Error> {
        let mut required = None;
        let mut first = None;
        let mut failed = 0;
        for (conn, result) in self.servers.iter().zip(results) {
            let Err(error) = result else {
                continue;
            };
            failed += 1;
            tracing::warn!(
                server = conn.name(),
                %error,
                "MCP server unavailable: its tools are not offered until it connects"
            );
            if conn.config().is_required() && required.is_none() {
                required = Some(error.clone());
            }
            first.get_or_insert(error);
        }
        match (required, first) {
            (Some(error), _) => Err(error),
            (None, Some(error)) if failed == self.servers.len() => Err(error),
            _ => Ok(()),
        }
    }

    /// Offer every server's tools as they were last listed.
    fn rebuild(&self) {
        // Under the lock: two servers listed at once each offer the other's tools too.
        let mut routes = self.routes.write().unwrap_or_else(PoisonError::into_inner);
        let listed: Vec<(usize, Vec<rmcp::model::Tool>)> = self
            .servers
            .iter()
            .map(|conn| (conn.index(), conn.tools()))
            .collect();
        let listed_routes = convert::routes(listed.iter().map(|(index, tools)| {
            let server = &self.servers[*index];
            (
                *index,
                server.name(),
                server.trusts_hints(),
                tools.as_slice(),
            )
        }));
        *routes = Arc::new(listed_routes);
    }

    async fn call(self: Arc<Self>, req: ToolRequest) -> Result<ToolResponse, Error> {
        let routes = self.routes();
        let Some(route) = routes.by_name.get(&req.call.name) else {
            return Ok(ToolResponse::unknown_tool(&req.call, &routes.specs));
        };
        // A call an earlier run started and did not finish: MCP has no way to ask a server
        // what became of it, so only a tool that may repeat is sent again (with its key).
        if req.recover && !route.may_repeat {
            drop(routes);
            return Ok(Recovery::Unknown.respond(&req).await);
        }
        let arguments = match convert::arguments(&req.call.arguments) {
            Ok(arguments) => arguments,
            Err(message) => return Ok(ToolResponse::error(&req.call, message)),
        };
        let conn = Arc::clone(&self.servers[route.server]);
        let remote = route.remote.clone();
        let may_repeat = route.may_repeat;
        drop(routes);
        conn.call(&self, remote, arguments, &req, may_repeat).await
    }
}

impl DescribeTools for McpTools {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        Arc::clone(&self.inner.routes().specs)
    }
}

impl fmt::Debug for McpTools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let routes = self.inner.routes();
        f.debug_struct("McpTools")
            .field(
                "servers",
                &self
                    .inner
                    .servers
                    .iter()
                    .map(|c| c.config())
                    .collect::<Vec<_>>(),
            )
            .field(
                "tools",
                &routes.specs.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// The response future of [`McpTools`].
pub type ResponseFuture = Pin<Box<dyn Future<Output = Result<ToolResponse, Error>> + Send>>;

impl Service<ToolRequest> for McpTools {
    type Response = ToolResponse;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        Box::pin(Arc::clone(&self.inner).call(req))
    }
}
