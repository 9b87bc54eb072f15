//! The eviction layer: the limit, exclusions, the preview, paths a model wrote, the read tool,
//! a failing backend, and a whole run where the model pages through an evicted result.

#![cfg(feature = "evict")]

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use serde_json::{Value, json};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentRequest, Event, Message, ModelResponse, RunContext, Session, ToolCall, ToolRequest,
    ToolResponse,
};
use tower_agent_layers::evict::ResultEvicted;
use tower_agent_layers::evict::{Evict, EvictLayer, READ_TOOL, RESULTS_DIR};
use tower_agent_loop::Agent;
use tower_agent_storage::{
    BoxFuture, ByteStream, Entry, InMemory, LocalFs, Storage, StorageError, StoragePath,
};
use tower_agent_test::{EventRecorder, ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::{Tool, ToolSet};

/// `line 1\n` to `line {n}\n`.
fn lines(n: usize) -> String {
    (1..=n).map(|i| format!("line {i}\n")).collect()
}

/// A context whose events go to `recorder`.
fn ctx(recorder: &EventRecorder) -> RunContext {
    RunContext::new().with_observer(recorder.clone())
}

/// Call `tool` through `layer` once.
async fn run(layer: &EvictLayer, tool: StubTool, call: ToolCall, ctx: RunContext) -> ToolResponse {
    let mut service = layer.layer(tool);
    service
        .ready()
        .await
        .expect("ready")
        .call(ToolRequest::new(call, ctx))
        .await
        .expect("the layer never fails on its own")
}

/// Call the read tool of `layer` with `args`.
async fn read(layer: &EvictLayer, args: Value) -> ToolResponse {
    let call = ToolCall::new("r1", READ_TOOL, args);
    layer
        .read_tool()
        .oneshot(ToolRequest::new(call, RunContext::new()))
        .await
        .expect("the read tool answers with a result")
}

async fn stored(storage: &impl Storage, path: &str) -> String {
    let path = StoragePath::parse(path).expect("a valid path");
    let bytes = storage.get(&path).await.expect("stored");
    String::from_utf8(bytes.to_vec()).expect("UTF-8")
}

fn evicted(recorder: &EventRecorder) -> Vec<(String, String, String, usize)> {
    recorder
        .events()
        .into_iter()
        .filter_map(|event| {
            let e = event.downcast_ref::<ResultEvicted>()?;
            Some((e.call_id.clone(), e.name.clone(), e.path.clone(), e.tokens))
        })
        .collect()
}

fn warnings(recorder: &EventRecorder) -> Vec<(&'static str, String)> {
    recorder
        .events()
        .into_iter()
        .filter_map(|event| match event {
            Event::Warning { source, message } => Some((source, message)),
            _ => None,
        })
        .collect()
}

/// The path a preview names.
fn named_path(preview: &str) -> &str {
    let start = preview.find(RESULTS_DIR).expect("the preview names a path");
    let len = preview[start..].find([' ', '"']).expect("the path ends");
    &preview[start..start + len]
}

#[tokio::test]
async fn the_layer_builds_an_evict_service() {
    let layer = EvictLayer::new(InMemory::new())
        .limit(10)
        .exclude("shell")
        .preview_lines(3, 2)
        .max_line_chars(80)
        .read_lines(50);
    let service: Evict<StubTool> = layer.layer(StubTool::returning("t", "x"));
    assert_eq!(service.get_ref().calls().len(), 0);
    let _: StubTool = service.into_inner();
    let _: EvictLayer = Evict::<StubTool>::layer(InMemory::new());
    let debug = format!("{layer:?}");
    assert!(
        debug.contains("limit: 10") && debug.contains("shell"),
        "{debug}"
    );
    assert_eq!(layer.read_tool().spec().name, READ_TOOL);

    // And through the `ServiceBuilder` extension.
    let mut tools = ServiceBuilder::new()
        .layer(layer)
        .service(StubTool::returning("t", lines(100)));
    let call = ToolCall::new("c1", "t", json!({}));
    let res = tools
        .ready()
        .await
        .expect("ready")
        .call(ToolRequest::new(call, RunContext::new()))
        .await
        .expect("ok");
    assert!(res.result.content.contains("/large_tool_results/t_c1"));
}

#[tokio::test]
async fn a_result_over_the_limit_is_stored_whole_and_previewed() {
    let storage = InMemory::new();
    let layer = EvictLayer::new(storage.clone()).limit(100);
    let recorder = EventRecorder::new();
    let content = lines(1000);
    let res = run(
        &layer,
        StubTool::returning("search", content.clone()),
        ToolCall::new("call_1", "search", json!({})),
        ctx(&recorder),
    )
    .await;

    let preview = &res.result.content;
    assert_eq!(
        stored(&storage, "/large_tool_results/search_call_1").await,
        content,
        "stored whole"
    );
    // Header: size, limit, path.
    assert!(
        preview.starts_with("[This result is too large for the context: about 2224 tokens, over the limit of 100. It was saved whole to /large_tool_results/search_call_1 (1000 lines, 8893 characters)."),
        "{preview}"
    );
    // The first and last ten lines, numbered like `cat -n`.
    let head: String = (1..=10).map(|i| format!("{i:>6}\tline {i}\n")).collect();
    let tail: String = (991..=1000)
        .map(|i| format!("{i:>6}\tline {i}\n"))
        .collect();
    let marker = "[... 980 lines (8731 characters) left out: lines 11 to 990 ...]\n";
    assert!(
        preview.contains(&format!("{head}{marker}{tail}")),
        "{preview}"
    );
    // How to read the rest, with the read tool's arguments.
    assert!(
        preview.ends_with(
            "[To read it, call `read_large_result` with {\"path\": \"/large_tool_results/search_call_1\", \"offset\": 11, \"limit\": 200}: `offset` is the first line to show (1-based), `limit` how many lines (default 200). Each reply says which lines it shows and the offset of the next slice.]"
        ),
        "{preview}"
    );
    assert!(
        res.result.content.len() < 2224 * 4,
        "a replacement: the preview"
    );
    assert!(!res.result.is_error);
    assert_eq!(
        evicted(&recorder),
        [(
            "call_1".to_owned(),
            "search".to_owned(),
            "/large_tool_results/search_call_1".to_owned(),
            2224
        )]
    );
}

#[tokio::test]
async fn a_result_exactly_at_the_limit_stays_inline() {
    let storage = InMemory::new();
    // 400 ASCII characters: 100 tokens.
    let content = "x".repeat(400);
    let recorder = EventRecorder::new();
    let at = EvictLayer::new(storage.clone()).limit(100);
    let res = run(
        &at,
        StubTool::returning("t", content.clone()),
        ToolCall::new("c1", "t", json!({})),
        ctx(&recorder),
    )
    .await;
    assert_eq!(res.result.content, content);
    assert!(!res.result.content.contains("read_large_result"));
    assert!(storage.list("").await.expect("listed").is_empty());
    assert!(evicted(&recorder).is_empty());

    // One token more is over it.
    let over = EvictLayer::new(storage.clone()).limit(99);
    let res = run(
        &over,
        StubTool::returning("t", content),
        ToolCall::new("c1", "t", json!({})),
        ctx(&recorder),
    )
    .await;
    assert!(res.result.content.contains("over the limit of 99"));
    assert_eq!(storage.list("").await.expect("listed").len(), 1);
}

#[tokio::test]
async fn an_excluded_tool_stays_inline() {
    let storage = InMemory::new();
    let layer = EvictLayer::new(storage.clone())
        .limit(10)
        .exclude("read_file")
        .exclude("grep");
    for tool in ["read_file", "grep"] {
        let res = run(
            &layer,
            StubTool::returning(tool, lines(500)),
            ToolCall::new("c1", tool, json!({})),
            RunContext::new(),
        )
        .await;
        assert_eq!(res.result.content, lines(500), "{tool}");
    }
    assert!(storage.list("").await.expect("listed").is_empty());
}

#[tokio::test]
async fn the_read_tools_results_are_never_evicted() {
    let storage = InMemory::new();
    let layer = EvictLayer::new(storage.clone()).limit(10);
    // One result is evicted...
    let mut tools = layer.layer(ToolSet::new().tool(StubTool::returning("fetch", lines(500))));
    let ask = |id: &str, name: &str, args: Value| {
        ToolRequest::new(ToolCall::new(id, name, args), RunContext::new())
    };
    let res = tools
        .ready()
        .await
        .expect("ready")
        .call(ask("c1", "fetch", json!({})))
        .await
        .expect("ok");
    assert!(res.result.content.contains("read_large_result"), "evicted");
    // ...and a page of it, read with the layer's own read tool, is never evicted again.
    let args = json!({"path": "/large_tool_results/fetch_c1", "limit": 500});
    let res = tools
        .ready()
        .await
        .expect("ready")
        .call(ask("r1", READ_TOOL, args))
        .await
        .expect("ok");
    assert!(!res.result.is_error, "{}", res.result.content);
    assert!(
        res.result.content.starts_with("     1\tline 1\n"),
        "{}",
        res.result.content
    );
    assert_eq!(
        storage.list("").await.expect("listed").len(),
        1,
        "nothing more stored"
    );
}

#[tokio::test]
async fn error_flag_ids_and_action_are_kept() {
    let storage = InMemory::new();
    let layer = EvictLayer::new(storage.clone()).limit(10);
    let res = run(
        &layer,
        StubTool::failing("build", lines(300)),
        ToolCall::new("call_9", "build", json!({})),
        RunContext::new(),
    )
    .await;
    assert!(res.result.is_error, "the error flag stays");
    assert_eq!(res.result.call_id, "call_9");
    assert_eq!(res.result.name, "build");
    assert!(
        res.result
            .content
            .contains("/large_tool_results/build_call_9")
    );
    assert_eq!(
        stored(&storage, "/large_tool_results/build_call_9").await,
        lines(300)
    );

    let res = run(
        &layer,
        StubTool::stopping("deploy", lines(300), "deployed"),
        ToolCall::new("call_10", "deploy", json!({})),
        RunContext::new(),
    )
    .await;
    assert_eq!(
        res.action,
        tower_agent_core::ToolAction::stop(
            &ToolCall::new("call_10", "deploy", json!({})),
            "deployed"
        )
    );
    assert!(
        res.result
            .content
            .contains("/large_tool_results/deploy_call_10")
    );
}

#[tokio::test]
async fn a_paused_call_is_not_evicted() {
    let storage = InMemory::new();
    let layer = EvictLayer::new(storage.clone()).limit(1);
    let res = run(
        &layer,
        StubTool::interrupting("ask", json!({"question": "which one?"})),
        ToolCall::new("c1", "ask", json!({})),
        RunContext::new(),
    )
    .await;
    assert!(matches!(
        res.action,
        tower_agent_core::ToolAction::Interrupt(_)
    ));
    assert!(storage.list("").await.expect("listed").is_empty());
}

#[tokio::test]
async fn non_ascii_text_is_counted_by_characters() {
    // 1,000 Chinese characters are 3,000 bytes: bytes / 4 would say 750 tokens, characters / 4
    // 250. The layer's estimate says 1,000, so a limit of 999 evicts them and 1,000 does not.
    let content = "数".repeat(1000);
    let recorder = EventRecorder::new();
    let storage = InMemory::new();
    let res = run(
        &EvictLayer::new(storage.clone()).limit(1000),
        StubTool::returning("t", content.clone()),
        ToolCall::new("c1", "t", json!({})),
        ctx(&recorder),
    )
    .await;
    assert_eq!(res.result.content, content);

    let res = run(
        &EvictLayer::new(storage.clone())
            .limit(999)
            .max_line_chars(7),
        StubTool::returning("t", content.clone()),
        ToolCall::new("c2", "t", json!({})),
        ctx(&recorder),
    )
    .await;
    assert_eq!(evicted(&recorder)[0].3, 1000);
    let preview = &res.result.content;
    assert!(preview.contains("(1 lines, 1000 characters)"), "{preview}");
    // The one long line is clipped at seven characters, none of them split.
    assert!(
        preview.contains(
            "     1\t数数数数数数数 [... line clipped: 993 more characters, from column 8]\n"
        ),
        "{preview}"
    );
    assert_eq!(stored(&storage, "/large_tool_results/t_c2").await, content);

    // A counter of the host's choice.
    let words = EvictLayer::new(storage.clone())
        .limit(5)
        .counter(|text: &str| text.split_whitespace().count());
    let res = run(
        &words,
        StubTool::returning("t", "a b c d e f"),
        ToolCall::new("c3", "t", json!({})),
        RunContext::new(),
    )
    .await;
    assert!(
        res.result.content.contains("about 6 tokens"),
        "{}",
        res.result.content
    );
}

/// Tool names and call ids a model might write.
fn bad_names() -> Vec<(String, String)> {
    [
        ("../../etc", "passwd"),
        ("t", "../../../escape"),
        ("t", "/abs/path"),
        ("t", "a\\b\\..\\c"),
        ("t", ".."),
        ("t", "."),
        ("..", ".."),
        ("t", "a\0b"),
        ("t", "with space"),
        ("t", "日本語の呼び出し"),
        ("t", ""),
        ("ツール", "🙂"),
    ]
    .into_iter()
    .map(|(tool, id)| (tool.to_owned(), id.to_owned()))
    .chain([
        ("t".to_owned(), "x".repeat(300)),
        ("y".repeat(300), "é".repeat(300)),
    ])
    .collect()
}

/// Every bad name lands under the results directory of `storage`, and the path the preview
/// names reads back the first line.
async fn names_stay_inside(storage: Arc<dyn Storage>) -> Vec<String> {
    let layer = EvictLayer::from_shared(storage.clone()).limit(10);
    let mut paths = Vec::new();
    for (tool, id) in bad_names() {
        let res = run(
            &layer,
            StubTool::returning(tool.clone(), lines(100)),
            ToolCall::new(id.clone(), tool.clone(), json!({})),
            RunContext::new(),
        )
        .await;
        let preview = &res.result.content;
        assert!(
            preview.starts_with("[This result is too large"),
            "{tool:?}/{id:?}: {preview}"
        );
        let path = named_path(preview).to_owned();
        assert!(
            path.starts_with("/large_tool_results/"),
            "{tool:?}/{id:?}: {path}"
        );
        assert_eq!(
            path.matches('/').count(),
            2,
            "{tool:?}/{id:?}: one segment: {path}"
        );
        let page = read(&layer, json!({"path": path, "limit": 1})).await;
        assert!(!page.result.is_error, "{path}: {}", page.result.content);
        assert!(
            page.result.content.starts_with("     1\tline 1\n"),
            "{path}: {}",
            page.result.content
        );
        paths.push(path);
    }
    let listed: Vec<Entry> = storage.list("").await.expect("listed");
    assert_eq!(
        listed.len(),
        bad_names().len(),
        "one file each, no collision"
    );
    assert!(
        listed
            .iter()
            .all(|entry| entry.path.as_str().starts_with("large_tool_results/"))
    );
    paths
}

#[tokio::test]
async fn names_a_model_wrote_stay_under_the_root_in_memory() {
    names_stay_inside(Arc::new(InMemory::new())).await;
}

#[tokio::test]
async fn names_a_model_wrote_stay_under_the_root_on_disk() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path().join("root");
    let paths = names_stay_inside(Arc::new(LocalFs::new(&root))).await;

    // Nothing was written beside the root, and every file is in the results directory.
    let beside: Vec<_> = std::fs::read_dir(dir.path())
        .expect("listed")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(beside, ["root"]);
    let results = root.join("large_tool_results");
    let files: Vec<String> = std::fs::read_dir(&results)
        .expect("the results directory")
        .map(|e| {
            let e = e.expect("entry");
            assert!(e.file_type().expect("type").is_file());
            e.file_name().into_string().expect("ASCII")
        })
        .collect();
    assert_eq!(files.len(), paths.len());
    assert_eq!(
        std::fs::read_dir(&root).expect("root").count(),
        1,
        "only the results directory under the root"
    );
    for path in paths {
        let file = Path::new(&results).join(path.trim_start_matches("/large_tool_results/"));
        assert_eq!(
            std::fs::read_to_string(&file).expect("readable"),
            lines(100)
        );
    }
}

