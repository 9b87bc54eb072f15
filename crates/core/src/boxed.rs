//! The three services boxed: one name for a stack whatever layers it holds.

use std::fmt;
use std::sync::Arc;
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
