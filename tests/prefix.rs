//! Cache-bust attribution: when the request at the provider no longer starts with the run's
//! previous one, `PrefixMoved` names who moved it. One test per built-in that may edit the
//! prefix, one for the session, and the canonical stack over many rounds moving nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use tower_agent::layers::PatchDanglingLayer;
use tower_agent::layers::RetryLayer;
use tower_agent::layers::approval::ApprovalLayer;
use tower_agent::layers::clear::ClearToolResultsLayer;
use tower_agent::layers::evict::EvictLayer;
use tower_agent::layers::instructions::InstructionsLayer;
use tower_agent::layers::limits::{CallLimitsLayer, Limit};
use tower_agent::layers::redact::{RedactLayer, Rules};
use tower_agent::layers::retry::RetryPolicy;
use tower_agent::layers::select::ToolSelectLayer;
use tower_agent::layers::summarize::{Keep, SummarizeLayer, Trigger};
use tower_agent::prelude::*;
use tower_agent::sessions::{InMemorySessions, StoreLayer};
use tower_agent::storage::InMemory;
use tower_agent::{AgentBuilder, Builtins, PrefixMoved, around_model};
use tower_agent_test::{EventRecorder, ScriptedModel, StubTool};

/// A model that looks something up for `rounds` rounds, then answers.
fn looking(rounds: u32) -> ScriptedModel {
    ScriptedModel::from_fn(move |req| {
        let n = req.ctx.round();
        Ok(match n <= rounds {
            true => {
                ModelResponse::tool_calls([ToolCall::new(format!("c{n}"), "look", json!({"q": n}))])
            }
            false => ModelResponse::text("done"),
        })
    })
}

fn tools() -> ToolSet {
    ToolSet::new()
        .tool(StubTool::returning(
            "look",
            "a view of ada@example.com ".repeat(20),
        ))
        .tool(StubTool::returning("other", "other"))
}

/// Run `agent` for a few rounds, observed; the prefix moves it reported.
async fn moves(agent: Builtins, rounds: u32) -> Vec<PrefixMoved> {
    let model = looking(rounds);
    let agent = agent.build(model, tools());
    let recorder = EventRecorder::new();
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "Look around.").with_observer(recorder.clone()))
        .await
        .expect("the run");
    assert!(
        matches!(res.outcome, Outcome::Completed { .. }),
        "{:?}",
        res.outcome
    );
    recorder
        .events()
        .into_iter()
        .filter_map(|event| event.downcast_ref::<PrefixMoved>().cloned())
        .collect()
}

fn builder() -> AgentBuilder {
    Agent::builder().tool_specs(tools().specs())
}

fn by(moves: &[PrefixMoved]) -> Vec<(&'static str, &'static str)> {
    moves.iter().map(|m| (m.by, m.what)).collect()
}

#[tokio::test]
async fn the_canonical_stack_over_many_rounds_moves_nothing() {
    let agent = builder()
        .with(StoreLayer::new(InMemorySessions::new()))
        .with(RedactLayer::new(Rules::new().emails()))
        .with(PatchDanglingLayer::new())
        .with(CallLimitsLayer::new().model_calls(Limit::per_run(20)))
        .with(ApprovalLayer::builder().build().expect("valid"))
        .with(EvictLayer::new(InMemory::new()))
        .with(InstructionsLayer::new().text("Be brief."))
        .with(RetryLayer::new(RetryPolicy::new()))
        .with(ClearToolResultsLayer::new())
        .model_layer(around_model(|req: ModelRequest, mut next| async move {
            next.run(req).await
        }));
    assert_eq!(moves(agent, 8).await, [], "nothing moved the prefix");
}

#[tokio::test]
async fn summarization_moves_the_messages() {
    let summarizer = ScriptedModel::from_fn(|_| Ok(ModelResponse::text("the gist")));
    let agent = builder().with(
        SummarizeLayer::new(summarizer)
            .trigger(Trigger::messages(6))
            .keep(Keep::messages(2)),
    );
    let moves = moves(agent, 5).await;
    assert!(!moves.is_empty(), "a summary moves the prefix");
    assert!(
        moves
            .iter()
            .all(|m| (m.by, m.what) == ("summarize", "messages")),
        "{moves:?}"
    );
    assert!(
        moves[0].lost_tokens > 0 && moves[0].kept_messages < 6,
        "{moves:?}"
    );
}

