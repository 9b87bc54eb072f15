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
