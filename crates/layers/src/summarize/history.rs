//! What summarization does to a history, without any service: how the summarizer sees the
//! messages, the summary message, argument truncation, the running count.

use std::fmt::Write as _;

use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use tower_agent_core::{
    ContentPart, ExtensionKey, History, HistoryMark, Message, ModelRequest, Role, RunContext, Usage,
};

use crate::text::clip_chars;
use crate::tokens::{RunningCount, TokenCounter};

/// The first line of a summary message.
pub const SUMMARY_OPEN: &str = "<conversation_summary>";
/// The last line of a summary message.
pub const SUMMARY_CLOSE: &str = "</conversation_summary>";

/// The message that stands for the summarized part of a conversation: a user message
/// `<conversation_summary>\n{summary}\n</conversation_summary>`.
///
/// ```
/// use tower_agent_layers::summarize::{is_summary, summary_message, summary_text};
///
/// let message = summary_message("The user wants a report on Q3.");
/// assert!(is_summary(&message));
/// assert_eq!(summary_text(&message), Some("The user wants a report on Q3."));
/// assert!(!is_summary(&tower_agent_core::Message::user("hello")));
/// ```
pub fn summary_message(summary: &str) -> Message {
    Message::user(format!(
        "{SUMMARY_OPEN}\n{}\n{SUMMARY_CLOSE}",
        summary.trim()
    ))
}

/// Whether `message` is a summary written by the summarization layer.
pub fn is_summary(message: &Message) -> bool {
    summary_text(message).is_some()
}

/// The summary a summary message carries.
pub fn summary_text(message: &Message) -> Option<&str> {
    if message.role != Role::User {
        return None;
    }
    let [ContentPart::Text { text }] = message.content.as_slice() else {
        return None;
    };
    text.strip_prefix(SUMMARY_OPEN)?
        .strip_suffix(SUMMARY_CLOSE)
        .map(str::trim)
}

/// How many of the last messages to keep so that they hold at most `tokens` (at least one).
pub(crate) fn keep_for_tokens(
    messages: &[Message],
    tokens: usize,
    counter: &dyn TokenCounter,
) -> usize {
    let mut total = 0;
    let mut kept = 0;
    for message in messages.iter().rev() {
        total += counter.count_message(message);
        if total > tokens && kept > 0 {
            break;
        }
        kept += 1;
    }
    kept
}

/// The longest clip of one part shown to the summarizer, in characters.
pub(crate) const RENDER_CLIP: usize = 2_000;

/// `messages` as text for the summarizer: one line per part, reasoning left out, each part
/// clipped to `clip` characters.
pub(crate) fn render(messages: &[Message], clip: usize) -> String {
    let mut out = String::new();
    for message in messages {
        let role = match message.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        for part in &message.content {
            let _ = match part {
                ContentPart::Text { text } => {
                    writeln!(out, "[{role}]: {}", clipped(text, clip))
                }
                ContentPart::Reasoning { .. } => Ok(()),
                ContentPart::ToolCall(call) => writeln!(
                    out,
                    "[{role} calls {}]: {}",
                    call.name,
                    clipped(&call.arguments, clip)
                ),
                ContentPart::ToolResult(result) => writeln!(
                    out,
                    "[{} result{}]: {}",
                    result.name,
                    if result.is_error { ", an error" } else { "" },
                    clipped(&result.content, clip)
                ),
            };
        }
    }
    out
}

/// `messages` in full as markdown, for the offloaded conversation file.
pub(crate) fn render_markdown(messages: &[Message], round: u32) -> String {
    let mut out = format!(
        "\n## Summarized at round {round} ({} messages)\n\n",
        messages.len()
    );
    for message in messages.iter().filter(|m| !is_summary(m)) {
        for part in &message.content {
            let _ = match part {
                ContentPart::Text { text } => {
                    writeln!(out, "**{:?}**: {text}\n", message.role)
                }
                ContentPart::Reasoning { text, .. } => {
                    writeln!(out, "**{:?}** (reasoning): {text}\n", message.role)
                }
                ContentPart::ToolCall(call) => writeln!(
                    out,
                    "**{:?}** calls `{}` (`{}`): `{}`\n",
                    message.role, call.name, call.id, call.arguments
                ),
                ContentPart::ToolResult(result) => writeln!(
                    out,
                    "**{}** result (`{}`{}):\n\n```\n{}\n```\n",
                    result.name,
                    result.call_id,
                    if result.is_error { ", error" } else { "" },
                    result.content
                ),
            };
        }
    }
    out
}

