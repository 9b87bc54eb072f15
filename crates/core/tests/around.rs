//! The around callback: `next` zero, one or many times, each call through `poll_ready`
//! (checked with `tower_test::mock`, whose service panics when `call` comes before
//! `poll_ready`), and errors and responses turned into each other.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;

use serde_json::json;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_agent_core::{
    AroundCallback, AroundLayer, BoxError, Error, ErrorKind, ModelRequest, ModelResponse, Next,
    RunContext, ToolCall, ToolNext, ToolRequest, ToolResponse, around_model, around_tool,
};
use tower_test::mock;

fn req(id: &str) -> ToolRequest {
    ToolRequest::new(ToolCall::new(id, "t", json!({})), RunContext::new())
}

#[tokio::test]
async fn zero_calls_answer_without_touching_the_inner_service() {
    let (mock, mut handle) = mock::pair::<ToolRequest, ToolResponse>();
    let layer = around_tool(|req: ToolRequest, _next: ToolNext| async move {
        Ok(ToolResponse::success(&req.call, "cached"))
    });
    let mut svc = mock::Spawn::new(layer.layer(mock));
    handle.allow(1);
    assert!(matches!(
        svc.poll_ready::<ToolRequest>(),
        Poll::Ready(Ok(()))
    ));
    let res = svc.call(req("one")).await.unwrap();
    assert_eq!(res.result.content, "cached");
    // The ready service was dropped unused: nothing reached the mock.
    assert!(
        futures_util::poll!(Box::pin(handle.next_request())).is_pending(),
        "no request reached the inner service"
    );
}

#[tokio::test]
async fn one_call_uses_the_service_polled_ready() {
    let (mock, mut handle) = mock::pair::<ToolRequest, ToolResponse>();
    let layer = around_tool(|req: ToolRequest, mut next: ToolNext| async move {
        tokio::task::yield_now().await; // the inner call happens later, in the future
        next.run(req).await
    });
    let mut svc = mock::Spawn::new(layer.layer(mock));

    handle.allow(0);
    assert!(
        svc.poll_ready::<ToolRequest>().is_pending(),
        "backpressure passes through"
    );
    handle.allow(1);
    assert!(matches!(
        svc.poll_ready::<ToolRequest>(),
        Poll::Ready(Ok(()))
    ));
    let mut first = Box::pin(svc.call(req("one")));
    assert!(futures_util::poll!(first.as_mut()).is_pending());
    assert!(futures_util::poll!(first.as_mut()).is_pending());
    let (request, send) = handle.next_request().await.unwrap();
    assert_eq!(request.call.id, "one");
    // The capacity went with the ready service into `next`.
    assert!(svc.poll_ready::<ToolRequest>().is_pending());
    send.send_response(ToolResponse::success(&request.call, "ok"));
    assert_eq!(first.await.unwrap().result.content, "ok");
}

#[tokio::test]
async fn further_calls_wait_for_readiness_of_their_own() {
    let (mock, mut handle) = mock::pair::<ToolRequest, ToolResponse>();
    // Retries until a success: every call after the first drives the service to readiness.
    let layer = around_tool(|req: ToolRequest, mut next: ToolNext| async move {
        loop {
            let res = next.run(req.clone()).await?;
            if !res.result.is_error {
                return Ok(res);
            }
        }
    });
    let mut svc = mock::Spawn::new(layer.layer(mock));
    handle.allow(1);
    assert!(matches!(
        svc.poll_ready::<ToolRequest>(),
        Poll::Ready(Ok(()))
    ));
    let mut call = Box::pin(svc.call(req("one")));
    assert!(futures_util::poll!(call.as_mut()).is_pending());
    let (request, send) = handle.next_request().await.unwrap();
    send.send_response(ToolResponse::error(&request.call, "flaky"));

    // No capacity: the second try waits in poll_ready (the mock would panic on a call).
    assert!(futures_util::poll!(call.as_mut()).is_pending());
    assert!(
        futures_util::poll!(Box::pin(handle.next_request())).is_pending(),
        "the retry must not be sent before the inner service is ready"
    );
    handle.allow(1);
    assert!(futures_util::poll!(call.as_mut()).is_pending());
    let (request, send) = handle.next_request().await.unwrap();
    assert_eq!(request.call.id, "one");
    send.send_response(ToolResponse::success(&request.call, "second try"));
    assert_eq!(call.await.unwrap().result.content, "second try");
}

