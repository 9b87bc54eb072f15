//! The GenAI span of a provider call. Alone in its test binary: tracing caches a callsite's
//! interest process-wide, and a test in another thread hitting the callsite first without a
//! subscriber could hide it from this one.

#![cfg(feature = "openai")]

mod common;

use tower_agent_core::{Message, ModelRequest, ToolCall, ToolResult};
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
    assert_eq!(
        get("gen_ai.response.id").as_deref(),
        Some("\"chatcmpl-AUq2r5Yh0s3kE1\"")
    );
    assert_eq!(
        get("gen_ai.response.model").as_deref(),
        Some("\"gpt-4o-mini-2024-07-18\"")
    );
    // Written through `Display`: no quotes.
    assert_eq!(get("otel.name").as_deref(), Some("chat gpt-4o-mini"));
    assert_eq!(get("otel.kind").as_deref(), Some("\"client\""));
    assert_eq!(get("server.address").as_deref(), Some("\"127.0.0.1\""));
    assert_eq!(
        get("server.port"),
        Some(server.url.rsplit(':').next().expect("a port").to_owned())
    );
    // The messages stay off the span unless asked for.
    for content in [
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
    ] {
        assert_eq!(get(content), None, "{content} was captured");
    }
    assert!(recorded.iter().all(|(_, v)| !v.contains(KEY)));
}

#[tokio::test]
async fn the_messages_are_on_the_span_only_when_asked() {
    use tracing_subscriber::layer::SubscriberExt;
    let fields = Fields::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(fields.clone()));
    let server = Server::start([Canned::fixture("openai/parallel_calls.sse")]).await;
    let model = OpenAi::new("gpt-4o-mini")
        .base_url(format!("{}/v1", server.url))
        .api_key(KEY)
        .capture_content(true);
    let clock = ToolCall::new("c0", "clock", serde_json::json!({}));
    let mut req = ModelRequest::new(vec![
        Message::user("Weather in Paris?"),
        Message::assistant_with_calls("", [clock.clone()]),
        Message::tool_result(ToolResult::success(&clock, "noon")),
    ]);
    req.system = Some("Be brief.".into());
    let answer = call(model, req).await.expect("answered");
    let recorded = fields.0.lock().expect("lock").clone();
    let json = |name: &str| -> serde_json::Value {
        let (_, value) = recorded
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{name} is not on the span"));
        // Recorded as a string: its Debug form is a quoted JSON text.
        let text: String = serde_json::from_str(value).expect("a quoted string");
        serde_json::from_str(&text).expect("JSON")
    };
    assert_eq!(
        json("gen_ai.system_instructions"),
        serde_json::json!([{ "type": "text", "content": "Be brief." }])
    );
    assert_eq!(
        json("gen_ai.input.messages"),
        serde_json::json!([
            { "role": "user", "parts": [{ "type": "text", "content": "Weather in Paris?" }] },
            { "role": "assistant", "parts": [
                { "type": "tool_call", "id": "c0", "name": "clock", "arguments": {} }
            ] },
            { "role": "tool", "parts": [
                { "type": "tool_call_response", "id": "c0", "response": "noon" }
            ] },
        ])
    );
    let first = answer
        .message
        .tool_calls()
        .next()
        .expect("the fixture calls tools");
    let output = json("gen_ai.output.messages");
    assert_eq!(output[0]["role"], "assistant");
    assert_eq!(output[0]["finish_reason"], "tool_calls");
    let part = output[0]["parts"]
        .as_array()
        .expect("parts")
        .iter()
        .find(|part| part["type"] == "tool_call")
        .expect("the call is captured");
    assert_eq!(part["id"], first.id.as_str());
    assert_eq!(part["name"], first.name.as_str());
    assert_eq!(
        part["arguments"],
        serde_json::from_str::<serde_json::Value>(&first.arguments).expect("JSON arguments")
    );
    assert!(recorded.iter().all(|(_, v)| !v.contains(KEY)));
}
