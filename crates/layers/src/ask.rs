//! Asking a human, what the approval and checkpoint layers share: the one trait a host
//! implements to answer inline ([`Human`], or [`human_fn`] from a closure), the question asked
//! within a timeout that fails closed ([`within`], [`inline`]), and the one response future
//! both layers return ([`ResponseFuture`]): the inner call then a hook, an answer known now
//! (the interrupt that pauses the run, a decision it resumed with), or the inline question.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tower_agent_core::{BoxError, RunContext, ToolRequest, ToolResponse};
use tower_service::Service;

/// The default time a human has to answer inline: 15 minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// A human asked while the run waits (inline), whatever the question: the approval layer asks
/// for a `Decision` on a gated call (`approval::ReviewRequest` to `Decision`), the checkpoint
/// whether to go on (`checkpoint::CheckpointRequest` to `bool`). An error, or no answer within
/// the layer's timeout, fails closed: the call is rejected, the run stopped.
///
/// Implement it for a type, or make one from an async closure with [`human_fn`].
pub trait Human<Q, A>: Send + Sync + 'static {
    /// Ask `question` about the run of `ctx`.
    fn ask(
        &self,
        question: Q,
        ctx: RunContext,
    ) -> Pin<Box<dyn Future<Output = Result<A, BoxError>> + Send + 'static>>;
}

/// A [`Human`] from an async closure of the question and the run's context. Name the
/// question's type in the closure: it says which question the closure answers.
///
/// ```
/// use tower_agent_core::{Decision, RunContext};
/// use tower_agent_layers::human_fn;
/// # #[cfg(feature = "approval")]
/// use tower_agent_layers::approval::{ApprovalLayer, Gate, ReviewRequest};
///
/// # #[cfg(feature = "approval")]
/// # {
/// let human = human_fn(|review: ReviewRequest, _ctx: RunContext| async move {
///     if review.arguments["cmd"].as_str().is_some_and(|c| c.starts_with("ls")) {
///         Ok(Decision::Approve)
///     } else {
///         Ok(Decision::reject("only listing is allowed"))
///     }
/// });
/// let approval = ApprovalLayer::builder().gate("shell", Gate::new()).inline(human).build();
/// # let _ = approval;
/// # }
/// ```
pub fn human_fn<Q, A, F, Fut>(f: F) -> HumanFn<F>
where
    F: Fn(Q, RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<A, BoxError>> + Send + 'static,
{
    HumanFn { f }
}

/// The [`Human`] [`human_fn`] makes.
#[derive(Clone)]
pub struct HumanFn<F> {
    f: F,
}

impl<F> fmt::Debug for HumanFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HumanFn").finish_non_exhaustive()
    }
}

impl<Q, A, F, Fut> Human<Q, A> for HumanFn<F>
where
    F: Fn(Q, RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<A, BoxError>> + Send + 'static,
{
    fn ask(
        &self,
        question: Q,
        ctx: RunContext,
    ) -> Pin<Box<dyn Future<Output = Result<A, BoxError>> + Send + 'static>> {
        Box::pin((self.f)(question, ctx))
    }
}

/// How asking inline ended.
#[derive(Debug)]
pub(crate) enum Answer<T> {
    /// The answer, in time.
    Given(T),
    /// Asking failed.
    Failed(BoxError),
    /// No answer within this time.
    Late(Duration),
}

/// Wait for `asked` at most `timeout`. The clock starts at the first poll.
pub(crate) async fn within<T>(
    asked: impl Future<Output = Result<T, BoxError>>,
    timeout: Duration,
) -> Answer<T> {
    match tokio::time::timeout(timeout, asked).await {
        Ok(Ok(answer)) => Answer::Given(answer),
        Ok(Err(error)) => Answer::Failed(error),
        Err(_) => Answer::Late(timeout),
    }
}

/// What runs on the response of a call the layer let through.
pub(crate) trait After {
    /// The response the caller sees.
    fn after(self, response: ToolResponse) -> ToolResponse;
}

/// No hook, or one.
impl<A: After> After for Option<A> {
    fn after(self, response: ToolResponse) -> ToolResponse {
        match self {
            Some(after) => after.after(response),
            None => response,
        }
    }
}

/// What the human's answer comes to.
pub(crate) enum Decided<H> {
    /// The call's response, without running it.
    Answer(ToolResponse),
    /// Run this request, then `H`.
    Run(ToolRequest, H),
}

