//! Letting a request through a callback layer allocates nothing and boxes nothing (an around
//! *closure* excepted: it boxes the rest of the stack, and this test pins how much).
//!
//! A counting global allocator (stats_alloc) counts every allocation of this test binary.
//! There is one test function, so no other test runs concurrently and pollutes the count.

use std::alloc::System;
use std::future::{Future, ready};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use tower_agent::AroundCallback;
use tower_agent::AroundLayer;
use tower_agent::ModelNext;
use tower_agent::Next;
use tower_agent::ObserveLayer;
use tower_agent::Role;

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tower::{Layer, Service, ServiceBuilder, service_fn};
use tower_agent::prelude::*;
use tower_agent::{History, ModelRequest, NextFuture};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Drive a future that completes on its first poll, with no runtime (and no allocation).
fn poll_once<F: Future>(future: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the stub completes at once"),
    }
}

fn request(history: &History, ctx: &RunContext) -> ModelRequest {
    let mut req = ModelRequest::new(history.clone());
    req.ctx = ctx.clone();
    req
}

/// Allocations made by `calls` calls of `svc` (requests are built before counting).
fn allocations<S>(mut svc: S, calls: usize) -> usize
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error>,
{
    let history = History::from(vec![Message::user("hi"); 10]);
    let ctx = RunContext::new();
    let requests: Vec<ModelRequest> = (0..calls).map(|_| request(&history, &ctx)).collect();
    let region = Region::new(GLOBAL);
    for req in requests {
        let mut cx = Context::from_waker(Waker::noop());
        assert!(svc.poll_ready(&mut cx).is_ready());
        let res = poll_once(svc.call(req)).expect("the stub answers");
        drop(res);
    }
    region.change().allocations
}

#[test]
fn pass_through_callbacks_allocate_nothing() {
    // A response without heap data, so the stub itself allocates nothing.
    let stub = service_fn(|_req: ModelRequest| {
        ready(Ok::<_, Error>(ModelResponse::new(Message {
            role: Role::Assistant,
            content: Vec::new(),
        })))
    });

    let bare = allocations(stub, 100);
    assert_eq!(
        bare, 0,
        "the stub must not allocate, or the comparison means nothing"
    );

    let before = before_model(|req: ModelRequest| async move { Ok(Flow::Continue(req)) });
    assert_eq!(
        allocations(before.clone().layer(stub), 100),
        0,
        "before_model"
    );

    let after = after_model(|res: ModelResponse, _: RunContext| async move { Ok(res) });
    assert_eq!(
        allocations(after.clone().layer(stub), 100),
        0,
        "after_model"
    );

    let observe = ObserveLayer::new()
        .on_request(|_: &ModelRequest| {})
        .on_response(|_: Result<&ModelResponse, &Error>, _: &RunContext| {});
    assert_eq!(allocations(observe.clone().layer(stub), 100), 0, "observe");

    // Callbacks capturing shared state (an Arc) clone it per call: a refcount, not a malloc.
    let counter = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counting = before_model(move |req: ModelRequest| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(Flow::Continue(req))
        }
    });
    let stack = ServiceBuilder::new()
        .layer(observe)
        .layer(after)
        .layer(counting)
        .layer(before)
        .service(stub);
    assert_eq!(allocations(stack, 100), 0, "a stack of four");

    // The counter is real: a layer that allocates is caught.
    let boxing = before_model(|req: ModelRequest| async move {
        let _boxed = Box::new(1_u64);
        Ok(Flow::Continue(req))
    });
    assert_eq!(
        allocations(boxing.layer(stub), 100),
        100,
        "the counter sees allocations"
    );

    // An around strategy generic over the inner service boxes nothing.
    assert_eq!(
        allocations(AroundLayer::new(PassThrough).layer(stub), 100),
        0,
        "around strategy"
    );
    // An around closure boxes the rest of the stack: one box for the service handed over as
    // `next` (none when it is zero-sized, as `stub` is) and one for its future. At most two
    // allocations per call: the price of the closure form.
    let around =
        around_model(|req: ModelRequest, next: ModelNext| async move { next.oneshot(req).await });
    assert_eq!(
        allocations(around.clone().layer(stub), 100),
        100,
        "around closure, zero-sized inner service"
    );
    let shared = Arc::new(());
    let sized = service_fn(move |_req: ModelRequest| {
        let _ = &shared;
        ready(Ok::<_, Error>(ModelResponse::new(Message {
            role: Role::Assistant,
            content: Vec::new(),
        })))
    });
    assert_eq!(
        allocations(around.layer(sized), 100),
        200,
        "around closure, inner service with state"
    );
}

/// An around callback that only calls `next`, written as a strategy.
#[derive(Clone, Copy)]
struct PassThrough;

impl<S: Service<ModelRequest>> AroundCallback<S, ModelRequest> for PassThrough {
    type Future = NextFuture<S, ModelRequest>;

    fn around(&mut self, req: ModelRequest, next: Next<S>) -> Self::Future {
        next.oneshot(req)
    }
}
