//! What a provider implements: its wire format ([`Format`]), the decoder of its stream
//! ([`StreamDecoder`]), the frame of its request body ([`Frame`]), and the helpers its
//! request and response code share. A leaf: nothing else of the crate is imported here.

use std::borrow::Cow;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Deserializer, Serialize};
use tower_agent_core::{ContentPart, Error, ErrorKind, Message, ModelRequest, ModelResponse};

use crate::key::ApiKey;

// `Format`, and what its methods take and give, are `pub` only so that the public `Wire`
// marker can name `Format` as its supertrait (the sealed-trait pattern): they are reachable
// from no path outside the crate.

pub(crate) use tower_agent_core::Delta;

/// Assembles one streamed answer from its server-sent events.
pub trait StreamDecoder: Send {
    /// Take one event (`event` is its `event:` name, empty when none); push what should go up
    /// to the run's readers now to `deltas`.
    ///
    /// # Errors
    ///
    /// A chunk that is not what the provider sends (invalid JSON), or an error event.
    fn feed(&mut self, event: &str, data: &str, deltas: &mut Vec<Delta>) -> Result<(), Error>;

    /// Whether the provider said the answer is complete.
    fn is_done(&self) -> bool;

    /// The complete answer.
    ///
    /// # Errors
    ///
    /// The stream ended before the provider said the answer is complete.
    fn finish(self: Box<Self>) -> Result<ModelResponse, Error>;
}

/// Where a provider's requests go, and as whom: the same three things for every provider.
#[derive(Clone)]
pub struct Endpoint {
    pub(crate) model: String,
    /// As the requests need it ([`Format::base_url_of`]).
    pub(crate) base_url: String,
    pub(crate) key: Option<ApiKey>,
    /// The `max_tokens` of a request whose options set none.
    pub(crate) max_tokens: u32,
}

impl Endpoint {
    /// The length limit `req` goes with: its own, else this endpoint's.
    pub(crate) fn max_tokens(&self, req: &ModelRequest) -> u32 {
        req.options.max_tokens.unwrap_or(self.max_tokens)
    }
}

/// The model, and the base URL without its query; never the key's value.
impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("model", &self.model)
            .field(
                "base_url",
                &self.base_url.split('?').next().unwrap_or_default(),
            )
            .field("key", &self.key)
            .finish()
    }
}

/// What one provider is, as data: its names, where it is, the environment it reads, how its
/// error bodies and list headers read. What differs in behaviour is [`Format`]'s methods.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The provider type's name, for `Debug` output (`OpenAi`).
    pub name: &'static str,
    /// The provider's name, in error messages (`gemini: the prompt was blocked`).
    pub provider: &'static str,
    /// The provider's name as in `gen_ai.provider.name` of the semantic conventions
    /// (`openai`, `anthropic`, `gcp.gemini`).
    pub gen_ai_provider: &'static str,
    /// What a 404 error says about the base URL.
    pub base_url_hint: &'static str,
    /// The base URL when none is given.
    pub default_base_url: &'static str,
    /// The environment variable the key is read from.
    pub key_env: &'static str,
    /// The environment variable the base URL is read from.
    pub base_url_env: &'static str,
    /// Headers whose value is a comma-separated list: a value the format sets is added to the
    /// host's own (Anthropic's `anthropic-beta`), where another header of the format's
    /// replaces the host's.
    pub list_headers: &'static [&'static str],
    /// The key of a turn's item list, for providers whose messages are turns of items
    /// (`content` for Anthropic, `parts` for Gemini).
    pub turn_items: &'static str,
    /// What the provider's error bodies say, in its words (`classify`).
    pub errors: crate::classify::ErrorWords,
}

/// One provider's wire format: what differs between providers, and nothing else. Its value
/// holds the provider's own options (Anthropic's default `max_tokens`).
pub trait Format: Clone + Default + std::fmt::Debug + Send + Sync + 'static {
    /// What the provider is called, where it is, how its errors read: data, not behaviour.
    const SPEC: Spec;

    /// A base URL as the requests need it, from one given with or without its version path.
    fn base_url_of(url: &str) -> String;

    /// Where a request goes.
    fn url(&self, endpoint: &Endpoint, stream: bool) -> String;

    /// Headers beyond `content-type`, the key's among them (marked sensitive).
    fn headers(&self, endpoint: &Endpoint) -> HeaderMap;

    /// The body around the messages (model, system prompt, tools, options).
    ///
    /// # Errors
    ///
    /// A request this provider cannot express.
    fn frame(&self, endpoint: &Endpoint, req: &ModelRequest, stream: bool) -> Result<Frame, Error>;

    /// Append one message's items to `out` (comma-separated, nothing when it has none), and
    /// say where they go. Depends on the message only: the bytes are reused across rounds and
    /// requests of a run.
    ///
    /// # Errors
    ///
    /// A message this provider cannot express.
    fn encode_message(message: &Message, out: &mut Vec<u8>) -> Result<Items, Error>;

    /// A whole (not streamed) response body.
    ///
    /// # Errors
    ///
    /// A body that is not what the provider sends.
    fn decode(body: &[u8]) -> Result<ModelResponse, Error>;

    /// A decoder for one streamed answer.
    fn decoder() -> Box<dyn StreamDecoder>;
}

