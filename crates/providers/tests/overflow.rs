//! Context overflow end to end: a provider over HTTP answers 400 "context length exceeded",
//! tower's `Retry` with `RetryPolicy` hands it over at once (no retry), the summarization layer
//! outside it summarizes and tries once more.

#![cfg(feature = "openai")]

mod common;

use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent_core::{Error, ErrorKind, Message, ModelRequest, ModelResponse, RunContext};
use tower_agent_layers::RetryLayer;
use tower_agent_layers::retry::RetryPolicy;
use tower_agent_layers::summarize::{Keep, SummarizeLayer, Trigger};
use tower_agent_providers::OpenAi;
use tower_agent_test::ScriptedModel;

use common::{Canned, Server};

fn too_long() -> Canned {
    Canned::json(
        400,
        std::fs::read("tests/fixtures/openai/context_too_long.json").expect("fixture"),
    )
}

fn history() -> ModelRequest {
    let messages: Vec<Message> = (0..8)
        .map(|i| {
            if i % 2 == 0 {
                Message::user(format!("question {i}"))
            } else {
                Message::assistant(format!("answer {i}"))
            }
        })
        .collect();
    let mut req = ModelRequest::new(messages);
    req.ctx = RunContext::new();
    req
}

async fn stack(
    server: &Server,
    summarizer: &ScriptedModel,
) -> impl Service<ModelRequest, Response = ModelResponse, Error = Error> {
    ServiceBuilder::new()
        .layer(
            SummarizeLayer::new(summarizer.clone())
                .trigger(Trigger::messages(100))
                .keep(Keep::messages(4)),
        )
        .layer(RetryLayer::new(RetryPolicy::new()))
        .service(
            OpenAi::new("m")
                .base_url(format!("{}/v1", server.url))
                .api_key("sk-test")
                .streaming(false),
        )
}

#[tokio::test]
async fn an_overflow_over_http_is_summarized_and_sent_once_more() {
    let server = Server::start([too_long(), Canned::fixture("openai/text.json")]).await;
    let summarizer = ScriptedModel::new([ModelResponse::text("The user asked 4 questions.")]);
    let mut model = stack(&server, &summarizer).await;
    let res = model
        .ready()
        .await
        .expect("ready")
        .call(history())
        .await
        .expect("recovered");
    assert_eq!(res.message.text(), "Paris is the capital of France.");
    assert_eq!(summarizer.request_count(), 1);
    let sent = server.received();
    assert_eq!(sent.len(), 2, "the 400 was not retried as it was");
    let first = sent[0].json()["messages"].as_array().map(Vec::len);
    let second = sent[1].json();
    let messages = second["messages"].as_array().expect("messages");
    assert_eq!(first, Some(8));
    // The summary and the newest 2 messages (keep 4, halved after an overflow).
    assert_eq!(messages.len(), 3, "{second}");
    let summary = messages[0]["content"].to_string();
    assert!(summary.contains("The user asked 4 questions."), "{summary}");
    assert!(summary.contains("conversation_summary"), "{summary}");
    assert!(messages[2]["content"].to_string().contains("answer 7"));
}

#[tokio::test]
async fn overflows_over_http_shrink_the_request_until_it_fits_or_say_what_does_not() {
    // Two overflows: shrunk twice, then it fits.
    let server = Server::start([too_long(), too_long(), Canned::fixture("openai/text.json")]).await;
    let summarizer = ScriptedModel::from_fn(|_| Ok(ModelResponse::text("summary")));
    let mut model = stack(&server, &summarizer).await;
    let res = model
        .ready()
        .await
        .expect("ready")
        .call(history())
        .await
        .expect("recovered");
    assert_eq!(res.message.text(), "Paris is the capital of France.");
    let sizes: Vec<usize> = server.received().iter().map(|r| r.body.len()).collect();
    assert_eq!(sizes.len(), 3);
    assert!(sizes.windows(2).all(|w| w[1] < w[0]), "{sizes:?}");

    // A server that refuses everything: a few ever smaller tries, then the error says what
    // does not fit, with the provider's refusal as its cause.
    let server = Server::start(std::iter::repeat_n(too_long(), 20)).await;
    let mut model = stack(&server, &summarizer).await;
    let error = model
        .ready()
        .await
        .expect("ready")
        .call(history())
        .await
        .expect_err("never fits");
    assert_eq!(error.kind(), ErrorKind::ContextTooLong);
    assert!(
        error.message().contains("the newest message (~")
            && error.message().contains("openai: HTTP 400"),
        "{error}"
    );
    let sizes: Vec<usize> = server.received().iter().map(|r| r.body.len()).collect();
    assert!(sizes.len() < 10, "{sizes:?}");
    assert!(sizes.windows(2).all(|w| w[1] < w[0]), "{sizes:?}");
}
