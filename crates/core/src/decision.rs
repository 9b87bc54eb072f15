//! Decisions on calls that wait for the host: what [`AgentInput::Resume`] carries.
//!
//! Plain data, at the bottom of the crate with the session.
//!
//! [`AgentInput::Resume`]: crate::AgentInput::Resume

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::ToolCall;

/// A decision on a call that waits for review (a human approving a tool call).
///
/// Serialized with a `type` tag, so a web front end sends
/// `{"type": "edit", "arguments": {"cmd": "ls"}}`:
///
/// ```
/// use serde_json::json;
/// use tower_agent_core::{Decision, DecisionKind};
///
/// let decision: Decision = serde_json::from_value(json!({"type": "reject", "reason": "too risky"})).unwrap();
/// assert_eq!(decision, Decision::reject("too risky"));
/// assert_eq!(decision.kind(), DecisionKind::Reject);
/// assert_eq!(serde_json::to_value(Decision::Approve).unwrap(), json!({"type": "approve"}));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum Decision {
    /// Run the call as the model wrote it.
    Approve,
    /// Run the call with these arguments instead (a JSON object).
    Edit {
        /// The arguments to run with.
        arguments: Value,
    },
    /// Do not run the call; the model sees an error result with the reason.
    Reject {
        /// Why, for the model.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reason: String,
    },
    /// Do not run the call; `text` becomes its result, as if the tool had returned it.
    Respond {
        /// The result the model sees.
        text: String,
    },
}

/// Why a decision cannot be taken where it was given ([`Decision::check`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DecisionError {
    /// Its kind is not among those allowed there.
    #[error("`{0}` is not allowed")]
    NotAllowed(DecisionKind),
    /// An edit whose arguments are not a JSON object.
    #[error("edited arguments that are not a JSON object: {0}")]
    EditNotAnObject(Value),
}

impl Decision {
    /// Whether this decision may be taken where `allowed` are: its kind is one of them, and
    /// edited arguments are a JSON object. The one check of a decision, for the approval layer
    /// and for a resume.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::decision::DecisionError;
    /// use tower_agent_core::{Decision, DecisionKind};
    ///
    /// let allowed = [DecisionKind::Approve, DecisionKind::Edit];
    /// assert!(Decision::Approve.check(&allowed).is_ok());
    /// assert_eq!(Decision::reject("no").check(&allowed), Err(DecisionError::NotAllowed(DecisionKind::Reject)));
    /// assert!(Decision::edit(json!("rm")).check(&allowed).is_err());
    /// ```
    pub fn check(&self, allowed: &[DecisionKind]) -> Result<(), DecisionError> {
        if !allowed.contains(&self.kind()) {
            return Err(DecisionError::NotAllowed(self.kind()));
        }
        match self {
            Decision::Edit { arguments } if !arguments.is_object() => {
                Err(DecisionError::EditNotAnObject(arguments.clone()))
            }
            _ => Ok(()),
        }
    }

    /// Run the call with `arguments` instead of the model's.
    pub fn edit(arguments: Value) -> Self {
        Decision::Edit { arguments }
    }

    /// Do not run the call, for `reason`.
    pub fn reject(reason: impl Into<String>) -> Self {
        Decision::Reject {
            reason: reason.into(),
        }
    }

    /// Answer the call with `text` instead of running it.
    pub fn respond(text: impl Into<String>) -> Self {
        Decision::Respond { text: text.into() }
    }

    /// Which kind of decision this is.
    pub fn kind(&self) -> DecisionKind {
        match self {
            Decision::Approve => DecisionKind::Approve,
            Decision::Edit { .. } => DecisionKind::Edit,
            Decision::Reject { .. } => DecisionKind::Reject,
            Decision::Respond { .. } => DecisionKind::Respond,
        }
    }
}

impl From<Decision> for Value {
    fn from(decision: Decision) -> Value {
        serde_json::to_value(decision).unwrap_or(Value::Null)
    }
}

/// The kinds of [`Decision`], to say which a waiting call allows.
///
/// Parsed from its name (`"approve"`, `"edit"`, `"reject"`, `"respond"`), so a gate read from
/// a configuration file is checked when it is built:
///
/// ```
/// use tower_agent_core::DecisionKind;
///
/// assert_eq!("edit".parse::<DecisionKind>().unwrap(), DecisionKind::Edit);
/// let err = "aprove".parse::<DecisionKind>().unwrap_err();
/// assert_eq!(err.to_string(), "unknown decision `aprove` (known: approve, edit, reject, respond)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// [`Decision::Approve`].
    Approve,
    /// [`Decision::Edit`].
    Edit,
    /// [`Decision::Reject`].
    Reject,
    /// [`Decision::Respond`].
    Respond,
}

impl DecisionKind {
    /// Every kind, in a fixed order.
    pub const ALL: [DecisionKind; 4] = [
        DecisionKind::Approve,
        DecisionKind::Edit,
        DecisionKind::Reject,
        DecisionKind::Respond,
    ];

    /// Its name.
    pub const fn as_str(self) -> &'static str {
        match self {
            DecisionKind::Approve => "approve",
            DecisionKind::Edit => "edit",
            DecisionKind::Reject => "reject",
            DecisionKind::Respond => "respond",
        }
    }
}

impl fmt::Display for DecisionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AsRef<str> for DecisionKind {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// A decision name that is not one of [`DecisionKind`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown decision `{0}` (known: approve, edit, reject, respond)")]
pub struct UnknownDecision(pub String);

impl FromStr for DecisionKind {
    type Err = UnknownDecision;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        DecisionKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
            .ok_or_else(|| UnknownDecision(name.to_owned()))
    }
}

