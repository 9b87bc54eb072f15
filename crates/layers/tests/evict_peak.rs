//! Peak memory of the eviction layer: one 50 MB result through the layer costs about one copy
//! of it, not several; the first page of the read tool reads little more than that page.
//!
//! Its own test binary (one test), so that no other test allocates meanwhile. The peak is read
//! from `/proc/self/status` (`VmHWM`), reset before each step through `/proc/self/clear_refs`
//! where the kernel allows it. Run with `--nocapture` to see the figures.

#![cfg(all(feature = "evict", target_os = "linux"))]

use std::sync::Arc;

use serde_json::json;
use tower::{Layer, Service, ServiceExt};
use tower_agent_core::{RunContext, ToolCall, ToolRequest, ToolResponse};
use tower_agent_layers::evict::{EvictLayer, READ_TOOL};
use tower_agent_storage::{InMemory, LocalFs, Storage, StoragePath};
use tower_agent_test::StubTool;

const SIZE: usize = 50 * 1024 * 1024;
const MB: f64 = 1024.0 * 1024.0;

/// A field of `/proc/self/status`, in bytes.
fn status(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| {
            value
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<usize>()
                .ok()
        })
        .map(|kb| kb * 1024)
        .expect("the field is there")
}

/// Reset the peak (`VmHWM`) to the current RSS; `false` when the kernel refuses.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// How much the peak grew over `baseline` while `f` ran.
async fn peak_growth<T>(f: impl std::future::Future<Output = T>) -> (T, usize) {
    let resettable = reset_peak();
    let baseline = if resettable {
        status("VmRSS")
    } else {
        status("VmHWM")
    };
    let out = f.await;
    (out, status("VmHWM").saturating_sub(baseline))
}

/// 50 MB of numbered 64-byte lines, in a buffer of exactly that size (so that building it
/// never holds two buffers while growing).
fn big() -> String {
    let mut text = String::with_capacity(SIZE);
    let mut i = 0;
    while text.len() < SIZE {
        i += 1;
        text.push_str(&format!("row {i:>10}: {}\n", "x".repeat(47)));
    }
    assert_eq!(text.len(), SIZE);
    assert_eq!(text.capacity(), SIZE);
    text
}

async fn evict_once(storage: Arc<dyn Storage>) -> (ToolResponse, usize) {
    let layer = EvictLayer::from_shared(storage);
    let mut tools = layer.layer(StubTool::from_fn("dump", |req: &ToolRequest| {
        ToolResponse::success(&req.call, big())
    }));
    let call = ToolCall::new("c1", "dump", json!({}));
    let request = ToolRequest::new(call, RunContext::new());
    let (res, growth) = peak_growth(async {
        tools
            .ready()
            .await
            .expect("ready")
            .call(request)
            .await
            .expect("evicted")
    })
    .await;
    assert!(
        res.result.content.contains(
            "saved whole to /large_tool_results/dump_c1 (819200 lines, 52428800 characters)"
        ),
        "{}",
        &res.result.content[..300]
    );
    (res, growth)
}

#[test]
fn a_50_mb_result_costs_about_one_copy() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let resettable = reset_peak();
        let path = StoragePath::parse("/large_tool_results/dump_c1").expect("valid");

        // To the disk.
        let dir = tempfile::tempdir().expect("a temporary directory");
        let disk = LocalFs::new(dir.path());
        let (_res, growth) = evict_once(Arc::new(disk.clone())).await;
        let stored = std::fs::metadata(dir.path().join("large_tool_results/dump_c1"))
            .expect("written")
            .len();
        assert_eq!(stored, SIZE as u64);
        eprintln!(
            "evict 50 MB to LocalFs: peak RSS growth {:.1} MB ({:.2}x the result)",
            growth as f64 / MB,
            growth as f64 / SIZE as f64
        );
        assert!(growth < 3 * SIZE, "peak grew by {growth} bytes");

        // The first page and a page in the middle read a few chunks, not the value.
        let layer = EvictLayer::new(disk);
        for offset in [1, 400_000] {
            let call = ToolCall::new(
                "r1",
                READ_TOOL,
                json!({"path": "/large_tool_results/dump_c1", "offset": offset, "limit": 200}),
            );
            let request = ToolRequest::new(call, RunContext::new());
            let (page, growth) = peak_growth(layer.read_tool().oneshot(request)).await;
            let page = page.expect("a page");
            assert!(!page.result.is_error, "{}", page.result.content);
            assert!(
                page.result
                    .content
                    .starts_with(&format!("{offset:>6}\trow {offset:>10}: ")),
                "{}",
                &page.result.content[..100]
            );
            eprintln!(
                "read 200 lines from line {offset} of 50 MB: peak RSS growth {:.1} MB",
                growth as f64 / MB
            );
            if resettable {
                assert!(growth < SIZE / 10, "peak grew by {growth} bytes");
            }
        }

        // In memory: the stored value is the tool's buffer. Measured only when the peak can be
        // reset: over the earlier peak, the check could not fail.
        if !resettable {
            assert!(
                std::env::var_os("CI").is_none(),
                "the kernel refused to reset the peak (/proc/self/clear_refs): nothing to measure"
            );
            eprintln!("the peak cannot be reset here: the in-memory case is not measured");
            return;
        }
        let memory = InMemory::new();
        let (_res, growth) = evict_once(Arc::new(memory.clone())).await;
        assert_eq!(memory.get(&path).await.expect("stored").len(), SIZE);
        eprintln!(
            "evict 50 MB to InMemory: peak RSS growth {:.1} MB ({:.2}x the result)",
            growth as f64 / MB,
            growth as f64 / SIZE as f64,
        );
        assert!(growth < 3 * SIZE, "peak grew by {growth} bytes");
    });
}
