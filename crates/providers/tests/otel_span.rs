//! The `chat` span as OpenTelemetry exports it (feature `otel`): `gen_ai.response.finish_reasons`
//! is an array of strings, as the conventions type it, and only once. Alone in its test binary
//! for the reason `span.rs` gives.

#![cfg(all(feature = "openai", feature = "otel"))]

mod common;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Array, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tower_agent_core::{Message, ModelRequest};
use tower_agent_providers::OpenAi;
use tracing_subscriber::layer::SubscriberExt;

use common::{Canned, Server, call};

#[tokio::test]
async fn finish_reasons_are_exported_as_an_array_once() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));

    let server = Server::start([Canned::fixture("openai/text.json")]).await;
    let model = OpenAi::new("gpt-4o-mini")
        .base_url(format!("{}/v1", server.url))
        .api_key("sk-test")
        .streaming(false);
    let request = ModelRequest::new(vec![Message::user("What is the capital of France?")]);
    call(model, request).await.expect("answered");
    provider.force_flush().expect("flushed");

    let spans = exporter.get_finished_spans().expect("spans");
    let [chat] = &spans[..] else {
        panic!("one span: {spans:?}")
    };
    assert_eq!(chat.name, "chat gpt-4o-mini");
    let reasons: Vec<&Value> = chat
        .attributes
        .iter()
        .filter(|kv| kv.key.as_str() == "gen_ai.response.finish_reasons")
        .map(|kv| &kv.value)
        .collect();
    assert_eq!(
        reasons,
        [&Value::Array(Array::String(vec!["stop".into()]))],
        "one array attribute"
    );
    // The other fields still come through the span's fields.
    assert!(
        chat.attributes
            .iter()
            .any(|kv| kv.key.as_str() == "gen_ai.response.id"
                && kv.value.as_str() == "chatcmpl-AUq2r5Yh0s3kE1")
    );
}
