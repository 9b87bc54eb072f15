//! The runs a server started: each one's events kept in order (so that a client that comes
//! back reads on from where it left), its cancellation and its steering.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::Value;
use tokio::sync::watch;
use tower_agent_core::{CancellationToken, Steer};

/// How many ended runs stay readable (their events, for a client that reconnects late).
pub(crate) const KEPT_ENDED: usize = 64;

/// One run: its events so far, and how to cancel or steer it.
pub(crate) struct Run {
    pub(crate) id: String,
    pub(crate) session_id: String,
    events: Mutex<Vec<(&'static str, Value)>>,
    /// How many events there are, and whether the run ended: readers wait on it.
    progress: watch::Sender<(usize, bool)>,
    pub(crate) cancel: CancellationToken,
    pub(crate) steer: Steer,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Run {
    pub(crate) fn new(
        id: String,
        session_id: String,
        cancel: CancellationToken,
        steer: Steer,
    ) -> Self {
        Self {
            id,
            session_id,
            events: Mutex::new(Vec::new()),
            progress: watch::channel((0, false)).0,
            cancel,
            steer,
        }
    }

    pub(crate) fn push(&self, name: &'static str, data: Value) {
        let count = {
            let mut events = lock(&self.events);
            events.push((name, data));
            events.len()
        };
        self.progress.send_modify(|progress| progress.0 = count);
    }

    pub(crate) fn end(&self) {
        self.progress.send_modify(|progress| progress.1 = true);
    }

    pub(crate) fn ended(&self) -> bool {
        self.progress.borrow().1
    }

    /// How many events there are so far.
    pub(crate) fn len(&self) -> usize {
        lock(&self.events).len()
    }

    /// The event at `index`, once there is one; `None` when the run ended before it.
    pub(crate) async fn event(&self, index: usize) -> Option<(&'static str, Value)> {
        let mut progress = self.progress.subscribe();
        loop {
            // Seen before the events are read: a push after it wakes the wait below.
            let ended = progress.borrow_and_update().1;
            if let Some(event) = lock(&self.events).get(index) {
                return Some(event.clone());
            }
            if ended || progress.changed().await.is_err() {
                return None;
            }
        }
    }
}

/// The server's runs, by id; the run going on each session.
#[derive(Default)]
pub(crate) struct Runs {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    by_id: HashMap<String, Arc<Run>>,
    /// The run going on, per session.
    going: HashMap<String, String>,
    /// The ended runs still kept, oldest first.
    ended: VecDeque<String>,
}

impl Runs {
    /// Register `run` as its session's: `Err` with the id of the run going on there.
    pub(crate) fn start(&self, run: Arc<Run>) -> Result<(), String> {
        let mut state = lock(&self.state);
        if let Some(going) = state.going.get(&run.session_id) {
            return Err(going.clone());
        }
        state.going.insert(run.session_id.clone(), run.id.clone());
        state.by_id.insert(run.id.clone(), run);
        Ok(())
    }

    pub(crate) fn get(&self, id: &str) -> Option<Arc<Run>> {
        lock(&self.state).by_id.get(id).cloned()
    }

    /// `run` is over (it saved, and said so): its session is free for the next run.
    pub(crate) fn release(&self, run: &Run) {
        let mut state = lock(&self.state);
        if state.going.get(&run.session_id) == Some(&run.id) {
            state.going.remove(&run.session_id);
        }
    }

    /// `run` ended: its session is free, and it is kept among the last ended ones.
    pub(crate) fn ended(&self, run: &Run) {
        self.release(run);
        run.end();
        let mut state = lock(&self.state);
        state.ended.push_back(run.id.clone());
        while state.ended.len() > KEPT_ENDED {
            if let Some(old) = state.ended.pop_front() {
                state.by_id.remove(&old);
            }
        }
    }
}
