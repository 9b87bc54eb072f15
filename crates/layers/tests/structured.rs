//! Structured output: an answer that does not match its response format is sent back with
//! what is wrong (bounded), streamed attempts are retracted, tool arguments are repaired as an
//! option, and the session keeps only the answer that matched.
#![cfg(feature = "structured")]

use std::time::Duration;

use serde_json::{Value, json};
use tower::{Layer, ServiceExt};
use tower_agent_core::{
    AgentRequest, Error, ErrorKind, GenerationOptions, Message, ModelRequest, ModelResponse,
    ResponseFormat, Role, RunContext, Session, ToolCall, ToolSpec, Usage,
};
use tower_agent_layers::structured::{Mismatch, StructuredLayer};
use tower_agent_loop::Agent;
use tower_agent_test::{EventRecorder, ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;

fn trip() -> ResponseFormat {
    ResponseFormat::json_schema(
        "trip",
        json!({
            "type": "object",
            "properties": {
                "city": { "type": "string" },
                "days": { "type": "integer", "minimum": 1 }
            },
            "required": ["city", "days"],
            "additionalProperties": false
        }),
    )
}

fn request(format: Option<ResponseFormat>) -> (ModelRequest, EventRecorder) {
    let recorder = EventRecorder::new();
    let mut request = ModelRequest::new(vec![Message::user("Plan a trip.")]);
    if let Some(format) = format {
        request.options = GenerationOptions::new().response_format(format).into();
    }
    request.ctx = RunContext::new()
        .with_observer(recorder.clone())
        .with_round(2);
    (request, recorder)
}

/// `layer` over `model`, called once with `req`.
async fn ask(
    layer: StructuredLayer,
    model: &ScriptedModel,
    req: ModelRequest,
) -> Result<ModelResponse, Error> {
    layer.layer(model.clone()).oneshot(req).await
}

fn answer(text: &str, input: u64) -> ModelResponse {
    let mut res = ModelResponse::text(text);
    res.usage = Usage::new(input, 5);
    res
}

#[tokio::test]
async fn an_answer_that_does_not_match_is_sent_back_with_what_is_wrong() {
    let model = ScriptedModel::new([
        answer(r#"{"city": "Paris", "days": 0, "note": "x"}"#, 10),
        answer(r#"{"city": "Paris", "days": 3}"#, 20),
    ]);
    let (req, _) = request(Some(trip()));
    let res = ask(StructuredLayer::new(), &model, req)
        .await
        .expect("the repaired answer");
    assert_eq!(res.message.text(), r#"{"city": "Paris", "days": 3}"#);
    assert_eq!(res.usage, Usage::new(20, 5), "the answer's own tokens");
    assert_eq!(
        res.side_usage,
        Usage::new(10, 5),
        "the refused answer's tokens"
    );

    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let repair = requests[1].messages.as_slice();
    assert_eq!(
        repair.len(),
        3,
        "the question, the refused answer, what is wrong"
    );
    assert_eq!(repair[1].role, Role::Assistant);
    assert!(repair[1].text().contains("\"note\""));
    assert_eq!(repair[2].role, Role::User);
    let feedback = repair[2].text();
    assert!(feedback.contains("`trip`"), "{feedback}");
    assert!(feedback.contains("at /days"), "names where: {feedback}");
    assert!(
        feedback.contains("note"),
        "names the extra property: {feedback}"
    );
    assert_eq!(
        requests[1].options.response_format,
        Some(trip()),
        "the repair asks for the same format"
    );
}

#[tokio::test]
async fn text_that_is_not_json_is_refused_as_such() {
    let model = ScriptedModel::new([
        answer("Sure! Paris, for three days.", 1),
        answer(r#" {"city": "Paris", "days": 3} "#, 1),
    ]);
    let (req, _) = request(Some(trip()));
    let res = ask(StructuredLayer::new(), &model, req)
        .await
        .expect("the repaired answer");
    assert_eq!(
        serde_json::from_str::<Value>(&res.message.text()).expect("JSON")["days"],
        3
    );
    let feedback = model.requests()[1].messages.as_slice()[2].text();
    assert!(feedback.contains("not JSON"), "{feedback}");
}

#[tokio::test]
async fn when_no_answer_matches_the_call_fails_typed_after_the_repairs() {
    let model = ScriptedModel::new([
        answer(r#"{"city": 1}"#, 10),
        answer(r#"{"city": 2}"#, 20),
        answer(r#"{"city": "never asked"}"#, 40),
    ]);
    let (req, _) = request(Some(trip()));
    let error = ask(StructuredLayer::new().repairs(1), &model, req)
        .await
        .expect_err("no answer matched");
    assert_eq!(error.kind(), ErrorKind::InvalidResponse);
    assert!(error.to_string().contains("after 1 repairs"), "{error}");
    assert_eq!(model.requests().len(), 2, "one call and one repair");
    assert_eq!(error.usage(), Usage::new(30, 10), "both answers' tokens");
    let mismatch = std::error::Error::source(&error)
        .and_then(|source| source.downcast_ref::<Mismatch>())
        .expect("the mismatch as the source");
    assert_eq!(mismatch.text, r#"{"city": 2}"#, "the last answer");
    assert!(mismatch.against.contains("trip"));
    assert!(
        mismatch.errors.iter().any(|e| e.contains("days")),
        "{:?}",
        mismatch.errors
    );
}

#[tokio::test]
async fn zero_repairs_fails_at_once_and_a_model_error_passes_through() {
    let model = ScriptedModel::new([answer("no", 1)]);
    let (req, _) = request(Some(trip()));
    let error = ask(StructuredLayer::new().repairs(0), &model, req)
        .await
        .expect_err("refused");
    assert_eq!(error.kind(), ErrorKind::InvalidResponse);
    assert_eq!(model.requests().len(), 1);

    // A refused answer, then an error carrying tokens of its own (a fallback's): both count.
    let failing = ScriptedModel::with_results([
        Ok(answer("no", 10)),
        Err(Error::new(ErrorKind::Auth, "refused").with_usage(Usage::new(7, 1))),
    ]);
    let (req, _) = request(Some(trip()));
    let error = StructuredLayer::new()
        .layer(failing)
        .oneshot(req)
        .await
        .expect_err("the model's error");
    assert_eq!(error.kind(), ErrorKind::Auth);
    assert_eq!(error.usage(), Usage::new(17, 6));
}

#[tokio::test]
async fn a_streamed_answer_that_is_refused_is_retracted() {
    let model = ScriptedModel::new([
        answer(r#"{"town": "Paris"}"#, 1),
        answer(r#"{"city": "Paris", "days": 3}"#, 1),
    ])
    .streaming(4, Duration::ZERO);
    let (req, events) = request(Some(trip()));
    StructuredLayer::new()
        .layer(model)
        .oneshot(req)
        .await
        .expect("the repaired answer");
    let names = events.names();
    assert_eq!(names.iter().filter(|n| **n == "retract").count(), 1);
    let retract = names.iter().position(|n| *n == "retract").expect("one");
    assert_eq!(names[retract + 1], "retrying");
    assert_eq!(
        events.streamed_text(2),
        r#"{"city": "Paris", "days": 3}"#,
        "readers hold the answer that matched, nothing of the refused one"
    );
}

#[tokio::test]
async fn without_a_format_or_with_tool_calls_nothing_is_checked() {
    let model = ScriptedModel::new([answer("free text", 1)]);
    let (req, _) = request(None);
    let res = ask(StructuredLayer::new(), &model, req)
        .await
        .expect("passed through");
    assert_eq!(res.message.text(), "free text");

    // A call is not the final answer: it is not held to the format.
    let calls = ModelResponse::tool_calls([ToolCall::new("c1", "weather", json!({"x": 1}))]);
    let model = ScriptedModel::new([calls.clone()]);
    let (req, _) = request(Some(trip()));
    let res = ask(StructuredLayer::new(), &model, req)
        .await
        .expect("passed through");
    assert_eq!(res.message, calls.message);
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test]
async fn a_schema_that_is_not_valid_fails_at_once_as_a_bad_request() {
    let model = ScriptedModel::new([answer("{}", 1), answer("{}", 1)]);
    let bad = ResponseFormat::json_schema("bad", json!({ "type": "no-such-type" }));
    let (req, _) = request(Some(bad));
    let error = ask(StructuredLayer::new(), &model, req)
        .await
        .expect_err("a host error");
    assert_eq!(error.kind(), ErrorKind::BadRequest);
    assert!(error.to_string().contains("`bad`"), "{error}");
    assert_eq!(model.requests().len(), 1, "no repair for a bad schema");
}

fn weather_spec() -> ToolSpec {
    ToolSpec::new(
        "weather",
        "The weather in a city.",
        json!({
            "type": "object",
            "properties": { "city": { "type": "string" } },
            "required": ["city"]
        }),
    )
}

#[tokio::test]
async fn tool_arguments_that_do_not_match_are_repaired_before_any_tool_runs() {
    let bad = ModelResponse::tool_calls([
        ToolCall::new("c1", "weather", json!({"city": "Paris"})),
        ToolCall::new("c2", "weather", json!({"town": "Lyon"})),
        ToolCall::raw("c3", "weather", "{\"city\": "),
        ToolCall::new("c4", "unknown", json!({})),
    ]);
    let good = ModelResponse::tool_calls([ToolCall::new("c5", "weather", json!({"city": "Lyon"}))]);
    let (mut req, _) = request(None);
    req.tools = vec![weather_spec()].into();

    // Off by default.
    let res = StructuredLayer::new()
        .layer(ScriptedModel::new([bad.clone()]))
        .oneshot(req.clone())
        .await
        .expect("passed through");
    assert_eq!(res.message.tool_calls().count(), 4);

    let model = ScriptedModel::new([bad, good.clone()]);
    let res = StructuredLayer::new()
        .tool_arguments(true)
        .layer(model.clone())
        .oneshot(req)
        .await
        .expect("the repaired calls");
    assert_eq!(res.message, good.message);
    let repair = model.requests()[1].messages.clone();
    assert_valid_history(repair.as_slice());
    let results: Vec<_> = repair
        .as_slice()
        .iter()
        .flat_map(|m| m.tool_results())
        .map(|r| (r.call_id.as_str(), r.is_error, r.content.clone()))
        .collect();
    assert_eq!(results.len(), 4, "every call answered: {results:?}");
    assert!(results[0].2.starts_with("Not run"), "{results:?}");
    assert!(results[1].2.contains("city"), "{results:?}");
    assert!(results[2].2.contains("not JSON"), "{results:?}");
    assert!(
        results[3].2.starts_with("Not run"),
        "the loop answers unknown tools"
    );
    assert!(results.iter().all(|r| r.1), "every result is an error");
}

#[tokio::test]
async fn the_session_keeps_only_the_answer_that_matched() {
    let model = ScriptedModel::new([
        answer(r#"{"city": "Paris"}"#, 1),
        answer(r#"{"city": "Paris", "days": 2}"#, 1),
    ]);
    let agent = Agent::builder()
        .options(GenerationOptions::new().response_format(trip()))
        .build(
            StructuredLayer::new().layer(model),
            ToolSet::new().tool(StubTool::returning("weather", "sunny")),
        );
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "Plan a trip."))
        .await
        .expect("answered");
    let messages = res.session.history.as_slice();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[1].text(), r#"{"city": "Paris", "days": 2}"#);
    assert_eq!(
        res.usage,
        Usage::new(2, 10),
        "the refused answer's tokens count"
    );
}

/// Vercel AI's `extractJson` case: a valid answer inside a Markdown fence is taken as it is,
/// without a repair call; its text becomes the bare JSON.
#[tokio::test]
async fn a_fenced_json_answer_is_taken_without_a_repair() {
    for fenced in [
        "```json\n{\"city\": \"Paris\", \"days\": 3}\n```",
        "  ```\n{\"city\": \"Paris\", \"days\": 3}\n```\n",
    ] {
        let model = ScriptedModel::new([answer(fenced, 10)]);
        let (req, _) = request(Some(trip()));
        let res = ask(StructuredLayer::new(), &model, req)
            .await
            .expect("taken");
        assert_eq!(model.request_count(), 1, "no repair");
        assert_eq!(res.message.text(), "{\"city\": \"Paris\", \"days\": 3}");
    }
    // A fence around an answer out of shape is repaired as any other; text around a fence is
    // not a fenced answer.
    let model = ScriptedModel::new([
        answer("```json\n{\"city\": \"Paris\"}\n```", 10),
        answer("Here: ```json\n{\"city\": \"Paris\", \"days\": 3}\n```", 10),
        answer(r#"{"city": "Paris", "days": 3}"#, 10),
    ]);
    let (req, _) = request(Some(trip()));
    let res = ask(StructuredLayer::new(), &model, req)
        .await
        .expect("repaired");
    assert_eq!(model.request_count(), 3);
    assert_eq!(res.message.text(), r#"{"city": "Paris", "days": 3}"#);
}

/// LangChain lets the last answer through when its repairs run out; here that is an option,
/// with a warning the host sees.
#[tokio::test]
async fn the_last_answer_goes_through_when_asked_with_a_warning() {
    let model = ScriptedModel::new([answer("not json", 10), answer(r#"{"city": 1}"#, 20)]);
    let (req, events) = request(Some(trip()));
    let res = ask(
        StructuredLayer::new().repairs(1).let_last_through(true),
        &model,
        req,
    )
    .await
    .expect("let through");
    assert_eq!(res.message.text(), r#"{"city": 1}"#);
    assert_eq!(res.usage, Usage::new(20, 5), "its own tokens");
    assert_eq!(res.side_usage, Usage::new(10, 5), "the refused answer's");
    let warned = events.events().into_iter().any(|event| {
        matches!(event, tower_agent_core::Event::Warning { source: "structured", message }
            if message.contains("let through"))
    });
    assert!(warned, "{:?}", events.names());
    // Without the option the same answers fail the call.
    let model = ScriptedModel::new([answer("not json", 10), answer(r#"{"city": 1}"#, 20)]);
    let (req, _) = request(Some(trip()));
    let error = ask(StructuredLayer::new().repairs(1), &model, req)
        .await
        .expect_err("fails");
    assert_eq!(error.kind(), ErrorKind::InvalidResponse);
}
