//! The summarization layer: triggers, cut points, the commit, repeated summaries, offload,
//! failures and argument truncation, on the model service alone and in a real agent run.
//! Overflow recovery is in `summarize_overflow.rs`, the bounds on sizes in
//! `summarize_bounds.rs`.

#![cfg(feature = "summarize")]

mod common;

use std::sync::Arc;

use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{
    AgentRequest, ContentPart, Error, ErrorKind, Event, Message, ModelResponse, Role, Session,
    ToolCall, ToolResult,
};
use tower_agent_layers::summarize::Summarized;
use tower_agent_layers::summarize::{
    Keep, Summarize, SummarizeLayer, Trigger, is_summary, summary_message, summary_text,
};
use tower_agent_loop::Agent;
use tower_agent_storage::{ByteStream, Entry, InMemory, Storage, StorageError, StoragePath};
use tower_agent_test::{EventRecorder, ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;

use common::{batch, call, chat, request, summarizer, talk};

#[tokio::test]
async fn the_layer_makes_a_summarize_service() {
    let layer = SummarizeLayer::new(summarizer("s"));
    let service: Summarize<ScriptedModel> = tower::Layer::layer(&layer, ScriptedModel::new([]));
    let _ = service.get_ref();
    let _ = ServiceBuilder::new()
        .layer(layer)
        .service(ScriptedModel::new([]));
}

#[tokio::test]
async fn below_every_trigger_nothing_happens() {
    let summarizer = summarizer("s");
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let (req, _ctx, recorder) = request(chat(9));
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(10))
        .trigger(Trigger::tokens(1_000))
        .trigger(Trigger::fraction(0.5, 2_000))
        .keep(Keep::messages(2));
    let res = call(layer, &model, req).await.expect("ok");
    assert_eq!(summarizer.request_count(), 0);
    assert_eq!(model.requests()[0].messages.len(), 9);
    assert!(res.history.clone().is_none(), "nothing committed");
    assert!(!recorder.names().contains(&"summarized"));
}

#[tokio::test]
async fn each_trigger_fires_on_its_own() {
    let long = || {
        let mut m = chat(3);
        m[0] = Message::user("x".repeat(4_000)); // about 1,000 tokens
        m
    };
    for (trigger, messages) in [
        (Trigger::messages(3), long()),
        (Trigger::tokens(1_000), long()),
        (Trigger::fraction(0.5, 2_000), long()),
    ] {
        let summarizer = summarizer("the summary");
        let model = ScriptedModel::new([ModelResponse::text("ok")]);
        let (req, _ctx, recorder) = request(messages);
        let layer = SummarizeLayer::new(summarizer.clone())
            .trigger(trigger)
            .keep(Keep::messages(1));
        let res = call(layer, &model, req).await.expect("ok");
        assert_eq!(summarizer.request_count(), 1, "{trigger:?}");
        let seen = &model.requests()[0].messages;
        assert_eq!(seen.len(), 2, "{trigger:?}");
        assert_eq!(summary_text(&seen[0]), Some("the summary"));
        assert_eq!(seen[1].text(), "q2");
        assert_eq!(res.history.clone().as_deref(), Some(seen.as_slice()));
        let summarized = recorder.events().into_iter().find_map(|e| {
            let s = e.downcast_ref::<Summarized>()?;
            Some((s.summarized, s.kept, s.tokens_before > s.tokens_after))
        });
        assert_eq!(summarized, Some((2, 1, true)), "{trigger:?}");
    }
}

