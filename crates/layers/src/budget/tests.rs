use std::time::Duration;

use tower::ServiceExt;
use tower_agent_core::{
    ErrorKind, GenerationOptions, Message, ModelRequest, ModelResponse, RunContext, StopReason,
    Usage,
};
use tower_agent_test::ScriptedModel;

use super::service::worst_case;
use super::*;

/// $1 per million prompt tokens, $10 per million completion tokens.
const PRICE: ModelPrice = ModelPrice::per_million(1.0, 0.1, 10.0);

fn request(ctx: &RunContext, max_tokens: u32) -> ModelRequest {
    let mut req = ModelRequest::new(vec![Message::user("hi")]);
    req.options = GenerationOptions::new().max_tokens(max_tokens).into();
    req.ctx = ctx.clone();
    req
}

async fn call(
    layer: &BudgetLayer,
    model: ScriptedModel,
    req: ModelRequest,
) -> Result<ModelResponse, tower_agent_core::Error> {
    layer.layer(model).oneshot(req).await
}

fn stop_of(res: &ModelResponse) -> Option<&StopReason> {
    res.stop.as_ref()
}

#[tokio::test]
async fn a_call_reserves_its_worst_case_and_settles_with_what_it_cost() {
    let budget = Budget::new(Cost::from_dollars(1.0));
    let layer = BudgetLayer::new(PRICE).shared("team", budget.clone());
    let ctx = RunContext::new();
    // Worst case: "hi" (2 bytes) + the message's framing at $1/M, 1,000 tokens at $10/M.
    let req = request(&ctx, 1_000);
    let asked = worst_case(&layer.config, &req);
    assert!(asked >= Cost::from_dollars(0.01), "{asked}");
    let seen = budget.clone();
    let watching = ScriptedModel::from_fn(move |_| {
        assert_eq!(seen.reserved(), asked, "reserved while in flight");
        Ok(ModelResponse::text("ok").with_usage(Usage::new(10, 100)))
    });
    let res = call(&layer, watching, req).await.expect("ok");
    let cost = Cost::from_dollars((10.0 * 1.0 + 100.0 * 10.0) / 1e6);
    assert_eq!(res.usage.cost, cost, "priced at the layer's price");
    assert_eq!((budget.spent(), budget.reserved()), (cost, Cost::ZERO));
    assert_eq!(ctx.get(&STATE_KEY), cost, "the session's total");
}

#[tokio::test]
async fn a_provider_priced_usage_is_settled_as_it_came() {
    let budget = Budget::new(Cost::from_dollars(1.0));
    let layer = BudgetLayer::new(PRICE).shared("team", budget.clone());
    let priced = Usage::new(10, 100).with_cost(Cost::from_dollars(0.5));
    let model = ScriptedModel::from_fn(move |_| Ok(ModelResponse::text("ok").with_usage(priced)));
    let res = call(&layer, model, request(&RunContext::new(), 10))
        .await
        .expect("ok");
    assert_eq!(res.usage.cost, Cost::from_dollars(0.5));
    assert_eq!(budget.spent(), Cost::from_dollars(0.5));
}

#[tokio::test]
async fn a_call_that_does_not_fit_is_not_sent_and_says_which_budget() {
    let layer = BudgetLayer::new(PRICE)
        .per_run(Cost::from_dollars(1.0))
        .shared("team", Budget::new(Cost::from_dollars(0.005)));
    let model = ScriptedModel::new([]);
    let ctx = RunContext::new();
    let res = call(&layer, model.clone(), request(&ctx, 1_000))
        .await
        .expect("a stop");
    let Some(StopReason::Budget {
        scope,
        limit,
        spent,
        asked,
    }) = stop_of(&res)
    else {
        panic!("expected a budget stop: {res:?}")
    };
    assert_eq!(
        (scope.as_str(), *limit, *spent),
        ("team", Cost::from_dollars(0.005), Cost::ZERO)
    );
    assert!(*asked > Cost::from_dollars(0.01));
    assert_eq!(model.request_count(), 0, "not sent");
    let run = ctx
        .root()
        .extension_at(&layer.config.run_key)
        .expect("the run's ledger");
    assert_eq!(
        run.reserved(),
        Cost::ZERO,
        "the run's reservation was released"
    );
}

