//! Unit tests of the mapping, with recorded payloads.

use serde_json::{Value, json};
use tower_agent_core::{ContentPart, ErrorKind, FinishReason, Role, ToolCall, ToolResult, Usage};

use crate::encode;
use crate::wire::Delta;

use super::response::*;
use super::*;

#[test]
fn signatures_go_back_on_their_part() {
    let call = ToolCall::new("c1", "ls", json!({"path": "."}));
    let req = ModelRequest::new(vec![
        Message::user("list"),
        Message {
            role: Role::Assistant,
            content: vec![
                ContentPart::Reasoning {
                    text: String::new(),
                    signature: Some("SIG".into()),
                },
                ContentPart::ToolCall(call.clone()),
            ],
        },
        Message::tool_result(ToolResult::error(&call, "denied")),
    ]);
    let endpoint = Endpoint {
        model: "g".into(),
        base_url: "http://x".into(),
        key: None,
        max_tokens: crate::http::DEFAULT_MAX_TOKENS,
    };
    let wire = GeminiWire::default();
    let body: Value = serde_json::from_slice(
        &encode::body(&wire, &endpoint, &req, false, None).expect("encodes"),
    )
    .expect("json");
    assert_eq!(
        body,
        json!({
            "contents": [
                {"role": "user", "parts": [{"text": "list"}]},
                {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {"path": "."}, "id": "c1"}, "thoughtSignature": "SIG"}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "ls", "id": "c1", "response": {"error": "denied"}}}]}
            ],
            "generationConfig": {"maxOutputTokens": 4096}
        })
    );
}

#[test]
fn chunks_accumulate_into_one_message() {
    let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
    let mut deltas = Vec::new();
    for data in [
        r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Hel"}]}}]}"#,
        r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"lo"}]}}]}"#,
        r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"ls","args":{}},"thoughtSignature":"S"},{"functionCall":{"name":"cat","args":{"p":"a"},"id":"c2"}}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":7,"candidatesTokenCount":3,"thoughtsTokenCount":2}}"#,
    ] {
        decoder.feed("", data, &mut deltas).expect("valid");
    }
    let ls = ToolCall::raw("", "ls", "{}");
    let cat = ToolCall::raw("c2", "cat", r#"{"p":"a"}"#);
    let res = decoder.finish().expect("complete");
    assert_eq!(
        res.message.content,
        vec![
            ContentPart::Text {
                text: "Hello".into()
            },
            ContentPart::Reasoning {
                text: String::new(),
                signature: Some("S".into())
            },
            ContentPart::ToolCall(ls.clone()),
            ContentPart::ToolCall(cat.clone()),
        ]
    );
    assert_eq!(res.usage, Usage::new(7, 5));
    assert_eq!(res.finish_reason, FinishReason::ToolCalls);
    // Calls come whole, each sent up with its part.
    assert_eq!(
        deltas,
        [
            Delta::Text("Hel".into()),
            Delta::Text("lo".into()),
            Delta::ToolCall(ls),
            Delta::ToolCall(cat)
        ]
    );
}

#[test]
fn empty_candidates_and_cut_streams_are_errors() {
    let empty = GeminiWire::decode(br#"{"candidates":[],"usageMetadata":{"promptTokenCount":3}}"#);
    assert_eq!(empty.expect_err("empty").kind(), ErrorKind::EmptyResponse);
    let blocked = GeminiWire::decode(br#"{"promptFeedback":{"blockReason":"SAFETY"}}"#);
    assert_eq!(blocked.expect_err("blocked").kind(), ErrorKind::BadRequest);
    let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
    decoder
        .feed(
            "",
            r#"{"candidates":[{"content":{"parts":[{"text":"Hel"}]}}]}"#,
            &mut Vec::new(),
        )
        .expect("valid");
    assert_eq!(decoder.finish().expect_err("cut").kind(), ErrorKind::Server);
}

#[test]
fn a_response_format_goes_as_a_json_mime_type_and_schema() {
    let mut req = ModelRequest::new(vec![Message::user("judge")]);
    let schema = json!({"type": "object", "properties": {"done": {"type": "boolean"}}});
    req.options_mut().response_format = Some(tower_agent_core::ResponseFormat::json_schema(
        "verdict",
        schema.clone(),
    ));
    req.options_mut().temperature = Some(0.0);
    let endpoint = Endpoint {
        model: "g".into(),
        base_url: "http://x".into(),
        key: None,
        max_tokens: crate::http::DEFAULT_MAX_TOKENS,
    };
    let body: Value = serde_json::from_slice(
        &encode::body(&GeminiWire::default(), &endpoint, &req, false, None).expect("encodes"),
    )
    .expect("json");
    assert_eq!(
        body["generationConfig"],
        json!({
            "temperature": 0.0,
            "maxOutputTokens": 4096,
            "responseMimeType": "application/json",
            "responseJsonSchema": schema
        })
    );
}
