//! The checkpoint's service: count, ask, stop.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use serde::Deserialize;
use serde_json::Value;
use tower_agent_core::{Decision, DecisionKind, StopReason, ToolAction, ToolRequest, ToolResponse};
use tower_service::Service;

use super::budget::{Budget, add_waiting, not_executed, record, take_waiting};
use super::future::ResponseFuture;
use super::{Checkpoint, CheckpointRequest, Mode};

/// Passes on the tools of the service inside it.
impl<S: tower_agent_core::DescribeTools> tower_agent_core::DescribeTools for Checkpoint<S> {
    fn tool_specs(&self) -> std::sync::Arc<[tower_agent_core::ToolSpec]> {
        self.get_ref().tool_specs()
    }
}

impl<S> Service<ToolRequest> for Checkpoint<S>
where
    S: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = ToolResponse;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: ToolRequest) -> Self::Future {
        let every = self.config.every;
        let budget = Budget::of(&req.ctx);
        if req.resume.is_some() {
            if !take_waiting(&req.ctx, &req.call.id) {
                // Another layer's interrupt: counted when it first came through.
                return ResponseFuture::tracked(self.inner.call(req), budget);
            }
            let value = req.resume.take().unwrap_or(Value::Null);
            return match Decision::deserialize(&value) {
                Ok(Decision::Approve) => {
                    budget.renew();
                    ResponseFuture::tracked(self.inner.call(req), budget)
                }
                _ => stop(&req, every, "declined"),
            };
        }
        if budget.take(every) {
            return ResponseFuture::tracked(self.inner.call(req), budget);
        }
        let question = CheckpointRequest {
            calls: budget.0.calls.load(Ordering::Acquire),
            progress: budget.counts().progress.clone(),
            next: req.call.name.clone(),
        };
        match &self.config.mode {
            Mode::Interrupt => {
                add_waiting(&req.ctx, &req.call.id);
                let payload = serde_json::json!({
                    "checkpoint": question,
                    "question": format!(
                        "The agent made {} tool calls ({}). Go on?",
                        question.calls, question.progress
                    ),
                });
                ResponseFuture::ready(ToolResponse::review(
                    &req.call,
                    payload,
                    [DecisionKind::Approve, DecisionKind::Reject],
                ))
            }
            Mode::Inline(checkpoint) => {
                let checkpoint = Arc::clone(checkpoint);
                let timeout = self.config.timeout;
                let generation = budget.counts().generation;
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::boxed(async move {
                    let asking = budget.0.asking.lock().await;
                    if budget.counts().stopped {
                        // Another call of the round was told to stop.
                        return Ok(ToolResponse::error(&req.call, not_executed(every)));
                    }
                    // Another call of the round got a fresh budget while this one waited.
                    let renewed = budget.counts().generation != generation && budget.take(every);
                    if !renewed {
                        let asked = checkpoint.ask(question, req.ctx.clone());
                        let reason = match tokio::time::timeout(timeout, asked).await {
                            Ok(Ok(true)) => None,
                            Ok(Ok(false)) => Some("declined".to_owned()),
                            Ok(Err(error)) => Some(format!("the checkpoint failed: {error}")),
                            Err(_) => Some(format!(
                                "no answer within {} s",
                                timeout.as_secs_f64().round()
                            )),
                        };
                        if let Some(reason) = reason {
                            budget.counts().stopped = true;
                            return Ok(stopped(&req, every, reason));
                        }
                        budget.renew();
                    }
                    drop(asking);
                    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                    let response = inner.call(req).await?;
                    record(&budget, &response.result.name, &response);
                    Ok(response)
                })
            }
        }
    }
}

fn stop<F, E>(req: &ToolRequest, every: u32, reason: &str) -> ResponseFuture<F, E> {
    ResponseFuture::ready(stopped(req, every, reason.to_owned()))
}

/// The answer to a call the checkpoint did not let run: the run stops.
fn stopped(req: &ToolRequest, every: u32, reason: String) -> ToolResponse {
    let reason = StopReason::Checkpoint {
        calls: every,
        reason,
    };
    ToolResponse::error(&req.call, not_executed(every)).with_action(ToolAction::Stop(reason))
}