#[tokio::test]
async fn keep_by_tokens_keeps_what_fits() {
    let summarizer = summarizer("s");
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    // Six messages of about 100 tokens each (plus framing).
    let messages: Vec<Message> = (0..6)
        .map(|i| {
            let text = format!("{i}{}", "y".repeat(399));
            if i % 2 == 0 {
                Message::user(text)
            } else {
                Message::assistant(text)
            }
        })
        .collect();
    let (req, _ctx, _) = request(messages);
    let layer = SummarizeLayer::new(summarizer)
        .trigger(Trigger::messages(6))
        .keep(Keep::tokens(250));
    call(layer, &model, req).await.expect("ok");
    let seen = &model.requests()[0].messages;
    assert_eq!(seen.len(), 3, "a summary and the two newest messages");
    assert!(seen[1].text().starts_with('4'));
}

#[tokio::test]
async fn a_parallel_batch_of_ten_is_never_split() {
    let ids: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    for keep in 1..=12 {
        let summarizer = summarizer("s");
        let model = ScriptedModel::new([ModelResponse::text("ok")]);
        // [U, A, U, A(c0..c9), T x 10, A]: 15 messages.
        let mut messages = talk(3);
        messages.extend(batch(&ids));
        messages.push(Message::assistant("all found"));
        let (req, _ctx, _) = request(messages.clone());
        let layer = SummarizeLayer::new(summarizer)
            .trigger(Trigger::messages(2))
            .keep(Keep::messages(keep));
        call(layer, &model, req).await.expect("ok");
        let seen = &model.requests()[0].messages;
        assert_valid_history(seen);
        assert!(is_summary(&seen[0]), "keep {keep}");
        let kept = &seen[1..];
        // Either the whole batch is kept or none of it.
        let results = kept.iter().filter(|m| m.role == Role::Tool).count();
        assert!(
            results == 0 || results == 10,
            "keep {keep}: {results} results kept"
        );
        assert!(kept.len() >= keep.min(messages.len() - 1), "keep {keep}");
        assert_eq!(
            kept,
            &messages[messages.len() - kept.len()..],
            "keep {keep}"
        );
    }
}

#[tokio::test]
async fn no_safe_cut_means_no_summary() {
    let summarizer = summarizer("s");
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    // [U, A(c0..c2), T, T, T]: keeping one message would split the batch; the only cut is
    // after the user message, and keeping 4 cuts there.
    let mut messages = vec![Message::user("go")];
    messages.extend(batch(&["c0", "c1", "c2"]));
    let (req, _ctx, _) = request(messages.clone());
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(2))
        .keep(Keep::messages(5));
    let res = call(layer, &model, req).await.expect("ok");
    assert_eq!(summarizer.request_count(), 0);
    assert_eq!(model.requests()[0].messages.as_slice(), messages.as_slice());
    assert!(res.history.clone().is_none());
}

#[tokio::test]
async fn reasoning_stays_with_its_message() {
    let summarizer = summarizer("s");
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let mut messages = talk(3);
    let call_ = ToolCall::new("c1", "search", json!({}));
    messages.push(Message {
        role: Role::Assistant,
        content: vec![
            ContentPart::Reasoning {
                text: "I should search".into(),
                signature: Some("sig".into()),
            },
            ContentPart::ToolCall(call_.clone()),
        ],
    });
    messages.push(Message::tool_result(ToolResult::success(&call_, "hit")));
    let (req, _ctx, _) = request(messages.clone());
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(2))
        .keep(Keep::messages(1));
    call(layer, &model, req).await.expect("ok");
    let seen = &model.requests()[0].messages;
    assert_eq!(
        &seen[1..],
        &messages[3..],
        "the reasoning message and its result"
    );
    // The summarizer never sees reasoning.
    let input = summarizer.requests()[0].messages[0].text();
    assert!(!input.contains("I should search"), "{input}");
}

