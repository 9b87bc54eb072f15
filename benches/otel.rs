//! What the OpenTelemetry export costs a run: a 100-round run (one tool call per round, stub
//! services, 10 messages of history), with no subscriber (`off`) and with the
//! `tracing-opentelemetry` layer of `tower_agent::otel` exporting through the SDK's batch
//! processor to an exporter that drops every batch (`otel_noop_exporter`). Each round makes a
//! `model` and an `execute_tool` span, each run one `invoke_agent` span (a provider would add
//! its `chat` span per call). Divide by 100 for the per-round cost.
//!
//! Run: `cargo bench --bench otel --features otel`.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tower_agent::otel::{opentelemetry, opentelemetry_sdk, tracing_opentelemetry};
use tower_agent::prelude::*;
use tracing_subscriber::layer::SubscriberExt;

mod common;

use common::{ROUNDS, request, stub_model, stub_tools};

/// An exporter that drops what it is given.
#[derive(Debug)]
struct Noop;

impl SpanExporter for Noop {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        black_box(batch);
        Ok(())
    }
}

fn runs(c: &mut Criterion) {
    let mut group = c.benchmark_group("otel");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let agent = Agent::builder()
        .max_rounds(ROUNDS)
        .build(stub_model(), stub_tools());
    let run = |req| {
        let res = rt.block_on(agent.clone().oneshot(req)).expect("the run");
        assert_eq!(res.rounds, ROUNDS);
        res
    };

    group.bench_function("off", |b| {
        b.iter_batched(|| request(10), run, BatchSize::SmallInput)
    });

    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(Noop)
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("bench")));
    tracing::subscriber::with_default(subscriber, || {
        group.bench_function("otel_noop_exporter", |b| {
            b.iter_batched(|| request(10), run, BatchSize::SmallInput)
        });
    });
    provider.shutdown().expect("shut down");
    group.finish();
}

criterion_group!(benches, runs);
criterion_main!(benches);
