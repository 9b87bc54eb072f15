//! What the tool cache costs and saves per call: `cargo bench --bench tool_cache --features cache`.
//!
//! A read-only tool that answers at once with 2 KB, called directly, through `ToolCacheLayer`
//! on a hit (the same arguments each time), and on a miss (new arguments each time: the
//! tool runs and its result is kept). A real tool that is worth caching (a search, a file
//! read, an MCP server) takes milliseconds, so the hit's figure is what a cached call costs.

use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use tower::{Layer, ServiceExt};
use tower_agent::layers::cache::ToolCacheLayer;
use tower_agent::{
    DescribedTools, Error, RunContext, ToolCall, ToolRequest, ToolResponse, ToolSpec,
};

type Reply = std::future::Ready<Result<ToolResponse, Error>>;

fn tool() -> DescribedTools<tower::util::ServiceFn<impl Fn(ToolRequest) -> Reply + Clone>> {
    let spec = ToolSpec::new("search", "Searches.", json!({"type": "object"})).read_only();
    DescribedTools::new(
        [spec],
        tower::service_fn(|req: ToolRequest| {
            std::future::ready(Ok(ToolResponse::success(
                &req.call,
                "a result line\n".repeat(150),
            )))
        }),
    )
}

fn request(ctx: &RunContext, query: u64) -> ToolRequest {
    let call = ToolCall::new(
        "c1",
        "search",
        json!({"query": format!("tower layers {query}"), "limit": 10}),
    );
    ToolRequest::new(call, ctx.clone())
}

fn calls(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let ctx = RunContext::new().with_session_id("bench");
    let bare = tool();
    let cached = ToolCacheLayer::new().max_bytes(8 << 20).layer(tool());
    let mut group = c.benchmark_group("tool_cache");
    group.bench_function("call_without_layer", |b| {
        b.iter(|| rt.block_on(bare.clone().oneshot(request(&ctx, 0))))
    });
    group.bench_function("hit", |b| {
        b.iter(|| rt.block_on(cached.clone().oneshot(request(&ctx, 0))))
    });
    let next = AtomicU64::new(1);
    group.bench_function("miss_and_keep", |b| {
        b.iter(|| {
            let query = next.fetch_add(1, Ordering::Relaxed);
            rt.block_on(cached.clone().oneshot(request(&ctx, query)))
        })
    });
    group.finish();
}

criterion_group!(benches, calls);
criterion_main!(benches);
