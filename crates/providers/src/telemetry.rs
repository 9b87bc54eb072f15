//! A call's GenAI telemetry: its span, its metrics (feature `otel`), and its content when the
//! host asked for it. The names are those of the OpenTelemetry semantic conventions for
//! generative AI, as of version 1.41.0 ([`SEMCONV_SCHEMA_URL`](tower_agent_core::SEMCONV_SCHEMA_URL)).

use serde_json::{Value, json};
use tower_agent_core::{
    ContentPart, Error, FinishReason, Message, ModelRequest, ModelResponse, Role,
};
use tracing::field::Empty;

use crate::wire::{Endpoint, Format};

/// The span of one call to the provider: `chat {model}`, of kind client.
pub(crate) fn span<W: Format>(
    endpoint: &Endpoint,
    capture_content: bool,
    req: &ModelRequest,
) -> tracing::Span {
    let model = endpoint.model.as_str();
    let (address, port) = server(&endpoint.base_url);
    let span = tracing::info_span!(
        "chat",
        otel.name = %format_args!("chat {model}"),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = W::SPEC.gen_ai_provider,
        gen_ai.request.model = model,
        gen_ai.request.max_tokens = i64::from(endpoint.max_tokens(req)),
        gen_ai.request.temperature = req.options.temperature.map(f64::from),
        gen_ai.request.top_p = req.options.top_p.map(f64::from),
        server.address = address.as_deref(),
        server.port = port.map(i64::from),
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.usage.cache_read.input_tokens = Empty,
        gen_ai.usage.cache_creation.input_tokens = Empty,
        gen_ai.response.finish_reasons = Empty,
        gen_ai.response.id = Empty,
        gen_ai.response.model = Empty,
        error.type = Empty,
        otel.status_code = Empty,
        gen_ai.system_instructions = Empty,
        gen_ai.input.messages = Empty,
        gen_ai.output.messages = Empty,
    );
    if capture_content && !span.is_disabled() {
        if let Some(system) = &req.system {
            let instructions = json!([{ "type": "text", "content": &**system }]);
            span.record(
                "gen_ai.system_instructions",
                instructions.to_string().as_str(),
            );
        }
        let input: Vec<Value> = req.messages.iter().map(|m| message(m, None)).collect();
        span.record(
            "gen_ai.input.messages",
            Value::Array(input).to_string().as_str(),
        );
    }
    span
}

/// What the call came to, on its span.
pub(crate) fn record(
    span: &tracing::Span,
    capture_content: bool,
    result: &Result<ModelResponse, Error>,
) {
    match result {
        Ok(res) => {
            span.record("gen_ai.usage.input_tokens", int(res.usage.input_tokens));
            span.record("gen_ai.usage.output_tokens", int(res.usage.output_tokens));
            span.record(
                "gen_ai.usage.cache_read.input_tokens",
                int(res.usage.cached_input_tokens),
            );
            if res.usage.cache_write_input_tokens > 0 {
                span.record(
                    "gen_ai.usage.cache_creation.input_tokens",
                    int(res.usage.cache_write_input_tokens),
                );
            }
            if let Some(id) = res.response_id() {
                span.record("gen_ai.response.id", id);
            }
            if let Some(model) = res.response_model() {
                span.record("gen_ai.response.model", model);
            }
            let reason = finish_reason_name(&res.finish_reason);
            finish_reasons(span, reason);
            if capture_content {
                let output = json!([message(&res.message, Some(reason))]);
                span.record("gen_ai.output.messages", output.to_string().as_str());
            }
        }
        Err(error) => {
            span.record("error.type", error.kind().name());
            span.record("otel.status_code", "error");
        }
    }
}

/// `gen_ai.response.finish_reasons`: an array of one string on a span that OpenTelemetry
/// exports (feature `otel`), as the conventions type it; a `tracing` field holds no array, so
/// any other subscriber gets the one string.
fn finish_reasons(span: &tracing::Span, reason: &str) {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        // A context with a span only under `tracing-opentelemetry`'s layer; the field stays
        // unrecorded there, so the attribute is not exported twice.
        if span.context().has_active_span() {
            let reason = opentelemetry::StringValue::from(reason.to_owned());
            let reasons = opentelemetry::Value::Array(opentelemetry::Array::String(vec![reason]));
            span.set_attribute("gen_ai.response.finish_reasons", reasons);
            return;
        }
    }
    span.record("gen_ai.response.finish_reasons", reason);
}