#[tokio::test]
async fn ids_that_map_alike_get_different_paths() {
    let storage = InMemory::new();
    let layer = EvictLayer::new(storage.clone()).limit(10);
    let ids = ["a/b", "a_b", "a\\b", "a b", "a.b", "a:b"];
    for (n, id) in ids.iter().enumerate() {
        run(
            &layer,
            StubTool::returning("t", lines(50 + n)),
            ToolCall::new(*id, "t", json!({})),
            RunContext::new(),
        )
        .await;
    }
    let listed = storage.list("").await.expect("listed");
    assert_eq!(listed.len(), ids.len(), "{listed:?}");
    assert!(
        listed
            .iter()
            .any(|e| e.path.as_str() == "large_tool_results/t_a_b")
    );
}

/// A layer over 1,000 stored lines at `/large_tool_results/t_c1`.
async fn stored_thousand() -> EvictLayer {
    let layer = EvictLayer::new(InMemory::new()).limit(100);
    run(
        &layer,
        StubTool::returning("t", lines(1000)),
        ToolCall::new("c1", "t", json!({})),
        RunContext::new(),
    )
    .await;
    layer
}

const PATH: &str = "/large_tool_results/t_c1";

#[tokio::test]
async fn the_read_tool_pages_with_offset_and_limit() {
    let layer = stored_thousand().await.limit(100_000);
    let page = read(&layer, json!({"path": PATH, "offset": 11, "limit": 3})).await;
    assert!(!page.result.is_error);
    assert_eq!(
        page.result.content,
        "    11\tline 11\n    12\tline 12\n    13\tline 13\n[Lines 11 to 13 shown; the result goes on. \
         Next slice: call `read_large_result` with {\"path\": \"/large_tool_results/t_c1\", \
         \"offset\": 14, \"limit\": 3}.]"
    );
    // The defaults: from line 1, 200 lines.
    let page = read(&layer, json!({"path": PATH})).await;
    let content = &page.result.content;
    assert!(content.starts_with("     1\tline 1\n"), "{content}");
    assert!(
        content.contains("   200\tline 200\n[Lines 1 to 200 shown;"),
        "{content}"
    );
    assert!(
        content.contains("\"offset\": 201, \"limit\": 200"),
        "{content}"
    );
    // Without the leading slash too.
    let page = read(
        &layer,
        json!({"path": "large_tool_results/t_c1", "offset": 2, "limit": 1}),
    )
    .await;
    assert!(page.result.content.starts_with("     2\tline 2\n"));
}

