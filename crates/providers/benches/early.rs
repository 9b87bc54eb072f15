//! Early tool start, measured: the time saved on a recorded OpenAI stream served on
//! 127.0.0.1 (a chunk every 100 ms, 600 ms in all) that calls two read-only tools taking
//! 500 ms each. The first call closes at 400 ms, when the second starts; the second at the
//! end of the stream. One round (`max_rounds(1)`): the model's stream, then its calls.
//!
//! Expected, sequential tools: 600 + 500 + 500 = 1,600 ms without, 400 + 500 + 500 (the
//! second started at 600, ends at 1,100) = 1,100 ms with. Concurrent tools: 1,100 ms either
//! way, as the last call closes with the stream. Run: `cargo bench -p tower-agent-providers
//! --bench early`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use schemars::JsonSchema;
use serde::Deserialize;
use tower::ServiceExt;
use tower_agent_core::{AgentRequest, Error, Session};
use tower_agent_loop::AgentBuilder;
use tower_agent_providers::OpenAi;
use tower_agent_tools::{ToolSet, tool_fn};

/// The recorded stream, each piece after its pause in milliseconds.
const STREAM: &[(u64, &[u8])] = &[
    (
        0,
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Checking \"}}]}\n\n",
    ),
    (
        100,
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"both.\"}}]}\n\n",
    ),
    (
        100,
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"docs\",\"arguments\":\"{\\\"q\\\":\"}}]}}]}\n\n",
    ),
    (
        100,
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"retry\\\"}\"}}]}}]}\n\n",
    ),
    (
        100,
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"code\",\"arguments\":\"{\\\"q\\\":\"}}]}}]}\n\n",
    ),
    (
        100,
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\"\\\"backoff\\\"}\"}}]}}]}\n\n",
    ),
    (
        100,
        b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n",
    ),
];

#[derive(Deserialize, JsonSchema)]
struct Query {
    q: String,
}

/// Two read-only tools taking 500 ms each.
fn tools() -> ToolSet {
    let slow = |name: &'static str| {
        tool_fn(name, "Look something up.", |args: Query| async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok::<_, Error>(format!("found {}", args.q))
        })
        .read_only()
    };
    ToolSet::new().tool(slow("docs")).tool(slow("code"))
}

/// One round against the server: the stream, then both calls.
async fn round(url: &str, early: bool, concurrent: bool) {
    let model = OpenAi::new("recorded").base_url(url).api_key("none");
    let builder = AgentBuilder::new().max_rounds(1).early_tool_start(early);
    let builder = match concurrent {
        true => builder.concurrent_tools(2),
        false => builder,
    };
    let res = builder
        .build(model, tools())
        .oneshot(AgentRequest::new(Session::new(), "Find it."))
        .await
        .expect("the round runs");
    let results = res
        .session
        .history
        .iter()
        .flat_map(|m| m.tool_results())
        .filter(|r| !r.is_error)
        .count();
    assert_eq!(results, 2, "both calls answered");
}

fn early(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let server = rt.block_on(common::Server::trickling(STREAM));
    let mut group = c.benchmark_group("early_tool_start");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(12));
    for (name, early, concurrent) in [
        ("sequential/off", false, false),
        ("sequential/on", true, false),
        ("concurrent/off", false, true),
        ("concurrent/on", true, true),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let started = Instant::now();
                    for _ in 0..iters {
                        round(&server.url, early, concurrent).await;
                    }
                    started.elapsed()
                })
            });
        });
    }
    group.finish();
}

criterion_group!(benches, early);
criterion_main!(benches);
