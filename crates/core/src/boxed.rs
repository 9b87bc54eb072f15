//! The three services boxed: one name for a stack whatever layers it holds.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tower::util::{BoxCloneService, BoxCloneSyncService};
use tower::{Service, ServiceExt};

use crate::{
    AgentRequest, AgentResponse, BoxError, DescribeTools, Error, ModelRequest, ModelResponse,
    ToolRequest, ToolResponse, ToolSpec,
};

/// A model service with its layers, boxed.
pub type BoxModel = BoxCloneService<ModelRequest, ModelResponse, Error>;

/// An agent service with its layers, boxed. It is `Clone + Send`, so one value serves many
/// sessions at once.
pub type BoxAgent = BoxCloneService<AgentRequest, AgentResponse, Error>;

/// A service kept by a value that must be `Sync` (a layer, a workflow, an endpoint) without
/// asking it of the service: a model or an agent boxed by tower (`BoxCloneService`) is not
/// `Sync`. Clones share it; each use takes a clone of the service ([`get`](Self::get)), as
/// tower services are meant to be used.
///
/// ```
/// use tower::ServiceExt;
/// use tower_agent_core::{BoxModel, Error, ModelRequest, ModelResponse, Shared};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let model = tower::service_fn(|_: ModelRequest| async { Ok::<_, Error>(ModelResponse::text("hi")) });
/// let shared = Shared::new(BoxModel::new(model));
/// fn is_sync<T: Sync>(_: &T) {}
/// is_sync(&shared);
/// let answer = shared.get().oneshot(ModelRequest::new(vec![])).await?;
/// assert_eq!(answer.message.text(), "hi");
/// # Ok(())
/// # }
/// ```
pub struct Shared<S>(Arc<Mutex<S>>);

impl<S: Clone> Shared<S> {
    /// Share `service`.
    pub fn new(service: S) -> Self {
        Self(Arc::new(Mutex::new(service)))
    }

    /// A clone of the service, for one use.
    pub fn get(&self) -> S {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl<S> Clone for Shared<S> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<S> fmt::Debug for Shared<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// A tool service with its layers, boxed, that still says which tools it serves.
#[derive(Clone)]
pub struct BoxTools {
    inner: BoxCloneSyncService<ToolRequest, ToolResponse, Error>,
    specs: Arc<dyn Fn() -> Arc<[ToolSpec]> + Send + Sync>,
}

impl BoxTools {
    /// Box `tools`, keeping what it reports (asked again every time: a tool service may
    /// change what it serves).
    pub fn new<T>(tools: T) -> Self
    where
        T: Service<ToolRequest, Response = ToolResponse>
            + DescribeTools
            + Clone
            + Send
            + Sync
            + 'static,
        T::Error: Into<BoxError>,
        T::Future: Send + 'static,
    {
        let probe = tools.clone();
        Self {
            inner: BoxCloneSyncService::new(tools.map_err(into_error)),
            specs: Arc::new(move || probe.tool_specs()),
        }
    }

    /// Box a tool service that does not describe itself (one boxed by tower, say), with the
    /// specs it serves.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower::util::BoxCloneSyncService;
    /// use tower_agent_core::{BoxTools, DescribeTools, Error, ToolRequest, ToolResponse, ToolSpec};
    ///
    /// let service = tower::service_fn(|req: ToolRequest| async move {
    ///     Ok::<_, Error>(ToolResponse::success(&req.call, "12:00"))
    /// });
    /// let boxed = BoxCloneSyncService::new(service);
    /// let tools = BoxTools::with_specs(boxed, [ToolSpec::new("clock", "The time.", json!({}))]);
    /// assert_eq!(tools.tool_specs()[0].name, "clock");
    /// ```
    pub fn with_specs<T>(tools: T, specs: impl Into<Arc<[ToolSpec]>>) -> Self
    where
        T: Service<ToolRequest, Response = ToolResponse> + Clone + Send + Sync + 'static,
        T::Error: Into<BoxError>,
        T::Future: Send + 'static,
    {
        let specs: Arc<[ToolSpec]> = specs.into();
        Self {
            inner: BoxCloneSyncService::new(tools.map_err(into_error)),
            specs: Arc::new(move || specs.clone()),
        }
    }
}

impl fmt::Debug for BoxTools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = (self.specs)().iter().map(|s| s.name.clone()).collect();
        f.debug_struct("BoxTools").field("tools", &names).finish()
    }
}

impl DescribeTools for BoxTools {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        (self.specs)()
    }
}

impl Service<ToolRequest> for BoxTools {
    type Response = ToolResponse;
    type Error = Error;
    type Future =
        <BoxCloneSyncService<ToolRequest, ToolResponse, Error> as Service<ToolRequest>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: ToolRequest) -> Self::Future {
        self.inner.call(request)
    }
}

fn into_error(error: impl Into<BoxError>) -> Error {
    Error::from_boxed(error.into())
}