/// A model that calls `ls` twice and then answers; the session grows past the trigger.
async fn agent_run(
    layer: SummarizeLayer,
    session: Session,
    rounds: usize,
    recorder: &EventRecorder,
) -> Result<(Session, ScriptedModel), Error> {
    let mut script: Vec<ModelResponse> = (0..rounds)
        .map(|i| ModelResponse::tool_calls([ToolCall::new(format!("r{i}"), "ls", json!({}))]))
        .collect();
    script.push(ModelResponse::text("done"));
    let model = ScriptedModel::new(script);
    let stub = model.clone();
    let model = ServiceBuilder::new().layer(layer).service(model);
    let agent = Agent::new(
        model,
        ToolSet::new().tool(StubTool::returning("ls", "a.txt b.txt")),
    );
    let res = agent
        .oneshot(AgentRequest::new(session, "list").with_observer(recorder.clone()))
        .await?;
    Ok((res.session, stub))
}

#[tokio::test]
async fn the_summary_is_committed_and_summarized_again_later() {
    let summaries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let summarizer = ScriptedModel::from_fn({
        let summaries = Arc::clone(&summaries);
        move |_| {
            let n = summaries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            Ok(ModelResponse::text(format!("summary {n}")))
        }
    });
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(8))
        .keep(Keep::messages(3));
    let recorder = EventRecorder::new();
    // 6 rounds of one call each: 1 + 2 * 6 + 1 messages in the end.
    let (session, model) = agent_run(layer, Session::with_id("s1"), 6, &recorder)
        .await
        .expect("completes");
    assert_valid_history(&session.history);
    assert!(
        is_summary(&session.history[0]),
        "the session keeps the summary"
    );
    let requests = model.requests();
    // Each round's request holds the previous round's commit: never more than 8 messages,
    // and the summarizer is not asked every round.
    for req in &requests {
        assert!(req.messages.len() <= 8, "{} messages", req.messages.len());
    }
    let n = summarizer.request_count();
    assert!(
        (2..requests.len()).contains(&n),
        "{n} summaries for {} rounds",
        requests.len()
    );
    // The second summary folds in the first, not the archive again.
    let second = summarizer.requests()[1].messages[0].text();
    assert!(
        second.starts_with("The summary so far:\nsummary 1\n"),
        "{second}"
    );
    assert!(
        !second.contains("[user]: list"),
        "the first user message was summarized before"
    );
    assert_eq!(
        session.state["tower_agent.summarization"]["summaries"],
        json!(n)
    );
    let events = recorder
        .events()
        .iter()
        .filter(|e| e.downcast_ref::<Summarized>().is_some())
        .count();
    assert_eq!(events, n);
}

/// A backend that fails every write.
#[derive(Debug, Clone, Default)]
struct Broken;

impl Storage for Broken {
    fn put<'a>(
        &'a self,
        _: &'a StoragePath,
        _: bytes::Bytes,
    ) -> BoxFuture<'a, Result<(), StorageError>> {
        Box::pin(async {
            Err(StorageError::backend(
                "disk full",
                std::io::Error::other("ENOSPC"),
            ))
        })
    }
    fn put_stream<'a>(
        &'a self,
        _: &'a StoragePath,
        _: ByteStream,
    ) -> BoxFuture<'a, Result<u64, StorageError>> {
        Box::pin(async {
            Err(StorageError::backend(
                "disk full",
                std::io::Error::other("ENOSPC"),
            ))
        })
    }
    fn get<'a>(&'a self, p: &'a StoragePath) -> BoxFuture<'a, Result<bytes::Bytes, StorageError>> {
        Box::pin(async move { Err(StorageError::NotFound(p.to_string())) })
    }
    fn get_range<'a>(
        &'a self,
        p: &'a StoragePath,
        _: std::ops::Range<u64>,
    ) -> BoxFuture<'a, Result<bytes::Bytes, StorageError>> {
        Box::pin(async move { Err(StorageError::NotFound(p.to_string())) })
    }
    fn get_stream<'a>(
        &'a self,
        p: &'a StoragePath,
    ) -> BoxFuture<'a, Result<ByteStream, StorageError>> {
        Box::pin(async move { Err(StorageError::NotFound(p.to_string())) })
    }
    fn list<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StorageError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn delete<'a>(&'a self, _: &'a StoragePath) -> BoxFuture<'a, Result<(), StorageError>> {
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test]
async fn summarized_messages_are_offloaded_and_appended() {
    let storage = InMemory::new();
    let layer = SummarizeLayer::new(summarizer("s"))
        .trigger(Trigger::messages(6))
        .keep(Keep::messages(2))
        .offload(storage.clone());
    let recorder = EventRecorder::new();
    let (session, _) = agent_run(layer, Session::with_id("team/../s 1"), 5, &recorder)
        .await
        .expect("completes");
    let listed = storage.list("conversation_history/").await.expect("list");
    assert_eq!(listed.len(), 1, "one file per session: {listed:?}");
    let text = storage.get(&listed[0].path).await.expect("get");
    let text = String::from_utf8(text.to_vec()).expect("utf-8");
    // Every message that left the history is in the file, in order, whole.
    assert!(text.starts_with("\n## Summarized at round"), "{text}");
    assert!(text.contains("**User**: list"), "{text}");
    for id in ["r0", "r1", "r2"] {
        assert!(text.contains(&format!("`{id}`")), "{id} in {text}");
    }
    assert!(
        text.matches("## Summarized at round").count() >= 2,
        "appended: {text}"
    );
    assert!(
        !text.contains("<conversation_summary>"),
        "summaries are not archived"
    );
    assert!(is_summary(&session.history[0]));
}