#[tokio::test]
async fn the_read_tools_last_page_says_it_is_the_end() {
    let layer = stored_thousand().await.limit(100_000);
    let page = read(&layer, json!({"path": PATH, "offset": 998, "limit": 200})).await;
    assert_eq!(
        page.result.content,
        "   998\tline 998\n   999\tline 999\n  1000\tline 1000\n[Lines 998 to 1000 of 1000 shown: \
         this is the end of the result.]"
    );
    // A slice ending exactly at the last line knows it too.
    let page = read(&layer, json!({"path": PATH, "offset": 1000, "limit": 1})).await;
    assert!(
        page.result
            .content
            .ends_with("of 1000 shown: this is the end of the result.]")
    );
}

#[tokio::test]
async fn the_read_tool_refuses_an_offset_past_the_end() {
    let layer = stored_thousand().await;
    let page = read(&layer, json!({"path": PATH, "offset": 1001})).await;
    assert!(page.result.is_error);
    assert_eq!(
        page.result.content,
        "offset 1001 is past the end of /large_tool_results/t_c1: it has 1000 lines. Use an \
         offset from 1 to 1000."
    );
    // Offset 0 is read as 1; limit 0 as 1.
    let page = read(&layer, json!({"path": PATH, "offset": 0, "limit": 0})).await;
    assert!(
        page.result
            .content
            .starts_with("     1\tline 1\n[Lines 1 to 1 shown;")
    );
}

