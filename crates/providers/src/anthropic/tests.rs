//! Unit tests of the mapping, with recorded payloads.

use serde_json::{Value, json};
use tower_agent_core::{
    ContentPart, ErrorKind, FinishReason, ModelRequest, PromptCache, Role, ToolCall, ToolResult,
    Usage,
};

use crate::encode;
use crate::wire::Delta;

use super::stream::*;
use super::*;

fn wire() -> (AnthropicWire, Endpoint) {
    let endpoint = Endpoint {
        model: "claude".into(),
        base_url: "http://x".into(),
        key: None,
        max_tokens: crate::http::DEFAULT_MAX_TOKENS,
    };
    (AnthropicWire { cache: None }, endpoint)
}

/// The body of `req` with cache markers of `ttl`, as a run's call makes it (the messages'
/// bytes kept across the run's calls, under one provider's `key`).
fn cached_body(req: &ModelRequest, ttl: CacheTtl, key: &encode::KeptKey) -> Value {
    let (mut wire, endpoint) = wire();
    wire.cache = Some(ttl);
    let body = encode::body(&wire, &endpoint, req, false, Some(key)).expect("encodes");
    serde_json::from_slice(&body).expect("json")
}

/// Where the body's cache markers are: `system[i]`, `tools[i]`, `messages[i][j]`.
fn markers(body: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let marked = |v: &Value| !v["cache_control"].is_null();
    for (i, block) in body["system"].as_array().into_iter().flatten().enumerate() {
        if marked(block) {
            found.push(format!("system[{i}]"));
        }
    }
    for (i, tool) in body["tools"].as_array().into_iter().flatten().enumerate() {
        if marked(tool) {
            found.push(format!("tools[{i}]"));
        }
    }
    for (i, message) in body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        for (j, block) in message["content"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if marked(block) {
                found.push(format!("messages[{i}][{j}]"));
            }
        }
    }
    found
}

#[test]
fn cache_markers_go_on_the_stable_system_blocks_and_the_end_of_the_history() {
    let key = encode::KeptKey::new();
    let call = ToolCall::new("t1", "ls", json!({}));
    let mut req = ModelRequest::new(vec![
        Message::user("list"),
        Message::assistant_with_calls("", [call.clone()]),
        Message::tool_result(ToolResult::success(&call, "a.txt")),
    ]);
    req.tools = vec![tower_agent_core::ToolSpec::new("ls", "List.", json!({}))].into();
    req.system = Some("You help.".into());
    req.append_system("Memory: metric units.");
    req.append_system("Answer briefly.");
    let body = cached_body(&req, CacheTtl::FiveMinutes, &key);
    // Each block keeps the blank line after it: joined, they are the prompt. Two markers for
    // the system prompt (memory, instructions: the first block's prefix is in theirs), two
    // for the history.
    assert_eq!(
        body["system"],
        json!([
            { "type": "text", "text": "You help.\n\n" },
            { "type": "text", "text": "Memory: metric units.\n\n", "cache_control": { "type": "ephemeral" } },
            { "type": "text", "text": "Answer briefly.", "cache_control": { "type": "ephemeral" } },
        ])
    );
    // The history's end (the tool result); no previous request in this run yet.
    assert_eq!(markers(&body), ["system[1]", "system[2]", "messages[2][0]"]);
    assert_eq!(body["messages"][2]["content"][0]["type"], "tool_result");

    // A later call of the run reuses the messages' bytes: a marker at the new end, and one
    // where the previous request ended, four in all.
    let mut later = req.clone();
    later.messages.push(Message::assistant("Done."));
    let body = cached_body(&later, CacheTtl::OneHour, &key);
    assert_eq!(
        markers(&body),
        ["system[1]", "system[2]", "messages[2][0]", "messages[3][0]"]
    );
    // The kept bytes stay unmarked: a third call marks its own two.
    let mut third = later.clone();
    third.messages.push(Message::user("And then?"));
    let body = cached_body(&third, CacheTtl::OneHour, &key);
    assert_eq!(
        markers(&body),
        ["system[1]", "system[2]", "messages[3][0]", "messages[4][0]"]
    );
    assert_eq!(
        body["messages"][3]["content"][0]["cache_control"],
        json!({ "type": "ephemeral", "ttl": "1h" })
    );
}

