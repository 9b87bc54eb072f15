//! Spend windows shared by two processes on a real Postgres (`POSTGRES_URL`; `.ci/run` starts
//! one): each process runs many one-call runs of one tenant at once, every call reserving its
//! worst case in the day's window before it is sent. Between them they never spend (nor hold)
//! more than the window's limit, both are refused once it is reached, and what the store says
//! was spent is exactly what the calls that went out cost. Two processes with a budget in
//! memory each would spend up to twice the limit; the test would fail.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower::{Layer, ServiceExt};
use tower_agent_core::{
    AgentRequest, Cost, ModelPrice, ModelResponse, Outcome, RunContext, Session, StopReason, Usage,
};
use tower_agent_layers::budget::{BudgetLayer, PostgresSpend, SpendStore, SpendWindow};
use tower_agent_loop::Agent;
use tower_agent_test::ScriptedModel;
use tower_agent_tools::ToolSet;

/// The day's limit: $0.50.
const LIMIT: f64 = 0.50;
/// Runs per process, all at once.
const RUNS: usize = 40;

fn price() -> ModelPrice {
    // $1 per million prompt tokens, $100 per million completion tokens.
    ModelPrice::per_million(1.0, 0.0, 100.0)
}

fn main() {
    let Ok(url) = std::env::var("POSTGRES_URL") else {
        assert!(
            std::env::var("CI").is_err(),
            "POSTGRES_URL is not set: .ci/run starts Postgres on 127.0.0.1 (.ci/postgres) and exports it"
        );
        eprintln!("skipped: POSTGRES_URL is not set");
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    match std::env::var("SPEND_CHILD") {
        Ok(tenant) => runtime.block_on(child(&url, &tenant)),
        Err(_) => runtime.block_on(parent(&url)),
    }
}

/// One process: `RUNS` runs at once, one model call each; prints how many calls went out and
/// how many runs the window stopped.
async fn child(url: &str, tenant: &str) {
    let store = PostgresSpend::connect(url).await.expect("connects");
    let tenant = tenant.to_owned();
    // Each call reserves its worst case: at most 100 prompt bytes ($0.0001) and 500 completion
    // tokens ($0.05); it costs 100 prompt and 200 completion tokens: $0.0201.
    let budget = BudgetLayer::new(price()).assume_output_tokens(500).window(
        SpendWindow::day(Cost::from_dollars(LIMIT)).per(move |_| Some(tenant.clone())),
        store,
    );
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    let model = ScriptedModel::from_fn(move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
        Ok(ModelResponse::text("ok").with_usage(Usage::new(100, 200)))
    })
    .without_recording();
    // A model call that takes a while, so that the two processes' calls overlap.
    let slow = tower::ServiceBuilder::new()
        .then(|res| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            res
        })
        .service(model);
    let agent = Agent::new(budget.layer(slow), ToolSet::new());
    let runs = (0..RUNS).map(|i| {
        let agent = agent.clone();
        tokio::spawn(async move {
            agent
                .oneshot(AgentRequest::new(Session::with_id(format!("r{i}")), "hi"))
                .await
        })
    });
    let mut stopped = 0;
    for run in futures_util::future::join_all(runs).await {
        let res = run.expect("the run's task").expect("an outcome");
        match res.outcome {
            Outcome::Completed { .. } => {}
            Outcome::Stopped {
                reason: StopReason::Budget { scope, .. },
                ..
            } => {
                assert!(scope.contains("/day/"), "{scope}");
                stopped += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    println!("sent {} stopped {stopped}", sent.load(Ordering::SeqCst));
}

async fn parent(url: &str) {
    // The tables, before two processes race to make them.
    let store = PostgresSpend::connect(url).await.expect("connects");
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos();
    let tenant = format!("acme-{stamp}");
    let exe = std::env::current_exe().expect("the test binary");
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .env("SPEND_CHILD", &tenant)
                .stdout(Stdio::piped())
                .spawn()
                .expect("a child process")
        })
        .collect();
    let (mut sent, mut stopped) = (0u64, Vec::new());
    for child in children {
        let out = child.wait_with_output().expect("the child ends");
        assert!(out.status.success(), "a child failed");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| l.starts_with("sent "))
            .expect("a report");
        let words: Vec<&str> = line.split(' ').collect();
        sent += words[1].parse::<u64>().expect("a count");
        stopped.push(words[3].parse::<u64>().expect("a count"));
    }
    let limit = Cost::from_dollars(LIMIT);
    let per_call = price().cost(&Usage::new(100, 200));
    let worst = price().worst_case(100, 500);
    let day = store_key(&tenant);
    let spent = store.spent(&day).await.expect("reads");
    assert_eq!(
        spent,
        Cost::from_nanodollars(per_call.nanodollars() * sent),
        "the store counted every call that went out, and only those"
    );
    assert!(spent <= limit, "spent {spent} over the limit {limit}");
    // Each call held its worst case: the calls that went out fit by their worst case while
    // others were in flight, and the window filled up: at least limit / worst went out.
    assert!(
        sent >= limit.nanodollars() / worst.nanodollars(),
        "only {sent} calls went out"
    );
    assert!(
        stopped.iter().all(|&n| n > 0),
        "both processes met the limit: {stopped:?}"
    );
    assert_eq!(sent + stopped.iter().sum::<u64>(), 2 * RUNS as u64);
    println!(
        "spend windows: 2 processes × {RUNS} runs at once on one tenant's day window of {limit}: \
         {sent} calls sent, {stopped:?} runs stopped, spent {spent} (never over the limit)"
    );
}

/// The day window's key of `tenant`, as the layer makes it (the runs and this read fall on one
/// UTC day but near midnight).
fn store_key(tenant: &str) -> String {
    let tenant = tenant.to_owned();
    SpendWindow::day(Cost::ZERO)
        .per(move |_| Some(tenant.clone()))
        .key(&RunContext::new(), SystemTime::now())
        .expect("a tenant")
}
