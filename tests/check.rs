//! The test kit's stack check on the full stack of built-ins, as a host app would run it on
//! its own: patching, call limits, summarization, retry, approval by interrupt, eviction.

use std::time::Duration;

use tower_agent::layers::approval::{ApprovalLayer, Gate};
use tower_agent::layers::evict::EvictLayer;
use tower_agent::layers::limits::{CallLimitsLayer, Limit};
use tower_agent::layers::retry::RetryPolicy;
use tower_agent::layers::summarize::{Keep, SummarizeLayer, Trigger};
use tower_agent::prelude::*;
use tower_agent::storage::InMemory;
use tower_agent_test::check::StackCheck;

#[tokio::test(flavor = "current_thread")]
async fn the_built_in_stack_keeps_every_invariant() {
    let report = StackCheck::new()
        .seed(7)
        .cases(200)
        .run(|model, tools| {
            Agent::builder()
                .max_rounds(8)
                .patch()
                .limits(CallLimitsLayer::new().tool_calls(Limit::per_run(6)))
                .summarize(
                    SummarizeLayer::in_stack()
                        .trigger(Trigger::messages(12))
                        .keep(Keep::messages(4)),
                )
                .retry(
                    RetryPolicy::new()
                        .max_attempts(3)
                        .jitter(Duration::ZERO)
                        .max_delay(Duration::ZERO),
                )
                .approval(
                    ApprovalLayer::builder()
                        .gate("write", Gate::new())
                        .build()
                        .expect("valid"),
                )
                .evict(EvictLayer::new(InMemory::new()).limit(1_000))
                .build(model, tools)
        })
        .await;
    println!("{report}");
    for (what, count) in [
        ("completed", report.completed),
        ("stopped", report.stopped),
        ("cancelled", report.cancelled),
        ("interrupted", report.interrupted),
        ("leftovers", report.leftovers),
        ("summaries", report.summaries),
        ("large results", report.large_results),
    ] {
        assert!(count > 0, "no {what}: {report}");
    }
}

/// Every built-in at once, in its canonical slot, with early tool starts: thousands of cases
/// of generated sessions, crashed leftovers, runs killed at random points (the case goes on
/// from what they saved), cancellations, interrupts decided at random, failures and resumes.
/// Besides the check's own invariants: a secret (an email address the redaction removes)
/// reaches no saved version, event or error; an input the guardrail trips on never stays; a
/// call answered in a saved version is never answered otherwise; no call runs twice; and a
/// saved version drawn at random from each case resumes. The check plays the store: it gives
/// each run the saver `.store(..)` would, and keeps every version.
#[tokio::test(flavor = "current_thread")]
async fn every_built_in_at_once_keeps_every_invariant() {
    use tower_agent::layers::budget::BudgetLayer;
    use tower_agent::layers::checkpoint::CheckpointLayer;
    use tower_agent::layers::clear::ClearToolResultsLayer;
    use tower_agent::layers::fallback::FallbackLayer;
    use tower_agent::layers::guardrail::{Guardrail, GuardrailLayer, Verdict};
    use tower_agent::layers::instructions::InstructionsLayer;
    use tower_agent::layers::memory::MemoryLayer;
    use tower_agent::layers::redact::{RedactLayer, Rules};
    use tower_agent::layers::select::ToolSelectLayer;
    use tower_agent::storage::{Storage, StoragePath};
    use tower_agent::{Cost, ModelPrice};

    const SECRET: &str = "ada.lovelace@example.com";
    let cases = std::env::var("CHECK_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    let files = InMemory::new();
    files
        .put(
            &StoragePath::parse("/memories/AGENTS.md").expect("a path"),
            "Prefer short answers.".into(),
        )
        .await
        .expect("stored");
    // Every other case runs its tool calls concurrently.
    let mut case = 0;
    let report = StackCheck::new()
        .seed(32)
        .cases(cases)
        .secret(SECRET)
        .trips_on("forbidden")
        .run(|model, tools| {
            case += 1;
            let builder = match case % 2 {
                0 => Agent::builder().concurrent_tools(4),
                _ => Agent::builder(),
            };
            let guardrail = GuardrailLayer::new().input(Guardrail::new(
                "no_forbidden",
                |text: String| async move {
                    match text.contains("forbidden") {
                        true => Verdict::trip("a forbidden request"),
                        false => Verdict::Pass,
                    }
                },
            ));
            let every = builder
                .max_rounds(8)
                .early_tool_start(true)
                .memory(MemoryLayer::from_storage(
                    files.clone(),
                    ["/memories/AGENTS.md"],
                ))
                .patch()
                .redact(RedactLayer::new(Rules::new().emails()))
                .guardrail(guardrail)
                .limits(
                    CallLimitsLayer::new()
                        .tool_calls(Limit::per_run(6))
                        .model_calls(Limit::per_session(60)),
                )
                .instructions(InstructionsLayer::new().text("Be careful."))
                .tool_select(ToolSelectLayer::by(|req| {
                    req.tools.iter().map(|spec| spec.name.clone()).collect()
                }))
                .summarize(
                    SummarizeLayer::in_stack()
                        .trigger(Trigger::messages(12))
                        .keep(Keep::messages(4)),
                )
                .clear_tool_results(ClearToolResultsLayer::new())
                .budget(
                    BudgetLayer::new(ModelPrice::per_million(1.0, 0.1, 2.0))
                        .per_session(Cost::from_nanodollars(2_000_000_000)),
                )
                .retry(
                    RetryPolicy::new()
                        .max_attempts(2)
                        .jitter(Duration::ZERO)
                        .max_delay(Duration::ZERO),
                )
                .fallback(FallbackLayer::new().to("second", model.clone()))
                .approval(
                    ApprovalLayer::builder()
                        .gate("write", Gate::new())
                        .build()
                        .expect("valid"),
                )
                .checkpoint(CheckpointLayer::interrupting().every(5))
                .evict(EvictLayer::new(InMemory::new()).limit(1_000));
            #[cfg(feature = "structured")]
            let every = every.structured(tower_agent::layers::structured::StructuredLayer::new());
            #[cfg(feature = "cache")]
            let every = every.tool_cache(tower_agent::layers::cache::ToolCacheLayer::new());
            every.build(model, tools)
        })
        .await;
    println!("{report}");
    for (what, count) in [
        ("completed", report.completed),
        ("stopped", report.stopped),
        ("cancelled", report.cancelled),
        ("interrupted", report.interrupted),
        ("killed", report.killed),
        ("tripped", report.tripped),
        ("leftovers", report.leftovers),
        ("summaries", report.summaries),
        ("large results", report.large_results),
        ("resumed versions", report.resumed_versions),
    ] {
        assert!(count > 0, "no {what}: {report}");
    }
}