/// `text` cut to at most `tokens` by `counter`, with a marker when it was cut.
pub(crate) fn clip_to_tokens<'a>(
    text: &'a str,
    tokens: usize,
    counter: &dyn TokenCounter,
) -> Cow<'a, str> {
    if counter.count_text(text) <= tokens {
        return Cow::Borrowed(text);
    }
    // The longest prefix, in characters, that fits with the marker.
    let chars = text.chars().count();
    let cut_at = |n: usize| text.char_indices().nth(n).map_or(text.len(), |(at, _)| at);
    let marked = |n: usize| format!("{}… [cut]", &text[..cut_at(n)]);
    let (mut low, mut high) = (0, chars);
    while low < high {
        let mid = (low + high).div_ceil(2);
        if counter.count_text(&marked(mid)) <= tokens {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    Cow::Owned(marked(low))
}

/// `messages` with the tool results and call arguments after a leading summary clipped to
/// `max` characters (arguments: each long string value), or `None` when none was longer.
pub(crate) fn clip_kept(
    messages: &[Message],
    max: usize,
    counter: &dyn TokenCounter,
) -> Option<History> {
    let mut out = messages.to_vec();
    let start = usize::from(out.first().is_some_and(is_summary));
    let mut changed = truncate_arguments(&mut out[start..], max, counter) > 0;
    for message in &mut out[start..] {
        for part in &mut message.content {
            let ContentPart::ToolResult(result) = part else {
                continue;
            };
            if let (kept, left @ 1..) = clip_chars(&result.content, max) {
                let clipped = format!(
                    "{kept}… [clipped {left} characters to fit the model's context window]"
                );
                // Only when it saves tokens: the marker counts too.
                if counter.count_text(&clipped) < counter.count_text(&result.content) {
                    result.content = clipped;
                    changed = true;
                }
            }
        }
    }
    changed.then(|| History::from(out))
}

/// `messages` with the text of a leading summary cut to half its tokens, or `None` when
/// there is no summary or it is too short to cut.
pub(crate) fn cut_summary(messages: &[Message], counter: &dyn TokenCounter) -> Option<History> {
    let text = messages.first().and_then(summary_text)?;
    let tokens = counter.count_text(text);
    if tokens < 16 {
        return None;
    }
    let cut = clip_to_tokens(text, tokens / 2, counter);
    let mut out = messages.to_vec();
    out[0] = summary_message(&cut);
    Some(History::from(out))
}

/// `messages` without a leading summary, or `None` when there is none or nothing else.
pub(crate) fn drop_summary(messages: &[Message]) -> Option<History> {
    match messages.split_first() {
        Some((first, rest)) if is_summary(first) && !rest.is_empty() => {
            Some(History::from(rest.to_vec()))
        }
        _ => None,
    }
}

fn clipped(text: &str, clip: usize) -> Cow<'_, str> {
    match clip_chars(text, clip) {
        (all, 0) => all.into(),
        (kept, left) => format!("{kept}… [{left} more characters]").into(),
    }
}

/// Shorten every string value of over `max` characters in the arguments of the tool calls
/// of `messages`, with a marker `… [truncated N characters]`. Arguments that are not JSON
/// are left alone (a provider that sends them as an object could not parse a cut). Returns
/// how many calls changed.
pub(crate) fn truncate_arguments(
    messages: &mut [Message],
    max: usize,
    counter: &dyn TokenCounter,
) -> usize {
    let mut changed = 0;
    for message in messages {
        for part in &mut message.content {
            let ContentPart::ToolCall(call) = part else {
                continue;
            };
            if call.arguments.chars().count() <= max {
                continue;
            }
            let Ok(mut value) = serde_json::from_str::<Value>(&call.arguments) else {
                continue;
            };
            if !truncate_strings(&mut value, max) {
                continue;
            }
            // Only when it saves tokens: the marker counts too.
            let arguments = value.to_string();
            if counter.count_text(&arguments) < counter.count_text(&call.arguments) {
                call.arguments = arguments;
                changed += 1;
            }
        }
    }
    changed
}

