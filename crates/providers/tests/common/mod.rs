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

impl Server {
    /// Start a server answering with `canned`, in order (then 500).
    pub async fn start(canned: impl IntoIterator<Item = Canned>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let canned = Arc::new(Mutex::new(canned.into_iter().collect::<VecDeque<_>>()));
        let (r, c) = (received.clone(), canned.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let (r, c) = (r.clone(), c.clone());
                tokio::spawn(async move {
                    let Some(request) = read_request(&mut socket).await else {
                        return;
                    };
                    r.lock().expect("lock").push(request);
                    let response = c.lock().expect("lock").pop_front().unwrap_or_else(|| {
                        Canned::json(
                            500,
                            "{\"error\":{\"message\":\"no more canned responses\"}}",
                        )
                    });
                    let mut head = format!(
                        "HTTP/1.1 {} Canned\r\nconnection: close\r\n",
                        response.status
                    );
                    for (name, value) in &response.headers {
                        head.push_str(&format!("{name}: {value}\r\n"));
                    }
                    head.push_str("\r\n");
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(&response.body).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Self {
            url,
            received,
            canned,
            connections: Arc::default(),
        }
    }

    /// A server that keeps its connections open, as real ones do: each response body goes
    /// chunked, its last chunk a moment after the data (so a client that stops reading at the
    /// end of the data drops the connection); it counts the connections it accepted.
    pub async fn keep_alive(canned: impl IntoIterator<Item = Canned>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let canned = Arc::new(Mutex::new(canned.into_iter().collect::<VecDeque<_>>()));
        let connections: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let (r, c, n) = (received.clone(), canned.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (r, c) = (r.clone(), c.clone());
                tokio::spawn(async move {
                    while let Some(request) = read_request(&mut socket).await {
                        r.lock().expect("lock").push(request);
                        let response = c.lock().expect("lock").pop_front().unwrap_or_else(|| {
                            Canned::json(500, "{\"error\":{\"message\":\"no more\"}}")
                        });
                        let mut head = format!(
                            "HTTP/1.1 {} Canned\r\ntransfer-encoding: chunked\r\n",
                            response.status
                        );
                        for (name, value) in &response.headers {
                            head.push_str(&format!("{name}: {value}\r\n"));
                        }
                        head.push_str("\r\n");
                        let chunk = format!("{:x}\r\n", response.body.len());
                        let written = async {
                            socket.write_all(head.as_bytes()).await?;
                            socket.write_all(chunk.as_bytes()).await?;
                            socket.write_all(&response.body).await?;
                            socket.write_all(b"\r\n").await?;
                            socket.flush().await?;
                            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                            socket.write_all(b"0\r\n\r\n").await?;
                            socket.flush().await
                        };
                        if written.await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self {
            url,
            received,
            canned,
            connections,
        }
    }

    /// A server that keeps each connection for one answer: the next request on it is read
    /// and the connection closed without an answer, as a server that closes an idle kept
    /// connection just as the request goes out on it.
    pub async fn one_answer_per_connection(canned: impl IntoIterator<Item = Canned>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let canned = Arc::new(Mutex::new(canned.into_iter().collect::<VecDeque<_>>()));
        let connections: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let (r, c, n) = (received.clone(), canned.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (r, c) = (r.clone(), c.clone());
                tokio::spawn(async move {
                    let Some(request) = read_request(&mut socket).await else {
                        return;
                    };
                    r.lock().expect("lock").push(request);
                    let response = c.lock().expect("lock").pop_front().unwrap_or_else(|| {
                        Canned::json(500, "{\"error\":{\"message\":\"no more\"}}")
                    });
                    let mut head = format!(
                        "HTTP/1.1 {} Canned\r\ncontent-length: {}\r\n",
                        response.status,
                        response.body.len()
                    );
                    for (name, value) in &response.headers {
                        head.push_str(&format!("{name}: {value}\r\n"));
                    }
                    head.push_str("\r\n");
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(&response.body).await;
                    // The next request on this connection is read, and not answered.
                    if let Some(request) = read_request(&mut socket).await {
                        r.lock().expect("lock").push(request);
                    }
                });
            }
        });
        Self {
            url,
            received,
            canned,
            connections,
        }
    }

    /// A server that accepts connections and reads requests, then sends `first` (a head and
    /// part of a body, or nothing) and nothing more, as a stopped process does.
    pub async fn stalling(first: &'static [u8]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let connections: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let (r, n) = (received.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let r = r.clone();
                tokio::spawn(async move {
                    if let Some(request) = read_request(&mut socket).await {
                        r.lock().expect("lock").push(request);
                        let _ = socket.write_all(first).await;
                        let _ = socket.flush().await;
                        // Held open, silent, until the client gives up.
                        let mut sink = [0_u8; 64];
                        while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
                    }
                });
            }
        });
        Self {
            url,
            received,
            canned: Arc::default(),
            connections,
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }

    /// The connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
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
