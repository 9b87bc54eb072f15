//! Classification with each provider's own words (`ERRORS` in its module): with every
//! provider on. Apart from `classify.rs`, which names no provider.

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tower_agent_core::ErrorKind;

use crate::classify::{ErrorWords, classify, stream_error};
use crate::key::ApiKey;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| {
            (
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            )
        })
        .collect()
}

/// The words of the provider named.
fn words(provider: &str) -> ErrorWords {
    match provider {
        "anthropic" => crate::anthropic::ERRORS,
        "gemini" => crate::gemini::ERRORS,
        _ => crate::openai::ERRORS,
    }
}

fn kind(provider: &'static str, status: u16, pairs: &[(&str, &str)], body: &str) -> ErrorKind {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    classify(
        provider,
        &words(provider),
        StatusCode::from_u16(status).expect("status"),
        &headers(pairs),
        body,
        None,
        now,
    )
    .kind()
}

fn waits(pairs: &[(&str, &str)], body: &str) -> Option<Duration> {
    kind("openai", 429, pairs, body).retry_after()
}

#[test]
fn the_wait_comes_from_the_first_header_found() {
    assert_eq!(
        waits(&[("retry-after", "7")], ""),
        Some(Duration::from_secs(7))
    );
    assert_eq!(
        waits(&[("retry-after", "1.5")], ""),
        Some(Duration::from_millis(1500))
    );
    // An HTTP date 30 s after "now".
    assert_eq!(
        waits(&[("retry-after", "Tue, 14 Nov 2023 22:13:50 GMT")], ""),
        Some(Duration::from_secs(30))
    );
    assert_eq!(
        waits(&[("retry-after-ms", "250")], ""),
        Some(Duration::from_millis(250))
    );
    assert_eq!(
        waits(
            &[
                ("x-ratelimit-reset-requests", "1s"),
                ("x-ratelimit-reset-tokens", "6m0s")
            ],
            ""
        ),
        Some(Duration::from_secs(360))
    );
    assert_eq!(
        waits(
            &[("retry-after", "2"), ("x-ratelimit-reset-tokens", "6m0s")],
            ""
        ),
        Some(Duration::from_secs(2)),
        "Retry-After wins"
    );
    let anthropic = [
        ("anthropic-ratelimit-requests-reset", "2023-11-14T22:13:25Z"),
        ("anthropic-ratelimit-tokens-reset", "2023-11-14T22:13:40Z"),
    ];
    assert_eq!(
        kind("anthropic", 429, &anthropic, "").retry_after(),
        Some(Duration::from_secs(20))
    );
    // Each provider reads its own reset headers only.
    assert_eq!(waits(&anthropic, ""), None);
    assert_eq!(
        kind(
            "anthropic",
            429,
            &[("x-ratelimit-reset-tokens", "6m0s")],
            ""
        )
        .retry_after(),
        None
    );
    let gemini = r#"{"error":{"code":429,"message":"Resource exhausted","status":"RESOURCE_EXHAUSTED",
        "details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"34s"}]}}"#;
    assert_eq!(
        kind("gemini", 429, &[], gemini).retry_after(),
        Some(Duration::from_secs(34))
    );
    assert_eq!(
        waits(&[("retry-after", "soon")], ""),
        None,
        "unreadable: no wait"
    );
}

