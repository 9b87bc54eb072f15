//! The run context every request carries.

use std::any::{Any, TypeId};
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::event::{Event, EventSink, EventStream, Observer};
pub use crate::session::new_id;
use crate::state::StateKey;

mod nested;

use nested::Nesting;

/// What every request of one run carries down: ids, the round, shared state, the event sink
/// and the cancellation token. Nothing flows back through it: what a call did travels in its
/// response (or its [`Error`]).
///
/// Cloning is O(1): clones share the same state. The agent hands a clone, with the round
/// number set, to every model and tool request of the run, so state written at one callback
/// point is read at the next.
///
/// Two kinds of state:
///
/// - the **JSON state** is the session's state: the agent moves
///   [`Session::state`](crate::Session::state) in at the start of a run (keys already set on
///   the context win) and writes it back at the end, so it persists with the session;
/// - **extensions** are typed values for this run only (like `http::Extensions`).
///
/// ```
/// use tower_agent_core::RunContext;
///
/// let ctx = RunContext::new();
/// ctx.set_state("todo", vec!["write tests"]);
/// ctx.insert_extension(42_u32);
/// let other = ctx.with_round(3);
/// assert_eq!(other.state::<Vec<String>>("todo").unwrap(), vec!["write tests".to_string()]);
/// assert_eq!(other.extension::<u32>(), Some(42));
/// assert_eq!(other.round(), 3);
/// ```
#[derive(Clone)]
pub struct RunContext {
    shared: Arc<Shared>,
    round: u32,
}

struct Shared {
    run_id: Arc<str>,
    session_id: Arc<str>,
    cancel: CancellationToken,
    events: EventSink,
    /// Made at the first write that leaves a value: most runs keep no state, and every run
    /// has a context.
    state: Mutex<Option<Box<Map<String, Value>>>>,
    extensions: Mutex<Extensions>,
    /// Where a nested run belongs ([`RunContext::nested`]); boxed, as few runs are nested.
    nesting: Option<Box<Nesting>>,
    /// The outermost run a side call was made for ([`RunContext::side_call`]).
    side_of: Option<RunContext>,
}

/// A copy for [`Arc::make_mut`]: the locks are copied by value.
impl Clone for Shared {
    fn clone(&self) -> Self {
        Self {
            run_id: self.run_id.clone(),
            session_id: self.session_id.clone(),
            cancel: self.cancel.clone(),
            events: self.events.clone(),
            state: Mutex::new(lock(&self.state).clone()),
            extensions: Mutex::new(lock(&self.extensions).clone()),
            nesting: self.nesting.clone(),
            side_of: self.side_of.clone(),
        }
    }
}

pub(crate) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock (in user code) must not poison the run.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Default for RunContext {
    fn default() -> Self {
        Self::new()
    }
}

impl RunContext {
    /// A context with a fresh run id, an empty session id, no event sink and a fresh
    /// cancellation token.
    pub fn new() -> Self {
        Self::from_shared(Shared {
            run_id: new_id().into(),
            session_id: Arc::from(""),
            cancel: CancellationToken::new(),
            events: EventSink::default(),
            state: Mutex::new(None),
            extensions: Mutex::new(Extensions::default()),
            nesting: None,
            side_of: None,
        })
    }

    fn from_shared(shared: Shared) -> Self {
        Self {
            shared: Arc::new(shared),
            round: 0,
        }
    }

    /// Mutable access for the builder-style methods: in place when this is the only clone,
    /// else on a copy (ids, token, sink and state are carried over).
    fn shared_mut(&mut self) -> &mut Shared {
        Arc::make_mut(&mut self.shared)
    }

    /// Set the run id.
    pub fn with_run_id(mut self, id: impl Into<Arc<str>>) -> Self {
        self.shared_mut().run_id = id.into();
        self
    }

    /// Set the session id.
    pub fn with_session_id(mut self, id: impl Into<Arc<str>>) -> Self {
        self.shared_mut().session_id = id.into();
        self
    }

    /// Use `token` to cancel the run (a child token works too).
    pub fn with_cancellation(mut self, token: CancellationToken) -> Self {
        self.shared_mut().cancel = token;
        self
    }

