//! Callback layers follow tower's readiness rules, checked with `tower_test::mock`, whose
//! service panics when `call` comes before `poll_ready`.

use std::task::Poll;

use serde_json::json;
use tower::Layer;
use tower_agent_core::{
    AfterLayer, BeforeLayer, Error, ErrorKind, Flow, ObserveLayer, RunContext, ServiceBuilderExt,
    ToolCall, ToolRequest, ToolResponse,
};
use tower_test::mock;

fn req(id: &str) -> ToolRequest {
    ToolRequest::new(ToolCall::new(id, "t", json!({})), RunContext::new())
}

type Decision =
    std::pin::Pin<Box<dyn Future<Output = Result<Flow<ToolRequest, ToolResponse>, Error>> + Send>>;

/// A before callback that yields before deciding, so the inner call happens later, inside
/// the response future: the layer must hand the *ready* inner service to that future.
fn slow_before() -> BeforeLayer<impl FnMut(ToolRequest) -> Decision + Clone> {
    BeforeLayer::new(|req: ToolRequest| -> Decision {
        Box::pin(async move {
            tokio::task::yield_now().await;
            Ok(Flow::Continue(req))
        })
    })
}

#[tokio::test]
async fn before_hands_the_ready_service_to_its_future() {
    let (mock, mut handle) = mock::pair::<ToolRequest, ToolResponse>();
    let mut svc = mock::Spawn::new(slow_before().layer(mock));

    // No capacity: the layer is not ready either (backpressure passes through).
    handle.allow(0);
    assert!(svc.poll_ready::<ToolRequest>().is_pending());

    handle.allow(1);
    assert!(matches!(
        svc.poll_ready::<ToolRequest>(),
        Poll::Ready(Ok(()))
    ));
    let first = svc.call(req("one"));

    // Driving `first` calls the mock only after the callback yielded. It must use the clone
    // that was polled ready: the mock panics on a `call` without `poll_ready`.
    let mut first = Box::pin(first);
    assert!(
        futures_util::poll!(first.as_mut()).is_pending(),
        "the callback yields first"
    );
    assert!(
        futures_util::poll!(first.as_mut()).is_pending(),
        "then it calls the mock"
    );
    let (request, send) = handle.next_request().await.unwrap();
    assert_eq!(request.call.id, "one");
    // The capacity is used up: the service left in the layer waits again.
    assert!(svc.poll_ready::<ToolRequest>().is_pending());
    send.send_response(ToolResponse::success(&request.call, "ok"));
    let res = first.await.unwrap();
    assert_eq!(res.result.content, "ok");
}

#[tokio::test]
async fn after_and_observe_call_the_polled_service_directly() {
    let (mock, mut handle) = mock::pair::<ToolRequest, ToolResponse>();
    let stack = tower::ServiceBuilder::new()
        .observe(ObserveLayer::new())
        .layer(AfterLayer::new(
            |res: ToolResponse, _: RunContext| async move { Ok(res) },
        ))
        .service(mock);
    let mut svc = mock::Spawn::new(stack);

    handle.allow(0);
    assert!(svc.poll_ready::<ToolRequest>().is_pending());
    handle.allow(1);
    assert!(matches!(
        svc.poll_ready::<ToolRequest>(),
        Poll::Ready(Ok(()))
    ));
    let fut = tokio::spawn(svc.call(req("two")));
    let (got, send) = handle.next_request().await.unwrap();
    assert_eq!(got.call.id, "two");
    send.send_response(ToolResponse::success(&got.call, "fine"));
    assert_eq!(fut.await.unwrap().unwrap().result.content, "fine");
}

#[tokio::test]
async fn inner_errors_pass_through_unchanged() {
    let (mock, mut handle) = mock::pair::<ToolRequest, ToolResponse>();
    let mut svc = mock::Spawn::new(slow_before().layer(mock));
    handle.allow(1);
    assert!(matches!(
        svc.poll_ready::<ToolRequest>(),
        Poll::Ready(Ok(()))
    ));
    let mut fut = Box::pin(svc.call(req("three")));
    assert!(futures_util::poll!(fut.as_mut()).is_pending());
    assert!(futures_util::poll!(fut.as_mut()).is_pending());
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error(Error::backend("disk on fire"));
    let err = fut.await.unwrap_err();
    assert_eq!(Error::from_boxed(err).kind(), ErrorKind::Backend);
}
