//! The one error type of tower-agent, with kinds a retry policy can classify.
//!
//! [`Error`] is for infrastructure failure: the model endpoint is down, a backend cannot write,
//! the run was cancelled inside a provider. A tool failure the model should see is *not* an
//! error: it is a [`ToolResult`](crate::ToolResult) with `is_error: true`. A run paused for a
//! human is not an error either: it is [`Outcome::Interrupted`](crate::Outcome::Interrupted),
//! carried in an `Ok` response, so no retry layer can ever catch it. [`ErrorKind`] has no
//! variant for it, by construction.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::history::History;
use crate::session::{Session, Usage};

/// A type-erased error, as tower's middleware produce (`tower::BoxError`).
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What went wrong, in terms a retry policy can act on.
///
/// `RateLimited` and `Overloaded` carry the provider's wait: match them as
/// `ErrorKind::RateLimited { retry_after }` (or `{ .. }`).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_agent_core::{Error, ErrorKind};
///
/// let err = Error::rate_limited(Some(Duration::from_secs(2)), "429 from the provider");
/// assert!(err.kind().is_transient());
/// assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));
/// assert!(!Error::new(ErrorKind::Auth, "bad key").kind().is_transient());
///
/// let wait = match err.kind() {
///     ErrorKind::RateLimited { retry_after } | ErrorKind::Overloaded { retry_after } => retry_after,
///     _ => None,
/// };
/// assert_eq!(wait, Some(Duration::from_secs(2)));
///
/// // It serializes (a recorded call keeps its error's kind):
/// let json = serde_json::to_value(ErrorKind::RateLimited { retry_after: None }).unwrap();
/// assert_eq!(json, serde_json::json!({ "rate_limited": { "retry_after": null } }));
/// assert_eq!(serde_json::to_value(ErrorKind::Auth).unwrap(), "auth");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// The provider rate-limited the request (HTTP 429), optionally saying when to come back.
    RateLimited {
        /// How long the provider asked to wait, when it said so.
        retry_after: Option<Duration>,
    },
    /// The provider is overloaded (HTTP 503/529), optionally saying when to come back.
    Overloaded {
        /// How long the provider asked to wait, when it said so.
        retry_after: Option<Duration>,
    },
    /// The provider failed (HTTP 5xx), or its answer broke off.
    Server,
    /// The provider could not be reached (the connection was refused, no route, a name that
    /// does not resolve, a TLS failure): nothing was sent. Transient, but a server that is
    /// not running rarely starts within a retry's wait: retried briefly by default.
    Unreachable,
    /// The provider's answer arrived but is not what was asked for: not the provider's JSON,
    /// a response a fallback rejected, or an answer that still did not match its response
    /// format after the repairs allowed. Not transient: the same request would be paid for
    /// again and most likely answered the same way.
    InvalidResponse,
    /// The credentials were refused (HTTP 401/403). Never worth retrying.
    Auth,
    /// The account's quota or credit is used up. Not worth retrying soon.
    QuotaExhausted,
    /// The request does not fit the model's context window; summarizing the history may help.
    ContextTooLong,
    /// The request was malformed (HTTP 400), or a caller broke a contract of this library.
    BadRequest,
    /// A deadline passed (for example tower's `Timeout` layer fired).
    Timeout,
    /// The provider answered with no content at all (Gemini's empty `candidates`). Trying
    /// again, perhaps with a slightly changed prompt, usually works.
    EmptyResponse,
    /// The run was cancelled through its cancellation token.
    Cancelled,
    /// A tool failed at the infrastructure level (not a failure the model should see).
    Tool,
    /// A storage backend failed.
    Backend,
    /// Another writer changed what this call was writing since it was read (a stored session
    /// saved by another process since the run loaded it): nothing was overwritten. Load it
    /// again and start over from what is stored. Not transient: the same request conflicts
    /// again; a retry starts from a fresh load.
    Conflict,
    /// An event observer failed; the run stops and returns this error.
    Observer,
    /// A call limit was reached and configured to fail the run (see the call limits of
    /// `tower-agent-layers`). Not worth retrying within the run.
    LimitReached,
    /// The model's answer was cut off at its length limit (`max_tokens`), and the agent was
    /// told to fail then (`Truncation::Fail` in `tower-agent-loop`). Not transient: the same
    /// request is cut off again; give it more room.
    Truncated,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// Whether trying the same request again later may succeed: rate limits, overload, server
    /// errors, timeouts and empty responses.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ErrorKind::RateLimited { .. }
                | ErrorKind::Overloaded { .. }
                | ErrorKind::Server
                | ErrorKind::Unreachable
                | ErrorKind::Timeout
                | ErrorKind::EmptyResponse
        )
    }

    /// The wait the provider asked for, for [`RateLimited`](Self::RateLimited) and
    /// [`Overloaded`](Self::Overloaded).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ErrorKind::RateLimited { retry_after } | ErrorKind::Overloaded { retry_after } => {
                *retry_after
            }
            _ => None,
        }
    }

    /// The kind's name, as it serializes (`rate_limited`, `auth`): short and stable, for
    /// metrics and span attributes such as OpenTelemetry's `error.type`.
    ///
    /// ```
    /// use tower_agent_core::ErrorKind;
    ///
    /// assert_eq!(ErrorKind::RateLimited { retry_after: None }.name(), "rate_limited");
    /// assert_eq!(ErrorKind::ContextTooLong.name(), "context_too_long");
    /// ```
    pub fn name(&self) -> &'static str {
        match self {
            ErrorKind::RateLimited { .. } => "rate_limited",
            ErrorKind::Overloaded { .. } => "overloaded",
            ErrorKind::Server => "server",
            ErrorKind::Unreachable => "unreachable",
            ErrorKind::InvalidResponse => "invalid_response",
            ErrorKind::Auth => "auth",
            ErrorKind::QuotaExhausted => "quota_exhausted",
            ErrorKind::ContextTooLong => "context_too_long",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::Timeout => "timeout",
            ErrorKind::EmptyResponse => "empty_response",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Tool => "tool",
            ErrorKind::Backend => "backend",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Observer => "observer",
            ErrorKind::LimitReached => "limit_reached",
            ErrorKind::Truncated => "truncated",
            ErrorKind::Other => "other",
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            ErrorKind::RateLimited { .. } => "rate limited",
            ErrorKind::Overloaded { .. } => "overloaded",
            ErrorKind::Server => "server error",
            ErrorKind::Unreachable => "unreachable",
            ErrorKind::InvalidResponse => "invalid response",
            ErrorKind::Auth => "authentication failed",
            ErrorKind::QuotaExhausted => "quota exhausted",
            ErrorKind::ContextTooLong => "context too long",
            ErrorKind::BadRequest => "bad request",
            ErrorKind::Timeout => "timed out",
            ErrorKind::EmptyResponse => "empty response",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Tool => "tool failure",
            ErrorKind::Backend => "backend failure",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Observer => "observer failed",
            ErrorKind::LimitReached => "limit reached",
            ErrorKind::Truncated => "answer cut off",
            ErrorKind::Other => "error",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())?;
        if let Some(wait) = self.retry_after() {
            write!(f, " (retry after {wait:?})")?;
        }
        Ok(())
    }
}

