//! Gemini's explicit context cache: the system instruction, the tools and the tool config of a
//! request stored once as a `cachedContents` resource, and named by later requests.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;
use serde_json::{Map, Value};

/// The fewest bytes of a prefix worth caching: about 1,024 tokens, the least the API caches
/// (Gemini 2.5 Flash; 2.5 Pro needs 4,096, and refuses less, which the cache then remembers).
pub(super) const MIN_BYTES: usize = 4 * 1024;

/// The shortest time to live asked for.
pub(super) const MIN_TTL: Duration = Duration::from_secs(60);

/// A cache is no longer named this close to its expiry (a quarter of its time to live when
/// that is shorter): a request in flight would find it gone.
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
    /// Sent once: a prefix is cached the second time it is seen, so that a prompt used once
    /// is never stored (and billed by the hour).
    Seen {
        at: Instant,
    },
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

impl Entry {
    /// Whether the entry still says something at `now`.
    fn current(&self, now: Instant, ttl: Duration) -> bool {
        match self {
            Entry::Seen { at } => now < *at + ttl,
            Entry::Creating => true,
            Entry::Live { expires, .. } => now < *expires,
            Entry::Refused { until } => now < *until,
        }
    }
}

impl ContextCache {
    pub(super) fn new(ttl: Duration) -> Self {
        Self {
            ttl: ttl.max(MIN_TTL),
            entries: Arc::default(),
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn margin(&self) -> Duration {
        MARGIN.min(self.ttl / 4)
    }

    /// The name of a cache holding the prefix `key`, live long enough to be used.
    pub(super) fn live(&self, key: u64) -> Option<String> {
        match self.entries().get(&key) {
            Some(Entry::Live { name, expires }) if Instant::now() + self.margin() < *expires => {
                Some(name.clone())
            }
            _ => None,
        }
    }

    /// The server refused a request that named the cache of `key` (deleted, expired early,
    /// not this key's): it is not named again, and is made anew when the prefix comes back.
    pub(super) fn forget(&self, key: u64) -> bool {
        let mut entries = self.entries();
        match entries.get(&key) {
            Some(Entry::Live { .. }) => {
                entries.remove(&key);
                true
            }
            _ => false,
        }
    }

    /// Whether the prefix `key` should be cached now: the second time it is seen, unless a
    /// cache of it is live, being made, or was refused lately. Marks it as being made.
    pub(super) fn claim(&self, key: u64) -> bool {
        let mut entries = self.entries();
        let now = Instant::now();
        let margin = self.margin();
        let ttl = self.ttl;
        // Forget what no longer says anything, so that the map does not grow with every
        // prompt ever sent.
        entries.retain(|_, entry| entry.current(now, ttl));
        let make = match entries.get(&key) {
            None => {
                entries.insert(key, Entry::Seen { at: now });
                return false;
            }
            Some(Entry::Seen { .. }) => true,
            Some(Entry::Creating | Entry::Refused { .. }) => false,
            Some(Entry::Live { expires, .. }) => now + margin >= *expires,
        };
        if make {
            entries.insert(key, Entry::Creating);
        }
        make
    }

    /// Make the cache of `prefix` (claimed with [`claim`](Self::claim)) for `model`. It runs as
    /// a task of its own, so that a request dropped meanwhile leaves no cache made and
    /// forgotten; the request waits for it. Never fails: a request goes on without the cache.
    pub(super) async fn make(
        &self,
        http: reqwest::Client,
        url: String,
        headers: HeaderMap,
        model: &str,
        key: u64,
        prefix: Map<String, Value>,
    ) {
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
        let cache = self.clone();
        let task = tokio::spawn(async move {
            // The server counts the time to live from about now.
            let sent_at = Instant::now();
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
                    expires: sent_at + cache.ttl,
                },
                None => Entry::Refused {
                    until: Instant::now() + REFUSED_FOR,
                },
            };
            cache.entries().insert(key, entry);
        });
        if task.await.is_err() {
            // The task panicked or its runtime is shutting down: not made.
            self.entries().remove(&key);
        }
    }
}

/// The key of `prefix` for `model` at `base_url` with the key `api_key` (a cache belongs to
/// the project that made it).
pub(super) fn key(model: &str, base_url: &str, api_key: Option<&str>, prefix: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    model.hash(&mut hasher);
    base_url.hash(&mut hasher);
    api_key.hash(&mut hasher);
    prefix.hash(&mut hasher);
    hasher.finish()
}
