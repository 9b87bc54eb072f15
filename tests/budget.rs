//! Cost budgets reserved before dispatch, on whole agents: twenty concurrent sub-agents on a
//! budget for ten calls dispatch ten; a retried call reserves and settles once; an exhausted
//! budget ends the run with a typed stop and a valid, resumable history.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower_agent::layers::RetryLayer;

use serde_json::json;
use tower::ServiceExt;
use tower_agent::layers::budget::{Budget, BudgetLayer, session_cost};
use tower_agent::layers::retry::RetryPolicy;
use tower_agent::prelude::*;
use tower_agent::workflow::AgentTool;
use tower_agent::{Cost, ErrorKind, GenerationOptions, ModelPrice, StopReason, Usage};
use tower_agent_test::{ScriptedModel, assert_valid_history};

/// Prompt tokens free, $10 per million completion tokens: a call of `max_tokens` 100 that
/// writes 100 costs exactly $0.001, its worst case too.
const PRICE: ModelPrice = ModelPrice::per_million(0.0, 0.0, 10.0);
const CALL: Cost = Cost::from_nanodollars(1_000_000);

/// A model that answers after a while, counting the calls it got and how many were in flight
/// at once.
#[derive(Clone, Default)]
struct Counted {
    dispatched: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    most_in_flight: Arc<AtomicUsize>,
}

impl Counted {
    fn model(&self) -> tower::util::BoxCloneService<ModelRequest, ModelResponse, Error> {
        let this = self.clone();
        tower::util::BoxCloneService::new(tower::service_fn(move |_req: ModelRequest| {
            let this = this.clone();
            async move {
                this.dispatched.fetch_add(1, Ordering::SeqCst);
                let now = this.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                this.most_in_flight.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                this.in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok(ModelResponse::text("found it").with_usage(Usage::new(50, 100)))
            }
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_sub_agents_on_a_budget_for_ten_calls_dispatch_ten() {
    let counted = Counted::default();
    // The lead's run budget, shared by every sub-agent nested in it.
    let budget = BudgetLayer::new(PRICE).per_run(Cost::from_nanodollars(10 * CALL.nanodollars()));
    let researcher = Agent::builder()
        .options(GenerationOptions::new().max_tokens(100))
        .with(budget)
        .build(counted.model(), ToolSet::new());
    let tools = ToolSet::new().tool(AgentTool::new(
        "research",
        "Research a question.",
        researcher,
    ));
    let lead = Agent::builder().concurrent_tools(20).build(
        ScriptedModel::new([
            ModelResponse::tool_calls((0..20).map(|i| {
                ToolCall::new(
                    format!("c{i}"),
                    "research",
                    json!({ "task": format!("question {i}") }),
                )
            })),
            ModelResponse::text("done"),
        ]),
        tools,
    );
    let res = lead
        .oneshot(AgentRequest::new(Session::new(), "research twenty things"))
        .await
        .expect("the lead completes");

    assert_eq!(
        counted.dispatched.load(Ordering::SeqCst),
        10,
        "never more than the budget allows"
    );
    assert!(
        counted.most_in_flight.load(Ordering::SeqCst) >= 2,
        "the sub-agents ran side by side"
    );
    let results: Vec<bool> = res
        .session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .map(|r| r.is_error)
        .collect();
    assert_eq!(results.len(), 20);
    assert_eq!(
        results.iter().filter(|e| !**e).count(),
        10,
        "ten answered, ten stopped"
    );
    assert_valid_history(&res.session.history);
    // What the sub-agents spent is in the lead's usage and its session's total.
    assert_eq!(
        res.usage.cost,
        Cost::from_nanodollars(10 * CALL.nanodollars())
    );
    assert_eq!(session_cost(&res.session), res.usage.cost);
}

#[tokio::test(start_paused = true)]
async fn a_retried_call_reserves_once_and_settles_once() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let model = {
        let attempts = Arc::clone(&attempts);
        ScriptedModel::from_fn(move |_| {
            if attempts.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(Error::new(
                    ErrorKind::RateLimited { retry_after: None },
                    "slow down",
                ))
            } else {
                Ok(ModelResponse::text("ok").with_usage(Usage::new(0, 100)))
            }
        })
    };
    let team = Budget::new(Cost::from_dollars(1.0));
    let agent = Agent::builder()
        .options(GenerationOptions::new().max_tokens(100))
        .with(BudgetLayer::new(PRICE).shared("team", team.clone()))
        .with(RetryLayer::new(RetryPolicy::new()))
        .build(model, ToolSet::new());
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "hi"))
        .await
        .expect("completes after two 429s");
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    assert_eq!((team.spent(), team.reserved()), (CALL, Cost::ZERO));
    assert_eq!(res.usage.cost, CALL);
}

#[tokio::test]
async fn an_exhausted_budget_stops_the_run_with_a_valid_history_that_resumes() {
    let team = Budget::new(Cost::from_nanodollars(CALL.nanodollars() * 3 / 2));
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "clock", json!({}))])
            .with_usage(Usage::new(0, 100)),
        ModelResponse::text("It is noon.").with_usage(Usage::new(0, 100)),
    ]);
    let build = |team: Budget| {
        Agent::builder()
            .options(GenerationOptions::new().max_tokens(100))
            .with(BudgetLayer::new(PRICE).shared("team", team))
            .build(
                model.clone(),
                ToolSet::new().tool(tower_agent_test::StubTool::returning("clock", "12:00")),
            )
    };
    let res = build(team.clone())
        .oneshot(AgentRequest::new(Session::new(), "what time is it?"))
        .await
        .expect("a stopped run is a response");
    let Outcome::Stopped {
        reason:
            StopReason::Budget {
                scope,
                limit,
                spent,
                asked,
            },
        ..
    } = &res.outcome
    else {
        panic!("expected a budget stop, got {:?}", res.outcome)
    };
    assert_eq!(
        (scope.as_str(), *limit, *spent, *asked),
        ("team", team.limit(), CALL, CALL)
    );
    assert_eq!(model.request_count(), 1, "the second call was not sent");
    assert_valid_history(&res.session.history);
    assert_eq!(res.session.history.len(), 3, "input, the call, its result");

    // More budget: the same session goes on.
    let res = build(Budget::new(Cost::from_dollars(1.0)))
        .oneshot(AgentRequest::new(res.session, Vec::<Message>::new()))
        .await
        .expect("resumes");
    assert!(
        matches!(res.outcome, Outcome::Completed { .. }),
        "{:?}",
        res.outcome
    );
    assert_eq!(res.text().as_deref(), Some("It is noon."));
    assert_eq!(
        session_cost(&res.session),
        Cost::from_nanodollars(2 * CALL.nanodollars())
    );
}
