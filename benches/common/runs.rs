//! What the benches of many runs at once share (`memory`, `scale`): the model's answers, the
//! same work without an agent, and the process's peak memory.

use std::future::Future;

use tower_agent::prelude::*;

/// The bench's command line: `[mode] [numbers...]` (cargo's `--bench` left out): the mode
/// (`agent` by default) and the numbers after it, `None` where one is missing or unreadable.
pub(crate) fn args() -> (String, Vec<Option<u64>>) {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mode = args.next().unwrap_or_else(|| "agent".to_owned());
    (mode, args.map(|n| n.parse().ok()).collect())
}

/// A multi-threaded runtime with its drivers, as a host's.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The model's answer in `round` of `rounds`: one tool call, then text in the last round.
pub(crate) fn answer(round: u32, rounds: u32) -> ModelResponse {
    if round < rounds {
        ModelResponse::tool_calls([ToolCall::raw(format!("call_{round}"), "echo", "{}")])
    } else {
        ModelResponse::text("done")
    }
}

/// The same work without an agent: a session that appends each round's messages after
/// `wait` (the model's time).
pub(crate) async fn without_agent<F: Future<Output = ()>>(rounds: u32, wait: impl Fn() -> F) {
    let mut session = Session::new();
    session.history.push(Message::user("go"));
    for round in 1..=rounds {
        wait().await;
        let message = answer(round, rounds).message;
        let calls: Vec<ToolCall> = message.tool_calls().cloned().collect();
        session.history.push(message);
        for call in calls {
            session
                .history
                .push(Message::tool_result(ToolResult::success(&call, "ok")));
        }
    }
    assert_eq!(session.history.len(), 2 * rounds as usize);
}

/// The process's peak resident memory (`VmHWM`), in MiB.
pub(crate) fn peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}