#[tokio::test]
async fn an_offload_failure_is_a_warning_and_the_run_goes_on() {
    let layer = SummarizeLayer::new(summarizer("s"))
        .trigger(Trigger::messages(6))
        .keep(Keep::messages(2))
        .offload(Broken);
    let recorder = EventRecorder::new();
    let (session, _) = agent_run(layer, Session::with_id("s1"), 3, &recorder)
        .await
        .expect("completes");
    assert!(is_summary(&session.history[0]));
    assert!(recorder.events().iter().any(|e| matches!(
        e,
        Event::Warning { source: "summarize", message } if message.contains("disk full")
    )));
}

#[tokio::test]
async fn a_failing_summarizer_is_a_warning_and_changes_nothing() {
    // Down, then an empty answer, then a model that refuses the request (an o-series model
    // refusing `max_tokens`): each time the call goes on with the history as it was.
    let summarizer = ScriptedModel::with_results([
        Err(Error::new(ErrorKind::Server, "summarizer down")),
        Ok(ModelResponse::text("")),
        Err(Error::bad_request("Unsupported parameter: 'max_tokens'")),
    ]);
    let model = ScriptedModel::from_fn(|_| Ok(ModelResponse::text("ok")));
    for said in ["summarizer down", "no text", "Unsupported parameter"] {
        let (req, ctx, recorder) = request(talk(6));
        let layer = SummarizeLayer::new(summarizer.clone())
            .trigger(Trigger::messages(6))
            .keep(Keep::messages(2));
        let res = call(layer, &model, req).await.expect("the call goes on");
        assert_eq!(res.message.text(), "ok");
        let sent = model.requests().last().expect("called").messages.clone();
        assert_eq!(sent.as_slice(), talk(6).as_slice(), "the history as it was");
        assert!(res.history.clone().is_none(), "nothing committed");
        let warned = recorder.events().into_iter().any(|e| {
            matches!(
                e,
                Event::Warning { source: "summarize", message }
                    if message.contains("summarization failed") && message.contains(said)
            )
        });
        assert!(warned, "{said}: {:?}", recorder.names());
        // The triggers rest: the next round does not ask a failing summarizer again.
        let record = ctx
            .state::<serde_json::Value>("tower_agent.summarization")
            .expect("a record");
        assert!(record["wait_until_tokens"].is_u64(), "{record}");
    }
    assert_eq!(summarizer.request_count(), 3);

    // In a run: it completes, the session as it was, then the answer.
    let summarizer = ScriptedModel::with_results([Err(Error::new(ErrorKind::Server, "down"))]);
    let layer = SummarizeLayer::new(summarizer)
        .trigger(Trigger::messages(2))
        .keep(Keep::messages(1));
    let mut session = Session::with_id("s1");
    session.history = talk(4).into();
    let before = session.history.clone();
    let (session, _) = agent_run(layer, session, 1, &EventRecorder::new())
        .await
        .expect("completes");
    assert_eq!(&session.history[..4], &before[..]);
    assert_valid_history(&session.history);
}