#[tokio::test]
async fn the_read_tool_refuses_bad_paths_and_arguments() {
    let layer = stored_thousand().await;
    for path in [
        "/etc/passwd",
        "../../etc/passwd",
        "/large_tool_results/../secret",
        "/large_tool_results",
        "/large_tool_results/",
        "/other/t_c1",
        "",
        "a\0b",
    ] {
        let page = read(&layer, json!({ "path": path })).await;
        assert!(page.result.is_error, "{path:?}");
        assert!(
            page.result
                .content
                .contains("is not the path of a stored result"),
            "{path:?}: {}",
            page.result.content
        );
    }
    let page = read(&layer, json!({"path": "/large_tool_results/t_missing"})).await;
    assert!(page.result.is_error);
    assert_eq!(
        page.result.content,
        "no stored result at /large_tool_results/t_missing: check the path the preview named."
    );
    for args in [
        json!({}),
        json!({"path": 3}),
        json!({"path": PATH, "offset": -1}),
        json!({"path": PATH, "limit": "ten"}),
        json!([PATH, 1, 2]),
    ] {
        let page = read(&layer, args.clone()).await;
        assert!(page.result.is_error, "{args}");
        assert!(
            page.result
                .content
                .contains("invalid arguments for tool `read_large_result`"),
            "{args}: {}",
            page.result.content
        );
    }
    // A huge path the model made up is not echoed whole.
    let page = read(
        &layer,
        json!({"path": format!("/x/{}", "a".repeat(10_000))}),
    )
    .await;
    assert!(page.result.is_error && page.result.content.len() < 500);
}

