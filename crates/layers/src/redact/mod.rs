//! Redaction: emails, phone numbers, API keys and patterns of your own, replaced or masked, with
//! the same rules on whole texts and on streams.
//!
//! [`Rules`] are named patterns whose matches have a bounded length (a pattern that could match
//! any length is refused: no stream could hold back enough to catch it split in two).
//! [`Rules::redact`] redacts a whole text; [`Rules::stream`] a text that arrives in pieces,
//! releasing, piece by piece, exactly the redaction of the whole text (a property test cuts
//! texts anywhere and checks what went up after every piece).
//! [`RedactLayer`] applies them to the model's input, its output (streamed deltas included)
//! and tool results.
//!
//! # Strategies
//!
//! Each rule says what replaces its matches ([`Replace`]): a label (`[REDACTED:email]`), a mask,
//! a mask keeping a tail (a card's last four), a keyed hash, or a text of yours. LangChain's
//! fifth strategy, *block*, refuses the text instead of rewriting it: that is a guardrail's
//! job here, [`Guardrail::blocking`](crate::guardrail::Guardrail::blocking) made from rules of
//! their own, which ends the run with the rule named and nothing refused saved (where LangChain
//! raises). A pattern is rewritten or refused, not both: a guardrail inside the redaction
//! would not see a match the redaction already replaced in the input.
//!
//! # What a stream holds back
//!
//! Only the tail in which a match could still be growing: the longest end of the text so far
//! that is the beginning of a match of some rule (a whole match included, it could grow).
//! Everything before it is released, redacted: every match that starts there ends before the
//! text so far does, whatever comes next. An email cannot hold a space, so on prose the tail is
//! at most the word being written (`Sure,` goes up at its comma, `write` at the space after
//! it), which at 200 characters a second is 50 ms for a word of 10 characters. The tail grows
//! past a space only where a match can: `Bearer ` (a token may follow), `+1 415` (a phone
//! number). It is never longer than [`Rules::holdback`] bytes unless it is a whole match (it
//! could grow). The beginnings of the rules' matches are one regular expression, derived from
//! the patterns; should it be too large for the regex crate to compile, a stream falls back to
//! holding back the last [`Rules::holdback`] bytes.

mod layer;
mod rules;
mod stream;

pub use layer::{Redact, RedactLayer};
pub use rules::{API_KEY, EMAIL, PHONE, Replace, RuleError, Rules};
pub use stream::RedactStream;

/// The boxed future of [`Redact`].
pub type ResponseFuture<T> =
    tower_agent_core::event::BoxFuture<'static, Result<T, tower_agent_core::Error>>;