/// Where the items of one message go, as [`Format::encode_message`] says.
#[derive(Debug, Clone, Copy)]
pub struct Items {
    /// The turn they belong to (`None`: they stand alone in the array).
    pub(crate) turn: Option<&'static str>,
    /// Whether the last of them can carry [`Frame::last_item`]'s fields (Anthropic: a
    /// thinking block cannot carry a cache marker).
    pub(crate) last_takes_fields: bool,
}

impl Items {
    /// Items standing alone in the array (OpenAI's messages).
    pub(crate) const ALONE: Items = Items {
        turn: None,
        last_takes_fields: true,
    };

    /// Items of the turn `turn`.
    #[cfg(feature = "gemini")]
    pub(crate) fn of(turn: &'static str) -> Items {
        Items {
            turn: Some(turn),
            last_takes_fields: true,
        }
    }
}

/// A key header value the HTTP stack will not log.
pub(crate) fn secret_header(name: &'static str, value: &str) -> Option<(HeaderName, HeaderValue)> {
    let mut value = HeaderValue::from_str(value).ok()?;
    value.set_sensitive(true);
    Some((HeaderName::from_static(name), value))
}

/// The body around the messages.
#[derive(Debug, Default)]
pub struct Frame {
    /// Up to and including the opening `[` of the messages (and items already in it).
    pub(crate) head: Vec<u8>,
    /// Whether `head` already holds an item (OpenAI's system message).
    pub(crate) head_has_items: bool,
    /// From the closing `]` of the messages to the end.
    pub(crate) tail: Vec<u8>,
    /// Fields added to the last item of the messages (Anthropic's cache marker), as
    /// `,"key":value`.
    pub(crate) last_item: Option<Vec<u8>>,
    /// The same fields on the last item of the messages the run's previous request ended
    /// with, when this one holds them all and more (a second marker at the previous round's
    /// end).
    pub(crate) previous_item: bool,
}

impl Frame {
    /// A frame from the fields before the messages, the key of the messages, and the fields
    /// after them, each serialized as a JSON object (whose braces are dropped).
    pub(crate) fn around(
        before: &impl Serialize,
        key: &str,
        after: &impl Serialize,
        provider: &'static str,
    ) -> Result<Frame, Error> {
        let before = to_vec(before, provider)?;
        let after = to_vec(after, provider)?;
        let mut head = Vec::with_capacity(before.len() + key.len() + 8);
        head.extend_from_slice(&before[..before.len() - 1]);
        if before.len() > 2 {
            head.push(b',');
        }
        head.push(b'"');
        head.extend_from_slice(key.as_bytes());
        head.extend_from_slice(b"\":[");
        let mut tail = Vec::with_capacity(after.len() + 2);
        tail.push(b']');
        if after.len() > 2 {
            tail.push(b',');
            tail.extend_from_slice(&after[1..]);
        } else {
            tail.push(b'}');
        }
        Ok(Frame {
            head,
            head_has_items: false,
            tail,
            last_item: None,
            previous_item: false,
        })
    }
}

/// `value` as JSON.
pub(crate) fn to_vec(value: &impl Serialize, provider: &'static str) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(value)
        .map_err(|e| Error::bad_request(format!("{provider}: cannot encode the request: {e}")))
}

/// Append `value` as JSON to `out`, after a comma unless it is the first item.
pub(crate) fn item(
    out: &mut Vec<u8>,
    first: &mut bool,
    value: &impl Serialize,
    provider: &'static str,
) -> Result<(), Error> {
    if !std::mem::take(first) {
        out.push(b',');
    }
    serde_json::to_writer(&mut *out, value)
        .map_err(|e| Error::bad_request(format!("{provider}: cannot encode the request: {e}")))
}

