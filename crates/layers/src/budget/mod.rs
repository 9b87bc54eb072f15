//! Cost budgets, checked before a model call is sent: per run, per session, per tenant.
//!
//! [`BudgetLayer`] prices each call at a [`ModelPrice`]. Before the call goes below, it
//! **reserves** the call's worst case on every budget that applies: the request's prompt
//! tokens (an upper bound: its UTF-8 bytes, since no token is shorter than a byte, plus the
//! framing of each message) at the prompt price, plus `max_tokens` (the request's, or
//! [`assume_output_tokens`](BudgetLayer::assume_output_tokens) when it sets none) at the
//! completion price. After the call it **settles** each reservation with what the call cost:
//! the response's [`Usage::cost`](tower_agent_core::Usage) when the provider priced it
//! ([`Provider::price`]), else its usage at the layer's price, plus the side usage the layers
//! below report for it. A call that fails settles with the usage its error
//! reports (often none); a call cancelled or dropped midway releases what it reserved.
//!
//! **When a budget cannot take the worst case**, the call is not sent: the response is a stop
//! ([`ModelResponse::stop`]) with [`StopReason::Budget`] (which budget, its limit, what was
//! spent or reserved, what the call asked for). The agent ends the run with
//! [`Outcome::Stopped`](tower_agent_core::Outcome::Stopped) and that reason; the history stays
//! as it was, valid, and a later run with more budget goes on from it.
//!
//! **Scopes.** Any number at once; a call must fit in each.
//! - [`per_run`](BudgetLayer::per_run): one ledger per run, kept in the outermost run's
//!   context, so a sub-agent called as a tool (a nested run) spends from its parent's.
//! - [`per_session`](BudgetLayer::per_session): what the session spent is kept in its state
//!   under [`STATE_KEY`] (`tower_agent.cost`), saved with it, and read back at the start of
//!   each run. The layer keeps that total whether or not a session limit is set:
//!   [`session_cost`] reads it.
//! - [`per_key`](BudgetLayer::per_key): one ledger per key a closure reads from the run (a
//!   tenant's id), shared by every run through this layer (and its clones).
//! - [`shared`](BudgetLayer::shared): a [`Budget`] the host holds, shared with anything else
//!   that has a clone of it.
//! - [`window`](BudgetLayer::window): a tenant's day, month or conversation
//!   ([`SpendWindow`]), kept in a [`SpendStore`] every process shares ([`InMemorySpend`] for
//!   one process; `PostgresSpend` with the feature `budget-postgres` for many). Still reserved
//!   before the call is sent, in one step in the store: two processes never hold more than
//!   the window's limit between them (`tests/spend_windows.rs` runs two against a real
//!   Postgres). Pydantic's `SpendLimits` and Mastra's cost control check what was spent, so
//!   concurrent calls overshoot; a reservation here holds the worst case until it settles.
//!
//! **Atomic.** A reservation is one step under the ledger's lock: concurrent calls (parallel
//! sub-agents, parallel runs of one tenant) never reserve more than a run's, a key's or a
//! shared budget's limit between them.
//! With a budget for ten calls, twenty concurrent sub-agents dispatch ten.
//!
//! **What it does not count.** Calls made by layers *above* it: a summarizer of its own
//! (`SummarizeLayer::new`), a guardrail's classifier
//! model. Their tokens reach the run's usage, not the budgets; put their models behind a
//! `BudgetLayer` of their own with the same [`shared`](BudgetLayer::shared) budget to count
//! them. Cache writes are priced at the price's
//! [`cache_write`](tower_agent_core::ModelPrice::cache_write), the prompt price when it gives
//! none. A call dropped after it
//! was sent (its run cancelled) releases its reservation, though the provider may bill its
//! prompt. The session scope is one ledger per run, started from the saved total: two runs of
//! one session at once each see the total of when they started.
//!
//! **Once per call.** Put the layer outside the retry (and the fallback): a call retried
//! three times reserves once and settles once. In the agent builder it sits right inside the
//! structured-output layer (slot `budget`), so every call below is reserved, a summary's or a
//! structured-output repair's included; a fallback chain is reserved at the layer's price, so
//! give it the most expensive model's.
//!
//! ```
//! use tower::ServiceExt;
//! use tower_agent_core::{AgentRequest, Cost, ModelPrice, ModelResponse, Outcome, Session, StopReason, Usage};
//! use tower_agent_layers::budget::BudgetLayer;
//! use tower_agent_loop::Agent;
//! use tower_agent_test::ScriptedModel;
//! use tower_agent_tools::ToolSet;
//! use tower_layer::Layer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_agent_core::Error> {
//! let price = ModelPrice::per_million(3.0, 0.3, 15.0);
//! let budget = BudgetLayer::new(price).per_run(Cost::from_dollars(0.10));
//! let model = ScriptedModel::new([ModelResponse::text("Hello.").with_usage(Usage::new(1_000, 200))]);
//! let agent = Agent::new(budget.layer(model), ToolSet::new());
//!
//! let res = agent.clone().oneshot(AgentRequest::new(Session::new(), "hi")).await?;
//! // 1,000 × $3 + 200 × $15 per million tokens.
//! assert_eq!(res.usage.cost, Cost::from_dollars(0.006));
//!
//! // With no `max_tokens`, a call may write 4,096 tokens: $0.061 at $15 per million, more than
//! // a budget of $0.01. The call is not sent.
//! let tight = BudgetLayer::new(price).per_run(Cost::from_dollars(0.01));
//! let agent = Agent::new(tight.layer(ScriptedModel::new([])), ToolSet::new());
//! let res = agent.oneshot(AgentRequest::new(Session::new(), "hi")).await?;
//! assert!(matches!(res.outcome, Outcome::Stopped { reason: StopReason::Budget { .. }, .. }));
//! # Ok(())
//! # }
//! ```
//!
//! [`Provider::price`]: https://docs.rs/tower-agent-providers/latest/tower_agent_providers/struct.Provider.html#method.price