#[tokio::test]
async fn the_read_tool_clips_lines_and_stops_at_the_token_limit() {
    let storage = InMemory::new();
    let long: String = (1..=50)
        .map(|i| format!("{i}:{}\r\n", "é".repeat(100)))
        .collect();
    let layer = EvictLayer::new(storage.clone())
        .limit(500)
        .max_line_chars(10);
    run(
        &layer,
        StubTool::returning("t", long),
        ToolCall::new("c1", "t", json!({})),
        RunContext::new(),
    )
    .await;
    let page = read(&layer, json!({"path": PATH, "limit": 50})).await;
    let content = &page.result.content;
    assert!(!page.result.is_error, "{content}");
    assert!(
        content.starts_with(
            "     1\t1:éééééééé [... line clipped: 92 more characters, from column 11]\n"
        ),
        "{content}"
    );
    // A shown line is about 24 tokens: the slice stops before passing 500.
    let line_20 = format!(
        "    20\t20:{} [... line clipped: 93 more characters, from column 11]\n",
        "é".repeat(7)
    );
    assert!(content.contains(&line_20), "{content}");
    assert!(!content.contains("    21\t21:"), "{content}");
    assert!(
        content.ends_with(
            "[Lines 1 to 20 shown (this slice stopped early at the size limit of 500 tokens); the \
             result goes on. Next slice: call `read_large_result` with {\"path\": \
             \"/large_tool_results/t_c1\", \"offset\": 21, \"limit\": 50}.]"
        ),
        "{content}"
    );
}

