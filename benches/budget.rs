//! What reserving a call's worst cost on its budgets adds to a model call:
//! `cargo bench --bench budget`.
//!
//! A model that answers at once, called through `BudgetLayer` with a run, a session and a
//! shared budget (three reservations, three settlements, the session's total updated), and
//! without the layer. The difference is the layer's overhead per call; a real model call takes
//! seconds.

use criterion::{Criterion, criterion_group, criterion_main};
use tower::{Layer, ServiceExt};
use tower_agent::layers::budget::{Budget, BudgetLayer};
use tower_agent::{
    Cost, Error, GenerationOptions, Message, ModelPrice, ModelRequest, ModelResponse, RunContext,
    Usage,
};

fn model() -> tower::util::ServiceFn<
    impl Fn(ModelRequest) -> std::future::Ready<Result<ModelResponse, Error>> + Clone,
> {
    tower::service_fn(|_req: ModelRequest| {
        std::future::ready(Ok(
            ModelResponse::text("ok").with_usage(Usage::new(1_200, 80))
        ))
    })
}

fn request(ctx: &RunContext) -> ModelRequest {
    let mut req = ModelRequest::new(
        (0..20)
            .map(|i| Message::user(format!("message {i}: {}", "some words ".repeat(20))))
            .collect::<Vec<_>>(),
    );
    req.options = GenerationOptions::new().max_tokens(1_000);
    req.ctx = ctx.clone();
    req
}

fn calls(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let ctx = RunContext::new();
    let layer = BudgetLayer::new(ModelPrice::per_million(3.0, 0.3, 15.0))
        .per_run(Cost::from_dollars(1e6))
        .per_session(Cost::from_dollars(1e6))
        .shared("team", Budget::new(Cost::from_dollars(1e6)));
    let budgeted = layer.layer(model());
    let bare = model();
    let mut group = c.benchmark_group("budget");
    group.bench_function("call_without_layer", |b| {
        b.iter(|| rt.block_on(bare.clone().oneshot(request(&ctx))))
    });
    group.bench_function("call_with_three_budgets", |b| {
        b.iter(|| rt.block_on(budgeted.clone().oneshot(request(&ctx))))
    });
    group.finish();
}

criterion_group!(benches, calls);
criterion_main!(benches);
