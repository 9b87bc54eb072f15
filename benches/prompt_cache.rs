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

use prompt_cache::{Summaries, cost, session, sonnet, static_instructions};

fn sessions(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let (tally, calls, _) = rt.block_on(session(
        Some(CacheTtl::FiveMinutes),
        static_instructions(),
        Summaries::InStack,
    ));
    let (_, uncached_calls, _) =
        rt.block_on(session(None, static_instructions(), Summaries::InStack));
    // Priced by the price table as Anthropic bills: reads at a tenth of the prompt price,
    // writes at 1.25 times it, the rest and the output at list price.
    let price = sonnet();
    let (with_cache, without) = (cost(&calls, &price), cost(&uncached_calls, &price));
    let written: u64 = calls.iter().map(|c| c.written).sum();
    eprintln!(
        "50 rounds: {:.1}% of the input after the first call read from the cache \
         ({} of {} tokens; {written} written); cost {with_cache} with the cache, {without} \
         without: {} saved",
        tally.ratio() * 100.0,
        tally.cached,
        tally.input,
        without.saturating_sub(with_cache),
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
