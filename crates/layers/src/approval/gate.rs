//! Gates, review requests, approvers and the builder: what the approval layer is configured
//! with.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tower_agent_core::{Decision, DecisionKind, Interrupt, ToolCall, UnknownDecision};

use super::{ApprovalLayer, DEFAULT_TIMEOUT};
use crate::ask::Human;
use crate::by_name::ByName;

type Predicate = Arc<dyn Fn(&Value) -> bool + Send + Sync>;
type Describe = Arc<dyn Fn(&ToolCall) -> String + Send + Sync>;

/// Which calls of one tool need a decision, which decisions they allow, and what the human is
/// shown.
///
/// ```
/// use serde_json::Value;
/// use tower_agent_layers::approval::Gate;
///
/// // Only `rm` outside /tmp needs a decision; it can be approved or rejected, not edited.
/// let gate = Gate::new()
///     .allow(["approve", "reject"])
///     .when(|args: &Value| !args["path"].as_str().unwrap_or("").starts_with("/tmp/"))
///     .description("Deletes files");
/// # let _ = gate;
/// ```
#[derive(Clone)]
pub struct Gate {
    allowed: Vec<String>,
    when: Option<Predicate>,
    description: Option<Describe>,
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// Every call of the tool needs a decision; every decision is allowed.
    pub fn new() -> Self {
        Self {
            allowed: DecisionKind::ALL
                .iter()
                .map(|k| k.as_str().to_owned())
                .collect(),
            when: None,
            description: None,
        }
    }

    /// The decisions the human may take, by name (`"approve"`, `"edit"`, `"reject"`,
    /// `"respond"`) or as [`DecisionKind`]s. A name that is not a decision fails
    /// [`ApprovalBuilder::build`].
    pub fn allow<I>(mut self, decisions: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        self.allowed = decisions
            .into_iter()
            .map(|d| d.as_ref().to_owned())
            .collect();
        self
    }

    /// Only calls whose arguments match need a decision. Arguments that are not JSON always
    /// need one (fail closed).
    pub fn when(mut self, predicate: impl Fn(&Value) -> bool + Send + Sync + 'static) -> Self {
        self.when = Some(Arc::new(predicate));
        self
    }

    /// What the human is shown about the tool.
    pub fn description(self, text: impl Into<String>) -> Self {
        let text: Arc<str> = text.into().into();
        self.describe(move |_| text.to_string())
    }

    /// What the human is shown, written from the call.
    pub fn describe(
        mut self,
        describe: impl Fn(&ToolCall) -> String + Send + Sync + 'static,
    ) -> Self {
        self.description = Some(Arc::new(describe));
        self
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("allowed", &self.allowed)
            .field("when", &self.when.as_ref().map(|_| "<predicate>"))
            .finish_non_exhaustive()
    }
}

/// A gate whose decisions were checked.
#[derive(Clone)]
pub(super) struct Checked {
    pub(super) allowed: Vec<DecisionKind>,
    when: Option<Predicate>,
    description: Option<Describe>,
}

impl Checked {
    /// Whether `call` needs a decision.
    pub(super) fn applies(&self, call: &ToolCall) -> bool {
        match &self.when {
            None => true,
            Some(predicate) => match call.parse_arguments::<Value>() {
                Ok(args) => predicate(&args),
                Err(_) => true,
            },
        }
    }

    pub(super) fn review(&self, call: &ToolCall) -> ReviewRequest {
        let description = match &self.description {
            Some(describe) => describe(call),
            None => format!("The agent wants to call `{}`.", call.name),
        };
        ReviewRequest {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments: call
                .parse_arguments::<Value>()
                .unwrap_or_else(|_| Value::String(call.arguments.clone())),
            description,
            allowed_decisions: self.allowed.clone(),
            token: None,
        }
    }
}

/// What a human is asked about one gated call: the payload of its interrupt, and what an
/// inline [`Human`] receives. Serializable, for a UI in another process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReviewRequest {
    /// The call's id: key the decision by it.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The arguments the model wrote (a JSON string when they are not JSON).
    pub arguments: Value,
    /// What the gate says about the tool.
    pub description: String,
    /// The decisions the human may take.
    pub allowed_decisions: Vec<DecisionKind>,
    /// With [`ApprovalBuilder::signed`]: the token a decision about this call must carry
    /// (`"token"` beside its `"type"`), an HMAC of the call (its id, key and arguments) under
    /// the host's key. A client cannot make one for a call it was not shown, nor reuse one for
    /// another call or other arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl ReviewRequest {
    /// The review an interrupt carries, if it is one (an interrupt from a tool's own question
    /// is not).
    pub fn from_interrupt(interrupt: &Interrupt) -> Option<Self> {
        if interrupt.allowed.is_empty() {
            return None;
        }
        ReviewRequest::deserialize(&interrupt.payload).ok()
    }
}

#[derive(Clone)]
pub(super) enum Mode {
    Interrupt,
    Inline {
        approver: Arc<dyn Human<ReviewRequest, Decision>>,
        timeout: Duration,
    },
}

