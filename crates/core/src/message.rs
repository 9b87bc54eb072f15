//! Provider-neutral messages: roles, content parts, tool calls and tool results.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// System instructions placed in the history (most requests carry them in
    /// [`ModelRequest::system`](crate::ModelRequest::system) instead).
    System,
    /// The human, or the host application speaking for them.
    User,
    /// The model.
    Assistant,
    /// Tool results, one per message.
    Tool,
}

/// A tool call the model asked for.
///
/// `arguments` is the text the model produced, kept exactly: normally a JSON object, but a
/// model can produce malformed JSON, and the tool service reports that as an error result
/// the model sees instead of the agent failing. Use [`ToolCall::parse_arguments`] to read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call; the result answers it by this id.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments as JSON text, as the model wrote them.
    pub arguments: String,
    /// The agent's key for this logical call, never sent to a model: the same for every try
    /// of the call (a retry, a resume in another process, a replay, an approval's pause, an
    /// early start and its adoption), another for every other call, even with the same
    /// arguments. A tool that has effects passes it on (an `Idempotency-Key` header, an MCP
    /// request's `_meta`), so that the effect happens once. `None` until the agent gives the
    /// call its key, as the model's message comes in; saved with the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<CallKey>,
}

/// The agent's key for one logical call ([`ToolCall::key`]): 128 bits, written as a UUID
/// (`6d1f2a0c-4b7e-5c11-9a3d-0e8f7b24c6a5`), in JSON too.
///
/// ```
/// use tower_agent_core::CallKey;
///
/// let key: CallKey = "6d1f2a0c-4b7e-5c11-9a3d-0e8f7b24c6a5".parse()?;
/// assert_eq!(key.to_string(), "6d1f2a0c-4b7e-5c11-9a3d-0e8f7b24c6a5");
/// assert_eq!(serde_json::to_value(key)?, "6d1f2a0c-4b7e-5c11-9a3d-0e8f7b24c6a5");
/// assert!("not a key".parse::<CallKey>().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallKey(uuid::Uuid);

impl CallKey {
    /// The key of these 128 bits.
    pub const fn from_u128(bits: u128) -> Self {
        Self(uuid::Uuid::from_u128(bits))
    }

    /// Its 128 bits.
    pub const fn as_u128(self) -> u128 {
        self.0.as_u128()
    }
}

impl fmt::Display for CallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl fmt::Debug for CallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallKey({self})")
    }
}

/// Text that is not a call key (a UUID).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a call key (a UUID): {0}")]
pub struct NotACallKey(String);

impl std::str::FromStr for CallKey {
    type Err = NotACallKey;

    fn from_str(text: &str) -> Result<Self, NotACallKey> {
        uuid::Uuid::parse_str(text)
            .map(Self)
            .map_err(|error| NotACallKey(error.to_string()))
    }
}

impl Serialize for CallKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CallKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl ToolCall {
    /// A call with JSON arguments.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::ToolCall;
    ///
    /// let call = ToolCall::new("call_1", "add", json!({ "a": 1, "b": 2 }));
    /// assert_eq!(call.arguments, r#"{"a":1,"b":2}"#);
    /// ```
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            arguments: arguments.to_string(),
            key: None,
        }
    }

    /// A call whose arguments are kept as the given text, valid JSON or not.
    pub fn raw(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
            key: None,
        }
    }

    /// Deserialize the arguments. Empty text counts as `{}` (some models send nothing for a
    /// tool without parameters).
    ///
    /// # Errors
    ///
    /// The `serde_json` error when the text is not JSON or does not fit `T`.
    pub fn parse_arguments<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        let text = self.arguments.trim();
        if text.is_empty() {
            serde_json::from_str("{}")
        } else {
            serde_json::from_str(text)
        }
    }
}

/// The result of one tool call, as the model will see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The id of the call this answers.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// What the model reads.
    pub content: String,
    /// The tool failed; `content` says why. The run goes on and the model can react.
    #[serde(default)]
    pub is_error: bool,
}

impl ToolResult {
    /// A successful result answering `call`.
    pub fn success(call: &ToolCall, content: impl Into<String>) -> Self {
        Self {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content: content.into(),
            is_error: false,
        }
    }

