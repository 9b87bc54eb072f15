//! Streamed deltas through layers that do not filter cost no allocation per delta: a call
//! streaming 1,000 deltas allocates as much as one streaming none, bare and through the model
//! stack (guardrail with an output check → limits → instructions → patch → fallback → retry).
//!
//! A counting global allocator (stats_alloc) counts every allocation of this test binary.
//! There is one test function, so no other test runs concurrently and pollutes the count.

use std::alloc::System;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tower::util::BoxCloneService;
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
use tower_agent::layers::fallback::FallbackLayer;
use tower_agent::layers::guardrail::{Guardrail, GuardrailLayer, Verdict};
use tower_agent::layers::limits::{CallLimitsLayer, Limit};
use tower_agent::layers::retry::{RetryLayer, RetryPolicy};
use tower_agent::layers::{InstructionsLayer, PatchDanglingLayer};
use tower_agent::stream::Delta;
use tower_agent::{Error, Message, ModelRequest, ModelResponse, Role};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

type Model = BoxCloneService<ModelRequest, ModelResponse, Error>;

/// Drive a future that completes on its first poll, with no runtime.
fn poll_once<F: Future>(future: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("everything here completes at once"),
    }
}

/// A provider streaming `deltas` empty text deltas (which allocate nothing themselves).
fn provider(deltas: usize) -> Model {
    BoxCloneService::new(service_fn(move |req: ModelRequest| async move {
        for _ in 0..deltas {
            req.send_delta(Delta::Text(String::new())).await?;
        }
        req.end_stream().await?;
        Ok::<_, Error>(ModelResponse::new(Message {
            role: Role::Assistant,
            content: Vec::new(),
        }))
    }))
}

fn stack(model: Model) -> Model {
    let guard = GuardrailLayer::new().output(Guardrail::new("nothing", |_text: String| async {
        Verdict::Pass
    }));
    let stack = ServiceBuilder::new()
        .layer(guard)
        .layer(CallLimitsLayer::new().model_calls(Limit::per_run(1_000_000)))
        .layer(InstructionsLayer::new().text("Be brief."))
        .layer(PatchDanglingLayer::new())
        .layer(FallbackLayer::new())
        .layer(RetryLayer::new(RetryPolicy::new()))
        .service(model);
    BoxCloneService::new(stack.map_err(|e: Error| e))
}

/// Allocations of one call of `model` (its request built before counting).
fn allocations(model: &Model) -> usize {
    let mut model = model.clone();
    let req = ModelRequest::new(vec![Message::user("hi")]);
    let region = Region::new(GLOBAL);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(model.poll_ready(&mut cx).is_ready());
    let res = poll_once(model.call(req)).expect("answers");
    drop(res);
    region.change().allocations
}

#[test]
fn deltas_through_layers_that_do_not_filter_allocate_nothing() {
    for (name, wrap) in [
        ("bare", (|m| m) as fn(Model) -> Model),
        ("stack", stack as fn(Model) -> Model),
    ] {
        let none = wrap(provider(0));
        let many = wrap(provider(1_000));
        // Warm up once each (lazy statics, first-use buffers).
        allocations(&none);
        allocations(&many);
        let (none, many) = (allocations(&none), allocations(&many));
        assert_eq!(
            many, none,
            "{name}: 1,000 deltas allocate {many}, none {none}"
        );
    }
}
