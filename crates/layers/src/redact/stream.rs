//! Redaction of a stream of text: the least held back that still catches a match split across
//! pieces, the tail in which a match could still be growing.

use std::sync::Arc;

use tower_agent_core::{Delta, Error, StreamFilter};

use super::Rules;

/// Redacts a text that arrives in pieces (a content block of a streamed message): what
/// [`push`](RedactStream::push) and [`finish`](RedactStream::finish) return, put together, is
/// what [`Rules::redact`] makes of the whole text, and what has gone up is always its
/// beginning.
///
/// It holds back only the tail in which a match could still be growing: the longest end of the
/// text so far that is the beginning of a match of some rule, a whole match included (see the
/// [module](super#what-a-stream-holds-back)). On prose that is the word being written; never
/// more than [`Rules::holdback`] bytes, but for a whole match that ends where the text so far
/// ends.
///
/// ```
/// use tower_agent_layers::redact::Rules;
///
/// let rules = Rules::new().emails();
/// let mut stream = rules.stream();
/// // `ada@exa` could be the beginning of an address: held; the rest goes up.
/// let mut out = stream.push("write to ada@exa");
/// assert_eq!(out, "write to ");
/// // The address is whole (a space cannot be in one), `today` could begin another.
/// out += &stream.push("mple.com today");
/// assert_eq!(out, "write to [REDACTED:email] ");
/// out += &stream.finish();
/// assert_eq!(out, "write to [REDACTED:email] today");
/// ```
#[derive(Debug)]
pub struct RedactStream<'r> {
    rules: &'r Rules,
    held: Held,
}

/// What a stream has not released yet.
#[derive(Debug, Default)]
struct Held {
    /// The text not released yet, after `context` bytes already released (kept for the
    /// patterns' assertions, `\b` among them).
    pending: String,
    context: usize,
}

impl Rules {
    /// A stream redacted with these rules.
    pub fn stream(&self) -> RedactStream<'_> {
        RedactStream {
            rules: self,
            held: Held::default(),
        }
    }
}

impl RedactStream<'_> {
    /// Take the next piece; the redacted text that can be released now.
    pub fn push(&mut self, piece: &str) -> String {
        self.held.push(self.rules, piece)
    }

    /// The end of the text: the rest, redacted.
    pub fn finish(&mut self) -> String {
        self.held.finish(self.rules)
    }

    /// Forget what was pushed (a call started again): nothing is released of it.
    pub fn reset(&mut self) {
        self.held = Held::default();
    }
}

impl Held {
    fn push(&mut self, rules: &Rules, piece: &str) -> String {
        self.pending.push_str(piece);
        let len = self.pending.len();
        let matches = rules.matches(&self.pending, self.context);
        // Hold back the tail in which a match could still be growing: a match of any rule
        // starting before `cut` is whole already, it cannot reach past the text so far. One
        // may reach into the tail (a key whose last digits could begin a phone number): it
        // goes up whole.
        let mut cut = rules.growing(&self.pending, self.context);
        for &(start, end, _) in &matches {
            if start < cut && (end > cut || end == len) {
                // Release a whole match only when text follows it (it cannot grow, and its
                // assertions saw what follows); else keep it.
                cut = if end < len { end } else { start };
            }
        }
        let mut out = String::new();
        let released: Vec<_> = matches.into_iter().filter(|m| m.1 <= cut).collect();
        rules.write(&self.pending, self.context, cut, &released, &mut out);
        self.keep_from(cut);
        out
    }

    fn finish(&mut self, rules: &Rules) -> String {
        let matches = rules.matches(&self.pending, self.context);
        let mut out = String::new();
        let len = self.pending.len();
        rules.write(&self.pending, self.context, len, &matches, &mut out);
        *self = Held::default();
        out
    }

    /// Keep the text from `cut` on, and the character before it as context.
    fn keep_from(&mut self, cut: usize) {
        let context_start = self.pending[..cut]
            .char_indices()
            .next_back()
            .map_or(cut, |(at, _)| at);
        self.pending.drain(..context_start);
        self.context = cut - context_start;
    }
}

/// The filter [`RedactLayer`](super::RedactLayer) puts on a model call's stream: text and
/// reasoning each redacted as one stream ([`RedactStream`]'s hold-back: the tail in which a
/// match could still be growing).
pub(super) struct RedactFilter {
    rules: Arc<Rules>,
    text: Held,
    reasoning: Held,
}

impl RedactFilter {
    pub(super) fn new(rules: Arc<Rules>) -> Self {
        Self {
            rules,
            text: Held::default(),
            reasoning: Held::default(),
        }
    }
}

impl StreamFilter for RedactFilter {
    fn delta(&mut self, delta: Delta, out: &mut Vec<Delta>) -> Result<(), Error> {
        let released = match delta {
            Delta::Text(piece) => Delta::Text(self.text.push(&self.rules, &piece)),
            Delta::Reasoning(piece) => Delta::Reasoning(self.reasoning.push(&self.rules, &piece)),
            // A call closed early starts no tool with a secret in its arguments.
            Delta::ToolCall(mut call) => {
                if let Some(arguments) = self.rules.redact_arguments(&call.arguments) {
                    call.arguments = arguments;
                }
                Delta::ToolCall(call)
            }
            other => other,
        };
        if !is_empty(&released) {
            out.push(released);
        }
        Ok(())
    }

    fn end(&mut self, out: &mut Vec<Delta>) -> Result<(), Error> {
        let reasoning = self.reasoning.finish(&self.rules);
        if !reasoning.is_empty() {
            out.push(Delta::Reasoning(reasoning));
        }
        let text = self.text.finish(&self.rules);
        if !text.is_empty() {
            out.push(Delta::Text(text));
        }
        Ok(())
    }

    fn restart(&mut self) {
        self.text = Held::default();
        self.reasoning = Held::default();
    }
}

fn is_empty(delta: &Delta) -> bool {
    match delta {
        Delta::Text(text) | Delta::Reasoning(text) => text.is_empty(),
        _ => false,
    }
}
