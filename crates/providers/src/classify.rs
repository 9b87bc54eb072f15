//! From an HTTP failure (status, headers, body) to the core error kinds, with the wait the
//! provider asked for.
//!
//! | status | kind |
//! |---|---|
//! | 429, quota used up (OpenAI `insufficient_quota`; Gemini without a retry delay) | [`ErrorKind::QuotaExhausted`] |
//! | 429 | [`ErrorKind::RateLimited`], with the wait |
//! | 503, 529 | [`ErrorKind::Overloaded`], with the wait |
//! | 5xx whose body says the request is invalid (`invalid_request_error`, "failed to parse") | [`ErrorKind::BadRequest`]: the same request fails the same way |
//! | other 5xx | [`ErrorKind::Server`] |
//! | 401, 403 | [`ErrorKind::Auth`] |
//! | 402, 400 with a billing message (Anthropic's "credit balance is too low") | [`ErrorKind::QuotaExhausted`] |
//! | 400 recognized as a context overflow per provider, 413 | [`ErrorKind::ContextTooLong`] |
//! | 408 | [`ErrorKind::Timeout`] |
//! | other 4xx | [`ErrorKind::BadRequest`] |
//!
//! The wait, first found wins: `Retry-After` (seconds, or an HTTP date), `retry-after-ms`,
//! the longest of the provider's own reset headers ([`Resets`]: OpenAI's
//! `x-ratelimit-reset-requests` / `-tokens` (`1s`, `6m0s`, `20ms`), Anthropic's
//! `anthropic-ratelimit-*-reset` (RFC 3339 instants)), Gemini's `RetryInfo.retryDelay` in the
//! body (`"34s"`).

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;
use tower_agent_core::{Error, ErrorKind};

use crate::key::ApiKey;

/// What one provider's error bodies say, in its own words: each provider declares its own
/// (`ERRORS` in its module, its `Format::ERRORS`; `pub` only as `Format` is, see `wire`).
/// What any server may say (llama.cpp answers every provider's API alike) is checked for all
/// of them here.
#[derive(Debug, Clone, Copy)]
pub struct ErrorWords {
    /// Fragments of a message (lower case) that says the request is too long for the context.
    pub overflow: &'static [&'static str],
    /// Error codes that say the same.
    pub overflow_codes: &'static [&'static str],
    /// How a 429 says the quota is used up, rather than "slow down".
    pub quota: Quota,
    /// The headers that say when a rate limit resets, read after `Retry-After` and
    /// `retry-after-ms`.
    pub resets: Resets,
}

/// The headers that say when a provider's rate limits reset: the longest wait of them counts.
#[derive(Debug, Clone, Copy)]
pub enum Resets {
    /// None (Gemini says it in the body, `RetryInfo.retryDelay`).
    None,
    /// These headers, each a duration written as Go prints one (OpenAI's
    /// `x-ratelimit-reset-requests` and `-tokens`: `1s`, `6m0s`, `20ms`).
    Durations(&'static [&'static str]),
    /// The headers named `prefix...suffix`, each an RFC 3339 instant (Anthropic's
    /// `anthropic-ratelimit-*-reset`).
    Instants {
        /// How their names begin.
        prefix: &'static str,
        /// How their names end.
        suffix: &'static str,
    },
}

/// How a 429 says the quota is used up.
#[derive(Debug, Clone, Copy)]
pub enum Quota {
    /// The error's code or type is one of these.
    Codes(&'static [&'static str]),
    /// The message holds this word (lower case) and the body gives no retry delay.
    WordWithoutDelay(&'static str),
}

/// The most of a provider's error message kept in an error.
const MAX_MESSAGE: usize = 500;

/// The error for a failed HTTP response of `provider`.
pub(crate) fn classify(
    provider: &'static str,
    words: &ErrorWords,
    status: StatusCode,
    headers: &HeaderMap,
    body: &str,
    key: Option<&ApiKey>,
    now: SystemTime,
) -> Error {
    let detail = Detail::of(body);
    let message = redact(&detail.message, key);
    let kind = match status.as_u16() {
        429 if detail.is_quota(words) => ErrorKind::QuotaExhausted,
        429 => ErrorKind::RateLimited {
            retry_after: retry_after(headers, &detail, words.resets, now),
        },
        503 | 529 => ErrorKind::Overloaded {
            retry_after: retry_after(headers, &detail, words.resets, now),
        },
        // The server could not handle this request, and never will: the same body fails the
        // same way (llama.cpp answers a call's arguments it cannot parse with a 500).
        500..=599 if detail.is_invalid_request() => ErrorKind::BadRequest,
        500..=599 => ErrorKind::Server,
        401 | 403 => ErrorKind::Auth,
        402 => ErrorKind::QuotaExhausted,
        413 => ErrorKind::ContextTooLong,
        408 => ErrorKind::Timeout,
        400 if detail.is_context_overflow(words) => ErrorKind::ContextTooLong,
        400 if detail.is_billing() => ErrorKind::QuotaExhausted,
        _ => ErrorKind::BadRequest,
    };
    Error::new(
        kind,
        format!("{provider}: HTTP {}: {message}", status.as_u16()),
    )
}

