//! The rules: patterns with a bounded length, one scan for all of them, and the beginnings of
//! their matches (the tail a stream holds back).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use regex::Regex;
use regex_syntax::hir::{Hir, HirKind, Look, Repetition};
use serde_json::Value;

/// What replaces a match.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Replace {
    /// `[REDACTED:<rule name>]`.
    Label,
    /// The match's characters, each replaced by this one.
    Mask(char),
    /// The match's letters and digits replaced by `mask`, but for its last `keep` ones; other
    /// characters (a card's dashes) are kept: `****-****-****-3456` (LangChain's mask of a
    /// card). Made by [`Replace::mask_keeping`].
    MaskKeeping {
        /// The character that replaces.
        mask: char,
        /// How many of the last letters and digits are kept.
        keep: usize,
    },
    /// `[<rule name>:<16 hex digits>]`: a keyed hash of the match (HMAC-SHA-256 with a secret
    /// of yours), the same for the same value and key, so that a model (and a log reader) can
    /// tell two values apart and see one come back, and nobody without the key can test a
    /// guess. Made by [`Replace::hash`].
    Hash(Arc<[u8]>),
    /// This text.
    Text(Arc<str>),
}

impl Replace {
    /// [`Replace::MaskKeeping`]: mask with `mask`, keeping the last `keep` letters and digits.
    pub fn mask_keeping(mask: char, keep: usize) -> Self {
        Replace::MaskKeeping { mask, keep }
    }

    /// [`Replace::Hash`] keyed by `key` (keep it secret, and the same across processes for the
    /// hashes to stay the same).
    pub fn hash(key: impl AsRef<[u8]>) -> Self {
        Replace::Hash(Arc::from(key.as_ref()))
    }
}

/// The key of a hash never shows.
impl fmt::Debug for Replace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Replace::Label => f.write_str("Label"),
            Replace::Mask(mask) => f.debug_tuple("Mask").field(mask).finish(),
            Replace::MaskKeeping { mask, keep } => f
                .debug_struct("MaskKeeping")
                .field("mask", mask)
                .field("keep", keep)
                .finish(),
            Replace::Hash(_) => f.write_str("Hash(<key>)"),
            Replace::Text(text) => f.debug_tuple("Text").field(text).finish(),
        }
    }
}

/// Why a rule cannot be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    /// The pattern is not a regular expression.
    #[error("rule `{name}`: {message}")]
    Pattern {
        /// The rule's name.
        name: String,
        /// The parser's message.
        message: String,
    },
    /// A match of the pattern may be of any length, so no stream could hold back enough to
    /// catch it split across deltas: bound its repetitions (`{1,64}` rather than `+`).
    #[error(
        "rule `{name}`: a match may be of any length; bound its repetitions (`{{1,64}}`, not `+` or `*`)"
    )]
    Unbounded {
        /// The rule's name.
        name: String,
    },
}

#[derive(Clone)]
struct Rule {
    name: Arc<str>,
    replace: Replace,
    /// The index of the group that wraps the rule's pattern in the combined expression.
    group: usize,
}

/// A set of redaction rules: named patterns, each with what replaces its matches, applied in
/// one scan (the leftmost match wins; between matches at one place, the rule added first).
///
/// Every pattern's matches have a bounded length, and a stream holds back only the tail of the
/// text in which a match could still be growing (the beginning of a match of some rule; at
/// most [`Rules::holdback`] bytes but for a whole match): a secret split across two deltas is
/// caught, and prose streams a word at a time.
///
/// ```
/// use tower_agent_layers::redact::{Replace, Rules};
///
/// let rules = Rules::new().emails().api_keys();
/// assert_eq!(
///     rules.redact("mail ada@example.com, key sk-abcdefghijklmnopqrstuvwx"),
///     "mail [REDACTED:email], key [REDACTED:api_key]"
/// );
/// let masked = Rules::new().pattern("card", r"\d{4}-\d{4}-\d{4}-\d{4}", Replace::Mask('*')).unwrap();
/// assert_eq!(masked.redact("card 1234-5678-9012-3456."), "card *******************.");
/// // The peers' strategies: the last four kept, or a keyed hash (the same value, the same hash).
/// let card = r"\d{4}-\d{4}-\d{4}-\d{4}";
/// let last_four = Rules::new().pattern("card", card, Replace::mask_keeping('*', 4)).unwrap();
/// assert_eq!(last_four.redact("card 1234-5678-9012-3456."), "card ****-****-****-3456.");
/// let hashed = Rules::new().pattern("card", card, Replace::hash(b"a secret key")).unwrap();
/// let (a, b) = (hashed.redact("1234-5678-9012-3456"), hashed.redact("paid with 1234-5678-9012-3456"));
/// assert!(a.starts_with("[card:") && b.ends_with(&*a), "{a} {b}");
/// assert_ne!(hashed.redact("1111-5678-9012-3456"), a);
/// ```
#[derive(Clone)]
pub struct Rules {
    rules: Vec<Rule>,
    patterns: Vec<String>,
    regex: Option<Regex>,
    /// The beginnings of every rule's matches ([`prefixes`]), one per rule.
    beginnings: Vec<Hir>,
    /// `(?:<the beginnings>)\z`: its leftmost match is the tail of a text in which a match
    /// could still be growing. `None` without rules, or when it is too large to compile (then
    /// a stream holds back [`Rules::holdback`] bytes).
    growing: Option<Regex>,
    longest: usize,
    /// The groups of the combined expression so far.
    groups: usize,
}

