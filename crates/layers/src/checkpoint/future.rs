//! The checkpoint's response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_agent_core::ToolResponse;

use super::budget::{Budget, record};

type BoxFuture<E> = Pin<Box<dyn Future<Output = Result<ToolResponse, E>> + Send>>;

pin_project! {
    /// The response future of [`Checkpoint`]: the inner future (its result recorded
    /// for the next question), a ready answer, or a boxed wait for the checkpoint (inline
    /// mode, once per budget).
    pub struct ResponseFuture<F, E> {
        #[pin]
        kind: Kind<F, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, E> {
        Tracked { #[pin] future: F, budget: Budget },
        Ready { response: Option<ToolResponse> },
        Boxed { future: BoxFuture<E> },
    }
}

impl<F, E> ResponseFuture<F, E> {
    pub(super) fn tracked(future: F, budget: Budget) -> Self {
        Self {
            kind: Kind::Tracked { future, budget },
        }
    }

    pub(super) fn ready(response: ToolResponse) -> Self {
        Self {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }

    pub(super) fn boxed(
        future: impl Future<Output = Result<ToolResponse, E>> + Send + 'static,
    ) -> Self {
        Self {
            kind: Kind::Boxed {
                future: Box::pin(future),
            },
        }
    }
}

impl<F, E> fmt::Debug for ResponseFuture<F, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, E> Future for ResponseFuture<F, E>
where
    F: Future<Output = Result<ToolResponse, E>>,
{
    type Output = Result<ToolResponse, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Tracked { future, budget } => match future.poll(cx) {
                Poll::Ready(Ok(response)) => {
                    record(budget, &response.result.name, &response);
                    Poll::Ready(Ok(response))
                }
                other => other,
            },
            KindProj::Ready { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => panic!("ResponseFuture polled after completion"),
            },
            KindProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}
