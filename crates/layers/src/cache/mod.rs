//! A cache of tool results, for tools that only read.
//!
//! [`ToolCacheLayer`] answers a call from a result it keeps when the same tool was called with
//! the same arguments before, in the same scope, within its time to live. It caches the tools
//! the service inside it marks read-only ([`ToolSpec::read_only`], which an MCP tool's
//! `readOnlyHint` sets), and the tools you name with [`include`](ToolCacheLayer::include);
//! never those you [`exclude`](ToolCacheLayer::exclude).
//!
//! - **The key** is the scope, the tool's name and its arguments in canonical form: parsed as
//!   JSON, object keys sorted, written without spaces. `{"b": 1, "a": 2}` and `{"a":2,"b":1}`
//!   are one call. Arguments that are not JSON are never cached: the tool answers them.
//! - **Scopes.** By default one per session ([`per_session`](ToolCacheLayer::per_session),
//!   the outermost run's; a run with no session id is a scope of its own).
//!   [`shared`](ToolCacheLayer::shared) is one for every run through the layer and its clones,
//!   for tools whose answer does not depend on who asks; [`per_key`](ToolCacheLayer::per_key)
//!   one per key a closure reads from the run (a tenant's id; a run with no key is not cached).
//!   A sub-agent (a nested run) is in its parent's scope, but its results are kept apart from
//!   its parent's (a read-only sub-agent calling its own tool would otherwise wait for itself).
//! - **Single flight.** Concurrent identical calls in one scope run the tool once; the others
//!   wait for its result. A hundred at once run it once. When the call that runs it is
//!   dropped (its run cancelled), one of the waiting calls runs it instead.
//! - **What is kept.** A successful result that lets the run go on. A result not kept (an
//!   error result, or one a write overlapped) goes to the calls that waited for it too. A
//!   stop, a pause or an [`Err`] is the running call's own: each call that waited runs its own
//!   request, at once and without single flight. A hit answers with the kept result under its
//!   own call id and no usage (the model calls a sub-agent made are the first call's).
//! - **Writes end what was read.** A call to a tool the service marks as not read-only may
//!   change what the others read (`write_file` after `read_file`): its scope moves to a new
//!   epoch when the call starts and again when it ends (or is dropped), so the entries kept
//!   before are no longer found, and a read that overlapped it is not kept either. The old
//!   entries stay, unreachable, until their time to live ends or room is needed. Only calls
//!   through this layer (or a clone) count: give a sub-agent's tool stack the same layer for
//!   its writes to reach its parent's scope. A call of a tool the service does not serve
//!   changes nothing. [`invalidate_on_write(false)`](ToolCacheLayer::invalidate_on_write)
//!   turns this off.
//! - **Bounded.** Entries live [`ttl`](ToolCacheLayer::ttl) (5 minutes by default) and take at
//!   most [`max_bytes`](ToolCacheLayer::max_bytes) between them (32 MiB by default, counting
//!   their results and arguments); the least used go first.
//! - **Not answered from the cache:** a resumed call (it carries the value the run resumed
//!   with); a resumed write still moves its scope on.
//!
//! The cache lives in memory, in the layer and its clones (the entries are
//! [moka](https://docs.rs/moka)'s): each process has its own, and a restart starts empty.
//!
//! In the agent builder it sits right inside approval (slot `cache`): the calls it answers are
//! still counted by the call limits and still asked for approval, and your `tool_layer` runs
//! only for the calls that reach the tool.
//!
//! ```
//! use serde_json::json;
//! use tower::{Layer, ServiceExt};
//! use tower_agent_core::{RunContext, ToolCall, ToolRequest};
//! use tower_agent_layers::cache::ToolCacheLayer;
//! use tower_agent_test::StubTool;
//! use tower_agent_tools::ToolSet;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_agent_core::Error> {
//! let weather = StubTool::returning("weather", "sunny").read_only();
//! let tools = ToolCacheLayer::new().layer(ToolSet::new().tool(weather.clone()));
//!
//! let ctx = RunContext::new().with_session_id("s1");
//! let call = |id: &str, args| ToolRequest::new(ToolCall::new(id, "weather", args), ctx.clone());
//! tools.clone().oneshot(call("c1", json!({"city": "Paris", "days": 1}))).await?;
//! let again = tools.clone().oneshot(call("c2", json!({"days": 1, "city": "Paris"}))).await?;
//! assert_eq!(again.result.content, "sunny");
//! assert_eq!(again.result.call_id, "c2");
//! assert_eq!(weather.calls().len(), 1, "the second call was answered from the cache");
//! # Ok(())
//! # }
//! ```
//!
//! [`ToolSpec::read_only`]: tower_agent_core::ToolSpec::read_only