    /// Add an observer: it receives every event, in order, and its error stops the run.
    pub fn with_observer(mut self, observer: impl Observer) -> Self {
        let events = &mut self.shared_mut().events;
        *events = std::mem::take(events).with_observer(observer);
        self
    }

    /// Add an event stream with room for `capacity` events: when it is full, the run waits
    /// for the consumer (backpressure). Dropping the stream stops the sending, not the run.
    pub fn with_event_stream(mut self, capacity: usize) -> (Self, EventStream) {
        let events = &mut self.shared_mut().events;
        let (sink, stream) = std::mem::take(events).with_stream(capacity);
        *events = sink;
        (self, stream)
    }

    /// A clone of this context at `round`.
    pub fn with_round(&self, round: u32) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            round,
        }
    }

    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.shared.run_id
    }

    /// The session's id.
    pub fn session_id(&self) -> &str {
        &self.shared.session_id
    }

    /// The round this request belongs to: 1 for the first model call of a run, 0 outside
    /// rounds (before the first one, and for calls resumed after an interrupt).
    pub fn round(&self) -> u32 {
        self.round
    }

    /// The run's cancellation token.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.shared.cancel
    }

    /// Whether the run was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.shared.cancel.is_cancelled()
    }

    /// Cancel the run: it ends before the next model or tool call, with outcome cancelled.
    pub fn cancel(&self) {
        self.shared.cancel.cancel();
    }

    /// The event sink.
    pub fn events(&self) -> &EventSink {
        &self.shared.events
    }

    /// Emit an event to the observers (awaited, in order) and the stream. While the stream is
    /// full the call waits for the reader, unless the run is cancelled: then the event goes to
    /// the stream only if it fits (see [`EventSink::emit_until_cancelled`]).
    ///
    /// # Errors
    ///
    /// An observer's error ([`ErrorKind::Observer`](crate::ErrorKind::Observer) unless the
    /// observer chose another kind): the caller should stop and return it.
    pub async fn emit(&self, event: Event) -> Result<(), Error> {
        let events = &self.shared.events;
        if !events.is_enabled() {
            return Ok(());
        }
        // Boxed: delivering an event (observers in turn, the stream's send) is a future of
        // about a kilobyte, which every future that emits (a run's, a layer's) would hold
        // whether anything listens or not.
        Box::pin(events.emit_until_cancelled(event, &self.shared.cancel)).await
    }

    /// The value the run was resumed with for the pause `key` ([`Interrupt::before_model`]),
    /// in the run that resumes it: what the host answered the layer that paused. `None` in
    /// any other run.
    ///
    /// A layer that pauses reads it at its next call: the answer, it goes on (or stops); none,
    /// it pauses. It keeps what the answer settles in the session's state if a later run must
    /// know (the answer lives for this run only).
    ///
    /// [`Interrupt::before_model`]: crate::Interrupt::before_model
    pub fn resumed(&self, key: &str) -> Option<Value> {
        self.extension::<Resumed>()?.0.get(key).cloned()
    }

    /// Give the run the values a resume answered its pauses with ([`RunContext::resumed`]);
    /// the agent does it when a [`Resume`](crate::AgentInput::Resume) answers a pause.
    pub fn set_resumed(&self, answers: crate::Decisions) {
        self.insert_extension(Resumed(Arc::new(answers)));
    }

    /// Read a value of the session's JSON state. `None` when missing or not of type `T`.
    pub fn state<T: DeserializeOwned>(&self, key: &str) -> Option<T> {
        self.read_state(|state| state.get(key).and_then(|v| T::deserialize(v).ok()))
    }

    /// Write a value into the session's JSON state. A value that does not serialize to JSON
    /// is stored as `null`.
    pub fn set_state(&self, key: impl Into<String>, value: impl Serialize) {
        let value = serde_json::to_value(value).unwrap_or(Value::Null);
        self.with_state(|state| state.insert(key.into(), value));
    }

    /// The value under the typed `key` of the session's state ([`StateKey::get`]): its default
    /// when there is none.
    pub fn get<T>(&self, key: &StateKey<T>) -> T
    where
        T: Serialize + DeserializeOwned + Default + PartialEq,
    {
        self.read_state(|state| key.get(state))
    }

    /// Change the value under the typed `key` of the session's state, atomically (other
    /// clones wait meanwhile; `f` runs with the state locked: do not block or await in it); a
    /// value back to its default is removed ([`StateKey::update`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::BadRequest`](crate::ErrorKind::BadRequest) when the stored value is not a
    /// `T`; the state is left as it was.
    pub fn update<T, R>(&self, key: &StateKey<T>, f: impl FnOnce(&mut T) -> R) -> Result<R, Error>
    where
        T: Serialize + DeserializeOwned + Default + PartialEq,
    {
        self.with_state(|state| key.update(state, f))
    }

    /// [`RunContext::update`] for state a layer owns and can rebuild: a stored value that is not
    /// a `T` is replaced, starting from the default ([`StateKey::update_or_reset`]).
    pub fn update_or_reset<T, R>(&self, key: &StateKey<T>, f: impl FnOnce(&mut T) -> R) -> R
    where
        T: Serialize + DeserializeOwned + Default + PartialEq,
    {
        self.with_state(|state| key.update_or_reset(state, f))
    }

    /// Run `f` with the JSON state locked. Do not block or await inside.
    pub fn with_state<R>(&self, f: impl FnOnce(&mut Map<String, Value>) -> R) -> R {
        let mut state = lock(&self.shared.state);
        if let Some(state) = state.as_deref_mut() {
            return f(state);
        }
        // None yet: kept only if `f` wrote something.
        let mut fresh = Map::new();
        let out = f(&mut fresh);
        if !fresh.is_empty() {
            *state = Some(Box::new(fresh));
        }
        out
    }

    /// Run `f` with the JSON state locked for reading (an empty map when none was written).
    fn read_state<R>(&self, f: impl FnOnce(&Map<String, Value>) -> R) -> R {
        match &*lock(&self.shared.state) {
            Some(state) => f(state),
            None => f(&Map::new()),
        }
    }

    /// Store a typed value for this run, replacing any value of the same type.
    pub fn insert_extension<T: Clone + Send + Sync + 'static>(&self, value: T) {
        lock(&self.shared.extensions).insert(None, value);
    }

    /// A clone of the typed value of type `T`, if one was stored.
    pub fn extension<T: Clone + Send + Sync + 'static>(&self) -> Option<T> {
        lock(&self.shared.extensions).get::<T>(None)
    }

    /// A clone of the typed value of type `T`, storing `make()` first if there is none. One
    /// step under the lock, so concurrent tool calls of a round all get the same value (a
    /// shared counter, say).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use tower_agent_core::RunContext;
    ///
    /// let ctx = RunContext::new();
    /// let a = ctx.extension_or_insert_with(|| Arc::new(AtomicU32::new(0)));
    /// a.fetch_add(1, Ordering::Relaxed);
    /// let b = ctx.extension_or_insert_with(|| Arc::new(AtomicU32::new(0)));
    /// assert_eq!(b.load(Ordering::Relaxed), 1);
    /// ```
    pub fn extension_or_insert_with<T: Clone + Send + Sync + 'static>(
        &self,
        make: impl FnOnce() -> T,
    ) -> T {
        let mut extensions = lock(&self.shared.extensions);
        if let Some(value) = extensions.get::<T>(None) {
            return value;
        }
        let value = make();
        extensions.insert(None, value.clone());
        value
    }

    /// Merge `state` into the JSON state; keys already present win.
    pub fn absorb_state(&self, state: Map<String, Value>) {
        if state.is_empty() {
            return;
        }
        self.with_state(|mine| {
            for (key, value) in state {
                mine.entry(key).or_insert(value);
            }
        });
    }

    /// A copy of the whole JSON state.
    pub fn state_snapshot(&self) -> Map<String, Value> {
        self.read_state(Map::clone)
    }
}