#[test]
fn each_class_is_recognized() {
    let openai_quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    assert_eq!(
        kind("openai", 429, &[], openai_quota),
        ErrorKind::QuotaExhausted
    );
    assert!(matches!(
        kind("openai", 429, &[], "{}"),
        ErrorKind::RateLimited { .. }
    ));
    assert!(matches!(
        kind("anthropic", 529, &[], "{}"),
        ErrorKind::Overloaded { .. }
    ));
    assert!(
        matches!(kind("openai", 503, &[("retry-after", "3")], ""), ErrorKind::Overloaded { retry_after: Some(d) } if d == Duration::from_secs(3))
    );
    assert_eq!(kind("openai", 500, &[], ""), ErrorKind::Server);
    // llama.cpp's answer to a call's arguments it cannot parse: the same body fails again.
    let unparsable = r#"{"error":{"code":500,"message":"Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] parse error","type":"server_error"}}"#;
    assert_eq!(kind("openai", 500, &[], unparsable), ErrorKind::BadRequest);
    let invalid = r#"{"error":{"message":"bad","type":"invalid_request_error"}}"#;
    assert_eq!(kind("anthropic", 500, &[], invalid), ErrorKind::BadRequest);
    assert_eq!(
        kind("openai", 502, &[], "<html>bad gateway</html>"),
        ErrorKind::Server
    );
    assert_eq!(kind("openai", 401, &[], ""), ErrorKind::Auth);
    assert_eq!(kind("gemini", 403, &[], ""), ErrorKind::Auth);
    let openai_long = r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","code":"context_length_exceeded"}}"#;
    assert_eq!(
        kind("openai", 400, &[], openai_long),
        ErrorKind::ContextTooLong
    );
    let llama = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#;
    assert_eq!(kind("openai", 400, &[], llama), ErrorKind::ContextTooLong);
    // The same server's Anthropic endpoint answers the same (a newer build names sizes).
    let llama = r#"{"error":{"code":400,"message":"request (631 tokens) exceeds the available context size (512 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":631,"n_ctx":512}}"#;
    assert_eq!(
        kind("anthropic", 400, &[], llama),
        ErrorKind::ContextTooLong
    );
    assert_eq!(kind("gemini", 400, &[], llama), ErrorKind::ContextTooLong);
    let anthropic_long = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
    assert_eq!(
        kind("anthropic", 400, &[], anthropic_long),
        ErrorKind::ContextTooLong
    );
    let anthropic_credit = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#;
    assert_eq!(
        kind("anthropic", 400, &[], anthropic_credit),
        ErrorKind::QuotaExhausted
    );
    let gemini_long = r#"{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#;
    assert_eq!(
        kind("gemini", 400, &[], gemini_long),
        ErrorKind::ContextTooLong
    );
    let gemini_quota = r#"{"error":{"code":429,"message":"You exceeded your current quota.","status":"RESOURCE_EXHAUSTED"}}"#;
    assert_eq!(
        kind("gemini", 429, &[], gemini_quota),
        ErrorKind::QuotaExhausted
    );
    assert_eq!(
        kind("openai", 400, &[], r#"{"error":{"message":"bad"}}"#),
        ErrorKind::BadRequest
    );
    assert_eq!(kind("openai", 404, &[], ""), ErrorKind::BadRequest);
    assert_eq!(kind("openai", 413, &[], ""), ErrorKind::ContextTooLong);
}

#[test]
fn an_echoed_key_is_redacted_and_messages_are_clipped() {
    let key = ApiKey::new("sk-live-123456");
    let body = r#"{"error":{"message":"Incorrect API key provided: sk-live-123456."}}"#;
    let error = classify(
        "openai",
        &words("openai"),
        StatusCode::UNAUTHORIZED,
        &HeaderMap::new(),
        body,
        Some(&key),
        SystemTime::now(),
    );
    assert!(!error.to_string().contains("sk-live-123456"), "{error}");
    assert!(
        error.to_string().contains("Incorrect API key provided"),
        "{error}"
    );
    let long = "é".repeat(1000);
    let error = classify(
        "openai",
        &words("openai"),
        StatusCode::BAD_REQUEST,
        &HeaderMap::new(),
        &long,
        None,
        SystemTime::now(),
    );
    assert!(error.message().len() < 600);
}

#[test]
fn errors_inside_a_stream() {
    let overloaded =
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    assert!(matches!(
        stream_error("anthropic", &words("anthropic"), overloaded, None).kind(),
        ErrorKind::Overloaded { .. }
    ));
    assert_eq!(
        stream_error("openai", &words("openai"), "not json", None).kind(),
        ErrorKind::Server
    );
}
