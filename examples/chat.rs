//! An interactive terminal agent: streams the answer as it arrives, shows a live tool log,
//! asks before running a gated tool, and Ctrl-C cancels the current run (not the program)
//! with a summary of what was done.
//!
//! The model comes from the environment, first found:
//!
//! | variables | model |
//! |---|---|
//! | `OPENAI_BASE_URL` or `OPENAI_API_KEY` (+ `OPENAI_MODEL`, default `gpt-4o-mini`) | OpenAI Chat Completions or a compatible server |
//! | `ANTHROPIC_API_KEY` (+ `ANTHROPIC_MODEL`, default `claude-sonnet-4-5`) | Anthropic |
//! | `GEMINI_API_KEY` (+ `GEMINI_MODEL`, default `gemini-2.5-flash`) | Gemini |
//! | none | an offline demo model |
//!
//! ```sh
//! cargo run --example chat --features providers
//! # a local llama-server (llama.cpp) or Ollama:
//! OPENAI_BASE_URL=http://127.0.0.1:8080/v1 cargo run --example chat --features providers
//! OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_MODEL=qwen3 cargo run --example chat --features providers
//! ```
//!
//! Tools: `list_dir` and `read_file` (inside the current directory), and `write_file`, which
//! asks you first.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, mpsc};
use tower_agent::layers::approval::{ApprovalLayer, Gate, ReviewRequest, human_fn};
use tower_agent::layers::retry::{RetryLayer, RetryPolicy};
use tower_agent::layers::summarize::{SummarizeLayer, Trigger};
use tower_agent::layers::{InstructionsLayer, PatchDanglingLayer};
use tower_agent::prelude::*;

#[path = "common/demo.rs"]
mod demo;

use demo::{file_tools, model};

type Lines = Arc<Mutex<mpsc::Receiver<String>>>;

/// The tools that ask before they run.
const GATED: &[&str] = &["write_file"];

/// Read stdin line by line into a channel: the prompt loop and the approval callback share it.
fn stdin_lines() -> Lines {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if tx.send(line).await.is_err() {
                break;
            }
        }
    });
    Arc::new(Mutex::new(rx))
}

async fn say(text: &str) {
    let mut out = tokio::io::stdout();
    let _ = out.write_all(text.as_bytes()).await;
    let _ = out.flush().await;
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (model, name) = model();
    let lines = stdin_lines();

    let tools = file_tools();

    // Gated tools ask on the terminal before they run (the built-in approval layer, inline);
    // anything but "y" rejects the call with an error the model sees. `prompted` tells the
    // tool log that a question broke its line.
    let approvals = lines.clone();
    let prompted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let asked = prompted.clone();
    let approver = human_fn(move |review: ReviewRequest, _: RunContext| {
        let lines = approvals.clone();
        let asked = asked.clone();
        async move {
            asked.store(true, std::sync::atomic::Ordering::SeqCst);
            say(&format!(
                "\n❓ run {}({})? [y/N] ",
                review.tool, review.arguments
            ))
            .await;
            let answer = lines.lock().await.recv().await.unwrap_or_default();
            Ok(if answer.trim().eq_ignore_ascii_case("y") {
                Decision::Approve
            } else {
                Decision::reject("the user declined")
            })
        }
    });
    let mut approval = ApprovalLayer::builder().inline(approver);
    for tool in GATED {
        approval = approval.gate(*tool, Gate::new().allow(["approve", "reject"]));
    }
    let tools = ServiceBuilder::new()
        .layer(approval.build().expect("a valid gate"))
        .service(tools);

    // Long chats are summarized by the same model, with the same retry, past three quarters
    // of a 32k window (the boxed model need not be `Sync`).
    let retry = RetryPolicy::new().max_delay(Duration::from_secs(20));
    let summarizer = ServiceBuilder::new()
        .layer(RetryLayer::new(retry.clone()))
        .service(model.clone());
    let model = ServiceBuilder::new()
        .layer(InstructionsLayer::from(
            "You are a helpful assistant in a terminal. Use the tools for files.",
        ))
        .layer(SummarizeLayer::new(summarizer).trigger(Trigger::fraction(0.75, 32_000)))
        .layer(PatchDanglingLayer::new())
        .layer(RetryLayer::new(retry))
        .service(model);
    let agent = ServiceBuilder::new()
        .layer(PatchDanglingLayer::new())
        .service(Agent::builder().build(model, tools));

    say(&format!(
        "chat with {name} — Ctrl-C cancels a run, Ctrl-D quits\n"
    ))
    .await;
    let mut session = Session::new();
    loop {
        say("\n> ").await;
        let line = tokio::select! {
            line = async { lines.lock().await.recv().await } => line,
            _ = tokio::signal::ctrl_c() => None,
        };
        let Some(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let mut run = agent
            .clone()
            .spawn(AgentRequest::new(std::mem::take(&mut session), line));
        let mut events = run.take_events().expect("a fresh run has its stream");
        let mut streamed = false;
        let mut tools_run: Vec<String> = Vec::new();
        let mut cancelled = false;
        loop {
            tokio::select! {
                event = events.recv() => match event {
                    Some(Event::TextDelta { delta, .. }) => { streamed = true; say(&delta).await; }
                    // A terminal cannot take text back: it says so, and the answer follows.
                    Some(Event::Retract { .. }) => {
                        streamed = false;
                        say("\n↺ (the text above is withdrawn)\n").await;
                    }
                    Some(Event::Retrying { delay, error, .. }) => {
                        say(&format!("\n⏳ {error}; retrying in {delay:?}\n")).await;
                    }
                    Some(Event::ToolStarted { name, .. }) => say(&format!("\n🔧 {name} ...")).await,
                    Some(Event::ToolFinished { name, is_error, .. }) => {
                        let mark = if is_error { "✗" } else { "✓" };
                        if prompted.swap(false, std::sync::atomic::Ordering::SeqCst) {
                            // A question was asked since the tool started: a line of its own.
                            say(&format!("\n🔧 {name} {mark}\n")).await;
                        } else {
                            say(&format!(" {mark}\n")).await;
                        }
                        tools_run.push(format!("{name} {}", if is_error { "✗" } else { "✓" }));
                    }
                    Some(_) => {}
                    None => break,
                },
                _ = tokio::signal::ctrl_c(), if !cancelled => {
                    cancelled = true;
                    run.cancel();
                }
            }
        }
        match run.join().await {
            Ok(res) => {
                match &res.outcome {
                    Outcome::Cancelled { .. } => {
                        say(&format!(
                            "\n⏹ cancelled after {} round(s); tools run: {}\n",
                            res.rounds,
                            if tools_run.is_empty() {
                                "none".into()
                            } else {
                                tools_run.join(", ")
                            }
                        ))
                        .await
                    }
                    _ if !streamed => say(&format!("{}\n", res.text().unwrap_or_default())).await,
                    _ => say("\n").await,
                }
                session = res.session;
            }
            Err(mut error) => {
                say(&format!("\n⚠ {error}\n")).await;
                session = error.take_session().unwrap_or_default();
            }
        }
    }
    say("\nbye\n").await;
    Ok(())
}
