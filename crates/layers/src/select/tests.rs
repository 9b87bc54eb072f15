use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use tower::{Layer, ServiceExt, service_fn};
use tower_agent_core::{
    Error, Message, ModelRequest, ModelResponse, ResponseFormat, RunContext, SideModel, ToolSpec,
    Usage,
};
use tower_agent_test::ScriptedModel;

use super::ToolSelectLayer;
use super::service::read_names;

const TOOLS: [&str; 6] = ["search", "forecast", "calendar", "email", "shell", "math"];

fn request(text: &str, ctx: &RunContext) -> ModelRequest {
    let mut req = ModelRequest::new(vec![Message::user(text)]);
    req.tools = TOOLS
        .map(|name| {
            ToolSpec::new(
                name,
                format!("The {name} tool.\nMore."),
                json!({"type": "object"}),
            )
        })
        .into();
    req.ctx = ctx.clone();
    req
}

fn offered(req: &ModelRequest) -> Vec<String> {
    req.tools.iter().map(|t| t.name.clone()).collect()
}

async fn offered_through(layer: &ToolSelectLayer, req: ModelRequest) -> Vec<String> {
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    layer
        .layer(model.clone())
        .oneshot(req)
        .await
        .expect("answers");
    offered(&model.requests()[0])
}

#[tokio::test]
async fn a_closure_chooses_and_named_tools_are_always_kept_in_their_order() {
    let layer = ToolSelectLayer::by(|_req: &ModelRequest| {
        ["math", "nope", "calendar", "math"]
            .map(String::from)
            .to_vec()
    })
    .always("search");
    let ctx = RunContext::new();
    assert_eq!(
        offered_through(&layer, request("hi", &ctx)).await,
        ["search", "calendar", "math"],
        "unknown names skipped, repeats once, the service's order"
    );
    assert_eq!(
        offered_through(&layer.clone().max_tools(1), request("hi", &ctx)).await,
        ["search", "math"],
        "the first named within the cap, the always-kept on top"
    );
    let none = ToolSelectLayer::by(|_req: &ModelRequest| Vec::new()).always("shell");
    assert_eq!(offered_through(&none, request("hi", &ctx)).await, ["shell"]);
    // Nothing left at all: every tool (calls in the history must stay defined).
    let nothing = ToolSelectLayer::by(|_req: &ModelRequest| vec!["nope".to_string()]);
    assert_eq!(offered_through(&nothing, request("hi", &ctx)).await, TOOLS);
    // A tool the request forces is kept.
    let mut forced = request("hi", &ctx);
    forced.options_mut().tool_choice = Some(tower_agent_core::ToolChoice::Tool("email".into()));
    let math = ToolSelectLayer::by(|_req: &ModelRequest| vec!["math".to_string()]);
    assert_eq!(offered_through(&math, forced).await, ["email", "math"]);
}

