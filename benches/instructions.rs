//! A fixed workload for instruction counting with valgrind (`benches/instructions.sh`):
//! instruction counts do not move with the machine's load, unlike wall-clock time.
//!
//! `instructions <workload> <runs> <history>` runs `runs` runs of 100 rounds (one tool call
//! each) from a history of `history` messages. Workloads: `baseline` (setup only),
//! `reference` (the hand-written copy-on-write loop), `agent`, `agent_six_callbacks`,
//! `agent_patch_instructions` (patching at the agent and the model, one instruction block),
//! `agent_history_stack` (that, plus summarization that does not trigger and eviction of
//! small tool results).
//! Without arguments (as `cargo test --benches` runs it) it does one small run of each.

use std::future::ready;
use std::hint::black_box;
use tower_agent::DescribedTools;
use tower_agent::layers::PatchDanglingLayer;

use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_agent::ModelRequest;
use tower_agent::prelude::*;

mod common;

use common::{
    Handoff, ROUNDS, history, model_answer, reference, tool_answer, with_builtins,
    with_history_stack,
};

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let (workloads, runs, len): (Vec<&str>, usize, usize) = match args.as_slice() {
        [w, runs, len] => (
            vec![w.as_str()],
            runs.parse().expect("runs"),
            len.parse().expect("history length"),
        ),
        _ => (
            vec![
                "baseline",
                "reference",
                "agent",
                "agent_six_callbacks",
                "agent_patch_instructions",
                "agent_builtins_boxed",
                "agent_history_stack",
            ],
            1,
            10,
        ),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let model =
        service_fn(|req: ModelRequest| ready(Ok::<_, Error>(model_answer(req.ctx.round()))));
    let tools = DescribedTools::none(service_fn(|req: ToolRequest| {
        ready(Ok::<_, Error>(tool_answer(&req.call)))
    }));
    let bare = Agent::builder()
        .max_rounds(ROUNDS)
        .build(model, tools.clone());
    let six = ServiceBuilder::new()
        .after_agent(|res: AgentResponse, _: RunContext| async move { Ok(res) })
        .before_agent(|req: AgentRequest| async move { Ok(Flow::Continue(req)) })
        .service(
            Agent::builder().max_rounds(ROUNDS).build(
                ServiceBuilder::new()
                    .after_model(|res: ModelResponse, _: RunContext| async move { Ok(res) })
                    .before_model(|req: ModelRequest| async move { Ok(Flow::Continue(req)) })
                    .service(model),
                ServiceBuilder::new()
                    .after_tool(|res: ToolResponse, _: RunContext| async move { Ok(res) })
                    .before_tool(|req: ToolRequest| async move { Ok(Flow::Continue(req)) })
                    .service(tools.clone()),
            ),
        );
    let builtins = with_builtins(model, tools.clone());
    // The same built-ins placed by the builder: every layer boxed.
    let boxed = Agent::builder()
        .max_rounds(ROUNDS)
        .with(PatchDanglingLayer::new())
        .with(tower_agent::layers::InstructionsLayer::from("Be brief."))
        .build(model, tools.clone());
    let history_stack = with_history_stack(model, tools);
    for workload in workloads {
        // Setup, counted in every workload alike: fresh sessions, so no run copies another's.
        let requests: Vec<AgentRequest> = (0..runs)
            .map(|_| {
                AgentRequest::new(
                    Session::new().with_history(history(len)),
                    AgentInput::Continue,
                )
            })
            .collect();
        let mut kept = Vec::with_capacity(runs);
        for req in requests {
            let history = match workload {
                "baseline" => req.session.history,
                "reference" => reference(req.session.history, Handoff::Shared),
                "agent" => {
                    rt.block_on(bare.clone().oneshot(req))
                        .expect("run")
                        .session
                        .history
                }
                "agent_six_callbacks" => {
                    rt.block_on(six.clone().oneshot(req))
                        .expect("run")
                        .session
                        .history
                }
                "agent_patch_instructions" => {
                    rt.block_on(builtins.clone().oneshot(req))
                        .expect("run")
                        .session
                        .history
                }
                "agent_builtins_boxed" => {
                    rt.block_on(boxed.clone().oneshot(req))
                        .expect("run")
                        .session
                        .history
                }
                "agent_history_stack" => {
                    rt.block_on(history_stack.clone().oneshot(req))
                        .expect("run")
                        .session
                        .history
                }
                other => panic!("unknown workload {other}"),
            };
            kept.push(history);
        }
        if workload != "baseline" {
            assert!(kept.iter().all(|h| h.len() == len + 2 * ROUNDS as usize));
        }
        black_box(kept);
    }
}
