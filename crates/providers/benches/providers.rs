//! What a provider costs on top of the bytes it sends and reads.
//!
//! - `encode/*`: the request body for a history of 10 and 1,000 messages (user and assistant
//!   text, tool calls and results), next to two floors: `serde_json::to_vec` of the same JSON
//!   document held as a `Value`, and a plain copy of its bytes. `*_cold` is a run's first
//!   request (a fresh context: every message encoded, and kept); `*_warm` a later round (the
//!   same context, the history grown by two messages: two encoded, the rest reused).
//! - `decode/*`: a recorded streamed answer of 2,000 text chunks and 3 tool calls, next to
//!   `serde_json` parsing each chunk's data as a `Value` (the floor).
//! - `sse/*`: split into events by `eventsource-stream` (nothing decoded), delivered in one
//!   read, as a fast server's burst arrives: the server-sent events of that answer (430 KB of
//!   short lines), and one event whose data line is 1 MB (a tool call written whole). Fed
//!   the read whole (how the live path read a stream before), in blind pieces of 8 KiB and
//!   1 KiB, and in pieces of at least 1 KiB that end at a line's end (what the providers do
//!   now: `pieces` in `src/http.rs`).
//!
//! Run: `cargo bench -p tower-agent-providers --bench providers`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use tower_agent_core::{
    History, Message, ModelRequest, RunContext, ToolCall, ToolResult, ToolSpec,
};
use tower_agent_providers::{Anthropic, Gemini, OpenAi};

fn history(len: usize) -> Vec<Message> {
    (0..len)
        .map(|i| match i % 4 {
            0 => Message::user(format!("question {i}: what is in the file number {i}, and why does it matter?")),
            1 => Message::assistant_with_calls(
                "Let me look.",
                [ToolCall::new(format!("call_{i}"), "read_file", json!({ "path": format!("src/file_{i}.rs") }))],
            ),
            2 => Message::tool_result(ToolResult::success(
                &ToolCall::new(format!("call_{}", i - 1), "read_file", json!({})),
                format!("fn main() {{\n    println!(\"file {i}\");\n}}\n").repeat(4),
            )),
            _ => Message::assistant(format!("File {i} prints its number; it matters because the build uses it. \"Quoted\" text too.")),
        })
        .collect()
}

fn request(len: usize) -> ModelRequest {
    let mut req = ModelRequest::new(history(len));
    req.system = Some("You are a careful coding assistant.".into());
    req.tools = Arc::from(vec![ToolSpec::new(
        "read_file",
        "Read a file.",
        json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
    )]);
    req
}

/// 2,000 text chunks and 3 tool calls, as Chat Completions streams them.
fn openai_stream() -> Vec<u8> {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1731900000, "model": "gpt-4o-mini",
                   "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
        )
    };
    let mut body = String::new();
    for i in 0..2000 {
        body.push_str(&chunk(json!({"content": format!(" tok{i}")}), Value::Null));
    }
    for call in 0..3 {
        body.push_str(&chunk(
            json!({"tool_calls": [{"index": call, "id": format!("call_{call}"), "type": "function", "function": {"name": "read_file", "arguments": ""}}]}),
            Value::Null,
        ));
        for piece in ["{\"pa", "th\": \"src/", "main.rs\"}"] {
            body.push_str(&chunk(
                json!({"tool_calls": [{"index": call, "function": {"arguments": piece}}]}),
                Value::Null,
            ));
        }
    }
    body.push_str(&chunk(json!({}), json!("tool_calls")));
    body.push_str("data: [DONE]\n\n");
    body.into_bytes()
}

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("encode");
    let openai = OpenAi::new("gpt-4o-mini");
    let anthropic = Anthropic::new("claude-sonnet-4-5");
    let gemini = Gemini::new("gemini-2.5-flash");
    for len in [10_usize, 1000] {
        let req = request(len);
        let body = openai.request_body(&req).expect("encodes");
        let value: Value = serde_json::from_slice(&body).expect("JSON");
        macro_rules! provider {
            ($name:literal, $model:expr) => {
                group.bench_with_input(
                    BenchmarkId::new(concat!($name, "_cold"), len),
                    &req,
                    |b, req| {
                        b.iter(|| {
                            let mut req = req.clone();
                            req.ctx = RunContext::new();
                            $model.request_body(black_box(&req)).expect("encodes")
                        })
                    },
                );
                // Two rounds of one run, in turn: the longer one (the shorter one, grown by
                // two messages, as a run's history grows) re-encodes its last two messages.
                let shorter = {
                    let mut shorter = req.clone();
                    shorter.messages = History::from(req.messages[..len - 2].to_vec());
                    shorter
                };
                let longer = {
                    let mut longer = shorter.clone();
                    longer
                        .messages
                        .extend(req.messages[len - 2..].iter().cloned());
                    longer
                };
                let mut round = 0_usize;
                group.bench_with_input(
                    BenchmarkId::new(concat!($name, "_warm"), len),
                    &req,
                    |b, _| {
                        b.iter(|| {
                            round += 1;
                            let req = if round % 2 == 0 { &longer } else { &shorter };
                            $model.request_body(black_box(req)).expect("encodes")
                        })
                    },
                );
            };
        }
        provider!("openai", openai);
        provider!("anthropic", anthropic);
        provider!("gemini", gemini);
        group.bench_with_input(
            BenchmarkId::new("serde_value_floor", len),
            &value,
            |b, value| b.iter(|| serde_json::to_vec(black_box(value)).expect("encodes")),
        );
        group.bench_with_input(BenchmarkId::new("copy_floor", len), &body, |b, body| {
            b.iter(|| black_box(body).to_vec())
        });
    }
    group.finish();
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode");
    let body = openai_stream();
    let openai = OpenAi::new("gpt-4o-mini");
    let res = openai.parse_response(&body).expect("a whole answer");
    assert_eq!(res.message.tool_calls().count(), 3);
    group.bench_function("openai_stream_2000_chunks_3_calls", |b| {
        b.iter(|| openai.parse_response(black_box(&body)).expect("parses"))
    });
    let text = String::from_utf8(body.clone()).expect("utf-8");
    group.bench_function("serde_value_floor", |b| {
        b.iter(|| {
            black_box(&text)
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .map(|d| serde_json::from_str::<Value>(d).expect("JSON"))
                .filter(|chunk| chunk.is_object())
                .count()
        })
    });
    group.finish();
}

