//! What streaming through the stack costs: a model call streaming 1,000 one-character
//! deltas to an observer, straight from the model and through model stacks.
//!
//! - `stream/bare`: the scripted model alone (its own cost: a string and an event per delta).
//! - `stream/redact`: inside the redaction layer (e-mails, phone numbers, API keys): every
//!   delta goes through the redaction filter.
//! - `stream/full`: inside the model stack `Agent::builder()` builds with every built-in that
//!   acts on a model call (redact → guardrail → limits → instructions → patch → fallback →
//!   retry), the guardrail checking the output at the end.
//!
//! `(redact - bare) / 1000` is the redaction's cost per delta; `first_delta/*` is a call
//! streaming one delta: the stack's whole cost around a call, an upper bound of what it adds
//! to the time to the first delta.
//!
//! Run: `cargo bench --bench streams`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_agent::layers::fallback::FallbackLayer;
use tower_agent::layers::guardrail::{Guardrail, GuardrailLayer, Verdict};
use tower_agent::layers::limits::{CallLimitsLayer, Limit};
use tower_agent::layers::redact::{RedactLayer, Rules};
use tower_agent::layers::retry::{RetryLayer, RetryPolicy};
use tower_agent::layers::{InstructionsLayer, PatchDanglingLayer};
use tower_agent::{Error, Message, ModelRequest, ModelResponse, RunContext, observer_fn};
use tower_agent_test::ScriptedModel;

type Model = BoxCloneService<ModelRequest, ModelResponse, Error>;

fn scripted(text: &str) -> ScriptedModel {
    ScriptedModel::from_fn({
        let text = text.to_owned();
        move |_| Ok(ModelResponse::text(text.clone()))
    })
    .without_recording()
    .streaming(1, Duration::ZERO)
}

fn redact() -> RedactLayer {
    RedactLayer::new(Rules::new().emails().phones().api_keys())
}

fn full(model: ScriptedModel) -> Model {
    let guard = GuardrailLayer::new().output(Guardrail::new("nothing", |_text: String| async {
        Verdict::Pass
    }));
    let stack = ServiceBuilder::new()
        .layer(redact())
        .layer(guard)
        .layer(CallLimitsLayer::new().model_calls(Limit::per_run(1_000_000)))
        .layer(InstructionsLayer::new().text("Be brief."))
        .layer(PatchDanglingLayer::new())
        .layer(FallbackLayer::new())
        .layer(RetryLayer::new(RetryPolicy::new()))
        .service(model);
    BoxCloneService::new(stack.map_err(|e: Error| e))
}

fn request() -> ModelRequest {
    let mut req = ModelRequest::new(vec![Message::user("Tell me a story.")]);
    req.ctx = RunContext::new().with_observer(observer_fn(|event| {
        black_box(event);
        async { Ok(()) }
    }));
    req
}

fn streams(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let story = "a".repeat(1_000);
    let mut group = c.benchmark_group("stream");
    let bare: Model = BoxCloneService::new(scripted(&story));
    let redacted: Model = BoxCloneService::new(redact().layer(scripted(&story)));
    let stacked = full(scripted(&story));
    for (name, model) in [("bare", &bare), ("redact", &redacted), ("full", &stacked)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(model.clone().oneshot(request()))
                    .expect("answers")
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("first_delta");
    let bare: Model = BoxCloneService::new(scripted("a"));
    let stacked = full(scripted("a"));
    for (name, model) in [("bare", &bare), ("full", &stacked)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(model.clone().oneshot(request()))
                    .expect("answers")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, streams);
criterion_main!(benches);
