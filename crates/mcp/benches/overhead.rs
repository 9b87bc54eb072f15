//! What `McpTools` adds to a tool call over calling the server straight with rmcp: `echo` on
//! server-everything over stdio (a child process) and over streamable HTTP on 127.0.0.1. Each
//! iteration is one call, awaited. Needs server-everything (`.ci/run` installs it and exports
//! `MCP_EVERYTHING`). Run: `cargo bench -p tower-agent-mcp --bench overhead`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Stdio;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde_json::json;
use tower::ServiceExt as _;
use tower_agent_core::{RunContext, ToolCall, ToolRequest};
use tower_agent_mcp::{McpServer, McpTools};

fn arguments() -> rmcp::model::JsonObject {
    let serde_json::Value::Object(arguments) = json!({"message": "ping"}) else {
        unreachable!("an object")
    };
    arguments
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let everything = common::everything().expect("server-everything is installed (see .ci/run)");
    let port = common::free_port();
    let _served = rt.block_on(common::serve(&everything, port));
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
