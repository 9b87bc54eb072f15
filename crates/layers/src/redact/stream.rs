//! Redaction of a stream of text: the least held back that still catches a match split across
//! pieces.

use super::Rules;

/// Redacts a text that arrives in pieces (a content block of a streamed message): what
/// [`push`](RedactStream::push) and [`finish`](RedactStream::finish) return, put together, is
/// what [`Rules::redact`] makes of the whole text. It holds back at most
/// [`Rules::holdback`] bytes, and a match that ends where the text so far ends (it could still
/// grow).
///
/// ```
/// use tower_agent_layers::redact::Rules;
///
/// let rules = Rules::new().emails();
/// let mut stream = rules.stream();
/// let mut out = stream.push("write to ada@exa");
/// out += &stream.push("mple.com today");
/// out += &stream.finish();
/// assert_eq!(out, "write to [REDACTED:email] today");
/// ```
#[derive(Debug)]
pub struct RedactStream<'r> {
    rules: &'r Rules,
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
            pending: String::new(),
            context: 0,
        }
    }
}

impl RedactStream<'_> {
    /// Take the next piece; the redacted text that can be released now.
    pub fn push(&mut self, piece: &str) -> String {
        self.pending.push_str(piece);
        let len = self.pending.len();
        let matches = self.rules.matches(&self.pending, self.context);
        // A match of any rule starting before `cut` is whole already: it cannot reach past the
        // text so far.
        let mut cut = floor_char(&self.pending, len.saturating_sub(self.rules.holdback()));
        cut = cut.max(self.context);
        for &(start, end, _) in &matches {
            if start < cut && (end > cut || end == len) {
                // Release a whole match only when text follows it (it cannot grow, and its
                // assertions saw what follows); else keep it.
                cut = if end < len { end } else { start };
            }
        }
        let mut out = String::new();
        let released: Vec<_> = matches.into_iter().filter(|m| m.1 <= cut).collect();
        self.rules
            .write(&self.pending, self.context, cut, &released, &mut out);
        self.keep_from(cut);
        out
    }

    /// The end of the text: the rest, redacted.
    pub fn finish(&mut self) -> String {
        let matches = self.rules.matches(&self.pending, self.context);
        let mut out = String::new();
        let len = self.pending.len();
        self.rules
            .write(&self.pending, self.context, len, &matches, &mut out);
        self.pending.clear();
        self.context = 0;
        out
    }

    /// Forget what was pushed (a call started again): nothing is released of it.
    pub fn reset(&mut self) {
        self.pending.clear();
        self.context = 0;
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

/// The largest char boundary of `text` at or before `at`.
fn floor_char(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}
