//! Quickstart: an agent composed with `ServiceBuilder`, two typed tools, one custom
//! `before_model` and one `before_tool` callback, and a live tool log.
//!
//! It runs offline: the model is a scripted demo model that plays a small, deterministic
//! conversation and writes its final answer from the tool results it received.
//!
//! ```sh
//! cargo run --example quickstart
//! ```
//!
//! With `--session FILE` (and the `sqlite` feature) the session is kept in a SQLite file: run
//! it twice and the second run goes on from the first.
//!
//! ```sh
//! cargo run --example quickstart --features sqlite -- --session quickstart.db
//! ```

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tower_agent::layers::PatchDanglingLayer;
use tower_agent::layers::RetryLayer;
use tower_agent::layers::retry::RetryPolicy;
use tower_agent::prelude::*;
use tower_agent_test::ScriptedModel;

/// Arguments of the `weather` tool.
#[derive(Deserialize, JsonSchema)]
struct WeatherArgs {
    /// The city to look up.
    city: String,
}

/// Arguments of the `percent` tool.
#[derive(Deserialize, JsonSchema)]
struct PercentArgs {
    /// The percentage, e.g. 12.5 for 12.5%.
    percent: f64,
    /// The value to take it of.
    of: f64,
}

/// The first typed tool: a small offline forecast table. Unknown cities fail, and the model
/// sees the error.
async fn weather(args: WeatherArgs) -> Result<String, String> {
    match args.city.to_lowercase().as_str() {
        "paris" => Ok("18°C, sunny".to_owned()),
        "oslo" => Ok("4°C, light rain".to_owned()),
        _ => Err(format!("no forecast for `{}`", args.city)),
    }
}

/// The second typed tool.
async fn percent(args: PercentArgs) -> Result<f64, Error> {
    Ok(args.percent / 100.0 * args.of)
}

/// The offline demo model: round 1 asks for the weather and a percentage; round 2 tries two
/// calls that will fail (an unknown city, and a tool the policy forbids); round 3 answers from
/// the results it got.
fn demo_model() -> ScriptedModel {
    ScriptedModel::from_fn(|req: &ModelRequest| {
        let response = match req.ctx.round() {
            1 => ModelResponse::new(Message::assistant_with_calls(
                "Let me check the forecast and do the maths.",
                [
                    ToolCall::new("call_1", "weather", json!({ "city": "Paris" })),
                    ToolCall::new("call_2", "percent", json!({ "percent": 12.5, "of": 80 })),
                ],
            )),
            2 => ModelResponse::tool_calls([
                ToolCall::new("call_3", "weather", json!({ "city": "Atlantis" })),
                ToolCall::new("call_4", "shell", json!({ "command": "rm -rf /" })),
            ]),
            _ => {
                let result = |id: &str| {
                    req.messages
                        .iter()
                        .flat_map(Message::tool_results)
                        .find(|r| r.call_id == id)
                        .map(|r| r.content.clone())
                        .unwrap_or_default()
                };
                ModelResponse::text(format!(
                    "In Paris it is {}. 12.5% of 80 is {}. (Atlantis has no forecast, and I may not run shell commands.)",
                    result("call_1"),
                    result("call_2"),
                ))
            }
        };
        Ok(response)
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    // Two typed tools: their JSON schemas come from the argument types.
    let tools = ToolSet::new()
        .tool(tool_fn("weather", "The forecast for a city.", weather))
        .tool(tool_fn("percent", "A percentage of a value.", percent));

    // `--session FILE`: keep the session in a SQLite file, saved at every step.
    let file = std::env::args().skip_while(|a| a != "--session").nth(1);

    // The agent places its built-ins (here dangling-call patching and retries of the
    // provider's transient failures) and your own layers in named places.
    let builder = Agent::builder()
        .system("You are a helpful assistant.")
        .with(PatchDanglingLayer::new())
        .with(RetryLayer::new(RetryPolicy::new()))
        // A custom before_model callback: add the round to the system prompt of every call
        // (a request-only edit: the session is not changed).
        .model_layer(before_model(|mut req: ModelRequest| async move {
            let round = req.ctx.round();
            req.append_system(&format!("This is round {round}. Be concise."));
            Ok(Flow::Continue(req))
        }))
        // A custom before_tool callback: a policy that answers forbidden calls itself, so the
        // tool service never sees them (a short-circuit).
        .tool_layer(before_tool(|req: ToolRequest| async move {
            if req.call.name == "shell" {
                return Ok(Flow::Answer(ToolResponse::error(
                    &req.call,
                    "blocked by policy: shell commands are not allowed",
                )));
            }
            Ok(Flow::Continue(req))
        }));
    let (builder, session) = match &file {
        #[cfg(feature = "sqlite")]
        Some(file) => {
            let store = tower_agent::sessions::SqliteSessions::open(file).await?;
            // A request names its session by id; the store supplies the rest.
            (
                builder.with(tower_agent::sessions::StoreLayer::new(store)),
                Session::with_id("quickstart"),
            )
        }
        #[cfg(not(feature = "sqlite"))]
        Some(_) => {
            eprintln!(
                "--session needs the sqlite feature: cargo run --example quickstart --features sqlite -- --session FILE"
            );
            std::process::exit(2);
        }
        None => (builder, Session::new()),
    };
    let agent = builder.build(demo_model(), tools);

    let question = "What's the weather in Paris, and what is 12.5% of 80?";
    println!("tower-agent quickstart (offline, scripted demo model)\n");
    println!("> {question}");

    // Spawn the run and print the tool log live from its event stream.
    let mut run = agent.spawn(AgentRequest::new(session, question));
    let mut events = run.take_events().expect("the stream is taken once");
    let mut names = std::collections::HashMap::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::RoundStarted { round } => println!("round {round}"),
            Event::ToolStarted { call_id, name, .. } => {
                names.insert(call_id, name);
            }
            Event::ToolFinished {
                call_id, is_error, ..
            } => {
                let name = names.get(&call_id).map(String::as_str).unwrap_or("?");
                let mark = if is_error { "✗" } else { "✓" };
                println!("  tool {name} {mark}");
            }
            _ => {}
        }
    }

    let response = run.join().await?;
    let calls = response
        .session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .count();
    match &response.outcome {
        Outcome::Completed { message } => println!("\nanswer: {}", message.text()),
        other => println!("\nthe run ended without an answer: {other:?}"),
    }
    println!(
        "({} rounds, {calls} tool calls, {} messages in the session)",
        response.rounds,
        response.session.history.len()
    );
    if let Some(file) = file {
        println!("session `{}` kept in {file}", response.session.id);
    }
    Ok(())
}