/// The error of every service in tower-agent.
///
/// A clone shares the source and copies the rest. Its `Display` and `Debug` output never include
/// request bodies, headers or credentials: providers put only what is safe to log into the
/// message.
///
/// When a run fails, the agent attaches the session as it stood at the failure (every tool
/// call answered), so nothing is lost: take it back with [`Error::take_session`] and resume.
/// It attaches the tokens the run used too ([`Error::usage`]): they were paid.
///
/// One pointer wide, as hyper's and reqwest's errors are: every `Result` and every future
/// that holds one stays small, and a run holds many (an error is made only when something
/// fails).
#[derive(Clone)]
pub struct Error(Box<Parts>);

#[derive(Clone)]
struct Parts {
    kind: ErrorKind,
    message: Cow<'static, str>,
    source: Option<Arc<dyn StdError + Send + Sync + 'static>>,
    session: Option<Session>,
    history: Option<History>,
    usage: Usage,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.0.kind, self.0.message)
    }
}

impl StdError for Error {
    /// The cause itself (not the `Arc` that shares it), so `downcast_ref` finds its type.
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.0.source {
            Some(source) => Some(&**source),
            None => None,
        }
    }
}

impl Error {
    /// A new error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Self(Box::new(Parts {
            kind,
            message: message.into(),
            source: None,
            session: None,
            history: None,
            usage: Usage::default(),
        }))
    }

    /// [`ErrorKind::RateLimited`].
    pub fn rate_limited(
        retry_after: Option<Duration>,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self::new(ErrorKind::RateLimited { retry_after }, message)
    }

    /// [`ErrorKind::Cancelled`]: the run was cancelled.
    pub fn cancelled() -> Self {
        Self::new(ErrorKind::Cancelled, "the run was cancelled")
    }

    /// [`ErrorKind::BadRequest`].
    pub fn bad_request(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::BadRequest, message)
    }

    /// [`ErrorKind::Tool`].
    pub fn tool(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::Tool, message)
    }

    /// [`ErrorKind::Backend`].
    pub fn backend(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::Backend, message)
    }

    /// [`ErrorKind::Other`].
    pub fn other(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::Other, message)
    }

    /// Attach the underlying cause, reachable through [`std::error::Error::source`].
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.0.source = Some(Arc::from(source.into()));
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// Shorthand for `self.kind().retry_after()`.
    pub fn retry_after(&self) -> Option<Duration> {
        self.0.kind.retry_after()
    }

    /// Shorthand for `self.kind().is_transient()`.
    pub fn is_transient(&self) -> bool {
        self.0.kind.is_transient()
    }

    /// Attach the session as it stood when the run failed.
    pub fn with_session(mut self, session: Session) -> Self {
        self.0.session = Some(session);
        self
    }

    /// The session saved at the failure, if the agent attached one.
    pub fn session(&self) -> Option<&Session> {
        self.0.session.as_ref()
    }

    /// Take the session saved at the failure, to resume the run later.
    pub fn take_session(&mut self) -> Option<Session> {
        self.0.session.take()
    }

    /// Attach the history a layer committed before the call failed (a summary it paid for):
    /// the agent applies it, as it would a [`ModelResponse::history`](crate::ModelResponse),
    /// to the session it returns with the error. An inner layer's commit wins, as in
    /// [`ModelResponse::commit`](crate::ModelResponse::commit).
    pub fn with_history(mut self, history: History) -> Self {
        self.0.history.get_or_insert(history);
        self
    }

    /// The history a layer committed before the call failed ([`Error::with_history`]).
    pub fn history(&self) -> Option<&History> {
        self.0.history.as_ref()
    }

    /// Take the history a layer committed before the call failed.
    pub fn take_history(&mut self) -> Option<History> {
        self.0.history.take()
    }

    /// Attach the tokens the failed run used before it failed (replacing any attached).
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.0.usage = usage;
        self
    }

    /// Add `usage` to the tokens attached: a layer that spent tokens before an inner call
    /// failed keeps the inner call's own.
    ///
    /// ```
    /// use tower_agent_core::{Error, Usage};
    ///
    /// let error = Error::other("down").with_usage(Usage::new(5, 1));
    /// assert_eq!(error.add_usage(Usage::new(1, 1)).usage(), Usage::new(6, 2));
    /// ```
    pub fn add_usage(mut self, usage: Usage) -> Self {
        self.0.usage += usage;
        self
    }

    /// The tokens the failed run used before it failed (its model calls, the summarizer's,
    /// nested agents'), when the agent attached them; zero otherwise.
    pub fn usage(&self) -> Usage {
        self.0.usage
    }

    /// Turn any error a tower service returns into an [`Error`].
    ///
    /// An `Error` inside the box is unwrapped; with the `tower` feature (default), tower's
    /// `timeout::error::Elapsed` becomes [`ErrorKind::Timeout`] and
    /// `load_shed::error::Overloaded` becomes [`ErrorKind::Overloaded`]; anything else is
    /// [`ErrorKind::Other`] with the original as its source.
    pub fn from_boxed(error: BoxError) -> Self {
        match error.downcast::<Error>() {
            Ok(error) => *error,
            Err(error) => Error::describe(&*error).with_source(error),
        }
    }

    /// An error of the kind [`Error::from_boxed`] gives `error`, with its message, without
    /// taking it (no source attached).
    pub fn describe(error: &(dyn StdError + Send + Sync + 'static)) -> Self {
        if let Some(error) = error.downcast_ref::<Error>() {
            return error.clone();
        }
        Error::new(kind_of(error), error.to_string())
    }
}

