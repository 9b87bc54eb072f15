//! Token estimates for the layers that keep the context small (eviction, summarization,
//! clearing old tool results).
//!
//! A [`TokenCounter`] counts the tokens of a text; the layers add up messages with
//! [`TokenCounter::count_message`]. The default, [`CharEstimate`], needs no tokenizer: a
//! quarter token per ASCII character (rounded up) and one token per other character, so text
//! in Chinese, Russian or emoji is never undercounted the way a count of bytes divided by four
//! would overcount it, or a count of characters divided by four would undercount it. Any
//! `Fn(&str) -> usize` is a counter too, for a real tokenizer.
//!
//! **How far off the estimate is.** Measured against a real tokenizer (SmolLM2's, 49k tokens,
//! through llama-server's `/tokenize`), the estimate counts low, and by how much depends on
//! the text:
//!
//! | text | characters | estimate | SmolLM2 | estimate / real |
//! |---|---|---|---|---|
//! | English prose (the project's docs) | 6,000 | 1,505 | 1,819 | 0.83 |
//! | Rust code | 6,000 | 1,500 | 1,654 | 0.91 |
//! | JSON (a tool result) | 8,032 | 2,008 | 4,313 | 0.47 |
//! | German prose | 2,860 | 775 | 1,161 | 0.67 |
//! | Chinese prose | 1,320 | 1,320 | 2,120 | 0.62 |
//!
//! Larger vocabularies (OpenAI's, Anthropic's) come closer to four characters a token in
//! English, but JSON and other languages stay under-counted. So a budget set from the estimate
//! should leave room, and the summarization layer counts a run's previous call as the
//! provider reported it, estimating only what came since.
//!
//! With the feature `tiktoken`, `Tiktoken` counts text exactly as OpenAI's models do (`o200k_base`
//! for the GPT-4o, GPT-4.1, GPT-5 and o-series families, `cl100k_base` for GPT-4 and GPT-3.5),
//! from the encodings `tiktoken-rs` carries (no download).
//!
//! ```
//! use tower_agent_layers::tokens::{CharEstimate, TokenCounter};
//!
//! assert_eq!(CharEstimate.count_text("abcdefgh"), 2);
//! assert_eq!(CharEstimate.count_text("abcdefghi"), 3);
//! assert_eq!(CharEstimate.count_text("日本語"), 3);
//! let words = |text: &str| text.split_whitespace().count();
//! assert_eq!(words.count_text("three small words"), 3);
//! ```

use tower_agent_core::{ContentPart, Message};

/// Counts tokens. Implemented by [`CharEstimate`] and by every `Fn(&str) -> usize`.
pub trait TokenCounter: Send + Sync + 'static {
    /// The tokens of `text`.
    fn count_text(&self, text: &str) -> usize;

    /// The tokens of `message`: its parts (text, reasoning and its signature, a call's name
    /// and arguments, a result's name and content) plus [`MESSAGE_OVERHEAD`] for the framing
    /// a provider adds.
    fn count_message(&self, message: &Message) -> usize {
        let parts: usize = message
            .content
            .iter()
            .map(|part| match part {
                ContentPart::Text { text } => self.count_text(text),
                ContentPart::Reasoning { text, signature } => {
                    self.count_text(text) + signature.as_deref().map_or(0, |s| self.count_text(s))
                }
                ContentPart::ToolCall(call) => {
                    self.count_text(&call.name) + self.count_text(&call.arguments)
                }
                ContentPart::ToolResult(result) => {
                    self.count_text(&result.name) + self.count_text(&result.content)
                }
            })
            .sum();
        parts + MESSAGE_OVERHEAD
    }
}

/// The tokens [`TokenCounter::count_message`] adds per message for its framing.
pub const MESSAGE_OVERHEAD: usize = 4;

/// OpenAI's tokenizer (feature `tiktoken`): the exact count of a text for OpenAI's models.
/// Messages are counted by [`TokenCounter::count_message`] (their parts, plus
/// [`MESSAGE_OVERHEAD`]), not as OpenAI frames them: close, not exact.
///
/// ```
/// use tower_agent_layers::tokens::{Tiktoken, TokenCounter};
///
/// let counter = Tiktoken::for_model("gpt-4o").expect("a known model");
/// assert_eq!(counter.count_text("Hello, world!"), 4);
/// assert!(Tiktoken::for_model("claude-sonnet-4-5").is_none());
/// ```
#[cfg(feature = "tiktoken")]
#[derive(Clone, Copy)]
pub struct Tiktoken {
    bpe: &'static tiktoken_rs::CoreBPE,
    name: &'static str,
}

#[cfg(feature = "tiktoken")]
impl Tiktoken {
    /// `o200k_base`: GPT-4o, GPT-4.1, GPT-5, the o-series.
    pub fn o200k() -> Self {
        Self {
            bpe: tiktoken_rs::o200k_base_singleton(),
            name: "o200k_base",
        }
    }

    /// `cl100k_base`: GPT-4, GPT-3.5.
    pub fn cl100k() -> Self {
        Self {
            bpe: tiktoken_rs::cl100k_base_singleton(),
            name: "cl100k_base",
        }
    }

    /// The encoding of an OpenAI model by its name; `None` for a model tiktoken does not
    /// know (another provider's: use [`CharEstimate`] or a tokenizer of its own).
    pub fn for_model(model: &str) -> Option<Self> {
        match tiktoken_rs::tokenizer::get_tokenizer(model)? {
            tiktoken_rs::tokenizer::Tokenizer::O200kBase
            | tiktoken_rs::tokenizer::Tokenizer::O200kHarmony => Some(Self::o200k()),
            tiktoken_rs::tokenizer::Tokenizer::Cl100kBase => Some(Self::cl100k()),
            _ => None,
        }
    }
}

