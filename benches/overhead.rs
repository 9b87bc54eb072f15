//! What tower-agent costs on top of the services it drives.
//!
//! - `layer/*`: one model call through a pass-through callback layer vs the bare stub, polled
//!   once with no runtime; `around_model_pass_through` is the closure form (boxed `next`),
//!   `around_strategy_pass_through` an `AroundCallback` implemented by hand (nothing boxed).
//! - `loop/*`: a 100-round run, one tool call per round, on stub services, starting from a
//!   history of 10 or 1,000 messages; next to two hand-written reference loops (history shared
//!   copy-on-write, and history cloned every round). Divide by 100 for the per-round cost.
//!   `loop/agent_streaming` spawns the run with its event stream and a reader that drains it.
//!   `loop/agent_patch_instructions` adds the first built-ins: `PatchDanglingLayer` at the agent
//!   and the model, and one static instruction block. `loop/agent_human_control` adds the
//!   human-control layers on a run that never needs a human: an approval gate on a tool that
//!   is never called, call limits (model calls per run; tool calls per run, and `echo` calls
//!   per run and per session) and the checkpoint's counter (every 1,000 calls, never reached).
//!   `loop/agent_history_stack` adds the context-management stack on a run that never needs
//!   it: patching at the agent and the model, one instruction block, summarization that does
//!   not trigger, and eviction of (small) tool results.
//! - `workflow/*`: 10 iterations of a coder and a reviewer (stub models answering at once),
//!   judged after each: run by hand (two agents and a judge call per iteration) and as a
//!   `Loop` of a `Sequential`. Divide the difference by 10 for the workflow's cost per
//!   iteration.
//!
//! Run: `cargo bench --bench overhead`.

use std::future::{Future, ready};
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use tower_agent::AroundCallback;
use tower_agent::AroundLayer;
use tower_agent::ModelNext;
use tower_agent::Next;
use tower_agent::ObserveLayer;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use tower::layer::util::Identity;
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};
use tower_agent::prelude::*;
use tower_agent::{History, ModelRequest, NextFuture};

mod common;

use common::{
    Handoff, ROUNDS, history, reference, request, stub_model, stub_tools, with_builtins,
    with_history_stack,
};

fn poll_once<F: Future>(future: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("stubs complete at once"),
    }
}

// ------------------------------------------------------------------- layer micro-benchmarks

fn layer(c: &mut Criterion) {
    let mut group = c.benchmark_group("layer");
    let template = ModelRequest::new(history(10));
    let answer = |_req: ModelRequest| ready(Ok::<_, Error>(ModelResponse::text("hi")));

    let mut bare = service_fn(answer);
    group.bench_function("bare_service_fn", |b| {
        b.iter(|| poll_once(bare.call(black_box(template.clone()))))
    });

    let mut identity = Identity::new().layer(service_fn(answer));
    group.bench_function("tower_identity", |b| {
        b.iter(|| poll_once(identity.call(black_box(template.clone()))))
    });

    let mut before = before_model(|req: ModelRequest| async move { Ok(Flow::Continue(req)) })
        .layer(service_fn(answer));
    group.bench_function("before_model_pass_through", |b| {
        b.iter(|| {
            let _ = before.poll_ready(&mut Context::from_waker(Waker::noop()));
            poll_once(before.call(black_box(template.clone())))
        })
    });

    let mut after = after_model(|res: ModelResponse, _: RunContext| async move { Ok(res) })
        .layer(service_fn(answer));
    group.bench_function("after_model_pass_through", |b| {
        b.iter(|| poll_once(after.call(black_box(template.clone()))))
    });

    let mut around =
        around_model(|req: ModelRequest, next: ModelNext| async move { next.oneshot(req).await })
            .layer(service_fn(answer));
    group.bench_function("around_model_pass_through", |b| {
        b.iter(|| {
            let _ = around.poll_ready(&mut Context::from_waker(Waker::noop()));
            poll_once(around.call(black_box(template.clone())))
        })
    });

    let mut strategy = AroundLayer::new(PassThrough).layer(service_fn(answer));
    group.bench_function("around_strategy_pass_through", |b| {
        b.iter(|| {
            let _ = strategy.poll_ready(&mut Context::from_waker(Waker::noop()));
            poll_once(strategy.call(black_box(template.clone())))
        })
    });

    let mut stack = ServiceBuilder::new()
        .observe(ObserveLayer::new())
        .after_model(|res: ModelResponse, _: RunContext| async move { Ok(res) })
        .before_model(|req: ModelRequest| async move { Ok(Flow::Continue(req)) })
        .service(service_fn(answer));
    group.bench_function("observe_after_before_stack", |b| {
        b.iter(|| {
            let _ = stack.poll_ready(&mut Context::from_waker(Waker::noop()));
            poll_once(stack.call(black_box(template.clone())))
        })
    });
    group.finish();
}

