//! server-everything for the MCP tests and the bench: where it is installed, and started over
//! streamable HTTP on a free port of 127.0.0.1.
#![allow(dead_code, unreachable_pub)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// `dist/index.js` of server-everything (`MCP_EVERYTHING`, set by `.ci/run`, or its place
/// under `.ci/mcp`), or `None` (outside CI, said) when it is not installed.
pub fn everything() -> Option<PathBuf> {
    let path = match std::env::var_os("MCP_EVERYTHING") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(
            "../../.ci/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
        ),
    };
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var("CI").is_err(),
        "server-everything is not installed: .ci/run installs it under .ci/mcp and exports MCP_EVERYTHING"
    );
    eprintln!(
        "skipped: server-everything is not installed (npm install --prefix .ci/mcp @modelcontextprotocol/server-everything)"
    );
    None
}

/// server-everything over streamable HTTP on `port` (it binds every interface; callers speak
/// to 127.0.0.1), killed when dropped.
pub async fn serve(everything: &Path, port: u16) -> tokio::process::Child {
    let child = tokio::process::Command::new("node")
        .arg(everything)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    let mut child = child;
    for _ in 0..100 {
        // A server that could not take the port has exited: another one answers there.
        if let Ok(Some(status)) = child.try_wait() {
            panic!("server-everything exited ({status}): port {port} is taken");
        }
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return child;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("server-everything did not listen on 127.0.0.1:{port}");
}

/// A port nothing listens on now, and never handed out before in this process: two tests
/// running at once never get the same one (the system may give a port just released again).
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut given = GIVEN.lock().unwrap_or_else(PoisonError::into_inner);
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}