#[tokio::test]
async fn retries_through_a_concurrency_limit_of_one_do_not_wait_on_themselves() {
    // The slot reserved by `poll_ready` goes into `next`; a retry on the same `next` frees it
    // with the first response and reserves it again. (A clone would wait for a second slot.)
    let tries = Arc::new(AtomicUsize::new(0));
    let seen = tries.clone();
    let flaky = service_fn(move |req: ToolRequest| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        async move {
            if n < 2 {
                Err(Error::new(ErrorKind::Server, "flaky"))
            } else {
                Ok(ToolResponse::success(&req.call, "third time"))
            }
        }
    });
    let stack = tower::ServiceBuilder::new()
        .layer(around_tool(
            |req: ToolRequest, mut next: ToolNext| async move {
                loop {
                    match next.run(req.clone()).await {
                        Err(e) if e.is_transient() => continue,
                        other => return other,
                    }
                }
            },
        ))
        .concurrency_limit(1)
        .service(flaky);
    let res = tokio::time::timeout(std::time::Duration::from_secs(5), stack.oneshot(req("one")))
        .await
        .expect("a retry must not wait for a slot its own `next` holds")
        .unwrap();
    assert_eq!(res.result.content, "third time");
    assert_eq!(tries.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn errors_become_responses_and_responses_errors() {
    let failing = service_fn(|_: ModelRequest| async {
        Err::<ModelResponse, Error>(Error::new(ErrorKind::ContextTooLong, "too long"))
    });
    let rescue = around_model(|req, mut next| async move {
        match next.run(req).await {
            Err(e) if e.kind() == ErrorKind::ContextTooLong => Ok(ModelResponse::text("rescued")),
            other => other,
        }
    });
    let res = rescue
        .layer(failing)
        .oneshot(ModelRequest::new(vec![]))
        .await
        .unwrap();
    assert_eq!(res.message.text(), "rescued");

    let answering = service_fn(|_: ModelRequest| async { Ok::<_, Error>(ModelResponse::text("")) });
    let refuse_empty = around_model(|req, mut next| async move {
        let res = next.run(req).await?;
        if res.message.text().is_empty() {
            return Err(Error::new(ErrorKind::Server, "empty answer"));
        }
        Ok(res)
    });
    let err = refuse_empty
        .layer(answering)
        .oneshot(ModelRequest::new(vec![]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server);
}

#[tokio::test]
async fn boxed_errors_of_tower_middleware_reach_the_closure_as_errors() {
    // Outside tower's timeout the inner error is a `BoxError`: the closure still sees `Error`.
    let slow = service_fn(|_: ModelRequest| async {
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        Ok::<_, Error>(ModelResponse::text("late"))
    });
    let stack = tower::ServiceBuilder::new()
        .layer(around_model(|req, mut next| async move {
            match next.run(req).await {
                Err(e) if e.kind() == ErrorKind::Timeout => Ok(ModelResponse::text("timed out")),
                other => other,
            }
        }))
        .timeout(std::time::Duration::from_millis(1))
        .service(slow);
    let res: Result<ModelResponse, BoxError> = stack.oneshot(ModelRequest::new(vec![])).await;
    assert_eq!(res.unwrap().message.text(), "timed out");
}

/// A strategy: generic over the inner service, so nothing is boxed.
#[derive(Clone, Debug)]
struct Fallback {
    calls: Arc<AtomicUsize>,
}

impl<S> AroundCallback<S, ModelRequest> for Fallback
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    S::Future: Send,
{
    type Future = Pin<Box<dyn Future<Output = Result<ModelResponse, Error>> + Send>>;

    fn around(&mut self, req: ModelRequest, next: Next<S>) -> Self::Future {
        let calls = self.calls.clone();
        Box::pin(async move {
            calls.fetch_add(1, Ordering::SeqCst);
            match next.oneshot(req).await {
                Ok(res) => Ok(res),
                Err(_) => Ok(ModelResponse::text("fallback")),
            }
        })
    }
}

#[tokio::test]
async fn strategies_and_closures_are_one_mechanism() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = AroundLayer::new(Fallback {
        calls: calls.clone(),
    });
    let down = service_fn(|_: ModelRequest| async {
        Err::<ModelResponse, _>(Error::new(
            ErrorKind::Overloaded { retry_after: None },
            "529",
        ))
    });
    let res = layer
        .layer(down)
        .oneshot(ModelRequest::new(vec![]))
        .await
        .unwrap();
    assert_eq!(res.message.text(), "fallback");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
