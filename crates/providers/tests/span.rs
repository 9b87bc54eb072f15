//! The GenAI span of a provider call. Alone in its test binary: tracing caches a callsite's
//! interest process-wide, and a test in another thread hitting the callsite first without a
//! subscriber could hide it from this one.

#![cfg(feature = "openai")]

mod common;

use tower_agent_core::{Message, ModelRequest};
use tower_agent_providers::OpenAi;

use common::{Canned, Server, call};

const KEY: &str = "sk-test-SECRET-0123456789";

fn request() -> ModelRequest {
    ModelRequest::new(vec![Message::user("What is the capital of France?")])
}

/// Span fields recorded by the provider, by name.
#[derive(Clone, Default)]
struct Fields(std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .lock()
            .expect("lock")
            .push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Fields {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        attrs.record(&mut self.clone());
    }

    fn on_record(
        &self,
        _id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        values.record(&mut self.clone());
    }
}

#[tokio::test]
async fn each_call_has_a_gen_ai_span_without_the_key() {
    use tracing_subscriber::layer::SubscriberExt;
    let fields = Fields::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(fields.clone()));
    let server = Server::start([Canned::fixture("openai/text.json")]).await;
    let model = OpenAi::new("gpt-4o-mini")
        .base_url(format!("{}/v1", server.url))
        .api_key(KEY)
        .streaming(false);
    call(model, request()).await.expect("answered");
    let recorded = fields.0.lock().expect("lock").clone();
    let get = |name: &str| {
        recorded
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("gen_ai.operation.name").as_deref(), Some("\"chat\""));
    assert_eq!(get("gen_ai.provider.name").as_deref(), Some("\"openai\""));
    assert_eq!(
        get("gen_ai.request.model").as_deref(),
        Some("\"gpt-4o-mini\"")
    );
    assert_eq!(get("gen_ai.usage.input_tokens").as_deref(), Some("24"));
    assert_eq!(get("gen_ai.usage.output_tokens").as_deref(), Some("8"));
    assert_eq!(
        get("gen_ai.response.finish_reasons").as_deref(),
        Some("\"stop\"")
    );
    assert!(recorded.iter().all(|(_, v)| !v.contains(KEY)));
}