#[tokio::test]
async fn long_old_arguments_are_truncated_before_summarizing() {
    let write = |id: &str| {
        ToolCall::new(
            id,
            "write_file",
            json!({"path": format!("{id}.txt"), "content": "z".repeat(8_000)}),
        )
    };
    let mut messages = vec![Message::user("write two files")];
    for id in ["w1", "w2"] {
        messages.push(Message::assistant_with_calls("", [write(id)]));
        messages.push(Message::tool_result(ToolResult::success(
            &write(id),
            "written",
        )));
    }
    messages.push(Message::assistant("done"));
    messages.push(Message::user("thanks"));
    // About 4,000 tokens, most of them in the two calls' arguments.
    let summarizer = summarizer("s");
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let (req, _ctx, recorder) = request(messages.clone());
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::tokens(3_000))
        .keep(Keep::messages(2))
        .truncate_arguments(100);
    let res = call(layer, &model, req).await.expect("ok");
    assert_eq!(summarizer.request_count(), 0, "truncation was enough");
    let seen = &model.requests()[0].messages;
    assert_eq!(seen.len(), messages.len(), "no message left");
    assert_valid_history(seen);
    let args: serde_json::Value =
        serde_json::from_str(&seen[1].tool_calls().next().expect("a call").arguments)
            .expect("JSON");
    assert_eq!(args["path"], "w1.txt");
    assert_eq!(
        args["content"],
        format!("{}… [truncated 7900 characters]", "z".repeat(100))
    );
    assert_eq!(&seen[5..], &messages[5..], "kept messages untouched");
    assert_eq!(res.history.clone().as_deref(), Some(seen.as_slice()));
    assert!(recorder.events().iter().any(|e| matches!(
        e,
        Event::Warning { source: "summarize", message } if message.contains("truncated")
    )));

    // Not enough: truncate, then summarize.
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let (req, _ctx, _) = request(messages);
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::tokens(3_000))
        .trigger(Trigger::messages(7))
        .keep(Keep::messages(2))
        .truncate_arguments(100);
    call(layer, &model, req).await.expect("ok");
    assert_eq!(summarizer.request_count(), 1);
    let input = summarizer.requests()[0].messages[0].text();
    assert!(input.contains("truncated 7900 characters"), "{input}");
    assert_eq!(model.requests()[0].messages.len(), 3);
}

#[tokio::test]
async fn a_summary_message_is_recognizable() {
    let message = summary_message("  the gist  ");
    assert_eq!(summary_text(&message), Some("the gist"));
    assert!(
        !is_summary(&Message::assistant(message.text())),
        "only as a user message"
    );
    let json = serde_json::to_string(&message).expect("serializes");
    let back: Message = serde_json::from_str(&json).expect("parses");
    assert!(is_summary(&back), "recognized after a save and a load");
}

#[tokio::test]
async fn the_summarizers_tokens_count_in_the_runs_usage() {
    let summarizer = ScriptedModel::new([
        ModelResponse::text("the gist").with_usage(tower_agent_core::Usage::new(900, 40))
    ]);
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let (req, _ctx, _) = request(talk(6));
    let layer = SummarizeLayer::new(summarizer)
        .trigger(Trigger::messages(6))
        .keep(Keep::messages(2));
    let res = call(layer, &model, req).await.expect("ok");
    assert_eq!(
        res.side_usage,
        tower_agent_core::Usage::new(900, 40),
        "in the response, for the agent to add"
    );
}