#[tokio::test]
async fn a_failed_call_settles_what_its_error_reports_and_releases_the_rest() {
    let budget = Budget::new(Cost::from_dollars(1.0));
    let layer = BudgetLayer::new(PRICE).shared("team", budget.clone());
    let model = ScriptedModel::from_fn(|_| {
        Err(
            tower_agent_core::Error::new(ErrorKind::Server, "broken stream")
                .with_usage(Usage::new(0, 50)),
        )
    });
    let err = call(&layer, model, request(&RunContext::new(), 1_000))
        .await
        .unwrap_err();
    let cost = Cost::from_dollars(50.0 * 10.0 / 1e6);
    assert_eq!(err.usage().cost, cost);
    assert_eq!((budget.spent(), budget.reserved()), (cost, Cost::ZERO));
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_midway_releases_its_reservation() {
    let budget = Budget::new(Cost::from_dollars(1.0));
    let layer = BudgetLayer::new(PRICE).shared("team", budget.clone());
    let slow = tower::service_fn(|_req: ModelRequest| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, tower_agent_core::Error>(ModelResponse::text("late"))
    });
    let call = layer
        .layer(slow)
        .oneshot(request(&RunContext::new(), 1_000));
    let timed_out = tokio::time::timeout(Duration::from_secs(1), call).await;
    assert!(timed_out.is_err());
    assert_eq!(
        (budget.spent(), budget.reserved()),
        (Cost::ZERO, Cost::ZERO)
    );
}

#[tokio::test]
async fn nested_runs_and_side_calls_spend_from_the_runs_budget() {
    let layer = BudgetLayer::new(PRICE).per_run(Cost::from_dollars(1.0));
    let run = RunContext::new();
    let model = || {
        ScriptedModel::from_fn(|_| Ok(ModelResponse::text("ok").with_usage(Usage::new(0, 1_000))))
    };
    for ctx in [
        run.clone(),
        run.nested("sub"),
        run.nested("sub").side_call(),
    ] {
        call(&layer, model(), request(&ctx, 10)).await.expect("ok");
    }
    let ledger = run
        .extension_at(&layer.config.run_key)
        .expect("one ledger, on the run");
    assert_eq!(ledger.spent(), Cost::from_dollars(0.03));
    assert_eq!(run.get(&STATE_KEY), Cost::from_dollars(0.03));
    // Another run has a ledger of its own.
    let other = RunContext::new();
    call(&layer, model(), request(&other, 10))
        .await
        .expect("ok");
    assert_eq!(ledger.spent(), Cost::from_dollars(0.03));
}

#[tokio::test]
async fn a_session_budget_starts_from_what_the_session_spent() {
    let layer = BudgetLayer::new(PRICE).per_session(Cost::from_dollars(0.02));
    let ctx = RunContext::new();
    ctx.update_or_reset(&STATE_KEY, |spent| *spent = Cost::from_dollars(0.015));
    let model = ScriptedModel::new([]);
    // Asks about $0.01: 0.015 + 0.01 > 0.02.
    let res = call(&layer, model.clone(), request(&ctx, 1_000))
        .await
        .expect("a stop");
    assert!(
        matches!(stop_of(&res), Some(StopReason::Budget { scope, spent, .. }) if scope == "session" && *spent == Cost::from_dollars(0.015)),
        "{res:?}"
    );
    assert_eq!(model.request_count(), 0);
}

#[tokio::test]
async fn keys_have_ledgers_of_their_own_and_a_run_without_one_is_not_limited() {
    let layer = BudgetLayer::new(PRICE).per_key(Cost::from_dollars(0.015), |ctx: &RunContext| {
        ctx.state::<String>("tenant")
    });
    let tenant = |name: &str| {
        let ctx = RunContext::new();
        ctx.set_state("tenant", name);
        ctx
    };
    let model = || {
        ScriptedModel::from_fn(|_| Ok(ModelResponse::text("ok").with_usage(Usage::new(0, 1_000))))
    };
    // $0.01 each once settled; the second call of a tenant asks about $0.01 on $0.005 left.
    let acme = tenant("acme");
    assert!(
        call(&layer, model(), request(&acme, 1_000))
            .await
            .expect("ok")
            .stop
            .is_none()
    );
    let second = call(&layer, model(), request(&tenant("acme"), 1_000))
        .await
        .expect("a stop");
    assert!(
        matches!(stop_of(&second), Some(StopReason::Budget { scope, .. }) if scope == "key acme")
    );
    assert!(
        call(&layer, model(), request(&tenant("globex"), 1_000))
            .await
            .expect("ok")
            .stop
            .is_none()
    );
    assert!(
        call(&layer, model(), request(&RunContext::new(), 1_000))
            .await
            .expect("ok")
            .stop
            .is_none()
    );
    assert_eq!(
        layer.key_budget("acme").map(|b| b.spent()),
        Some(Cost::from_dollars(0.01))
    );
    layer.set_key("acme", Budget::new(Cost::from_dollars(1.0)));
    assert!(
        call(&layer, model(), request(&acme, 1_000))
            .await
            .expect("ok")
            .stop
            .is_none()
    );
}