impl fmt::Debug for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.rules.iter().map(|r| &*r.name).collect();
        f.debug_struct("Rules")
            .field("rules", &names)
            .field("holdback", &self.holdback())
            .finish()
    }
}

impl Default for Rules {
    fn default() -> Self {
        Self::new()
    }
}

/// Email addresses.
pub const EMAIL: &str =
    r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){0,4}\.[A-Za-z]{2,24}";
/// Phone numbers: an optional `+`, then 9 to 15 digits with spaces, dots or dashes between.
pub const PHONE: &str = r"\+?[0-9](?:[ .-]?[0-9]){8,14}";
/// API keys and tokens of common services: OpenAI and Anthropic (`sk-...`), AWS access key
/// ids, GitHub, Slack, Google API keys, and bearer tokens.
pub const API_KEY: &str = concat!(
    r"sk-(?:ant-)?[A-Za-z0-9_-]{20,200}",
    r"|AKIA[0-9A-Z]{16}",
    r"|gh[pousr]_[A-Za-z0-9]{36,255}",
    r"|xox[abpr]-[A-Za-z0-9-]{10,200}",
    r"|AIza[0-9A-Za-z_-]{35}",
    r"|[Bb]earer [A-Za-z0-9._~+/-]{20,500}={0,2}",
);

impl Rules {
    /// No rule: nothing is redacted.
    pub fn new() -> Self {
        Self {
            rules: Vec::new(),
            patterns: Vec::new(),
            regex: None,
            beginnings: Vec::new(),
            growing: None,
            longest: 0,
            groups: 1,
        }
    }

    /// Email addresses, labelled `[REDACTED:email]`.
    pub fn emails(self) -> Self {
        self.built_in("email", EMAIL)
    }

    /// Phone numbers, labelled `[REDACTED:phone]`.
    pub fn phones(self) -> Self {
        self.built_in("phone", PHONE)
    }

    /// API keys and tokens ([`API_KEY`]), labelled `[REDACTED:api_key]`.
    pub fn api_keys(self) -> Self {
        self.built_in("api_key", API_KEY)
    }

    fn built_in(self, name: &str, pattern: &str) -> Self {
        match self.clone().pattern(name, pattern, Replace::Label) {
            Ok(rules) => rules,
            // The built-in patterns are bounded and valid (a unit test checks each).
            Err(_) => self,
        }
    }

    /// Redact the matches of `pattern` (a regular expression whose matches have a bounded
    /// length), named `name`, with `replace`.
    ///
    /// # Errors
    ///
    /// [`RuleError::Pattern`] when it does not parse, [`RuleError::Unbounded`] when a match
    /// may be of any length.
    pub fn pattern(
        mut self,
        name: impl Into<Arc<str>>,
        pattern: &str,
        replace: Replace,
    ) -> Result<Self, RuleError> {
        let name = name.into();
        let invalid = |message: String| RuleError::Pattern {
            name: name.to_string(),
            message,
        };
        let hir = regex_syntax::parse(pattern).map_err(|e| invalid(e.to_string()))?;
        let longest = hir
            .properties()
            .maximum_len()
            .ok_or_else(|| RuleError::Unbounded {
                name: name.to_string(),
            })?;
        let own_groups = hir.properties().explicit_captures_len();
        self.patterns.push(format!("({pattern})"));
        let regex = Regex::new(&self.patterns.join("|")).map_err(|e| invalid(e.to_string()))?;
        self.regex = Some(regex);
        self.beginnings.push(prefixes(&without_assertions(&hir)));
        let beginnings = Hir::concat(vec![
            Hir::alternation(self.beginnings.clone()),
            Hir::look(Look::End),
        ]);
        self.growing = Regex::new(&beginnings.to_string()).ok();
        self.longest = self.longest.max(longest);
        let group = self.groups;
        self.groups += 1 + own_groups;
        self.rules.push(Rule {
            name,
            replace,
            group,
        });
        Ok(self)
    }

