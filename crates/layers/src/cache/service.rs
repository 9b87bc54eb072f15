//! The cache service: look up, run once, keep.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::Either;
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

    tower_agent_core::inner_service_accessors!();
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
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        // Asked per call: a tool service may change its tools (an MCP server's list).
        let spec = self
            .inner
            .tool_specs()
            .iter()
            .find(|spec| spec.name == req.call.name)
            .map(|spec| spec.read_only);
        let kind = match (self.config.kind(&req.call.name, spec), &req.resume) {
            // A resumed call carries the value the run resumed with: it is run, never
            // answered from the cache; a write still drops what its scope read.
            (Kind::Cached, Some(_)) => Kind::Other,
            (kind, _) => kind,
        };
        let scope = match kind {
            Kind::Other => None,
            Kind::Cached | Kind::Writes => self.config.scope(&req.ctx),
        };
        // Passed through: the inner service's own future, nothing cloned or boxed.
        let Some(scope) = scope else {
            return Either::Left(self.inner.call(req));
        };
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        Either::Right(match kind {
            Kind::Cached => Box::pin(cached(config, inner, req, scope)),
            _ => Box::pin(writes(config, inner, req, scope)),
        })
    }
}

/// The response future of [`ToolCache`]: the inner service's for a call passed through, a
/// boxed one for a call the cache answers, runs once or counts as a write.
pub type ResponseFuture<F> = Either<F, BoxFuture<'static, Result<ToolResponse, Error>>>;

/// Why a call's response was not kept.
enum NotKept {
    /// An error result: the calls that waited for it get it too.
    Shared(Box<ToolResponse>),
    /// A stop, a pause or an `Err`: the call's own; a waiting call runs its own request.
    Own,
}

/// Answer from the cache, or run the call once for every identical call waiting, and keep
/// what it returned when it may be kept.
async fn cached<S>(
    config: Arc<Config>,
    mut inner: S,
    req: ToolRequest,
    scope: Arc<str>,
) -> Result<ToolResponse, Error>
where
    S: Service<ToolRequest, Response = ToolResponse, Error = Error>,
{
    let Some(arguments) = canonical(&req.call.arguments) else {
        return inner.call(req).await;
    };
    let epoch = config.epoch(&scope);
    let key = Key {
        scope: Arc::clone(&scope),
        epoch,
        // A sub-agent's calls are kept apart from its parent's: a read-only sub-agent that
        // calls its own tool with the same arguments would otherwise wait for itself.
        path: req.ctx.path(),
        tool: req.call.name.clone(),
        arguments,
    };
    let call_id = req.call.id.clone();
    // Taken by the call that runs the tool; still here for a call that waited for another.
    let mut waiting = Some(req);
    // The running call's own response when it is not kept.
    let mut own: Option<Result<ToolResponse, Error>> = None;
    let run = async {
        let Some(req) = waiting.take() else {
            return Err(NotKept::Own);
        };
        let mut response = match inner.call(req).await {
            Ok(response) => response,
            Err(error) => {
                own = Some(Err(error));
                return Err(NotKept::Own);
            }
        };
        let keep = !response.result.is_error
            && response.action == ToolAction::Continue
            // A write that overlapped the call: what it read may be stale.
            && config.epoch(&scope) == epoch;
        if keep {
            let usage = std::mem::take(&mut response.usage);
            let kept = Arc::new(response.clone());
            response.usage = usage;
            own = Some(Ok(response));
            Ok(kept)
        } else if response.action == ToolAction::Continue {
            let shared = ToolResponse {
                usage: Usage::default(),
                ..response.clone()
            };
            own = Some(Ok(response));
            Err(NotKept::Shared(Box::new(shared)))
        } else {
            own = Some(Ok(response));
            Err(NotKept::Own)
        }
    };
    // When the running call is dropped, moka runs a waiting call's `run` instead; a waiting
    // call that sees 200 running calls dropped in a row panics (moka's bound), which the
    // agent's tool call turns into an error result like any tool panic.
    let outcome = config.values.entry(key).or_try_insert_with(run).await;
    if let Some(own) = own {
        return own;
    }
    let mut response = match outcome {
        Ok(entry) => ToolResponse::clone(&entry.into_value()),
        Err(not_kept) => match (&*not_kept, waiting.take()) {
            (NotKept::Shared(response), _) => ToolResponse::clone(response),
            // What the running call got was its own (a pause, a stop, a failure, its run
            // cancelled): this call runs its own request.
            (NotKept::Own, Some(req)) => return inner.call(req).await,
            (NotKept::Own, None) => {
                return Err(Error::other("tool cache: a call neither ran nor waited"));
            }
        },
    };
    tracing::debug!(tool = %response.result.name, "tool result from the cache");
    response.result.call_id = call_id;
    Ok(response)
}

/// Run a call that may write, dropping its scope's entries before it and after it (even when
/// it is dropped midway: part of the write may have happened).
async fn writes<S>(
    config: Arc<Config>,
    mut inner: S,
    req: ToolRequest,
    scope: Arc<str>,
) -> Result<ToolResponse, Error>
where
    S: Service<ToolRequest, Response = ToolResponse, Error = Error>,
{
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
