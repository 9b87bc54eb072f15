//! Human approval of a shell command, the interrupt-and-resume way: the run pauses at the
//! gated call, the session is saved as JSON, a human decides, and a fresh agent resumes from
//! the saved file. Ctrl-C cancels a run (or the review) with a summary of what was done.
//!
//! The agent is scripted (offline): it lists the files, then wants to run `rm -rf build`. The
//! shell is simulated: nothing is run on your machine.
//!
//! ```sh
//! cargo run --example approval                                 # asks you: [a]pprove, [e]dit, [r]eject
//! cargo run --example approval -- approve                      # decisions from arguments (no terminal)
//! cargo run --example approval -- edit "rm -rf build/tmp"
//! cargo run --example approval -- reject "not on a Friday"
//! printf 'e\nrm -rf build/cache\n' | cargo run --example approval   # answers piped in
//! ```
//!
//! `--slow` makes the simulated shell take 5 seconds, to try Ctrl-C while it runs.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_agent::CancellationToken;
use tower_agent::Decisions;
use tower_agent::Progress;
use tower_agent::tools::NoArgs;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tower_agent::layers::approval::{Approval, ApprovalLayer, Gate, ReviewRequest};
use tower_agent::prelude::*;
use tower_agent_test::ScriptedModel;

#[derive(Deserialize, JsonSchema)]
struct ShellArgs {
    /// The command line.
    cmd: String,
}

/// The model: list the files, then ask to remove the build directory, then report.
fn model() -> ScriptedModel {
    ScriptedModel::from_fn(|req| {
        let results: Vec<&ToolResult> =
            req.messages.iter().flat_map(|m| m.tool_results()).collect();
        if results.is_empty() {
            return Ok(ModelResponse::tool_calls([
                ToolCall::new("call_1", "list_files", json!({})),
                ToolCall::new("call_2", "shell", json!({"cmd": "rm -rf build"})),
            ]));
        }
        let shell = results.iter().find(|r| r.name == "shell");
        let ran = req
            .messages
            .iter()
            .flat_map(|m| m.tool_calls())
            .find(|c| c.name == "shell")
            .map(|c| c.arguments.clone())
            .unwrap_or_default();
        Ok(ModelResponse::text(match shell {
            Some(r) if r.is_error => format!("I did not clean up. {}", r.content),
            Some(r) => format!(
                "Cleaned up: {} (the history shows the call as {ran}).",
                r.content
            ),
            None => "Nothing to report.".to_owned(),
        }))
    })
}

fn agent(slow: bool) -> Agent<ScriptedModel, Approval<ToolSet>> {
    let list = tool_fn("list_files", "List the files.", |_: NoArgs| async {
        Ok::<_, Error>("Cargo.toml src/ build/")
    });
    let shell = tool_fn(
        "shell",
        "Run a shell command.",
        move |args: ShellArgs| async move {
            // Simulated: nothing runs on your machine.
            tokio::time::sleep(Duration::from_millis(if slow { 5_000 } else { 50 })).await;
            Ok::<_, Error>(format!("ran: {}", args.cmd))
        },
    );
    let approval = ApprovalLayer::builder()
        .gate(
            "shell",
            Gate::new()
                .allow(["approve", "edit", "reject"])
                .describe(|call| {
                    format!("Run a shell command on your machine: {}", call.arguments)
                }),
        )
        .build()
        .expect("a valid gate");
    let tools = ToolSet::new().tool(list).tool(shell);
    let tools = ServiceBuilder::new().layer(approval).service(tools);
    Agent::builder().build(model(), tools)
}

/// Where decisions come from.
enum Source {
    /// One decision given on the command line, for every review.
    Args(Decision),
    /// Lines typed at a terminal or piped in.
    Lines(tokio::io::Lines<BufReader<tokio::io::Stdin>>, bool),
}

fn from_args(args: &[String]) -> Option<Decision> {
    let rest = |from: usize| args[from..].join(" ");
    match args.first().map(String::as_str) {
        Some("approve") => Some(Decision::Approve),
        Some("edit") => Some(Decision::edit(json!({ "cmd": rest(1) }))),
        Some("reject") => Some(Decision::reject(rest(1))),
        _ => None,
    }
}

/// The run's cancellation: Ctrl-C cancels the token of the run in progress, or the review.
#[derive(Clone, Default)]
struct CtrlC(Arc<Mutex<CancellationToken>>);

