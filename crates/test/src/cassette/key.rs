//! What a request is keyed by and written as: its canonical JSON and its hash.

use std::borrow::Cow;
use std::io::{BufWriter, Write};

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tower_agent_core::{ContentPart, Error, GenerationOptions, History, Message, ModelRequest};

use super::scrub;

/// The request as the provider is asked it: system, messages (without the calls' keys, which
/// are the agent's and change from run to run), tool specs (what providers send of them),
/// options. Hashed as it is encoded, without a copy of the request unless its calls have keys.
#[derive(Serialize)]
pub(super) struct Canonical<'a> {
    system: Option<&'a str>,
    messages: Cow<'a, History>,
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
            messages: without_keys(&req.messages),
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

/// `history` with no call's key: what a provider is sent.
fn without_keys(history: &History) -> Cow<'_, History> {
    let keyed = history
        .iter()
        .flat_map(Message::tool_calls)
        .any(|call| call.key.is_some());
    if !keyed {
        return Cow::Borrowed(history);
    }
    let mut bare = history.clone();
    for message in bare.tail_mut(0) {
        for part in &mut message.content {
            if let ContentPart::ToolCall(call) = part {
                call.key = None;
            }
        }
    }
    Cow::Owned(bare)
}

/// A tool call as the cassette keys it: the tool and its arguments, not the call's id.
#[derive(Serialize)]
pub(super) struct ToolCanonical<'a> {
    pub(super) tool: &'a str,
    pub(super) arguments: &'a str,
}

/// The SHA-256 of `request`'s JSON as the cassette writes it, every string scrubbed (a
/// replayed request that carries a scrubbed answer has the recorded request's key), in hex.
/// Hashed as it is encoded, without a copy of the request.
pub(super) fn key_of(request: &impl Serialize) -> Result<String, Error> {
    let mut hasher = Sha256::new();
    // The encoder writes a few bytes at a time: the hasher takes them in blocks.
    let mut writer = BufWriter::with_capacity(8 * 1024, &mut hasher);
    scrub::to_writer(&mut writer, request)
        .map_err(|error| error.to_string())
        .and_then(|()| writer.flush().map_err(|error| error.to_string()))
        .map_err(|error| Error::other(format!("cannot encode the request: {error}")))?;
    drop(writer);
    Ok(hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect())
}

pub(super) fn to_value(request: &impl Serialize) -> Result<Value, Error> {
    serde_json::to_value(request)
        .map_err(|error| Error::other(format!("cannot encode the request: {error}")))
}

/// `value` scrubbed, indented, for a diff.
pub(super) fn pretty(value: &Value) -> String {
    let scrubbed = scrub::to_string(value)
        .and_then(|text| serde_json::from_str::<Value>(&text))
        .unwrap_or_default();
    let mut text = serde_json::to_string_pretty(&scrubbed).unwrap_or_default();
    text.push('\n');
    text
}
