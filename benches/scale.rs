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

#[path = "common/runs.rs"]
mod runs;

use std::time::Instant;

use tower::{ServiceExt, service_fn};
use tower_agent::DescribedTools;
use tower_agent::prelude::*;

fn main() {
    let (mode, numbers) = runs::args();
    let number = |i: usize| numbers.get(i).copied().flatten();
    let runs = number(0).map_or(10_000, |n| n as usize);
    let rounds = number(1).map_or(100, |n| n as u32);
    let runtime = runs::runtime();
    let started = Instant::now();
    runtime.block_on(async {
        let model = service_fn(move |req: ModelRequest| async move {
            tokio::task::yield_now().await;
            Ok::<_, Error>(runs::answer(req.ctx.round(), rounds))
        });
        let tools = DescribedTools::none(service_fn(|req: ToolRequest| async move {
            Ok::<_, Error>(ToolResponse::success(&req.call, "ok"))
        }));
        let agent = Agent::builder().max_rounds(rounds + 1).build(model, tools);
        let mut tasks = Vec::with_capacity(runs);
        for _ in 0..runs {
            tasks.push(match mode.as_str() {
                "floor" => tokio::spawn(runs::without_agent(rounds, tokio::task::yield_now)),
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
        runs::peak_mib()
    );
}