/// The line the module docs show: the summarizer with the agent's retry.
#[cfg(feature = "retry")]
#[tokio::test(start_paused = true)]
async fn a_summarizer_with_the_retry_layer_survives_a_refused_connection() {
    use tower_agent_layers::retry::{RetryLayer, RetryPolicy};

    let cheap_model = ScriptedModel::with_results([
        Err(Error::new(
            ErrorKind::Server,
            "openai: cannot connect: connection refused",
        )),
        Ok(ModelResponse::text("the gist")),
    ]);
    let layer = SummarizeLayer::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new(RetryPolicy::new()))
            .service(cheap_model.clone()),
    )
    .trigger(Trigger::messages(6))
    .keep(Keep::messages(2));
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let (req, _ctx, _) = request(talk(6));
    let res = call(layer, &model, req).await.expect("retried");
    assert_eq!(cheap_model.request_count(), 2);
    let committed = res.history.clone().expect("committed");
    assert_eq!(summary_text(&committed[0]), Some("the gist"));
}

/// A model below the layer that summarizes when asked (its last message says so), fails a
/// request of more than `window` messages with `ContextTooLong`, and answers "ok" otherwise.
fn stack_model(window: usize) -> ScriptedModel {
    ScriptedModel::from_fn(move |req: &tower_agent_core::ModelRequest| {
        let asked = req
            .messages
            .last()
            .is_some_and(|m| m.role == Role::User && m.text().contains("Write the summary"));
        if req.messages.len() > window {
            return Err(Error::new(ErrorKind::ContextTooLong, "too long"));
        }
        Ok(ModelResponse::text(if asked {
            "the summary"
        } else {
            "ok"
        }))
    })
}

#[tokio::test]
async fn in_the_stack_the_summary_is_asked_with_the_requests_own_prefix() {
    let model = stack_model(100);
    let (mut req, _ctx, recorder) = request(chat(12));
    req.system = Some("You help.".into());
    req.tools = vec![tower_agent_core::ToolSpec::new("ls", "List.", json!({}))].into();
    req.options_mut().response_format = Some(tower_agent_core::ResponseFormat::json_schema(
        "answer",
        json!({ "type": "object" }),
    ));
    let layer = SummarizeLayer::in_stack()
        .trigger(Trigger::messages(10))
        .keep(Keep::messages(4));
    let res = call(layer, &model, req.clone()).await.expect("ok");
    assert_eq!(res.message.text(), "ok");
    let seen = model.requests();
    assert_eq!(seen.len(), 2, "the summary, then the call");
    let summary = &seen[0];
    // The same system prompt and tools; the older messages as sent, then the instruction.
    assert_eq!(summary.system, req.system);
    assert_eq!(summary.tools.len(), 1);
    assert_eq!(&summary.messages[..8], &req.messages[..8]);
    assert_eq!(summary.messages.len(), 9);
    let ask = summary.messages[8].text();
    assert!(ask.starts_with("Do not call any tool now."), "{ask}");
    assert!(
        ask.contains("You summarize the earlier part"),
        "the prompt follows: {ask}"
    );
    assert!(summary.options.max_tokens.is_some(), "bounded");
    assert_eq!(summary.options.response_format, None);
    // The call itself: the summary, then the four kept messages.
    let history = res.history.clone().expect("committed");
    assert_eq!(history.len(), 5);
    assert_eq!(summary_text(&history[0]), Some("the summary"));
    assert!(recorder.names().contains(&"summarized"));
}