/// Ask inline: the ready inner service goes with the future and a clone takes its place
/// (tower's "be careful when cloning inner services"). Once `decided`, the call is answered,
/// or waits for the inner service, runs and goes through the hook.
pub(crate) fn inline<S, H>(
    inner: &mut S,
    decided: impl Future<Output = Decided<H>> + Send + 'static,
) -> ResponseFuture<S::Future, S::Error, H>
where
    S: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    H: After + Send + 'static,
{
    let clone = inner.clone();
    let mut inner = std::mem::replace(inner, clone);
    ResponseFuture::boxed(async move {
        match decided.await {
            Decided::Answer(response) => Ok(response),
            Decided::Run(req, after) => {
                std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                let response = inner.call(req).await?;
                Ok(after.after(response))
            }
        }
    })
}

type BoxFuture<E> = Pin<Box<dyn Future<Output = Result<ToolResponse, E>> + Send>>;

pin_project! {
    /// The inner service's future then the hook `H`, an answer known now, or an inline
    /// question ([`inline`]).
    #[project = Proj]
    pub(crate) enum ResponseFuture<F, E, H> {
        Inner {
            #[pin]
            future: F,
            after: Option<H>,
        },
        Ready { response: Option<ToolResponse> },
        Boxed { future: BoxFuture<E> },
    }
}

impl<F, E, H> ResponseFuture<F, E, H> {
    /// The inner service's future; `after` runs on its response.
    pub(crate) fn inner(future: F, after: H) -> Self {
        Self::Inner {
            future,
            after: Some(after),
        }
    }

    /// `response`, now.
    pub(crate) fn ready(response: ToolResponse) -> Self {
        Self::Ready {
            response: Some(response),
        }
    }

    fn boxed(future: impl Future<Output = Result<ToolResponse, E>> + Send + 'static) -> Self {
        Self::Boxed {
            future: Box::pin(future),
        }
    }
}

impl<F, E, H> fmt::Debug for ResponseFuture<F, E, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, E, H> Future for ResponseFuture<F, E, H>
where
    F: Future<Output = Result<ToolResponse, E>>,
    H: After,
{
    type Output = Result<ToolResponse, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            Proj::Inner { future, after } => match future.poll(cx) {
                Poll::Ready(Ok(response)) => Poll::Ready(Ok(match after.take() {
                    Some(after) => after.after(response),
                    None => response,
                })),
                other => other,
            },
            Proj::Ready { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => panic!("ResponseFuture polled after completion"),
            },
            Proj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}

/// A layer's public response future `$name<F, E>`: [`ResponseFuture`] with the layer's hook,
/// its insides hidden the way tower's `opaque_future!` hides them. Made with `new` in the
/// parent of the module the macro is used in (the layer's).
macro_rules! response_future {
    ($(#[$m:meta])* pub struct $name:ident<F, E>(After = $after:ty);) => {
        pin_project_lite::pin_project! {
            $(#[$m])*
            pub struct $name<F, E> {
                #[pin]
                inner: $crate::ask::ResponseFuture<F, E, $after>,
            }
        }

        impl<F, E> $name<F, E> {
            pub(super) fn new(inner: $crate::ask::ResponseFuture<F, E, $after>) -> Self {
                Self { inner }
            }
        }

        impl<F, E> std::fmt::Debug for $name<F, E> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name)).finish_non_exhaustive()
            }
        }

        impl<F, E> std::future::Future for $name<F, E>
        where
            F: std::future::Future<Output = Result<tower_agent_core::ToolResponse, E>>,
        {
            type Output = Result<tower_agent_core::ToolResponse, E>;

            fn poll(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Self::Output> {
                self.project().inner.poll(cx)
            }
        }
    };
}
pub(crate) use response_future;

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn an_answer_in_time_is_given() {
        let asked = async {
            tokio::time::sleep(TIMEOUT - Duration::from_secs(1)).await;
            Ok(true)
        };
        assert!(matches!(within(asked, TIMEOUT).await, Answer::Given(true)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_is_failed() {
        let asked = async { Err::<bool, BoxError>("the prompt closed".into()) };
        match within(asked, TIMEOUT).await {
            Answer::Failed(error) => assert_eq!(error.to_string(), "the prompt closed"),
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_answer_in_time_is_late_by_the_timeout() {
        let start = tokio::time::Instant::now();
        let asked = async {
            tokio::time::sleep(TIMEOUT + Duration::from_secs(1)).await;
            Ok(true)
        };
        match within(asked, TIMEOUT).await {
            Answer::Late(waited) => assert_eq!(waited, TIMEOUT),
            other => panic!("expected a late answer, got {other:?}"),
        }
        assert_eq!(
            start.elapsed(),
            TIMEOUT,
            "gave up at the timeout, not later"
        );
    }
}
