//! What real servers send and how they behave, each found against one: tool-call deltas
//! without an index, `null` where a field may be absent, cumulative usage at the end of a
//! stream, connections kept alive, servers that stall, base URLs with and without their
//! version, and errors that name where they went.

#![cfg(all(feature = "openai", feature = "anthropic", feature = "gemini"))]

mod common;

use std::time::{Duration, Instant};

use serde_json::json;
use tower::ServiceBuilder;
use tower_agent_core::{ErrorKind, FinishReason, Message, ModelRequest, RunContext, Usage};
use tower_agent_layers::RetryLayer;
use tower_agent_layers::retry::RetryPolicy;
use tower_agent_providers::{Anthropic, Gemini, OpenAi};

use common::{Canned, Server, call};

fn request() -> ModelRequest {
    let mut req = ModelRequest::new(vec![Message::user("What is the capital of France?")]);
    req.ctx = RunContext::new();
    req
}

#[tokio::test]
async fn tool_call_deltas_without_an_index_are_told_apart_by_their_ids() {
    // Gemini's OpenAI-compatible endpoint: no `index`, an id on each new call, and a
    // fragment without either that continues the call before it.
    let server = Server::start([Canned::fixture("openai/calls_without_index.sse")]).await;
    let model = OpenAi::new("gemini-2.5-flash").base_url(format!("{}/v1", server.url));
    let res = call(model, request()).await.expect("streamed");
    let calls: Vec<(String, String, serde_json::Value)> = res
        .message
        .tool_calls()
        .map(|c| {
            let args = serde_json::from_str(&c.arguments).expect("JSON arguments");
            (c.id.clone(), c.name.clone(), args)
        })
        .collect();
    assert_eq!(
        calls,
        [
            (
                "function-call-17690".to_owned(),
                "read_file".to_owned(),
                json!({"path": "src/main.rs"})
            ),
            (
                "function-call-17691".to_owned(),
                "search_code".to_owned(),
                json!({"query": "fn main"})
            ),
            (
                "function-call-17692".to_owned(),
                "run_command".to_owned(),
                json!({"command": "cargo test"})
            ),
        ]
    );
    assert_eq!(res.finish_reason, FinishReason::ToolCalls);
    assert_eq!(res.usage, Usage::new(212, 61));
}

#[tokio::test]
async fn null_and_absent_are_alike() {
    // Inception's Mercury: `"tool_calls": null` in every text delta, `null` details.
    let server = Server::start([
        Canned::fixture("openai/null_tool_calls.sse"),
        Canned::fixture("openai/nulls.json"),
    ])
    .await;
    let model = OpenAi::new("mercury-coder").base_url(format!("{}/v1", server.url));
    let res = call(model.clone(), request()).await.expect("streamed");
    assert_eq!(res.message.text(), "Paris is the capital.");
    assert_eq!(res.usage, Usage::new(21, 6));
    let res = call(model.streaming(false), request())
        .await
        .expect("whole");
    assert_eq!(res.message.text(), "Paris is the capital.");
    assert_eq!(res.message.tool_calls().count(), 0);

    // The same in Anthropic's and Gemini's bodies.
    // Anthropic's stream with `"usage": null` where it starts.
    let server = Server::start([Canned::sse(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":null}}\n\n\
         event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"Paris.\"}}\n\n\
         event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":null}\n\n\
         event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    )])
    .await;
    let res = call(Anthropic::new("claude").base_url(&server.url), request())
        .await
        .expect("usage null");
    assert_eq!(res.message.text(), "Paris.");

    let anthropic = json!({
        "content": [{"type": "text", "text": "Paris.", "citations": null}],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 9, "output_tokens": 2, "cache_read_input_tokens": null,
                  "cache_creation_input_tokens": null}
    });
    let gemini = json!({
        "candidates": [{"content": {"parts": [{"text": "Paris.", "thought": null}], "role": "model"},
                        "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 2,
                          "thoughtsTokenCount": null, "cachedContentTokenCount": null}
    });
    let server = Server::start([
        Canned::json(200, anthropic.to_string()),
        Canned::json(200, gemini.to_string()),
    ])
    .await;
    let anthropic = Anthropic::new("claude")
        .base_url(&server.url)
        .streaming(false);
    let res = call(anthropic, request()).await.expect("anthropic");
    assert_eq!(
        (res.message.text().as_str(), res.usage),
        ("Paris.", Usage::new(9, 2))
    );
    let gemini = Gemini::new("gemini").base_url(&server.url).streaming(false);
    let res = call(gemini, request()).await.expect("gemini");
    assert_eq!(
        (res.message.text().as_str(), res.usage),
        ("Paris.", Usage::new(9, 2))
    );
}