#[tokio::test]
async fn in_the_stack_a_prefix_too_long_is_summarized_as_rendered_text() {
    // The request overflows (13 messages), and so would the summary's own prefix (9).
    let model = stack_model(8);
    let (req, _ctx, _recorder) = request(chat(13));
    let layer = SummarizeLayer::in_stack()
        .trigger(Trigger::messages(10))
        .keep(Keep::messages(5));
    let res = call(layer, &model, req).await.expect("ok");
    let seen = model.requests();
    // The summary with the prefix (too long), then rendered as one message, then the call.
    assert_eq!(
        seen.len(),
        3,
        "{:?}",
        seen.iter().map(|r| r.messages.len()).collect::<Vec<_>>()
    );
    assert_eq!(seen[0].messages.len(), 9);
    assert_eq!(seen[1].messages.len(), 1);
    assert!(seen[1].messages[0].text().contains("The messages since:"));
    let history = res.history.clone().expect("committed");
    assert!(is_summary(&history[0]));
}

#[tokio::test]
async fn in_the_stack_a_tool_call_instead_of_a_summary_keeps_the_history() {
    let model = ScriptedModel::from_fn(|req: &tower_agent_core::ModelRequest| {
        let asked = req
            .messages
            .last()
            .is_some_and(|m| m.text().contains("Write the summary"));
        Ok(if asked {
            ModelResponse::tool_calls([ToolCall::new("c1", "ls", json!({}))])
        } else {
            ModelResponse::text("ok")
        })
    });
    let (req, _ctx, recorder) = request(chat(12));
    let layer = SummarizeLayer::in_stack()
        .trigger(Trigger::messages(10))
        .keep(Keep::messages(4));
    let res = call(layer, &model, req).await.expect("ok");
    assert!(res.history.clone().is_none(), "nothing committed");
    assert_eq!(model.requests()[1].messages.len(), 12);
    let warnings: Vec<String> = recorder
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Warning { message, .. } => Some(message),
            _ => None,
        })
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("the summarizer called a tool")),
        "{warnings:?}"
    );
}

#[tokio::test]
async fn in_the_stack_a_concurrency_limit_below_does_not_hold_the_summary_up() {
    // One permit below the layer: the ready service holds it while the layer shortens.
    let model = stack_model(100);
    let (req, _ctx, _recorder) = request(chat(12));
    let layer = SummarizeLayer::in_stack()
        .trigger(Trigger::messages(10))
        .keep(Keep::messages(4));
    let mut service = ServiceBuilder::new()
        .layer(layer)
        .concurrency_limit(1)
        .service(model.clone());
    let res = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        tower::Service::call(service.ready().await?, req).await
    })
    .await
    .expect("no wait for a permit the layer holds")
    .expect("answered");
    assert_eq!(model.requests().len(), 2, "the summary, then the call");
    assert!(res.history.clone().is_some(), "committed");
}

#[tokio::test]
async fn in_the_stack_a_forced_tool_is_relaxed_and_the_summarys_tokens_count() {
    let model = ScriptedModel::from_fn(|req: &tower_agent_core::ModelRequest| {
        let asked = req
            .messages
            .last()
            .is_some_and(|m| m.text().contains("Write the summary"));
        Ok(if asked {
            let mut res = ModelResponse::text("the summary")
                .with_usage(tower_agent_core::Usage::new(100, 10));
            // What a fallback below spent on a failed attempt for it.
            res.add_side_usage(tower_agent_core::Usage::new(50, 0));
            res
        } else {
            ModelResponse::text("ok")
        })
    });
    let (mut req, _ctx, _recorder) = request(chat(12));
    req.options_mut().tool_choice = Some(tower_agent_core::ToolChoice::Required);
    let layer = SummarizeLayer::in_stack()
        .trigger(Trigger::messages(10))
        .keep(Keep::messages(4));
    let res = call(layer, &model, req).await.expect("ok");
    let seen = model.requests();
    assert_eq!(
        seen[0].options.tool_choice,
        Some(tower_agent_core::ToolChoice::None)
    );
    assert_eq!(
        seen[1].options.tool_choice,
        Some(tower_agent_core::ToolChoice::Required),
        "the call itself keeps its choice"
    );
    assert_eq!(res.side_usage, tower_agent_core::Usage::new(150, 10));
}