#[tokio::test]
async fn clearing_moves_the_messages() {
    let agent = builder().with(ClearToolResultsLayer::new().trigger(0).keep(1).batch(1));
    let moves = moves(agent, 4).await;
    assert!(!moves.is_empty());
    assert!(
        moves
            .iter()
            .all(|m| (m.by, m.what) == ("clear", "messages")),
        "{moves:?}"
    );
    // Each cleared result was about 130 tokens the provider had cached.
    assert!(moves.iter().all(|m| m.lost_tokens >= 100), "{moves:?}");
}

#[tokio::test]
async fn batched_clearing_moves_the_prefix_once_per_batch() {
    let agent = builder().with(ClearToolResultsLayer::new().trigger(0).keep(1).batch(3));
    let moves = moves(agent, 7).await;
    assert_eq!(
        by(&moves),
        [("clear", "messages"), ("clear", "messages")],
        "{moves:?}"
    );
}

#[tokio::test]
async fn a_tool_selection_that_changes_moves_the_tools() {
    let agent = builder().with(ToolSelectLayer::by(|req: &ModelRequest| {
        match req.ctx.round() {
            1 => vec!["look".into()],
            _ => vec!["look".into(), "other".into()],
        }
    }));
    assert_eq!(by(&moves(agent, 3).await), [("select", "tools")]);
}

#[tokio::test]
async fn a_dynamic_instruction_that_changes_moves_the_system_prompt() {
    let agent = builder().with(
        InstructionsLayer::new()
            .text("Be brief.")
            .with(|req: &ModelRequest| Some(format!("This is round {}.", req.ctx.round()))),
    );
    let moves = moves(agent, 2).await;
    assert_eq!(
        by(&moves),
        [("instructions", "system"), ("instructions", "system")]
    );
    assert_eq!(moves[0].round, 2);
}

#[tokio::test]
async fn a_host_layer_that_edits_an_old_message_is_named() {
    let agent = builder().model_layer(around_model(|mut req: ModelRequest, mut next| async move {
        // Stamps the first message with the round: the oldest message changes every call.
        if req.ctx.round() > 1 {
            let round = req.ctx.round();
            req.messages.tail_mut(0)[0] = Message::user(format!("Look around ({round})."));
        }
        next.run(req).await
    }));
    let moves = moves(agent, 3).await;
    assert_eq!(
        by(&moves),
        [
            ("model_layer", "messages"),
            ("model_layer", "messages"),
            ("model_layer", "messages")
        ]
    );
    assert_eq!(moves[1].kept_messages, 0);
}

#[tokio::test]
async fn a_committed_edit_of_the_session_is_named_the_session() {
    let edited = Arc::new(AtomicUsize::new(0));
    let seen = edited.clone();
    // A layer that, at the second call, commits a history whose first message is rewritten
    // (it sends the request unchanged): the next call's history moved before the stack.
    let agent = builder()
        .with(RetryLayer::new(RetryPolicy::new()))
        .model_layer(around_model(move |req: ModelRequest, mut next| {
            let seen = seen.clone();
            async move {
                let mut history = req.messages.clone();
                let mut res = next.run(req).await?;
                if seen.fetch_add(1, Ordering::SeqCst) == 1 {
                    history.tail_mut(0)[0] = Message::user("Look around, please.");
                    res.commit(history);
                }
                Ok(res)
            }
        }));
    assert_eq!(by(&moves(agent, 3).await), [("session", "messages")]);
    assert_eq!(edited.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn after_a_summary_a_clearing_is_named_clear_not_the_session() {
    // The summarizer commits its history: the agent's next request starts otherwise than the
    // one before it did, though the provider's does not. A clearing after that is the clear
    // layer's, not the session's.
    let summarizer = ScriptedModel::from_fn(|_| Ok(ModelResponse::text("the gist")));
    let agent = builder()
        .with(
            SummarizeLayer::new(summarizer)
                .trigger(Trigger::messages(8))
                .keep(Keep::messages(4)),
        )
        .with(ClearToolResultsLayer::new().trigger(0).keep(1).batch(1));
    let moves = moves(agent, 8).await;
    let names: Vec<&str> = moves.iter().map(|m| m.by).collect();
    assert!(names.contains(&"summarize"), "{moves:?}");
    assert!(names.contains(&"clear"), "{moves:?}");
    assert!(!names.contains(&"session"), "{moves:?}");
}
