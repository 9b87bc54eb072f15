//! API keys that never show: not in `Debug`, not in errors, not in logs.

use std::fmt;
use std::sync::Arc;

/// An API key. Its `Debug` prints `ApiKey(…)`; it has no `Display`. The providers send it in a
/// header marked sensitive, never in a URL, so no reqwest error or log line carries it.
///
/// ```
/// use tower_agent_providers::ApiKey;
///
/// let key = ApiKey::new("sk-secret");
/// assert_eq!(format!("{key:?}"), "ApiKey(…)");
/// assert_eq!(key.expose(), "sk-secret");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(Arc<str>);

impl ApiKey {
    /// A key from its text.
    pub fn new(key: impl Into<Arc<str>>) -> Self {
        Self(key.into())
    }

    /// The key in the environment variable `name`, if it is set and not empty.
    pub fn from_env(name: &str) -> Option<Self> {
        std::env::var(name)
            .ok()
            .filter(|key| !key.trim().is_empty())
            .map(|key| Self::new(key.trim()))
    }

    /// The key's text, to put in a request header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(…)")
    }
}

impl From<&str> for ApiKey {
    fn from(key: &str) -> Self {
        Self::new(key)
    }
}

impl From<String> for ApiKey {
    fn from(key: String) -> Self {
        Self::new(key)
    }
}
