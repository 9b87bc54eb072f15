//! MCP over streamable HTTP when the server forgets its sessions (it restarted): the call the
//! server refused is sent once more on a new session; a call whose answer was lost is never
//! sent again. On server-everything restarted on the same port of 127.0.0.1, and on a small
//! MCP server in this file (plain HTTP/1.1 on tokio) that counts what it is sent and refuses,
//! hangs or drops the connection on demand. Without server-everything its tests say why they
//! skip, and fail in CI.
#![cfg(feature = "http")]

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;
use tower_agent_core::{CallKey, DescribeTools, ErrorKind, RunContext, ToolCall, ToolRequest};
use tower_agent_mcp::{McpError, McpServer, McpTools};

use common::{everything, free_port, serve};

/// A call with a key, as the agent gives each ([`key_of`]).
fn call(id: &str, name: &str, arguments: Value) -> ToolRequest {
    let mut call = ToolCall::new(id, name, arguments);
    call.key = Some(key_of(id));
    ToolRequest::new(call, RunContext::new())
}

/// The key of the call `id` in these tests: its bytes as a number.
fn key_of(id: &str) -> CallKey {
    CallKey::from_u128(id.bytes().fold(0, |n, b| n << 8 | u128::from(b)))
}

fn source(error: &tower_agent_core::Error) -> &McpError {
    std::error::Error::source(error)
        .and_then(|s| s.downcast_ref::<McpError>())
        .expect("an McpError source")
}

#[tokio::test]
async fn the_first_call_after_server_everything_restarted_succeeds() {
    let Some(everything) = everything() else {
        return;
    };
    let port = free_port();
    let mut served = serve(&everything, port).await;
    let tools = McpTools::connect([McpServer::http(
        "remote",
        format!("http://127.0.0.1:{port}/mcp"),
    )])
    .await
    .expect("connects");
    let echo = tools
        .clone()
        .oneshot(call("c1", "echo", json!({"message": "before"})))
        .await
        .expect("an answer");
    assert!(echo.result.content.contains("before"));

    // A deploy: the process goes, a new one (no sessions) comes on the same port, the client
    // idle meanwhile.
    served.kill().await.expect("killed");
    let _served = serve(&everything, port).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let echo = tokio::time::timeout(
        Duration::from_secs(10),
        tools
            .clone()
            .oneshot(call("c2", "echo", json!({"message": "after"}))),
    )
    .await
    .expect("answered in time")
    .expect("the first call after the restart succeeds");
    assert!(!echo.result.is_error, "{}", echo.result.content);
    assert!(
        echo.result.content.contains("after"),
        "{}",
        echo.result.content
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// How the small server refuses a request of a session it does not know.
#[derive(Clone, Copy, Debug)]
enum Refusal {
    /// HTTP 400, a JSON-RPC error without an id (server-everything's, whose Express app does
    /// not parse the body).
    BadRequestWithoutId,
    /// HTTP 400, a JSON-RPC error with the request's id (the TypeScript SDK's examples that
    /// parse the body).
    BadRequestWithId,
    /// HTTP 400 in plain text (the Python SDK's).
    BadRequestText,
    /// HTTP 404, as the specification says.
    NotFound,
}

/// What the small server does with `tools/call`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum OnCall {
    /// Answers.
    Answer,
    /// Reads the request and closes the connection without a word: the call's outcome is
    /// unknown to the client.
    Drop,
    /// Runs the first call, then closes the connection without a word (its answer is lost);
    /// answers the calls after it.
    RunThenDropOnce,
    /// Refuses it as though the session were gone, whatever the session.
    Refuse,
}

struct State {
    refusal: Refusal,
    on_call: OnCall,
    /// Never answers `initialize` (connect timeout) or `tools/list` (list timeout).
    hang_initialize: bool,
    hang_list: bool,
    sessions: HashSet<String>,
    next_session: u32,
    initializes: usize,
    /// `tools/call` requests received, and those the server ran (a call with the key of one
    /// it ran is answered without running again, as a server that keys its effects does).
    calls_received: usize,
    calls_run: usize,
    /// `tools/call` requests refused for their session.
    calls_refused: usize,
    /// The `annotations` of the one tool the server lists.
    annotations: Value,
    /// The `_meta.idempotencyKey` of each `tools/call` received, and of each it ran.
    keys: Vec<Option<String>>,
    ran_keys: HashSet<String>,
}

/// A small MCP server over streamable HTTP (JSON answers, no event stream) on 127.0.0.1.
struct Fake {
    url: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fake {
    async fn start(refusal: Refusal, on_call: OnCall) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let port = listener.local_addr().expect("an address").port();
        let state = Arc::new(Mutex::new(State {
            refusal,
            on_call,
            hang_initialize: false,
            hang_list: false,
            sessions: HashSet::new(),
            next_session: 0,
            initializes: 0,
            calls_received: 0,
            calls_run: 0,
            calls_refused: 0,
            annotations: Value::Null,
            keys: Vec::new(),
            ran_keys: HashSet::new(),
        }));
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(handle(stream, Arc::clone(&shared)));
            }
        });
        Self {
            url: format!("http://127.0.0.1:{port}/mcp"),
            state,
            task,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The server forgets every session, as a restarted one would.
    fn forget_sessions(&self) {
        self.state().sessions.clear();
    }
}