#[tokio::test]
async fn one_long_line_is_read_on_by_column() {
    let storage = InMemory::new();
    // Compact JSON: one line of about 6,900 characters.
    let json_line = serde_json::to_string(&(0..1_000).collect::<Vec<u32>>()).expect("json");
    let layer = EvictLayer::new(storage.clone())
        .limit(100)
        .max_line_chars(1_000);
    let res = run(
        &layer,
        StubTool::returning("t", json_line.clone()),
        ToolCall::new("c1", "t", json!({})),
        RunContext::new(),
    )
    .await;
    let more = json_line.chars().count() - 1_000;
    assert!(
        res.result.content.contains(&format!(
            "[... line clipped: {more} more characters, from column 1001]"
        )),
        "{}",
        res.result.content
    );
    // Page through the line by column, as the markers say, and get it back whole.
    let mut read_back = String::new();
    let mut column = 1;
    for _ in 0..10 {
        let page = read(
            &layer,
            json!({"path": PATH, "offset": 1, "limit": 1, "column": column}),
        )
        .await;
        let content = &page.result.content;
        assert!(!page.result.is_error, "{content}");
        let line = content
            .strip_prefix("     1\t")
            .and_then(|rest| rest.split(['\n', ' ']).next())
            .expect("line 1");
        read_back.push_str(line);
        match content.find("from column ") {
            Some(at) => {
                let digits: String = content[at + 12..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                column = digits.parse().expect("a column");
            }
            None => break,
        }
    }
    assert_eq!(read_back, json_line);
}

/// A backend whose every operation fails.
#[derive(Debug, Default, Clone)]
struct Broken {
    puts: Arc<AtomicUsize>,
}

fn broken() -> StorageError {
    StorageError::backend("disk full", std::io::Error::other("ENOSPC"))
}

impl Storage for Broken {
    fn put<'a>(&'a self, _: &'a StoragePath, _: Bytes) -> BoxFuture<'a, Result<(), StorageError>> {
        self.puts.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err(broken()) })
    }
    fn put_stream<'a>(
        &'a self,
        _: &'a StoragePath,
        _: ByteStream,
    ) -> BoxFuture<'a, Result<u64, StorageError>> {
        Box::pin(async { Err(broken()) })
    }
    fn get<'a>(&'a self, _: &'a StoragePath) -> BoxFuture<'a, Result<Bytes, StorageError>> {
        Box::pin(async { Err(broken()) })
    }
    fn get_range<'a>(
        &'a self,
        _: &'a StoragePath,
        _: Range<u64>,
    ) -> BoxFuture<'a, Result<Bytes, StorageError>> {
        Box::pin(async { Err(broken()) })
    }
    fn get_stream<'a>(
        &'a self,
        _: &'a StoragePath,
    ) -> BoxFuture<'a, Result<ByteStream, StorageError>> {
        Box::pin(async { Err(broken()) })
    }
    fn list<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StorageError>> {
        Box::pin(async { Err(broken()) })
    }
    fn delete<'a>(&'a self, _: &'a StoragePath) -> BoxFuture<'a, Result<(), StorageError>> {
        Box::pin(async { Err(broken()) })
    }
}

#[tokio::test]
async fn a_failing_backend_keeps_the_result_inline_and_warns() {
    let storage = Broken::default();
    let layer = EvictLayer::new(storage.clone()).limit(10);
    let recorder = EventRecorder::new();
    // The tool's buffer is recorded: the result must come back in that very buffer.
    let buffer = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&buffer);
    let tool = StubTool::from_fn("search", move |req: &ToolRequest| {
        let content = lines(2000);
        seen.store(content.as_ptr() as usize, Ordering::SeqCst);
        ToolResponse::error(&req.call, content)
    });
    let res = run(
        &layer,
        tool,
        ToolCall::new("c1", "search", json!({})),
        ctx(&recorder),
    )
    .await;

    assert_eq!(storage.puts.load(Ordering::SeqCst), 1);
    assert_eq!(res.result.content, lines(2000), "nothing lost");
    assert!(res.result.is_error);
    assert!(!res.result.content.contains("read_large_result"));
    assert_eq!(
        res.result.content.as_ptr() as usize,
        buffer.load(Ordering::SeqCst),
        "the same buffer, not a copy"
    );
    assert!(evicted(&recorder).is_empty());
    let warnings = warnings(&recorder);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].0, "evict");
    assert!(
        warnings[0]
            .1
            .contains("could not be stored at /large_tool_results/search_c1")
            && warnings[0].1.contains("disk full"),
        "{}",
        warnings[0].1
    );

    // Its read tool answers with an error result.
    let page = read(&layer, json!({"path": "/large_tool_results/search_c1"})).await;
    assert!(page.result.is_error);
    assert!(
        page.result.content.contains("could not be read"),
        "{}",
        page.result.content
    );
}

