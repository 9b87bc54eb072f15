//! End-to-end scenarios as a host application writes them, with the facade: a whole stack of
//! callback points and observers, per-tool middleware, the six points in run order, and a
//! `before_agent` answer that skips the loop.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_agent::AgentNext;
use tower_agent::ModelNext;
use tower_agent::ObserveLayer;
use tower_agent::ToolNext;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tower_agent::Tool as _;
use tower_agent::prelude::*;
use tower_agent_test::{ScriptedModel, StubTool, assert_valid_history};

type Log = Arc<Mutex<Vec<String>>>;

fn push(log: &Log, entry: String) {
    log.lock().expect("the log lock").push(entry);
}

fn call(id: &str, name: &str, args: serde_json::Value) -> ToolCall {
    ToolCall::new(id, name, args)
}

#[derive(Deserialize, JsonSchema)]
struct AddArgs {
    a: i64,
    b: i64,
}

fn calculator() -> ToolSet {
    ToolSet::new().tool(tool_fn(
        "add",
        "Add two integers.",
        |args: AddArgs| async move { Ok::<_, Error>(args.a + args.b) },
    ))
}

#[tokio::test]
async fn a_stack_of_all_six_points_and_observers_serves_sessions_from_other_tasks() {
    fn assert_clone_send_static<T: Clone + Send + 'static>(_: &T) {}
    let model = ServiceBuilder::new()
        .observe(ObserveLayer::new().on_request(|_: &ModelRequest| {}))
        .after_model(|res: ModelResponse, _: RunContext| async move { Ok(res) })
        .before_model(|req: ModelRequest| async move { Ok(Flow::Continue(req)) })
        .service(ScriptedModel::from_fn(|_| Ok(ModelResponse::text("hi"))));
    let tools = ServiceBuilder::new()
        .after_tool(|res: ToolResponse, _: RunContext| async move { Ok(res) })
        .before_tool(|req: ToolRequest| async move { Ok(Flow::Continue(req)) })
        .service(calculator());
    let agent = ServiceBuilder::new()
        .after_agent(|res: AgentResponse, _: RunContext| async move { Ok(res) })
        .before_agent(|req: AgentRequest| async move { Ok(Flow::Continue(req)) })
        .service(Agent::new(model, tools));
    assert_clone_send_static(&agent);
    // One composed stack, several sessions at once, each on its own task.
    let runs: Vec<_> = (0..4)
        .map(|i| {
            let agent = agent.clone();
            tokio::spawn(agent.oneshot(AgentRequest::new(Session::with_id(format!("s{i}")), "hi")))
        })
        .collect();
    for (i, run) in runs.into_iter().enumerate() {
        let res = run.await.unwrap().unwrap();
        assert_eq!(res.session.id, format!("s{i}"));
        assert_eq!(res.text().as_deref(), Some("hi"));
    }
}

#[tokio::test(start_paused = true)]
async fn per_tool_middleware_bounds_one_tool_only() {
    // A concurrent round of six calls: `slow` is limited to one at a time, `fast` is not.
    let probe = |name: &'static str, in_flight: Arc<AtomicUsize>, peak: Arc<AtomicUsize>| {
        StubTool::from_fn(name, move |req: &ToolRequest| {
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            ToolResponse::success(&req.call, "ok")
        })
    };
    let (slow_now, slow_peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let slow = probe("slow", slow_now.clone(), slow_peak.clone());
    // Each call holds its permit until the stub's response is built; a delay makes calls
    // overlap, and the counter is decremented by an after_tool callback.
    let delayed = |tool: StubTool, now: Arc<AtomicUsize>| {
        ServiceBuilder::new()
            .after_tool(move |res: ToolResponse, _: RunContext| {
                let now = now.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    Ok(res)
                }
            })
            .service(tool)
    };
    let tools = ToolSet::new().service(
        StubTool::returning("slow", "").spec(),
        ServiceBuilder::new()
            .concurrency_limit(1)
            .service(delayed(slow, slow_now)),
    );
    let (fast_now, fast_peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let fast = probe("fast", fast_now.clone(), fast_peak.clone());
    let tools = tools.service(
        StubTool::returning("fast", "").spec(),
        delayed(fast, fast_now),
    );
    let calls = (0..6).map(|i| {
        call(
            &format!("c{i}"),
            if i % 2 == 0 { "slow" } else { "fast" },
            json!({}),
        )
    });
    let model = ScriptedModel::new([ModelResponse::tool_calls(calls), ModelResponse::text("ok")]);
    let res = Agent::builder()
        .concurrent_tools(6)
        .build(model, tools)
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    assert_valid_history(&res.session.history);
    assert_eq!(
        slow_peak.load(Ordering::SeqCst),
        1,
        "the limited tool ran one at a time"
    );
    assert_eq!(
        fast_peak.load(Ordering::SeqCst),
        3,
        "the other ran all its calls at once"
    );
}