/// One HTTP request: method, session header, body.
async fn read_request(stream: &mut TcpStream) -> Option<(String, Option<String>, Vec<u8>)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let method = lines.next()?.split(' ').next()?.to_owned();
    let mut length = 0;
    let mut session = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().ok()?,
            "mcp-session-id" => session = Some(value.trim().to_owned()),
            _ => {}
        }
    }
    let mut body = buffer[end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some((method, session, body))
}

async fn respond(stream: &mut TcpStream, status: &str, headers: &str, body: &str) {
    let response = format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

async fn json(stream: &mut TcpStream, status: &str, extra: &str, body: &Value) {
    let headers = format!("Content-Type: application/json\r\n{extra}");
    respond(stream, status, &headers, &body.to_string()).await;
}

/// What the server does with one request.
enum Action {
    Json(&'static str, String, Value),
    Text(&'static str, &'static str),
    Accepted,
    NotAllowed,
    Hang,
    Drop,
}

async fn handle(mut stream: TcpStream, state: Arc<Mutex<State>>) {
    let Some((method, session, body)) = read_request(&mut stream).await else {
        return;
    };
    let action = {
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        decide(&mut state, &method, session, &body)
    };
    match action {
        Action::Json(status, extra, body) => json(&mut stream, status, &extra, &body).await,
        Action::Text(status, text) => {
            respond(&mut stream, status, "Content-Type: text/plain\r\n", text).await;
        }
        Action::Accepted => respond(&mut stream, "202 Accepted", "", "").await,
        Action::NotAllowed => respond(&mut stream, "405 Method Not Allowed", "", "").await,
        Action::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Action::Drop => drop(stream),
    }
}

fn decide(state: &mut State, method: &str, session: Option<String>, body: &[u8]) -> Action {
    if method != "POST" {
        // No event stream, no session deletion.
        return Action::NotAllowed;
    }
    let Ok(message) = serde_json::from_slice::<Value>(body) else {
        return Action::Text("400 Bad Request", "not JSON");
    };
    let id = message.get("id").cloned();
    let rpc = message["method"].as_str().unwrap_or_default().to_owned();
    if rpc == "initialize" {
        if state.hang_initialize {
            return Action::Hang;
        }
        state.initializes += 1;
        state.next_session += 1;
        let session = format!("session-{}", state.next_session);
        state.sessions.insert(session.clone());
        let version = message["params"]["protocolVersion"].clone();
        return Action::Json(
            "200 OK",
            format!("Mcp-Session-Id: {session}\r\n"),
            json!({
                "jsonrpc": "2.0",
                "id": id,
                "result": {
                    "protocolVersion": version,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "fake", "version": "1.0.0"}
                }
            }),
        );
    }
    let known = session.is_some_and(|s| state.sessions.contains(&s));
    if rpc == "tools/call" {
        state.calls_received += 1;
        let key = message["params"]["_meta"]["idempotencyKey"].as_str();
        state.keys.push(key.map(str::to_owned));
    }
    if !known || (rpc == "tools/call" && state.on_call == OnCall::Refuse) {
        if rpc == "tools/call" {
            state.calls_refused += 1;
        }
        let error = |id: Option<Value>| {
            let mut error = json!({
                "jsonrpc": "2.0",
                "error": {"code": -32000, "message": "Bad Request: No valid session ID provided"}
            });
            if let Some(id) = id {
                error["id"] = id;
            }
            error
        };
        return match state.refusal {
            Refusal::BadRequestWithoutId => {
                Action::Json("400 Bad Request", String::new(), error(None))
            }
            Refusal::BadRequestWithId => Action::Json("400 Bad Request", String::new(), error(id)),
            Refusal::BadRequestText => Action::Text(
                "400 Bad Request",
                "Bad Request: No valid session ID provided",
            ),
            Refusal::NotFound => Action::Json(
                "404 Not Found",
                String::new(),
                json!({
                    "jsonrpc": "2.0",
                    "id": null,
                    "error": {"code": -32001, "message": "Session not found"}
                }),
            ),
        };
    }
    let Some(id) = id else {
        // A notification.
        return Action::Accepted;
    };
    match rpc.as_str() {
        "tools/list" if state.hang_list => Action::Hang,
        "tools/list" => Action::Json(
            "200 OK",
            String::new(),
            json!({
                "jsonrpc": "2.0",
                "id": id,
                "result": {"tools": [{
                    "name": "shout",
                    "description": "Says it louder.",
                    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
                    "annotations": state.annotations.clone()
                }]}
            }),
        ),
        "tools/call" if state.on_call == OnCall::Drop => Action::Drop,
        "tools/call" if state.on_call == OnCall::RunThenDropOnce => {
            if let Some(key) = state.keys.last().cloned().flatten() {
                state.ran_keys.insert(key);
            }
            state.calls_run += 1;
            state.on_call = OnCall::Answer;
            Action::Drop
        }
        "tools/call" => {
            let key = state.keys.last().cloned().flatten();
            let ran_before = key.is_some_and(|key| !state.ran_keys.insert(key));
            if !ran_before {
                state.calls_run += 1;
            }
            let text = message["params"]["arguments"]["text"]
                .as_str()
                .unwrap_or_default()
                .to_uppercase();
            Action::Json(
                "200 OK",
                String::new(),
                json!({
                    "jsonrpc": "2.0",
                    "id": id,
                    "result": {"content": [{"type": "text", "text": text}]}
                }),
            )
        }
        "ping" => Action::Json(
            "200 OK",
            String::new(),
            json!({"jsonrpc": "2.0", "id": id, "result": {}}),
        ),
        _ => Action::Json(
            "200 OK",
            String::new(),
            json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": {"code": -32601, "message": "Method not found"}
            }),
        ),
    }
}