impl fmt::Debug for RunContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // State values are the host's data: show only the keys.
        let keys: Vec<String> = self.read_state(|state| state.keys().cloned().collect());
        f.debug_struct("RunContext")
            .field("run_id", &self.shared.run_id)
            .field("session_id", &self.shared.session_id)
            .field("round", &self.round)
            .field("cancelled", &self.is_cancelled())
            .field("state_keys", &keys)
            .field("events", &self.shared.events)
            .finish()
    }
}

/// A slot in a run's extensions that belongs to one layer value and its clones: two layers of
/// the same type keep their values apart ([`RunContext::extension_at`]). Make one when the layer
/// is configured; its clones share it.
///
/// ```
/// use tower_agent_core::{ExtensionKey, RunContext};
///
/// let (first, second) = (ExtensionKey::<u32>::new(), ExtensionKey::<u32>::new());
/// let ctx = RunContext::new();
/// ctx.insert_extension_at(&first, 1);
/// ctx.insert_extension_at(&second.clone(), 2);
/// assert_eq!((ctx.extension_at(&first), ctx.extension_at(&second)), (Some(1), Some(2)));
/// assert_eq!(ctx.extension::<u32>(), None, "not the value by type alone");
/// ```
pub struct ExtensionKey<T> {
    id: Arc<()>,
    value: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T> {
    /// A new key, unlike every other.
    pub fn new() -> Self {
        Self {
            id: Arc::new(()),
            value: PhantomData,
        }
    }
}

impl<T> Default for ExtensionKey<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        Self {
            id: Arc::clone(&self.id),
            value: PhantomData,
        }
    }
}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtensionKey")
            .field("type", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

impl RunContext {
    /// A clone of the value stored under `key`, if one was.
    pub fn extension_at<T: Clone + Send + Sync + 'static>(
        &self,
        key: &ExtensionKey<T>,
    ) -> Option<T> {
        lock(&self.shared.extensions).get::<T>(Some(&key.id))
    }

    /// Store `value` under `key`, replacing the value stored there.
    pub fn insert_extension_at<T: Clone + Send + Sync + 'static>(
        &self,
        key: &ExtensionKey<T>,
        value: T,
    ) {
        lock(&self.shared.extensions).insert(Some(&key.id), value);
    }

    /// A clone of the value under `key`, storing `make()` first if there is none (one step
    /// under the lock, as [`RunContext::extension_or_insert_with`]).
    pub fn extension_at_or_insert_with<T: Clone + Send + Sync + 'static>(
        &self,
        key: &ExtensionKey<T>,
        make: impl FnOnce() -> T,
    ) -> T {
        let mut extensions = lock(&self.shared.extensions);
        if let Some(value) = extensions.get::<T>(Some(&key.id)) {
            return value;
        }
        let value = make();
        extensions.insert(Some(&key.id), value.clone());
        value
    }
}

