//! Secrets kept off a cassette: every string of a line is scrubbed as text, decoded, before
//! it is encoded.
//!
//! Scrubbing the encoded line instead missed a key right after a line break or a tab: there
//! the break is the escape `\n`, and the key seemed to go on a word (`nsk-...`). Here the
//! encoder hands each string over decoded ([`Scrub`]), and what is not decoded (a string that
//! is itself JSON, a URL) has its escapes read as the boundaries they stand for.

use std::borrow::Cow;
use std::io;

use serde::Serialize;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter, Serializer};

/// What a secret is written as.
pub(super) const REDACTED: &str = "[REDACTED]";

/// Prefixes of API keys; a key is one of them at the start of a word, then [`KEY_MIN`] or
/// more key characters.
static PREFIXES: [&str; 8] = [
    "sk-ant-", "sk-", "AIza", "ghp_", "xoxb-", "xoxp-", "Bearer ", "bearer ",
];
const KEY_MIN: usize = 16;

/// Names whose value is a secret, the whole name or its last part (`OPENAI_API_KEY`,
/// `x-api-key`, `client_secret`), compared in lower case with `-` as `_`.
static SECRET_NAMES: [&str; 10] = [
    "api_key",
    "apikey",
    "access_key",
    "secret_key",
    "private_key",
    "token",
    "secret",
    "password",
    "passwd",
    "authorization",
];
/// Names whose value is a secret only as the whole name and before `=`: a URL's `?key=`.
static QUERY_NAMES: [&str; 2] = ["key", "auth"];
/// The shortest value a name marks as a secret: shorter ones are prose (`token: the`).
const VALUE_MIN: usize = 8;
/// Schemes that go before a credential in an `Authorization` header.
static SCHEMES: [&str; 3] = ["bearer ", "basic ", "token "];

/// Whether `byte` is a key's character: a letter, a digit, `-` or `_`.
fn is_key(byte: u8) -> bool {
    /// The answer for each byte, looked up: `redact` asks it of every byte it scrubs.
    static KEY: [bool; 256] = {
        let mut table = [false; 256];
        let mut byte = 0;
        while byte < 256 {
            let b = byte as u8;
            table[byte] = b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
            byte += 1;
        }
        table
    };
    KEY[usize::from(byte)]
}

/// Whether an escape standing for a character that is not a key's ends right before `i`:
/// `\n`, `\t`, `\"`, `\u000a` in JSON held in a string; `%0A` in a URL.
fn escaped(bytes: &[u8], i: usize) -> bool {
    let hex = |run: &[&u8]| run.iter().all(|b| b.is_ascii_hexdigit());
    match bytes.get(..i).unwrap_or_default() {
        [.., b'\\', _] => true,
        [.., b'\\', b'u', a, b, c, d] => hex(&[a, b, c, d]),
        [.., b'%', a, b] => hex(&[a, b]),
        _ => false,
    }
}

/// Whether `name` names a secret: one of [`SECRET_NAMES`], or ends with `_` or `-` and one;
/// in any case, `-` and `_` alike.
fn secret_name(name: &[u8]) -> bool {
    let same = |a: &u8, b: &u8| {
        a.eq_ignore_ascii_case(b) || (matches!(a, b'-' | b'_') && matches!(b, b'-' | b'_'))
    };
    SECRET_NAMES.iter().any(|secret| {
        let Some(split) = name.len().checked_sub(secret.len()) else {
            return false;
        };
        let (head, tail) = name.split_at(split);
        tail.iter().zip(secret.as_bytes()).all(|(a, b)| same(a, b))
            && matches!(head, [] | [.., b'-' | b'_'])
    })
}

