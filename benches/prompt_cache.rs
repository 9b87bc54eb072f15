//! Prompt caching over a 50-round session (a system prompt of about 1,150 tokens, memory, static
//! instructions, summarization), sent as the Anthropic provider sends it to a server that
//! prices it as Anthropic's prompt cache does (`common/prompt_cache.rs`): the share of input
//! tokens read from the cache after the first call, what that saves at Claude Sonnet's list
//! prices, and the time the whole session takes on stubs (request bodies built, markers
//! planned, the cache priced).
//!
//! Run: `cargo bench --bench prompt_cache --features anthropic`.

use criterion::{Criterion, criterion_group, criterion_main};
use tower_agent::providers::anthropic::CacheTtl;

#[path = "common/prompt_cache.rs"]
mod prompt_cache;

use prompt_cache::{Summaries, session, static_instructions};

/// Claude Sonnet's list prices, dollars per million tokens: input, 5-minute cache write, cache
/// read.
const INPUT: f64 = 3.0;
const WRITE: f64 = 3.75;
const READ: f64 = 0.30;

fn sessions(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let (tally, calls, _) = rt.block_on(session(
        Some(CacheTtl::FiveMinutes),
        static_instructions(),
        Summaries::InStack,
    ));
    let (uncached, ..) = rt.block_on(session(None, static_instructions(), Summaries::InStack));
    // Priced as Anthropic does: cached tokens at the read price, the rest written once at
    // the write price (an upper bound: the tail of each call is written once, then read).
    let input: u64 = calls.iter().map(|c| c.input).sum();
    let cached: u64 = calls.iter().map(|c| c.cached).sum();
    let with_cache = (cached as f64 * READ + (input - cached) as f64 * WRITE) / 1e6;
    let without = uncached.input as f64 * INPUT / 1e6 + calls[0].input as f64 * INPUT / 1e6;
    eprintln!(
        "50 rounds: {:.1}% of the input after the first call read from the cache \
         ({} of {} tokens); input cost ${with_cache:.3} with the cache, ${without:.3} without",
        tally.ratio() * 100.0,
        tally.cached,
        tally.input,
    );
    c.bench_function("prompt_cache/session_50_rounds", |b| {
        b.iter(|| {
            rt.block_on(session(
                Some(CacheTtl::FiveMinutes),
                static_instructions(),
                Summaries::InStack,
            ))
        })
    });
}

criterion_group!(benches, sessions);
criterion_main!(benches);
