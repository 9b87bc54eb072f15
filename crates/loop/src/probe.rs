//! Which layer moved the prompt cache's prefix: a probe above the model stack, one below each
//! slot's layers, and one at the provider, each remembering what its place saw at the run's
//! previous model call.
//!
//! A provider caches a request's prefix: the system prompt, the tools, then the messages. When
//! the request at the provider no longer starts with the previous one (a message before its
//! end changed, the system prompt or the tools changed), what was cached is lost. The probe
//! at the provider then says so ([`PrefixMoved`]), naming where the change comes from: walking
//! out from the provider, the last place that saw its own prefix move too, the session (the
//! history the agent sent, a layer's commit) or the slot whose layers made it. Probes look
//! only while someone listens to the run's events.

use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use serde::Serialize;
use tower::Service;
use tower_agent_core::{
    BoxModel, Error, Event, ExtensionKey, HistoryMark, LayerEvent, ModelRequest, ModelResponse,
    ToolSpec,
};

fn lock(seen: &Mutex<Seen>) -> MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The prompt cache's prefix moved between two model calls of a run: what the provider cached
/// of the previous request is lost, and the place that moved it.
///
/// Emitted (as [`Event::Layer`]) by an agent built with [`Agent::builder`](crate::Agent::builder)
/// whose run is observed, before the model call that pays for it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PrefixMoved {
    /// The round of the call that pays.
    pub round: u32,
    /// Who moved it: `"session"` (the history the agent sent changed before its end: a
    /// layer's commit, an edit of the session) or the name of the model slot whose layers did
    /// (`"summarize"`, `"clear"`, `"select"`, `"instructions"`, `"model_layer"`...,
    /// as [`ModelSlot::name`](crate::stack::ModelSlot::name) gives it).
    pub by: &'static str,
    /// What moved: `"system"`, `"tools"` or `"messages"`.
    pub what: &'static str,
    /// How many of the previous request's messages the new one still starts with.
    pub kept_messages: usize,
    /// About how many tokens of the previous request are no longer a cached prefix (its bytes
    /// from the change on, four to a token).
    pub lost_tokens: u64,
}

impl LayerEvent for PrefixMoved {
    const NAME: &'static str = "prefix_moved";
}

impl fmt::Display for PrefixMoved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "round {}: {} moved the cached prefix ({}), about {} tokens no longer cached",
            self.round, self.by, self.what, self.lost_tokens
        )
    }
}

/// A part of a request: its hash and its size in bytes.
type Part = (u64, usize);

fn part(value: &impl Serialize) -> Part {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    (hasher.finish(), bytes.len())
}

/// What one place saw of a request.
struct Seen {
    /// The system prompt and the tools, kept to tell an unchanged one without encoding it
    /// again (the same `Arc` every call, unless a layer made another).
    system: Option<Arc<str>>,
    tools: Arc<[ToolSpec]>,
    system_part: Part,
    tools_part: Part,
    /// Each message's part, and where the history stood: the next look reads only what the
    /// history does not keep of it.
    messages: Vec<Part>,
    mark: HistoryMark,
}

/// What a place saw at the run's previous call, and what it sees now: what the new one lost.
struct Change {
    what: &'static str,
    kept_messages: usize,
    lost_bytes: usize,
}

/// `new`'s part: `old`'s when it is the same value.
fn part_of<T: ?Sized + Serialize>(old: &Arc<T>, old_part: Part, new: &Arc<T>) -> Part {
    match Arc::ptr_eq(old, new) {
        true => old_part,
        false => part(&&**new),
    }
}

impl Seen {
    fn new(request: &ModelRequest) -> Self {
        let history = &request.messages;
        Self {
            system: request.system.clone(),
            tools: Arc::clone(&request.tools),
            system_part: part(&request.system.as_deref()),
            tools_part: part(&&request.tools[..]),
            messages: history.iter().map(part).collect(),
            mark: history.mark(),
        }
    }