/// `text` with what looks like a credential replaced by `[REDACTED]`:
///
/// - a key: a known prefix (`sk-`, `sk-ant-`, `AIza`, `ghp_`, `xoxb-`, `xoxp-`, `Bearer `) at
///   the start of a word, then 16 or more key characters (letters, digits, `-`, `_`);
/// - a named value: after a name that says it is a secret (`api_key`, `x-api-key`,
///   `OPENAI_API_KEY`, `access_token`, `client_secret`, `password`, `Authorization`, and in a
///   query `key` and `auth`), then `=` or `:` (quotes and spaces around them allowed), the
///   value, 8 characters or more, up to a space, a quote, a backslash, `&`, `,`, `;`, `<`,
///   `>`, `[` or `]`; an authorization scheme before it (`Bearer `, `Basic `) is kept.
///
/// A word starts anywhere a character that is not a key's, or an escape (`\n`, `%0A`), goes
/// before it. Every word start is tried against both rules in the text as given, and what
/// they find is replaced together (spans that overlap as one): so scrubbing scrubbed text
/// changes nothing, and a request carrying a replayed, scrubbed answer is keyed as the
/// recorded one was.
pub(super) fn redact(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    // Most strings hold no `=` or `:` and no escape: the rules that need them are skipped.
    let separators = bytes.contains(&b'=') || bytes.contains(&b':');
    // Too short for a key and nothing named (most keys, roles, ids): nothing to look for.
    if bytes.len() < KEY_MIN && !separators {
        return Cow::Borrowed(text);
    }
    let escapes = bytes.contains(&b'\\') || bytes.contains(&b'%');
    let mut spans = Vec::new();
    let mut after_key = false;
    for (i, &byte) in bytes.iter().enumerate() {
        // A word starts here: a key's character after one that is not, or after an escape.
        let starts = is_key(byte) && (!after_key || (escapes && escaped(bytes, i)));
        after_key = is_key(byte);
        if !starts {
            continue;
        }
        if matches!(byte, b's' | b'A' | b'g' | b'x' | b'B' | b'b') {
            spans.extend(key(text, i));
        }
        if separators {
            spans.extend(named_value(text, i));
        }
    }
    if spans.is_empty() {
        return Cow::Borrowed(text);
    }
    spans.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (start, end) in spans {
        if end <= copied {
            continue;
        }
        if start >= copied {
            out.push_str(text.get(copied..start).unwrap_or_default());
            out.push_str(REDACTED);
        }
        copied = end;
    }
    out.push_str(text.get(copied..).unwrap_or_default());
    Cow::Owned(out)
}

/// A key starting at `i`: its span.
fn key(text: &str, i: usize) -> Option<(usize, usize)> {
    let rest = text.get(i..)?;
    PREFIXES.iter().find_map(|prefix| {
        let tail = rest.strip_prefix(prefix)?;
        let secret = tail.bytes().take_while(|b| is_key(*b)).count();
        (secret >= KEY_MIN).then_some((i, i + prefix.len() + secret))
    })
}

/// The value of a secret's name starting at `i` (`api_key=...`, `"x-api-key": "..."`): its
/// span, the name and the separator left.
fn named_value(text: &str, i: usize) -> Option<(usize, usize)> {
    let bytes = text.as_bytes();
    let name_end = i + bytes.get(i..)?.iter().take_while(|b| is_key(**b)).count();
    let name = bytes.get(i..name_end)?;
    let named = secret_name(name);
    let query = QUERY_NAMES
        .iter()
        .any(|query| name.eq_ignore_ascii_case(query.as_bytes()));
    if !named && !query {
        return None;
    }
    let mut at = skip_quote(bytes, name_end);
    at = skip_spaces(bytes, at);
    match bytes.get(at) {
        Some(b'=') => {}
        Some(b':') if named => {}
        _ => return None,
    }
    at = skip_spaces(bytes, at + 1);
    at = skip_quote(bytes, at);
    let rest = text.get(at..)?;
    if let Some(scheme) = SCHEMES.iter().find(|scheme| {
        rest.get(..scheme.len())
            .is_some_and(|word| word.eq_ignore_ascii_case(scheme))
    }) {
        at += scheme.len();
    }
    // A value ends where `[REDACTED]` starts: scrubbed again, it is no longer.
    let value = text
        .get(at..)?
        .bytes()
        .take_while(|b| {
            !b.is_ascii_whitespace()
                && !b.is_ascii_control()
                && !matches!(
                    b,
                    b'"' | b'\'' | b'&' | b',' | b';' | b'\\' | b'<' | b'>' | b'[' | b']'
                )
        })
        .count();
    (value >= VALUE_MIN).then_some((at, at + value))
}

/// Past a quote at `at` (`"`, `'`, or `\"` in JSON held in a string).
fn skip_quote(bytes: &[u8], at: usize) -> usize {
    match bytes.get(at..) {
        Some([b'"' | b'\'', ..]) => at + 1,
        Some([b'\\', b'"', ..]) => at + 2,
        _ => at,
    }
}

fn skip_spaces(bytes: &[u8], at: usize) -> usize {
    at + bytes
        .get(at..)
        .map_or(0, |rest| rest.iter().take_while(|b| **b == b' ').count())
}