pub(super) struct Config {
    pub(super) gates: ByName<Checked>,
    pub(super) mode: Mode,
    /// The key decisions are signed with ([`ApprovalBuilder::signed`]).
    pub(super) signing: Option<Arc<[u8]>>,
}

impl Config {
    /// The token of `call`: an HMAC under the signing key of its id, key and arguments.
    pub(super) fn token(&self, call: &ToolCall) -> Option<String> {
        let key = self.signing.as_ref()?;
        Some(crate::sign::hmac_hex(key, &signed_message(call), 32))
    }

    /// Whether `decision` (the resume value) carries the token of `call`, or no token is
    /// needed.
    pub(super) fn verifies(&self, call: &ToolCall, decision: &Value) -> bool {
        let Some(key) = &self.signing else {
            return true;
        };
        match decision.get("token").and_then(Value::as_str) {
            Some(token) => crate::sign::hmac_verify(key, &signed_message(call), token),
            None => false,
        }
    }
}

/// What a token signs: the call's id, key and arguments.
fn signed_message(call: &ToolCall) -> Vec<u8> {
    let key = call.key.map(|key| key.to_string()).unwrap_or_default();
    format!("{}\n{key}\n{}", call.id, call.arguments).into_bytes()
}

/// A gate that cannot work, refused when the layer is built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the approval gate of tool `{tool}`: {problem}")]
pub struct ConfigError {
    /// The gate's tool.
    pub tool: String,
    /// What is wrong with it.
    #[source]
    pub problem: GateProblem,
}

/// What is wrong with a gate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GateProblem {
    /// It names a decision that does not exist.
    #[error(transparent)]
    UnknownDecision(#[from] UnknownDecision),
    /// It allows no decision: its calls would wait for one forever.
    #[error("it allows no decision, so its calls could never run nor be refused")]
    NoDecision,
}

/// Builds an [`ApprovalLayer`].
#[derive(Default)]
pub struct ApprovalBuilder {
    gates: Vec<(String, Gate)>,
    approver: Option<Arc<dyn Human<ReviewRequest, Decision>>>,
    timeout: Option<Duration>,
    signing: Option<Arc<[u8]>>,
}

impl fmt::Debug for ApprovalBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApprovalBuilder")
            .field("gates", &self.gates)
            .field("inline", &self.approver.is_some())
            .field("signed", &self.signing.is_some())
            .finish_non_exhaustive()
    }
}

impl ApprovalBuilder {
    /// Gate the tool `tool` (replacing an earlier gate of the same tool).
    pub fn gate(mut self, tool: impl Into<String>, gate: Gate) -> Self {
        let tool = tool.into();
        self.gates.retain(|(name, _)| *name != tool);
        self.gates.push((tool, gate));
        self
    }

    /// Decide inline with `approver` instead of interrupting the run.
    pub fn inline(mut self, approver: impl Human<ReviewRequest, Decision>) -> Self {
        self.approver = Some(Arc::new(approver));
        self
    }

    /// Sign each review with `key` (an HMAC, as Vercel AI signs its approvals) and take only
    /// decisions that carry the token of the call they decide: a decision without it, or with
    /// another call's, is a rejection (fail closed). The token is in the review
    /// ([`ReviewRequest::token`]); the client sends it back with its decision,
    /// `{"type": "approve", "token": "..."}`. Keep `key` on the server, the same in every
    /// process that may resume the run. An inline approver is in the host's process, so its
    /// decisions need no token.
    pub fn signed(mut self, key: impl AsRef<[u8]>) -> Self {
        self.signing = Some(Arc::from(key.as_ref()));
        self
    }

    /// How long an inline approver has to decide ([`DEFAULT_TIMEOUT`]); then the call is
    /// rejected.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The layer; fails when a gate allows a decision that does not exist, or none.
    pub fn build(self) -> Result<ApprovalLayer, ConfigError> {
        let mut gates = ByName::default();
        for (tool, gate) in self.gates {
            let mut allowed = Vec::with_capacity(gate.allowed.len());
            for name in &gate.allowed {
                let kind = name.parse::<DecisionKind>().map_err(|error| ConfigError {
                    tool: tool.clone(),
                    problem: error.into(),
                })?;
                if !allowed.contains(&kind) {
                    allowed.push(kind);
                }
            }
            if allowed.is_empty() {
                return Err(ConfigError {
                    tool,
                    problem: GateProblem::NoDecision,
                });
            }
            let checked = Checked {
                allowed,
                when: gate.when,
                description: gate.description,
            };
            gates.insert(tool, checked);
        }
        let mode = match self.approver {
            None => Mode::Interrupt,
            Some(approver) => Mode::Inline {
                approver,
                timeout: self.timeout.unwrap_or(DEFAULT_TIMEOUT),
            },
        };
        Ok(ApprovalLayer {
            config: Arc::new(Config {
                gates,
                mode,
                signing: self.signing,
            }),
        })
    }
}