/// How a read is cut before the parser gets it.
#[derive(Clone, Copy)]
enum Cut {
    /// Pieces of this many bytes, wherever they fall.
    Blind(usize),
    /// Pieces of at least this many bytes, each ending at a line's end (the rule of `pieces`
    /// in `src/http.rs`).
    AtLines(usize),
}

fn cut(body: &bytes::Bytes, how: Cut) -> Vec<bytes::Bytes> {
    match how {
        Cut::Blind(piece) => (0..body.len())
            .step_by(piece)
            .map(|at| body.slice(at..body.len().min(at + piece)))
            .collect(),
        Cut::AtLines(piece) => {
            let mut out = Vec::new();
            let mut start = 0;
            while body.len() - start > piece {
                match body[start + piece..].iter().position(|&b| b == b'\n') {
                    Some(at) => {
                        out.push(body.slice(start..start + piece + at + 1));
                        start += piece + at + 1;
                    }
                    None => break,
                }
            }
            if start < body.len() {
                out.push(body.slice(start..));
            }
            out
        }
    }
}

/// Split `body`, delivered as one read, into events, feeding the parser the pieces `how`
/// cuts; returns how many events there were.
fn split(body: &bytes::Bytes, how: Cut) -> usize {
    use eventsource_stream::Eventsource;
    use futures_util::{FutureExt, StreamExt};
    let reads = futures_util::stream::iter(
        cut(body, how)
            .into_iter()
            .map(Ok::<_, std::convert::Infallible>),
    );
    let mut events = reads.eventsource();
    let mut n = 0;
    while let Some(Some(event)) = events.next().now_or_never() {
        black_box(event.expect("an event"));
        n += 1;
    }
    n
}

fn sse(c: &mut Criterion) {
    let mut group = c.benchmark_group("sse");
    let short_lines = bytes::Bytes::from(openai_stream());
    let long_line = bytes::Bytes::from(format!(
        "data: {}\n\ndata: [DONE]\n\n",
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1",
               "function": {"name": "write_file", "arguments": "x".repeat(1 << 20)}}]}}]})
    ));
    for (body, name) in [(&short_lines, "short_lines"), (&long_line, "long_line")] {
        let events = split(body, Cut::Blind(body.len()));
        for (how, cut) in [
            ("one_read_whole", Cut::Blind(body.len())),
            ("blind_8k", Cut::Blind(8 * 1024)),
            ("blind_1k", Cut::Blind(1024)),
            ("at_lines_1k", Cut::AtLines(1024)),
        ] {
            assert_eq!(split(body, cut), events);
            group.bench_function(format!("{name}/{how}"), |b| {
                b.iter(|| split(black_box(body), cut))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, encode, decode, sse);
criterion_main!(benches);
