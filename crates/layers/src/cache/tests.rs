use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_agent_core::{
    DescribedTools, Error, RunContext, ToolAction, ToolCall, ToolRequest, ToolResponse, ToolSpec,
    Usage,
};

use super::ToolCacheLayer;

/// Runs of each tool, and a gate that holds every run (or the runs of one tool) until it is
/// opened.
#[derive(Clone, Default)]
struct Tools {
    read: Arc<AtomicUsize>,
    write: Arc<AtomicUsize>,
    pure: Arc<AtomicUsize>,
    gate: Option<Arc<Semaphore>>,
    gated_tool: Option<&'static str>,
}

impl Tools {
    fn gated() -> Self {
        Self {
            gate: Some(Arc::new(Semaphore::new(0))),
            ..Self::default()
        }
    }

    /// Only `tool`'s runs wait at the gate.
    fn gating(tool: &'static str) -> Self {
        Self {
            gated_tool: Some(tool),
            ..Self::gated()
        }
    }

    fn writes(&self) -> usize {
        self.write.load(Ordering::SeqCst)
    }

    fn open(&self) {
        if let Some(gate) = &self.gate {
            gate.add_permits(Semaphore::MAX_PERMITS / 2);
        }
    }

    fn reads(&self) -> usize {
        self.read.load(Ordering::SeqCst)
    }

    /// `read` (read-only; answers what `write` wrote last, with usage; `{"fail": true}` is an
    /// error result, `{"err": true}` an `Err`, `{"stop": true}` a stop), `write`, `pure` (not
    /// marked read-only) and `clock` (read-only).
    fn service(
        &self,
    ) -> impl Service<ToolRequest, Response = ToolResponse, Error = Error, Future: Send>
    + tower_agent_core::DescribeTools
    + Clone
    + Send
    + 'static {
        let tools = self.clone();
        let written = Arc::new(std::sync::Mutex::new(String::from("v0")));
        let specs = [
            ToolSpec::new("read", "Reads.", json!({"type": "object"})).read_only(),
            ToolSpec::new("write", "Writes.", json!({"type": "object"})),
            ToolSpec::new("pure", "Computes.", json!({"type": "object"})),
            ToolSpec::new("clock", "The time.", json!({"type": "object"})).read_only(),
        ];
        DescribedTools::new(
            specs,
            service_fn(move |req: ToolRequest| {
                let tools = tools.clone();
                let written = Arc::clone(&written);
                async move {
                    let args: Value = serde_json::from_str(&req.call.arguments)
                        .unwrap_or_else(|_| json!({"malformed": true}));
                    let counter = match req.call.name.as_str() {
                        "read" | "clock" => &tools.read,
                        "write" => &tools.write,
                        _ => &tools.pure,
                    };
                    let run = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    let held = tools.gated_tool.is_none_or(|t| t == req.call.name);
                    if let (Some(gate), true) = (&tools.gate, held) {
                        let _permit = gate.acquire().await.expect("gate open");
                    }
                    if args["err"] == json!(true) {
                        return Err(Error::tool("broken"));
                    }
                    if req.call.name == "write" {
                        *written.lock().expect("lock") = format!("v{run}");
                        return Ok(ToolResponse::success(&req.call, "written"));
                    }
                    let content = format!("{} {} run {run}", written.lock().expect("lock"), args);
                    let mut response = if args["fail"] == json!(true) {
                        ToolResponse::error(&req.call, content)
                    } else {
                        ToolResponse::success(&req.call, content)
                    };
                    if args["stop"] == json!(true) {
                        response = response.with_action(ToolAction::stop(&req.call, "enough"));
                    }
                    Ok(response.with_usage(Usage::new(10, 5)))
                }
            }),
        )
    }
}

fn request(id: &str, tool: &str, arguments: &str, ctx: &RunContext) -> ToolRequest {
    let call = ToolCall::raw(id, tool, arguments);
    ToolRequest::new(call, ctx.clone())
}

fn session(id: &str) -> RunContext {
    RunContext::new().with_session_id(id)
}

