//! Redaction: emails, phone numbers, API keys and patterns of your own, replaced or masked, with
//! the same rules on whole texts and on streams.
//!
//! [`Rules`] are named patterns whose matches have a bounded length (a pattern that could match
//! any length is refused: no stream could hold back enough to catch it split in two).
//! [`Rules::redact`] redacts a whole text; [`Rules::stream`] a text that arrives in pieces,
//! holding back only what a match could still need ([`Rules::holdback`]), and releasing, piece
//! by piece, exactly the redaction of the whole text (a property test cuts texts anywhere).
//! [`RedactLayer`] applies them to the model's input, its output (streamed deltas included)
//! and tool results.

mod layer;
mod rules;
mod stream;

pub use layer::{Redact, RedactLayer};
pub use rules::{API_KEY, EMAIL, PHONE, Replace, RuleError, Rules};
pub use stream::RedactStream;

/// The boxed future of [`Redact`].
pub type ResponseFuture<T> =
    tower_agent_core::event::BoxFuture<'static, Result<T, tower_agent_core::Error>>;
