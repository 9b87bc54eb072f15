//! Overflow recovery of the summarization layer: a provider's "context too long" is answered
//! by shrinking the request step by step until it fits, or an error that says what does not
//! fit; a later turn summarizes before it sends a request that large again.

#![cfg(feature = "summarize")]

mod common;

use serde_json::json;
use tower_agent_core::{
    Error, ErrorKind, Message, ModelRequest, ModelResponse, RunContext, ToolCall, ToolResult,
};
use tower_agent_layers::summarize::{Keep, SummarizeLayer, Trigger, is_summary};
use tower_agent_test::{ScriptedModel, assert_valid_history};

use common::{call, chat, request, summarizer, talk, windowed};

#[tokio::test]
async fn an_overflow_is_summarized_and_tried_again() {
    let summarizer = summarizer("short");
    let model = ScriptedModel::with_results([
        Err(Error::new(ErrorKind::ContextTooLong, "prompt is too long")),
        Ok(ModelResponse::text("ok")),
    ]);
    let (req, _ctx, _) = request(chat(7));
    // No trigger would fire: only the overflow does.
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(100))
        .keep(Keep::messages(3));
    let res = call(layer, &model, req).await.expect("recovered");
    assert_eq!(res.message.text(), "ok");
    assert_eq!(summarizer.request_count(), 1);
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].messages.len(), 7);
    // Keep 3 halved: the summary and the newest message.
    assert_eq!(requests[1].messages.len(), 2);
    assert!(is_summary(&requests[1].messages[0]));
    assert_eq!(
        res.history.as_deref(),
        Some(requests[1].messages.as_slice())
    );
}

#[tokio::test]
async fn recovery_keeps_shrinking_until_the_request_fits() {
    // Twelve messages of about 34 tokens, then a call whose result is 2,000 tokens.
    let mut messages = talk(12);
    let read = ToolCall::new("r1", "read", json!({"path": "big.log"}));
    messages.push(Message::assistant_with_calls("", [read.clone()]));
    messages.push(Message::tool_result(ToolResult::success(
        &read,
        "x".repeat(8_000),
    )));
    let summarizer = summarizer("short");
    let model = windowed(600);
    let (req, _ctx, recorder) = request(messages.clone());
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(100))
        .keep(Keep::messages(10));
    let res = call(layer, &model, req).await.expect("recovered");
    assert_eq!(res.message.text(), "ok");

    let requests = model.requests();
    // Each try is smaller than the one before: never the same request twice.
    let sizes: Vec<usize> = requests
        .iter()
        .map(|r| {
            r.messages
                .iter()
                .map(|m| m.text().len() + m.tool_results().map(|r| r.content.len()).sum::<usize>())
                .sum()
        })
        .collect();
    assert!(sizes.windows(2).all(|w| w[1] < w[0]), "{sizes:?}");
    // Keep 10, then 5, 2, 1 (the call and its result), then the result clipped to 2,000
    // and to 500 characters: the last request fits.
    let last = requests.last().expect("requests");
    assert!(is_summary(&last.messages[0]));
    assert_eq!(last.messages.len(), 3, "the summary, the call, its result");
    let result = last.messages[2].tool_results().next().expect("the result");
    assert!(
        result
            .content
            .contains("characters to fit the model's context window"),
        "{}",
        result.content
    );
    assert_valid_history(&last.messages);
    assert_eq!(
        res.history.as_deref(),
        Some(last.messages.as_slice()),
        "the request that fit is the session's history"
    );
    assert!(summarizer.request_count() >= 2);
    assert!(recorder.names().contains(&"summarized"));
}

