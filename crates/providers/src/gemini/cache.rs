//! Gemini's explicit context cache, a layer: the system instruction, the tools and the tool
//! config of a request stored once as a `cachedContents` resource, and named by later
//! requests.

use std::collections::HashMap;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;
use serde_json::{Map, Value};
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{Error, ErrorKind, ModelRequest, ModelResponse};
use tower_layer::Layer;
use tower_service::Service;

use super::Gemini;
use super::request::prefix;
use crate::http::request_headers;
use crate::wire::Endpoint;

/// Gemini's explicit context cache, as a layer around the [`Gemini`] model service it was made
/// from: the request's system instruction, tools and tool config are stored once as a
/// `cachedContents` resource living `ttl`, and later requests with the same ones name it
/// ([`PromptCache::stored`](tower_agent_core::PromptCache::stored)) instead of sending them.
/// Gemini bills cached tokens at a quarter of the price, and their storage by the hour. Gemini
/// 2.5 models also cache implicitly, without a guarantee and without this layer.
///
/// - A prefix under about 1,024 tokens (4 KiB) is not cached, nor one sent only once: the
///   second request with a prefix makes its cache (waiting for it, up to 30 s) and names it;
///   the requests that come while it is made go whole.
/// - A cache the API refuses to make (a prefix under the model's minimum) or fails to make is
///   not asked for again for ten minutes; the requests go whole.
/// - A request that named a cache the server no longer has (refused as a bad request or
///   forbidden) is sent once more, whole, and the cache is made anew when the prefix comes
///   back.
/// - `ttl` is at least a minute; a cache is named until a quarter of it (at most 30 s) is left.
/// - The storage Gemini bills by the hour is not in [`Usage::cost`](tower_agent_core::Usage)
///   nor in a budget's worst case.
///
/// It wraps the Gemini service it was made from, and nothing else: a cache belongs to that
/// provider's base URL, key and model, taken when the layer is made, and is named only to it.
/// Wrap the provider with tower's `ServiceBuilder` and give the result to the agent (or to a
/// fallback chain as one of its models): every model layer then runs outside it, so it sees
/// the prompt the provider sends. Not an agent's `provider_layer` slot, which wraps every
/// model of a fallback chain. Clones of the layer share their caches.
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_agent_providers::Gemini;
/// use tower_agent_providers::gemini::ContextCacheLayer;
///
/// let gemini = Gemini::new("gemini-2.5-flash");
/// let model = ServiceBuilder::new()
///     .layer(ContextCacheLayer::new(&gemini, Duration::from_secs(3600)))
///     .service(gemini);
/// # let _ = model;
/// ```
#[derive(Clone)]
pub struct ContextCacheLayer {
    cache: ContextCache,
    target: Arc<Target>,
}

/// Where caches are made, and as whom.
struct Target {
    endpoint: Endpoint,
    http: reqwest::Client,
    /// The provider's headers (its key's among them, marked sensitive) and the host's.
    headers: HeaderMap,
}

/// The model and the base URL; never the key nor a header's value.
impl fmt::Debug for ContextCacheLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContextCacheLayer")
            .field("endpoint", &self.target.endpoint)
            .field("ttl", &self.cache.ttl)
            .finish()
    }
}

impl ContextCacheLayer {
    /// Caches living `ttl` (at least a minute), made with `model`'s base URL, key, headers and
    /// model name.
    pub fn new(model: &Gemini, ttl: Duration) -> Self {
        let client = model.client();
        Self {
            cache: ContextCache::new(ttl),
            target: Arc::new(Target {
                endpoint: client.endpoint.clone(),
                http: client.http.clone(),
                headers: request_headers(&client.wire, &client.endpoint, &client.extra),
            }),
        }
    }