#[test]
fn debug_shows_prices_and_limits() {
    let layer = BudgetLayer::new(PRICE).per_run(Cost::from_dollars(1.0));
    let debug = format!("{layer:?}");
    assert!(debug.contains("run: Some(Cost(1000000000))"), "{debug}");
}

#[tokio::test]
async fn a_keys_sub_agents_and_side_calls_spend_from_the_keys_budget() {
    let layer = BudgetLayer::new(PRICE).per_key(Cost::from_dollars(0.015), |ctx: &RunContext| {
        ctx.state::<String>("tenant")
    });
    let run = RunContext::new();
    run.set_state("tenant", "acme");
    let model = || {
        ScriptedModel::from_fn(|_| Ok(ModelResponse::text("ok").with_usage(Usage::new(0, 1_000))))
    };
    assert!(
        call(&layer, model(), request(&run, 1_000))
            .await
            .expect("ok")
            .stop
            .is_none()
    );
    // A sub-agent's and a summary's contexts have no state of their own: the key is the run's.
    for ctx in [run.nested("sub"), run.side_call()] {
        let res = call(&layer, model(), request(&ctx, 1_000))
            .await
            .expect("a stop");
        assert!(
            matches!(stop_of(&res), Some(StopReason::Budget { scope, .. }) if scope == "key acme"),
            "{res:?}"
        );
    }
}

#[test]
fn concurrent_reservations_never_pass_the_limit() {
    let budget = Budget::new(Cost::from_nanodollars(10));
    let barrier = std::sync::Barrier::new(8);
    let taken = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                barrier.wait();
                let mut held = Vec::new();
                for _ in 0..100 {
                    if let Ok(reservation) = budget.reserve(Cost::from_nanodollars(1)) {
                        held.push(reservation);
                    }
                }
                taken.fetch_add(held.len(), std::sync::atomic::Ordering::SeqCst);
                barrier.wait();
                for reservation in held {
                    reservation.settle(Cost::from_nanodollars(1));
                }
            });
        }
    });
    assert_eq!(
        taken.into_inner(),
        10,
        "ten reservations of one in ten, across eight threads"
    );
    assert_eq!(
        (budget.spent(), budget.reserved()),
        (Cost::from_nanodollars(10), Cost::ZERO)
    );
}

#[test]
fn a_builder_method_makes_a_new_layer_with_ledgers_of_its_own() {
    let layer = BudgetLayer::new(PRICE).per_key(Cost::from_dollars(1.0), |_: &RunContext| None);
    layer.set_key("acme", Budget::new(Cost::from_dollars(5.0)));
    let reconfigured = layer.clone().assume_output_tokens(100);
    assert_eq!(
        layer.key_budget("acme").map(|b| b.limit()),
        Some(Cost::from_dollars(5.0))
    );
    assert_eq!(
        reconfigured.key_budget("acme").map(|b| b.limit()),
        Some(Cost::from_dollars(1.0))
    );
}

#[test]
fn a_runs_growing_history_is_reserved_as_a_fresh_count_would() {
    let layer = BudgetLayer::new(PRICE);
    let ctx = RunContext::new();
    let mut req = request(&ctx, 100);
    req.system = Some("Be brief.".into());
    for round in 0..5 {
        let fresh = {
            let mut alone = req.clone();
            alone.ctx = RunContext::new();
            worst_case(&layer.config, &alone)
        };
        assert_eq!(worst_case(&layer.config, &req), fresh, "round {round}");
        req.messages
            .push(Message::assistant(format!("answer {round}")));
        req.messages.push(Message::user(format!(
            "question {round} {}",
            "words ".repeat(round)
        )));
    }
    // A history the run did not grow (a summary replaced it) is counted whole.
    let mut shorter = request(&ctx, 100);
    shorter.system = req.system.clone();
    let mut alone = shorter.clone();
    alone.ctx = RunContext::new();
    assert_eq!(
        worst_case(&layer.config, &shorter),
        worst_case(&layer.config, &alone)
    );
}
