//! The checkpoint's service: count, ask, stop.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use serde::Deserialize;
use serde_json::Value;
use tower_agent_core::{Decision, DecisionKind, StopReason, ToolAction, ToolRequest, ToolResponse};
use tower_service::Service;

use super::allowance::{Allowance, add_waiting, not_executed, take_waiting};
use super::future::ResponseFuture;
use super::{Checkpoint, CheckpointRequest, Mode};
use crate::ask::{self, Answer, Decided};

/// What a checkpoint call's future is inside.
type Asked<S> = ask::ResponseFuture<
    <S as Service<ToolRequest>>::Future,
    <S as Service<ToolRequest>>::Error,
    Allowance,
>;

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

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        ResponseFuture::new(self.decide(req))
    }
}

impl<S> Checkpoint<S>
where
    S: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    fn decide(&mut self, mut req: ToolRequest) -> Asked<S> {
        let every = self.config.every;
        let allowance = Allowance::of(&req.ctx, &self.config.allowance);
        // A call an earlier run started is recovered, not made again: it counted then.
        if req.recover {
            return ask::ResponseFuture::inner(self.inner.call(req), allowance);
        }
        if req.resume.is_some() {
            if !take_waiting(&req.ctx, &req.call.id) {
                // Another layer's interrupt: counted when it first came through.
                return ask::ResponseFuture::inner(self.inner.call(req), allowance);
            }
            let value = req.resume.take().unwrap_or(Value::Null);
            return match Decision::deserialize(&value) {
                Ok(Decision::Approve) => {
                    allowance.renew();
                    ask::ResponseFuture::inner(self.inner.call(req), allowance)
                }
                _ => ask::ResponseFuture::ready(stopped(&req, every, "declined".to_owned())),
            };
        }
        // Taken with the allowance's generation read under its lock: a fresh allowance given at the
        // same time is never the one an early call gives back to.
        let taken = {
            let counts = allowance.counts();
            allowance.take(every).then_some(counts.generation)
        };
        if let Some(generation) = taken {
            // An early call the loop discards counts against nothing.
            if let Some(early) = &req.early {
                let taken = allowance.clone();
                early.on_discard(move || taken.give_back(generation));
            }
            return ask::ResponseFuture::inner(self.inner.call(req), allowance);
        }
        let question = CheckpointRequest {
            calls: allowance.0.calls.load(Ordering::Acquire),
            progress: allowance.counts().progress.clone(),
            next: req.call.name.clone(),
        };
        match &self.config.mode {
            Mode::Interrupt => {
                add_waiting(&req.ctx, &req.call.id);
                if let Some(early) = &req.early {
                    let (ctx, id) = (req.ctx.clone(), req.call.id.clone());
                    early.on_discard(move || {
                        take_waiting(&ctx, &id);
                    });
                }
                let payload = serde_json::json!({
                    "checkpoint": question,
                    "question": format!(
                        "The agent made {} tool calls ({}). Go on?",
                        question.calls, question.progress
                    ),
                });
                ask::ResponseFuture::ready(ToolResponse::review(
                    &req.call,
                    payload,
                    [DecisionKind::Approve, DecisionKind::Reject],
                ))
            }
            Mode::Inline(checkpoint) => {
                let checkpoint = Arc::clone(checkpoint);
                let timeout = self.config.timeout;
                let generation = allowance.counts().generation;
                ask::inline(&mut self.inner, async move {
                    // One question per run at a time; the timeout starts once it is asked.
                    let asking = allowance.0.asking.lock().await;
                    if allowance.counts().stopped {
                        // Another call of the round was told to stop.
                        return Decided::Answer(ToolResponse::error(
                            &req.call,
                            not_executed(every),
                        ));
                    }
                    // Another call of the round got a fresh allowance while this one waited.
                    let renewed =
                        allowance.counts().generation != generation && allowance.take(every);
                    if !renewed {
                        let asked = checkpoint.ask(question, req.ctx.clone());
                        let reason = match ask::within(asked, timeout).await {
                            Answer::Given(true) => None,
                            Answer::Given(false) => Some("declined".to_owned()),
                            Answer::Failed(error) => {
                                Some(format!("the checkpoint failed: {error}"))
                            }
                            Answer::Late(waited) => Some(format!(
                                "no answer within {} s",
                                waited.as_secs_f64().round()
                            )),
                        };
                        if let Some(reason) = reason {
                            allowance.counts().stopped = true;
                            return Decided::Answer(stopped(&req, every, reason));
                        }
                        allowance.renew();
                    }
                    drop(asking);
                    Decided::Run(req, allowance)
                })
            }
        }
    }
}

/// The answer to a call the checkpoint did not let run: the run stops.
fn stopped(req: &ToolRequest, every: u32, reason: String) -> ToolResponse {
    let reason = StopReason::Checkpoint {
        calls: every,
        reason,
    };
    ToolResponse::error(&req.call, not_executed(every)).with_action(ToolAction::Stop(reason))
}
