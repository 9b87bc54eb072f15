//! A coding loop: a coder and a reviewer, one after the other, iteration after iteration, until
//! a judge (a model answering `{"decision": .., "reason": ..}`) says the work is done. A cheap
//! model writes a progress line for the UI every second; the workflow's lifecycle is printed
//! with the path of each agent (`coding_loop/2/reviewer`).
//!
//! Offline by default: the coder, the reviewer, the judge and the progress writer are scripted.
//! With `--real` and the `providers` feature, the models come from the environment (as in the
//! chat example: `OPENAI_BASE_URL` / `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `GEMINI_API_KEY`).
//!
//! ```sh
//! cargo run --example coding_loop
//! OPENAI_BASE_URL=http://127.0.0.1:8080/v1 cargo run --example coding_loop --features providers -- --real
//! ```

use std::time::Duration;
use tower_agent::Role;

use serde_json::json;
use tower::util::BoxCloneSyncService;
use tower_agent::prelude::*;
use tower_agent::workflow::progress::ProgressLayer;
use tower_agent::workflow::{Loop, ModelJudge, Sequential, WorkflowObserver, workflow_observer};
use tower_agent_test::ScriptedModel;

type Model = BoxCloneSyncService<ModelRequest, ModelResponse, Error>;

/// The coder, the reviewer, the judge and the progress writer.
struct Models {
    coder: Model,
    reviewer: Model,
    judge: Model,
    progress: Model,
    name: String,
}

/// Offline: the coder writes twice, the reviewer asks for tests once, the judge follows it.
fn scripted() -> Models {
    let coder = ScriptedModel::from_fn(|req: &ModelRequest| {
        let wrote = req
            .messages
            .iter()
            .filter(|m| m.tool_calls().any(|c| c.name == "write_file"))
            .count();
        let last_is_result = req.messages.last().is_some_and(|m| m.role == Role::Tool);
        Ok(if last_is_result {
            ModelResponse::text(format!("Version {wrote} of add() is written."))
        } else if wrote == 0 {
            ModelResponse::tool_calls([ToolCall::new(
                "w1",
                "write_file",
                json!({"path": "src/add.rs", "content": "pub fn add(a: i64, b: i64) -> i64 { a + b }"}),
            )])
        } else {
            ModelResponse::tool_calls([ToolCall::new(
                format!("w{}", wrote + 1),
                "write_file",
                json!({"path": "src/add.rs", "content": "pub fn add(a: i64, b: i64) -> i64 { a + b }\n#[test] fn adds() { assert_eq!(add(2, 3), 5); }"}),
            )])
        })
    });
    let reviewer = ScriptedModel::from_fn(|req: &ModelRequest| {
        let code: String = req
            .messages
            .iter()
            .flat_map(|m| m.tool_calls())
            .filter(|c| c.name == "write_file")
            .map(|c| c.arguments.clone())
            .last()
            .unwrap_or_default();
        Ok(ModelResponse::text(if code.contains("#[test]") {
            "LGTM: add() is tested."
        } else {
            "add() has no tests: add one."
        }))
    });
    let judge = ScriptedModel::from_fn(|req: &ModelRequest| {
        let result = req.messages.first().map(Message::text).unwrap_or_default();
        Ok(ModelResponse::text(if result.contains("LGTM") {
            r#"{"decision": "stop", "reason": "the reviewer approved"}"#
        } else {
            r#"{"decision": "continue", "reason": "the reviewer asked for tests"}"#
        }))
    });
    let progress = ScriptedModel::from_fn(|req: &ModelRequest| {
        let digest = req.messages.last().map(Message::text).unwrap_or_default();
        let line = if digest.contains("reviewer") {
            "Reviewing the change"
        } else {
            "Writing add()"
        };
        Ok(ModelResponse::text(line))
    });
    Models {
        coder: BoxCloneSyncService::new(coder),
        reviewer: BoxCloneSyncService::new(reviewer),
        judge: BoxCloneSyncService::new(judge),
        progress: BoxCloneSyncService::new(progress),
        name: "scripted models (offline)".into(),
    }
}

