//! Unit tests of the mapping, with recorded payloads.

use serde_json::{Value, json};
use tower_agent_core::{
    ContentPart, ErrorKind, FinishReason, Role, ToolCall, ToolChoice, ToolResult, ToolSpec, Usage,
};

use std::sync::Arc;

use crate::encode;
use crate::wire::Delta;

use super::stream::*;
use super::*;

fn encoded(req: &ModelRequest) -> Value {
    let endpoint = Endpoint {
        model: "m".into(),
        base_url: "http://x/v1".into(),
        key: None,
        max_tokens: crate::http::DEFAULT_MAX_TOKENS,
    };
    let body = encode::body(&OpenAiWire::default(), &endpoint, req, true, None);
    serde_json::from_slice(&body.expect("encodes")).expect("json")
}

#[test]
fn a_conversation_with_calls_and_results() {
    let call = ToolCall::new("c1", "add", json!({"a": 1}));
    let mut req = ModelRequest::new(vec![
        Message::user("add"),
        Message {
            role: Role::Assistant,
            content: vec![
                ContentPart::Reasoning {
                    text: "hmm".into(),
                    signature: None,
                },
                ContentPart::ToolCall(call.clone()),
            ],
        },
        Message::tool_result(ToolResult::error(&call, "boom")),
    ]);
    req.system = Some("sys".into());
    req.tools = Arc::from(vec![ToolSpec::new(
        "add",
        "adds",
        json!({"type": "object"}),
    )]);
    req.options_mut().max_tokens = Some(100);
    req.options_mut().tool_choice = Some(ToolChoice::Tool("add".into()));
    assert_eq!(
        encoded(&req),
        json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "add"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1}"}}
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "boom"}
            ],
            "tools": [{"type": "function", "function": {"name": "add", "description": "adds", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "add"}},
            "max_tokens": 100,
            "stream": true,
            "stream_options": {"include_usage": true}
        })
    );
}

#[test]
fn stream_fragments_are_joined_by_index() {
    let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
    let mut deltas = Vec::new();
    for data in [
        r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"lo"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"t2","arguments":"{\"x\""}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"t1","arguments":""}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":":1}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}"#,
        "[DONE]",
    ] {
        decoder.feed("", data, &mut deltas).expect("a valid chunk");
    }
    assert!(decoder.is_done());
    // Out of index order: the calls are sent up whole at the finish.
    assert_eq!(
        deltas,
        [
            Delta::Text("Hel".into()),
            Delta::Text("lo".into()),
            Delta::ToolCall(ToolCall::raw("b", "t2", "{\"x\":1}")),
            Delta::ToolCall(ToolCall::raw("a", "t1", "")),
        ]
    );
    let res = decoder.finish().expect("complete");
    assert_eq!(res.message.text(), "Hello");
    let calls: Vec<_> = res
        .message
        .tool_calls()
        .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
        .collect();
    assert_eq!(calls, [("a", "t1", ""), ("b", "t2", "{\"x\":1}")]);
    assert_eq!(res.usage, Usage::new(9, 3).with_cached(4));
    assert_eq!(res.finish_reason, FinishReason::ToolCalls);
}

#[test]
fn a_call_is_sent_up_as_soon_as_the_next_one_starts() {
    let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
    let mut sent = Vec::new();
    for data in [
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"docs","arguments":"{\"q\":"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"x\"}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"code","arguments":"{}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        "[DONE]",
    ] {
        let mut deltas = Vec::new();
        decoder.feed("", data, &mut deltas).expect("a valid chunk");
        sent.push(deltas);
    }
    let a = ToolCall::raw("a", "docs", "{\"q\":\"x\"}");
    let b = ToolCall::raw("b", "code", "{}");
    assert_eq!(
        sent,
        [
            vec![],
            vec![],
            vec![Delta::ToolCall(a.clone())],
            vec![Delta::ToolCall(b.clone())],
            vec![]
        ]
    );
    let res = decoder.finish().expect("complete");
    let calls: Vec<ToolCall> = res.message.tool_calls().cloned().collect();
    assert_eq!(calls, [a, b], "what was sent up is what the message holds");
}