mod service;
/// The cache on the tools, right inside approval: the calls it answers are still counted by the
/// limits and asked for approval; the host's tool layers run only for the calls that reach the
/// tools.
impl tower_agent_loop::Builtin for ToolCacheLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::ToolSlot;
        stacks.tools(ToolSlot::Cache, self);
    }
}

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use tower_agent_core::RunContext;
use tower_layer::Layer;

pub use service::{ResponseFuture, ToolCache};

type KeyFn = Arc<dyn Fn(&RunContext) -> Option<String> + Send + Sync>;

/// Where every scope's epochs come from: an epoch is never given twice, so a scope whose epoch
/// was forgotten (unread for its time to live) starts on one no entry was kept under.
static NEXT_EPOCH: AtomicU64 = AtomicU64::new(1);

/// Applies [`ToolCache`]; see the [module docs](self).
///
/// Clones share one cache. Each builder method makes a new, empty one.
#[derive(Clone)]
pub struct ToolCacheLayer {
    config: Arc<Config>,
}

/// What the layer was built with.
#[derive(Clone)]
struct Settings {
    scope: Scope,
    ttl: Duration,
    max_bytes: u64,
    tools: Vec<String>,
    exclude: Vec<String>,
    invalidate_on_write: bool,
}

#[derive(Clone)]
enum Scope {
    Session,
    Shared,
    Key(KeyFn),
}

pub(crate) struct Config {
    settings: Settings,
    /// The kept results, by scope, epoch, nesting, tool and arguments.
    values: moka::future::Cache<Key, Arc<tower_agent_core::ToolResponse>>,
    /// Each scope's epoch: a write moves it on, and the entries of earlier epochs are no longer
    /// found (they stay, unreachable, until their time to live ends or room is needed). An
    /// epoch is forgotten when it is not read for the time to live; the scope then gets a new
    /// one.
    epochs: moka::sync::Cache<Arc<str>, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub(crate) scope: Arc<str>,
    pub(crate) epoch: u64,
    /// The nested run's path (a sub-agent's), `None` for the outermost run.
    pub(crate) path: Option<Arc<str>>,
    pub(crate) tool: String,
    pub(crate) arguments: String,
}

/// Longer than this and moka refuses the time to live; no one means more.
const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

impl ToolCacheLayer {
    /// A cache of the read-only tools' results, per session, for 5 minutes, of at most 32 MiB.
    pub fn new() -> Self {
        Self::from_settings(Settings {
            scope: Scope::Session,
            ttl: Duration::from_secs(5 * 60),
            max_bytes: 32 << 20,
            tools: Vec::new(),
            exclude: Vec::new(),
            invalidate_on_write: true,
        })
    }

    fn from_settings(settings: Settings) -> Self {
        let values = moka::future::Cache::builder()
            .time_to_live(settings.ttl)
            .max_capacity(settings.max_bytes)
            .weigher(|key: &Key, value: &Arc<tower_agent_core::ToolResponse>| {
                let bytes = key.arguments.len() + value.result.content.len();
                u32::try_from(bytes).unwrap_or(u32::MAX)
            })
            .build();
        let epochs = moka::sync::Cache::builder()
            .time_to_idle(settings.ttl)
            .build();
        Self {
            config: Arc::new(Config {
                settings,
                values,
                epochs,
            }),
        }
    }

    fn with(self, change: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = self.config.settings.clone();
        change(&mut settings);
        Self::from_settings(settings)
    }

