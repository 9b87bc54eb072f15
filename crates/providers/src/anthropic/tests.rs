//! Unit tests of the mapping, with recorded payloads.

use serde_json::{Value, json};
use tower_agent_core::{ContentPart, ErrorKind, FinishReason, Role, ToolCall, ToolResult, Usage};

use crate::encode;
use crate::wire::Delta;

use super::stream::*;
use super::*;

fn wire() -> (AnthropicWire, Endpoint) {
    let endpoint = Endpoint {
        model: "claude".into(),
        base_url: "http://x".into(),
        key: None,
    };
    (AnthropicWire { max_tokens: 1000 }, endpoint)
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
    let body: Value = serde_json::from_slice(
        &encode::body(&wire().0, &wire().1, &req, false, false).expect("encodes"),
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
            r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":1}}}"#,
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
    req.options.response_format = Some(tower_agent_core::ResponseFormat::json_schema(
        "verdict",
        schema.clone(),
    ));
    let body: Value = serde_json::from_slice(
        &encode::body(&wire().0, &wire().1, &req, false, false).expect("encodes"),
    )
    .expect("json");
    assert_eq!(
        body["output_config"],
        json!({"format": {"type": "json_schema", "schema": schema}})
    );
}