    /// The key of `prefix`, when it is long enough to cache.
    fn key(&self, prefix: &Map<String, Value>) -> Option<u64> {
        let text = serde_json::to_string(prefix).ok()?;
        let endpoint = &self.target.endpoint;
        let api_key = endpoint.key.as_ref().map(|key| key.expose());
        (text.len() >= MIN_BYTES).then(|| key(&endpoint.model, &endpoint.base_url, api_key, &text))
    }

    /// The request as it goes: naming a cache live for its prefix (made first when this is
    /// the time), or whole. With the key of the named cache.
    async fn named(&self, req: &ModelRequest) -> Option<(u64, ModelRequest)> {
        // A cancelled run makes nothing: the provider answers it at once.
        if req.ctx.is_cancelled() {
            return None;
        }
        let prefix = prefix(req);
        let key = self.key(&prefix)?;
        if self.cache.claim(key) {
            let Target {
                endpoint,
                http,
                headers,
            } = &*self.target;
            let url = format!("{}/cachedContents", endpoint.base_url);
            self.cache
                .make(
                    http.clone(),
                    url,
                    headers.clone(),
                    &endpoint.model,
                    key,
                    prefix,
                )
                .await;
        }
        let name = self.cache.live(key)?;
        let mut named = req.clone();
        named.cache.stored = Some(name.into());
        Some((key, named))
    }
}

impl<S> Layer<S> for ContextCacheLayer {
    type Service = ContextCached<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ContextCached {
            inner,
            layer: self.clone(),
        }
    }
}

/// A model service whose requests name Gemini context caches: see [`ContextCacheLayer`].
#[derive(Clone, Debug)]
pub struct ContextCached<S> {
    inner: S,
    layer: ContextCacheLayer,
}

impl<S> Service<ModelRequest> for ContextCached<S>
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = ModelResponse;
    type Error = Error;
    type Future = BoxFuture<'static, Result<ModelResponse, Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ModelRequest) -> Self::Future {
        // The clone that was polled ready takes the call (tower's pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let Some((key, named)) = layer.named(&req).await else {
                return inner.call(req).await;
            };
            match inner.call(named).await {
                // The server no longer has it (deleted, expired early, another project's):
                // not named again, and this request once more, whole.
                Err(error)
                    if matches!(error.kind(), ErrorKind::BadRequest | ErrorKind::Auth)
                        && layer.cache.forget(key) =>
                {
                    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                    inner.call(req).await
                }
                other => other,
            }
        })
    }
}

/// The fewest bytes of a prefix worth caching: about 1,024 tokens, the least the API caches
/// (Gemini 2.5 Flash; 2.5 Pro needs 4,096, and refuses less, which the cache then remembers).
const MIN_BYTES: usize = 4 * 1024;

/// The shortest time to live asked for.
const MIN_TTL: Duration = Duration::from_secs(60);

/// A cache is no longer named this close to its expiry (a quarter of its time to live when
/// that is shorter): a request in flight would find it gone.
const MARGIN: Duration = Duration::from_secs(30);

/// How long a prefix the API refused to cache, or failed to, is not asked again.
const REFUSED_FOR: Duration = Duration::from_secs(600);

/// The caches made, by prefix: one value shared by a provider and its clones.
#[derive(Debug, Clone)]
struct ContextCache {
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
    fn new(ttl: Duration) -> Self {
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
    fn live(&self, key: u64) -> Option<String> {
        match self.entries().get(&key) {
            Some(Entry::Live { name, expires }) if Instant::now() + self.margin() < *expires => {
                Some(name.clone())
            }
            _ => None,
        }
    }

    /// The server refused a request that named the cache of `key` (deleted, expired early,
    /// not this key's): it is not named again, and is made anew when the prefix comes back.
    fn forget(&self, key: u64) -> bool {
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
    fn claim(&self, key: u64) -> bool {
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
    async fn make(
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
fn key(model: &str, base_url: &str, api_key: Option<&str>, prefix: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    model.hash(&mut hasher);
    base_url.hash(&mut hasher);
    api_key.hash(&mut hasher);
    prefix.hash(&mut hasher);
    hasher.finish()
}