    /// A failed result answering `call`: the model sees `content` as the error.
    pub fn error(call: &ToolCall, content: impl Into<String>) -> Self {
        Self {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content: content.into(),
            is_error: true,
        }
    }

    /// The synthetic result of a call that never ran because the run was cancelled.
    pub fn cancelled(call: &ToolCall) -> Self {
        Self::error(call, Self::CANCELLED)
    }

    /// The content of the result of a call the model's answer was cut off in (at its length
    /// limit): it was not run, its arguments may be incomplete.
    pub const TRUNCATED: &'static str = "not executed: the answer that made this call was cut \
         off at its length limit, so its arguments may be incomplete; make the call again, \
         shorter if needed";

    /// The content of [`ToolResult::cancelled`].
    pub const CANCELLED: &'static str =
        "cancelled: the run was cancelled before this tool call completed";

    /// The content of the result of a call that waited for a decision when the run went on
    /// with new input instead.
    pub const NOT_DECIDED: &'static str = "not executed: the run was interrupted here and \
         continued with new input instead of a decision";

    /// The content of the synthetic result of a call left without one (a run that stopped or
    /// crashed while the call ran, a history edited by hand): the one text the loop's repair
    /// and the patch layer answer it with.
    pub const UNANSWERED: &'static str = "error: this tool call did not complete. It may have \
         been cancelled or interrupted, and no result was recorded: do not assume it took effect.";

    /// The content of the result of a call an earlier run started (its write-ahead record,
    /// [`Session::started`](crate::Session::started)) and did not finish, when nothing can say
    /// whether it took effect ([`Recovery::Unknown`](crate::Recovery::Unknown)).
    pub const OUTCOME_UNKNOWN: &'static str = "error: the process running this tool call \
         stopped before its result was saved, so whether it took effect is unknown. Check (look \
         the effect up) before making the call again.";

    /// The content of the result of a call the run ended without (cancelled, stopped or
    /// failed) when it may have been running (the write-ahead record,
    /// [`Session::started`](crate::Session::started), has it): "not executed" would claim too
    /// much.
    pub const ENDED_WHILE_RUNNING: &'static str = "error: the run ended (cancelled, stopped or \
         failed) while this tool call may have been running, so whether it took effect is \
         unknown. Check (look the effect up) before making the call again.";

    /// The content of the result of a call an earlier run started and did not finish, when its
    /// tool says it did not run ([`Recovery::NotRun`](crate::Recovery::NotRun)).
    pub const NOT_RUN: &'static str = "not executed: the process running this tool call stopped \
         before the call took effect (the tool checked). Make the call again if it is still \
         needed.";

    /// The start of the content of the synthetic result of a call left without one whose
    /// arguments are not valid JSON; the parser's message follows.
    pub const MALFORMED: &'static str = "error: this tool call was not executed: its arguments \
         are not valid JSON";

    /// The synthetic result of `call`, left without one: [`ToolResult::UNANSWERED`], or
    /// [`ToolResult::MALFORMED`] with the parser's message when its arguments are not JSON.
    /// Deterministic: no clock, no random id.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::{ToolCall, ToolResult};
    ///
    /// let call = ToolCall::new("c1", "search", json!({}));
    /// assert_eq!(ToolResult::unanswered(&call).content, ToolResult::UNANSWERED);
    /// let broken = ToolCall { arguments: "{oops".into(), ..call };
    /// assert!(ToolResult::unanswered(&broken).content.starts_with(ToolResult::MALFORMED));
    /// ```
    pub fn unanswered(call: &ToolCall) -> Self {
        match call.parse_arguments::<serde::de::IgnoredAny>() {
            Ok(_) => Self::error(call, Self::UNANSWERED),
            Err(error) => Self::error(call, format!("{} ({error}).", Self::MALFORMED)),
        }
    }

    /// The same result with `content` instead: for an `after_tool` callback that rewrites what
    /// the model sees. The call id, the tool name and the error flag are kept.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::{ToolCall, ToolResult};
    ///
    /// let call = ToolCall::new("c1", "search", json!({}));
    /// let result = ToolResult::success(&call, "a very long page").with_content("[trimmed]");
    /// assert_eq!((result.call_id.as_str(), result.content.as_str()), ("c1", "[trimmed]"));
    /// ```
    pub fn with_content(mut self, content: impl Into<String>) -> Self {
        self.content = content.into();
        self
    }

