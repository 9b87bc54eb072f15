//! A tool service that routes calls by tool name.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::ServiceExt;
use tower::util::BoxCloneSyncService;
use tower_agent_core::{BoxError, DescribeTools, Error, ToolRequest, ToolResponse, ToolSpec};
use tower_layer::Layer;
use tower_service::Service;

use crate::recover::recovered;
use crate::{Reconcile, ResponseFuture, Tool};

type ToolService = BoxCloneSyncService<ToolRequest, ToolResponse, Error>;

/// Routes each call to the tool of that name and exposes the tools' specs.
///
/// A call to an unknown tool gets an error result naming the tools that exist, so the model
/// can correct itself. Each call clones the tool's service and drives it to readiness before
/// calling it, so per-tool middleware (a concurrency limit, say) applies backpressure to
/// that tool only. Errors of a tool's service pass through as `Err` (the agent turns them
/// into error results).
///
/// A call an earlier run started and did not finish ([`ToolRequest::recover`]) is not run
/// again unless its tool may repeat ([`ToolSpec::may_repeat`]): its tool's reconcile step
/// ([`Tool::reconcile`]) says what became of it, and a tool without one (any service added
/// with [`ToolSet::service`]) answers [`Recovery::Unknown`](tower_agent_core::Recovery::Unknown).
#[derive(Clone, Default)]
pub struct ToolSet {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    services: HashMap<String, ToolService>,
    /// The reconcile steps of the tools that have one.
    reconcile: HashMap<String, Reconcile>,
    /// Shared with every model request: rebuilt when a tool is added, never per call.
    specs: Arc<[ToolSpec]>,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            services: HashMap::new(),
            reconcile: HashMap::new(),
            specs: Arc::from(Vec::new()),
        }
    }
}

impl ToolSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a tool.
    ///
    /// # Panics
    ///
    /// If a tool of the same name is already in the set (a programming error, found at
    /// start-up, like a conflicting route in axum).
    pub fn tool<T: Tool>(self, tool: T) -> Self {
        let (spec, reconcile) = (tool.spec(), tool.reconcile());
        self.service(spec, tool).with_reconcile(reconcile)
    }

    /// Keep the reconcile step of the tool added last.
    fn with_reconcile(mut self, reconcile: Option<Reconcile>) -> Self {
        let inner = Arc::make_mut(&mut self.inner);
        if let (Some(reconcile), Some(spec)) = (reconcile, inner.specs.last()) {
            inner.reconcile.insert(spec.name.clone(), reconcile);
        }
        self
    }

    /// Add a tool wrapped in `layer` (a timeout, a concurrency limit...).
    ///
    /// # Panics
    ///
    /// As [`ToolSet::tool`].
    pub fn tool_with_layer<T, L>(self, tool: T, layer: L) -> Self
    where
        T: Tool,
        L: Layer<T>,
        L::Service: Service<ToolRequest, Response = ToolResponse> + Clone + Send + Sync + 'static,
        <L::Service as Service<ToolRequest>>::Error: Into<BoxError>,
        <L::Service as Service<ToolRequest>>::Future: Send + 'static,
    {
        let (spec, reconcile) = (tool.spec(), tool.reconcile());
        self.service(spec, layer.layer(tool))
            .with_reconcile(reconcile)
    }

    /// Add any tool service under `spec`.
    ///
    /// # Panics
    ///
    /// As [`ToolSet::tool`].
    pub fn service<S>(mut self, spec: ToolSpec, service: S) -> Self
    where
        S: Service<ToolRequest, Response = ToolResponse> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        let inner = Arc::make_mut(&mut self.inner);
        assert!(
            !inner.services.contains_key(&spec.name),
            "ToolSet: a tool named `{}` is already registered",
            spec.name
        );
        let service = service.map_err(|error: S::Error| Error::from_boxed(error.into()));
        inner
            .services
            .insert(spec.name.clone(), BoxCloneSyncService::new(service));
        let mut specs = inner.specs.to_vec();
        specs.push(spec);
        inner.specs = specs.into();
        self
    }

    /// The specs, in the order the tools were added.
    pub fn specs(&self) -> &[ToolSpec] {
        &self.inner.specs
    }

    /// The number of tools.
    pub fn len(&self) -> usize {
        self.inner.specs.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.specs.is_empty()
    }
}

impl DescribeTools for ToolSet {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        Arc::clone(&self.inner.specs)
    }
}

impl fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.inner.specs.iter().map(|s| &s.name))
            .finish()
    }
}

impl Service<ToolRequest> for ToolSet {
    type Response = ToolResponse;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        // Which tool is called is known only in `call`: readiness is checked there, on a
        // clone of that tool's service.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        if req.recover {
            let name = req.call.name.as_str();
            let spec = self.inner.specs.iter().find(|spec| spec.name == name);
            if let Some(answer) = recovered(spec, self.inner.reconcile.get(name), &req) {
                return answer;
            }
        }
        match self.inner.services.get(&req.call.name) {
            Some(service) => ResponseFuture::new(service.clone().oneshot(req)),
            None => {
                let response = ToolResponse::unknown_tool(&req.call, &self.inner.specs);
                ResponseFuture::new(std::future::ready(Ok(response)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NoArgs, tool_fn};
    use serde_json::json;
    use std::time::Duration;
    use tower_agent_core::{ErrorKind, RunContext, ToolCall};

    fn call(name: &str) -> ToolRequest {
        ToolRequest::new(ToolCall::new("c", name, json!({})), RunContext::new())
    }

    #[tokio::test]
    async fn routes_by_name_and_names_the_alternatives() {
        let set = ToolSet::new()
            .tool(tool_fn("a", "A.", |_: NoArgs| async {
                Ok::<_, Error>("from a")
            }))
            .tool(tool_fn("b", "B.", |_: NoArgs| async {
                Ok::<_, Error>("from b")
            }));
        assert_eq!(set.len(), 2);
        let names: Vec<_> = set.specs().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            set.clone().oneshot(call("b")).await.unwrap().result.content,
            "from b"
        );
        let res = set.oneshot(call("c")).await.unwrap();
        assert!(res.result.is_error);
        assert_eq!(
            res.result.content,
            "unknown tool `c`. Available tools: a, b"
        );
    }

    #[tokio::test]
    #[should_panic(expected = "a tool named `a` is already registered")]
    async fn duplicate_names_are_refused() {
        let t = tool_fn("a", "A.", |_: NoArgs| async { Ok::<_, Error>("") });
        let _ = ToolSet::new().tool(t.clone()).tool(t);
    }

    #[tokio::test(start_paused = true)]
    async fn per_tool_middleware_errors_are_typed() {
        let slow = tool_fn("slow", "Slow.", |_: NoArgs| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, Error>("late")
        });
        let set = ToolSet::new().tool_with_layer(
            slow,
            tower::timeout::TimeoutLayer::new(Duration::from_secs(1)),
        );
        let err = set.oneshot(call("slow")).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout);
    }
}
