//! MCP tools on the reference server `@modelcontextprotocol/server-everything` (npm, pinned;
//! `.ci/run` installs it under `.ci/mcp` and exports `MCP_EVERYTHING`, the path of its
//! `dist/index.js`), over stdio and streamable HTTP on 127.0.0.1, and on a small server of the
//! same SDK whose tool list changes (`tests/servers/changing.mjs`). Without the server each test
//! says why it skips, and fails in CI.
#![cfg(feature = "stdio")]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use tower::ServiceExt;
use tower_agent_core::{
    AgentRequest, CancellationToken, DescribeTools, ErrorKind, Event, Message, ModelResponse,
    Outcome, RunContext, Session, ToolCall, ToolRequest, ToolResponse,
};
use tower_agent_loop::Agent;
use tower_agent_mcp::{McpError, McpServer, McpTools};
use tower_agent_test::{EventRecorder, ScriptedModel};

use common::everything;

/// The SDK's ESM directory next to server-everything.
fn sdk(everything: &Path) -> PathBuf {
    everything.join("../../../sdk/dist/esm")
}

fn stdio(name: &str, everything: &Path) -> McpServer {
    McpServer::stdio(name, "node").arg(everything).arg("stdio")
}

fn call(id: &str, name: &str, arguments: serde_json::Value) -> ToolRequest {
    ToolRequest::new(ToolCall::new(id, name, arguments), RunContext::new())
}

async fn run(tools: &McpTools, request: ToolRequest) -> ToolResponse {
    tools.clone().oneshot(request).await.expect("an answer")
}

#[tokio::test]
async fn lists_the_tools_with_their_schemas_and_hints() {
    let Some(everything) = everything() else {
        return;
    };
    // The hints of a server the host does not trust decide nothing.
    let untrusted = McpTools::connect([stdio("everything", &everything)])
        .await
        .expect("connects");
    let echo = untrusted.tool_specs();
    let echo = echo.iter().find(|s| s.name == "echo").expect("echo");
    assert!(!echo.read_only && !echo.idempotent);
    let tools = McpTools::connect([stdio("everything", &everything).trust_hints(true)])
        .await
        .expect("connects");
    let specs = tools.tool_specs();
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    for name in [
        "echo",
        "get-sum",
        "trigger-long-running-operation",
        "get-tiny-image",
    ] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    let sum = specs.iter().find(|s| s.name == "get-sum").expect("get-sum");
    assert_eq!(sum.parameters["type"], "object");
    assert!(
        sum.parameters["properties"]["a"].is_object(),
        "{}",
        sum.parameters
    );
    let long = specs
        .iter()
        .find(|s| s.name == "trigger-long-running-operation")
        .expect("listed");
    assert!(long.read_only, "readOnlyHint: true becomes read_only");
    assert!(long.idempotent, "idempotentHint: true becomes idempotent");
    let hints = tools
        .annotations("trigger-long-running-operation")
        .expect("annotations kept");
    assert_eq!(hints.destructive_hint, Some(false));
    assert_eq!(
        tools.server_of("echo"),
        Some(("everything", "echo".to_owned()))
    );
}

#[tokio::test]
async fn calls_echo_and_get_sum_and_names_what_is_wrong() {
    let Some(everything) = everything() else {
        return;
    };
    let tools = McpTools::connect([stdio("everything", &everything)])
        .await
        .expect("connects");
    let echo = run(&tools, call("c1", "echo", json!({"message": "hello"}))).await;
    assert!(!echo.result.is_error);
    assert_eq!(echo.result.call_id, "c1");
    assert!(
        echo.result.content.contains("hello"),
        "{}",
        echo.result.content
    );
    let sum = run(&tools, call("c2", "get-sum", json!({"a": 2, "b": 40}))).await;
    assert!(sum.result.content.contains("42"), "{}", sum.result.content);

    // A tool no server has: an error result naming the tools, nothing sent.
    let unknown = run(&tools, call("c3", "nope", json!({}))).await;
    assert!(unknown.result.is_error);
    assert!(unknown.result.content.contains("unknown tool `nope`"));
    assert!(unknown.result.content.contains("get-sum"));

    // Arguments the server refuses: its error, for the model to read.
    let wrong = run(&tools, call("c4", "get-sum", json!({"a": "two"}))).await;
    assert!(wrong.result.is_error, "{}", wrong.result.content);

    // Arguments that are not a JSON object never reach the server.
    let malformed = ToolRequest::new(
        ToolCall::raw("c5", "echo", "{\"message\": "),
        RunContext::new(),
    );
    let malformed = run(&tools, malformed).await;
    assert!(malformed.result.is_error);
    assert!(malformed.result.content.contains("not valid JSON"));

    // Non-text content is named, not dropped.
    let image = run(&tools, call("c6", "get-tiny-image", json!({}))).await;
    assert!(
        image.result.content.contains("[image: image/png"),
        "{}",
        image.result.content
    );
}

