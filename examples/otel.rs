//! An agent run as one OpenTelemetry trace, exported over OTLP/HTTP: the run's
//! `invoke_agent` span, a `model` span per round with the provider's `chat {model}` span per
//! HTTP call beneath (tokens, model, finish reason; a retried 429 is a failed `chat` span of
//! its own), and an `execute_tool` span per tool call. The providers' GenAI metrics go to the
//! same receiver.
//!
//! ```sh
//! # Arize Phoenix (`pip install arize-phoenix`, `phoenix serve`) takes OTLP/HTTP at :6006,
//! # and has no metrics receiver:
//! OPENAI_API_KEY=sk-... OTEL_METRICS_EXPORTER=none cargo run --example otel --features otel,openai
//! # an OpenTelemetry Collector, and a local llama-server:
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 OPENAI_BASE_URL=http://127.0.0.1:8080/v1 \
//!     cargo run --example otel --features otel,openai -- "What is the weather in Oslo?"
//! ```
//!
//! The messages go on the `chat` spans only with
//! `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`, the conventions' switch.

use schemars::JsonSchema;
use serde::Deserialize;
use tower_agent::layers::retry::{RetryLayer, RetryPolicy};
use tower_agent::otel::Otlp;
use tower_agent::prelude::*;
use tower_agent::providers::OpenAi;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Arguments of the `weather` tool.
#[derive(Deserialize, JsonSchema)]
struct WeatherArgs {
    /// The city to look up.
    city: String,
}

async fn weather(args: WeatherArgs) -> Result<String, String> {
    match args.city.to_lowercase().as_str() {
        "paris" => Ok("18°C, sunny".to_owned()),
        "oslo" => Ok("4°C, light rain".to_owned()),
        _ => Err(format!("no forecast for `{}`", args.city)),
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .filter(|value| !value.trim().is_empty())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let endpoint = env("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or("http://127.0.0.1:6006".into());
    let question = std::env::args()
        .nth(1)
        .unwrap_or("What is the weather in Paris?".into());

    // The export, and the subscriber that feeds it.
    let telemetry = Otlp::http(&endpoint)
        .service_name("weather-agent")
        .metrics(env("OTEL_METRICS_EXPORTER").as_deref() != Some("none"))
        .start()?;
    tracing_subscriber::registry()
        .with(telemetry.layer())
        .with(LevelFilter::INFO)
        .init();

    // The agent: a provider behind the retry policy, one tool.
    let capture =
        env("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT").as_deref() == Some("true");
    let model =
        OpenAi::new(env("OPENAI_MODEL").unwrap_or("gpt-4o-mini".into())).capture_content(capture);
    let model = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::new()))
        .service(model);
    let tools = ToolSet::new().tool(tool_fn("weather", "The forecast for a city.", weather));
    let agent = Agent::builder().build(model, tools);

    let session = Session::new();
    let conversation = session.id.clone();
    let res = agent.oneshot(AgentRequest::new(session, question)).await?;
    println!("{}", res.text().unwrap_or_default());
    println!(
        "{} rounds, {} tokens in, {} out; trace of conversation {conversation} sent to {endpoint}",
        res.rounds, res.usage.input_tokens, res.usage.output_tokens
    );
    telemetry.shutdown()
}
