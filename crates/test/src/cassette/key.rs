//! What a request is keyed by and written as: its canonical JSON, its hash, redaction.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tower_agent_core::{Error, GenerationOptions, History, ModelRequest};

/// The request as the provider is asked it: system, messages, tool specs (what providers
/// send of them), options. Hashed as it is encoded, without a copy of the request.
#[derive(Serialize)]
pub(super) struct Canonical<'a> {
    system: Option<&'a str>,
    messages: &'a History,
    tools: Vec<ToolWire<'a>>,
    options: &'a GenerationOptions,
}

#[derive(Serialize)]
struct ToolWire<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

impl<'a> Canonical<'a> {
    pub(super) fn of(req: &'a ModelRequest) -> Self {
        Self {
            system: req.system.as_deref(),
            messages: &req.messages,
            tools: req
                .tools
                .iter()
                .map(|spec| ToolWire {
                    name: &spec.name,
                    description: &spec.description,
                    parameters: &spec.parameters,
                })
                .collect(),
            options: &req.options,
        }
    }
}

/// A tool call as the cassette keys it: the tool and its arguments, not the call's id.
#[derive(Serialize)]
pub(super) struct ToolCanonical<'a> {
    pub(super) tool: &'a str,
    pub(super) arguments: &'a str,
}

/// The SHA-256 of `request`'s JSON as the cassette writes it (key-like text redacted: a
/// replayed request that carries a redacted answer has the recorded request's key), in hex.
pub(super) fn key_of(request: &impl Serialize) -> Result<String, Error> {
    let json = serde_json::to_string(request)
        .map_err(|error| Error::other(format!("cannot encode the request: {error}")))?;
    Ok(Sha256::digest(redact(&json).as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect())
}

pub(super) fn to_value(request: &impl Serialize) -> Result<Value, Error> {
    serde_json::to_value(request)
        .map_err(|error| Error::other(format!("cannot encode the request: {error}")))
}

pub(super) fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

/// Text that looks like a credential, replaced: a known prefix at the start of a word, then
/// at least 16 characters of a key.
pub(super) fn redact(text: &str) -> String {
    const PREFIXES: [&str; 8] = [
        "sk-ant-", "sk-", "AIza", "ghp_", "xoxb-", "xoxp-", "Bearer ", "bearer ",
    ];
    const MIN: usize = 16;
    let is_key = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        let boundary = i == 0 || !is_key(bytes[i - 1]);
        if boundary && matches!(bytes[i], b's' | b'A' | b'g' | b'x' | b'B' | b'b') {
            let found = PREFIXES.iter().find_map(|prefix| {
                let tail = text[i..].strip_prefix(prefix)?;
                let secret = tail.bytes().take_while(|b| is_key(*b)).count();
                (secret >= MIN).then_some(prefix.len() + secret)
            });
            if let Some(length) = found {
                out.push_str(&text[copied..i]);
                out.push_str("[REDACTED]");
                i += length;
                copied = i;
                continue;
            }
        }
        i += 1;
    }
    out.push_str(&text[copied..]);
    out
}