#[tokio::test]
async fn progress_becomes_run_events() {
    let Some(everything) = everything() else {
        return;
    };
    let tools = McpTools::connect([stdio("everything", &everything)])
        .await
        .expect("connects");
    let recorder = EventRecorder::new();
    let request = ToolRequest::new(
        ToolCall::new(
            "c1",
            "trigger-long-running-operation",
            json!({"duration": 0.4, "steps": 4}),
        ),
        RunContext::new().with_observer(recorder.clone()),
    );
    let done = run(&tools, request).await;
    assert!(
        done.result.content.contains("completed"),
        "{}",
        done.result.content
    );
    let mut progress: Vec<(f64, Option<f64>)> = recorder
        .events()
        .into_iter()
        .filter_map(|event| match event {
            Event::ToolProgress {
                call_id,
                name,
                progress,
                total,
                ..
            } => {
                assert_eq!(
                    (call_id.as_str(), name.as_str()),
                    ("c1", "trigger-long-running-operation")
                );
                Some((progress, total))
            }
            _ => None,
        })
        .collect();
    progress.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(
        progress,
        [
            (1.0, Some(4.0)),
            (2.0, Some(4.0)),
            (3.0, Some(4.0)),
            (4.0, Some(4.0))
        ]
    );
}

/// The server's stdin, copied to a file by `tee`: what the client sent; and the file with
/// the server's process id.
fn teed(everything: &Path, dir: &Path) -> (McpServer, PathBuf, PathBuf) {
    let sent = dir.join("sent.jsonl");
    let pid = dir.join("pid");
    let script = format!(
        // A job in the background reads /dev/null unless told otherwise: stdin goes by fd 3,
        // stdout by fd 4, and only the server holds the client's end of stdout (its exit
        // closes the stream at once, as a server's own process would).
        "exec 3<&0 4>&1 >/dev/null; \
         tee '{1}' <&3 3<&- 4>&- | node '{2}' stdio >&4 3<&- 4>&- & \
         echo $! > '{0}'; exec 3<&- 4>&-; wait",
        pid.display(),
        sent.display(),
        everything.display()
    );
    (
        McpServer::stdio("everything", "sh").args(["-c", &script]),
        sent,
        pid,
    )
}

#[tokio::test]
async fn a_dropped_call_sends_notifications_cancelled() {
    let Some(everything) = everything() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (server, sent, _) = teed(&everything, dir.path());
    let tools = McpTools::connect([server]).await.expect("connects");
    let long = call(
        "c1",
        "trigger-long-running-operation",
        json!({"duration": 30, "steps": 30}),
    );
    // A timeout layer drops the call's future.
    let timed = tower::timeout::Timeout::new(tools.clone(), Duration::from_millis(300));
    let error = timed.oneshot(long).await.expect_err("timed out");
    assert!(error.to_string().contains("timed out"), "{error}");
    let mut cancelled = None;
    for _ in 0..50 {
        let text = std::fs::read_to_string(&sent).unwrap_or_default();
        cancelled = text
            .lines()
            .find(|line| line.contains("notifications/cancelled"))
            .map(str::to_owned);
        if cancelled.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cancelled = cancelled.expect("the server was told");
    let text = std::fs::read_to_string(&sent).expect("sent");
    let call_line = text
        .lines()
        .find(|line| line.contains("trigger-long-running-operation") && line.contains("tools/call"))
        .expect("the call was sent");
    let id = serde_json::from_str::<serde_json::Value>(call_line).expect("JSON")["id"].clone();
    let notice: serde_json::Value = serde_json::from_str(&cancelled).expect("JSON");
    assert_eq!(
        notice["params"]["requestId"], id,
        "it names the call: {cancelled}"
    );

    // The connection goes on.
    let echo = run(&tools, call("c2", "echo", json!({"message": "still here"}))).await;
    assert!(echo.result.content.contains("still here"));
}

#[tokio::test]
async fn a_cancelled_run_cancels_the_server_call() {
    let Some(everything) = everything() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (server, sent, _) = teed(&everything, dir.path());
    let tools = McpTools::connect([server]).await.expect("connects");
    let model = ScriptedModel::new([ModelResponse::tool_calls([ToolCall::new(
        "c1",
        "trigger-long-running-operation",
        json!({"duration": 30, "steps": 30}),
    )])]);
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        cancel.cancel();
    });
    // The host keeps its tools across runs (dropping the last clone closes the connection).
    let response = Agent::new(model, tools.clone())
        .oneshot(AgentRequest::new(Session::new(), "go").with_cancellation(token))
        .await
        .expect("a cancelled run is an outcome");
    assert!(
        matches!(response.outcome, Outcome::Cancelled { .. }),
        "{:?}",
        response.outcome
    );
    let mut told = false;
    for _ in 0..50 {
        if std::fs::read_to_string(&sent)
            .unwrap_or_default()
            .contains("notifications/cancelled")
        {
            told = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(told, "the server heard of the cancellation");
}

/// Kills the process `pid` (SIGKILL) in 400 ms, mid-call.
fn kill_soon(pid: &str) -> tokio::task::JoinHandle<()> {
    let pid = pid.trim().to_owned();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let status = std::process::Command::new("sh")
            .args(["-c", &format!("kill -KILL {pid}")])
            .status()
            .expect("sh runs");
        assert!(status.success(), "the server was killed");
    })
}