/// `null` and absent alike give the default: for every field a server may send as `null`
/// (Inception's `"tool_calls": null` in a text delta, say).
pub(crate) fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The error of a body that is not what the provider sends: not transient (the same request
/// would be paid for again, and read the same way).
pub(crate) fn invalid(provider: &'static str, what: &str, error: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::InvalidResponse,
        format!("{provider}: {what} is not valid: {error}"),
    )
}

/// The error of a stream that ended before the provider said the answer was complete.
pub(crate) fn truncated(provider: &'static str) -> Error {
    Error::new(
        ErrorKind::Server,
        format!("{provider}: the stream ended before the answer was complete"),
    )
}

/// The text parts of `message`, borrowed when there is one.
pub(crate) fn text_of(message: &Message) -> Cow<'_, str> {
    let mut texts = message.content.iter().filter_map(|p| match p {
        ContentPart::Text { text } => Some(text.as_str()),
        _ => None,
    });
    match (texts.next(), texts.next()) {
        (None, _) => Cow::Borrowed(""),
        (Some(one), None) => Cow::Borrowed(one),
        (Some(first), Some(second)) => {
            let mut all = format!("{first}{second}");
            all.extend(texts);
            Cow::Owned(all)
        }
    }
}

/// A call's arguments as the JSON object every API requires: the model's own when they are
/// one (no arguments at all: `{}`), else the text it wrote under `_arguments` (a call cut off,
/// or malformed: the session keeps the text; the wire stays valid, so a server never refuses
/// the whole conversation for it).
#[cfg(any(feature = "anthropic", feature = "gemini"))]
pub(crate) fn arguments_object(call: &tower_agent_core::ToolCall) -> serde_json::Value {
    if call.arguments.trim().is_empty() {
        return serde_json::Value::Object(serde_json::Map::new());
    }
    match call.parse_arguments::<serde_json::Value>() {
        Ok(value @ serde_json::Value::Object(_)) => value,
        _ => serde_json::json!({ "_arguments": call.arguments }),
    }
}

/// The arguments as the text a wire sends in a string (OpenAI's `arguments`): the
/// model's own text when it is a JSON object.
#[cfg(feature = "openai")]
pub(crate) fn arguments_text(call: &tower_agent_core::ToolCall) -> Cow<'_, str> {
    if call.arguments.trim().is_empty() {
        return Cow::Borrowed("{}");
    }
    match call.parse_arguments::<serde_json::Value>() {
        Ok(serde_json::Value::Object(_)) => Cow::Borrowed(&call.arguments),
        _ => Cow::Owned(serde_json::json!({ "_arguments": call.arguments }).to_string()),
    }
}

#[cfg(all(test, feature = "openai", feature = "anthropic"))]
mod tests {
    use serde_json::{Value, json};
    use tower_agent_core::ToolCall;

    use super::{arguments_object, arguments_text};

    fn call(arguments: &str) -> ToolCall {
        let mut call = ToolCall::new("c1", "t", json!({}));
        call.arguments = arguments.into();
        call
    }

    /// The model's object goes as it wrote it; anything else is wrapped so that the wire stays
    /// valid.
    #[test]
    fn arguments_go_as_written_when_they_are_an_object() {
        for (written, sent) in [
            (r#"{"path": "a.rs"}"#, json!({"path": "a.rs"})),
            (" {\"n\":1}\n", json!({"n": 1})),
            ("", json!({})),
            ("  ", json!({})),
            (r#"{"path": "a."#, json!({"_arguments": r#"{"path": "a."#})),
            ("[1, 2]", json!({"_arguments": "[1, 2]"})),
            (r#""text""#, json!({"_arguments": r#""text""#})),
            ("{} {}", json!({"_arguments": "{} {}"})),
            // What a `Value` refuses, a server's parser may refuse too.
            (
                r#"{"s": "\ud800"}"#,
                json!({"_arguments": r#"{"s": "\ud800"}"#}),
            ),
            (r#"{"n": 1e400}"#, json!({"_arguments": r#"{"n": 1e400}"#})),
            (
                r#"{"s": "\ud83d\ude00", "n": 1e300}"#,
                json!({"s": "😀", "n": 1e300}),
            ),
        ] {
            let call = call(written);
            let object = serde_json::to_value(arguments_object(&call)).expect("serializes");
            assert_eq!(object, sent, "{written:?}");
            let text: Value = serde_json::from_str(&arguments_text(&call)).expect("JSON");
            assert_eq!(text, sent, "{written:?}");
        }
    }
}