mod ledger;
#[cfg(feature = "budget-postgres")]
mod postgres;
mod service;
mod window;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use tower_agent_core::{Cost, ExtensionKey, ModelPrice, RunContext, Session, StateKey};
use tower_layer::Layer;

pub use ledger::Budget;
#[cfg(feature = "budget-postgres")]
pub use postgres::PostgresSpend;
pub use service::{Budgeted, ResponseFuture};
pub use window::{Hold, InMemorySpend, Period, SpendStore, SpendWindow};

use crate::tokens::{RunningCount, TokenCounter};

#[cfg(doc)]
use tower_agent_core::{ModelResponse, StopReason};

/// Where the layer keeps what a session spent through it, in the session's state.
pub const STATE_KEY: StateKey<Cost> = StateKey::new("tower_agent.cost");

/// What `session` spent through budget layers, as its state says ([`STATE_KEY`]).
///
/// ```
/// use tower_agent_core::{Cost, Session};
/// use tower_agent_layers::budget::{STATE_KEY, session_cost};
///
/// let mut session = Session::new();
/// assert_eq!(session_cost(&session), Cost::ZERO);
/// session.state.insert(STATE_KEY.name().into(), serde_json::json!(1_500_000));
/// assert_eq!(session_cost(&session), Cost::from_dollars(0.0015));
/// ```
pub fn session_cost(session: &Session) -> Cost {
    STATE_KEY.get(&session.state)
}

type KeyFn = Arc<dyn Fn(&RunContext) -> Option<String> + Send + Sync>;

/// Applies [`Budgeted`]; see the [module docs](self).
#[derive(Clone)]
pub struct BudgetLayer {
    config: Arc<Config>,
}

pub(crate) struct Config {
    price: ModelPrice,
    run: Option<Cost>,
    session: Option<Cost>,
    keyed: Option<Keyed>,
    shared: Vec<(Arc<str>, Budget)>,
    windows: Vec<(SpendWindow, Arc<dyn SpendStore>)>,
    assume_output: u32,
    counter: Arc<dyn TokenCounter>,
    run_key: ExtensionKey<Budget>,
    session_key: ExtensionKey<Budget>,
    /// The run's count of its requests' prompts.
    counted: ExtensionKey<Arc<Mutex<RunningCount>>>,
}

struct Keyed {
    limit: Cost,
    key: KeyFn,
    budgets: Mutex<HashMap<String, Budget>>,
}

/// The default upper bound of a prompt's tokens: its UTF-8 bytes (no token is shorter).
fn bytes(text: &str) -> usize {
    text.len()
}

impl BudgetLayer {
    /// Calls priced at `price`, with no budget yet: the layer then only prices the calls and
    /// keeps the session's total ([`session_cost`]).
    pub fn new(price: ModelPrice) -> Self {
        Self {
            config: Arc::new(Config {
                price,
                run: None,
                session: None,
                keyed: None,
                shared: Vec::new(),
                windows: Vec::new(),
                assume_output: 4_096,
                counter: Arc::new(bytes),
                run_key: ExtensionKey::new(),
                session_key: ExtensionKey::new(),
                counted: ExtensionKey::new(),
            }),
        }
    }