/// With `--real`: the model the environment names, for every role.
#[cfg(feature = "providers")]
fn real() -> Option<Models> {
    use tower_agent::providers::{Anthropic, Gemini, OpenAi};
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let (model, name): (Model, String) =
        if var("OPENAI_BASE_URL").is_some() || var("OPENAI_API_KEY").is_some() {
            let name = var("OPENAI_MODEL").unwrap_or_else(|| "gpt-4o-mini".into());
            (
                BoxCloneSyncService::new(OpenAi::new(name.clone())),
                format!("openai {name}"),
            )
        } else if var("ANTHROPIC_API_KEY").is_some() {
            let name = var("ANTHROPIC_MODEL").unwrap_or_else(|| "claude-sonnet-4-5".into());
            (
                BoxCloneSyncService::new(Anthropic::new(name.clone())),
                format!("anthropic {name}"),
            )
        } else if var("GEMINI_API_KEY").is_some() {
            let name = var("GEMINI_MODEL").unwrap_or_else(|| "gemini-2.5-flash".into());
            (
                BoxCloneSyncService::new(Gemini::new(name.clone())),
                format!("gemini {name}"),
            )
        } else {
            return None;
        };
    Some(Models {
        coder: model.clone(),
        reviewer: model.clone(),
        judge: model.clone(),
        progress: model,
        name,
    })
}

#[cfg(not(feature = "providers"))]
fn real() -> Option<Models> {
    None
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct WriteArgs {
    /// The file's path.
    path: String,
    /// Its new content.
    content: String,
}

/// Prints the workflow's lifecycle.
struct Printer;

impl WorkflowObserver for Printer {
    fn iteration_started(&self, path: &str, iteration: u32) {
        println!("{path}: iteration {iteration}");
    }
    fn tool_finished(&self, path: &str, name: &str, is_error: bool) {
        println!("{path}: tool {name} {}", if is_error { "✗" } else { "✓" });
    }
    fn text(&self, path: &str, text: &str) {
        println!("{path}: says: {}", text.lines().next().unwrap_or_default());
    }
    fn iteration_ended(&self, path: &str, iteration: u32, next: bool, reason: &str) {
        let verdict = if next { "continue" } else { "stop" };
        println!("{path}: iteration {iteration}: {verdict} ({reason})");
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let wants_real = std::env::args().any(|a| a == "--real");
    let models = match wants_real.then(real).flatten() {
        Some(models) => models,
        None => {
            if wants_real {
                println!("--real: no provider in the environment (or no `providers` feature)");
            }
            scripted()
        }
    };
    println!("coding loop with {}", models.name);

    // A slow file write, so that the progress writer has something to say.
    let write_file = tool_fn(
        "write_file",
        "Write a file of the project.",
        |args: WriteArgs| async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            Ok::<_, Error>(format!(
                "wrote {} bytes to {}",
                args.content.len(),
                args.path
            ))
        },
    );
    let tools = ToolSet::new().tool(write_file);
    let coder = Agent::builder()
        .system("You write Rust code with the write_file tool, then say what you wrote.")
        .build(models.coder, tools);
    let reviewer = Agent::builder()
        .system("You review the code written above. Say LGTM when it is good and tested.")
        .build(models.reviewer, ToolSet::new());
    let coding_loop = Loop::new(
        "coding_loop",
        Sequential::new("pair")
            .step("coder", coder)
            .step_with_input("reviewer", reviewer, "Review the change above."),
        ModelJudge::new(models.judge),
    )
    .max_iterations(4);

    let progress = ProgressLayer::new(models.progress)
        .every(Duration::from_secs(1))
        .every_events(1_000)
        .on_summary(|line| println!("[progress] {line}"));
    let workflow = ServiceBuilder::new().layer(progress).service(coding_loop);

    let req = AgentRequest::new(Session::with_id("coding"), "Write add(a, b) in Rust.")
        .with_observer(workflow_observer(Printer));
    let res = workflow.oneshot(req).await?;
    match res.text() {
        Some(answer) => println!("answer: {answer}"),
        None => println!(
            "ended: {}",
            res.outcome
                .summary()
                .unwrap_or_else(|| "interrupted".into())
        ),
    }
    println!("model calls: {}", res.rounds);
    Ok(())
}