#[tokio::test]
async fn few_tools_and_side_calls_are_left_as_they_are() {
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&asked);
    let layer = ToolSelectLayer::by(move |_req: &ModelRequest| {
        counter.fetch_add(1, Ordering::SeqCst);
        vec!["math".to_string()]
    });
    let ctx = RunContext::new();
    assert_eq!(
        offered_through(&layer.clone().max_tools(6), request("hi", &ctx)).await,
        TOOLS
    );
    assert_eq!(
        offered_through(&layer, request("hi", &ctx.side_call())).await,
        TOOLS
    );
    assert_eq!(asked.load(Ordering::SeqCst), 0);
    assert_eq!(
        offered_through(&layer.max_tools(5), request("hi", &ctx)).await,
        ["math"]
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_model_chooses_once_per_run_and_message_and_its_tokens_are_side_usage() {
    let selector = ScriptedModel::new([
        ModelResponse::text(r#"{"tools": ["forecast", "calendar"]}"#)
            .with_usage(Usage::new(300, 12)),
        ModelResponse::text("```json\n[\"email\"]\n```").with_usage(Usage::new(310, 8)),
        ModelResponse::text(r#"{"tools": ["shell"]}"#),
    ]);
    let layer = ToolSelectLayer::model(SideModel::new(selector.clone())).always("search");
    let model = ScriptedModel::new((0..4).map(|_| ModelResponse::text("ok")));
    let service = layer.layer(model.clone());
    let ctx = RunContext::new();

    let first = service
        .clone()
        .oneshot(request("Weather in Oslo tomorrow?", &ctx.with_round(1)))
        .await
        .expect("answers");
    assert_eq!(first.side_usage, Usage::new(300, 12));
    let later = service
        .clone()
        .oneshot(request("Weather in Oslo tomorrow?", &ctx.with_round(2)))
        .await
        .expect("answers");
    assert!(later.side_usage.is_zero(), "the run's choice is reused");
    assert_eq!(selector.requests().len(), 1);
    for req in &model.requests()[..2] {
        assert_eq!(offered(req), ["search", "forecast", "calendar"]);
    }

    // What the selector was asked: the names and first lines, the message, a JSON schema.
    let asked = &selector.requests()[0];
    let prompt = asked.messages[0].text();
    assert!(
        prompt.contains("- calendar: The calendar tool.\n"),
        "{prompt}"
    );
    assert!(!prompt.contains("More."), "{prompt}");
    assert!(prompt.contains("Weather in Oslo tomorrow?"), "{prompt}");
    assert!(asked.ctx.is_side_call());
    let Some(ResponseFormat::JsonSchema { schema, .. }) = &asked.options.response_format else {
        panic!("a response format");
    };
    assert_eq!(schema["properties"]["tools"]["items"]["enum"], json!(TOOLS));

    // Another message in the run: asked again.
    service
        .clone()
        .oneshot(request("And send it by email.", &ctx.with_round(3)))
        .await
        .expect("answers");
    assert_eq!(selector.requests().len(), 2);
    assert_eq!(offered(&model.requests()[2]), ["search", "email"]);
    // Another run: its own choice.
    service
        .oneshot(request("Weather in Oslo tomorrow?", &RunContext::new()))
        .await
        .expect("answers");
    assert_eq!(selector.requests().len(), 3);
    assert_eq!(offered(&model.requests()[3]), ["search", "shell"]);
}

#[tokio::test]
async fn a_selector_that_fails_or_answers_nonsense_leaves_every_tool() {
    let failing = SideModel::new(service_fn(|_req: ModelRequest| async {
        Err::<ModelResponse, _>(Error::backend("selector down").with_usage(Usage::new(5, 0)))
    }));
    let ctx = RunContext::new();
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let response = ToolSelectLayer::model(failing)
        .layer(model.clone())
        .oneshot(request("hi", &ctx))
        .await
        .expect("a failed selection never ends a run");
    assert_eq!(offered(&model.requests()[0]), TOOLS);
    assert_eq!(
        response.side_usage,
        Usage::new(5, 0),
        "what it spent is counted"
    );

    for (answer, expected) in [
        ("I would use the search tool.", TOOLS.to_vec()),
        (r#"{"tools": ["teleport"]}"#, TOOLS.to_vec()),
        (r#"{"tools": [1, 2]}"#, TOOLS.to_vec()),
        (r#"{"tools": []}"#, vec!["shell"]),
    ] {
        let selector = ScriptedModel::new([ModelResponse::text(answer)]);
        let layer = ToolSelectLayer::model(SideModel::new(selector)).always("shell");
        assert_eq!(
            offered_through(&layer, request("hi", &RunContext::new())).await,
            expected,
            "{answer}"
        );
    }
}

#[test]
fn names_are_read_from_an_object_an_array_or_a_fence() {
    let names = |text: &str| read_names(text);
    let two = Some(vec!["a".to_string(), "b".to_string()]);
    assert_eq!(names(r#"{"tools": ["a", "b"]}"#), two);
    assert_eq!(names(r#"["a","b"]"#), two);
    assert_eq!(names("```json\n{\"tools\":[\"a\",\"b\"]}\n```"), two);
    assert_eq!(names(r#"{"other": []}"#), None);
    assert_eq!(names("none"), None);
    assert_eq!(names(r#"["a", 3]"#), None);
}

#[test]
fn debug_names_the_selector() {
    let layer = ToolSelectLayer::by(|_req: &ModelRequest| Vec::new())
        .always("search")
        .max_tools(4);
    let debug = format!("{layer:?}");
    assert!(debug.contains("closure") && debug.contains("search") && debug.contains('4'));
}

/// LangChain's case: `max_tools` is a cap on what the selector picks, and the selector is
/// asked even when the request has fewer tools than that.
#[tokio::test]
async fn a_cap_asks_the_selector_however_few_the_tools() {
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&asked);
    let layer = ToolSelectLayer::by(move |_req: &ModelRequest| {
        counter.fetch_add(1, Ordering::SeqCst);
        vec!["math".to_string(), "search".to_string()]
    });
    let ctx = RunContext::new();
    assert_eq!(
        offered_through(&layer.clone().cap(6), request("hi", &ctx)).await,
        ["search", "math"],
        "selected (in the tools' order), though the request has fewer tools than the cap"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert_eq!(
        offered_through(&layer.cap(1), request("hi", &ctx)).await,
        ["math"],
        "capped"
    );
}
