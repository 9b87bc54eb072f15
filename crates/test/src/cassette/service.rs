//! The layers and services around a model and a tool service.

use std::sync::Arc;
use std::task::{Context, Poll};

use tower_agent_core::event::BoxFuture;
use tower_agent_core::{
    BoxError, DescribeTools, Error, ModelRequest, ModelResponse, ToolRequest, ToolResponse,
    ToolSpec,
};
use tower_layer::Layer;
use tower_service::Service;

use super::key::{Canonical, ToolCanonical, key_of, to_value};
use super::{Answer, Cassette, Line, Mode};

/// Records around, or replays instead of, a model service. See [`Cassette`].
#[derive(Debug, Clone)]
pub struct CassetteLayer {
    pub(super) cassette: Cassette,
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
    pub(super) cassette: Cassette,
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