fn truncate_strings(value: &mut Value, max: usize) -> bool {
    match value {
        Value::String(text) => match clip_chars(text, max) {
            (_, 0) => false,
            (kept, left) => {
                let cut = format!("{kept}… [truncated {left} characters]");
                // Only when it saves something: the marker has a length too.
                let shorter = cut.len() < text.len();
                if shorter {
                    *text = cut;
                }
                shorter
            }
        },
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |any, item| truncate_strings(item, max) | any),
        Value::Object(map) => map
            .values_mut()
            .fold(false, |any, item| truncate_strings(item, max) | any),
        _ => false,
    }
}

/// Where one summarization layer keeps its counts in a run's extensions: two layers keep two.
#[derive(Clone, Debug, Default)]
pub(crate) struct Slots {
    tally: ExtensionKey<Arc<Mutex<RunningCount>>>,
    reported: ExtensionKey<Reported>,
}

/// The run's running count of its requests ([`RunningCount`], the one the clear and budget
/// layers keep too), in its context: each round counts only the messages it added.
pub(crate) struct Tally;

impl Tally {
    fn of(ctx: &RunContext, slots: &Slots) -> Arc<Mutex<RunningCount>> {
        ctx.extension_at_or_insert_with(&slots.tally, Default::default)
    }

    /// The estimated tokens of `req` (system prompt, tool specs, messages), counting only the
    /// messages added since the last count of this run when the history still starts the same.
    pub(crate) fn count(slots: &Slots, req: &ModelRequest, counter: &dyn TokenCounter) -> usize {
        let running = Self::of(&req.ctx, slots);
        let mut running = running.lock().unwrap_or_else(PoisonError::into_inner);
        running.count(counter, req)
    }

    /// Remember that `messages` (the history the layer commits) hold `tokens`.
    pub(crate) fn store(ctx: &RunContext, slots: &Slots, messages: &History, tokens: usize) {
        let running = Self::of(ctx, slots);
        let mut running = running.lock().unwrap_or_else(PoisonError::into_inner);
        running.set_messages(messages, tokens);
    }
}

pub(crate) use crate::tokens::tool_tokens;

/// The tokens of `req`: as the provider counted the part it reported ([`Reported`]), the rest
/// estimated ([`Tally`]).
pub(crate) fn count_request(
    slots: &Slots,
    req: &ModelRequest,
    counter: &dyn TokenCounter,
) -> usize {
    let estimate = Tally::count(slots, req, counter);
    Reported::count(&req.ctx, slots, &req.messages, counter).unwrap_or(estimate)
}

/// What the provider counted for the last call of a run that reported its usage: the
/// tokens of its request and of its answer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reported {
    /// The messages the request held.
    mark: HistoryMark,
    /// `input_tokens + output_tokens`.
    tokens: usize,
}

impl Reported {
    /// Remember what the provider counted for a request of `sent` (nothing when it reported
    /// no input tokens).
    pub(crate) fn store(ctx: &RunContext, slots: &Slots, sent: &History, usage: Usage) {
        if usage.input_tokens == 0 {
            return;
        }
        let tokens = usage.input_tokens.saturating_add(usage.output_tokens);
        let reported = Reported {
            mark: sent.mark(),
            tokens: usize::try_from(tokens).unwrap_or(usize::MAX),
        };
        ctx.insert_extension_at(&slots.reported, reported);
    }

