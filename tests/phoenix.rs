//! An agent run exported over OTLP/HTTP to a real trace viewer, Arize Phoenix, and read back
//! over Phoenix's REST API: one trace, the agent's span at the root, the model's and the
//! tools' spans beneath it, tokens and the model on the model spans.
//!
//! `.ci/run` installs Phoenix (PyPI `arize-phoenix`, pinned) and aimock, starts both on
//! 127.0.0.1 and sets `PHOENIX_URL` and `AIMOCK_URL`. Without them the test says so and
//! passes, except in CI (`CI=true`), where a missing server fails it.

use std::time::Duration;

use serde_json::Value;
use tower_agent::layers::retry::{RetryLayer, RetryPolicy};
use tower_agent::new_id;
use tower_agent::otel::Otlp;
use tower_agent::prelude::*;
use tower_agent::providers::OpenAi;
use tower_agent::{ErrorKind, ToolCall, Usage};
use tower_agent_test::StubTool;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;

const KEY: &str = "sk-aimock-0123456789";

/// The server's URL from `var`, or `None` (printed) when the test cannot run here.
fn server(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => Some(url.trim_end_matches('/').to_owned()),
        _ => {
            let reason =
                format!("{var} is not set: the server is not running (`bash .ci/run` starts it)");
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{reason}");
            eprintln!("skipped: {reason}");
            None
        }
    }
}