/// The values a run resumes with, keyed by the id of the call each one answers.
///
/// A call that waits for review ([`Interrupt::allowed`] not empty) takes a [`Decision`]; a
/// call a tool paused with a question of its own takes any JSON value (the answer).
///
/// ```
/// use serde_json::json;
/// use tower_agent_core::{Decision, Decisions};
///
/// let decisions = Decisions::new()
///     .with("call_1", Decision::Approve)
///     .with("call_2", json!("notes.txt"));
/// assert_eq!(decisions.get("call_2"), Some(&json!("notes.txt")));
/// assert_eq!(decisions.len(), 2);
/// ```
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Decisions(BTreeMap<String, Value>);

impl Decisions {
    /// No decision yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same value for every call of `interrupts` (typically [`Session::interrupts`]).
    ///
    /// [`Session::interrupts`]: crate::Session::interrupts
    pub fn all(interrupts: &[Interrupt], value: impl Into<Value>) -> Self {
        let value = value.into();
        Self(
            interrupts
                .iter()
                .map(|i| (i.call.id.clone(), value.clone()))
                .collect(),
        )
    }

    /// Add the value for `call_id` (replacing an earlier one).
    pub fn with(mut self, call_id: impl Into<String>, value: impl Into<Value>) -> Self {
        self.insert(call_id, value);
        self
    }

    /// Set the value for `call_id` (replacing an earlier one).
    pub fn insert(&mut self, call_id: impl Into<String>, value: impl Into<Value>) {
        self.0.insert(call_id.into(), value.into());
    }

    /// The value for `call_id`.
    pub fn get(&self, call_id: &str) -> Option<&Value> {
        self.0.get(call_id)
    }

    /// Whether there is a value for `call_id`.
    pub fn contains(&self, call_id: &str) -> bool {
        self.0.contains_key(call_id)
    }

    /// How many calls are decided.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no call is decided.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The decided call ids and their values, ordered by id.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(id, value)| (id.as_str(), value))
    }
}

impl<K: Into<String>, V: Into<Value>> FromIterator<(K, V)> for Decisions {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self(
            iter.into_iter()
                .map(|(id, value)| (id.into(), value.into()))
                .collect(),
        )
    }
}

/// A run paused at a tool call, waiting for the host (typically a human decision).
///
/// Stored in [`Session::interrupts`](crate::Session::interrupts) and reported in
/// [`Outcome::Interrupted`](crate::Outcome::Interrupted). The call stays unanswered in the
/// history until the run is resumed with [`AgentInput::Resume`](crate::AgentInput::Resume),
/// whose [`Decisions`] carry a value for its call id.
///
/// ```
/// use serde_json::json;
/// use tower_agent_core::{DecisionKind, Interrupt, ToolCall};
///
/// let call = ToolCall::new("c1", "shell", json!({"cmd": "rm -rf build"}));
/// let review = Interrupt::new(call, json!("run it?")).with_allowed([DecisionKind::Approve, DecisionKind::Reject]);
/// assert_eq!(review.allowed, [DecisionKind::Approve, DecisionKind::Reject]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Interrupt {
    /// The call that waits.
    pub call: ToolCall,
    /// What the host needs to decide (for example the question to show a human).
    pub payload: Value,
    /// The decisions the call takes, when it waits for review. Empty: it takes any JSON
    /// value (a tool's own question).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed: Vec<DecisionKind>,
    /// The run paused before a model call, not at a tool call ([`Interrupt::before_model`]):
    /// `call` names the pause (its id is the key to resume with, its name who paused, its
    /// arguments `{}`) and stands nowhere in the history.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub before_model: bool,
}

impl Interrupt {
    /// `call` waits with `payload` for the host, taking any value.
    pub fn new(call: ToolCall, payload: Value) -> Self {
        Self {
            call,
            payload,
            allowed: Vec::new(),
            before_model: false,
        }
    }

    /// A pause before a model call, asked by `name` (a layer) with `payload`, resumed by
    /// `key`: a layer answers a model request with it ([`ModelResponse::pause`]) instead of
    /// calling the model. The run ends [`Interrupted`](crate::Outcome::Interrupted) with it in
    /// [`Session::interrupts`](crate::Session::interrupts), like an approval; a
    /// [`Resume`](crate::AgentInput::Resume) whose [`Decisions`] carry a value for `key` goes on
    /// with the model call, the value in the run's context for the layer to read
    /// ([`RunContext::resumed`](crate::RunContext::resumed)). New messages instead drop the
    /// pause; a `Continue` keeps it waiting.
    ///
    /// `key` must not be a call id of the session: make it say what it asks (`budget-75%`).
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::Interrupt;
    ///
    /// let pause = Interrupt::before_model("spend-over-5-usd", "budget", json!("Spend more than $5?"));
    /// assert!(pause.before_model);
    /// assert_eq!((pause.call.id.as_str(), pause.call.name.as_str()), ("spend-over-5-usd", "budget"));
    /// ```
    ///
    /// [`ModelResponse::pause`]: crate::ModelResponse::pause
    pub fn before_model(key: impl Into<String>, name: impl Into<String>, payload: Value) -> Self {
        Self {
            call: ToolCall::new(key, name, Value::Object(Default::default())),
            payload,
            allowed: Vec::new(),
            before_model: true,
        }
    }

    /// The call takes only these decisions.
    pub fn with_allowed(mut self, allowed: impl IntoIterator<Item = DecisionKind>) -> Self {
        self.allowed = allowed.into_iter().collect();
        self
    }
}