    /// How long a result is kept (5 minutes by default; at most a hundred years).
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|s| s.ttl = ttl.min(MAX_TTL))
    }

    /// The most bytes of results and arguments kept at once (32 MiB by default); past it,
    /// the least used entries go.
    pub fn max_bytes(self, bytes: u64) -> Self {
        self.with(|s| s.max_bytes = bytes)
    }

    /// One scope per session (the default): the outermost run's session, so a sub-agent
    /// shares its parent's entries.
    pub fn per_session(self) -> Self {
        self.with(|s| s.scope = Scope::Session)
    }

    /// One scope for every run through the layer and its clones. Only for tools whose result
    /// does not depend on who calls them: a session reads what another session's call found.
    pub fn shared(self) -> Self {
        self.with(|s| s.scope = Scope::Shared)
    }

    /// One scope per key that `key` reads from the outermost run (a tenant's id from its
    /// extensions or state). A run it gives no key is not cached (its writes drop nothing).
    pub fn per_key(
        self,
        key: impl Fn(&RunContext) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.with(|s| s.scope = Scope::Key(Arc::new(key)))
    }

    /// Cache `tool` too, though it is not marked read-only (a pure computation).
    pub fn include(self, tool: impl Into<String>) -> Self {
        let tool = tool.into();
        self.with(|s| s.tools.push(tool))
    }

    /// Never cache `tool`, though it is read-only (its answer changes by itself: the time, a
    /// queue's length). Its calls neither use nor drop the cache: do not exclude a tool that
    /// writes, or its writes leave stale results.
    pub fn exclude(self, tool: impl Into<String>) -> Self {
        let tool = tool.into();
        self.with(|s| s.exclude.push(tool))
    }

    /// Whether a call to a tool that may write (neither cached nor read-only) drops its
    /// scope's entries (`true` by default).
    pub fn invalidate_on_write(self, invalidate: bool) -> Self {
        self.with(|s| s.invalidate_on_write = invalidate)
    }

    /// How many entries the cache holds now (for tests and metrics; moka counts lazily, so the
    /// figure may trail the last calls by a little).
    pub fn entry_count(&self) -> u64 {
        self.config.values.entry_count()
    }
}

impl Default for ToolCacheLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ToolCacheLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let settings = &self.config.settings;
        let scope = match settings.scope {
            Scope::Session => "session",
            Scope::Shared => "shared",
            Scope::Key(_) => "key",
        };
        f.debug_struct("ToolCacheLayer")
            .field("scope", &scope)
            .field("ttl", &settings.ttl)
            .field("max_bytes", &settings.max_bytes)
            .field("tools", &settings.tools)
            .field("exclude", &settings.exclude)
            .field("invalidate_on_write", &settings.invalidate_on_write)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ToolCacheLayer {
    type Service = ToolCache<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ToolCache::from_config(inner, Arc::clone(&self.config))
    }
}

/// What the layer does with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Answered from the cache, or run once and kept.
    Cached,
    /// May change what cached tools read: drops its scope's entries.
    Writes,
    /// Passed through untouched.
    Other,
}

impl Config {
    /// What to do with a call of `tool`, which the service inside marks read-only
    /// (`Some(true)`), not (`Some(false)`), or does not serve (`None`: the call only gets an
    /// error result).
    pub(crate) fn kind(&self, tool: &str, read_only: Option<bool>) -> Kind {
        let settings = &self.settings;
        let named = |names: &[String]| names.iter().any(|name| name == tool);
        if named(&settings.exclude) {
            Kind::Other
        } else if read_only == Some(true) || named(&settings.tools) {
            Kind::Cached
        } else if read_only == Some(false) && settings.invalidate_on_write {
            Kind::Writes
        } else {
            Kind::Other
        }
    }

    /// The scope of a call made in `ctx`; `None` when a keyed scope gives no key.
    pub(crate) fn scope(&self, ctx: &RunContext) -> Option<Arc<str>> {
        Some(match &self.settings.scope {
            Scope::Session => {
                let root = ctx.root();
                match root.session_id() {
                    // A run with no session is a scope of its own.
                    "" => Arc::from(format!("\0run {}", root.run_id())),
                    session => Arc::from(session),
                }
            }
            Scope::Shared => Arc::from(""),
            Scope::Key(key) => Arc::from(key(&ctx.root())?),
        })
    }

    /// The scope's epoch now (a new one when it has none).
    pub(crate) fn epoch(&self, scope: &Arc<str>) -> u64 {
        self.epochs
            .get_with_by_ref(scope, || NEXT_EPOCH.fetch_add(1, Ordering::Relaxed))
    }

    /// Move the scope to a new epoch: what was kept before is no longer found.
    pub(crate) fn invalidate(&self, scope: &Arc<str>) {
        self.epochs.insert(
            Arc::clone(scope),
            NEXT_EPOCH.fetch_add(1, Ordering::Relaxed),
        );
    }
}

/// `arguments` in canonical form (object keys sorted, no spaces), or `None` when they are not
/// JSON.
pub(crate) fn canonical(arguments: &str) -> Option<String> {
    let mut value: Value = serde_json::from_str(arguments).ok()?;
    value.sort_all_objects();
    Some(value.to_string())
}
