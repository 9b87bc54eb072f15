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

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tower_agent::Role;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, mpsc};
use tower::util::BoxCloneService;
use tower_agent::layers::approval::{ApprovalLayer, Gate, ReviewRequest, human_fn};
use tower_agent::layers::retry::{RetryLayer, RetryPolicy};
use tower_agent::layers::summarize::{SummarizeLayer, Trigger};
use tower_agent::layers::{InstructionsLayer, PatchDanglingLayer};
use tower_agent::prelude::*;
use tower_agent::providers::{Anthropic, Gemini, OpenAi};
use tower_agent_test::ScriptedModel;

type Model = BoxCloneService<ModelRequest, ModelResponse, Error>;
type Lines = Arc<Mutex<mpsc::Receiver<String>>>;

/// The tools that ask before they run.
const GATED: &[&str] = &["write_file"];

#[derive(Deserialize, JsonSchema)]
struct PathArgs {
    /// A path relative to the current directory.
    path: String,
}

#[derive(Deserialize, JsonSchema)]
struct WriteArgs {
    /// A path relative to the current directory.
    path: String,
    /// The text to write.
    content: String,
}

/// `path` inside the current directory, or an error the model sees.
fn inside(path: &str) -> Result<PathBuf, String> {
    let relative = Path::new(path);
    if relative
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        Ok(relative.to_path_buf())
    } else {
        Err(format!("`{path}` is outside the current directory"))
    }
}

async fn list_dir(args: PathArgs) -> Result<String, String> {
    let mut entries = tokio::fs::read_dir(inside(&args.path)?)
        .await
        .map_err(|e| format!("cannot list `{}`: {e}", args.path))?;
    let mut names = Vec::new();
    while let Ok(Some(entry)) = entries.next_entry().await {
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names.join("\n"))
}

async fn read_file(args: PathArgs) -> Result<String, String> {
    let text = tokio::fs::read_to_string(inside(&args.path)?)
        .await
        .map_err(|e| format!("cannot read `{}`: {e}", args.path))?;
    Ok(text.chars().take(4000).collect())
}

async fn write_file(args: WriteArgs) -> Result<String, String> {
    tokio::fs::write(inside(&args.path)?, &args.content)
        .await
        .map_err(|e| format!("cannot write `{}`: {e}", args.path))?;
    Ok(format!(
        "wrote {} bytes to {}",
        args.content.len(),
        args.path
    ))
}

/// The model the environment names, or the offline demo model.
fn model() -> (Model, String) {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if var("OPENAI_BASE_URL").is_some() || var("OPENAI_API_KEY").is_some() {
        let name = var("OPENAI_MODEL").unwrap_or_else(|| "gpt-4o-mini".into());
        return (
            BoxCloneService::new(OpenAi::new(name.clone())),
            format!("openai {name}"),
        );
    }
    if var("ANTHROPIC_API_KEY").is_some() {
        let name = var("ANTHROPIC_MODEL").unwrap_or_else(|| "claude-sonnet-4-5".into());
        return (
            BoxCloneService::new(Anthropic::new(name.clone())),
            format!("anthropic {name}"),
        );
    }
    if var("GEMINI_API_KEY").is_some() {
        let name = var("GEMINI_MODEL").unwrap_or_else(|| "gemini-2.5-flash".into());
        return (
            BoxCloneService::new(Gemini::new(name.clone())),
            format!("gemini {name}"),
        );
    }
    (
        BoxCloneService::new(demo_model()),
        "the offline demo model".into(),
    )
}

/// Offline: lists the directory when asked about files, writes a note when asked to, echoes
/// otherwise.
fn demo_model() -> ScriptedModel {
    ScriptedModel::from_fn(|req: &ModelRequest| {
        let asked = req
            .messages
            .iter()
            .rev()
            .find(|m| m.role == Role::User)
            .map(Message::text)
            .unwrap_or_default()
            .to_lowercase();
        let last_result = req
            .messages
            .last()
            .and_then(|m| m.tool_results().next())
            .cloned();
        let id = |n: &str| format!("demo_{}_{n}", req.messages.len());
        Ok(match last_result {
            Some(result) if result.name == "list_dir" => ModelResponse::text(format!(
                "This directory holds {} entries: {}.",
                result.content.lines().count(),
                result.content.lines().collect::<Vec<_>>().join(", ")
            )),
            Some(result) => ModelResponse::text(format!("Done: {}", result.content)),
            None if asked.contains("file") || asked.contains("list") => ModelResponse::tool_calls(
                [ToolCall::new(id("ls"), "list_dir", json!({ "path": "." }))],
            ),
            None if asked.contains("write") || asked.contains("note") => {
                ModelResponse::tool_calls([ToolCall::new(
                    id("w"),
                    "write_file",
                    json!({ "path": "note.txt", "content": "a note from the demo model\n" }),
                )])
            }
            None => ModelResponse::text(format!(
                "(offline demo model) You said: {asked}. Ask me to list the files, or to write a note."
            )),
        })
    })
}

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

    let tools = ToolSet::new()
        .tool(tool_fn(
            "list_dir",
            "List a directory (relative path).",
            list_dir,
        ))
        .tool(tool_fn(
            "read_file",
            "Read a text file (relative path).",
            read_file,
        ))
        .tool(tool_fn(
            "write_file",
            "Write a text file (relative path).",
            write_file,
        ));

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
