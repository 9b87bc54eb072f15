//! One server: how to reach it, and the connection to it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientRequest, JsonObject,
    Meta, PingRequest, RequestId, ServerResult, Tool,
};
use rmcp::service::{PeerRequestOptions, RunningService};
use rmcp::{Peer, RoleClient, ServiceError, ServiceExt};
use tower_agent_core::{Error, ErrorKind, ToolRequest, ToolResponse, ToolResult};

use crate::config::{McpServer, Transport};
use crate::handler::{Handler, Progress};
use crate::{Inner, McpError, convert};

/// The connection to one server: made on first use, made again after it is lost.
pub(crate) struct Conn {
    index: usize,
    config: McpServer,
    live: tokio::sync::Mutex<Option<Live>>,
    generation: AtomicU64,
    tools: Mutex<Vec<Tool>>,
    /// Held while the tools are listed and offered: two listings (a reconnect and a
    /// `list_changed`, or two `list_changed`) never interleave, so the last listed is offered.
    listing: tokio::sync::Mutex<()>,
    /// Why the last attempt to connect (or to list the tools) failed, until one succeeds.
    unavailable: Mutex<Option<Error>>,
}

struct Live {
    service: RunningService<RoleClient, Handler>,
    generation: u64,
    /// The calls of this connection waiting for progress (rmcp numbers progress tokens per
    /// connection: a new one starts again at 0).
    progress: Arc<Progress>,
}

/// A connection to call through.
pub(crate) struct Connected {
    pub(crate) peer: Peer<RoleClient>,
    generation: u64,
    progress: Arc<Progress>,
}

/// How one attempt of a call ended.
enum Attempt {
    /// An answer, or an error to return.
    Done(Result<ToolResponse, Error>),
    /// The server provably did not run the call: it refused it for its session, or the
    /// connection was refused before anything was sent.
    Refused(ServiceError),
    /// The call was sent and its answer lost with the connection: it may have run.
    Lost(Error),
}

/// Why the tools could not be listed.
enum ListFailure {
    /// No answer within the list timeout.
    Timeout,
    /// The request failed.
    Failed(ServiceError),
}