/// The spans of `project`, once there are at least `count` (Phoenix ingests in the
/// background).
async fn spans(phoenix: &str, project: &str, count: usize) -> Vec<Value> {
    let http = reqwest::Client::new();
    let url = format!("{phoenix}/v1/projects/{project}/spans?limit=100");
    let mut last = Value::Null;
    for _ in 0..150 {
        let response = http.get(&url).send().await.expect("Phoenix answers");
        if response.status().is_success() {
            last = response.json().await.expect("JSON");
            if let Some(data) = last["data"].as_array() {
                if data.len() >= count {
                    return data.clone();
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("Phoenix did not get {count} spans of {project} in 30 s: {last:#}");
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|span| span["name"] == name).collect()
}

/// Whether `span` has `ancestor` above it.
fn beneath(spans: &[Value], span: &Value, ancestor: &Value) -> bool {
    let mut parent = span["parent_id"].clone();
    while let Some(id) = parent.as_str() {
        if ancestor["context"]["span_id"] == id {
            return true;
        }
        parent = spans
            .iter()
            .find(|s| s["context"]["span_id"] == id)
            .map_or(Value::Null, |s| s["parent_id"].clone());
    }
    false
}

#[tokio::test(flavor = "current_thread")]
async fn an_agent_run_is_one_trace_in_phoenix() {
    let (Some(phoenix), Some(aimock)) = (server("PHOENIX_URL"), server("AIMOCK_URL")) else {
        return;
    };
    // A project of its own: the test reads back exactly its spans.
    let project = format!("tower-agent-{}", new_id());
    let telemetry = Otlp::http(&phoenix)
        .service_name("tower-agent-tests")
        .resource("openinference.project.name", project.clone())
        .metrics(false)
        .start()
        .expect("the exporter");
    // The test's thread only: the current-thread runtime polls every task here.
    let subscriber = tracing_subscriber::registry()
        .with(telemetry.layer())
        .with(LevelFilter::INFO);
    let guard = tracing::subscriber::set_default(subscriber);

    // aimock answers the first call with a 429, then a weather call, then the answer.
    let model = OpenAi::new("gpt-4o-mini")
        .base_url(format!("{aimock}/v1"))
        .api_key(KEY)
        .header("x-test-id", &new_id())
        .expect("a valid header");
    let model = ServiceBuilder::new()
        .layer(RetryLayer::new(
            RetryPolicy::new()
                .throttle(None)
                .jitter(Duration::ZERO)
                .max_delay(Duration::from_secs(2)),
        ))
        .service(model);
    let tools = ToolSet::new().tool(StubTool::returning("weather", "18°C, sunny"));
    let agent = Agent::builder().name("weather_agent").build(model, tools);
    let session = Session::new();
    let conversation = session.id.clone();
    let res = agent
        .oneshot(AgentRequest::new(session, "What is the weather in Paris?"))
        .await
        .expect("the run completes");
    drop(guard);
    telemetry.shutdown().expect("exported");

    // The run: 1 agent span, 2 rounds, 3 HTTP calls (one refused), 1 tool call.
    let spans = spans(&phoenix, &project, 7).await;
    let all = Value::Array(spans.clone()).to_string();
    assert!(!all.contains(KEY), "the key reached the trace");
    let traces: std::collections::BTreeSet<_> = spans
        .iter()
        .map(|span| span["context"]["trace_id"].to_string())
        .collect();
    assert_eq!(traces.len(), 1, "one trace: {traces:?}");

    let [agent] = named(&spans, "invoke_agent weather_agent")[..] else {
        panic!("one agent span: {spans:#?}")
    };
    assert_eq!(
        agent["parent_id"],
        Value::Null,
        "the agent's span is the root"
    );
    let attributes = &agent["attributes"];
    assert_eq!(attributes["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(attributes["gen_ai.agent.name"], "weather_agent");
    assert_eq!(attributes["gen_ai.conversation.id"], conversation.as_str());
    assert_eq!(
        attributes["gen_ai.usage.input_tokens"],
        res.usage.input_tokens
    );
    assert_eq!(
        attributes["gen_ai.usage.output_tokens"],
        res.usage.output_tokens
    );

    let rounds = named(&spans, "model");
    assert_eq!(rounds.len(), 2, "a model span per round");
    let chats = named(&spans, "chat gpt-4o-mini");
    assert_eq!(chats.len(), 3, "a chat span per HTTP call");
    let (mut input, mut output) = (0, 0);
    for chat in &chats {
        assert!(beneath(&spans, chat, agent), "{chat:#}");
        let attributes = &chat["attributes"];
        assert_eq!(attributes["gen_ai.operation.name"], "chat");
        assert_eq!(attributes["gen_ai.provider.name"], "openai");
        assert_eq!(attributes["gen_ai.request.model"], "gpt-4o-mini");
        assert_eq!(attributes["server.address"], "127.0.0.1");
        if attributes["error.type"].is_null() {
            let tokens = |name: &str| attributes[name].as_u64().expect("integer tokens");
            assert!(tokens("gen_ai.usage.input_tokens") > 0);
            assert!(tokens("gen_ai.usage.output_tokens") > 0);
            input += tokens("gen_ai.usage.input_tokens");
            output += tokens("gen_ai.usage.output_tokens");
            assert_eq!(chat["status_code"], "UNSET");
        } else {
            assert_eq!(attributes["error.type"], "rate_limited");
            assert_eq!(chat["status_code"], "ERROR");
        }
    }
    assert_eq!(
        (input, output),
        (res.usage.input_tokens, res.usage.output_tokens)
    );
    // An array of strings, as the conventions type it.
    let reasons: Vec<_> = chats
        .iter()
        .filter_map(|chat| chat["attributes"]["gen_ai.response.finish_reasons"].as_array())
        .flatten()
        .filter_map(|reason| reason.as_str())
        .collect();
    assert!(
        reasons.contains(&"tool_calls") && reasons.contains(&"stop"),
        "{reasons:?}"
    );

    let [tool] = named(&spans, "execute_tool weather")[..] else {
        panic!("one tool span")
    };
    assert!(beneath(&spans, tool, agent));
    assert_eq!(tool["attributes"]["gen_ai.tool.name"], "weather");
    assert_eq!(tool["attributes"]["gen_ai.operation.name"], "execute_tool");
    assert_eq!(tool["status_code"], "UNSET");
    let call = res
        .session
        .history
        .iter()
        .flat_map(|message| message.tool_calls())
        .next()
        .expect("the run called the tool");
    assert_eq!(tool["attributes"]["gen_ai.tool.call.id"], call.id.as_str());
}

/// A span's fields as text, its name (`span`) and id (`id`) among them.
type SpanFields = Vec<(String, String)>;

/// The fields of every span.
#[derive(Clone, Default)]
struct Spans(std::sync::Arc<std::sync::Mutex<Vec<SpanFields>>>);

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push((
            field.name().to_owned(),
            format!("{value:?}").replace('"', ""),
        ));
    }
}

impl<S> tracing_subscriber::Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = vec![("span".to_owned(), attrs.metadata().name().to_owned())];
        attrs.record(&mut Fields(&mut fields));
        let mut all = self.0.lock().expect("lock");
        fields.push(("id".to_owned(), id.into_u64().to_string()));
        all.push(fields);
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut all = self.0.lock().expect("lock");
        let id = id.into_u64().to_string();
        if let Some(fields) = all
            .iter_mut()
            .rev()
            .find(|f| f.iter().any(|(k, v)| k == "id" && *v == id))
        {
            values.record(&mut Fields(fields));
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn failed_tool_calls_and_runs_carry_error_type() {
    use serde_json::json;
    use tower_agent_test::ScriptedModel;

    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let model = ScriptedModel::with_results([
        Ok(ModelResponse::tool_calls([
            ToolCall::new("c1", "flaky", json!({})),
            ToolCall::new("c2", "crash", json!({})),
            ToolCall::new("c3", "fine", json!({})),
        ])
        .with_usage(Usage::new(10, 5))),
        Err(Error::new(ErrorKind::Auth, "the key was refused").with_usage(Usage::new(3, 0))),
    ]);
    let tools = ToolSet::new()
        .tool(StubTool::failing("flaky", "no luck"))
        .tool(StubTool::panicking("crash", "boom"))
        .tool(StubTool::returning("fine", "ok"));
    let error = Agent::builder()
        .build(model, tools)
        .oneshot(AgentRequest::new(Session::new(), "Go."))
        .await
        .expect_err("the second model call fails");
    assert_eq!(error.kind(), ErrorKind::Auth);

    let all = spans.0.lock().expect("lock").clone();
    let find = |name: &str| {
        all.iter()
            .find(|f| {
                f.iter().any(|(k, v)| k == "otel.name" && v == name)
                    || f.iter().any(|(k, v)| k == "span" && v == name)
            })
            .unwrap_or_else(|| panic!("no span {name}: {all:?}"))
            .clone()
    };
    let get = |fields: &[(String, String)], key: &str| {
        fields
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    for (tool, expected) in [
        ("flaky", Some("tool_error")),
        ("crash", Some("panic")),
        ("fine", None),
    ] {
        let span = find(&format!("execute_tool {tool}"));
        assert_eq!(get(&span, "error.type").as_deref(), expected, "{tool}");
        let status = expected.map(|_| "error");
        assert_eq!(get(&span, "otel.status_code").as_deref(), status, "{tool}");
    }
    let run = find("invoke_agent");
    assert_eq!(get(&run, "error.type").as_deref(), Some("auth"));
    assert_eq!(get(&run, "otel.status_code").as_deref(), Some("error"));
    // The failed run's tokens: the first call's and what the failure carried.
    assert_eq!(
        get(&run, "gen_ai.usage.input_tokens").as_deref(),
        Some("13")
    );
    assert_eq!(
        get(&run, "gen_ai.usage.output_tokens").as_deref(),
        Some("5")
    );
}