    /// Whether there is no rule.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The bound of what a stream holds back: one less than the longest match any rule can
    /// make, in bytes (`\d` and `\w` match any script's characters, up to 4 bytes each;
    /// `[0-9]` keeps it short). A stream holds back only the tail in which a match could still
    /// be growing ([`RedactStream`](super::RedactStream)): on prose a word at most, never more
    /// than this unless the tail is a whole match (it could grow).
    pub fn holdback(&self) -> usize {
        self.longest.saturating_sub(1)
    }

    /// Where the tail of `text` in which a match could still be growing begins, at or after
    /// byte `from`: the leftmost place from which the rest of `text` is the beginning of a
    /// match of some rule (a whole match included), or the end of `text` when there is none.
    /// Every match that starts before it ends before the end of `text`, whatever follows.
    ///
    /// When the rules' beginnings made an expression too large to compile, the tail is the
    /// last [`Rules::holdback`] bytes: no match starting before it can reach past the end.
    pub(super) fn growing(&self, text: &str, from: usize) -> usize {
        match &self.growing {
            Some(growing) => growing
                .find_at(text, from)
                .map_or(text.len(), |tail| tail.start()),
            None => {
                let mut at = text.len().saturating_sub(self.holdback());
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                at.max(from)
            }
        }
    }

    /// The name of the rule whose match comes first in `text`, if any rule matches (what
    /// [`Guardrail::blocking`](crate::guardrail::Guardrail) reports).
    ///
    /// ```
    /// use tower_agent_layers::redact::Rules;
    ///
    /// let rules = Rules::new().emails().api_keys();
    /// assert_eq!(rules.first_match("key sk-abcdefghijklmnopqrstuvwx, ada@example.com"), Some("api_key"));
    /// assert_eq!(rules.first_match("nothing here"), None);
    /// ```
    pub fn first_match(&self, text: &str) -> Option<&str> {
        let &(_, _, rule) = self.matches(text, 0).first()?;
        Some(&self.rules[rule].name)
    }

    /// `text` with every match replaced.
    pub fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let matches = self.matches(text, 0);
        if matches.is_empty() {
            return Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len());
        self.write(text, 0, text.len(), &matches, &mut out);
        Cow::Owned(out)
    }

    /// The matches in `text` from byte `from` on (the text before it is context for the
    /// patterns' assertions): (start, end, rule).
    pub(super) fn matches(&self, text: &str, from: usize) -> Vec<(usize, usize, usize)> {
        let Some(regex) = &self.regex else {
            return Vec::new();
        };
        let mut found = Vec::new();
        let mut at = from;
        let mut locations = regex.capture_locations();
        while at <= text.len() {
            let Some(whole) = regex.captures_read_at(&mut locations, text, at) else {
                break;
            };
            let rule = self
                .rules
                .iter()
                .position(|rule| locations.get(rule.group).is_some())
                .unwrap_or(0);
            if whole.start() == whole.end() {
                // An empty match replaces nothing; step past it.
                at = whole.end() + text[whole.end()..].chars().next().map_or(1, char::len_utf8);
                continue;
            }
            found.push((whole.start(), whole.end(), rule));
            at = whole.end();
        }
        found
    }

    /// Write `text[start..end]` to `out`, replacing the matches (which lie within it).
    pub(super) fn write(
        &self,
        text: &str,
        start: usize,
        end: usize,
        matches: &[(usize, usize, usize)],
        out: &mut String,
    ) {
        let mut at = start;
        for &(from, to, rule) in matches {
            out.push_str(&text[at..from]);
            match &self.rules[rule].replace {
                Replace::Label => {
                    out.push_str("[REDACTED:");
                    out.push_str(&self.rules[rule].name);
                    out.push(']');
                }
                Replace::Mask(mask) => {
                    out.extend(std::iter::repeat_n(*mask, text[from..to].chars().count()));
                }
                Replace::MaskKeeping { mask, keep } => {
                    let found = &text[from..to];
                    let masked = found.chars().filter(|c| c.is_alphanumeric()).count();
                    let mut left = masked.saturating_sub(*keep);
                    for c in found.chars() {
                        if c.is_alphanumeric() && left > 0 {
                            out.push(*mask);
                            left -= 1;
                        } else {
                            out.push(c);
                        }
                    }
                }
                Replace::Hash(key) => {
                    out.push('[');
                    out.push_str(&self.rules[rule].name);
                    out.push(':');
                    out.push_str(&crate::sign::hmac_hex(key, &text.as_bytes()[from..to], 8));
                    out.push(']');
                }
                Replace::Text(replacement) => out.push_str(replacement),
            }
            at = to;
        }
        out.push_str(&text[at..end]);
    }
}