#[tokio::test]
async fn an_answer_that_cannot_be_read_is_not_paid_for_again() {
    // A whole body that is not the provider's JSON: the retry policy does not re-send it.
    let server = Server::start([
        Canned::json(200, "<html>Bad gateway</html>"),
        Canned::fixture("openai/text.json"),
    ])
    .await;
    let model = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::new()))
        .service(
            OpenAi::new("m")
                .base_url(format!("{}/v1", server.url))
                .streaming(false),
        );
    let err = call(model, request()).await.expect_err("not JSON");
    assert_eq!(err.kind(), ErrorKind::InvalidResponse);
    assert!(err.message().contains("the response is not valid"), "{err}");
    assert_eq!(server.received().len(), 1, "not re-sent");
}

#[tokio::test]
async fn anthropic_usage_is_the_cumulative_count_of_message_delta() {
    // With server tools, `message_delta` counts more input than `message_start` did.
    let server = Server::start([Canned::fixture("anthropic/server_tools.sse")]).await;
    let model = Anthropic::new("claude-sonnet-4-5").base_url(&server.url);
    let res = call(model, request()).await.expect("streamed");
    assert_eq!(res.usage, Usage::new(10_682 + 512, 510).with_cached(512));
}

#[tokio::test]
async fn connections_are_kept_for_the_next_call() {
    for provider in ["openai", "anthropic", "openai whole"] {
        let canned = |_| match provider {
            "anthropic" => Canned::fixture("anthropic/thinking_tool.sse"),
            "openai" => Canned::fixture("openai/text.sse"),
            _ => Canned::fixture("openai/text.json"),
        };
        let server = Server::keep_alive((0..20).map(canned)).await;
        // Clones share the HTTP client, and its pool of connections.
        let anthropic = Anthropic::new("m").base_url(&server.url);
        let openai = OpenAi::new("m").base_url(&server.url);
        let whole = OpenAi::new("m").base_url(&server.url).streaming(false);
        for _ in 0..20 {
            let res = match provider {
                "anthropic" => call(anthropic.clone(), request()).await,
                "openai" => call(openai.clone(), request()).await,
                _ => call(whole.clone(), request()).await,
            };
            res.expect("answered");
        }
        assert_eq!(server.received().len(), 20);
        assert_eq!(
            server.connections(),
            1,
            "{provider}: one connection for 20 calls"
        );
    }
}

#[tokio::test]
async fn a_kept_connection_the_server_closed_is_replaced_at_once() {
    let server = Server::one_answer_per_connection([
        Canned::fixture("openai/text.json"),
        Canned::fixture("openai/text.json"),
    ])
    .await;
    let model = OpenAi::new("m").base_url(&server.url).streaming(false);
    call(model.clone(), request()).await.expect("first");
    // Sent on the kept connection, which closes without an answer; sent again on a new one.
    let started = Instant::now();
    let res = call(model, request())
        .await
        .expect("second, on a new connection");
    assert_eq!(res.message.text(), "Paris is the capital of France.");
    assert_eq!(server.received().len(), 3);
    assert_eq!(server.connections(), 2);
    assert!(started.elapsed() < Duration::from_secs(1), "no backoff");
}

