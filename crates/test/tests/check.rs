//! The stack check on the bare agent (it passes, and goes through every kind of run), and on
//! two broken stacks (it finds each, with a seed that replays it).

use tower::ServiceBuilder;
use tower_agent_core::{
    AgentRequest, AgentResponse, Error, ModelRequest, ModelResponse, Role, after_agent,
    around_model,
};
use tower_agent_loop::Agent;
use tower_agent_test::check::{CheckModel, CheckTools, Report, StackCheck};

#[tokio::test(flavor = "current_thread")]
async fn the_bare_agent_keeps_every_invariant() {
    let report = StackCheck::new()
        .seed(1)
        .cases(200)
        .run(|model, tools| Agent::builder().max_rounds(6).build(model, tools))
        .await;
    println!("{report}");
    assert_eq!(report.cases, 200);
    assert!(report.runs > 400, "{report}");
    for (what, count) in [
        ("completed", report.completed),
        ("stopped", report.stopped),
        ("cancelled", report.cancelled),
        ("failed", report.failed),
        ("leftovers", report.leftovers),
        ("tool calls", report.tool_calls),
        ("large results", report.large_results),
    ] {
        assert!(count > 0, "no {what}: {report}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_same_seed_runs_the_same_cases() {
    let run = || async {
        StackCheck::new()
            .seed(42)
            .cases(50)
            .run(|model, tools| Agent::builder().max_rounds(6).build(model, tools))
            .await
    };
    let (first, second): (Report, Report) = (run().await, run().await);
    assert_eq!(first, second);
}

#[tokio::test(flavor = "current_thread")]
#[should_panic(expected = "is neither in the history nor in a summary")]
async fn a_layer_that_drops_what_the_user_said_is_found() {
    // A "compaction" that commits the history without its first user message, and no summary.
    let forgetful = around_model(|req: ModelRequest, mut next| async move {
        let mut history = req.messages.clone().into_vec();
        let mut res: ModelResponse = next.run(req).await?;
        if let Some(first) = history.iter().position(|m| m.role == Role::User) {
            if history.len() > 6 {
                history.remove(first);
                res.commit(history.into());
            }
        }
        Ok(res)
    });
    StackCheck::new()
        .seed(3)
        .run(|model, tools| {
            let model = ServiceBuilder::new().layer(forgetful).service(model);
            Agent::builder().max_rounds(6).build(model, tools)
        })
        .await;
}

/// The bare agent, and after it a layer that drops the session's last tool result.
fn lossy(
    model: CheckModel,
    tools: CheckTools,
) -> impl tower::Service<AgentRequest, Response = AgentResponse, Error = Error> {
    let lossy = after_agent(|mut res: AgentResponse, _ctx| async move {
        if let Some(at) = res
            .session
            .history
            .iter()
            .rposition(|m| m.role == Role::Tool)
        {
            let mut history = res.session.history.clone().into_vec();
            history.remove(at);
            res.session.history = history.into();
        }
        Ok::<_, Error>(res)
    });
    ServiceBuilder::new()
        .layer(lossy)
        .service(Agent::builder().max_rounds(6).build(model, tools))
}

#[tokio::test(flavor = "current_thread")]
#[should_panic(expected = "replay it alone with TOWER_AGENT_CHECK_SEED=0x")]
async fn a_layer_that_breaks_the_pairs_is_found_with_its_seed() {
    StackCheck::new().seed(4).run(lossy).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_printed_seed_replays_its_case() {
    use futures_util::FutureExt;
    use std::panic::AssertUnwindSafe;

    let broken = |check: StackCheck| check.run(lossy);
    let message = |panic: Box<dyn std::any::Any + Send>| -> String {
        panic
            .downcast_ref::<String>()
            .cloned()
            .expect("a formatted panic message")
    };
    let first = AssertUnwindSafe(broken(StackCheck::new().seed(5)))
        .catch_unwind()
        .await
        .map(|report| report.to_string())
        .expect_err("the check fails");
    let first = message(first);
    let seed = first
        .split("TOWER_AGENT_CHECK_SEED=0x")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .expect("the seed is printed");
    let again = AssertUnwindSafe(broken(StackCheck::new().replay(seed)))
        .catch_unwind()
        .await
        .map(|report| report.to_string())
        .expect_err("the replay fails too");
    let again = message(again);
    // The same violation on the same session, as the only case run.
    let tail = |text: &str| text.split_once('\n').map(|(_, rest)| rest.to_owned());
    assert_eq!(first.lines().next(), again.lines().next());
    assert!(again.contains("case 1 of 1"), "{again}");
    assert_eq!(
        tail(&first).and_then(|t| tail(&t)),
        tail(&again).and_then(|t| tail(&t))
    );
}