/// The kind of a foreign error: tower's timeout and load-shed errors are recognized.
fn kind_of(error: &(dyn StdError + Send + Sync + 'static)) -> ErrorKind {
    #[cfg(feature = "tower")]
    {
        if error.is::<tower::timeout::error::Elapsed>() {
            return ErrorKind::Timeout;
        }
        if error.is::<tower::load_shed::error::Overloaded>() {
            return ErrorKind::Overloaded { retry_after: None };
        }
    }
    let _ = error;
    ErrorKind::Other
}

impl From<BoxError> for Error {
    fn from(error: BoxError) -> Self {
        Error::from_boxed(error)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = &*self.0;
        let mut d = f.debug_struct("Error");
        d.field("kind", &parts.kind)
            .field("message", &parts.message);
        if let Some(source) = &parts.source {
            d.field("source", &format_args!("{source}"));
        }
        if let Some(session) = &parts.session {
            d.field(
                "session",
                &format_args!("<{} messages>", session.history.len()),
            );
        }
        if let Some(history) = &parts.history {
            d.field("history", &format_args!("<{} messages>", history.len()));
        }
        if parts.usage != Usage::default() {
            d.field("usage", &parts.usage);
        }
        d.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_named_as_it_serializes() {
        let wait = Some(Duration::from_secs(1));
        for kind in [
            ErrorKind::RateLimited { retry_after: wait },
            ErrorKind::Overloaded { retry_after: None },
            ErrorKind::Server,
            ErrorKind::Unreachable,
            ErrorKind::Truncated,
            ErrorKind::InvalidResponse,
            ErrorKind::Auth,
            ErrorKind::QuotaExhausted,
            ErrorKind::ContextTooLong,
            ErrorKind::BadRequest,
            ErrorKind::Timeout,
            ErrorKind::EmptyResponse,
            ErrorKind::Cancelled,
            ErrorKind::Tool,
            ErrorKind::Backend,
            ErrorKind::Conflict,
            ErrorKind::Observer,
            ErrorKind::LimitReached,
            ErrorKind::Other,
        ] {
            let json = serde_json::to_value(kind).expect("serializes");
            let tag = match &json {
                serde_json::Value::String(tag) => tag.clone(),
                serde_json::Value::Object(map) => map.keys().next().expect("a tag").clone(),
                other => panic!("{other}"),
            };
            assert_eq!(kind.name(), tag);
        }
    }

    /// An error is one pointer, and so is a `Result` of nothing or an error: what every
    /// future of a run holds stays small.
    #[test]
    fn an_error_is_one_pointer_wide() {
        assert_eq!(std::mem::size_of::<Error>(), std::mem::size_of::<usize>());
        assert_eq!(
            std::mem::size_of::<Result<(), Error>>(),
            std::mem::size_of::<usize>()
        );
        assert_eq!(
            std::mem::size_of::<Option<Error>>(),
            std::mem::size_of::<usize>()
        );
    }

    #[test]
    fn boxed_error_round_trips_kind() {
        let boxed: BoxError = Box::new(Error::rate_limited(Some(Duration::from_secs(3)), "slow"));
        let back = Error::from(boxed);
        assert_eq!(
            back.kind(),
            ErrorKind::RateLimited {
                retry_after: Some(Duration::from_secs(3))
            }
        );
        assert_eq!(back.to_string(), "rate limited (retry after 3s): slow");
    }

    #[cfg(feature = "tower")]
    #[test]
    fn tower_elapsed_is_a_timeout() {
        let boxed: BoxError = Box::new(tower::timeout::error::Elapsed::new());
        assert_eq!(Error::from(boxed).kind(), ErrorKind::Timeout);
        let boxed: BoxError = Box::new(tower::load_shed::error::Overloaded::new());
        assert!(matches!(
            Error::from(boxed).kind(),
            ErrorKind::Overloaded { .. }
        ));
        let boxed: BoxError = "plain".into();
        let err = Error::from(boxed);
        assert_eq!(err.kind(), ErrorKind::Other);
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn the_source_downcasts_to_its_own_type() {
        let io = std::io::Error::other("disk full");
        let err = Error::backend("write failed").with_source(io);
        let source = StdError::source(&err).unwrap();
        assert_eq!(
            source.downcast_ref::<std::io::Error>().unwrap().to_string(),
            "disk full"
        );
    }

    #[test]
    fn debug_does_not_dump_the_session() {
        let mut session = Session::new();
        session.history.push(crate::Message::user("my secret plan"));
        let err = Error::other("boom").with_session(session);
        let debug = format!("{err:?}");
        assert!(debug.contains("<1 messages>"), "{debug}");
        assert!(!debug.contains("secret"), "{debug}");
    }
}