#[test]
fn a_volatile_block_keeps_the_history_unmarked_and_the_latest_marks_win() {
    let key = encode::KeptKey::new();
    let mut req = ModelRequest::new(vec![Message::user("hi")]);
    req.system = Some("a".into());
    for block in ["b", "c", "d", "e"] {
        req.append_system(block);
    }
    req.append_system_volatile("Round 3.");
    let body = cached_body(&req, CacheTtl::FiveMinutes, &key);
    // Five stable blocks, four markers: the last four; none on the history; the volatile
    // block last, unmarked.
    assert_eq!(
        markers(&body),
        ["system[1]", "system[2]", "system[3]", "system[4]"]
    );
    assert_eq!(body["system"][5]["text"], "Round 3.");
    let joined: String = (0..6)
        .map(|i| body["system"][i]["text"].as_str().expect("text").to_owned())
        .collect();
    assert_eq!(Some(joined.as_str()), req.system.as_deref());
    assert!(body["system"][5]["cache_control"].is_null());
}

#[test]
fn with_no_system_prompt_the_tools_are_marked_and_no_cache_means_no_marker() {
    let key = encode::KeptKey::new();
    let mut req = ModelRequest::new(vec![Message::user("hi")]);
    req.tools = vec![
        tower_agent_core::ToolSpec::new("a", "A.", json!({})),
        tower_agent_core::ToolSpec::new("b", "B.", json!({})),
    ]
    .into();
    let body = cached_body(&req, CacheTtl::FiveMinutes, &key);
    assert_eq!(markers(&body), ["tools[1]", "messages[0][0]"]);

    req.system = Some("sys".into());
    let (wire, endpoint) = wire();
    let body: Value = serde_json::from_slice(
        &encode::body(&wire, &endpoint, &req, false, None).expect("encodes"),
    )
    .expect("json");
    assert_eq!(body["system"], "sys");
    assert!(markers(&body).is_empty());
}

#[test]
fn turns_alternate_and_thinking_goes_back() {
    let call = ToolCall::new("t1", "ls", json!({}));
    let bad = ToolCall::raw("t2", "ls", "[1,2]");
    let mut req = ModelRequest::new(vec![
        Message::user("list"),
        Message {
            role: Role::Assistant,
            content: vec![
                ContentPart::Reasoning {
                    text: "let me look".into(),
                    signature: Some("sig".into()),
                },
                ContentPart::Reasoning {
                    text: String::new(),
                    signature: Some(format!("{REDACTED}xyz")),
                },
                ContentPart::Reasoning {
                    text: "from another provider".into(),
                    signature: None,
                },
                ContentPart::ToolCall(call.clone()),
                ContentPart::ToolCall(bad.clone()),
            ],
        },
        Message::tool_result(ToolResult::success(&call, "a.txt")),
        Message::tool_result(ToolResult::error(&bad, "bad args")),
        Message::user("and?"),
        Message::system("be brief"),
    ]);
    req.system = Some("sys".into());
    // The provider sets a request's `max_tokens` when it has none (4096 by default).
    req.options_mut().max_tokens = Some(1000);
    let body: Value = serde_json::from_slice(
        &encode::body(&wire().0, &wire().1, &req, false, None).expect("encodes"),
    )
    .expect("json");
    assert_eq!(
        body,
        json!({
            "model": "claude",
            "max_tokens": 1000,
            "system": "sys\n\nbe brief",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "list"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "let me look", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "xyz"},
                    {"type": "tool_use", "id": "t1", "name": "ls", "input": {}},
                    {"type": "tool_use", "id": "t2", "name": "ls", "input": {"_arguments": "[1,2]"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "bad args", "is_error": true},
                    {"type": "text", "text": "and?"}
                ]}
            ]
        })
    );
}