    /// A new layer with `f` applied: a builder method never changes a layer in use, and the
    /// new layer starts with ledgers of its own (configure it before [`BudgetLayer::set_key`]).
    fn edit(self, f: impl FnOnce(&mut Config)) -> Self {
        let mut config = self.config.copy();
        f(&mut config);
        Self {
            config: Arc::new(config),
        }
    }

    /// At most `limit` per run (the agents nested in it included).
    pub fn per_run(self, limit: Cost) -> Self {
        self.edit(|c| c.run = Some(limit))
    }

    /// At most `limit` per session, over all its runs.
    pub fn per_session(self, limit: Cost) -> Self {
        self.edit(|c| c.session = Some(limit))
    }

    /// At most `limit` per key `key` reads from the outermost run's context (a tenant's id in
    /// its state); a run it gives no key is not limited by this scope. The layer keeps one
    /// ledger per key it has seen, for as long as it lives.
    pub fn per_key<F>(self, limit: Cost, key: F) -> Self
    where
        F: Fn(&RunContext) -> Option<String> + Send + Sync + 'static,
    {
        self.edit(|c| {
            c.keyed = Some(Keyed {
                limit,
                key: Arc::new(key),
                budgets: Mutex::new(HashMap::new()),
            })
        })
    }

    /// Spend from `budget` too, named `scope` in a stop's reason.
    pub fn shared(self, scope: impl Into<String>, budget: Budget) -> Self {
        let scope = scope.into();
        self.edit(|c| c.shared.push((scope.into(), budget)))
    }

    /// Spend from `window` too, kept in `store`: a tenant's day, month or conversation,
    /// shared by every process that spends from the same store (an [`InMemorySpend`] for one
    /// process, a `PostgresSpend` for many). The call's worst case is held in the store before
    /// it is sent, in one step (in Postgres, under the window row's lock), so concurrent runs
    /// anywhere never hold more than the limit between them; a stop names the window's key
    /// (`acme/day/2026-11-29`). A store that fails fails the call (nothing passes unchecked).
    ///
    /// ```
    /// use tower::{Layer, ServiceExt};
    /// use tower_agent_core::{AgentRequest, Cost, ModelPrice, ModelResponse, Outcome, Session, StopReason, Usage};
    /// use tower_agent_layers::budget::{BudgetLayer, InMemorySpend, SpendStore, SpendWindow};
    /// use tower_agent_loop::Agent;
    /// use tower_agent_test::ScriptedModel;
    /// use tower_agent_tools::ToolSet;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_agent_core::Error> {
    /// let store = InMemorySpend::new();
    /// let price = ModelPrice::per_million(3.0, 0.3, 15.0);
    /// // $0.01 a conversation; each call may write 100 tokens, 0.15 cents at most.
    /// let budget = BudgetLayer::new(price)
    ///     .assume_output_tokens(100)
    ///     .window(SpendWindow::conversation(Cost::from_dollars(0.01)), store.clone());
    /// let model = ScriptedModel::from_fn(|_| Ok(ModelResponse::text("Hi.").with_usage(Usage::new(1_000, 100))));
    /// let agent = Agent::new(budget.layer(model), ToolSet::new());
    /// let mut stopped = None;
    /// for _ in 0..10 {
    ///     let res = agent.clone().oneshot(AgentRequest::new(Session::with_id("chat-1"), "hi")).await?;
    ///     if let Outcome::Stopped { reason: StopReason::Budget { scope, .. }, .. } = res.outcome {
    ///         stopped = Some(scope);
    ///         break;
    ///     }
    /// }
    /// assert_eq!(stopped.as_deref(), Some("*/conversation/chat-1"));
    /// assert!(store.spent("*/conversation/chat-1").await? <= Cost::from_dollars(0.01));
    /// # Ok(())
    /// # }
    /// ```
    pub fn window(self, window: SpendWindow, store: impl SpendStore) -> Self {
        let store: Arc<dyn SpendStore> = Arc::new(store);
        self.edit(|c| c.windows.push((window, store)))
    }

    /// The completion tokens a request that sets no `max_tokens` is assumed to take at most
    /// (4,096 by default). The request is not changed: such a call may cost more than its
    /// reservation, and settles with what it cost.
    pub fn assume_output_tokens(self, tokens: u32) -> Self {
        self.edit(|c| c.assume_output = tokens)
    }