async fn shout(tools: &McpTools, id: &str) -> Result<String, tower_agent_core::Error> {
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        tools
            .clone()
            .oneshot(call(id, "shout", json!({"text": id}))),
    )
    .await
    .expect("an answer in time")?;
    assert!(!response.result.is_error, "{}", response.result.content);
    Ok(response.result.content)
}

/// The server forgets its sessions and refuses the next call as `refusal` says: the call is
/// answered, run once, on a second session.
async fn refused_then_sent_once_more(refusal: Refusal) {
    let fake = Fake::start(refusal, OnCall::Answer).await;
    let tools = McpTools::connect([McpServer::http("fake", &fake.url)])
        .await
        .expect("connects");
    assert_eq!(shout(&tools, "c1").await.expect("answered"), "C1");
    fake.forget_sessions();
    let answer = shout(&tools, "c2").await;
    let state = fake.state();
    assert_eq!(answer.as_deref().ok(), Some("C2"), "{answer:?}");
    assert_eq!(state.initializes, 2, "initialized again");
    assert_eq!(state.calls_refused, 1);
    assert_eq!(state.calls_run, 2, "c1, then c2 once");
}

#[tokio::test]
async fn a_call_refused_with_400_and_an_id_less_error_is_sent_once_more() {
    refused_then_sent_once_more(Refusal::BadRequestWithoutId).await;
}

#[tokio::test]
async fn a_call_refused_with_400_and_an_error_of_its_id_is_sent_once_more() {
    refused_then_sent_once_more(Refusal::BadRequestWithId).await;
}

#[tokio::test]
async fn a_call_refused_with_400_in_plain_text_is_sent_once_more() {
    refused_then_sent_once_more(Refusal::BadRequestText).await;
}

#[tokio::test]
async fn a_call_refused_with_404_is_sent_once_more() {
    refused_then_sent_once_more(Refusal::NotFound).await;
}

#[tokio::test]
async fn a_call_refused_twice_is_not_sent_a_third_time() {
    let fake = Fake::start(Refusal::BadRequestWithoutId, OnCall::Refuse).await;
    let tools = McpTools::connect([McpServer::http("fake", &fake.url)])
        .await
        .expect("connects");
    let error = shout(&tools, "c1").await.expect_err("refused");
    assert_eq!(error.kind(), ErrorKind::Backend, "{error}");
    assert!(
        matches!(source(&error), McpError::Refused { .. }),
        "{}",
        source(&error)
    );
    let state = fake.state();
    assert_eq!(state.calls_received, 2, "sent, then once more: {error}");
    assert_eq!(state.calls_run, 0);
    assert_eq!(state.initializes, 2);
}