async fn call<S>(
    service: &S,
    id: &str,
    tool: &str,
    arguments: &str,
    ctx: &RunContext,
) -> ToolResponse
where
    S: Service<ToolRequest, Response = ToolResponse, Error = Error> + Clone,
{
    service
        .clone()
        .oneshot(request(id, tool, arguments, ctx))
        .await
        .expect("tool answers")
}

#[tokio::test]
async fn a_read_only_call_runs_once_and_hits_answer_under_their_own_id() {
    let tools = Tools::default();
    let service = ToolCacheLayer::new().layer(tools.service());
    let ctx = session("s1");

    let first = call(
        &service,
        "c1",
        "read",
        r#"{"path": "a", "n": [1, {"y": 2, "x": 1}]}"#,
        &ctx,
    )
    .await;
    // The same arguments, keys in another order and other spacing.
    let second = call(
        &service,
        "c2",
        "read",
        r#"{"n":[1,{"x":1,"y":2}],"path":"a"}"#,
        &ctx,
    )
    .await;
    assert_eq!(tools.reads(), 1);
    assert_eq!(first.result.call_id, "c1");
    assert_eq!(second.result.call_id, "c2");
    assert_eq!(second.result.content, first.result.content);
    assert!(second.result.content.ends_with("run 1"));
    // The usage of the run is the first call's; a hit spent nothing.
    assert_eq!(first.usage, Usage::new(10, 5));
    assert!(second.usage.is_zero());

    // Other arguments, or another array order, are another call.
    call(&service, "c3", "read", r#"{"path": "b"}"#, &ctx).await;
    call(
        &service,
        "c4",
        "read",
        r#"{"path": "a", "n": [{"y": 2, "x": 1}, 1]}"#,
        &ctx,
    )
    .await;
    assert_eq!(tools.reads(), 3);
}

#[tokio::test]
async fn only_read_only_or_named_tools_are_cached_and_excluded_ones_never() {
    let tools = Tools::default();
    let service = ToolCacheLayer::new()
        .invalidate_on_write(false)
        .layer(tools.service());
    let ctx = session("s1");
    for id in ["c1", "c2"] {
        call(&service, id, "pure", "{}", &ctx).await;
    }
    assert_eq!(
        tools.pure.load(Ordering::SeqCst),
        2,
        "not read-only: run each time"
    );

    let tools = Tools::default();
    let service = ToolCacheLayer::new()
        .include("pure")
        .exclude("clock")
        .layer(tools.service());
    for id in ["c1", "c2"] {
        call(&service, id, "pure", "{}", &ctx).await;
        call(&service, id, "clock", "{}", &ctx).await;
    }
    assert_eq!(tools.pure.load(Ordering::SeqCst), 1, "named: cached");
    assert_eq!(tools.reads(), 2, "excluded: run each time");
}

#[tokio::test]
async fn errors_stops_and_malformed_arguments_are_not_kept() {
    let tools = Tools::default();
    let service = ToolCacheLayer::new().layer(tools.service());
    let ctx = session("s1");
    for args in [r#"{"fail": true}"#, r#"{"stop": true}"#, "{not json"] {
        let first = call(&service, "c1", "read", args, &ctx).await;
        let second = call(&service, "c2", "read", args, &ctx).await;
        assert_eq!(second.result.call_id, "c2");
        assert_eq!(first.usage, second.usage, "both ran");
        assert_eq!(first.result.is_error, args.contains("fail"));
        assert_eq!(
            matches!(second.action, ToolAction::Stop(_)),
            args.contains("stop")
        );
    }
    assert_eq!(tools.reads(), 6);

    for _ in 0..2 {
        let err = service
            .clone()
            .oneshot(request("c1", "read", r#"{"err": true}"#, &ctx))
            .await
            .expect_err("an error passes through");
        assert!(err.to_string().contains("broken"), "{err}");
    }
    assert_eq!(tools.reads(), 8);
}

#[tokio::test]
async fn scopes_per_session_shared_and_per_key() {
    let (a, b) = (session("a"), session("b"));
    let tools = Tools::default();
    let service = ToolCacheLayer::new().layer(tools.service());
    call(&service, "c1", "read", "{}", &a).await;
    call(&service, "c2", "read", "{}", &b).await;
    assert_eq!(tools.reads(), 2);
    // A sub-agent's results are kept apart from its parent's (but shared between its calls).
    call(&service, "c3", "read", "{}", &a.nested("helper")).await;
    call(&service, "c4", "read", "{}", &a.nested("helper")).await;
    assert_eq!(tools.reads(), 3);
    // Two runs without a session are two scopes.
    call(&service, "c5", "read", "{}", &RunContext::new()).await;
    call(&service, "c6", "read", "{}", &RunContext::new()).await;
    assert_eq!(tools.reads(), 5);

    let tools = Tools::default();
    let service = ToolCacheLayer::new().shared().layer(tools.service());
    call(&service, "c1", "read", "{}", &a).await;
    call(&service, "c2", "read", "{}", &b).await;
    assert_eq!(tools.reads(), 1);

    let tools = Tools::default();
    let service = ToolCacheLayer::new()
        .per_key(|ctx| ctx.state::<String>("tenant"))
        .layer(tools.service());
    let tenant = |name: &str, tenant: &str| {
        let ctx = session(name);
        ctx.set_state("tenant", tenant);
        ctx
    };
    call(&service, "c1", "read", "{}", &tenant("a", "acme")).await;
    call(&service, "c2", "read", "{}", &tenant("b", "acme")).await;
    call(&service, "c3", "read", "{}", &tenant("c", "globex")).await;
    assert_eq!(tools.reads(), 2);
    // No tenant: not cached, not even between calls of one session.
    let anonymous = session("d");
    call(&service, "c4", "read", "{}", &anonymous).await;
    call(&service, "c5", "read", "{}", &anonymous).await;
    assert_eq!(tools.reads(), 4);
}

#[tokio::test]
async fn a_write_drops_what_its_scope_read() {
    let tools = Tools::default();
    let service = ToolCacheLayer::new().layer(tools.service());
    let (ctx, other) = (session("s1"), session("s2"));
    let before = call(&service, "c1", "read", "{}", &ctx).await;
    call(&service, "c2", "read", "{}", &other).await;
    call(&service, "c3", "write", "{}", &ctx).await;
    let after = call(&service, "c4", "read", "{}", &ctx).await;
    assert_eq!(tools.reads(), 3);
    assert!(before.result.content.starts_with("v0"));
    assert!(
        after.result.content.starts_with("v1"),
        "{}",
        after.result.content
    );
    // Another session's entries stay.
    call(&service, "c5", "read", "{}", &other).await;
    assert_eq!(tools.reads(), 3);
    // The new result is kept in turn.
    call(&service, "c6", "read", "{}", &ctx).await;
    assert_eq!(tools.reads(), 3);

    let tools = Tools::default();
    let service = ToolCacheLayer::new()
        .invalidate_on_write(false)
        .layer(tools.service());
    call(&service, "c1", "read", "{}", &ctx).await;
    call(&service, "c2", "write", "{}", &ctx).await;
    let stale = call(&service, "c3", "read", "{}", &ctx).await;
    assert_eq!(tools.reads(), 1);
    assert!(stale.result.content.starts_with("v0"), "kept, as asked");
}

#[tokio::test]
async fn a_read_that_overlaps_a_write_is_not_kept() {
    // The read starts first and ends after the write.
    let tools = Tools::gating("read");
    let service = ToolCacheLayer::new().layer(tools.service());
    let ctx = session("s1");
    let read = tokio::spawn(call_owned(service.clone(), "c1", "read", ctx.clone()));
    while tools.reads() == 0 {
        tokio::task::yield_now().await;
    }
    call(&service, "c2", "write", "{}", &ctx).await;
    tools.open();
    read.await.expect("read");
    call(&service, "c3", "read", "{}", &ctx).await;
    assert_eq!(
        tools.reads(),
        2,
        "the read that began before the write was not kept"
    );

    // The write starts first and ends after the read.
    let tools = Tools::gating("write");
    let service = ToolCacheLayer::new().layer(tools.service());
    let write = tokio::spawn(call_owned(service.clone(), "c1", "write", ctx.clone()));
    while tools.writes() == 0 {
        tokio::task::yield_now().await;
    }
    call(&service, "c2", "read", "{}", &ctx).await;
    call(&service, "c3", "read", "{}", &ctx).await;
    assert_eq!(tools.reads(), 1, "kept while the write runs");
    tools.open();
    write.await.expect("write");
    let after = call(&service, "c4", "read", "{}", &ctx).await;
    assert_eq!(
        tools.reads(),
        2,
        "the write's end drops what was read during it"
    );
    assert!(
        after.result.content.starts_with("v1"),
        "{}",
        after.result.content
    );
}

#[tokio::test]
async fn a_resumed_write_drops_and_an_unknown_tool_keeps_what_was_read() {
    let tools = Tools::default();
    let service = ToolCacheLayer::new().layer(tools.service());
    let ctx = session("s1");
    call(&service, "c1", "read", "{}", &ctx).await;
    let unknown = call(&service, "c2", "teleport", "{}", &ctx).await;
    call(&service, "c3", "read", "{}", &ctx).await;
    assert_eq!(
        tools.reads(),
        1,
        "a call of a tool the service lacks writes nothing"
    );
    assert_eq!(unknown.result.call_id, "c2");
    let mut resumed = request("c4", "write", "{}", &ctx);
    resumed.resume = Some(json!({"type": "approve"}));
    service.clone().oneshot(resumed).await.expect("answers");
    call(&service, "c5", "read", "{}", &ctx).await;
    assert_eq!(tools.reads(), 2);

    // A write in a sub-agent through the same layer reaches its parent's scope.
    call(&service, "c6", "write", "{}", &ctx.nested("helper")).await;
    call(&service, "c7", "read", "{}", &ctx).await;
    assert_eq!(tools.reads(), 3);
}

#[tokio::test]
async fn a_failure_a_stop_or_a_cancellation_is_the_running_calls_own() {
    for args in [r#"{"err": true}"#, r#"{"stop": true}"#] {
        let tools = Tools::gated();
        let service = ToolCacheLayer::new().layer(tools.service());
        let ctx = session("s1");
        let spawn = |id: &'static str| {
            let (service, ctx) = (service.clone(), ctx.clone());
            tokio::spawn(async move { service.oneshot(request(id, "read", args, &ctx)).await })
        };
        let first = spawn("c1");
        while tools.reads() == 0 {
            tokio::task::yield_now().await;
        }
        let second = spawn("c2");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(tools.reads(), 1, "{args}: the second call waits");
        tools.open();
        let (first, second) = (first.await.expect("task"), second.await.expect("task"));
        assert_eq!(
            tools.reads(),
            2,
            "{args}: the waiting call ran its own request"
        );
        match (first, second) {
            (Err(one), Err(two)) => {
                assert!(one.to_string().contains("broken") && two.to_string().contains("broken"));
            }
            (Ok(one), Ok(two)) => {
                let ids = |r: &ToolResponse| match &r.action {
                    ToolAction::Stop(tower_agent_core::StopReason::Tool { call_id, .. }) => {
                        call_id.clone()
                    }
                    other => panic!("a stop, not {other:?}"),
                };
                assert_eq!((ids(&one), ids(&two)), ("c1".into(), "c2".into()));
                assert_eq!(two.usage, Usage::new(10, 5), "its own run's usage");
            }
            other => panic!("{args}: {other:?}"),
        }
    }
}

async fn call_owned<S>(
    service: S,
    id: &'static str,
    tool: &'static str,
    ctx: RunContext,
) -> ToolResponse
where
    S: Service<ToolRequest, Response = ToolResponse, Error = Error>,
{
    service
        .oneshot(request(id, tool, "{}", &ctx))
        .await
        .expect("tool answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_concurrent_identical_calls_run_the_tool_once() {
    let tools = Tools::gated();
    let service = ToolCacheLayer::new().layer(tools.service());
    let ctx = session("s1");
    let calls: Vec<_> = (0..100)
        .map(|i| {
            let service = service.clone();
            let ctx = ctx.clone();
            tokio::spawn(async move {
                let id = format!("c{i}");
                service
                    .oneshot(request(&id, "read", r#"{"q": "rust"}"#, &ctx))
                    .await
                    .map(|response| (id, response))
            })
        })
        .collect();
    // Every call is in: the one that runs the tool waits at the gate, the others for it.
    while tools.reads() == 0 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    tools.open();
    let mut with_usage = 0;
    for task in calls {
        let (id, response) = task.await.expect("task").expect("tool answers");
        assert_eq!(response.result.call_id, id);
        assert!(response.result.content.ends_with("run 1"));
        with_usage += usize::from(!response.usage.is_zero());
    }
    assert_eq!(tools.reads(), 1, "single flight");
    assert_eq!(with_usage, 1, "the usage is counted once");
}

#[tokio::test]
async fn concurrent_calls_share_an_error_result_and_do_not_keep_it() {
    let tools = Tools::gated();
    let service = ToolCacheLayer::new().layer(tools.service());
    let ctx = session("s1");
    let args = r#"{"fail": true}"#;
    let first = tokio::spawn({
        let (service, ctx) = (service.clone(), ctx.clone());
        async move { service.oneshot(request("c1", "read", args, &ctx)).await }
    });
    while tools.reads() == 0 {
        tokio::task::yield_now().await;
    }
    let second = tokio::spawn({
        let (service, ctx) = (service.clone(), ctx.clone());
        async move { service.oneshot(request("c2", "read", args, &ctx)).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    tools.open();
    let first = first.await.expect("task").expect("answers");
    let second = second.await.expect("task").expect("answers");
    assert!(first.result.is_error && second.result.is_error);
    assert_eq!(second.result.call_id, "c2");
    assert_eq!(
        tools.reads(),
        1,
        "the waiting call got the one run's result"
    );
    call(&service, "c3", "read", args, &ctx).await;
    assert_eq!(tools.reads(), 2, "an error result is not kept");
}

#[tokio::test]
async fn when_the_running_call_is_dropped_a_waiting_one_runs_the_tool() {
    let tools = Tools::gated();
    let service = ToolCacheLayer::new().layer(tools.service());
    let ctx = session("s1");
    let first = tokio::spawn(call_owned(service.clone(), "c1", "read", ctx.clone()));
    while tools.reads() == 0 {
        tokio::task::yield_now().await;
    }
    let second = tokio::spawn(call_owned(service.clone(), "c2", "read", ctx.clone()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    first.abort();
    assert!(first.await.expect_err("aborted").is_cancelled());
    while tools.reads() < 2 {
        tokio::task::yield_now().await;
    }
    tools.open();
    let second = second.await.expect("the waiting call is answered");
    assert_eq!(second.result.call_id, "c2");
    assert!(second.result.content.ends_with("run 2"));
    assert_eq!(
        second.usage,
        Usage::new(10, 5),
        "it ran the tool: the usage is its own"
    );
    call(&service, "c3", "read", "{}", &ctx).await;
    assert_eq!(tools.reads(), 2, "and its result is kept");
}

#[tokio::test]
async fn entries_expire_after_their_time_to_live() {
    let tools = Tools::default();
    let service = ToolCacheLayer::new()
        .ttl(Duration::from_millis(100))
        .layer(tools.service());
    let ctx = session("s1");
    call(&service, "c1", "read", "{}", &ctx).await;
    call(&service, "c2", "read", "{}", &ctx).await;
    assert_eq!(tools.reads(), 1);
    // moka keeps its own clock: real time passes.
    std::thread::sleep(Duration::from_millis(250));
    call(&service, "c3", "read", "{}", &ctx).await;
    assert_eq!(tools.reads(), 2);
}

#[tokio::test]
async fn a_resumed_call_passes_through() {
    let tools = Tools::default();
    let service = ToolCacheLayer::new().layer(tools.service());
    let ctx = session("s1");
    for id in ["c1", "c2"] {
        let mut req = request(id, "read", "{}", &ctx);
        req.resume = Some(json!("yes"));
        service.clone().oneshot(req).await.expect("answers");
    }
    assert_eq!(tools.reads(), 2);
}

#[tokio::test]
async fn clones_share_the_cache_and_builder_methods_make_a_new_one() {
    let tools = Tools::default();
    let layer = ToolCacheLayer::new();
    let one = layer.layer(tools.service());
    let two = layer.clone().layer(tools.service());
    let ctx = session("s1");
    call(&one, "c1", "read", "{}", &ctx).await;
    call(&two, "c2", "read", "{}", &ctx).await;
    assert_eq!(tools.reads(), 1);
    let fresh = layer.ttl(Duration::from_secs(60)).layer(tools.service());
    call(&fresh, "c3", "read", "{}", &ctx).await;
    assert_eq!(tools.reads(), 2);
    let debug = format!("{:?}", ToolCacheLayer::new().shared().include("pure"));
    assert!(
        debug.contains("shared") && debug.contains("pure"),
        "{debug}"
    );
}

#[test]
fn canonical_arguments() {
    use super::canonical;
    assert_eq!(
        canonical(r#" { "b" : [2, {"d": 1, "c": null}], "a": "x" } "#).as_deref(),
        Some(r#"{"a":"x","b":[2,{"c":null,"d":1}]}"#)
    );
    assert_eq!(canonical("{"), None);
    assert_eq!(canonical("").as_deref(), None);
}

/// A service that counts its clones.
struct Clones<S> {
    inner: S,
    clones: Arc<AtomicUsize>,
}

impl<S: Clone> Clone for Clones<S> {
    fn clone(&self) -> Self {
        self.clones.fetch_add(1, Ordering::SeqCst);
        Self {
            inner: self.inner.clone(),
            clones: Arc::clone(&self.clones),
        }
    }
}

impl<S: tower_agent_core::DescribeTools> tower_agent_core::DescribeTools for Clones<S> {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        self.inner.tool_specs()
    }
}

impl<S: Service<ToolRequest>> Service<ToolRequest> for Clones<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ToolRequest) -> S::Future {
        self.inner.call(req)
    }
}

#[tokio::test]
async fn a_call_passed_through_clones_nothing() {
    let tools = Tools::default();
    let clones = Arc::new(AtomicUsize::new(0));
    let mut service = ToolCacheLayer::new()
        .invalidate_on_write(false)
        .exclude("clock")
        .layer(Clones {
            inner: tools.service(),
            clones: Arc::clone(&clones),
        });
    let ctx = session("s1");
    for (id, tool) in [("c1", "write"), ("c2", "clock"), ("c3", "teleport")] {
        let ready = service.ready().await.expect("ready");
        ready
            .call(request(id, tool, "{}", &ctx))
            .await
            .expect("answers");
    }
    assert_eq!(clones.load(Ordering::SeqCst), 0, "passed through as it is");
    let ready = service.ready().await.expect("ready");
    ready
        .call(request("c4", "read", "{}", &ctx))
        .await
        .expect("answers");
    assert_eq!(
        clones.load(Ordering::SeqCst),
        1,
        "a cached call takes the ready service"
    );
}

#[tokio::test]
async fn entries_are_held_to_the_byte_bound() {
    let big = format!(r#"{{"text": "{}"}}"#, "x".repeat(2_000));
    for (max_bytes, runs) in [(32 << 20, 1), (1_000, 2)] {
        let tools = Tools::default();
        let layer = ToolCacheLayer::new().max_bytes(max_bytes);
        let service = layer.layer(tools.service());
        let ctx = session("s1");
        call(&service, "c1", "read", &big, &ctx).await;
        // moka applies its bound as it tidies up, which it does now and then: now.
        layer.config.values.run_pending_tasks().await;
        call(&service, "c2", "read", &big, &ctx).await;
        assert_eq!(tools.reads(), runs, "max_bytes {max_bytes}");
    }
}
