//! The limits' response future: the model side checks the calls a message asks for; the tool
//! side gives back a call that pauses.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_agent_core::{Error, ModelResponse, RunContext, ToolResponse};

use super::count::{Config, check_calls};

use sealed::Check;

pin_project! {
    /// The response future of [`CallLimits`]: the inner future, or a blocked call's answer.
    pub struct ResponseFuture<F, T, E> {
        #[pin]
        kind: Kind<F, T, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, T, E> {
        Inner { #[pin] future: F, check: Check },
        Ready { answer: Option<Result<T, E>> },
    }
}

impl<F, T, E> ResponseFuture<F, T, E> {
    pub(super) fn inner(future: F, check: Option<(Arc<Config>, RunContext)>) -> Self {
        Self {
            kind: Kind::Inner {
                future,
                check: Check(check.map(|(config, ctx)| (config, ctx, None))),
            },
        }
    }

    /// A tool call's future: `pauses` says how to give back what the call counted if it
    /// pauses (the config, the run, the tool's name and the call's id if it started early).
    pub(super) fn tool(
        future: F,
        pauses: Option<(Arc<Config>, RunContext, (String, String))>,
    ) -> Self {
        Self {
            kind: Kind::Inner {
                future,
                check: Check(pauses.map(|(config, ctx, (tool, early))| {
                    (config, ctx, Some(sealed::Counted { tool, early }))
                })),
            },
        }
    }

    pub(super) fn ready(answer: Result<T, E>) -> Self {
        Self {
            kind: Kind::Ready {
                answer: Some(answer),
            },
        }
    }
}

impl<F, T, E> fmt::Debug for ResponseFuture<F, T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

mod sealed {
    use std::sync::Arc;

    use super::{Config, Error, RunContext};

    /// What the model side needs to look at a response (set when it counted a model call or
    /// a tool limit fails the run), and the tool side (set when it counted a tool call: the
    /// tool's name, and the call's id if it started early).
    #[derive(Debug)]
    pub struct Check(pub(super) Option<(Arc<Config>, RunContext, Option<Counted>)>);

    /// A tool call counted: its tool's name, and its id if it started early.
    #[derive(Debug)]
    pub(super) struct Counted {
        pub(super) tool: String,
        pub(super) early: String,
    }

    /// What the model side checks in a response; nothing for a tool response.
    pub trait Checked {
        fn check(&self, check: &Check) -> Result<(), Error>;
    }
}

use sealed::Checked;

impl Checked for ModelResponse {
    fn check(&self, check: &Check) -> Result<(), Error> {
        let Some((config, ctx, _)) = &check.0 else {
            return Ok(());
        };
        // Refused further in (a budget, a guardrail inside): it counts against nothing, and
        // asks for no call.
        if self.refused {
            config.give_back_model_call(ctx);
            return Ok(());
        }
        match config.tool_errors {
            true => check_calls(config, ctx, self),
            false => Ok(()),
        }
    }
}

impl Checked for ToolResponse {
    fn check(&self, check: &Check) -> Result<(), Error> {
        // A call that pauses did not run: it counts when it resumes.
        if let Some((config, ctx, Some(call))) = &check.0 {
            if self.is_interrupt() {
                config.give_back_tool_call(ctx, &call.tool, &call.early);
            }
        }
        Ok(())
    }
}

impl<F, T, E> Future for ResponseFuture<F, T, E>
where
    F: Future<Output = Result<T, E>>,
    T: Checked,
    E: From<Error>,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future, check } => match future.poll(cx) {
                Poll::Ready(Ok(response)) => Poll::Ready(match response.check(check) {
                    Ok(()) => Ok(response),
                    Err(error) => Err(error.into()),
                }),
                other => other,
            },
            KindProj::Ready { answer } => match answer.take() {
                Some(answer) => Poll::Ready(answer),
                None => panic!("ResponseFuture polled after completion"),
            },
        }
    }
}