/// A count as a signed integer: `tracing-opentelemetry` exports `i64` fields as integers, and
/// `u64` ones as text.
fn int(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// The host and port of a base URL, as in `server.address` and `server.port`.
fn server(base_url: &str) -> (Option<String>, Option<u16>) {
    match reqwest::Url::parse(base_url) {
        Ok(url) => (
            url.host_str().map(str::to_owned),
            url.port_or_known_default(),
        ),
        Err(_) => (None, None),
    }
}

/// The conventions' name of a finish reason.
fn finish_reason_name(reason: &FinishReason) -> &str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::Length => "length",
        FinishReason::ContentFilter => "content_filter",
        FinishReason::Other(other) => other,
    }
}

/// A message in the conventions' JSON form: its role and its parts.
fn message(message: &Message, finish_reason: Option<&str>) -> Value {
    let role = match message.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let parts: Vec<Value> = message
        .content
        .iter()
        .map(|part| match part {
            ContentPart::Text { text } => json!({ "type": "text", "content": text }),
            ContentPart::Reasoning { text, .. } => {
                json!({ "type": "reasoning", "content": text })
            }
            ContentPart::ToolCall(call) => json!({
                "type": "tool_call",
                "id": call.id,
                "name": call.name,
                // The arguments as the model wrote them: JSON when they parse, the text when not.
                "arguments": serde_json::from_str::<Value>(&call.arguments)
                    .unwrap_or_else(|_| Value::String(call.arguments.clone())),
            }),
            ContentPart::ToolResult(result) => json!({
                "type": "tool_call_response",
                "id": result.call_id,
                "response": result.content,
            }),
        })
        .collect();
    let mut out = json!({ "role": role, "parts": parts });
    if let Some(reason) = finish_reason {
        out["finish_reason"] = Value::from(reason);
    }
    out
}

/// The call's duration and tokens, on the GenAI client metrics of the global meter provider.
#[cfg(feature = "otel")]
pub(crate) fn measure<W: Format>(
    endpoint: &Endpoint,
    elapsed: std::time::Duration,
    result: &Result<ModelResponse, Error>,
) {
    use opentelemetry::{InstrumentationScope, KeyValue, global};

    /// The buckets the conventions advise for `gen_ai.client.operation.duration`, in seconds.
    const SECONDS: [f64; 14] = [
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    ];
    /// The buckets they advise for `gen_ai.client.token.usage`.
    const TOKENS: [f64; 14] = [
        1.0,
        4.0,
        16.0,
        64.0,
        256.0,
        1024.0,
        4096.0,
        16384.0,
        65536.0,
        262_144.0,
        1_048_576.0,
        4_194_304.0,
        16_777_216.0,
        67_108_864.0,
    ];

    let scope = InstrumentationScope::builder("tower-agent-providers")
        .with_version(env!("CARGO_PKG_VERSION"))
        .with_schema_url(tower_agent_core::SEMCONV_SCHEMA_URL)
        .build();
    let meter = global::meter_with_scope(scope);
    let (address, port) = server(&endpoint.base_url);
    let mut attributes = vec![
        KeyValue::new("gen_ai.operation.name", "chat"),
        KeyValue::new("gen_ai.provider.name", W::SPEC.gen_ai_provider),
        KeyValue::new("gen_ai.request.model", endpoint.model.clone()),
    ];
    if let (Some(address), Some(port)) = (address, port) {
        attributes.push(KeyValue::new("server.address", address));
        attributes.push(KeyValue::new("server.port", i64::from(port)));
    }
    if let Err(error) = result {
        attributes.push(KeyValue::new("error.type", error.kind().name()));
    }
    meter
        .f64_histogram("gen_ai.client.operation.duration")
        .with_unit("s")
        .with_description("GenAI operation duration")
        .with_boundaries(SECONDS.to_vec())
        .build()
        .record(elapsed.as_secs_f64(), &attributes);
    if let Ok(res) = result {
        let tokens = meter
            .u64_histogram("gen_ai.client.token.usage")
            .with_unit("{token}")
            .with_description("Number of input and output tokens used")
            .with_boundaries(TOKENS.to_vec())
            .build();
        for (kind, count) in [
            ("input", res.usage.input_tokens),
            ("output", res.usage.output_tokens),
        ] {
            let mut attributes = attributes.clone();
            attributes.push(KeyValue::new("gen_ai.token.type", kind));
            tokens.record(count, &attributes);
        }
    }
}