impl Conn {
    pub(crate) fn new(index: usize, config: McpServer) -> Self {
        Self {
            index,
            config,
            live: tokio::sync::Mutex::new(None),
            generation: AtomicU64::new(0),
            tools: Mutex::new(Vec::new()),
            listing: tokio::sync::Mutex::new(()),
            unavailable: Mutex::new(None),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.config.name
    }

    /// Whether the agent acts on the server's tool hints ([`McpServer::trust_hints`]).
    pub(crate) fn trusts_hints(&self) -> bool {
        self.config.trust_hints
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    pub(crate) fn config(&self) -> &McpServer {
        &self.config
    }

    /// The tools as last listed.
    pub(crate) fn tools(&self) -> Vec<Tool> {
        self.tools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Why the last attempt to connect or list failed, unless one succeeded since.
    pub(crate) fn unavailable(&self) -> Option<Error> {
        self.unavailable
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Remember the outcome of an attempt to connect or list.
    fn record<T>(&self, result: &Result<T, Error>) {
        *self
            .unavailable
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = result.as_ref().err().cloned();
    }

    /// The live connection; connects (and lists the tools) first when there is none or it
    /// was lost.
    pub(crate) async fn peer(&self, inner: &Arc<Inner>) -> Result<Connected, Error> {
        let mut live = self.live.lock().await;
        if let Some(current) = live.as_ref() {
            if !current.service.is_closed() && !current.service.peer().is_transport_closed() {
                return Ok(Connected {
                    peer: current.service.peer().clone(),
                    generation: current.generation,
                    progress: Arc::clone(&current.progress),
                });
            }
        }
        *live = None;
        let connected = self.connect(inner).await;
        self.record(&connected);
        let (service, progress) = connected?;
        let peer = service.peer().clone();
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *live = Some(Live {
            service,
            generation,
            progress: Arc::clone(&progress),
        });
        Ok(Connected {
            peer,
            generation,
            progress,
        })
    }

    /// A new connection whose tools are listed (and offered).
    async fn connect(
        &self,
        inner: &Arc<Inner>,
    ) -> Result<(RunningService<RoleClient, Handler>, Arc<Progress>), Error> {
        let progress = Arc::new(Progress::default());
        let handler = Handler {
            inner: Arc::downgrade(inner),
            index: self.index,
            progress: Arc::clone(&progress),
        };
        let service = match within(self.config.connect_timeout, self.start(handler)).await {
            Some(service) => service?,
            None => {
                return Err(self.timed_out(
                    "cannot connect",
                    format!(
                        "not connected within {:?} (McpServer::connect_timeout)",
                        self.config.connect_timeout
                    ),
                ));
            }
        };
        // Listed before it is kept: a connection whose tools cannot be listed is not used.
        self.list(inner, service.peer()).await?;
        Ok((service, progress))
    }

    fn timed_out(&self, what: &str, message: String) -> Error {
        Error::new(
            ErrorKind::Timeout,
            format!("MCP server `{}`: {what}", self.config.name),
        )
        .with_source(McpError::Timeout {
            server: self.config.name.clone(),
            message,
        })
    }

    async fn start(&self, handler: Handler) -> Result<RunningService<RoleClient, Handler>, Error> {
        let failed = |message: String| {
            Error::backend(format!("MCP server `{}`: cannot connect", self.config.name))
                .with_source(McpError::Connect {
                    server: self.config.name.clone(),
                    message,
                })
        };
        match &self.config.transport {
            #[cfg(feature = "stdio")]
            Transport::Stdio {
                program,
                args,
                env,
                dir,
            } => {
                use rmcp::transport::TokioChildProcess;
                let mut command = tokio::process::Command::new(program);
                command.args(args).envs(env.iter().map(|(k, v)| (k, v)));
                if let Some(dir) = dir {
                    command.current_dir(dir);
                }
                let (transport, stderr) = TokioChildProcess::builder(command)
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|error| failed(format!("cannot start {program:?}: {error}")))?;
                if let Some(stderr) = stderr {
                    tokio::spawn(log_stderr(self.config.name.clone(), stderr));
                }
                handler
                    .serve(transport)
                    .await
                    .map_err(|error| failed(error.to_string()))
            }
            #[cfg(feature = "http")]
            Transport::Http { url, bearer } => handler
                .serve(crate::http::transport(url, bearer.as_deref()))
                .await
                .map_err(|error| failed(error.to_string())),
            #[cfg(not(feature = "stdio"))]
            Transport::Stdio { .. } => Err(failed("the `stdio` feature is off".to_owned())),
            #[cfg(not(feature = "http"))]
            Transport::Http { .. } => Err(failed("the `http` feature is off".to_owned())),
        }
    }

    /// List the server's tools (every page) and offer them.
    pub(crate) async fn list(&self, inner: &Inner, peer: &Peer<RoleClient>) -> Result<(), Error> {
        self.try_list(inner, peer)
            .await
            .map_err(|failure| self.list_error(failure))
    }

    fn list_error(&self, failure: ListFailure) -> Error {
        match failure {
            ListFailure::Timeout => self.timed_out(
                "cannot list its tools",
                format!(
                    "tools/list not answered within {:?} (McpServer::list_timeout)",
                    self.config.list_timeout
                ),
            ),
            ListFailure::Failed(error) => Error::backend(format!(
                "MCP server `{}`: cannot list its tools",
                self.config.name
            ))
            .with_source(McpError::Protocol {
                server: self.config.name.clone(),
                message: error.to_string(),
            }),
        }
    }

    async fn try_list(&self, inner: &Inner, peer: &Peer<RoleClient>) -> Result<(), ListFailure> {
        let _listing = self.listing.lock().await;
        let tools = within(self.config.list_timeout, peer.list_all_tools())
            .await
            .ok_or(ListFailure::Timeout)?
            .map_err(ListFailure::Failed)?;
        *self.tools.lock().unwrap_or_else(PoisonError::into_inner) = tools;
        inner.rebuild();
        Ok(())
    }

    /// Connect when not connected, and list the tools again. A listing the server refused
    /// because it forgot the session (it restarted) connects again, which lists them.
    pub(crate) async fn refresh(&self, inner: &Arc<Inner>) -> Result<(), Error> {
        let connected = self.peer(inner).await?;
        let result = match self.try_list(inner, &connected.peer).await {
            Ok(()) => Ok(()),
            Err(ListFailure::Failed(error)) if crate::refused(&error) => {
                self.lost(connected.generation).await;
                self.peer(inner).await.map(drop)
            }
            Err(failure) => Err(self.list_error(failure)),
        };
        self.record(&result);
        result
    }

    /// Forget the connection of `generation` (not a newer one another call made).
    async fn lost(&self, generation: u64) {
        let mut live = self.live.lock().await;
        if live.as_ref().is_some_and(|l| l.generation == generation) {
            *live = None;
        }
    }

    /// Call the server's tool `remote` for `req`. A call the server provably did not run (it
    /// refused it because it no longer knows the session, or the connection was refused)
    /// connects again and is sent once more. A call whose answer was lost with the connection
    /// may have run: it is sent once more only when `may_repeat` (the tool only reads, or is
    /// idempotent), with the same key ([`ToolCall::key`](tower_agent_core::ToolCall::key)).
    pub(crate) async fn call(
        &self,
        inner: &Arc<Inner>,
        remote: String,
        arguments: Option<JsonObject>,
        req: &ToolRequest,
        may_repeat: bool,
    ) -> Result<ToolResponse, Error> {
        let connected = self.peer(inner).await?;
        let generation = connected.generation;
        let refused = match self
            .attempt(connected, remote.clone(), arguments.clone(), req)
            .await
        {
            Attempt::Done(result) => return result,
            Attempt::Lost(error) if !may_repeat => return Err(error),
            Attempt::Lost(error) => {
                tracing::info!(
                    server = %self.config.name,
                    %error,
                    "the answer to an idempotent MCP call was lost: sending it once more"
                );
                let connected = self.peer(inner).await?;
                let generation = connected.generation;
                return match self.attempt(connected, remote, arguments, req).await {
                    Attempt::Done(result) => result,
                    Attempt::Lost(error) => Err(error),
                    Attempt::Refused(error) => Err(self.failed(error, generation).await),
                };
            }
            Attempt::Refused(error) => error,
        };
        tracing::info!(
            server = %self.config.name,
            error = %refused,
            "MCP call refused before it ran: connecting again and sending it once more"
        );
        self.lost(generation).await;
        let connected = self.peer(inner).await?;
        let generation = connected.generation;
        match self.attempt(connected, remote, arguments, req).await {
            Attempt::Done(result) => result,
            Attempt::Lost(error) => Err(error),
            Attempt::Refused(error) => {
                // Refused on a new session too: nothing ran; the next call connects again.
                self.lost(generation).await;
                let server = self.config.name.clone();
                Err(Error::backend(format!(
                    "MCP server `{server}`: the call was refused, sent twice"
                ))
                .with_source(McpError::Refused {
                    server,
                    message: error.to_string(),
                }))
            }
        }
    }

    /// Send the call once on `connected`.
    async fn attempt(
        &self,
        connected: Connected,
        remote: String,
        arguments: Option<JsonObject>,
        req: &ToolRequest,
    ) -> Attempt {
        let Connected {
            peer,
            generation,
            progress,
        } = connected;
        let mut params = CallToolRequestParams::new(remote);
        params.arguments = arguments;
        if let Some(key) = req.call.key {
            // The call's key, for a server that runs each effect once (MCP's SEP-3182 names
            // the field `idempotencyKey`).
            let mut meta = JsonObject::new();
            meta.insert("idempotencyKey".into(), key.to_string().into());
            params.meta = Some(Meta(meta));
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let handle = match peer
            .send_cancellable_request(request, PeerRequestOptions::no_options())
            .await
        {
            Ok(handle) => handle,
            Err(error) => return Attempt::Done(Err(self.failed(error, generation).await)),
        };
        // Dropped before the answer (a cancelled run, a timeout): the server hears of it.
        let mut cancel = CancelOnDrop {
            peer: Some(peer),
            id: handle.id.clone(),
        };
        let (_watch, early) = progress.watch(handle.progress_token.clone(), &req.ctx, &req.call);
        for event in early {
            let _ = req.ctx.emit(event).await;
        }
        let answer = tokio::select! {
            answer = handle.await_response() => answer,
            lost = lost(cancel.peer.as_ref(), self.config.ping()) => {
                cancel.peer = None;
                // The call was sent and may be running: its outcome is unknown.
                return Attempt::Lost(self.failed(lost, generation).await);
            }
        };
        cancel.peer = None;
        Attempt::Done(match answer {
            Ok(ServerResult::CallToolResult(result)) => Ok(ToolResponse::new(ToolResult {
                call_id: req.call.id.clone(),
                name: req.call.name.clone(),
                content: convert::content(&result),
                is_error: result.is_error.unwrap_or(false),
            })),
            Ok(_) => Err(Error::backend(format!(
                "MCP server `{}`: unexpected answer to tools/call",
                self.config.name
            ))
            .with_source(McpError::Protocol {
                server: self.config.name.clone(),
                message: "not a tools/call result".to_owned(),
            })),
            // A JSON-RPC error (an unknown tool, arguments the server refuses): the model
            // reads it and can correct itself.
            Err(ServiceError::McpError(error)) => Ok(ToolResponse::error(
                &req.call,
                format!("MCP error {}: {}", error.code.0, error.message),
            )),
            Err(ServiceError::Cancelled { reason }) => Ok(ToolResponse::error(
                &req.call,
                format!(
                    "the call was cancelled: {}",
                    reason.as_deref().unwrap_or("no reason given")
                ),
            )),
            Err(error) if crate::refused(&error) => return Attempt::Refused(error),
            Err(error @ (ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
                return Attempt::Lost(self.failed(error, generation).await);
            }
            Err(error) => Err(self.failed(error, generation).await),
        })
    }

    /// The error of a call that did not get an answer. A lost transport is forgotten, so the
    /// next call connects again.
    async fn failed(&self, error: ServiceError, generation: u64) -> Error {
        let server = self.config.name.clone();
        match error {
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                self.lost(generation).await;
                Error::backend(format!("MCP server `{server}`: the connection was lost"))
                    .with_source(McpError::Lost {
                        message: error.to_string(),
                        server,
                    })
            }
            ServiceError::Timeout { .. } => Error::new(
                ErrorKind::Timeout,
                format!("MCP server `{server}`: no answer in time"),
            ),
            other => Error::backend(format!("MCP server `{server}`: the call failed")).with_source(
                McpError::Protocol {
                    server,
                    message: other.to_string(),
                },
            ),
        }
    }
}

/// `future`'s output, or `None` when `timeout` (not zero: zero is no limit) passes first.
async fn within<F: Future>(timeout: Duration, future: F) -> Option<F::Output> {
    if timeout.is_zero() {
        return Some(future.await);
    }
    tokio::time::timeout(timeout, future).await.ok()
}

/// Waits until a ping to `peer` fails or gets no answer in `every`: the transport error (a
/// missing answer counts as a closed transport).
async fn lost(peer: Option<&Peer<RoleClient>>, every: Option<Duration>) -> ServiceError {
    let Some(peer) = peer else {
        return ServiceError::TransportClosed;
    };
    let Some(every) = every else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(every).await;
        let ping = ClientRequest::PingRequest(PingRequest::default());
        match tokio::time::timeout(every, peer.send_request(ping)).await {
            // An answer, even an error, is a server that is there.
            Ok(Ok(_) | Err(ServiceError::McpError(_))) => {}
            Ok(Err(error)) => return error,
            Err(_) => return ServiceError::TransportClosed,
        }
    }
}

/// Sends `notifications/cancelled` for a request whose answer is no longer awaited.
struct CancelOnDrop {
    peer: Option<Peer<RoleClient>>,
    id: RequestId,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(peer) = self.peer.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let params = CancelledNotificationParam::new(
            Some(self.id.clone()),
            Some("the caller stopped waiting".to_owned()),
        );
        runtime.spawn(async move {
            let _ = peer.notify_cancelled(params).await;
        });
    }
}

#[cfg(feature = "stdio")]
async fn log_stderr(server: String, stderr: tokio::process::ChildStderr) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::debug!(target: "tower_agent_mcp::stderr", server = %server, "{line}");
    }
}