/// The error of an error event inside a stream that began with HTTP 200 (Anthropic's
/// `overloaded_error`, OpenAI's `{"error": ..}` chunk).
pub(crate) fn stream_error(
    provider: &'static str,
    words: &ErrorWords,
    data: &str,
    key: Option<&ApiKey>,
) -> Error {
    let detail = Detail::of(data);
    let message = redact(&detail.message, key);
    let kind = match detail.kind.as_str() {
        "overloaded_error" => ErrorKind::Overloaded { retry_after: None },
        "rate_limit_error" | "rate_limit_exceeded" => ErrorKind::RateLimited { retry_after: None },
        "authentication_error" | "permission_error" => ErrorKind::Auth,
        "invalid_request_error" if detail.is_context_overflow(words) => ErrorKind::ContextTooLong,
        "invalid_request_error" => ErrorKind::BadRequest,
        _ => ErrorKind::Server,
    };
    Error::new(kind, format!("{provider}: error in the stream: {message}"))
}

/// What a provider's error body says, whatever its shape.
#[derive(Debug, Default)]
struct Detail {
    message: String,
    /// OpenAI `error.type`/`error.code`, Anthropic `error.type`, Gemini `error.status`.
    kind: String,
    code: String,
    /// Gemini's `RetryInfo.retryDelay`.
    retry_delay: Option<Duration>,
}

impl Detail {
    fn of(body: &str) -> Detail {
        let Ok(value) = serde_json::from_str::<Value>(body) else {
            return Detail {
                message: clip(body.trim()).to_owned(),
                ..Detail::default()
            };
        };
        let error = value.get("error").unwrap_or(&value);
        let text = |v: Option<&Value>| match v {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => String::new(),
        };
        let message = match error {
            Value::String(s) => s.clone(),
            _ => text(error.get("message")),
        };
        let kind = [error.get("type"), error.get("status")]
            .into_iter()
            .map(text)
            .find(|s| !s.is_empty())
            .unwrap_or_default();
        let retry_delay = error
            .get("details")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|d| d.get("retryDelay").and_then(Value::as_str))
            .find_map(go_duration);
        Detail {
            message: clip(&message).to_owned(),
            kind,
            code: text(error.get("code")),
            retry_delay,
        }
    }

    fn lower(&self) -> String {
        self.message.to_lowercase()
    }

    fn is_quota(&self, words: &ErrorWords) -> bool {
        match words.quota {
            Quota::Codes(codes) => codes.contains(&&*self.code) || codes.contains(&&*self.kind),
            Quota::WordWithoutDelay(word) => {
                self.retry_delay.is_none() && self.lower().contains(word)
            }
        }
    }

    /// The body says the request itself is at fault, whatever the status: sending it again
    /// fails again.
    fn is_invalid_request(&self) -> bool {
        let message = self.lower();
        self.kind == "invalid_request_error"
            || [
                "failed to parse",
                "could not parse",
                "invalid request",
                "invalid json",
            ]
            .iter()
            .any(|words| message.contains(words))
    }

    fn is_billing(&self) -> bool {
        let message = self.lower();
        message.contains("credit balance") || message.contains("billing")
    }

    fn is_context_overflow(&self, words: &ErrorWords) -> bool {
        let message = self.lower();
        // Servers that speak every provider's API (llama.cpp's llama-server answers
        // `/v1/messages` as it answers `/v1/chat/completions`).
        let any = self.kind == "exceed_context_size_error"
            || message.contains("exceeds the available context size");
        any || words.overflow_codes.contains(&&*self.code)
            || words.overflow.iter().any(|words| message.contains(words))
    }
}

/// The wait a rate-limited or overloaded response asks for; see the [module docs](self).
fn retry_after(
    headers: &HeaderMap,
    detail: &Detail,
    resets: Resets,
    now: SystemTime,
) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(value) = header("retry-after") {
        if let Ok(seconds) = value.parse::<f64>() {
            if seconds.is_finite() && seconds >= 0.0 {
                return Some(Duration::from_secs_f64(seconds.min(86_400.0)));
            }
        }
        if let Ok(at) = httpdate::parse_http_date(value) {
            return Some(at.duration_since(now).unwrap_or(Duration::ZERO));
        }
    }
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms.min(86_400_000.0) / 1000.0));
        }
    }
    let reset = match resets {
        Resets::None => None,
        Resets::Durations(names) => names
            .iter()
            .filter_map(|name| header(name).and_then(go_duration))
            .max(),
        Resets::Instants { prefix, suffix } => headers
            .iter()
            .filter(|(name, _)| {
                let name = name.as_str();
                name.starts_with(prefix) && name.ends_with(suffix)
            })
            .filter_map(|(_, value)| value.to_str().ok())
            .filter_map(|value| humantime::parse_rfc3339_weak(value.trim()).ok())
            .map(|at| at.duration_since(now).unwrap_or(Duration::ZERO))
            .max(),
    };
    reset.or(detail.retry_delay)
}

/// A duration written the way Go prints one: `1s`, `6m0s`, `20ms`, `1h2m3.5s`, `34s`.
pub(crate) fn go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0_f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            _ => return None,
        };
        total += number * seconds;
        rest = &rest[unit_end..];
    }
    (total.is_finite() && total <= 86_400.0).then(|| Duration::from_secs_f64(total))
}

/// `text` without the key, if the provider echoed it.
fn redact(text: &str, key: Option<&ApiKey>) -> String {
    match key {
        Some(key) if key.expose().len() >= 4 => text.replace(key.expose(), "…"),
        _ => text.to_owned(),
    }
}

fn clip(text: &str) -> &str {
    if text.len() <= MAX_MESSAGE {
        return text;
    }
    let mut end = MAX_MESSAGE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(go_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(go_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(
            go_duration("1h2m3.5s"),
            Some(Duration::from_secs_f64(3723.5))
        );
        for bad in ["", "s", "1x", "1.2.3s", "-1s", "10"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }
}