/// An around callback that only calls `next`, written as a strategy (nothing boxed).
#[derive(Clone, Copy)]
struct PassThrough;

impl<S: Service<ModelRequest>> AroundCallback<S, ModelRequest> for PassThrough {
    type Future = NextFuture<S, ModelRequest>;

    fn around(&mut self, req: ModelRequest, next: Next<S>) -> Self::Future {
        next.oneshot(req)
    }
}

// ------------------------------------------------------------------------- loop benchmarks

fn agent_loop(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let mut group = c.benchmark_group("loop");

    let bare = Agent::builder()
        .max_rounds(ROUNDS)
        .build(stub_model(), stub_tools());

    let model = ServiceBuilder::new()
        .after_model(|res: ModelResponse, _: RunContext| async move { Ok(res) })
        .before_model(|req: ModelRequest| async move { Ok(Flow::Continue(req)) })
        .service(stub_model());
    let tools = ServiceBuilder::new()
        .after_tool(|res: ToolResponse, _: RunContext| async move { Ok(res) })
        .before_tool(|req: ToolRequest| async move { Ok(Flow::Continue(req)) })
        .service(stub_tools());
    let six = ServiceBuilder::new()
        .after_agent(|res: AgentResponse, _: RunContext| async move { Ok(res) })
        .before_agent(|req: AgentRequest| async move { Ok(Flow::Continue(req)) })
        .service(Agent::builder().max_rounds(ROUNDS).build(model, tools));

    let builtins = with_builtins(stub_model(), stub_tools());
    let history_stack = with_history_stack(stub_model(), stub_tools());

    let human = {
        use tower_agent::layers::approval::{ApprovalLayer, Gate};
        use tower_agent::layers::checkpoint::{CheckpointLayer, human_fn};
        use tower_agent::layers::limits::{CallLimitsLayer, Limit};
        let limits = CallLimitsLayer::new()
            .model_calls(Limit::per_run(1_000))
            .tool_calls(Limit::per_run(1_000))
            .tool("echo", Limit::per_run(1_000).and_per_session(1_000_000));
        let approval = ApprovalLayer::builder()
            .gate("rm", Gate::new())
            .build()
            .expect("valid");
        let checkpoint = CheckpointLayer::inline(human_fn(|_, _| async { Ok(true) })).every(1_000);
        let model = ServiceBuilder::new()
            .layer(limits.clone())
            .service(stub_model());
        let tools = ServiceBuilder::new()
            .layer(limits)
            .layer(checkpoint)
            .layer(approval)
            .service(stub_tools());
        Agent::builder().max_rounds(ROUNDS).build(model, tools)
    };

    // The runs measured below really do 100 rounds with one tool call each.
    for agent_run in [
        rt.block_on(bare.clone().oneshot(request(10))),
        rt.block_on(six.clone().oneshot(request(10))),
        rt.block_on(builtins.clone().oneshot(request(10))),
        rt.block_on(human.clone().oneshot(request(10))),
        rt.block_on(history_stack.clone().oneshot(request(10))),
    ] {
        let res = agent_run.expect("the run");
        assert_eq!(res.rounds, ROUNDS);
        assert_eq!(res.session.history.len(), 10 + 2 * ROUNDS as usize);
    }
    assert_eq!(
        reference(History::from(history(10)), Handoff::Shared).len(),
        210
    );

    for len in [10_usize, 1000] {
        group.bench_with_input(BenchmarkId::new("reference_cow", len), &len, |b, &len| {
            b.iter_batched(
                || History::from(history(len)),
                |h| reference(h, Handoff::Shared),
                BatchSize::SmallInput,
            )
        });
        group.bench_with_input(BenchmarkId::new("reference_clone", len), &len, |b, &len| {
            b.iter_batched(
                || History::from(history(len)),
                |h| reference(h, Handoff::Cloned),
                BatchSize::SmallInput,
            )
        });
        group.bench_with_input(BenchmarkId::new("agent", len), &len, |b, &len| {
            b.iter_batched(
                || request(len),
                |req| rt.block_on(bare.clone().oneshot(req)).expect("the run"),
                BatchSize::SmallInput,
            )
        });
        group.bench_with_input(BenchmarkId::new("agent_streaming", len), &len, |b, &len| {
            b.iter_batched(
                || request(len),
                |req| {
                    rt.block_on(async {
                        let mut run = bare.clone().spawn(req);
                        let mut events = run.take_events().expect("the stream");
                        let reader = tokio::spawn(async move {
                            let mut n = 0_usize;
                            while events.recv().await.is_some() {
                                n += 1;
                            }
                            n
                        });
                        let res = run.join().await.expect("the run");
                        let events = reader.await.expect("the reader");
                        (res, events)
                    })
                },
                BatchSize::SmallInput,
            )
        });
        group.bench_with_input(
            BenchmarkId::new("agent_six_callbacks", len),
            &len,
            |b, &len| {
                b.iter_batched(
                    || request(len),
                    |req| rt.block_on(six.clone().oneshot(req)).expect("the run"),
                    BatchSize::SmallInput,
                )
            },
        );
        group.bench_with_input(
            BenchmarkId::new("agent_human_control", len),
            &len,
            |b, &len| {
                b.iter_batched(
                    || request(len),
                    |req| rt.block_on(human.clone().oneshot(req)).expect("the run"),
                    BatchSize::SmallInput,
                )
            },
        );
        group.bench_with_input(
            BenchmarkId::new("agent_history_stack", len),
            &len,
            |b, &len| {
                b.iter_batched(
                    || request(len),
                    |req| {
                        rt.block_on(history_stack.clone().oneshot(req))
                            .expect("the run")
                    },
                    BatchSize::SmallInput,
                )
            },
        );
        group.bench_with_input(
            BenchmarkId::new("agent_patch_instructions", len),
            &len,
            |b, &len| {
                b.iter_batched(
                    || request(len),
                    |req| rt.block_on(builtins.clone().oneshot(req)).expect("the run"),
                    BatchSize::SmallInput,
                )
            },
        );
    }
    group.finish();
}