#[tokio::test]
async fn a_call_to_a_server_that_is_gone_sends_nothing_and_says_it_cannot_connect() {
    let fake = Fake::start(Refusal::BadRequestWithoutId, OnCall::Answer).await;
    let tools = McpTools::connect([McpServer::http("fake", &fake.url)])
        .await
        .expect("connects");
    assert_eq!(shout(&tools, "c1").await.expect("answered"), "C1");
    // The server stops listening: the connection is refused, nothing was sent, and the call
    // (after one more attempt to connect) says so rather than that the connection was lost.
    let url = fake.url.clone();
    drop(fake);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let error = shout(&tools, "c2").await.expect_err("nobody listens");
    assert!(
        matches!(source(&error), McpError::Connect { .. }),
        "{error}: {}",
        source(&error)
    );
    assert_eq!(tools.unavailable().len(), 1, "{url}");
}

/// A TCP server on 127.0.0.1 that accepts and never says a word.
async fn silent() -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let port = listener.local_addr().expect("an address").port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    (format!("http://127.0.0.1:{port}/mcp"), task)
}

#[tokio::test]
async fn connecting_and_listing_have_timeouts() {
    let short = Duration::from_millis(300);
    // An HTTP server that never answers `initialize`.
    let (url, _silent) = silent().await;
    let started = Instant::now();
    let error = McpTools::connect([McpServer::http("silent", url).connect_timeout(short)])
        .await
        .expect_err("never answers");
    assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
    assert!(
        matches!(source(&error), McpError::Timeout { server, .. } if server == "silent"),
        "{}",
        source(&error)
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // A process that never answers `initialize` (stdio).
    #[cfg(feature = "stdio")]
    {
        let started = Instant::now();
        let error = McpTools::connect([McpServer::stdio("sleeper", "sh")
            .args(["-c", "exec sleep 30"])
            .connect_timeout(short)])
        .await
        .expect_err("never answers");
        assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }

    // A server that answers `initialize` and never `tools/list`.
    let fake = Fake::start(Refusal::BadRequestWithoutId, OnCall::Answer).await;
    fake.state().hang_list = true;
    let started = Instant::now();
    let error = McpTools::connect([McpServer::http("fake", &fake.url).list_timeout(short)])
        .await
        .expect_err("never lists");
    assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
    assert!(
        matches!(source(&error), McpError::Timeout { .. }),
        "{}",
        source(&error)
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn one_server_down_does_not_fail_the_others() {
    let Some(everything) = everything() else {
        return;
    };
    let port = free_port();
    let _served = serve(&everything, port).await;
    let down = free_port();
    let (silent_url, _silent) = silent().await;
    let servers = || {
        let mut servers = vec![
            McpServer::http("up", format!("http://127.0.0.1:{port}/mcp")),
            McpServer::http("down", format!("http://127.0.0.1:{down}/mcp")),
            McpServer::http("silent", silent_url.clone())
                .connect_timeout(Duration::from_millis(500)),
        ];
        servers.extend(missing());
        servers
    };
    let started = Instant::now();
    let tools = McpTools::connect(servers())
        .await
        .expect("the server that is up is enough");
    // At once: the silent server's timeout, not the sum of them all.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let names: Vec<String> = tools.tool_specs().iter().map(|s| s.name.clone()).collect();
    assert!(names.contains(&"echo".to_owned()), "{names:?}");
    assert_eq!(tools.server_of("echo"), Some(("up", "echo".to_owned())));
    let unavailable: Vec<(String, ErrorKind)> = tools
        .unavailable()
        .into_iter()
        .map(|u| (u.server, u.error.kind()))
        .collect();
    let mut expected = vec![
        ("down".to_owned(), ErrorKind::Backend),
        ("silent".to_owned(), ErrorKind::Timeout),
    ];
    expected.extend(missing().map(|_| ("missing".to_owned(), ErrorKind::Backend)));
    assert_eq!(unavailable, expected);
    let echo = tools
        .clone()
        .oneshot(call("c1", "echo", json!({"message": "still"})))
        .await
        .expect("an answer");
    assert!(
        echo.result.content.contains("still"),
        "{}",
        echo.result.content
    );

    // A server that must be there fails the connect.
    let mut strict = servers();
    strict[1] = McpServer::http("down", format!("http://127.0.0.1:{down}/mcp")).required(true);
    let error = McpTools::connect(strict)
        .await
        .expect_err("`down` is required");
    assert!(
        matches!(source(&error), McpError::Connect { server, .. } if server == "down"),
        "{}",
        source(&error)
    );

    // No server at all: nothing to offer is an error.
    let error = McpTools::connect([McpServer::http(
        "down",
        format!("http://127.0.0.1:{down}/mcp"),
    )])
    .await
    .expect_err("nothing connects");
    assert!(
        matches!(source(&error), McpError::Connect { .. }),
        "{}",
        source(&error)
    );

    // The server comes up: `refresh` connects it and offers its tools.
    let _later = serve(&everything, down).await;
    tools.refresh().await.expect("refreshed");
    let names: Vec<String> = tools.tool_specs().iter().map(|s| s.name.clone()).collect();
    assert!(
        names.contains(&"up_echo".to_owned()) && names.contains(&"down_echo".to_owned()),
        "{names:?}"
    );
    let still: Vec<String> = tools.unavailable().into_iter().map(|u| u.server).collect();
    let mut expected = vec!["silent".to_owned()];
    expected.extend(missing().map(|_| "missing".to_owned()));
    assert_eq!(still, expected);
}

/// A stdio server whose program does not exist (with the `stdio` feature).
fn missing() -> Option<McpServer> {
    #[cfg(feature = "stdio")]
    {
        Some(McpServer::stdio("missing", "/nonexistent/mcp-server"))
    }
    #[cfg(not(feature = "stdio"))]
    {
        None
    }
}

#[tokio::test]
async fn a_call_whose_answer_was_lost_is_not_sent_again() {
    let fake = Fake::start(Refusal::BadRequestWithoutId, OnCall::Drop).await;
    let tools = McpTools::connect([McpServer::http("fake", &fake.url)])
        .await
        .expect("connects");
    let error = shout(&tools, "c1").await.expect_err("no answer");
    assert_eq!(error.kind(), ErrorKind::Backend, "{error}");
    assert!(
        matches!(source(&error), McpError::Lost { .. }),
        "{}",
        source(&error)
    );
    assert_eq!(fake.state().calls_received, 1, "sent once: {error}");

    // The server answers again: the next call connects again and is answered.
    fake.state().on_call = OnCall::Answer;
    assert_eq!(shout(&tools, "c2").await.expect("answered"), "C2");
    let state = fake.state();
    assert_eq!(state.calls_received, 2);
    assert_eq!(state.calls_run, 1);
    assert_eq!(tools.tool_specs().len(), 1);
}

/// A call whose answer was lost is sent again only to a tool of a trusted server that says a
/// second call changes nothing (`idempotentHint`, or `readOnlyHint`), and with the same key,
/// so that a server that keys its effects runs it once.
#[tokio::test]
async fn a_lost_answer_is_asked_again_only_of_an_idempotent_tool_with_the_same_key() {
    for (annotations, again) in [
        (json!({"idempotentHint": true}), true),
        (json!({"readOnlyHint": true}), true),
        (json!({"destructiveHint": false}), false),
        (Value::Null, false),
    ] {
        let fake = Fake::start(Refusal::BadRequestWithoutId, OnCall::RunThenDropOnce).await;
        fake.state().annotations = annotations.clone();
        let tools = McpTools::connect([McpServer::http("fake", &fake.url).trust_hints(true)])
            .await
            .expect("connects");
        let spec = &tools.tool_specs()[0];
        assert_eq!(spec.may_repeat(), again, "{annotations}");
        let answer = shout(&tools, "c1").await;
        let state = fake.state();
        assert_eq!(
            state.calls_run, 1,
            "{annotations}: the effect happened once"
        );
        if again {
            assert_eq!(answer.expect("answered the second time"), "C1");
            assert_eq!(state.calls_received, 2, "{annotations}");
            let key = Some(key_of("c1").to_string());
            assert_eq!(state.keys, [key.clone(), key]);
        } else {
            let error = answer.expect_err("the outcome is unknown");
            assert!(matches!(source(&error), McpError::Lost { .. }), "{error}");
            assert_eq!(state.calls_received, 1, "{annotations}: never sent again");
            assert_eq!(state.keys, [Some(key_of("c1").to_string())]);
        }
    }
}

/// The same hints from a server the host does not trust: the call is never sent again.
#[tokio::test]
async fn a_lost_answer_is_never_asked_again_of_a_server_not_trusted() {
    let fake = Fake::start(Refusal::BadRequestWithoutId, OnCall::RunThenDropOnce).await;
    fake.state().annotations = json!({"idempotentHint": true, "readOnlyHint": true});
    let tools = McpTools::connect([McpServer::http("fake", &fake.url)])
        .await
        .expect("connects");
    let error = shout(&tools, "c1")
        .await
        .expect_err("the outcome is unknown");
    assert!(matches!(source(&error), McpError::Lost { .. }), "{error}");
    assert_eq!(fake.state().calls_received, 1);
}
