//! What `McpTools` adds to a tool call over calling the server straight with rmcp: `echo` on
//! server-everything over stdio (a child process) and over streamable HTTP on 127.0.0.1. Each
//! iteration is one call, awaited. Needs server-everything (`.ci/run` installs it and exports
//! `MCP_EVERYTHING`). Run: `cargo bench -p tower-agent-mcp --bench overhead`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde_json::json;
use tower::ServiceExt as _;
use tower_agent_core::{RunContext, ToolCall, ToolRequest};
use tower_agent_mcp::{McpServer, McpTools};

fn everything() -> PathBuf {
    let path = std::env::var_os("MCP_EVERYTHING")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(
                "../../.ci/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
            )
        });
    assert!(
        path.exists(),
        "server-everything is not installed: .ci/run installs it under .ci/mcp"
    );
    path
}

fn arguments() -> rmcp::model::JsonObject {
    let serde_json::Value::Object(arguments) = json!({"message": "ping"}) else {
        unreachable!("an object")
    };
    arguments
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let everything = everything();
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let _served = rt.block_on(async {
        let child = tokio::process::Command::new("node")
            .arg(&everything)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("node starts");
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        child
    });
    let url = format!("http://127.0.0.1:{port}/mcp");

    let mut group = c.benchmark_group("mcp_echo");
    for transport in ["stdio", "http"] {
        // rmcp alone: one client, `tools/call` awaited.
        let direct = rt.block_on(async {
            match transport {
                "stdio" => {
                    let mut command = tokio::process::Command::new("node");
                    command.arg(&everything).arg("stdio");
                    let (child, _) = rmcp::transport::TokioChildProcess::builder(command)
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("node starts");
                    ().serve(child).await.expect("connects")
                }
                _ => {
                    let transport =
                        rmcp::transport::StreamableHttpClientTransport::from_uri(url.as_str());
                    ().serve(transport).await.expect("connects")
                }
            }
        });
        group.bench_function(format!("{transport}/rmcp"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let started = Instant::now();
                    for _ in 0..iters {
                        let mut params = CallToolRequestParams::new("echo");
                        params.arguments = Some(arguments());
                        direct.call_tool(params).await.expect("echo answers");
                    }
                    started.elapsed()
                })
            });
        });
        // The same call through McpTools, as the agent makes it.
        let server = match transport {
            "stdio" => McpServer::stdio("everything", "node")
                .arg(&everything)
                .arg("stdio"),
            _ => McpServer::http("everything", url.as_str()),
        };
        let tools = rt.block_on(McpTools::connect([server])).expect("connects");
        group.bench_function(format!("{transport}/mcp_tools"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let started = Instant::now();
                    for i in 0..iters {
                        let call =
                            ToolCall::new(format!("c{i}"), "echo", json!({"message": "ping"}));
                        let response = tools
                            .clone()
                            .oneshot(ToolRequest::new(call, RunContext::new()))
                            .await
                            .expect("echo answers");
                        assert!(!response.result.is_error);
                    }
                    started.elapsed()
                })
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