/// The compact JSON of `value` with every string (object keys too) scrubbed by [`redact`],
/// decoded, before it is encoded: the same text as `serde_json::to_string` where nothing is
/// a secret.
pub(super) fn to_writer(writer: impl io::Write, value: &impl Serialize) -> serde_json::Result<()> {
    value.serialize(&mut Serializer::with_formatter(writer, Scrub::default()))
}

/// [`to_writer`] into a string.
pub(super) fn to_string(value: &impl Serialize) -> serde_json::Result<String> {
    let mut bytes = Vec::new();
    to_writer(&mut bytes, value)?;
    String::from_utf8(bytes)
        .map_err(|error| serde_json::Error::io(io::Error::new(io::ErrorKind::InvalidData, error)))
}

/// A compact formatter that gathers each string as the encoder hands it over (plain runs and
/// escaped characters), decoded, and writes it scrubbed and escaped again when it ends. The
/// string value of an object key that names a secret (`"x-api-key": "..."`) is a secret
/// whole, if it is [`VALUE_MIN`] characters or more.
#[derive(Default)]
struct Scrub {
    /// The string being written, decoded (one buffer for them all).
    string: String,
    /// A string is being written.
    in_string: bool,
    /// The string has a character `serde_json` escapes: it is escaped again when written.
    escaped: bool,
    /// An object key is being written.
    in_key: bool,
    /// The object key just written names a secret: its value, if a string, is one.
    secret_value: bool,
}

impl Formatter for Scrub {
    fn begin_string<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.string.clear();
        self.in_string = true;
        self.escaped = false;
        writer.write_all(b"\"")
    }

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        if !self.in_string {
            return writer.write_all(fragment.as_bytes());
        }
        self.string.push_str(fragment);
        Ok(())
    }

    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        escape: CharEscape,
    ) -> io::Result<()> {
        if !self.in_string {
            return CompactFormatter.write_char_escape(writer, escape);
        }
        self.escaped = true;
        self.string.push(match escape {
            CharEscape::Quote => '"',
            CharEscape::ReverseSolidus => '\\',
            CharEscape::Solidus => '/',
            CharEscape::Backspace => '\u{8}',
            CharEscape::FormFeed => '\u{c}',
            CharEscape::LineFeed => '\n',
            CharEscape::CarriageReturn => '\r',
            CharEscape::Tab => '\t',
            CharEscape::AsciiControl(byte) => char::from(byte),
        });
        Ok(())
    }

    fn end_string<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        if std::mem::take(&mut self.in_string) {
            let string = &self.string;
            if self.in_key {
                self.secret_value = secret_name(string.as_bytes());
            }
            if !self.in_key && self.secret_value && string.len() >= VALUE_MIN {
                writer.write_all(REDACTED.as_bytes())?;
            } else if self.escaped {
                write_escaped(writer, &redact(string))?;
            } else {
                // Nothing to escape in it, nor in `[REDACTED]`.
                writer.write_all(redact(string).as_bytes())?;
            }
        }
        writer.write_all(b"\"")
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.in_key = true;
        CompactFormatter.begin_object_key(writer, first)
    }

    fn end_object_key<W: ?Sized + io::Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        self.in_key = false;
        Ok(())
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        self.secret_value = false;
        Ok(())
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        // A value that is an object or an array is not a secret whole: its strings are
        // scrubbed as text, and its keys may name secrets again.
        self.secret_value = false;
        CompactFormatter.begin_object(writer)
    }

    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.secret_value = false;
        CompactFormatter.begin_array(writer)
    }
}

/// `text` escaped as `serde_json` escapes a string's contents: `"`, `\` and control
/// characters.
fn write_escaped<W: ?Sized + io::Write>(writer: &mut W, text: &str) -> io::Result<()> {
    let mut plain = 0;
    for (at, byte) in text.bytes().enumerate() {
        let escape = match byte {
            b'"' => CharEscape::Quote,
            b'\\' => CharEscape::ReverseSolidus,
            b'\n' => CharEscape::LineFeed,
            b'\r' => CharEscape::CarriageReturn,
            b'\t' => CharEscape::Tab,
            0x08 => CharEscape::Backspace,
            0x0c => CharEscape::FormFeed,
            0x00..=0x1f => CharEscape::AsciiControl(byte),
            _ => continue,
        };
        // `at` is an ASCII byte's: a character boundary.
        writer.write_all(text.get(plain..at).unwrap_or_default().as_bytes())?;
        CompactFormatter.write_char_escape(writer, escape)?;
        plain = at + 1;
    }
    writer.write_all(text.get(plain..).unwrap_or_default().as_bytes())
}
