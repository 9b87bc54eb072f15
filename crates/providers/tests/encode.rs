//! Messages encoded once per run: a later request of the same run gives the very bytes a
//! fresh encoding gives, whatever happened to the history in between.

#![cfg(all(feature = "openai", feature = "anthropic", feature = "gemini"))]

use serde_json::json;
use tower_agent_core::{
    ContentPart, Error, History, Message, ModelRequest, Role, RunContext, ToolCall, ToolResult,
};
use tower_agent_providers::{Anthropic, Gemini, OpenAi};

fn call(id: &str) -> ToolCall {
    ToolCall::new(id, "read_file", json!({ "path": id }))
}

fn history() -> Vec<Message> {
    vec![
        Message::system("Be careful."),
        Message::user("read a"),
        Message::assistant_with_calls("Reading.", [call("a"), call("b")]),
        Message::tool_result(ToolResult::success(&call("a"), "A")),
        Message::tool_result(ToolResult::error(&call("b"), "no such file")),
        Message::user("and now?"),
        Message {
            role: Role::Assistant,
            content: vec![
                ContentPart::Reasoning {
                    text: "hm".into(),
                    signature: Some("SIG".into()),
                },
                ContentPart::Text {
                    text: "Done.".into(),
                },
            ],
        },
    ]
}

/// Requests of one run, each a step of a history's life: growing, edited at the start,
/// shortened in the middle, emptied, grown again.
fn steps() -> Vec<Vec<Message>> {
    let full = history();
    let mut edited = full.clone();
    edited[1] = Message::user("read a, please");
    let mut shortened = full.clone();
    shortened.remove(5);
    vec![
        full[..2].to_vec(),
        full[..5].to_vec(),
        full.clone(),
        edited,
        shortened,
        Vec::new(),
        full,
    ]
}

fn check(body: impl Fn(&ModelRequest) -> Result<Vec<u8>, Error>) {
    let ctx = RunContext::new();
    for (n, messages) in steps().into_iter().enumerate() {
        let mut warm = ModelRequest::new(History::from(messages.clone()));
        warm.ctx = ctx.clone();
        warm.system = Some("sys".into());
        let mut cold = ModelRequest::new(History::from(messages));
        cold.system = Some("sys".into());
        let (warm, cold) = (body(&warm).expect("encodes"), body(&cold).expect("encodes"));
        assert_eq!(
            String::from_utf8_lossy(&warm),
            String::from_utf8_lossy(&cold),
            "step {n}"
        );
        serde_json::from_slice::<serde_json::Value>(&warm).expect("valid JSON");
    }
}

#[test]
fn openai_reuses_bytes_only_for_unchanged_messages() {
    let model = OpenAi::new("m");
    check(|req| model.request_body(req));
}

#[test]
fn anthropic_reuses_bytes_only_for_unchanged_messages() {
    let model = Anthropic::new("m");
    check(|req| model.request_body(req));
}

#[test]
fn gemini_reuses_bytes_only_for_unchanged_messages() {
    let model = Gemini::new("m");
    check(|req| model.request_body(req));
}

/// A call's key ([`ToolCall::key`]) is the agent's, never the model's: no provider sends it.
#[test]
fn no_provider_sends_a_calls_key() {
    let mut keyed = call("a");
    let key = tower_agent_core::CallKey::from_u128(0x6f1d_2a0c_4b7e_5c11_9a3d_0e8f_7b24_c6a5);
    keyed.key = Some(key);
    let messages = vec![
        Message::user("read a"),
        Message::assistant_with_calls("", [keyed.clone()]),
        Message::tool_result(ToolResult::success(&keyed, "A")),
    ];
    let req = ModelRequest::new(History::from(messages));
    let bodies = [
        OpenAi::new("m").request_body(&req),
        Anthropic::new("m").request_body(&req),
        Gemini::new("m").request_body(&req),
    ];
    for body in bodies {
        let body = String::from_utf8(body.expect("encodes")).expect("UTF-8");
        assert!(body.contains("read_file"), "the call is sent: {body}");
        assert!(!body.contains(&key.to_string()), "the key is not: {body}");
        assert!(!body.contains("6f1d2a0c"), "nor any part of it: {body}");
    }
}
