//! Time to the first delta through the full model stack versus straight from the provider:
//! a recorded OpenAI stream served on 127.0.0.1 (its first text chunk at once, then the
//! finish), the OpenAI provider bare and under redact → guardrail (an output check) → limits →
//! instructions → patch → fallback → retry, with and without the redaction. Each iteration is one call on a new connection;
//! what is timed is the call's start to the first `TextDelta` an observer gets. Run:
//! `cargo bench -p tower-agent-providers --bench first_delta`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{
    Error, Event, Message, ModelRequest, ModelResponse, RunContext, observer_fn,
};
use tower_agent_layers::fallback::FallbackLayer;
use tower_agent_layers::guardrail::{Guardrail, GuardrailLayer, Verdict};
use tower_agent_layers::limits::{CallLimitsLayer, Limit};
use tower_agent_layers::redact::{RedactLayer, Rules};
use tower_agent_layers::retry::{RetryLayer, RetryPolicy};
use tower_agent_layers::{InstructionsLayer, PatchDanglingLayer};
use tower_agent_providers::OpenAi;

type Model = BoxCloneService<ModelRequest, ModelResponse, Error>;

/// The recorded stream: the first text at once, then the rest and the finish.
const STREAM: &[(u64, &[u8])] = &[
    (
        0,
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Once upon a time\"}}]}\n\n",
    ),
    (
        0,
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there was a stack.\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
    ),
];

/// The full model stack over `model`, with or without the redaction (whose hold-back, not its
/// cost, decides when the first delta goes up: it releases text once no secret can still
/// start in it).
fn full(model: OpenAi, redact: bool) -> Model {
    let guard = GuardrailLayer::new().output(Guardrail::new("nothing", |_text: String| async {
        Verdict::Pass
    }));
    let redact = redact.then(|| RedactLayer::new(Rules::new().emails().phones().api_keys()));
    let stack = ServiceBuilder::new()
        .option_layer(redact)
        .layer(guard)
        .layer(CallLimitsLayer::new().model_calls(Limit::per_run(1_000_000)))
        .layer(InstructionsLayer::new().text("Be brief."))
        .layer(PatchDanglingLayer::new())
        .layer(FallbackLayer::new())
        .layer(RetryLayer::new(RetryPolicy::new()))
        .service(model);
    BoxCloneService::new(stack.map_err(|e: Error| e))
}

/// One call: how long from its start to the first text delta.
async fn first_delta(model: &Model) -> Duration {
    let first: Arc<Mutex<Option<Instant>>> = Arc::default();
    let seen = Arc::clone(&first);
    let mut req = ModelRequest::new(vec![Message::user("Tell me a story.")]);
    req.ctx = RunContext::new().with_observer(observer_fn(move |event: &Event| {
        if matches!(event, Event::TextDelta { .. }) {
            seen.lock().expect("lock").get_or_insert_with(Instant::now);
        }
        async { Ok(()) }
    }));
    let started = Instant::now();
    model.clone().oneshot(req).await.expect("answers");
    let first = first.lock().expect("lock").expect("a delta came");
    first - started
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let server = rt.block_on(common::Server::trickling(STREAM));
    let provider = || {
        OpenAi::new("recorded")
            .base_url(&server.url)
            .api_key("none")
    };
    let bare: Model = BoxCloneService::new(provider());
    let unredacted = full(provider(), false);
    let stacked = full(provider(), true);
    let mut group = c.benchmark_group("served_first_delta");
    let models = [
        ("bare", &bare),
        ("full_without_redaction", &unredacted),
        ("full", &stacked),
    ];
    for (name, model) in models {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        total += first_delta(model).await;
                    }
                    total
                })
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