    /// The same result marked as an error (`true`) or a success (`false`).
    pub fn with_error(mut self, is_error: bool) -> Self {
        self.is_error = is_error;
        self
    }
}

/// One part of a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// The model's reasoning ("thinking"), kept so providers that need it back get it.
    Reasoning {
        /// The reasoning text (may be empty when the provider only sends a signature).
        text: String,
        /// A provider's opaque signature or encrypted reasoning, to send back unchanged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// A call the model asked for.
    ToolCall(ToolCall),
    /// The answer to a call.
    ToolResult(ToolResult),
}

/// A message of the conversation.
///
/// ```
/// use tower_agent_core::{Message, Role};
///
/// let msg = Message::user("What is 2 + 2?");
/// assert_eq!(msg.role, Role::User);
/// assert_eq!(msg.text(), "What is 2 + 2?");
/// let json = serde_json::to_string(&msg).unwrap();
/// assert_eq!(serde_json::from_str::<Message>(&json).unwrap(), msg);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// What it says, in order.
    pub content: Vec<ContentPart>,
}

impl Message {
    /// A message of `role` holding one text part.
    pub fn new(role: Role, text: impl Into<String>) -> Self {
        Self {
            role,
            content: vec![ContentPart::Text { text: text.into() }],
        }
    }

    /// A user message.
    pub fn user(text: impl Into<String>) -> Self {
        Self::new(Role::User, text)
    }

