//! The budget service: reserve, call, settle.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_agent_core::event::BoxFuture;
use tower_agent_core::{Cost, Error, ModelRequest, ModelResponse, RunContext, StopReason, Usage};
use tower_service::Service;

use super::ledger::Reservation;
use super::window::HoldGuard;
use super::{BudgetLayer, Config, STATE_KEY};
use std::sync::PoisonError;
use std::time::SystemTime;

/// Reserves each model call's worst case on its budgets before calling the inner service,
/// and settles with what it cost; see the [module docs](super).
///
/// `poll_ready` is the inner service's; the ready service goes into the call's future (a
/// clone stays for the next call), which calls it at most once.
#[derive(Clone)]
pub struct Budgeted<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> Budgeted<S> {
    /// Wrap `inner` with the configuration of `layer`.
    pub fn new(inner: S, layer: &BudgetLayer) -> Self {
        tower_layer::Layer::layer(layer, inner)
    }

    pub(super) fn from_config(inner: S, config: Arc<Config>) -> Self {
        Self { inner, config }
    }

    tower_agent_core::inner_service_accessors!();
}

impl<S: fmt::Debug> fmt::Debug for Budgeted<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budgeted")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> Service<ModelRequest> for Budgeted<S>
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = ModelResponse;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ModelRequest) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(run(Arc::clone(&self.config), inner, req))
    }
}

/// The response future of [`Budgeted`].
pub type ResponseFuture = BoxFuture<'static, Result<ModelResponse, Error>>;

/// Reserve on every budget (all or none), call, settle.
async fn run<S>(
    config: Arc<Config>,
    mut inner: S,
    req: ModelRequest,
) -> Result<ModelResponse, Error>
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error>,
{
    let ctx = req.ctx.clone();
    let asked = worst_case(&config, &req);
    let mut reservations: Vec<Reservation> = Vec::new();
    for (scope, budget) in config.budgets(&ctx) {
        match budget.reserve(asked) {
            Ok(reservation) => reservations.push(reservation),
            // The reservations taken so far are released as they drop.
            Err((spent, limit)) => {
                tracing::info!(%scope, %limit, %spent, %asked, "budget spent: call not sent");
                return Ok(ModelResponse::refuse(StopReason::Budget {
                    scope: scope.to_string(),
                    limit,
                    spent,
                    asked,
                }));
            }
        }
    }
    // The windows in their stores, after the budgets of this process: a call refused here
    // holds nothing anywhere.
    let (root, now) = (ctx.root(), SystemTime::now());
    let mut holds = Vec::new();
    for (window, store) in &config.windows {
        let Some(key) = window.key(&root, now) else {
            continue;
        };
        match store.reserve(&key, window.limit, asked).await? {
            Ok(hold) => holds.push(HoldGuard::new(Arc::clone(store), hold)),
            Err(taken) => {
                tracing::info!(window = %key, limit = %window.limit, spent = %taken, %asked, "spend window spent: call not sent");
                return Ok(ModelResponse::refuse(StopReason::Budget {
                    scope: key,
                    limit: window.limit,
                    spent: taken,
                    asked,
                }));
            }
        }
    }
    match inner.call(req).await {
        Ok(mut response) => {
            response.usage = priced(&config, response.usage);
            response.side_usage = priced(&config, response.side_usage);
            let actual = response.usage.cost + response.side_usage.cost;
            settle(&ctx, reservations, actual);
            for hold in holds {
                hold.settle(actual).await;
            }
            Ok(response)
        }
        Err(error) => {
            let usage = priced(&config, error.usage());
            settle(&ctx, reservations, usage.cost);
            for hold in holds {
                hold.settle(usage.cost).await;
            }
            Err(if usage.is_zero() {
                error
            } else {
                error.with_usage(usage)
            })
        }
    }
}

/// The most the call can cost: its prompt at the upper bound the counter gives, at the prompt
/// price, and its `max_tokens` (or the assumed ones) at the completion price. The prompt is
/// counted by what changed since the run's previous call (`tokens::RunningCount`).
pub(super) fn worst_case(config: &Config, req: &ModelRequest) -> Cost {
    let counted = req
        .ctx
        .extension_at_or_insert_with(&config.counted, Default::default);
    let prompt = counted
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .count(&*config.counter, req);
    let output = req.options.max_tokens.unwrap_or(config.assume_output);
    config.price.worst_case(prompt as u64, u64::from(output))
}

/// `usage` with its cost: the provider's, or at the layer's price.
fn priced(config: &Config, usage: Usage) -> Usage {
    if usage.cost.is_zero() && !usage.is_zero() {
        usage.with_cost(config.price.cost(&usage))
    } else {
        usage
    }
}

/// Settle every reservation with `actual`, and add it to the session's total.
fn settle(ctx: &RunContext, reservations: Vec<Reservation>, actual: Cost) {
    for reservation in reservations {
        reservation.settle(actual);
    }
    if !actual.is_zero() {
        ctx.root()
            .update_or_reset(&STATE_KEY, |spent| *spent += actual);
    }
}