#[cfg(feature = "tiktoken")]
impl std::fmt::Debug for Tiktoken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Tiktoken").field(&self.name).finish()
    }
}

#[cfg(feature = "tiktoken")]
impl TokenCounter for Tiktoken {
    fn count_text(&self, text: &str) -> usize {
        self.bpe.encode_ordinary(text).len()
    }
}

/// The tokens of a run's requests, counted by what changed since the run's previous one: a
/// request whose history only adds messages to the last one counted is counted by the messages
/// it adds, and a frame (system prompt, tool specs) that did not change is not counted again.
/// A layer that counts every request (a trigger, a budget) keeps one per run, so that passing a
/// request on costs what was added, not the length of the history.
#[cfg(any(feature = "clear", feature = "budget", feature = "summarize"))]
#[derive(Default)]
pub(crate) struct RunningCount {
    /// The tokens of the history's messages, as of the last count.
    messages: tower_agent_core::history::HistoryFold<usize>,
    /// The system prompt and tool specs last counted (the same specs: the same `Arc`), and
    /// their tokens.
    frame: Option<Frame>,
}

#[cfg(any(feature = "clear", feature = "budget", feature = "summarize"))]
struct Frame {
    system: Option<std::sync::Arc<str>>,
    tools: std::sync::Arc<[tower_agent_core::ToolSpec]>,
    tokens: usize,
}

#[cfg(any(feature = "clear", feature = "budget", feature = "summarize"))]
impl RunningCount {
    /// Remember that the messages of `history` hold `tokens` (a layer that rewrote the history
    /// counted what it wrote): the next count starts from there.
    #[cfg(feature = "summarize")]
    pub(crate) fn set_messages(&mut self, history: &tower_agent_core::History, tokens: usize) {
        self.messages.set(history.mark(), tokens);
    }

    /// The tokens of `req` as `counter` counts them: its system prompt, its tool specs (name,
    /// description, parameters) and its messages.
    pub(crate) fn count(
        &mut self,
        counter: &dyn TokenCounter,
        req: &tower_agent_core::ModelRequest,
    ) -> usize {
        let history = &req.messages;
        let messages = self.messages.update(history, |tokens, from| {
            *tokens += history[from..]
                .iter()
                .map(|m| counter.count_message(m))
                .sum::<usize>();
            *tokens
        });
        let frame = match &self.frame {
            Some(frame)
                if frame.system == req.system
                    && std::sync::Arc::ptr_eq(&frame.tools, &req.tools) =>
            {
                frame.tokens
            }
            _ => {
                let system = req.system.as_deref().map_or(0, |s| counter.count_text(s));
                let tokens = system + tool_tokens(&req.tools, counter);
                self.frame = Some(Frame {
                    system: req.system.clone(),
                    tools: std::sync::Arc::clone(&req.tools),
                    tokens,
                });
                tokens
            }
        };
        messages + frame
    }
}

/// The estimated tokens of the tool specs offered: names, descriptions and schemas.
#[cfg(any(feature = "clear", feature = "budget", feature = "summarize"))]
pub(crate) fn tool_tokens(
    specs: &[tower_agent_core::ToolSpec],
    counter: &dyn TokenCounter,
) -> usize {
    specs
        .iter()
        .map(|spec| {
            counter.count_text(&spec.name)
                + counter.count_text(&spec.description)
                + counter.count_text(&spec.parameters.to_string())
        })
        .sum()
}

/// The default estimate: `ceil(ascii / 4) + non_ascii`, counted in characters, not bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CharEstimate;

impl TokenCounter for CharEstimate {
    fn count_text(&self, text: &str) -> usize {
        let bytes = text.as_bytes();
        // The common case, checked a word at a time.
        if bytes.is_ascii() {
            return bytes.len().div_ceil(4);
        }
        let (mut ascii, mut other) = (0, 0);
        for &b in bytes {
            // Every character that is not ASCII starts with a byte that is neither ASCII nor
            // a continuation byte (0b10xx_xxxx).
            ascii += usize::from(b < 0x80);
            other += usize::from(b >= 0xC0);
        }
        ascii.div_ceil(4) + other
    }
}

impl<F> TokenCounter for F
where
    F: Fn(&str) -> usize + Send + Sync + 'static,
{
    fn count_text(&self, text: &str) -> usize {
        self(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_agent_core::ToolCall;

    #[test]
    fn non_ascii_counts_one_per_character() {
        assert_eq!(CharEstimate.count_text(""), 0);
        assert_eq!(CharEstimate.count_text("a"), 1);
        assert_eq!(CharEstimate.count_text("é"), 1);
        assert_eq!(CharEstimate.count_text("🙂🙂"), 2);
        // 4 ASCII characters and 2 others.
        assert_eq!(CharEstimate.count_text("abcdяя"), 3);
        // Never fewer than characters / 4, never more than characters.
        let text = "Größe 大小 size";
        let chars = text.chars().count();
        let n = CharEstimate.count_text(text);
        assert!(
            n >= chars.div_ceil(4) && n <= chars,
            "{n} for {chars} characters"
        );
    }

    #[test]
    fn messages_count_every_part() {
        let call = ToolCall::new("c1", "write", serde_json::json!({"text": "x".repeat(400)}));
        let message = Message::assistant_with_calls("", [call]);
        let n = CharEstimate.count_message(&message);
        assert!(n > 100, "{n}");
        assert_eq!(
            CharEstimate.count_message(&Message::user("")),
            MESSAGE_OVERHEAD
        );
    }
}
