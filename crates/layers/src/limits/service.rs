//! The limits' service, on the model stack and on the tool stack.

use std::sync::Arc;
use std::task::{Context, Poll};

use tower_agent_core::{Error, ModelRequest, ModelResponse, ToolAction, ToolRequest, ToolResponse};
use tower_service::Service;

use super::count::Ask;
use super::future::ResponseFuture;
use super::{CallLimits, Exit};

/// Passes on the tools of the service inside it.
impl<S: tower_agent_core::DescribeTools> tower_agent_core::DescribeTools for CallLimits<S> {
    fn tool_specs(&self) -> std::sync::Arc<[tower_agent_core::ToolSpec]> {
        self.get_ref().tool_specs()
    }
}

impl<S> Service<ModelRequest> for CallLimits<S>
where
    S: Service<ModelRequest, Response = ModelResponse>,
    S::Error: From<Error>,
{
    type Response = ModelResponse;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ModelResponse, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ModelRequest) -> Self::Future {
        let config = &self.config;
        if let Some(scope) = &config.model {
            if let Err(blocked) = config.admit(&req.ctx, &[scope], Ask::Call(None)) {
                return match blocked.scope.limit.exit {
                    Exit::Error => ResponseFuture::ready(Err(blocked.error().into())),
                    _ => ResponseFuture::ready(Ok(ModelResponse::refuse(blocked.reason()))),
                };
            }
        }
        // The response is looked at when a model call was counted (a refusal further in gives
        // it back) or a tool limit fails the run (the calls asked for are checked).
        let check = (config.tool_errors || config.model.is_some())
            .then(|| (Arc::clone(config), req.ctx.clone()));
        ResponseFuture::inner(self.inner.call(req), check)
    }
}

impl<S> Service<ToolRequest> for CallLimits<S>
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: From<Error>,
{
    type Response = ToolResponse;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ToolResponse, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        // A call an earlier run started is recovered, not made again: it counted then.
        if req.recover {
            return ResponseFuture::tool(self.inner.call(req), None);
        }
        // A call that waited was given back when it paused: it counts now, as it runs (a
        // resume is a first execution for the limits).
        let config = &self.config;
        // An early call is given back if the loop discards it.
        let ask = || {
            Ask::Call(
                req.early
                    .as_ref()
                    .map(|early| (req.call.id.as_str(), early)),
            )
        };
        let admitted = match config.tool_scopes(&req.call.name) {
            [None, None] => Ok(()),
            [Some(one), None] | [None, Some(one)] => config.admit(&req.ctx, &[one], ask()),
            [Some(global), Some(own)] => config.admit(&req.ctx, &[global, own], ask()),
        };
        {
            if let Err(blocked) = admitted {
                let mut response = ToolResponse::error(&req.call, blocked.message());
                if blocked.scope.limit.exit != Exit::Continue {
                    response.action = ToolAction::Stop(blocked.reason());
                }
                return ResponseFuture::ready(Ok(response));
            }
        }
        // A call that pauses (a human's decision, a checkpoint) gives back what it counted:
        // it did not run, and counts when it resumes. A call started early is given back
        // once: when it pauses or when the loop discards it.
        let counted = config
            .tool_scopes(&req.call.name)
            .iter()
            .any(Option::is_some);
        let pauses = counted.then(|| {
            let early = match req.early {
                Some(_) => req.call.id.clone(),
                None => String::new(),
            };
            (
                Arc::clone(config),
                req.ctx.clone(),
                (req.call.name.clone(), early),
            )
        });
        ResponseFuture::tool(self.inner.call(req), pauses)
    }
}
