//! What reserving a call's worst cost on its budgets adds to a model call:
//! `cargo bench --bench budget`.
//!
//! A model that answers at once, called through `BudgetLayer` with a run, a session and a
//! shared budget (three reservations, three settlements, the session's total updated), and
//! without the layer. The difference is the layer's overhead per call; a real model call takes
//! seconds.
//!
//! Then a run whose history has 1,000 messages and grows by one a call: through the layer in
//! one run (the prompt counted by what each call added), and with every call in a run of its
//! own (the whole history counted each time), as the layer counted before it kept a run's
//! count.

use criterion::{Criterion, criterion_group, criterion_main};
use std::time::{Duration, Instant};
use tower::{Layer, ServiceExt};
use tower_agent::layers::budget::{Budget, BudgetLayer};

use tower_agent::{
    Cost, Error, GenerationOptions, History, Message, ModelPrice, ModelRequest, ModelResponse,
    RunContext, Usage,
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
    req.options = GenerationOptions::new().max_tokens(1_000).into();
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

/// `iters` calls through `service`, each adding one message to a history of 1,000; a new run
/// every 1,000 calls, or for every call when `fresh_runs`.
fn grow<S>(rt: &tokio::runtime::Runtime, service: &S, iters: u64, fresh_runs: bool) -> Duration
where
    S: tower::Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone,
{
    let base: Vec<Message> = (0..1_000)
        .map(|i| Message::user(format!("message {i}: {}", "some words ".repeat(20))))
        .collect();
    let mut elapsed = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let run = RunContext::new();
        let mut history = History::from(base.clone());
        for _ in 0..(iters - done).min(1_000) {
            history.push(Message::user("one more"));
            let mut req = ModelRequest::new(history.clone());
            req.options = GenerationOptions::new().max_tokens(1_000).into();
            req.ctx = if fresh_runs {
                RunContext::new()
            } else {
                run.clone()
            };
            let start = Instant::now();
            let _ = rt.block_on(service.clone().oneshot(req));
            elapsed += start.elapsed();
            done += 1;
        }
    }
    elapsed
}

fn long_runs(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let layer = BudgetLayer::new(ModelPrice::per_million(3.0, 0.3, 15.0))
        .per_run(Cost::from_dollars(1e6))
        .shared("team", Budget::new(Cost::from_dollars(1e6)));
    let budgeted = layer.layer(model());
    let bare = model();
    let mut group = c.benchmark_group("budget_1000_messages");
    group.bench_function("call_without_layer", |b| {
        b.iter_custom(|iters| grow(&rt, &bare, iters, false))
    });
    group.bench_function("growing_run", |b| {
        b.iter_custom(|iters| grow(&rt, &budgeted, iters, false))
    });
    group.bench_function("counted_whole_each_call", |b| {
        b.iter_custom(|iters| grow(&rt, &budgeted, iters, true))
    });
    group.finish();
}

criterion_group!(benches, calls, long_runs);
criterion_main!(benches);
