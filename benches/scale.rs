//! Many runs at once, against the bare tokio floor:
//! `cargo bench --bench scale -- [agent|floor] [runs] [rounds]`.
//!
//! Starts `runs` (10,000 by default) runs of `rounds` rounds (100) at once on a
//! multi-threaded runtime. A round is a model call that yields to the scheduler once and
//! answers with one tool call, and the tool's answer; the last answer is text. `floor` runs the
//! same tasks without an agent: each yields as often and appends the same messages to a
//! session. It prints the wall time and the process's peak resident memory; the ratio of the
//! two modes' times is what the agent costs over tokio itself. Run each mode in its own
//! process (the peak is the process's).

use std::time::Instant;

use tower::{ServiceExt, service_fn};
use tower_agent::DescribedTools;
use tower_agent::prelude::*;

fn answer(round: u32, rounds: u32) -> ModelResponse {
    if round < rounds {
        ModelResponse::tool_calls([ToolCall::raw(format!("call_{round}"), "echo", "{}")])
    } else {
        ModelResponse::text("done")
    }
}

async fn floor_run(rounds: u32) {
    let mut session = Session::new();
    session.history.push(Message::user("go"));
    for round in 1..=rounds {
        tokio::task::yield_now().await;
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

fn peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mode = args
        .first()
        .map(String::as_str)
        .unwrap_or("agent")
        .to_owned();
    let runs: usize = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(10_000);
    let rounds: u32 = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(100);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let started = Instant::now();
    runtime.block_on(async {
        let model = service_fn(move |req: ModelRequest| async move {
            tokio::task::yield_now().await;
            Ok::<_, Error>(answer(req.ctx.round(), rounds))
        });
        let tools = DescribedTools::none(service_fn(|req: ToolRequest| async move {
            Ok::<_, Error>(ToolResponse::success(&req.call, "ok"))
        }));
        let agent = Agent::builder().max_rounds(rounds + 1).build(model, tools);
        let mut tasks = Vec::with_capacity(runs);
        for _ in 0..runs {
            tasks.push(match mode.as_str() {
                "floor" => tokio::spawn(floor_run(rounds)),
                _ => {
                    let agent = agent.clone();
                    tokio::spawn(async move {
                        let res = agent
                            .oneshot(AgentRequest::new(Session::new(), "go"))
                            .await
                            .expect("the run completes");
                        assert_eq!(res.rounds, rounds);
                    })
                }
            });
        }
        for task in tasks {
            task.await.expect("no panic");
        }
    });
    println!(
        "{mode}: {runs} runs of {rounds} rounds at once: {:.2} s, peak {:.0} MiB",
        started.elapsed().as_secs_f64(),
        peak_mib()
    );
}
