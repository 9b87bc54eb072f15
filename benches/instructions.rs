//! A fixed workload for instruction counting with valgrind (`benches/instructions.sh`):
//! instruction counts do not move with the machine's load, unlike wall-clock time.
//!
//! `instructions <workload> <runs> <history>` runs `runs` runs of 100 rounds (one tool call
//! each) from a history of `history` messages. Workloads: `baseline` (setup only),
//! `reference` (the hand-written copy-on-write loop), `agent`, `agent_six_callbacks`.
//! Without arguments (as `cargo test --benches` runs it) it does one small run of each.

use std::future::ready;
use std::hint::black_box;
use std::sync::Arc;

use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_agent::prelude::*;
use tower_agent::{GenerationOptions, History, ModelRequest};

const ROUNDS: u32 = 100;

fn model_answer(round: u32) -> ModelResponse {
    ModelResponse::tool_calls([ToolCall::raw(format!("call_{round}"), "echo", "{}")])
}

fn tool_answer(call: &ToolCall) -> ToolResponse {
    ToolResponse::success(call, "ok")
}

fn history(len: usize) -> Vec<Message> {
    (0..len)
        .map(|i| Message::user(format!("question {i} with a little text")))
        .collect()
}

fn reference(mut messages: History) -> History {
    let ctx = RunContext::new();
    let tools: Arc<[ToolSpec]> = Arc::from(Vec::new());
    let options = GenerationOptions::default();
    for round in 1..=ROUNDS {
        let req = ModelRequest {
            system: None,
            messages: messages.clone(),
            tools: tools.clone(),
            options: options.clone(),
            ctx: ctx.with_round(round),
        };
        let res = black_box(model_answer(req.ctx.round()));
        drop(req);
        let call = res.message.tool_calls().next().cloned().expect("a call");
        messages.push(res.message);
        messages.push(Message::tool_result(tool_answer(&call).result));
    }
    messages
}

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
            vec!["baseline", "reference", "agent", "agent_six_callbacks"],
            1,
            10,
        ),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let model =
        service_fn(|req: ModelRequest| ready(Ok::<_, Error>(model_answer(req.ctx.round()))));
    let tools = service_fn(|req: ToolRequest| ready(Ok::<_, Error>(tool_answer(&req.call))));
    let bare = Agent::builder().max_rounds(ROUNDS).build(model, tools);
    let six = ServiceBuilder::new()
        .after_agent(|res: AgentResponse, _: RunContext| async move { Ok(Flow::Continue(res)) })
        .before_agent(|req: AgentRequest| async move { Ok(Flow::Continue(req)) })
        .service(
            Agent::builder().max_rounds(ROUNDS).build(
                ServiceBuilder::new()
                    .after_model(|res: ModelResponse, _: RunContext| async move {
                        Ok(Flow::Continue(res))
                    })
                    .before_model(|req: ModelRequest| async move { Ok(Flow::Continue(req)) })
                    .service(model),
                ServiceBuilder::new()
                    .after_tool(|res: ToolResponse, _: RunContext| async move {
                        Ok(Flow::Continue(res))
                    })
                    .before_tool(|req: ToolRequest| async move { Ok(Flow::Continue(req)) })
                    .service(tools),
            ),
        );
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
                "reference" => reference(req.session.history),
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