/// Typed values by type (and by [`ExtensionKey`]), for one run.
#[derive(Clone, Default)]
struct Extensions {
    /// A list, searched in order: a run holds a handful of extensions.
    list: Vec<Slot>,
}

#[derive(Clone)]
struct Slot {
    type_id: TypeId,
    /// The key's identity; `None` for a value stored by type alone.
    key: Option<Arc<()>>,
    value: Arc<dyn Any + Send + Sync>,
}

impl Slot {
    fn holds(&self, type_id: TypeId, key: Option<&Arc<()>>) -> bool {
        let same_key = match (&self.key, key) {
            (None, None) => true,
            (Some(mine), Some(theirs)) => Arc::ptr_eq(mine, theirs),
            _ => false,
        };
        self.type_id == type_id && same_key
    }
}

impl Extensions {
    fn insert<T: Clone + Send + Sync + 'static>(&mut self, key: Option<&Arc<()>>, value: T) {
        let type_id = TypeId::of::<T>();
        match self.list.iter_mut().find(|slot| slot.holds(type_id, key)) {
            // Replaced in place when no one else holds the old value (`get` hands out clones
            // of the value, never the `Arc`).
            Some(slot) => {
                match Arc::get_mut(&mut slot.value).and_then(|old| old.downcast_mut::<T>()) {
                    Some(old) => *old = value,
                    None => slot.value = Arc::new(value),
                }
            }
            None => {
                // Grown one slot at a time: a run holds a handful, most of them one.
                self.list.reserve_exact(1);
                self.list.push(Slot {
                    type_id,
                    key: key.cloned(),
                    value: Arc::new(value),
                });
            }
        }
    }

    fn get<T: Clone + Send + Sync + 'static>(&self, key: Option<&Arc<()>>) -> Option<T> {
        let type_id = TypeId::of::<T>();
        self.list
            .iter()
            .find(|slot| slot.holds(type_id, key))?
            .value
            .downcast_ref::<T>()
            .cloned()
    }
}

