//! Gemini's explicit context cache: the system instruction, the tools and the tool config of a
//! request stored once as a `cachedContents` resource, and named by later requests.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;
use serde_json::{Map, Value};

/// The fewest bytes of a prefix worth caching: about 1,024 tokens, the least the API caches
/// (Gemini 2.5 Flash; 2.5 Pro needs 4,096, and refuses less, which the cache then remembers).
pub(super) const MIN_BYTES: usize = 4 * 1024;

/// A cache is no longer named this close to its expiry: a request in flight would find it gone.
const MARGIN: Duration = Duration::from_secs(30);

/// How long a prefix the API refused to cache, or failed to, is not asked again.
const REFUSED_FOR: Duration = Duration::from_secs(600);

/// The caches made, by prefix: one value shared by a provider and its clones.
#[derive(Debug, Clone)]
pub(super) struct ContextCache {
    ttl: Duration,
    entries: Arc<Mutex<HashMap<u64, Entry>>>,
}

#[derive(Debug, Clone)]
enum Entry {
    /// A request is making it.
    Creating,
    Live {
        name: String,
        expires: Instant,
    },
    Refused {
        until: Instant,
    },
}

impl ContextCache {
    pub(super) fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Arc::default(),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The name of a cache holding the prefix `key`, live long enough to be used.
    pub(super) fn live(&self, key: u64) -> Option<String> {
        match self.entries().get(&key) {
            Some(Entry::Live { name, expires }) if Instant::now() + MARGIN < *expires => {
                Some(name.clone())
            }
            _ => None,
        }
    }

    /// Make a cache of `prefix` (for `model`, under `key`) unless one is live, being made, or
    /// was refused lately. Never fails: a request goes on without the cache.
    pub(super) async fn make(
        &self,
        http: &reqwest::Client,
        url: String,
        headers: HeaderMap,
        model: &str,
        key: u64,
        prefix: Map<String, Value>,
    ) {
        {
            let mut entries = self.entries();
            let now = Instant::now();
            let fresh = match entries.get(&key) {
                Some(Entry::Creating) => false,
                Some(Entry::Live { expires, .. }) => now + MARGIN >= *expires,
                Some(Entry::Refused { until }) => now >= *until,
                None => true,
            };
            if !fresh {
                return;
            }
            entries.insert(key, Entry::Creating);
        }
        // A call dropped while it makes the cache leaves no `Creating` behind.
        let mut guard = Unfinished {
            cache: self,
            key,
            done: false,
        };
        let mut body = prefix;
        let model = match model.strip_prefix("models/") {
            Some(_) => model.to_owned(),
            None => format!("models/{model}"),
        };
        body.insert("model".into(), Value::String(model));
        body.insert(
            "ttl".into(),
            Value::String(format!("{}s", self.ttl.as_secs())),
        );
        let sent = http
            .post(&url)
            .headers(headers)
            .timeout(Duration::from_secs(30))
            .json(&body)
            .send()
            .await;
        let name = match sent {
            Ok(response) if response.status().is_success() => {
                let answer: Result<Value, _> = response.json().await;
                answer
                    .ok()
                    .and_then(|v| v["name"].as_str().map(str::to_owned))
            }
            Ok(response) => {
                tracing::warn!(status = %response.status(), "gemini: the context cache was refused; requests go without it");
                None
            }
            Err(error) => {
                tracing::warn!(error = %error.without_url(), "gemini: the context cache could not be made; requests go without it");
                None
            }
        };
        let entry = match name {
            Some(name) => Entry::Live {
                name,
                expires: Instant::now() + self.ttl,
            },
            None => Entry::Refused {
                until: Instant::now() + REFUSED_FOR,
            },
        };
        self.entries().insert(key, entry);
        guard.done = true;
    }
}

struct Unfinished<'a> {
    cache: &'a ContextCache,
    key: u64,
    done: bool,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.cache.entries().remove(&self.key);
        }
    }
}

/// The key of `prefix` for `model`.
pub(super) fn key(model: &str, prefix: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    model.hash(&mut hasher);
    prefix.hash(&mut hasher);
    hasher.finish()
}