    /// Count the prompt's tokens with `counter` (by default, an upper bound: the text's UTF-8
    /// bytes). A closer estimate reserves less, and may reserve less than the call costs.
    pub fn counter(self, counter: impl TokenCounter) -> Self {
        self.edit(|c| c.counter = Arc::new(counter))
    }

    /// The per-key budget of `key`, when [`per_key`](Self::per_key) is set: to read what a
    /// tenant spent, or to restore it (`budget.with_spent(..)` is not needed: the layer makes
    /// it on the key's first call; replace it before with [`BudgetLayer::set_key`]).
    pub fn key_budget(&self, key: &str) -> Option<Budget> {
        let keyed = self.config.keyed.as_ref()?;
        Some(keyed.budget(key))
    }

    /// Use `budget` for `key` from now on (a tenant's ledger restored from a database).
    pub fn set_key(&self, key: impl Into<String>, budget: Budget) {
        if let Some(keyed) = &self.config.keyed {
            keyed
                .budgets
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key.into(), budget);
        }
    }
}

impl Keyed {
    fn budget(&self, key: &str) -> Budget {
        let mut budgets = self.budgets.lock().unwrap_or_else(PoisonError::into_inner);
        match budgets.get(key) {
            Some(budget) => budget.clone(),
            None => {
                let budget = Budget::new(self.limit);
                budgets.insert(key.to_owned(), budget.clone());
                budget
            }
        }
    }
}

impl Config {
    /// A copy for a builder method: the per-key ledgers and the extension keys are new (a
    /// reconfigured layer is another layer).
    fn copy(&self) -> Config {
        Config {
            price: self.price,
            run: self.run,
            session: self.session,
            keyed: self.keyed.as_ref().map(|k| Keyed {
                limit: k.limit,
                key: Arc::clone(&k.key),
                budgets: Mutex::new(HashMap::new()),
            }),
            shared: self.shared.clone(),
            windows: self.windows.clone(),
            assume_output: self.assume_output,
            counter: Arc::clone(&self.counter),
            run_key: ExtensionKey::new(),
            session_key: ExtensionKey::new(),
            counted: ExtensionKey::new(),
        }
    }

    /// The budgets a call of the run `ctx` spends from, each with its scope.
    fn budgets(&self, ctx: &RunContext) -> Vec<(Scope, Budget)> {
        let root = ctx.root();
        let mut budgets = Vec::with_capacity(2 + self.shared.len());
        if let Some(limit) = self.run {
            let run = root.extension_at_or_insert_with(&self.run_key, || Budget::new(limit));
            budgets.push((Scope::Run, run));
        }
        if let Some(limit) = self.session {
            let session = root.extension_at_or_insert_with(&self.session_key, || {
                Budget::new(limit).with_spent(root.get(&STATE_KEY))
            });
            budgets.push((Scope::Session, session));
        }
        if let Some(keyed) = &self.keyed {
            // The outermost run's: a sub-agent's or a summary's context has no state of its own
            // to read a tenant from.
            if let Some(key) = (keyed.key)(&root) {
                let budget = keyed.budget(&key);
                budgets.push((Scope::Key(key), budget));
            }
        }
        budgets.extend(
            self.shared
                .iter()
                .map(|(name, budget)| (Scope::Shared(Arc::clone(name)), budget.clone())),
        );
        budgets
    }
}

/// Which budget: named in a stop's reason (`run`, `session`, `key acme`, a shared one's name).
enum Scope {
    Run,
    Session,
    Key(String),
    Shared(Arc<str>),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Run => f.write_str("run"),
            Scope::Session => f.write_str("session"),
            Scope::Key(key) => write!(f, "key {key}"),
            Scope::Shared(name) => f.write_str(name),
        }
    }
}

impl fmt::Debug for BudgetLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        f.debug_struct("BudgetLayer")
            .field("price", &c.price)
            .field("run", &c.run)
            .field("session", &c.session)
            .field("per_key", &c.keyed.as_ref().map(|k| k.limit))
            .field("shared", &c.shared)
            .field("assume_output", &c.assume_output)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for BudgetLayer {
    type Service = Budgeted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Budgeted::from_config(inner, Arc::clone(&self.config))
    }
}

/// Cost budgets on the model, outside the fallback and the retry: one reservation per call,
/// however many attempts (a summary's and a repair's calls reserved too).
impl tower_agent_loop::Builtin for BudgetLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::ModelSlot;
        stacks.model(ModelSlot::Budget, self);
    }
}

#[cfg(test)]
mod tests;