    /// An assistant message with text only.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::new(Role::Assistant, text)
    }

    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        Self::new(Role::System, text)
    }

    /// An assistant message with optional text followed by tool calls.
    pub fn assistant_with_calls(
        text: impl Into<String>,
        calls: impl IntoIterator<Item = ToolCall>,
    ) -> Self {
        let text = text.into();
        let mut content = Vec::new();
        if !text.is_empty() {
            content.push(ContentPart::Text { text });
        }
        content.extend(calls.into_iter().map(ContentPart::ToolCall));
        Self {
            role: Role::Assistant,
            content,
        }
    }

    /// A tool message carrying one result.
    pub fn tool_result(result: ToolResult) -> Self {
        Self {
            role: Role::Tool,
            content: vec![ContentPart::ToolResult(result)],
        }
    }

    /// The text parts joined together (reasoning excluded).
    pub fn text(&self) -> String {
        let mut out = String::new();
        for part in &self.content {
            if let ContentPart::Text { text } = part {
                out.push_str(text);
            }
        }
        out
    }

    /// Rewrite the message's text with `f` (it gets the text parts joined, as
    /// [`Message::text`] gives them), keeping everything else: tool calls, reasoning and their
    /// order. The new text takes the place of the first text part (or, when there was none,
    /// goes after the leading reasoning parts); an empty new text removes the text.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::{Message, ToolCall};
    ///
    /// let msg = Message::assistant_with_calls("my key is sk-123", [ToolCall::new("c1", "t", json!({}))]);
    /// let msg = msg.map_text(|text| text.replace("sk-123", "[redacted]"));
    /// assert_eq!(msg.text(), "my key is [redacted]");
    /// assert_eq!(msg.tool_calls().count(), 1);
    /// ```
    pub fn map_text(mut self, f: impl FnOnce(String) -> String) -> Self {
        // Where the first text was, or after the leading reasoning (providers want thinking
        // first).
        let at = self
            .content
            .iter()
            .position(|p| matches!(p, ContentPart::Text { .. }))
            .unwrap_or_else(|| {
                self.content
                    .iter()
                    .take_while(|p| matches!(p, ContentPart::Reasoning { .. }))
                    .count()
            });
        let text = self.text();
        self.content
            .retain(|p| !matches!(p, ContentPart::Text { .. }));
        let text = f(text);
        if !text.is_empty() {
            self.content.insert(at, ContentPart::Text { text });
        }
        self
    }

    /// Whether the message has any non-empty text part.
    pub fn has_text(&self) -> bool {
        self.content
            .iter()
            .any(|p| matches!(p, ContentPart::Text { text } if !text.is_empty()))
    }

    /// The tool calls, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.content.iter().filter_map(|p| match p {
            ContentPart::ToolCall(call) => Some(call),
            _ => None,
        })
    }

    /// Whether the message asks for any tool call.
    pub fn has_tool_calls(&self) -> bool {
        self.tool_calls().next().is_some()
    }

    /// The tool results, in order.
    pub fn tool_results(&self) -> impl Iterator<Item = &ToolResult> {
        self.content.iter().filter_map(|p| match p {
            ContentPart::ToolResult(result) => Some(result),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn serde_round_trip_of_every_part() {
        let msg = Message {
            role: Role::Assistant,
            content: vec![
                ContentPart::Reasoning {
                    text: "think".into(),
                    signature: Some("sig".into()),
                },
                ContentPart::Text { text: "hi".into() },
                ContentPart::ToolCall(ToolCall::new("c1", "add", json!({"a": 1}))),
                ContentPart::ToolResult(ToolResult::success(
                    &ToolCall::new("c1", "add", json!({})),
                    "2",
                )),
            ],
        };
        let value = serde_json::to_value(&msg).unwrap();
        assert_eq!(value["role"], "assistant");
        assert_eq!(value["content"][0]["type"], "reasoning");
        assert_eq!(value["content"][2]["type"], "tool_call");
        assert_eq!(value["content"][2]["arguments"], r#"{"a":1}"#);
        assert_eq!(value["content"][3]["type"], "tool_result");
        let back: Message = serde_json::from_value(value).unwrap();
        assert_eq!(back, msg);
    }

    #[test]
    fn arguments_parse_and_fail_cleanly() {
        #[derive(Deserialize, Debug, PartialEq)]
        struct Args {
            a: i64,
        }
        let ok = ToolCall::raw("c", "t", r#"{"a": 5}"#);
        assert_eq!(ok.parse_arguments::<Args>().unwrap(), Args { a: 5 });
        let broken = ToolCall::raw("c", "t", r#"{"a": 5"#);
        assert!(broken.parse_arguments::<Args>().is_err());
        let empty = ToolCall::raw("c", "t", "");
        assert_eq!(empty.parse_arguments::<Value>().unwrap(), json!({}));
    }

    #[test]
    fn map_text_keeps_everything_but_the_text() {
        let msg = Message {
            role: Role::Assistant,
            content: vec![
                ContentPart::Reasoning {
                    text: "think".into(),
                    signature: Some("sig".into()),
                },
                ContentPart::Text { text: "a".into() },
                ContentPart::ToolCall(ToolCall::new("1", "t", json!({}))),
                ContentPart::Text { text: "b".into() },
            ],
        };
        let mapped = msg.clone().map_text(|t| t.to_uppercase());
        assert_eq!(mapped.text(), "AB");
        assert!(matches!(mapped.content[0], ContentPart::Reasoning { .. }));
        assert!(matches!(&mapped.content[1], ContentPart::Text { text } if text == "AB"));
        assert_eq!(mapped.tool_calls().count(), 1);
        assert_eq!(mapped.content.len(), 3);
        // An empty text removes the text; a text for a message without one goes first.
        let emptied = msg.map_text(|_| String::new());
        assert!(!emptied.has_text());
        assert_eq!(emptied.content.len(), 2);
        let added = Message::assistant_with_calls("", [ToolCall::new("1", "t", json!({}))])
            .map_text(|_| "checking".into());
        assert!(matches!(&added.content[0], ContentPart::Text { text } if text == "checking"));
        let thinking = Message {
            role: Role::Assistant,
            content: vec![
                ContentPart::Reasoning {
                    text: "hmm".into(),
                    signature: None,
                },
                ContentPart::ToolCall(ToolCall::new("1", "t", json!({}))),
            ],
        }
        .map_text(|_| "checking".into());
        assert!(matches!(thinking.content[0], ContentPart::Reasoning { .. }));
        assert!(matches!(&thinking.content[1], ContentPart::Text { text } if text == "checking"));
    }

    #[test]
    fn text_and_calls_are_extracted_in_order() {
        let msg = Message::assistant_with_calls(
            "let me check",
            [
                ToolCall::new("1", "a", json!({})),
                ToolCall::new("2", "b", json!({})),
            ],
        );
        assert_eq!(msg.text(), "let me check");
        let names: Vec<_> = msg.tool_calls().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(!Message::assistant_with_calls("", []).has_text());
    }
}