/// The values a resume answered the run's pauses with ([`RunContext::resumed`]).
#[derive(Clone)]
struct Resumed(Arc<crate::Decisions>);

#[cfg(test)]
mod tests {
    use super::*;

    /// A context keeps no state until something is written: reading makes none, a write
    /// keeps it, and a copy for a builder method copies it.
    #[test]
    fn state_is_made_at_the_first_write() {
        let ctx = RunContext::new();
        let made = |ctx: &RunContext| lock(&ctx.shared.state).is_some();
        assert!(ctx.with_state(|state| state.is_empty()));
        assert_eq!(ctx.state::<i32>("k"), None);
        ctx.absorb_state(Map::new());
        assert!(ctx.state_snapshot().is_empty());
        assert!(!made(&ctx), "reads made state");
        ctx.set_state("k", 1);
        assert!(made(&ctx));
        let other = ctx.clone().with_run_id("other");
        ctx.set_state("k", 2);
        assert_eq!(
            (ctx.state::<i32>("k"), other.state::<i32>("k")),
            (Some(2), Some(1))
        );
    }

    #[test]
    fn an_extension_is_replaced_in_place_and_clones_handed_out_stay() {
        let ctx = RunContext::new();
        ctx.insert_extension(String::from("first"));
        let held = ctx.extension::<String>();
        ctx.insert_extension(String::from("second"));
        ctx.insert_extension(7_u32);
        ctx.insert_extension(String::from("third"));
        assert_eq!(held.as_deref(), Some("first"), "a clone is not changed");
        assert_eq!(ctx.extension::<String>().as_deref(), Some("third"));
        assert_eq!(ctx.extension::<u32>(), Some(7));
        assert_eq!(
            lock(&ctx.shared.extensions).list.len(),
            2,
            "one slot per type"
        );
    }

    #[test]
    fn clones_share_state_and_builders_keep_it() {
        let ctx = RunContext::new().with_session_id("s1");
        ctx.set_state("k", 1);
        let clone = ctx.clone();
        clone.set_state("k", 2);
        assert_eq!(ctx.state::<i32>("k"), Some(2));
        // A builder call on a shared context copies, keeping what was there.
        let moved = clone.with_run_id("r2");
        assert_eq!(moved.state::<i32>("k"), Some(2));
        assert_eq!(moved.session_id(), "s1");
        assert_eq!(moved.run_id(), "r2");
        assert_ne!(ctx.run_id(), "r2");
    }

    #[test]
    fn absorb_keeps_existing_keys() {
        let ctx = RunContext::new();
        ctx.set_state("a", "mine");
        let mut incoming = Map::new();
        incoming.insert("a".into(), Value::from("theirs"));
        incoming.insert("b".into(), Value::from(2));
        ctx.absorb_state(incoming);
        assert_eq!(ctx.state::<String>("a").as_deref(), Some("mine"));
        assert_eq!(ctx.state::<i32>("b"), Some(2));
    }

    #[test]
    fn wrong_type_reads_as_none() {
        let ctx = RunContext::new();
        ctx.set_state("n", "not a number");
        assert_eq!(ctx.state::<u32>("n"), None);
        assert_eq!(ctx.extension::<String>(), None);
    }

    #[test]
    fn update_refuses_another_type_and_changes_nothing() {
        const N: StateKey<u32> = StateKey::new("n");
        const LIST: StateKey<Vec<String>> = StateKey::new("list");
        let ctx = RunContext::new();
        ctx.set_state("n", "text");
        let err = ctx.update(&N, |n| *n += 1).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::BadRequest);
        assert_eq!(ctx.state::<String>("n").as_deref(), Some("text"));
        let items = ctx
            .update(&LIST, |v| {
                v.push("a".into());
                v.len()
            })
            .unwrap();
        assert_eq!(items, 1);
        assert_eq!(ctx.get(&LIST), vec!["a".to_string()]);
    }
}
