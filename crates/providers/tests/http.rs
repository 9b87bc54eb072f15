//! Each provider against recorded, real-shaped payloads served on 127.0.0.1: what it sends,
//! what it makes of each answer, each error class, broken streams, keys that never show.

#![cfg(all(feature = "openai", feature = "anthropic", feature = "gemini"))]

mod common;

use std::time::Duration;

use serde_json::json;
use tower::ServiceExt;
use tower_agent_core::{
    AgentRequest, ContentPart, ErrorKind, FinishReason, Message, ModelRequest, RunContext, Session,
    ToolSpec, Usage,
};
use tower_agent_loop::Agent;
use tower_agent_providers::gemini::ContextCacheLayer;
use tower_agent_providers::{Anthropic, Gemini, OpenAi};
use tower_agent_test::{EventRecorder, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;

use common::{Canned, Server, call};

const KEY: &str = "sk-test-SECRET-0123456789";

fn request() -> ModelRequest {
    let mut req = ModelRequest::new(vec![Message::user("What is the capital of France?")]);
    req.system = Some("Be brief.".into());
    req.tools = std::sync::Arc::from(vec![ToolSpec::new(
        "weather",
        "The weather in a city.",
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    )]);
    req
}

/// A request whose context streams events to a recorder.
fn observed() -> (ModelRequest, EventRecorder) {
    let recorder = EventRecorder::new();
    let mut req = request();
    req.ctx = RunContext::new().with_observer(recorder.clone());
    (req, recorder)
}

#[tokio::test]
async fn openai_text_and_what_it_sends() {
    let server = Server::start([Canned::fixture("openai/text.json")]).await;
    let model = OpenAi::new("gpt-4o-mini")
        .base_url(format!("{}/v1", server.url))
        .api_key(KEY)
        .streaming(false);
    let res = call(model, request()).await.expect("answered");
    assert_eq!(res.message.text(), "Paris is the capital of France.");
    assert_eq!(res.usage, Usage::new(24, 8));
    assert_eq!(res.finish_reason, FinishReason::Stop);

    let sent = &server.received()[0];
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    let body = sent.json();
    assert_eq!(body["model"], "gpt-4o-mini");
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(body["tools"][0]["function"]["name"], "weather");
    assert!(body.get("stream").is_none());
}

#[tokio::test]
async fn openai_streams_deltas_and_assembles_parallel_calls() {
    let server = Server::start([
        Canned::fixture("openai/text.sse"),
        Canned::fixture("openai/parallel_calls.sse"),
    ])
    .await;
    let model = OpenAi::new("gpt-4o-mini")
        .base_url(format!("{}/v1", server.url))
        .api_key(KEY);
    let (req, recorder) = observed();
    let res = call(model.clone(), req).await.expect("streamed");
    assert_eq!(res.message.text(), "Paris is the capital.");
    assert_eq!(recorder.text_deltas(), ["Par", "is is", " the capital."]);
    assert_eq!(res.usage, Usage::new(24, 6));
    assert_eq!(
        server.received()[0].json()["stream_options"],
        json!({"include_usage": true})
    );

    let res = call(model, request()).await.expect("streamed");
    let calls: Vec<_> = res
        .message
        .tool_calls()
        .map(|c| (c.id.clone(), c.arguments.clone()))
        .collect();
    assert_eq!(
        calls,
        [
            ("call_Wp1".to_owned(), r#"{"city": "Paris"}"#.to_owned()),
            ("call_Wp2".to_owned(), r#"{"city": "Oslo"}"#.to_owned()),
        ]
    );
    assert_eq!(res.finish_reason, FinishReason::ToolCalls);
    assert_eq!(res.usage, Usage::new(80, 40).with_cached(64));
}

#[tokio::test]
async fn a_truncated_stream_is_an_error_not_half_a_message() {
    let server = Server::start([Canned::fixture("openai/truncated.sse")]).await;
    let model = OpenAi::new("m").base_url(format!("{}/v1", server.url));
    let req = request();
    let given = req.deltas.clone();
    let err = call(model, req).await.expect_err("cut off");
    assert_eq!(err.kind(), ErrorKind::Server);
    assert!(err.message().contains("ended before"), "{err}");
    assert!(!given.delivered(), "nobody read its deltas");
    // A reader got "Par" before the cut: the request says part of it went up.
    let server = Server::start([Canned::fixture("openai/truncated.sse")]).await;
    let model = OpenAi::new("m").base_url(format!("{}/v1", server.url));
    let mut req = request();
    req.ctx =
        tower_agent_core::RunContext::new().with_observer(tower_agent_test::EventRecorder::new());
    let given = req.deltas.clone();
    let err = call(model, req).await.expect_err("cut off");
    assert_eq!(err.kind(), ErrorKind::Server);
    assert!(given.delivered(), "{err:?}");

    // A chunk that arrived whole but is not JSON: not worth paying for the answer again.
    let server = Server::start([Canned::sse("data: {\"choices\": [\n\n")]).await;
    let model = OpenAi::new("m").base_url(format!("{}/v1", server.url));
    let err = call(model, request()).await.expect_err("invalid JSON");
    assert_eq!(err.kind(), ErrorKind::InvalidResponse);
    assert!(!err.is_transient(), "{err}");
}

#[tokio::test]
async fn openai_error_classes_over_http() {
    let server = Server::start([
        Canned::json(
            429,
            std::fs::read("tests/fixtures/openai/rate_limited.json").expect("fixture"),
        )
        .header("x-ratelimit-reset-requests", "20s")
        .header("retry-after", "7"),
        Canned::json(
            400,
            std::fs::read("tests/fixtures/openai/context_too_long.json").expect("fixture"),
        ),
        Canned::json(
            401,
            format!(r#"{{"error":{{"message":"Incorrect API key provided: {KEY}."}}}}"#),
        ),
        Canned::json(503, "upstream connect error").header("retry-after", "3"),
    ])
    .await;
    let model = OpenAi::new("m")
        .base_url(format!("{}/v1", server.url))
        .api_key(KEY);
    let limited = call(model.clone(), request()).await.expect_err("429");
    assert_eq!(
        limited.kind(),
        ErrorKind::RateLimited {
            retry_after: Some(Duration::from_secs(7))
        }
    );
    let long = call(model.clone(), request()).await.expect_err("400");
    assert_eq!(long.kind(), ErrorKind::ContextTooLong);
    let auth = call(model.clone(), request()).await.expect_err("401");
    assert_eq!(auth.kind(), ErrorKind::Auth);
    assert!(
        !format!("{auth} {auth:?}").contains(KEY),
        "the echoed key is redacted: {auth}"
    );
    let overloaded = call(model, request()).await.expect_err("503");
    assert_eq!(
        overloaded.kind(),
        ErrorKind::Overloaded {
            retry_after: Some(Duration::from_secs(3))
        }
    );
}

#[tokio::test]
async fn keys_never_show_in_debug_or_transport_errors() {
    // Nothing listens on port 9; the URL itself carries a key, as a careless base URL might.
    let model = OpenAi::new("m")
        .base_url(format!("http://127.0.0.1:9/v1?key={KEY}"))
        .api_key(KEY);
    assert!(!format!("{model:?}").contains(KEY));
    let err = call(model, request()).await.expect_err("cannot connect");
    assert_eq!(err.kind(), ErrorKind::Unreachable);
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains(KEY), "{shown}");
    assert!(shown.contains("cannot connect"), "{shown}");
    for model in [
        format!("{:?}", Anthropic::new("c").api_key(KEY)),
        format!("{:?}", Gemini::new("g").api_key(KEY)),
    ] {
        assert!(!model.contains(KEY), "{model}");
    }
}

#[tokio::test]
async fn anthropic_streams_thinking_text_and_parallel_calls() {
    let server = Server::start([
        Canned::fixture("anthropic/thinking_tool.sse"),
        Canned::fixture("anthropic/text.json"),
    ])
    .await;
    let model = Anthropic::new("claude-sonnet-4-5")
        .base_url(&server.url)
        .api_key(KEY);
    let (req, recorder) = observed();
    let res = call(model.clone(), req).await.expect("streamed");
    let kinds: Vec<&str> = res
        .message
        .content
        .iter()
        .map(|p| match p {
            ContentPart::Reasoning {
                signature: Some(_), ..
            } => "thinking",
            ContentPart::Text { .. } => "text",
            ContentPart::ToolCall(_) => "call",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["thinking", "text", "call", "call"]);
    assert_eq!(
        res.message
            .tool_calls()
            .nth(1)
            .map(|c| c.arguments.as_str()),
        Some(r#"{"city": "Oslo"}"#)
    );
    assert_eq!(res.usage, Usage::new(2458, 89).with_cached(2048));
    assert_eq!(res.finish_reason, FinishReason::ToolCalls);
    assert_eq!(recorder.text_deltas(), ["I'll check both."]);
    assert!(recorder.names().contains(&"reasoning_delta"));

    let sent = &server.received()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.header("x-api-key"), Some(KEY));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    // The system prompt goes as a block with a cache marker (prompt caching is on by default).
    assert_eq!(
        sent.json()["system"],
        serde_json::json!([
            { "type": "text", "text": "Be brief.", "cache_control": { "type": "ephemeral" } }
        ])
    );

    // Non-streamed, the thinking goes back in the next request.
    let model = model.streaming(false);
    let mut next = request();
    next.messages.push(res.message.clone());
    call(model, next).await.expect("answered");
    let sent = server.received()[1].json();
    assert_eq!(sent["messages"][1]["content"][0]["type"], "thinking");
    assert_eq!(
        sent["messages"][1]["content"][0]["signature"],
        "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
    );
}

#[tokio::test]
async fn anthropic_overloaded_inside_a_200_stream() {
    let server = Server::start([Canned::fixture("anthropic/overloaded.sse")]).await;
    let model = Anthropic::new("c").base_url(&server.url);
    let err = call(model, request())
        .await
        .expect_err("overloaded mid-stream");
    assert!(matches!(err.kind(), ErrorKind::Overloaded { .. }), "{err}");
}

#[tokio::test]
async fn gemini_streams_and_calls_with_signatures() {
    let server = Server::start([
        Canned::fixture("gemini/text.sse"),
        Canned::fixture("gemini/calls.json"),
        Canned::fixture("gemini/empty.json"),
    ])
    .await;
    let model = Gemini::new("gemini-2.5-flash")
        .base_url(format!("{}/v1beta", server.url))
        .api_key(KEY);
    let (req, recorder) = observed();
    let res = call(model.clone(), req).await.expect("streamed");
    assert_eq!(res.message.text(), "Paris is the capital of France.");
    assert_eq!(res.usage, Usage::new(9, 31));
    assert_eq!(res.response_id(), Some("x1"));
    assert_eq!(res.response_model(), Some("gemini-2.5-flash"));
    assert_eq!(recorder.text_deltas().len(), 2);
    let sent = &server.received()[0];
    assert_eq!(
        sent.path,
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
    assert_eq!(sent.header("x-goog-api-key"), Some(KEY));
    assert!(!sent.path.contains(KEY));

    let model = model.streaming(false);
    let res = call(model.clone(), request()).await.expect("calls");
    assert_eq!(res.message.tool_calls().count(), 2);
    assert_eq!(res.finish_reason, FinishReason::ToolCalls);
    assert!(
        matches!(&res.message.content[0], ContentPart::Reasoning { signature: Some(s), .. } if s == "CiQBVKhc7mS2yEeM3Lk4Nv0")
    );
    assert_eq!(
        server.received()[1].path,
        "/v1beta/models/gemini-2.5-flash:generateContent"
    );

    let err = call(model, request()).await.expect_err("empty candidates");
    assert_eq!(err.kind(), ErrorKind::EmptyResponse);
}

#[tokio::test]
async fn an_agent_runs_end_to_end_over_http() {
    let server = Server::start([
        Canned::fixture("openai/parallel_calls.sse"),
        Canned::fixture("openai/text.sse"),
    ])
    .await;
    let model = OpenAi::new("gpt-4o-mini").base_url(format!("{}/v1", server.url));
    let tools = ToolSet::new().tool(StubTool::returning("weather", "18°C"));
    let agent = Agent::builder()
        .tool_specs(tools.specs())
        .build(model, tools);
    let res = agent
        .oneshot(AgentRequest::new(
            Session::new(),
            "Weather in Paris and Oslo?",
        ))
        .await
        .expect("completes");
    assert_eq!(res.text().as_deref(), Some("Paris is the capital."));
    assert_valid_history(&res.session.history);
    let second = server.received()[1].json();
    let roles: Vec<&str> = second["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["role"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(roles, ["user", "assistant", "tool", "tool"]);
    assert_eq!(second["messages"][2]["tool_call_id"], "call_Wp1");
    assert_eq!(second["messages"][3]["content"], "18°C");
}

#[tokio::test]
async fn gemini_thought_summaries_and_signatures_round_trip() {
    let server = Server::start([
        Canned::fixture("gemini/thinking_call.sse"),
        Canned::fixture("gemini/text.sse"),
    ])
    .await;
    let model = Gemini::new("gemini-2.5-pro").base_url(format!("{}/v1beta", server.url));
    let (req, recorder) = observed();
    let res = call(model.clone(), req).await.expect("streamed");
    assert!(
        matches!(&res.message.content[0], ContentPart::Reasoning { text, signature: None } if text.contains("Planning the lookup"))
    );
    assert!(
        matches!(&res.message.content[1], ContentPart::Reasoning { text, signature: Some(s) } if text.is_empty() && s == "CrQCAdHtim9a")
    );
    assert_eq!(res.message.tool_calls().count(), 1);
    assert_eq!(res.usage, Usage::new(40, 52));
    assert!(recorder.names().contains(&"reasoning_delta"));

    // Sent back: the signature on its call, the unsigned summary left out.
    let mut next = request();
    next.messages.push(res.message.clone());
    call(model, next).await.expect("answered");
    let sent = server.received()[1].json();
    let parts = &sent["contents"][1]["parts"];
    assert_eq!(parts.as_array().map(Vec::len), Some(1), "{sent}");
    assert_eq!(parts[0]["thoughtSignature"], "CrQCAdHtim9a");
    assert_eq!(parts[0]["functionCall"]["name"], "weather");
}

#[tokio::test]
async fn an_anthropic_stream_cut_before_message_stop_is_an_error() {
    let server = Server::start([Canned::fixture("anthropic/truncated.sse")]).await;
    let model = Anthropic::new("c").base_url(&server.url);
    let err = call(model, request()).await.expect_err("cut off");
    assert_eq!(err.kind(), ErrorKind::Server);
    assert!(err.message().contains("ended before"), "{err}");
}

#[tokio::test]
async fn a_priced_provider_puts_each_calls_cost_in_its_usage() {
    use tower_agent_core::Cost;
    use tower_agent_providers::PriceTable;
    let server = Server::start([
        Canned::fixture("openai/parallel_calls.sse"),
        Canned::fixture("openai/parallel_calls.sse"),
    ])
    .await;
    let table = PriceTable::from_json(
        r#"{"gpt-4o": {"input": 2.5, "output": 10},
            "gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.6}}"#,
    )
    .expect("a table");
    let model = OpenAi::new("gpt-4o-mini-2024-07-18")
        .base_url(format!("{}/v1", server.url))
        .api_key(KEY)
        .prices(&table);
    let res = call(model, request()).await.expect("streamed");
    // 80 input tokens, 64 of them cached, 40 output, at the mini's prices (not gpt-4o's).
    let expected = (16.0 * 0.15 + 64.0 * 0.075 + 40.0 * 0.6) / 1e6;
    assert_eq!(res.usage.cost, Cost::from_dollars(expected));
    assert_eq!(
        res.usage,
        Usage::new(80, 40)
            .with_cached(64)
            .with_cost(Cost::from_dollars(expected))
    );

    // A model the table does not have is not priced.
    let unpriced = OpenAi::new("o3")
        .base_url(format!("{}/v1", server.url))
        .api_key(KEY)
        .prices(&table);
    let res = call(unpriced, request()).await.expect("streamed");
    assert_eq!(res.usage.cost, Cost::ZERO);
}

/// A Gemini answer whose prompt was read partly from a context cache.
fn gemini_answer() -> Canned {
    Canned::json(
        200,
        json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": "Paris."}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 1500, "candidatesTokenCount": 2, "cachedContentTokenCount": 1200}
        })
        .to_string(),
    )
}

#[tokio::test]
async fn gemini_context_cache_is_made_once_and_named_after() {
    let made = r#"{"name": "cachedContents/abc123", "model": "models/gemini-2.5-flash"}"#;
    let gone = r#"{"error": {"code": 404, "message": "CachedContent not found."}}"#;
    let small = r#"{"error": {"code": 400, "message": "Cached content is too small."}}"#;
    let server = Server::start([
        gemini_answer(),          // 1: seen once, sent whole
        Canned::json(200, made),  // 2: seen again: the cache is made...
        gemini_answer(),          //    ...and named
        gemini_answer(),          // 3: named
        Canned::json(404, gone),  // 4: named, but the server lost it...
        gemini_answer(),          //    ...so sent once more, whole
        gemini_answer(),          // 5: another prompt, seen once
        Canned::json(400, small), // 6: the API refuses to cache it...
        gemini_answer(),          //    ...and it goes whole
        gemini_answer(),          // 7: not asked again
        gemini_answer(),          // 8: a short prompt: never cached
    ])
    .await;
    let gemini = Gemini::new("gemini-2.5-flash")
        .base_url(format!("{}/v1beta", server.url))
        .api_key(KEY)
        .streaming(false);
    let layer = ContextCacheLayer::new(&gemini, Duration::from_secs(3600));
    assert!(!format!("{layer:?}").contains(KEY), "the key never shows");
    let model = tower::ServiceBuilder::new().layer(layer).service(gemini);
    let long = |text: &str| {
        let mut req = request();
        req.system = Some(format!("{text} {}", "Answer from the handbook. ".repeat(200)).into());
        req
    };
    let generate = "/v1beta/models/gemini-2.5-flash:generateContent";
    let create = "/v1beta/cachedContents";

    for _ in 0..3 {
        call(model.clone(), long("One.")).await.expect("answered");
    }
    let sent = server.received();
    let paths: Vec<&str> = sent.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, [generate, create, generate, generate]);
    let made = sent[1].json();
    assert_eq!(made["model"], "models/gemini-2.5-flash");
    assert_eq!(made["ttl"], "3600s");
    assert!(
        made["systemInstruction"]["parts"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("One."))
    );
    assert_eq!(
        made["tools"][0]["functionDeclarations"][0]["name"],
        "weather"
    );
    assert_eq!(sent[1].header("x-goog-api-key"), Some(KEY));
    let whole = |body: &serde_json::Value| {
        body.get("cachedContent").is_none()
            && body["systemInstruction"]["parts"][0]["text"].is_string()
    };
    assert!(whole(&sent[0].json()));
    for named in &sent[2..] {
        let body = named.json();
        assert_eq!(body["cachedContent"], "cachedContents/abc123");
        assert!(body.get("systemInstruction").is_none() && body.get("tools").is_none());
        assert_eq!(
            body["contents"][0]["parts"][0]["text"],
            "What is the capital of France?"
        );
    }

    // The server lost the cache: the request goes once more, whole, and succeeds.
    let res = call(model.clone(), long("One."))
        .await
        .expect("answered the second time");
    assert_eq!(res.message.text(), "Paris.");
    // Refused: the request goes whole, and the prefix is not offered again.
    for _ in 0..3 {
        call(model.clone(), long("Two."))
            .await
            .expect("answered without the cache");
    }
    call(model, request()).await.expect("answered");
    let sent = server.received();
    let paths: Vec<&str> = sent[4..].iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            generate, generate, generate, create, generate, generate, generate
        ]
    );
    assert_eq!(sent[4].json()["cachedContent"], "cachedContents/abc123");
    for body in [5, 6, 8, 9, 10].map(|i| sent[i].json()) {
        assert!(whole(&body), "{body}");
    }
}

/// A cancelled run makes no context cache (a request seen twice would make one) and sends
/// nothing: the provider answers it as cancelled.
#[tokio::test]
async fn gemini_context_cache_makes_nothing_for_a_cancelled_run() {
    let server = Server::start([]).await;
    let gemini = Gemini::new("gemini-2.5-flash")
        .base_url(format!("{}/v1beta", server.url))
        .api_key(KEY)
        .streaming(false);
    let model = tower::ServiceBuilder::new()
        .layer(ContextCacheLayer::new(&gemini, Duration::from_secs(3600)))
        .service(gemini);
    for _ in 0..3 {
        let mut req = request();
        req.system = Some(format!("One. {}", "Answer from the handbook. ".repeat(200)).into());
        req.ctx.cancel();
        let error = call(model.clone(), req).await.expect_err("cancelled");
        assert_eq!(error.kind(), ErrorKind::Cancelled);
    }
    assert!(server.received().is_empty(), "{:?}", server.received());
}

#[tokio::test]
async fn every_request_has_a_max_tokens_and_the_hosts_extra_fields() {
    let server = Server::start([
        Canned::fixture("openai/text.json"),
        Canned::fixture("openai/text.json"),
        Canned::fixture("gemini/calls.json"),
    ])
    .await;
    let model = OpenAi::new("local")
        .base_url(format!("{}/v1", server.url))
        .streaming(false)
        .extra_body(json!({"cache_prompt": true, "top_k": 40, "token": "tok-SECRET"}))
        .expect("an object");
    assert!(
        !format!("{model:?}").contains("tok-SECRET"),
        "the extra fields' values never show"
    );
    call(model.clone(), request()).await.expect("answered");
    let sent = server.received()[0].json();
    assert_eq!(sent["max_tokens"], 4096, "the default: {sent}");
    assert_eq!(sent["cache_prompt"], true);
    assert_eq!(sent["top_k"], 40);
    // A request's own wins; the provider's default can be set.
    call(model.max_tokens(256), request())
        .await
        .expect("answered");
    assert_eq!(server.received()[1].json()["max_tokens"], 256);
    let gemini = Gemini::new("gemini-2.5-flash")
        .base_url(format!("{}/v1beta", server.url))
        .api_key(KEY)
        .streaming(false);
    call(gemini, request()).await.expect("answered");
    assert_eq!(
        server.received()[2].json()["generationConfig"]["maxOutputTokens"],
        4096
    );
    let refused = OpenAi::new("m").extra_body(json!(["not", "an", "object"]));
    assert_eq!(
        refused.expect_err("not an object").kind(),
        ErrorKind::BadRequest
    );
}