fn workflow(c: &mut Criterion) {
    use tower_agent::workflow::{JudgeRequest, Loop, Sequential, Verdict, judge_fn};

    const ITERATIONS: u32 = 10;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let mut group = c.benchmark_group("workflow");
    let answer = |text: &'static str| {
        service_fn(move |_: ModelRequest| ready(Ok::<_, Error>(ModelResponse::text(text))))
    };
    let coder = Agent::new(answer("code"), stub_tools());
    let reviewer = Agent::new(answer("review"), stub_tools());
    let verdict = |iteration: u32| {
        if iteration >= ITERATIONS {
            Verdict::stop("done")
        } else {
            Verdict::proceed("again")
        }
    };
    let judge = judge_fn(move |req: &JudgeRequest| ready(Ok(verdict(req.iteration))));
    let workflow = Loop::new(
        "coding_loop",
        Sequential::new("pair")
            .step("coder", coder.clone())
            .step("reviewer", reviewer.clone()),
        judge,
    )
    .max_iterations(ITERATIONS);

    let by_hand = |session: Session| async {
        let mut session = session;
        let mut input = AgentInput::from("Build it.");
        for iteration in 1..=ITERATIONS {
            let res = coder
                .clone()
                .oneshot(AgentRequest::new(session, input))
                .await?;
            let res = reviewer
                .clone()
                .oneshot(AgentRequest::new(res.session, AgentInput::Continue))
                .await?;
            session = res.session;
            if let Verdict::Stop { .. } = verdict(iteration) {
                return Ok::<_, Error>(session);
            }
            input = AgentInput::from("The judge asked for another iteration: again");
        }
        Ok(session)
    };
    let sessions = |_: ()| Session::new().with_history(history(10));
    let done = rt
        .block_on(
            workflow
                .clone()
                .oneshot(AgentRequest::new(sessions(()), "Build it.")),
        )
        .expect("the workflow");
    let manual = rt.block_on(by_hand(sessions(()))).expect("by hand");
    assert_eq!(done.session.history.len(), manual.history.len());

    group.bench_function("by_hand", |b| {
        b.iter_batched(
            || sessions(()),
            |session| rt.block_on(by_hand(session)).expect("by hand"),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("loop_sequential", |b| {
        b.iter_batched(
            || AgentRequest::new(sessions(()), "Build it."),
            |req| {
                rt.block_on(workflow.clone().oneshot(req))
                    .expect("the workflow")
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, layer, agent_loop, workflow);
criterion_main!(benches);