impl Rules {
    /// `text` redacted in place; whether it changed.
    pub(super) fn redact_in_place(&self, text: &mut String) -> bool {
        match self.redact(text) {
            Cow::Borrowed(_) => false,
            Cow::Owned(redacted) => {
                *text = redacted;
                true
            }
        }
    }

    /// The string values of a JSON text redacted (tool-call arguments); `None` when nothing
    /// changed. A text that is not JSON is redacted as text.
    pub(super) fn redact_arguments(&self, arguments: &str) -> Option<String> {
        fn walk(rules: &Rules, value: &mut Value) -> bool {
            match value {
                Value::String(text) => rules.redact_in_place(text),
                Value::Array(items) => items.iter_mut().fold(false, |c, v| walk(rules, v) | c),
                Value::Object(fields) => fields.values_mut().fold(false, |c, v| walk(rules, v) | c),
                _ => false,
            }
        }
        match serde_json::from_str::<Value>(arguments) {
            Ok(mut value) => walk(self, &mut value).then(|| value.to_string()),
            Err(_) => match self.redact(arguments) {
                Cow::Owned(redacted) => Some(redacted),
                Cow::Borrowed(_) => None,
            },
        }
    }
}

/// `hir` with its assertions (`\b`, `^`, `$`, ...) taken as always true and its groups
/// dropped: it matches every text `hir` matches, wherever it stands.
fn without_assertions(hir: &Hir) -> Hir {
    match hir.kind() {
        HirKind::Look(_) => Hir::empty(),
        HirKind::Capture(capture) => without_assertions(&capture.sub),
        HirKind::Repetition(repetition) => {
            Hir::repetition(repetition.with(without_assertions(&repetition.sub)))
        }
        HirKind::Concat(subs) => Hir::concat(subs.iter().map(without_assertions).collect()),
        HirKind::Alternation(subs) => {
            Hir::alternation(subs.iter().map(without_assertions).collect())
        }
        HirKind::Empty | HirKind::Literal(_) | HirKind::Class(_) => hir.clone(),
    }
}

/// The beginnings of `hir`'s matches: every text a match of `hir` starts with (the empty text
/// and whole matches among them). `hir` has no assertions ([`without_assertions`]), so a
/// text that ends with the beginning of a match of the rule matches this at its end.
fn prefixes(hir: &Hir) -> Hir {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => Hir::empty(),
        // `abc`: `(?:a(?:b(?:c)?)?)?`.
        HirKind::Literal(literal) => {
            // A character at a time (a byte at a time if it is not UTF-8).
            let pieces: Vec<Vec<u8>> = match std::str::from_utf8(&literal.0) {
                Ok(text) => text.chars().map(|c| c.to_string().into_bytes()).collect(),
                Err(_) => literal.0.iter().map(|&byte| vec![byte]).collect(),
            };
            pieces.into_iter().rev().fold(Hir::empty(), |rest, piece| {
                optional(Hir::concat(vec![Hir::literal(piece), rest]))
            })
        }
        HirKind::Class(_) => optional(hir.clone()),
        HirKind::Capture(capture) => prefixes(&capture.sub),
        // `abc`: the beginning of `a`, or `a` then the beginning of `bc`.
        HirKind::Concat(subs) => concat_prefixes(subs),
        HirKind::Alternation(subs) => Hir::alternation(subs.iter().map(prefixes).collect()),
        // `a{m,n}`: fewer than `n` whole `a`, then the beginning of one more.
        HirKind::Repetition(repetition) => match repetition.max {
            Some(0) => Hir::empty(),
            max => Hir::concat(vec![
                Hir::repetition(Repetition {
                    min: 0,
                    max: max.map(|n| n - 1),
                    greedy: repetition.greedy,
                    sub: repetition.sub.clone(),
                }),
                prefixes(&repetition.sub),
            ]),
        },
    }
}

/// The beginnings of the concatenation of `subs`.
fn concat_prefixes(subs: &[Hir]) -> Hir {
    match subs {
        [] => Hir::empty(),
        [last] => prefixes(last),
        [first, rest @ ..] => Hir::alternation(vec![
            prefixes(first),
            Hir::concat(vec![first.clone(), concat_prefixes(rest)]),
        ]),
    }
}

/// `hir` or nothing.
fn optional(hir: Hir) -> Hir {
    Hir::repetition(Repetition {
        min: 0,
        max: Some(1),
        greedy: true,
        sub: Box::new(hir),
    })
}
