//! A small HTTP/1.1 server on 127.0.0.1 for the provider tests: it answers each request with
//! the next canned response (recorded, real-shaped payloads from `tests/fixtures`) and
//! records what it received.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One canned response.
#[derive(Clone, Debug)]
pub struct Canned {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Canned {
    /// A JSON body with `status`.
    pub fn json(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.into(),
        }
    }

    /// A server-sent event stream (status 200).
    pub fn sse(body: impl Into<Vec<u8>>) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: body.into(),
        }
    }

    /// The fixture `name` under `tests/fixtures`, as JSON (`.json`) or SSE (`.sse`).
    pub fn fixture(name: &str) -> Self {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let body =
            std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
        if name.ends_with(".sse") {
            Self::sse(body)
        } else {
            Self::json(200, body)
        }
    }

    /// The same response with a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// One request the server received.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON request body")
    }
}

pub struct Server {
    pub url: String,
    received: Arc<Mutex<Vec<Received>>>,
    canned: Arc<Mutex<VecDeque<Canned>>>,
    connections: Arc<std::sync::atomic::AtomicUsize>,
}

/// How a server treats its connections.
#[derive(Clone, Copy)]
enum Mode {
    /// One answer, then the connection is closed.
    Close,
    /// Answers go chunked, the last chunk a moment after the data; the connection is kept.
    KeepAlive,
    /// One answer; the next request on the connection is read and not answered.
    OneAnswer,
    /// These bytes after the first request, then silence.
    Stall(&'static [u8]),
    /// After the first request, each piece after its pause (milliseconds), then the end.
    Trickle(&'static [(u64, &'static [u8])]),
}

impl Server {
    /// Start a server answering with `canned`, in order (then 500), one answer a connection.
    pub async fn start(canned: impl IntoIterator<Item = Canned>) -> Self {
        Self::serve(Mode::Close, canned).await
    }

    /// A server that keeps its connections open, as real ones do: each response body goes
    /// chunked, its last chunk a moment after the data (so a client that stops reading at the
    /// end of the data drops the connection).
    pub async fn keep_alive(canned: impl IntoIterator<Item = Canned>) -> Self {
        Self::serve(Mode::KeepAlive, canned).await
    }

    /// A server that keeps each connection for one answer: the next request on it is read
    /// and the connection closed without an answer, as a server that closes an idle kept
    /// connection just as the request goes out on it.
    pub async fn one_answer_per_connection(canned: impl IntoIterator<Item = Canned>) -> Self {
        Self::serve(Mode::OneAnswer, canned).await
    }

    /// A server that reads a request, sends `first` (a head and part of a body, or nothing)
    /// and nothing more, as a stopped process does.
    pub async fn stalling(first: &'static [u8]) -> Self {
        Self::serve(Mode::Stall(first), []).await
    }

    /// A server that reads a request and sends `pieces`, each after its pause in
    /// milliseconds, then closes the connection.
    pub async fn trickling(pieces: &'static [(u64, &'static [u8])]) -> Self {
        Self::serve(Mode::Trickle(pieces), []).await
    }

    async fn serve(mode: Mode, canned: impl IntoIterator<Item = Canned>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let server = Self {
            url: format!("http://{}", listener.local_addr().expect("addr")),
            received: Arc::default(),
            canned: Arc::new(Mutex::new(canned.into_iter().collect())),
            connections: Arc::default(),
        };
        let (r, c, n) = (
            server.received.clone(),
            server.canned.clone(),
            server.connections.clone(),
        );
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(connection(mode, socket, r.clone(), c.clone()));
            }
        });
        server
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }

    /// The connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Serve one connection in `mode`.
async fn connection(
    mode: Mode,
    mut socket: tokio::net::TcpStream,
    received: Arc<Mutex<Vec<Received>>>,
    canned: Arc<Mutex<VecDeque<Canned>>>,
) {
    let mut answered = 0;
    while let Some(request) = read_request(&mut socket).await {
        received.lock().expect("lock").push(request);
        let response = match mode {
            Mode::Stall(first) => {
                let _ = socket.write_all(first).await;
                let _ = socket.flush().await;
                // Held open, silent, until the client gives up.
                let mut sink = [0_u8; 64];
                while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
                return;
            }
            Mode::Trickle(pieces) => {
                for (pause, piece) in pieces {
                    tokio::time::sleep(std::time::Duration::from_millis(*pause)).await;
                    if socket.write_all(piece).await.is_err() || socket.flush().await.is_err() {
                        return;
                    }
                }
                let _ = socket.shutdown().await;
                return;
            }
            Mode::OneAnswer if answered == 1 => return,
            _ => canned.lock().expect("lock").pop_front().unwrap_or_else(|| {
                Canned::json(
                    500,
                    "{\"error\":{\"message\":\"no more canned responses\"}}",
                )
            }),
        };
        let framing = match mode {
            Mode::Close => "connection: close".to_owned(),
            Mode::KeepAlive => "transfer-encoding: chunked".to_owned(),
            _ => format!("content-length: {}", response.body.len()),
        };
        let mut head = format!("HTTP/1.1 {} Canned\r\n{framing}\r\n", response.status);
        for (name, value) in &response.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let written = async {
            socket.write_all(head.as_bytes()).await?;
            if let Mode::KeepAlive = mode {
                socket
                    .write_all(format!("{:x}\r\n", response.body.len()).as_bytes())
                    .await?;
                socket.write_all(&response.body).await?;
                socket.write_all(b"\r\n").await?;
                socket.flush().await?;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                socket.write_all(b"0\r\n\r\n").await?;
            } else {
                socket.write_all(&response.body).await?;
            }
            socket.flush().await
        };
        if written.await.is_err() {
            return;
        }
        answered += 1;
        if let Mode::Close = mode {
            let _ = socket.shutdown().await;
            return;
        }
    }
}

/// A model call: ready, then call.
pub async fn call(
    mut model: impl tower::Service<
        tower_agent_core::ModelRequest,
        Response = tower_agent_core::ModelResponse,
        Error = tower_agent_core::Error,
    >,
    req: tower_agent_core::ModelRequest,
) -> Result<tower_agent_core::ModelResponse, tower_agent_core::Error> {
    use tower::ServiceExt;
    model.ready().await?.call(req).await
}

async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<Received> {
    let mut buffer = Vec::new();
    let mut chunk = [0_u8; 4096];
    let head_end = loop {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path) = (first.next()?.to_owned(), first.next()?.to_owned());
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buffer[head_end..].to_vec();
    while body.len() < length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Received {
        method,
        path,
        headers,
        body,
    })
}
