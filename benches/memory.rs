//! Memory per concurrent run: `cargo bench --bench memory -- [agent|baseline] [runs]`.
//!
//! Starts `runs` (100,000 by default) runs at once on a multi-threaded runtime. Each has 10
//! rounds of a model that answers after 200 ms with one tool call, and a tool that answers at
//! once; the tenth answer is text. `baseline` runs the same tasks without an agent: each holds
//! a session and appends the same messages after the same sleeps. It prints the process's
//! peak resident memory (`VmHWM`); the difference, divided by the runs, is what the agent
//! costs per run. Run each mode in its own process (the peak is the process's).

#[path = "common/runs.rs"]
mod runs;

use std::time::{Duration, Instant};
use tower::Service;
use tower_agent::DescribedTools;

use tower::{ServiceExt, service_fn};
use tower_agent::prelude::*;

const ROUNDS: u32 = 10;
const THINK: Duration = Duration::from_millis(200);

async fn agent_run(agent: impl Service<AgentRequest, Response = AgentResponse, Error = Error>) {
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .expect("the run completes");
    assert_eq!(res.rounds, ROUNDS);
}

fn main() {
    let (mode, numbers) = runs::args();
    let runs = numbers
        .first()
        .copied()
        .flatten()
        .map_or(100_000, |n| n as usize);
    let runtime = runs::runtime();
    let started = Instant::now();
    runtime.block_on(async {
        let model = service_fn(|req: ModelRequest| async move {
            tokio::time::sleep(THINK).await;
            Ok::<_, Error>(runs::answer(req.ctx.round(), ROUNDS))
        });
        let tools = DescribedTools::none(service_fn(|req: ToolRequest| async move {
            Ok::<_, Error>(ToolResponse::success(&req.call, "ok"))
        }));
        let agent = Agent::builder().max_rounds(ROUNDS + 1).build(model, tools);
        let mut tasks = Vec::with_capacity(runs);
        for _ in 0..runs {
            tasks.push(match mode.as_str() {
                "baseline" => {
                    tokio::spawn(runs::without_agent(ROUNDS, || tokio::time::sleep(THINK)))
                }
                _ => tokio::spawn(agent_run(agent.clone())),
            });
        }
        for task in tasks {
            task.await.expect("no panic");
        }
    });
    let peak = runs::peak_mib();
    println!(
        "{mode}: {runs} concurrent runs of {ROUNDS} rounds, peak {peak:.0} MiB ({:.0} bytes per run), {:.1} s",
        peak * 1024.0 * 1024.0 / runs as f64,
        started.elapsed().as_secs_f64()
    );
}