#[tokio::test]
async fn six_points_in_run_order() {
    let log: Log = Arc::default();
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "t", json!({}))]),
        ModelResponse::text("done"),
    ]);
    let (l1, l2, l3, l4, l5, l6) = (
        log.clone(),
        log.clone(),
        log.clone(),
        log.clone(),
        log.clone(),
        log.clone(),
    );
    let model = ServiceBuilder::new()
        .after_model(move |res: ModelResponse, ctx: RunContext| {
            push(&l1, format!("after_model {}", ctx.round()));
            async move { Ok(res) }
        })
        .before_model(move |req: ModelRequest| {
            push(&l2, format!("before_model {}", req.ctx.round()));
            async move { Ok(Flow::Continue(req)) }
        })
        .service(model);
    let tools = ServiceBuilder::new()
        .after_tool(move |res: ToolResponse, _: RunContext| {
            push(&l3, "after_tool".into());
            async move { Ok(res) }
        })
        .before_tool(move |req: ToolRequest| {
            push(&l4, "before_tool".into());
            async move { Ok(Flow::Continue(req)) }
        })
        .service(ToolSet::new().tool(StubTool::returning("t", "ok")));
    let agent = ServiceBuilder::new()
        .after_agent(move |res: AgentResponse, _: RunContext| {
            push(&l5, "after_agent".into());
            async move { Ok(res) }
        })
        .before_agent(move |req: AgentRequest| {
            push(&l6, "before_agent".into());
            async move { Ok(Flow::Continue(req)) }
        })
        .service(Agent::new(model, tools));
    agent
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        [
            "before_agent",
            "before_model 1",
            "after_model 1",
            "before_tool",
            "after_tool",
            "before_model 2",
            "after_model 2",
            "after_agent",
        ]
    );
}

#[tokio::test]
async fn before_agent_answer_skips_the_loop() {
    let model = ScriptedModel::new([]);
    let agent = ServiceBuilder::new()
        .before_agent(|req: AgentRequest| async move {
            let message = Message::assistant("cached answer");
            Ok(Flow::Answer(AgentResponse::new(
                req.session,
                Outcome::Completed { message },
            )))
        })
        .service(Agent::new(model.clone(), ToolSet::new()));
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "hi"))
        .await
        .unwrap();
    assert_eq!(res.text().as_deref(), Some("cached answer"));
    assert_eq!(model.request_count(), 0, "the model must not be called");
}

#[tokio::test]
async fn around_callbacks_at_all_three_services_in_a_spawned_run() {
    // The model fails once with a rate limit; the around_model retry hides it.
    let model = ScriptedModel::with_results([
        Err(Error::rate_limited(Some(Duration::from_millis(1)), "429")),
        Ok(ModelResponse::tool_calls([call("c1", "clock", json!({}))])),
        Ok(ModelResponse::text("It is noon.")),
    ]);
    let model = ServiceBuilder::new()
        .around_model(|req: ModelRequest, mut next: ModelNext| async move {
            loop {
                match next.run(req.clone()).await {
                    Err(e) if e.is_transient() => {
                        tokio::time::sleep(e.retry_after().unwrap_or_default()).await;
                    }
                    other => return other,
                }
            }
        })
        .service(model.clone());
    let timed = Arc::new(AtomicUsize::new(0));
    let count = timed.clone();
    let tools = ServiceBuilder::new()
        .around_tool(move |req: ToolRequest, next: ToolNext| {
            let count = count.clone();
            async move {
                let res = next.oneshot(req).await;
                count.fetch_add(1, Ordering::SeqCst);
                res
            }
        })
        .service(ToolSet::new().tool(StubTool::returning("clock", "12:00")));
    let agent = ServiceBuilder::new()
        .around_agent(|req: AgentRequest, next: AgentNext| async move {
            if matches!(&req.input, AgentInput::Messages(m) if m.iter().any(|m| m.text() == "ping"))
            {
                return Ok(req.answer("pong"));
            }
            next.oneshot(req).await
        })
        .service(Agent::new(model, tools));

    // Spawning needs every future of the stack to be `Send`.
    let res = agent
        .clone()
        .spawn(AgentRequest::new(Session::new(), "What time is it?"))
        .join()
        .await
        .unwrap();
    assert_eq!(res.text().as_deref(), Some("It is noon."));
    assert_eq!(timed.load(Ordering::SeqCst), 1);
    assert_valid_history(&res.session.history);

    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "ping"))
        .await
        .unwrap();
    assert_eq!(res.text().as_deref(), Some("pong"));
    assert_eq!(res.session.history.len(), 2);
}