#[tokio::test]
async fn the_stored_value_is_the_tools_buffer() {
    let storage = InMemory::new();
    let layer = EvictLayer::new(storage.clone()).limit(10);
    let buffer = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&buffer);
    let tool = StubTool::from_fn("t", move |req: &ToolRequest| {
        let content = lines(2000);
        seen.store(content.as_ptr() as usize, Ordering::SeqCst);
        ToolResponse::success(&req.call, content)
    });
    run(
        &layer,
        tool,
        ToolCall::new("c1", "t", json!({})),
        RunContext::new(),
    )
    .await;
    let path = StoragePath::parse(PATH).expect("valid");
    let value = storage.get(&path).await.expect("stored");
    assert_eq!(
        value.as_ptr() as usize,
        buffer.load(Ordering::SeqCst),
        "moved, not copied"
    );
}

#[tokio::test]
async fn a_whole_run_pages_through_an_evicted_result() {
    let storage = InMemory::new();
    let evict = EvictLayer::new(storage.clone());
    // About 200 KB: 50,000 tokens, over the default limit of 20,000.
    let big: String = (1..=4000)
        .map(|i| format!("row {i:>5}: {}\n", "abcdefghij".repeat(4)))
        .collect();
    assert!(big.len() > 200_000);
    // The read tool is not in the set: the eviction layer serves it and reports it.
    let tools = ToolSet::new().tool(StubTool::returning("fetch", big.clone()));
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "fetch", json!({}))]),
        ModelResponse::tool_calls([ToolCall::new(
            "c2",
            READ_TOOL,
            json!({"path": "/large_tool_results/s1/fetch_c1", "offset": 11, "limit": 3}),
        )]),
        ModelResponse::text("done"),
    ]);
    let agent = Agent::new(
        model.clone(),
        ServiceBuilder::new().layer(evict).service(tools),
    );
    let recorder = EventRecorder::new();
    let res = agent
        .oneshot(
            AgentRequest::new(Session::with_id("s1"), "fetch it").with_observer(recorder.clone()),
        )
        .await
        .expect("the run completes");

    assert_valid_history(&res.session.history);
    let offered: Vec<String> = model.requests()[0]
        .tools
        .iter()
        .map(|spec| spec.name.clone())
        .collect();
    assert_eq!(
        offered,
        ["fetch", READ_TOOL],
        "the model is offered the read tool"
    );
    let results: Vec<_> = res
        .session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .collect();
    assert_eq!(results.len(), 2);
    assert!(
        results[0]
            .content
            .contains("saved whole to /large_tool_results/s1/fetch_c1 (4000 lines")
    );
    assert!(
        results[0].content.len() < 5_000,
        "the history holds the preview only"
    );
    assert!(
        results[1]
            .content
            .starts_with("    11\trow    11: abcdefghij"),
        "{}",
        results[1].content
    );
    assert!(results[1].content.contains("\"offset\": 14"));
    assert_eq!(
        stored(&storage, "/large_tool_results/s1/fetch_c1").await,
        big
    );

    // The model was offered the read tool and saw the preview, never the whole result.
    let requests = model.requests();
    assert!(requests[0].tools.iter().any(|spec| spec.name == READ_TOOL));
    assert!(
        requests
            .iter()
            .flat_map(|r| r.messages.iter())
            .flat_map(Message::tool_results)
            .all(|r| r.content.len() < 5_000)
    );
    assert_eq!(
        recorder
            .names()
            .iter()
            .filter(|n| **n == "result_evicted")
            .count(),
        1
    );
}

#[tokio::test]
async fn a_user_after_tool_outside_sees_the_preview() {
    // A plain onion: a callback outside the eviction layer sees what it returned.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let user_after = tower_agent_core::after_tool(move |res: ToolResponse, _ctx: RunContext| {
        log.lock().unwrap().push(res.result.content.clone());
        async move { Ok(res) }
    });
    let mut tools = ServiceBuilder::new()
        .layer(user_after)
        .layer(EvictLayer::new(InMemory::new()).limit(100))
        .service(
            ToolSet::new()
                .tool(StubTool::returning("big", lines(1000)))
                .tool(StubTool::returning("small", "ok")),
        );
    for (id, tool) in [("c1", "big"), ("c2", "small")] {
        let call = ToolCall::new(id, tool, json!({}));
        tools
            .ready()
            .await
            .expect("ready")
            .call(ToolRequest::new(call, RunContext::new()))
            .await
            .expect("ok");
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "both results reached the user's callback");
    assert!(
        seen[0].contains("read_large_result") && seen[0].len() < lines(1000).len(),
        "the big one as its preview: {}",
        seen[0]
    );
    assert_eq!(seen[1], "ok");
}