#[tokio::test]
async fn what_cannot_fit_is_the_error() {
    let summarizer = summarizer("short");
    let model = windowed(10);
    let (mut req, ctx, _) = request(talk(7));
    req.system = Some("You are a careful assistant.".into());
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(100))
        .keep(Keep::messages(3));
    let error = call(layer, &model, req).await.expect_err("fails");
    assert_eq!(error.kind(), ErrorKind::ContextTooLong);
    let message = error.message();
    assert!(
        message.starts_with("the request does not fit the model's context window"),
        "{message}"
    );
    assert!(
        message.contains("the system prompt (~7 tokens) and the newest message (~"),
        "{message}"
    );
    // The provider's last refusal is the cause, and its message is kept.
    let source = std::error::Error::source(&error).expect("a source");
    assert!(source.to_string().contains("> 10"), "{source}");
    assert!(
        message.contains("the last refusal: context too long: "),
        "{message}"
    );
    // Tried after each step, never twice the same request, and a few times only.
    let requests = model.requests();
    let lens: Vec<usize> = requests.iter().map(|r| r.messages.len()).collect();
    assert_eq!(
        lens,
        [7, 2, 1],
        "keep 3 halved to 1 (the summary and the newest message), then the summary dropped"
    );
    // The session keeps the shortest history, and remembers the size that overflowed.
    let committed = error.history().expect("committed in the error");
    assert_eq!(committed.as_slice(), requests[2].messages.as_slice());
    let overflow = ctx
        .state::<serde_json::Value>("tower_agent.summarization")
        .and_then(|v| v["overflow_at_tokens"].as_u64());
    assert!(overflow.is_some(), "remembered");

    // After a trigger fired in the same call, the recovery goes on from its history.
    let model = ScriptedModel::with_results([
        Err(Error::new(ErrorKind::ContextTooLong, "first")),
        Ok(ModelResponse::text("ok")),
    ]);
    let (req, _ctx, _) = request(talk(9));
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(9))
        .keep(Keep::messages(3));
    call(layer, &model, req).await.expect("recovered");
    assert_eq!(model.request_count(), 2);
    assert_eq!(
        model.requests()[0].messages.len(),
        4,
        "the trigger's summary"
    );
    assert_eq!(model.requests()[1].messages.len(), 2, "then keep 1");

    // With recovery off, the overflow is returned at once.
    let model = ScriptedModel::with_results([Err(Error::new(ErrorKind::ContextTooLong, "x"))]);
    let (req, _ctx, _) = request(chat(7));
    let layer = SummarizeLayer::new(summarizer)
        .trigger(Trigger::messages(100))
        .recover_overflow(false);
    let error = call(layer, &model, req).await.expect_err("fails");
    assert_eq!(error.kind(), ErrorKind::ContextTooLong);
    assert_eq!(error.message(), "x");
    assert_eq!(model.request_count(), 1);
}

#[tokio::test]
async fn a_later_turn_on_a_session_that_overflowed_summarizes_before_sending() {
    // The first turn: the model's window is smaller than the estimate lets through.
    let summarizer = summarizer("short");
    let model = windowed(200);
    let (req, ctx, _) = request(talk(8));
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::tokens(10_000))
        .keep(Keep::messages(4));
    let res = call(layer.clone(), &model, req).await.expect("recovered");
    let first = model.request_count();
    assert!(first >= 2, "overflowed, then fit");
    let history = res.history.expect("committed");

    // A later turn in a new run: as large again, it is summarized before it is sent.
    let mut messages = history.to_vec();
    messages.extend(talk(6));
    let mut req = ModelRequest::new(messages);
    req.ctx = RunContext::new().with_session_id("s1");
    req.ctx.absorb_state(ctx.state_snapshot());
    let summaries = summarizer.request_count();
    call(layer, &model, req).await.expect("fits");
    assert_eq!(model.request_count(), first + 1, "sent once, and it fit");
    assert_eq!(summarizer.request_count(), summaries + 1);
}

#[tokio::test]
async fn with_the_default_keep_a_later_turn_that_large_is_not_sent_as_it_is() {
    // The default keep (20 messages) holds the whole short history a recovery left: the later
    // turn is shrunk as an overflow is, before it is sent.
    let summarizer = summarizer("short");
    let model = windowed(150);
    let (req, ctx, _) = request(talk(8));
    let layer = SummarizeLayer::new(summarizer.clone());
    let res = call(layer.clone(), &model, req).await.expect("recovered");
    let history = res.history.expect("committed");
    assert!(history.len() < 8, "{}", history.len());

    let mut messages = history.to_vec();
    messages.extend(talk(3));
    let mut req = ModelRequest::new(messages);
    req.ctx = RunContext::new().with_session_id("s1");
    req.ctx.absorb_state(ctx.state_snapshot());
    let sent = model.request_count();
    call(layer, &model, req).await.expect("fits");
    let refused = model.requests()[sent..]
        .iter()
        .filter(|r| {
            use tower_agent_layers::tokens::{CharEstimate, TokenCounter};
            r.messages
                .iter()
                .map(|m| CharEstimate.count_message(m))
                .sum::<usize>()
                > 150
        })
        .count();
    assert_eq!(refused, 0, "no request over the window was sent");
    assert_eq!(model.request_count(), sent + 1);
}