    /// The tokens of a request of `messages`: when it holds the last request that reported
    /// its usage and that request's answer, what the provider counted for those and an
    /// estimate of the messages since; `None` otherwise.
    pub(crate) fn count(
        ctx: &RunContext,
        slots: &Slots,
        messages: &History,
        counter: &dyn TokenCounter,
    ) -> Option<usize> {
        let reported = ctx.extension_at(&slots.reported)?;
        let (answer, since) = messages.since(&reported.mark)?.split_first()?;
        if answer.role != Role::Assistant {
            return None;
        }
        let since: usize = since.iter().map(|m| counter.count_message(m)).sum();
        Some(reported.tokens + since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::CharEstimate;
    use serde_json::json;
    use tower_agent_core::ToolCall;

    #[test]
    fn truncation_keeps_json_and_marks_the_cut() {
        let long = "é".repeat(50);
        let mut messages = vec![Message::assistant_with_calls(
            "",
            [ToolCall::new(
                "c1",
                "write_file",
                json!({"path": "a.txt", "content": long, "lines": ["short", "y".repeat(60), "n".repeat(30)]}),
            )],
        )];
        assert_eq!(truncate_arguments(&mut messages, 10, &CharEstimate), 1);
        let args: Value = messages[0]
            .tool_calls()
            .next()
            .map(|c| serde_json::from_str(&c.arguments))
            .expect("a call")
            .expect("still JSON");
        assert_eq!(args["path"], "a.txt");
        assert_eq!(
            args["content"],
            format!("{}… [truncated 40 characters]", "é".repeat(10))
        );
        assert_eq!(args["lines"][0], "short");
        assert_eq!(
            args["lines"][1],
            format!("{}… [truncated 50 characters]", "y".repeat(10))
        );
        // Cut with its marker, it would be longer: left alone.
        assert_eq!(args["lines"][2], "n".repeat(30));
        // Not JSON: left alone.
        let mut raw = vec![Message::assistant_with_calls(
            "",
            [ToolCall::raw("c2", "w", "x".repeat(100))],
        )];
        assert_eq!(truncate_arguments(&mut raw, 10, &CharEstimate), 0);
    }

    #[test]
    fn the_tally_counts_only_new_messages_and_notices_rewrites() {
        let counter = CharEstimate;
        let ctx = RunContext::new();
        let mut req = ModelRequest::new(vec![Message::user("a".repeat(40))]);
        req.ctx = ctx.clone();
        let slots = Slots::default();
        let first = Tally::count(&slots, &req, &counter);
        assert_eq!(first, 10 + crate::tokens::MESSAGE_OVERHEAD);
        // The next round's history: the same one, grown.
        let mut history = req.messages.clone();
        history.push(Message::assistant("b".repeat(8)));
        req.messages = history;
        let counted = Counted::default();
        assert_eq!(
            Tally::count(&slots, &req, &counted),
            first + 2 + crate::tokens::MESSAGE_OVERHEAD
        );
        assert_eq!(
            counted.messages.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "only the new message is counted"
        );
        // Rewritten: counted whole again.
        req.messages = vec![Message::user("c".repeat(4)), Message::user("d")].into();
        assert_eq!(
            Tally::count(&slots, &req, &counted),
            2 + 2 * crate::tokens::MESSAGE_OVERHEAD
        );
        assert_eq!(
            counted.messages.load(std::sync::atomic::Ordering::Relaxed),
            3
        );
    }

    /// The character estimate, counting the messages it is asked about.
    #[derive(Default)]
    struct Counted {
        messages: std::sync::atomic::AtomicUsize,
    }

    impl TokenCounter for Counted {
        fn count_text(&self, text: &str) -> usize {
            CharEstimate.count_text(text)
        }

        fn count_message(&self, message: &Message) -> usize {
            self.messages
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            CharEstimate.count_message(message)
        }
    }

    #[test]
    fn rendering_clips_and_leaves_reasoning_out() {
        let message = Message {
            role: Role::Assistant,
            content: vec![
                ContentPart::Reasoning {
                    text: "secret thoughts".into(),
                    signature: None,
                },
                ContentPart::Text {
                    text: "x".repeat(30),
                },
            ],
        };
        let text = render(&[message], 10);
        assert!(!text.contains("secret"));
        assert!(
            text.contains("[assistant]: xxxxxxxxxx… [20 more characters]"),
            "{text}"
        );
    }
}
