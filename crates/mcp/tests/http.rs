//! MCP tools over streamable HTTP: server-everything started by each test with
//! `node dist/index.js streamableHttp` on a free port (it binds every interface; the tests
//! speak to 127.0.0.1 only), alone and beside the same server over stdio. Without the server
//! each test says why it skips, and fails in CI.
#![cfg(all(feature = "stdio", feature = "http"))]

mod common;

use std::time::Duration;

use serde_json::json;
use tower::ServiceExt;
use tower_agent_core::{DescribeTools, ErrorKind, RunContext, ToolCall, ToolRequest};
use tower_agent_mcp::{McpError, McpServer, McpTools};

use common::{everything, free_port, serve};

fn call(id: &str, name: &str, arguments: serde_json::Value) -> ToolRequest {
    ToolRequest::new(ToolCall::new(id, name, arguments), RunContext::new())
}

#[tokio::test]
async fn two_servers_with_the_same_tools_get_prefixed_names() {
    let Some(everything) = everything() else {
        return;
    };
    let port = free_port();
    let _served = serve(&everything, port).await;
    let tools = McpTools::connect([
        McpServer::stdio("local", "node")
            .arg(&everything)
            .arg("stdio"),
        McpServer::http("remote", format!("http://127.0.0.1:{port}/mcp")),
    ])
    .await
    .expect("connects to both");
    let specs = tools.tool_specs();
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"local_echo") && names.contains(&"remote_echo"),
        "{names:?}"
    );
    assert!(!names.contains(&"echo"), "{names:?}");
    assert_eq!(
        tools.server_of("remote_get-sum"),
        Some(("remote", "get-sum".to_owned()))
    );

    for (id, name) in [("c1", "local_echo"), ("c2", "remote_echo")] {
        let response = tools
            .clone()
            .oneshot(call(id, name, json!({"message": name})))
            .await
            .expect("an answer");
        assert!(!response.result.is_error, "{}", response.result.content);
        assert!(
            response.result.content.contains(name),
            "{}",
            response.result.content
        );
    }
    let sum = tools
        .clone()
        .oneshot(call("c3", "remote_get-sum", json!({"a": 1.5, "b": 2})))
        .await
        .expect("an answer");
    assert!(sum.result.content.contains("3.5"), "{}", sum.result.content);
}

#[tokio::test]
async fn a_server_gone_mid_call_is_a_typed_error_and_the_next_call_connects_again() {
    let Some(everything) = everything() else {
        return;
    };
    let port = free_port();
    let served = serve(&everything, port).await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let tools = McpTools::connect([McpServer::http("remote", &url)
        .bearer("sk-SECRET-TOKEN")
        .ping_every(Duration::from_millis(250))])
    .await
    .expect("connects");
    assert!(!format!("{tools:?}").contains("SECRET"), "{tools:?}");

    let kill = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        drop(served);
    });
    let long = call(
        "c1",
        "trigger-long-running-operation",
        json!({"duration": 30, "steps": 30}),
    );
    let error = tokio::time::timeout(Duration::from_secs(20), tools.clone().oneshot(long))
        .await
        .expect("the call ends when the server is gone")
        .expect_err("no answer");
    kill.await.expect("killed");
    assert_eq!(error.kind(), ErrorKind::Backend, "{error}");
    let source = std::error::Error::source(&error)
        .and_then(|s| s.downcast_ref::<McpError>())
        .expect("an McpError source");
    assert!(matches!(source, McpError::Lost { .. }), "{source}");
    assert!(!error.to_string().contains("SECRET"));

    // The server comes back (a new process, no old sessions): the next call connects again.
    let _served = serve(&everything, port).await;
    let echo = tools
        .clone()
        .oneshot(call("c2", "echo", json!({"message": "back"})))
        .await
        .expect("connected again");
    assert!(
        echo.result.content.contains("back"),
        "{}",
        echo.result.content
    );
}
