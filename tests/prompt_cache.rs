//! Prompt caching planned across the stack: a 50-round session with a system prompt, memory,
//! static instructions and summarization, sent as the Anthropic provider would send it to a
//! server that prices it as Anthropic's prompt cache does (`benches/common/prompt_cache.rs`).

use tower_agent::ModelRequest;
use tower_agent::layers::summarize::is_summary;
use tower_agent::providers::anthropic::CacheTtl;

#[path = "../benches/common/prompt_cache.rs"]
mod prompt_cache;

use prompt_cache::{Summaries, session, static_instructions};

#[tokio::test]
async fn nine_tenths_of_the_input_is_read_from_the_cache_after_the_first_round() {
    let (tally, calls, history) = session(
        Some(CacheTtl::FiveMinutes),
        static_instructions(),
        Summaries::InStack,
    )
    .await;
    // The session was summarized on the way: its first message is the summary now.
    assert!(history.iter().any(is_summary), "summarized");
    println!(
        "{} calls after the first: {} input tokens, {} cached ({:.1}%)",
        tally.calls,
        tally.input,
        tally.cached,
        tally.ratio() * 100.0
    );
    assert!(tally.ratio() >= 0.90, "{tally:?}");
    // Every call after the first reads at least the system prompt from the cache.
    assert!(
        calls.iter().skip(1).all(|call| call.cached > 0),
        "{calls:?}"
    );
}

#[tokio::test]
async fn without_markers_nothing_is_cached() {
    let (tally, ..) = session(None, static_instructions(), Summaries::InStack).await;
    assert_eq!(tally.cached, 0);
}

#[tokio::test]
async fn a_block_that_changes_every_call_leaves_only_the_prefix_before_it_cached() {
    let instructions = static_instructions()
        .with(|req: &ModelRequest| Some(format!("Round {}.", req.ctx.round())));
    let (tally, calls, _) = session(
        Some(CacheTtl::FiveMinutes),
        instructions,
        Summaries::InStack,
    )
    .await;
    // The system prompt up to the round's line is read from the cache; the history never.
    assert!(
        calls.iter().skip(1).all(|call| call.cached > 0),
        "{calls:?}"
    );
    assert!(tally.ratio() < 0.5, "{tally:?}");
}

#[tokio::test]
async fn a_summary_asked_in_the_stack_reads_the_sessions_prefix_from_the_cache() {
    let (_, calls, history) = session(
        Some(CacheTtl::FiveMinutes),
        static_instructions(),
        Summaries::InStack,
    )
    .await;
    assert!(history.iter().any(is_summary), "summarized");
    // 50 rounds and one summary, which went through the same server.
    assert_eq!(calls.len(), 51);
    // Its prefix (system prompt, tools, the older history, as sent for the rounds before)
    // is read from the cache: 9 in 10 of its input tokens.
    let [summary] = calls.iter().filter(|c| c.summary).collect::<Vec<_>>()[..] else {
        panic!("one summary call: {calls:?}")
    };
    assert!(summary.cached * 10 >= summary.input * 9, "{summary:?}");

    // A summarizer apart shares nothing with the session (its calls are not counted here).
    let (apart, calls, _) = session(
        Some(CacheTtl::FiveMinutes),
        static_instructions(),
        Summaries::Apart,
    )
    .await;
    assert_eq!(calls.len(), 50);
    assert!(apart.ratio() >= 0.9, "{apart:?}");
}

#[tokio::test]
async fn rounds_of_many_parallel_calls_still_read_the_history_from_the_cache() {
    use tower_agent::prelude::*;
    use tower_agent::providers::Anthropic;
    use tower_agent_test::StubTool;

    // Twelve calls a round: 24 blocks with their results, past the API's 20-block lookback
    // from the history's end. The marker where the previous request ended keeps the hit.
    let wide = |req: &ModelRequest| {
        let round = req.ctx.round();
        if round < 20 {
            ModelResponse::tool_calls((0..12).map(|i| {
                ToolCall::new(
                    format!("toolu_{round:02}_{i:02}"),
                    "lookup",
                    serde_json::json!({ "page": round * 12 + i }),
                )
            }))
        } else {
            ModelResponse::text("Done.")
        }
    };
    let provider = Anthropic::new("claude-sonnet-4-5")
        .api_key("sk-ant-test")
        .prompt_cache(Some(CacheTtl::FiveMinutes));
    let server = prompt_cache::CachingServer::new(provider, wide);
    let tools = ToolSet::new().tool(StubTool::returning("lookup", "A note. ".repeat(10)));
    let agent = Agent::builder()
        .system("You are a careful research assistant. ".repeat(120))
        .max_rounds(25)
        .build(server.clone(), tools);
    agent
        .oneshot(AgentRequest::new(Session::new(), "Read it all."))
        .await
        .expect("completes");
    let tally = server.after_first();
    println!(
        "12 calls a round: {:.1}% of the input after the first call cached",
        tally.ratio() * 100.0
    );
    assert!(tally.ratio() >= 0.9, "{tally:?}");
}

/// What `calls`' input costs at Claude Sonnet's prices from a price table: reads at a tenth of
/// the prompt price, writes at 1.25 times it (the 5-minute cache).
fn input_cost(calls: &[prompt_cache::Tally]) -> tower_agent::Cost {
    let input_only = tower_agent::ModelPrice {
        output: 0.0,
        ..prompt_cache::sonnet()
    };
    prompt_cache::cost(calls, &input_only)
}

#[tokio::test]
async fn tool_results_cleared_in_batches_keep_the_cached_prefix() {
    use tower_agent::layers::clear::ClearToolResultsLayer;

    let run = |clear: Option<ClearToolResultsLayer>| {
        prompt_cache::session_clearing(
            Some(CacheTtl::FiveMinutes),
            static_instructions(),
            Summaries::InStack,
            clear,
        )
    };
    let clear = || ClearToolResultsLayer::new().trigger(0).keep(3);
    let (none, none_calls, _) = run(None).await;
    let (one, one_calls, _) = run(Some(clear().batch(1))).await;
    let (ten, ten_calls, history) = run(Some(clear().batch(10))).await;
    assert!(
        history
            .iter()
            .flat_map(tower_agent::Message::tool_results)
            .all(|r| !r.content.starts_with("[cleared")),
        "the session keeps every result whole"
    );
    for (name, tally, calls) in [
        ("no clearing", none, &none_calls),
        ("cleared one at a time", one, &one_calls),
        ("cleared ten at a time", ten, &ten_calls),
    ] {
        println!(
            "{name}: {} input tokens after the first call, {:.1}% cached, input cost {}",
            tally.input,
            tally.ratio() * 100.0,
            input_cost(calls)
        );
    }
    // Clearing sends fewer tokens either way.
    assert!(one.input < none.input && ten.input < none.input);
    // One at a time, each round rewrites the history from the newly cleared result on: most
    // of it is written to the cache again, at 1.25 the price, every round.
    assert!(one.ratio() < 0.7, "{one:?}");
    // Ten at a time, the cleared part stays the same for ten rounds: the prefix is read.
    assert!(ten.ratio() >= 0.9, "{ten:?}");
    let (ten_cost, one_cost) = (input_cost(&ten_calls), input_cost(&one_calls));
    assert!(ten_cost + ten_cost < one_cost, "{ten_cost} {one_cost}");
}