#[test]
fn a_streamed_answer_with_thinking_and_a_call() {
    let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
    let mut deltas = Vec::new();
    for (event, data) in [
        (
            "message_start",
            r#"{"type":"message_start","message":{"id":"msg_01","model":"claude-sonnet-4-5","usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":1}}}"#,
        ),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"SIG"}}"#,
        ),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
        ),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Let me"}}"#,
        ),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"ls","input":{}}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"path\":"}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"src\"}"}}"#,
        ),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":2}"#,
        ),
        ("ping", r#"{"type":"ping"}"#),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":42}}"#,
        ),
        ("message_stop", r#"{"type":"message_stop"}"#),
    ] {
        let before = deltas.len();
        decoder.feed(event, data, &mut deltas).expect("valid");
        // The call goes up when its block stops, whole.
        let call_sent = deltas[before..]
            .iter()
            .any(|d| matches!(d, Delta::ToolCall(_)));
        assert_eq!(
            call_sent,
            data.contains(r#""content_block_stop","index":2"#),
            "{data}"
        );
    }
    let call = ToolCall::raw("toolu_1", "ls", r#"{"path":"src"}"#);
    assert_eq!(
        deltas,
        [
            Delta::Reasoning("hmm".into()),
            Delta::Text("Let me".into()),
            Delta::ToolCall(call)
        ]
    );
    let res = decoder.finish().expect("complete");
    assert_eq!(
        res.message.content,
        vec![
            ContentPart::Reasoning {
                text: "hmm".into(),
                signature: Some("SIG".into())
            },
            ContentPart::Text {
                text: "Let me".into()
            },
            ContentPart::ToolCall(ToolCall::raw("toolu_1", "ls", r#"{"path":"src"}"#)),
        ]
    );
    assert_eq!(res.usage, Usage::new(15, 42).with_cached(5));
    assert_eq!(res.finish_reason, FinishReason::ToolCalls);
    assert_eq!(res.response_id(), Some("msg_01"));
    assert_eq!(res.response_model(), Some("claude-sonnet-4-5"));
}

#[test]
fn an_error_event_inside_a_200_stream_is_typed() {
    let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
    let err = decoder
        .feed(
            "error",
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            &mut Vec::new(),
        )
        .expect_err("an error event");
    assert!(matches!(err.kind(), ErrorKind::Overloaded { .. }));
    let decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
    assert_eq!(
        decoder.finish().expect_err("never stopped").kind(),
        ErrorKind::Server
    );
}

#[test]
fn a_response_format_goes_as_the_output_config() {
    let mut req = ModelRequest::new(vec![Message::user("judge")]);
    let schema = json!({"type": "object", "properties": {"done": {"type": "boolean"}}});
    req.options_mut().response_format = Some(tower_agent_core::ResponseFormat::json_schema(
        "verdict",
        schema.clone(),
    ));
    let body: Value = serde_json::from_slice(
        &encode::body(&wire().0, &wire().1, &req, false, None).expect("encodes"),
    )
    .expect("json");
    assert_eq!(
        body["output_config"],
        json!({"format": {"type": "json_schema", "schema": schema}})
    );
}

#[test]
fn a_thinking_block_at_the_end_of_the_history_gets_no_marker() {
    let key = encode::KeptKey::new();
    let mut req = ModelRequest::new(vec![
        Message::user("think"),
        Message {
            role: Role::Assistant,
            content: vec![ContentPart::Reasoning {
                text: "hmm".into(),
                signature: Some("sig".into()),
            }],
        },
        // Encodes to nothing: the thinking block stays the last one sent.
        Message::user(""),
    ]);
    req.system = Some("sys".into());
    let body = cached_body(&req, CacheTtl::FiveMinutes, &key);
    assert_eq!(body["messages"][1]["content"][0]["type"], "thinking");
    assert_eq!(markers(&body), ["system[0]"]);
}

#[test]
fn a_whitespace_block_is_not_sent() {
    let key = encode::KeptKey::new();
    let mut req = ModelRequest::new(vec![Message::user("hi")]);
    req.append_system("   ");
    req.append_system("More.");
    assert_eq!(req.cache.stable, [3, 10]);
    let body = cached_body(&req, CacheTtl::FiveMinutes, &key);
    // The API refuses a text block of whitespace: the first is not sent.
    assert_eq!(
        body["system"],
        json!([{ "type": "text", "text": "More.", "cache_control": { "type": "ephemeral" } }])
    );
}

#[test]
fn cache_writes_are_reported_apart_and_the_hour_long_cache_sends_its_beta() {
    let body =
        br#"{"id":"m","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],
        "stop_reason":"end_turn","usage":{"input_tokens":12,"cache_creation_input_tokens":3000,
        "cache_read_input_tokens":500,"output_tokens":7}}"#;
    let res = decode(body).expect("decodes");
    assert_eq!(
        res.usage,
        Usage::new(3512, 7).with_cached(500).with_cache_writes(3000)
    );

    let (mut wire, endpoint) = wire();
    for (ttl, beta) in [
        (None, None),
        (Some(CacheTtl::FiveMinutes), None),
        (
            Some(CacheTtl::OneHour),
            Some("extended-cache-ttl-2025-04-11"),
        ),
    ] {
        wire.cache = ttl;
        let headers = wire.headers(&endpoint);
        let sent = headers.get("anthropic-beta").and_then(|v| v.to_str().ok());
        assert_eq!(sent, beta, "{ttl:?}");
    }
}

#[test]
fn the_cache_beta_joins_the_hosts_own_betas() {
    let (mut wire, endpoint) = wire();
    wire.cache = Some(CacheTtl::OneHour);
    let mut extra = HeaderMap::new();
    extra.insert(
        "anthropic-beta",
        "context-1m-2025-08-07".parse().expect("a value"),
    );
    extra.insert("x-trace", "t1".parse().expect("a value"));
    let headers = crate::http::request_headers(&wire, &endpoint, &extra);
    assert_eq!(
        headers.get("anthropic-beta").and_then(|v| v.to_str().ok()),
        Some("context-1m-2025-08-07,extended-cache-ttl-2025-04-11")
    );
    assert_eq!(
        headers.get("x-trace").and_then(|v| v.to_str().ok()),
        Some("t1")
    );
    assert_eq!(
        headers
            .get("anthropic-version")
            .and_then(|v| v.to_str().ok()),
        Some(Anthropic::VERSION)
    );
}

#[test]
fn a_beta_the_host_sent_already_is_not_repeated_and_every_host_value_stays() {
    let (mut wire, endpoint) = wire();
    wire.cache = Some(CacheTtl::OneHour);
    let mut extra = HeaderMap::new();
    extra.append(
        "anthropic-beta",
        "a-1, extended-cache-ttl-2025-04-11"
            .parse()
            .expect("a value"),
    );
    extra.append("anthropic-beta", "b-2".parse().expect("a value"));
    let headers = crate::http::request_headers(&wire, &endpoint, &extra);
    let sent: Vec<&str> = headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    assert_eq!(sent, ["a-1,extended-cache-ttl-2025-04-11,b-2"]);
}

#[test]
fn marks_fall_inside_the_prompt_in_order_on_character_boundaries() {
    let mut req = ModelRequest::new(vec![]);
    req.append_system("A long block of instructions.");
    req.system = Some("Short.".into()); // rewritten by hand: the mark is past its end
    req.append_system("More.");
    assert_eq!(
        super::request::marks(&req.cache, req.system.as_deref().unwrap()),
        [13]
    );
    // Nothing said: the whole prompt, or nothing when there is none.
    let plain = ModelRequest::new(vec![]);
    assert_eq!(super::request::marks(&plain.cache, "You help."), [9]);
    assert!(super::request::marks(&plain.cache, "").is_empty());
    // Out of order, zero and inside a character: dropped.
    let mut cache = PromptCache::default();
    cache.stable = vec![0, 3, 2, 5, 4];
    assert_eq!(super::request::marks(&cache, "ab\u{e9}cd"), [2, 5]);
}