impl CtrlC {
    fn fresh(&self) -> CancellationToken {
        let token = CancellationToken::new();
        *self.0.lock().expect("lock") = token.clone();
        token
    }

    fn current(&self) -> CancellationToken {
        self.0.lock().expect("lock").clone()
    }
}

/// Ask for a decision on one review. `None`: cancelled (Ctrl-C, or the input ended).
async fn decide(source: &mut Source, review: &ReviewRequest, ctrl_c: &CtrlC) -> Option<Decision> {
    println!(
        "review: {} wants to run `{}` {}",
        review.call_id, review.tool, review.arguments
    );
    println!("        {}", review.description);
    let (lines, terminal) = match source {
        Source::Args(decision) => {
            println!(
                "decision (from the arguments): {}",
                serde_json::to_string(decision).ok()?
            );
            return Some(decision.clone());
        }
        Source::Lines(lines, terminal) => (lines, *terminal),
    };
    let token = ctrl_c.fresh();
    let ask = |prompt: &str| {
        if terminal {
            print!("{prompt}");
            use std::io::Write;
            let _ = std::io::stdout().flush();
        }
    };
    ask("[a]pprove, [e]dit, [r]eject? ");
    let answer = tokio::select! {
        line = lines.next_line() => line.ok()??,
        () = token.cancelled() => return None,
    };
    let decision = match answer.trim() {
        "a" | "approve" => Decision::Approve,
        "e" | "edit" => {
            ask("new command: ");
            let cmd = tokio::select! {
                line = lines.next_line() => line.ok()??,
                () = token.cancelled() => return None,
            };
            Decision::edit(json!({ "cmd": cmd.trim() }))
        }
        // Anything else rejects (fail closed); the text after `r` is the reason.
        other => {
            let reason = other
                .strip_prefix("reject")
                .or_else(|| other.strip_prefix('r'))
                .unwrap_or(other);
            Decision::reject(reason.trim())
        }
    };
    println!("decision: {}", serde_json::to_string(&decision).ok()?);
    Some(decision)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let slow = args.iter().any(|a| a == "--slow");
    args.retain(|a| a != "--slow");
    let mut source = match from_args(&args) {
        Some(decision) => Source::Args(decision),
        None => Source::Lines(
            BufReader::new(tokio::io::stdin()).lines(),
            std::io::stdin().is_terminal(),
        ),
    };

    let ctrl_c = CtrlC::default();
    let watcher = ctrl_c.clone();
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            watcher.current().cancel();
        }
    });

    let file =
        std::env::temp_dir().join(format!("tower-agent-approval-{}.json", std::process::id()));
    let mut request = AgentRequest::new(Session::new(), "Clean up the build directory.");
    loop {
        let run = agent(slow).spawn(request.with_cancellation(ctrl_c.fresh()));
        let res = run.join().await?;
        let interrupts = match &res.outcome {
            Outcome::Interrupted { interrupts } => interrupts.clone(),
            Outcome::Completed { message } => {
                println!("tools: {}", Progress::of(&res.session.history));
                println!("answer: {}", message.text());
                break;
            }
            other => {
                println!(
                    "{}",
                    other.summary().unwrap_or_else(|| format!("{other:?}"))
                );
                break;
            }
        };

        // Pause: save the session, as a host would between two requests.
        std::fs::write(
            &file,
            serde_json::to_vec_pretty(&res.session).expect("JSON"),
        )
        .map_err(|e| Error::backend(format!("cannot save the session: {e}")))?;
        println!(
            "paused: {} call(s) wait; session saved to {}",
            interrupts.len(),
            file.display()
        );

        let mut decisions = Decisions::new();
        for interrupt in &interrupts {
            let Some(review) = ReviewRequest::from_interrupt(interrupt) else {
                continue;
            };
            match decide(&mut source, &review, &ctrl_c).await {
                Some(decision) => decisions.insert(review.call_id.clone(), decision),
                None => {
                    let done = Progress::of(&res.session.history);
                    println!("Cancelled at the review; nothing more ran. Was working on: {done}");
                    println!("the session stays saved in {}", file.display());
                    return Ok(());
                }
            }
        }

        // Resume: a fresh agent, from the saved file alone.
        let saved = std::fs::read(&file)
            .map_err(|e| Error::backend(format!("cannot load the session: {e}")))?;
        let session: Session = serde_json::from_slice(&saved).expect("the saved session");
        request = AgentRequest::resume(session, decisions);
    }
    let _ = std::fs::remove_file(&file);
    Ok(())
}