    /// Look at `request`, in place of the previous request this place saw: what it lost of
    /// that one, if anything.
    fn look(&mut self, request: &ModelRequest) -> Option<Change> {
        let system_part = match (&self.system, &request.system) {
            (Some(old), Some(new)) => part_of(old, self.system_part, new),
            _ => part(&request.system.as_deref()),
        };
        let tools_part = part_of(&self.tools, self.tools_part, &request.tools);
        let history = &request.messages;
        // The messages the history keeps of the previous look are not read again; the rest is
        // compared by content (a layer that builds an equal history anew moves nothing).
        let kept = history.kept(&self.mark).min(self.messages.len());
        let fresh: Vec<Part> = history[kept..].iter().map(part).collect();
        let same = kept
            + self.messages[kept..]
                .iter()
                .zip(&fresh)
                .take_while(|(a, b)| a == b)
                .count();
        let bytes = |parts: &[Part]| parts.iter().map(|p| p.1).sum::<usize>();
        let what = match (
            self.system_part == system_part,
            self.tools_part == tools_part,
        ) {
            (false, _) => Some("system"),
            (_, false) => Some("tools"),
            _ if same < self.messages.len() => Some("messages"),
            _ => None,
        };
        let change = what.map(|what| Change {
            what,
            kept_messages: same,
            lost_bytes: match what {
                "messages" => bytes(&self.messages[same..]),
                _ => self.system_part.1 + self.tools_part.1 + bytes(&self.messages),
            },
        });
        self.system.clone_from(&request.system);
        self.tools = Arc::clone(&request.tools);
        (self.system_part, self.tools_part) = (system_part, tools_part);
        self.messages.truncate(kept);
        self.messages.extend(fresh);
        self.mark = history.mark();
        change
    }
}

/// Where the probes of one model stack keep their state in a run.
#[derive(Clone)]
pub(crate) struct Probes {
    /// This call's places, outside in, and whether each saw its prefix move.
    trail: ExtensionKey<Vec<(&'static str, bool)>>,
}

impl Probes {
    pub(crate) fn new() -> Self {
        Self {
            trail: ExtensionKey::new(),
        }
    }

    /// A probe around `inner`, named `by`; `at_provider` for the innermost.
    pub(crate) fn probe(&self, inner: BoxModel, by: &'static str, at_provider: bool) -> BoxModel {
        BoxModel::new(Probe {
            inner,
            by,
            at_provider,
            top: by == "session",
            seen: ExtensionKey::new(),
            probes: self.clone(),
        })
    }
}

#[derive(Clone)]
struct Probe {
    inner: BoxModel,
    by: &'static str,
    at_provider: bool,
    top: bool,
    seen: ExtensionKey<Arc<Mutex<Seen>>>,
    probes: Probes,
}

impl Service<ModelRequest> for Probe {
    type Response = ModelResponse;
    type Error = Error;
    type Future = <BoxModel as Service<ModelRequest>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: ModelRequest) -> Self::Future {
        let ctx = &request.ctx;
        if !ctx.events().is_enabled() || ctx.is_side_call() {
            return self.inner.call(request);
        }
        // One place's view per run, looked at in place.
        let change = match ctx.extension_at(&self.seen) {
            Some(seen) => lock(&seen).look(&request),
            None => {
                let seen = Arc::new(Mutex::new(Seen::new(&request)));
                ctx.insert_extension_at(&self.seen, seen);
                None
            }
        };
        let mut trail = match self.top {
            true => Vec::new(),
            false => ctx.extension_at(&self.probes.trail).unwrap_or_default(),
        };
        trail.push((self.by, change.is_some()));
        // Who moved it: from the provider outwards, the last place that still saw it move (a
        // place further out that saw its own view move, a history a layer below it rewrites
        // every call, moved nothing the provider lost).
        let by = trail
            .iter()
            .rev()
            .take_while(|(_, moved)| *moved)
            .last()
            .map_or(self.by, |(by, _)| *by);
        ctx.insert_extension_at(&self.probes.trail, trail);
        let moved = match (self.at_provider, change) {
            (true, Some(change)) => Some(PrefixMoved {
                round: ctx.round(),
                by,
                what: change.what,
                kept_messages: change.kept_messages,
                lost_tokens: change.lost_bytes.div_ceil(4) as u64,
            }),
            _ => None,
        };
        let Some(moved) = moved else {
            return self.inner.call(request);
        };
        let ctx = request.ctx.clone();
        let call = self.inner.call(request);
        Box::pin(async move {
            ctx.emit(Event::layer(moved)).await?;
            call.await
        })
    }
}

impl fmt::Debug for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Probe")
            .field("by", &self.by)
            .finish_non_exhaustive()
    }
}