#[tokio::test]
async fn the_size_that_overflowed_is_kept_when_the_provider_counts_more_than_the_estimate() {
    // A provider whose tokenizer counts three times the estimate: its reported usage of the
    // request that fit is larger than the estimate of the last one that overflowed, in other
    // units.
    use tower_agent_layers::tokens::{CharEstimate, TokenCounter};
    let model = ScriptedModel::from_fn(|req: &ModelRequest| {
        let real: usize = 3 * req
            .messages
            .iter()
            .map(|m| CharEstimate.count_message(m))
            .sum::<usize>();
        if real > 250 {
            return Err(Error::new(
                ErrorKind::ContextTooLong,
                format!("{real} > 250"),
            ));
        }
        Ok(ModelResponse::text("ok").with_usage(tower_agent_core::Usage::new(real as u64, 2)))
    });
    let (req, ctx, _) = request(talk(8));
    let layer = SummarizeLayer::new(summarizer("short")).keep(Keep::messages(4));
    call(layer, &model, req).await.expect("recovered");
    assert_eq!(model.request_count(), 3, "overflowed twice, then fit");
    let record = ctx
        .state::<serde_json::Value>("tower_agent.summarization")
        .expect("a record");
    assert!(
        record["overflow_at_tokens"].is_u64(),
        "still known after the smaller request fit: {record}"
    );
}

#[tokio::test]
async fn an_overflow_with_nothing_to_cut_stands() {
    let summarizer = summarizer("short");
    let model = ScriptedModel::with_results([Err(Error::new(ErrorKind::ContextTooLong, "x"))]);
    let (req, _ctx, _) = request(chat(2));
    let layer = SummarizeLayer::new(summarizer.clone()).keep(Keep::messages(5));
    let error = call(layer, &model, req).await.expect_err("fails");
    assert_eq!(error.kind(), ErrorKind::ContextTooLong);
    assert_eq!(summarizer.request_count(), 0);
    assert_eq!(model.request_count(), 1);
}

#[tokio::test]
async fn other_errors_are_not_recovered() {
    let summarizer = summarizer("short");
    let model = ScriptedModel::with_results([Err(Error::new(ErrorKind::Auth, "bad key"))]);
    let (req, _ctx, _) = request(chat(7));
    let layer = SummarizeLayer::new(summarizer.clone()).keep(Keep::messages(2));
    let error = call(layer, &model, req).await.expect_err("fails");
    assert_eq!(error.kind(), ErrorKind::Auth);
    assert_eq!(summarizer.request_count(), 0);
}

#[tokio::test]
async fn recovery_goes_on_without_a_failing_summarizer_and_says_so() {
    // A summarizer that always fails; the kept call's result is what makes the request too
    // long, so clipping it is enough.
    let summarizer = ScriptedModel::from_fn(|_| Err(Error::bad_request("Unsupported parameter")));
    let mut messages = talk(4);
    let read = ToolCall::new("r1", "read", json!({"path": "big.log"}));
    messages.push(Message::assistant_with_calls("", [read.clone()]));
    messages.push(Message::tool_result(ToolResult::success(
        &read,
        "x".repeat(8_000),
    )));
    let (req, _, _) = request(messages.clone());
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(100))
        .keep(Keep::messages(4));
    let model = windowed(800);
    call(layer.clone(), &model, req)
        .await
        .expect("clipped to fit");
    assert_eq!(
        summarizer.request_count(),
        1,
        "not asked again once it failed"
    );

    // When even that does not fit, the error says the summarizer failed.
    let (req, _, _) = request(messages);
    let error = call(layer, &windowed(40), req).await.expect_err("too long");
    assert_eq!(error.kind(), ErrorKind::ContextTooLong);
    assert!(
        error.message().contains("as the summarizer failed (")
            && error.message().contains("Unsupported parameter"),
        "{error}"
    );
}