#[test]
fn reasoning_of_compatible_servers_is_kept_first() {
    let body = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"42","reasoning_content":"6 times 7"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":9}}"#;
    let res = OpenAiWire::decode(body).expect("decodes");
    assert_eq!(
        res.message.content,
        vec![
            ContentPart::Reasoning {
                text: "6 times 7".into(),
                signature: None
            },
            ContentPart::Text { text: "42".into() },
        ]
    );
    let empty = OpenAiWire::decode(br#"{"choices":[]}"#).expect_err("no choices");
    assert_eq!(empty.kind(), ErrorKind::EmptyResponse);
}

#[test]
fn a_broken_stream_is_an_error() {
    let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
    let mut deltas = Vec::new();
    decoder
        .feed(
            "",
            r#"{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#,
            &mut deltas,
        )
        .expect("valid");
    assert_eq!(decoder.finish().expect_err("cut").kind(), ErrorKind::Server);
    let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
    assert!(decoder.feed("", "{not json", &mut deltas).is_err());
    assert!(
        decoder
            .feed(
                "",
                r#"{"error":{"message":"boom","type":"server_error"}}"#,
                &mut deltas
            )
            .is_err()
    );
}

#[test]
fn openai_s_own_api_takes_the_length_limit_as_max_completion_tokens() {
    let mut req = ModelRequest::new(vec![Message::user("hi")]);
    req.options_mut().max_tokens = Some(64);
    for (base, key) in [
        ("https://api.openai.com/v1", "max_completion_tokens"),
        (
            "https://my-org.openai.azure.com/openai/v1",
            "max_completion_tokens",
        ),
        ("http://127.0.0.1:8080/v1", "max_tokens"),
        ("https://openrouter.ai/api/v1", "max_tokens"),
    ] {
        let endpoint = Endpoint {
            model: "m".into(),
            base_url: base.into(),
            key: None,
            max_tokens: crate::http::DEFAULT_MAX_TOKENS,
        };
        let wire = OpenAiWire::default();
        let body: Value = serde_json::from_slice(
            &encode::body(&wire, &endpoint, &req, false, None).expect("encodes"),
        )
        .expect("json");
        assert_eq!(body[key], 64, "{base}: {body}");
        let other = if key == "max_tokens" {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        assert!(body.get(other).is_none(), "{base}: {body}");
    }
}

#[test]
fn a_later_round_reuses_the_bytes_of_the_messages_its_history_kept() {
    let endpoint = Endpoint {
        model: "m".into(),
        base_url: "http://x/v1".into(),
        key: None,
        max_tokens: crate::http::DEFAULT_MAX_TOKENS,
    };
    let wire = OpenAiWire::default();
    let mut req = ModelRequest::new(vec![Message::user("first"), Message::assistant("two")]);
    req.ctx = tower_agent_core::RunContext::new();
    let key = encode::KeptKey::new();
    let body_of = |req: &ModelRequest| {
        let body = encode::body(&wire, &endpoint, req, false, Some(&key)).expect("encodes");
        String::from_utf8(body).expect("UTF-8")
    };
    assert!(body_of(&req).contains("first"));
    // Overwrite the kept bytes of the first message: a reuse shows it, an encoding does not.
    assert!(encode::overwrite_kept(&req.ctx, &key, b"first", b"FIRST"));
    // The next round: the same history, grown.
    let mut next = req.clone();
    next.messages.push(Message::user("three"));
    let grown = body_of(&next);
    assert!(
        grown.contains("FIRST") && grown.contains("three"),
        "{grown}"
    );
    // An edit of the second message keeps the first one's bytes.
    next.messages.tail_mut(1)[0] = Message::assistant("2");
    let edited = body_of(&next);
    assert!(
        edited.contains("FIRST") && !edited.contains("two"),
        "{edited}"
    );
    // A history built anew is encoded anew.
    next.messages = tower_agent_core::History::from(next.messages.to_vec());
    assert!(body_of(&next).contains("first"));
}

#[test]
fn a_response_format_goes_as_a_json_schema() {
    let mut req = ModelRequest::new(vec![Message::user("judge")]);
    let schema = json!({"type": "object", "properties": {"done": {"type": "boolean"}}});
    req.options_mut().response_format =
        Some(tower_agent_core::ResponseFormat::json_schema("verdict", schema.clone()).strict(true));
    assert_eq!(
        encoded(&req)["response_format"],
        json!({
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": schema, "strict": true}
        })
    );
    req.options_mut().response_format = None;
    assert!(encoded(&req).get("response_format").is_none());
}

#[test]
fn a_call_cut_off_at_the_length_limit_is_never_sent_up_as_complete() {
    let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
    let mut deltas = Vec::new();
    for data in [
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"t1","arguments":"{}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"t2","arguments":"{\"x\":"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
        "[DONE]",
    ] {
        decoder.feed("", data, &mut deltas).expect("a valid chunk");
    }
    // The first call closed when the second began; the second was cut.
    assert_eq!(deltas, [Delta::ToolCall(ToolCall::raw("a", "t1", "{}"))]);
    let res = decoder.finish().expect("complete");
    assert_eq!(res.finish_reason, FinishReason::Length);
    assert_eq!(
        res.message.tool_calls().count(),
        2,
        "the message keeps what was said"
    );
}

#[test]
fn arguments_that_are_not_a_json_object_go_as_valid_json() {
    let cut = ToolCall::raw("c1", "refund", r#"{"order": "A-1", "amo"#);
    let req = ModelRequest::new(vec![
        Message::user("Refund A-1."),
        Message::assistant_with_calls("", [cut.clone()]),
        Message::tool_result(ToolResult::error(&cut, ToolResult::TRUNCATED)),
    ]);
    let body = encoded(&req);
    let arguments = body["messages"][1]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .expect("a string");
    let parsed: Value = serde_json::from_str(arguments).expect("valid JSON on the wire");
    assert_eq!(parsed, json!({"_arguments": r#"{"order": "A-1", "amo"#}));
    // Whole arguments go as the model wrote them.
    let whole = ToolCall::raw("c2", "refund", r#"{"order":"A-1"}"#);
    let req = ModelRequest::new(vec![
        Message::user("Refund A-1."),
        Message::assistant_with_calls("", [whole]),
    ]);
    assert_eq!(
        encoded(&req)["messages"][1]["tool_calls"][0]["function"]["arguments"],
        r#"{"order":"A-1"}"#
    );
}