#[tokio::test]
async fn a_server_that_exits_mid_call_is_a_typed_error_then_started_again() {
    let Some(everything) = everything() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (server, _, pid) = teed(&everything, dir.path());
    let tools = McpTools::connect([server]).await.expect("connects");
    let first = std::fs::read_to_string(&pid).expect("pid written");
    let kill = kill_soon(&first);
    let long = call(
        "c1",
        "trigger-long-running-operation",
        json!({"duration": 30, "steps": 30}),
    );
    let error = tools
        .clone()
        .oneshot(long)
        .await
        .expect_err("the connection was lost");
    kill.await.expect("killed");
    assert_eq!(error.kind(), ErrorKind::Backend);
    let source = std::error::Error::source(&error)
        .and_then(|s| s.downcast_ref::<McpError>())
        .expect("an McpError source");
    assert!(
        matches!(source, McpError::Lost { server, .. } if server == "everything"),
        "{source}"
    );

    // The next call starts the server again.
    let echo = run(&tools, call("c2", "echo", json!({"message": "back"}))).await;
    assert!(
        echo.result.content.contains("back"),
        "{}",
        echo.result.content
    );
    let second = std::fs::read_to_string(&pid).expect("pid written");
    assert_ne!(first, second, "a new process");
}

/// The same death mid-call, of a read-only tool on a server whose hints the host trusts: the
/// call is sent once more, with its key, to the server started again, and answered.
#[tokio::test]
async fn a_read_only_call_of_a_server_that_exits_is_sent_again_to_the_new_one() {
    let Some(everything) = everything() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (server, _, pid) = teed(&everything, dir.path());
    let tools = McpTools::connect([server.trust_hints(true)])
        .await
        .expect("connects");
    let first = std::fs::read_to_string(&pid).expect("pid written");
    let kill = kill_soon(&first);
    let mut long = call(
        "c1",
        "trigger-long-running-operation",
        json!({"duration": 2, "steps": 2}),
    );
    long.call.key = Some(tower_agent_core::CallKey::from_u128(1));
    let answer = run(&tools, long).await;
    kill.await.expect("killed");
    assert!(!answer.result.is_error, "{}", answer.result.content);
    let second = std::fs::read_to_string(&pid).expect("pid written");
    assert_ne!(first, second, "answered by a new process");
}

/// The MCP tools, waiting after a call of `add-tool` until the server's
/// `notifications/tools/list_changed` has been handled (it runs on a task of its own, and
/// lists the tools again over the wire), so the next round is deterministic.
#[derive(Clone)]
struct Settled(McpTools);

impl DescribeTools for Settled {
    fn tool_specs(&self) -> std::sync::Arc<[tower_agent_core::ToolSpec]> {
        self.0.tool_specs()
    }
}

impl tower::Service<ToolRequest> for Settled {
    type Response = ToolResponse;
    type Error = tower_agent_core::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<ToolResponse, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: ToolRequest) -> Self::Future {
        let tools = self.0.clone();
        Box::pin(async move {
            let before = tools.tool_specs().len();
            let adds = request.call.name == "add-tool";
            let response = tools.clone().oneshot(request).await;
            for _ in 0..250 {
                if !adds || tools.tool_specs().len() > before {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            response
        })
    }
}

#[tokio::test]
async fn a_changed_tool_list_is_offered_in_the_next_round() {
    let Some(everything) = everything() else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/changing.mjs");
    let server = McpServer::stdio("changing", "node")
        .arg(script)
        .arg(sdk(&everything));
    let tools = McpTools::connect([server]).await.expect("connects");
    let names: Vec<String> = tools.tool_specs().iter().map(|s| s.name.clone()).collect();
    assert_eq!(names, ["add-tool"]);

    // The model adds a tool, then calls it in the next round: the agent offers what the
    // server lists now.
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "add-tool", json!({}))]),
        ModelResponse::tool_calls([ToolCall::new("c2", "added-1", json!({}))]),
        ModelResponse::text("done"),
    ]);
    let response = Agent::new(model.clone(), Settled(tools))
        .oneshot(AgentRequest::new(Session::new(), "add one"))
        .await
        .expect("a run");
    assert_eq!(response.text().as_deref(), Some("done"));
    let offered: Vec<Vec<String>> = model
        .requests()
        .iter()
        .map(|r| r.tools.iter().map(|s| s.name.clone()).collect())
        .collect();
    assert_eq!(offered[0], ["add-tool"]);
    assert_eq!(offered[1], ["add-tool", "added-1"]);
    let results: Vec<String> = response
        .session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .map(|r| r.content.clone())
        .collect();
    assert_eq!(results, ["added added-1", "this is added-1"]);
}
