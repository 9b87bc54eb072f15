//! Typed keys of the session's durable state.

use std::fmt;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::Error;

/// A typed key of the session's durable JSON state ([`Session::state`](crate::Session::state)):
/// the value under it is read as a `T` and written back from one, with no JSON written by
/// hand. A value equal to `T::default()` is not kept: a session carries only what matters.
///
/// Read and change it through the run's context ([`RunContext::get`](crate::RunContext::get),
/// [`RunContext::update`](crate::RunContext::update)) during a run, or on a session's state
/// between runs ([`StateKey::get`], [`StateKey::update`]).
///
/// ```
/// use std::collections::BTreeMap;
/// use tower_agent_core::{RunContext, StateKey};
///
/// const VISITS: StateKey<BTreeMap<String, u32>> = StateKey::new("my_app.visits");
///
/// let ctx = RunContext::new();
/// ctx.update(&VISITS, |visits| *visits.entry("home".into()).or_default() += 1).unwrap();
/// assert_eq!(ctx.get(&VISITS)["home"], 1);
/// ctx.update(&VISITS, |visits| visits.clear()).unwrap();
/// assert!(ctx.state_snapshot().is_empty(), "back to its default: removed");
/// ```
pub struct StateKey<T> {
    name: &'static str,
    value: PhantomData<fn() -> T>,
}

impl<T> StateKey<T> {
    /// The key `name` (namespace it: `"my_app.visits"`).
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            value: PhantomData,
        }
    }

    /// The key's name in the JSON state.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<T> StateKey<T>
where
    T: Serialize + DeserializeOwned + Default + PartialEq,
{
    /// The value under this key in `state`: its default when there is none, or when what is
    /// there is not a `T`.
    pub fn get(&self, state: &Map<String, Value>) -> T {
        state
            .get(self.name)
            .and_then(|value| T::deserialize(value).ok())
            .unwrap_or_default()
    }

    /// Change the value under this key in `state` with `f`, starting from its default when
    /// there is none; a value back to its default is removed. Returns what `f` returns.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::BadRequest`](crate::ErrorKind::BadRequest) when the stored value is not a
    /// `T`, or the new one does not serialize; the state is left as it was.
    pub fn update<R>(
        &self,
        state: &mut Map<String, Value>,
        f: impl FnOnce(&mut T) -> R,
    ) -> Result<R, Error> {
        let name = self.name;
        let mut value = match state.get(name) {
            None => T::default(),
            Some(stored) => T::deserialize(stored).map_err(|error| {
                Error::bad_request(format!(
                    "the session state `{name}` is not of the expected type: {error}"
                ))
            })?,
        };
        let out = f(&mut value);
        if value == T::default() {
            state.remove(name);
            return Ok(out);
        }
        let value = serde_json::to_value(value).map_err(|error| {
            Error::bad_request(format!(
                "the session state `{name}` does not serialize: {error}"
            ))
        })?;
        state.insert(name.to_owned(), value);
        Ok(out)
    }
}

impl<T> StateKey<T>
where
    T: Serialize + DeserializeOwned + Default + PartialEq,
{
    /// [`StateKey::update`] for state a layer owns and can rebuild: a stored value that is not
    /// a `T` is replaced, starting from the default (as is a new value that does not
    /// serialize).
    pub fn update_or_reset<R>(
        &self,
        state: &mut Map<String, Value>,
        f: impl FnOnce(&mut T) -> R,
    ) -> R {
        let mut value = self.get(state);
        let out = f(&mut value);
        match serde_json::to_value(&value) {
            Ok(json) if value != T::default() => {
                state.insert(self.name.to_owned(), json);
            }
            _ => {
                state.remove(self.name);
            }
        }
        out
    }
}

impl<T> Clone for StateKey<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for StateKey<T> {}

impl<T> fmt::Debug for StateKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StateKey").field(&self.name).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COUNT: StateKey<u32> = StateKey::new("count");

    #[test]
    fn a_value_of_another_type_is_refused_and_kept() {
        let mut state = Map::new();
        state.insert("count".into(), Value::from("many"));
        assert_eq!(COUNT.get(&state), 0, "read as the default");
        let error = COUNT.update(&mut state, |n| *n += 1).unwrap_err();
        assert_eq!(error.kind(), crate::ErrorKind::BadRequest);
        assert_eq!(state["count"], "many", "left as it was");
    }

    #[test]
    fn update_or_reset_replaces_what_cannot_be_read() {
        let mut state = Map::new();
        state.insert("count".into(), Value::from("many"));
        COUNT.update_or_reset(&mut state, |n| *n += 1);
        assert_eq!(state["count"], 1);
    }

    #[test]
    fn the_default_is_not_kept() {
        let mut state = Map::new();
        COUNT.update(&mut state, |n| *n = 3).unwrap();
        assert_eq!(state["count"], 3);
        COUNT.update(&mut state, |n| *n = 0).unwrap();
        assert!(state.is_empty());
    }
}