#[tokio::test]
async fn a_stalled_server_times_out_and_the_policy_tries_again() {
    // Nothing at all after the request.
    let server = Server::stalling(b"").await;
    let model = OpenAi::new("m")
        .base_url(&server.url)
        .idle_timeout(Duration::from_millis(200));
    let started = Instant::now();
    let err = call(model.clone(), request()).await.expect_err("stalled");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(
        err.message().contains("no byte from http://127.0.0.1:"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // The head and two events, then silence.
    let server = Server::stalling(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
          3b\r\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Par\"}}]}\n\n\r\n",
    )
    .await;
    let model = OpenAi::new("m")
        .base_url(&server.url)
        .idle_timeout(Duration::from_millis(200));
    let err = call(model.clone(), request()).await.expect_err("stalled");
    assert_eq!(err.kind(), ErrorKind::Timeout);

    // Retried, as a transient failure.
    let retried = ServiceBuilder::new()
        .layer(RetryLayer::new(
            RetryPolicy::new()
                .max_attempts(2)
                .base(Duration::from_millis(1))
                .jitter(Duration::ZERO),
        ))
        .service(model);
    let err = call(retried, request()).await.expect_err("stalled twice");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(
        server.received().len(),
        3,
        "the first call, then two attempts"
    );
}

#[tokio::test]
async fn the_idle_timeout_counts_every_byte_and_bounds_every_read() {
    // A quiet model behind a server that keeps the stream alive with comments for 1 s: no
    // event for longer than the idle timeout, but bytes all along.
    static KEPT_ALIVE: &[(u64, &[u8])] = &[
        (0, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"),
        (150, b": PROCESSING\n\n"),
        (150, b": PROCESSING\n\n"),
        (150, b": PROCESSING\n\n"),
        (150, b": PROCESSING\n\n"),
        (150, b": PROCESSING\n\n"),
        (150, b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Paris.\"},\"finish_reason\":\"stop\"}]}\n\n"),
        (0, b"data: [DONE]\n\n"),
    ];
    let server = Server::trickling(KEPT_ALIVE).await;
    let model = OpenAi::new("m")
        .base_url(&server.url)
        .idle_timeout(Duration::from_millis(400));
    let res = call(model, request())
        .await
        .expect("kept alive by its comments");
    assert_eq!(res.message.text(), "Paris.");

    // An error whose body stalls after its head: the error, not a hang.
    let server = Server::stalling(
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 200\r\n\r\n{\"error\": ",
    )
    .await;
    let model = OpenAi::new("m")
        .base_url(&server.url)
        .idle_timeout(Duration::from_millis(200));
    let started = Instant::now();
    let err = call(model, request()).await.expect_err("503");
    assert!(matches!(err.kind(), ErrorKind::Overloaded { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // A whole answer whose body stalls after its head.
    let server =
        Server::stalling(b"HTTP/1.1 200 OK\r\ncontent-length: 500\r\n\r\n{\"choices\": ").await;
    let model = OpenAi::new("m")
        .base_url(&server.url)
        .streaming(false)
        .idle_timeout(Duration::from_millis(200));
    let err = call(model, request()).await.expect_err("stalled body");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
}

#[tokio::test]
async fn base_urls_are_accepted_with_and_without_their_version() {
    for base in ["", "/v1", "/v1/"] {
        let server = Server::start([
            Canned::fixture("openai/text.json"),
            Canned::fixture("anthropic/text.json"),
        ])
        .await;
        let url = format!("{}{base}", server.url);
        let openai = OpenAi::new("m").base_url(&url).streaming(false);
        call(openai, request()).await.expect("openai");
        let anthropic = Anthropic::new("m").base_url(&url).streaming(false);
        call(anthropic, request()).await.expect("anthropic");
        let paths: Vec<String> = server.received().into_iter().map(|r| r.path).collect();
        assert_eq!(
            paths,
            ["/v1/chat/completions", "/v1/messages"],
            "base {base:?}"
        );
    }
    for base in ["", "/v1beta"] {
        let server = Server::start([Canned::json(
            200,
            json!({"candidates": [{"content": {"parts": [{"text": "ok"}]}, "finishReason": "STOP"}]})
                .to_string(),
        )])
        .await;
        let gemini = Gemini::new("g")
            .base_url(format!("{}{base}", server.url))
            .streaming(false);
        call(gemini, request()).await.expect("gemini");
        assert_eq!(
            server.received()[0].path,
            "/v1beta/models/g:generateContent"
        );
    }
}

#[tokio::test]
async fn a_404_names_the_url_and_says_to_check_the_base_url() {
    let not_found = || Canned::json(404, r#"{"error":{"message":"File Not Found"}}"#);
    let server = Server::start([not_found(), not_found()]).await;
    // A path the server does not serve.
    let model = OpenAi::new("m")
        .base_url(format!("{}/api/v2", server.url))
        .streaming(false);
    let err = call(model, request()).await.expect_err("404");
    assert_eq!(err.kind(), ErrorKind::BadRequest);
    let message = err.message();
    assert!(message.contains("HTTP 404"), "{message}");
    assert!(
        message.contains(&format!("POST {}/api/v2/chat/completions", server.url)),
        "{message}"
    );
    assert!(message.contains("check the base URL"), "{message}");
    let model = Anthropic::new("m").base_url(&server.url).streaming(false);
    let err = call(model, request()).await.expect_err("404");
    assert!(err.message().contains("https://api.anthropic.com"), "{err}");
}

#[tokio::test]
async fn a_refused_connection_names_the_url_without_secrets_and_keeps_its_cause() {
    // A port nobody listens on.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let model = OpenAi::new("m")
        .base_url(format!("http://user:hunter2@127.0.0.1:{port}/v1"))
        .api_key("sk-SECRET-KEY");
    let err = call(model, request()).await.expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::Unreachable);
    let text = format!("{err} {err:?}");
    assert!(
        text.contains(&format!(
            "cannot connect to http://127.0.0.1:{port}/v1/chat/completions"
        )),
        "{text}"
    );
    for secret in ["hunter2", "SECRET", "user"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    let source = std::error::Error::source(&err).expect("the cause is kept");
    assert!(
        source.to_string().contains("error sending request"),
        "{source}"
    );
}

#[test]
fn the_session_goes_as_prompt_cache_key_to_openai_only() {
    let mut req = request();
    req.ctx = RunContext::new().with_session_id("session-7");
    let key = |model: OpenAi, req: &ModelRequest| {
        let body: serde_json::Value =
            serde_json::from_slice(&model.request_body(req).expect("encodes")).expect("JSON");
        body.get("prompt_cache_key").cloned()
    };
    let openai = || OpenAi::new("gpt-4o").base_url("https://api.openai.com/v1");
    let local = || OpenAi::new("qwen3").base_url("http://127.0.0.1:8080/v1");
    assert_eq!(key(openai(), &req), Some(json!("session-7")));
    // A compatible server may refuse a field it does not know: only when asked.
    assert_eq!(key(local(), &req), None);
    assert_eq!(
        key(local().prompt_cache_key(true), &req),
        Some(json!("session-7"))
    );
    assert_eq!(key(openai().prompt_cache_key(false), &req), None);
    // A context with no session sends no key.
    req.ctx = RunContext::new().with_session_id("");
    assert_eq!(key(openai(), &req), None);
}

/// llama.cpp's answer to a call whose arguments it cannot parse.
const UNPARSABLE: &str = r#"{"error":{"code":500,"message":"Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] parse error at line 1, column 21","type":"server_error"}}"#;

#[tokio::test]
async fn a_cut_call_in_the_session_goes_as_valid_json_and_a_refusal_costs_one_attempt() {
    use tower_agent_core::{ToolCall, ToolResult};

    let server = Server::start([
        Canned::json(500, UNPARSABLE),
        Canned::json(500, UNPARSABLE),
        Canned::fixture("openai/text.json"),
    ])
    .await;
    let model = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::new()))
        .service(
            OpenAi::new("m")
                .base_url(format!("{}/v1", server.url))
                .streaming(false),
        );
    // A refusal of the request itself (an HTTP 500 that says so) is not sent again.
    let refused = call(model.clone(), ModelRequest::new(vec![Message::user("hi")]))
        .await
        .expect_err("refused");
    assert_eq!(refused.kind(), ErrorKind::BadRequest);
    assert_eq!(server.received().len(), 1, "one attempt");

    // A session holding a call cut off mid-arguments: the wire carries valid JSON.
    let cut = ToolCall::raw("c1", "refund", r#"{"order": "A-1", "amo"#);
    let req = ModelRequest::new(vec![
        Message::user("Refund A-1."),
        Message::assistant_with_calls("", [cut.clone()]),
        Message::tool_result(ToolResult::error(&cut, ToolResult::TRUNCATED)),
    ]);
    let _ = call(model, req).await;
    let sent = server.received()[1].json();
    let arguments = sent["messages"][1]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .expect("a string");
    let parsed: serde_json::Value = serde_json::from_str(arguments).expect("valid JSON");
    assert_eq!(parsed["_arguments"], r#"{"order": "A-1", "amo"#);
}

#[tokio::test]
async fn a_refused_connection_fails_within_seconds_and_says_so() {
    use tower_agent_core::Event;
    use tower_agent_test::EventRecorder;

    // Nothing listens on port 9.
    let model = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::new()))
        .service(OpenAi::new("m").base_url("http://127.0.0.1:9/v1"));
    let recorder = EventRecorder::new();
    let mut req = ModelRequest::new(vec![Message::user("hi")]);
    req.ctx = RunContext::new().with_observer(recorder.clone());
    let started = Instant::now();
    let error = call(model, req).await.expect_err("nothing listens");
    let took = started.elapsed();
    assert_eq!(error.kind(), ErrorKind::Unreachable);
    assert!(error.to_string().contains("cannot connect"), "{error}");
    let retries = recorder
        .events()
        .iter()
        .filter(|e| matches!(e, Event::Retrying { .. }))
        .count();
    assert_eq!(retries, 1, "two attempts, the retry told");
    // One wait of the backoff (1 s, plus up to 2 s of jitter): seconds, not minutes.
    assert!(took < Duration::from_secs(10), "{took:?}");
    println!("a refused connection failed after {took:?}");
}