/// Evict one result of tool `fetch` in session `session` (empty: none), call `call_1`.
async fn evict_in(layer: &EvictLayer, session: &str) -> String {
    let ctx = RunContext::new().with_session_id(session);
    let res = run(
        layer,
        StubTool::returning("fetch", lines(200)),
        ToolCall::new("call_1", "fetch", json!({})),
        ctx,
    )
    .await;
    assert!(
        res.result.content.contains("read_large_result"),
        "evicted in session {session:?}"
    );
    named_path(&res.result.content).to_owned()
}

async fn paths(storage: &InMemory) -> Vec<String> {
    storage
        .list("")
        .await
        .expect("lists")
        .into_iter()
        .map(|entry| format!("/{}", entry.path.as_str()))
        .collect()
}

#[tokio::test]
async fn forgetting_a_session_deletes_its_results_and_no_others() {
    let storage = InMemory::new();
    let layer = EvictLayer::new(storage.clone()).limit(100);
    let a = evict_in(&layer, "a").await;
    let b = evict_in(&layer, "b").await;
    let none = evict_in(&layer, "").await;
    // A session id that must be mapped, and one that starts like another.
    let odd = evict_in(&layer, "../b").await;
    let longer = evict_in(&layer, "ab").await;
    assert_eq!(a, "/large_tool_results/a/fetch_call_1");
    assert_eq!(none, "/large_tool_results/fetch_call_1");
    assert_eq!(paths(&storage).await.len(), 5);

    assert_eq!(layer.forget_session("a").await.expect("deletes"), 1);
    let left = paths(&storage).await;
    assert!(!left.contains(&a), "{left:?}");
    for kept in [&b, &none, &odd, &longer] {
        assert!(left.contains(kept), "{kept} kept: {left:?}");
    }
    // Nothing of the session is left: forgetting again deletes nothing.
    assert_eq!(layer.forget_session("a").await.expect("deletes"), 0);

    // The empty id: the results written without a session, not the sessions' directories.
    assert_eq!(layer.forget_session("").await.expect("deletes"), 1);
    assert_eq!(paths(&storage).await, {
        let mut kept = vec![b.clone(), odd.clone(), longer.clone()];
        kept.sort();
        kept
    });

    assert_eq!(layer.forget_session("../b").await.expect("deletes"), 1);
    assert_eq!(layer.forget_session("b").await.expect("deletes"), 1);
    assert_eq!(paths(&storage).await, [longer]);
    // The read tool of the session says the result is gone.
    let call = ToolCall::new("r1", READ_TOOL, json!({"path": a}));
    let ctx = RunContext::new().with_session_id("a");
    let gone = layer
        .read_tool()
        .oneshot(ToolRequest::new(call, ctx))
        .await
        .expect("a result");
    assert!(gone.result.is_error, "{}", gone.result.content);
    assert!(
        gone.result.content.contains("no stored result"),
        "{}",
        gone.result.content
    );
}

#[tokio::test]
async fn forgetting_a_session_on_a_failing_backend_is_an_error() {
    let layer = EvictLayer::new(Broken::default());
    let error = layer
        .forget_session("a")
        .await
        .expect_err("the backend fails");
    assert!(error.to_string().contains("disk full"), "{error}");
}

#[test]
fn the_read_tool_is_reported_once() {
    use tower_agent_core::DescribeTools;
    let evict = EvictLayer::new(InMemory::new());
    let alone = ServiceBuilder::new()
        .layer(evict.clone())
        .service(ToolSet::new().tool(StubTool::returning("fetch", "x")));
    let names: Vec<String> = alone.tool_specs().iter().map(|s| s.name.clone()).collect();
    assert_eq!(names, ["fetch", READ_TOOL]);
    // Asked again (every round), the same list: no spec is copied while the tools stay.
    assert!(std::sync::Arc::ptr_eq(
        &alone.tool_specs(),
        &alone.clone().tool_specs()
    ));
    // A host that also put it in its set (as before) gets it once.
    let both = ServiceBuilder::new().layer(evict.clone()).service(
        ToolSet::new()
            .tool(StubTool::returning("fetch", "x"))
            .tool(evict.read_tool()),
    );
    assert_eq!(both.tool_specs().len(), 2);
}
