//! The cache service: look up, run once, keep.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_agent_core::event::BoxFuture;
use tower_agent_core::{
    DescribeTools, Error, ToolAction, ToolRequest, ToolResponse, ToolSpec, Usage,
};
use tower_service::Service;

use super::{Config, Key, Kind, ToolCacheLayer, canonical};

/// Answers calls of read-only tools from the results it keeps; see the
/// [module docs](super).
///
/// `poll_ready` is the inner service's; the ready service goes into the call's future (a
/// clone stays for the next call), which calls it at most once, and not at all on a hit.
#[derive(Clone)]
pub struct ToolCache<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> ToolCache<S> {
    /// Wrap `inner` with the cache of `layer` (shared with the layer's other services).
    pub fn new(inner: S, layer: &ToolCacheLayer) -> Self {
        tower_layer::Layer::layer(layer, inner)
    }

    pub(super) fn from_config(inner: S, config: Arc<Config>) -> Self {
        Self { inner, config }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for ToolCache<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolCache")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// Passes on the tools of the service inside it.
impl<S: DescribeTools> DescribeTools for ToolCache<S> {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        self.inner.tool_specs()
    }
}

impl<S> Service<ToolRequest> for ToolCache<S>
where
    S: Service<ToolRequest, Response = ToolResponse, Error = Error>
        + DescribeTools
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = ToolResponse;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        // Asked per call: a tool service may change its tools (an MCP server's list).
        let read_only = self
            .inner
            .tool_specs()
            .iter()
            .any(|spec| spec.read_only && spec.name == req.call.name);
        let kind = match req.resume {
            Some(_) => Kind::Other,
            None => self.config.kind(&req.call.name, read_only),
        };
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        ResponseFuture {
            inner: match kind {
                Kind::Cached => Box::pin(cached(config, inner, req)),
                Kind::Writes => Box::pin(writes(config, inner, req)),
                Kind::Other => Box::pin(inner.call(req)),
            },
        }
    }
}

/// The response future of [`ToolCache`].
pub struct ResponseFuture {
    inner: BoxFuture<'static, Result<ToolResponse, Error>>,
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<ToolResponse, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

/// Why a call's response was not kept; the calls that waited for it get it too.
enum NotKept {
    Response(ToolResponse),
    Failed(Error),
}

/// Answer from the cache, or run the call once for every identical call waiting, and keep
/// what it returned when it may be kept.
async fn cached<S>(
    config: Arc<Config>,
    mut inner: S,
    req: ToolRequest,
) -> Result<ToolResponse, Error>
where
    S: Service<ToolRequest, Response = ToolResponse, Error = Error>,
{
    let Some(arguments) = canonical(&req.call.arguments) else {
        return inner.call(req).await;
    };
    let scope = config.scope(&req.ctx);
    let epoch = config.epoch(&scope);
    let key = Key {
        scope: Arc::clone(&scope),
        epoch,
        tool: req.call.name.clone(),
        arguments,
    };
    let call_id = req.call.id.clone();
    // Set when this call is the one that runs the tool: its usage is its own.
    let mut ran: Option<Usage> = None;
    let run = async {
        let response = inner.call(req).await;
        let mut response = match response {
            Ok(response) => response,
            Err(error) => return Err(NotKept::Failed(error)),
        };
        ran = Some(std::mem::take(&mut response.usage));
        let keep = !response.result.is_error
            && response.action == ToolAction::Continue
            // A write that overlapped the call: what it read may be stale.
            && config.epoch(&scope) == epoch;
        if keep {
            Ok(Arc::new(response))
        } else {
            Err(NotKept::Response(response))
        }
    };
    let outcome = config.values.entry(key).or_try_insert_with(run).await;
    let mut response = match outcome {
        Ok(entry) => ToolResponse::clone(&entry.into_value()),
        Err(not_kept) => match &*not_kept {
            NotKept::Response(response) => response.clone(),
            NotKept::Failed(error) => return Err(error.clone()),
        },
    };
    response.result.call_id = call_id;
    match ran {
        Some(usage) => response.usage = usage,
        None => tracing::debug!(tool = %response.result.name, "tool result from the cache"),
    }
    Ok(response)
}

/// Run a call that may write, dropping its scope's entries before it and after it (even when
/// it is dropped midway: part of the write may have happened).
async fn writes<S>(
    config: Arc<Config>,
    mut inner: S,
    req: ToolRequest,
) -> Result<ToolResponse, Error>
where
    S: Service<ToolRequest, Response = ToolResponse, Error = Error>,
{
    let scope = config.scope(&req.ctx);
    config.invalidate(&scope);
    let _after = InvalidateOnDrop { config, scope };
    inner.call(req).await
}

struct InvalidateOnDrop {
    config: Arc<Config>,
    scope: Arc<str>,
}

impl Drop for InvalidateOnDrop {
    fn drop(&mut self) {
        self.config.invalidate(&self.scope);
    }
}
