//! Summarization never cuts a batch of tool calls apart, even one only partly answered (a
//! result missing, or standing apart from its call): the cut moves so the batch is kept whole
//! or summarized whole, on the summarization layer alone and with the patch layer inside it,
//! as in the canonical order. Only when no cut at all leaves a valid kept part is nothing
//! summarized, and the warning says why.

#![cfg(all(feature = "summarize", feature = "patch"))]

mod common;

use serde_json::json;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent_core::history::validate;
use tower_agent_core::{Event, Message, ModelResponse, Role, ToolCall, ToolResult};
use tower_agent_layers::PatchDanglingLayer;
use tower_agent_layers::summarize::{Keep, SummarizeLayer, Trigger, is_summary};
use tower_agent_test::{EventRecorder, ScriptedModel, dump};

use common::{request, summarizer, talk};

fn read(id: &str) -> ToolCall {
    ToolCall::new(id, "read", json!({ "path": id }))
}

fn answer(id: &str) -> Message {
    Message::tool_result(ToolResult::success(&read(id), format!("contents of {id}")))
}

/// Whether `message` belongs to the batch of calls `a` and `b`: their message or a result.
fn of_batch(message: &Message) -> bool {
    message
        .tool_calls()
        .map(|c| c.id.as_str())
        .chain(message.tool_results().map(|r| r.call_id.as_str()))
        .any(|id| id == "a" || id == "b")
}

/// The calls of the last assistant message when only tool messages follow it.
fn trailing(messages: &[Message]) -> Vec<&str> {
    match messages.iter().rev().find(|m| m.role != Role::Tool) {
        Some(last) if last.role == Role::Assistant => {
            last.tool_calls().map(|c| c.id.as_str()).collect()
        }
        _ => Vec::new(),
    }
}

/// A history whose natural cut (the newest `keep` messages) falls inside the batch of `a` and
/// `b`, which is only partly answered.
struct Case {
    name: &'static str,
    messages: Vec<Message>,
    keep: usize,
}

fn cases() -> Vec<Case> {
    // `b` never answered, and the conversation went on.
    let mut unanswered = talk(8);
    unanswered.push(Message::assistant_with_calls("", [read("a"), read("b")]));
    unanswered.push(answer("a"));
    unanswered.push(Message::user("go on"));
    unanswered.extend(talk(3));
    // `b`'s result stands apart from its call, after another message: some of the batch is
    // in the kept part, its call message in the older part.
    let mut apart = talk(8);
    apart.push(Message::assistant_with_calls("", [read("a"), read("b")]));
    apart.push(answer("a"));
    apart.push(Message::assistant("still reading"));
    apart.push(answer("b"));
    apart.extend(talk(3));
    // A round still running (or a call waiting for a decision): the batch ends the history.
    let mut running = talk(8);
    running.push(Message::assistant_with_calls("", [read("a"), read("b")]));
    running.push(answer("a"));
    vec![
        Case {
            name: "a call never answered",
            messages: unanswered,
            keep: 5,
        },
        Case {
            name: "a result apart from its call",
            messages: apart,
            keep: 5,
        },
        Case {
            name: "a round still running",
            messages: running,
            keep: 1,
        },
    ]
}

/// The layer for `case`: fires now, keeps `keep` messages.
fn layer(keep: usize) -> SummarizeLayer {
    SummarizeLayer::new(summarizer("They talked and read files."))
        .trigger(Trigger::messages(4))
        .keep(Keep::messages(keep))
}

fn no_reordering_advice(recorder: &EventRecorder) {
    for event in recorder.events() {
        if let Event::Warning { message, .. } = event {
            assert!(!message.contains("patch layer"), "{message}");
        }
    }
}

/// The committed history holds a summary and a kept part that is valid on its own and holds
/// the batch whole or none of it.
fn check_committed(name: &str, input: &[Message], committed: &[Message]) {
    let show = format!("{name}:\n{}", dump(committed));
    assert!(is_summary(&committed[0]), "summarized: {show}");
    let kept = &committed[1..];
    assert_eq!(kept, &input[input.len() - kept.len()..], "{show}");
    assert_eq!(validate(kept, &trailing(kept)), Ok(()), "{show}");
    let whole = input.iter().filter(|m| of_batch(m)).count();
    let held = kept.iter().filter(|m| of_batch(m)).count();
    assert!(held == 0 || held == whole, "the batch cut apart: {show}");
}

#[tokio::test]
async fn a_cut_inside_a_partly_answered_batch_moves_on_the_layer_alone() {
    for case in cases() {
        let model = ScriptedModel::new([ModelResponse::text("ok")]);
        let (req, _, recorder) = request(case.messages.clone());
        let res = common::call(layer(case.keep), &model, req)
            .await
            .expect("answered");
        let committed = res.history.unwrap_or_else(|| {
            panic!(
                "{}: nothing was summarized: {:?}",
                case.name,
                recorder.events()
            )
        });
        check_committed(case.name, &case.messages, &committed);
        assert_eq!(model.requests()[0].messages, committed, "{}", case.name);
        no_reordering_advice(&recorder);
    }
}

#[tokio::test]
async fn a_cut_inside_a_partly_answered_batch_moves_with_the_patch_inside() {
    for case in cases() {
        let model = ScriptedModel::new([ModelResponse::text("ok")]);
        let (req, _, recorder) = request(case.messages.clone());
        let mut stack = ServiceBuilder::new()
            .layer(layer(case.keep))
            .layer(PatchDanglingLayer::new())
            .service(model.clone());
        let res = stack
            .ready()
            .await
            .expect("ready")
            .call(req)
            .await
            .expect("answered");
        let committed = res.history.unwrap_or_else(|| {
            panic!(
                "{}: nothing was summarized: {:?}",
                case.name,
                recorder.events()
            )
        });
        check_committed(case.name, &case.messages, &committed);
        let sent = &model.requests()[0].messages;
        assert_eq!(
            validate(sent, &[]),
            Ok(()),
            "{}:\n{}",
            case.name,
            dump(sent)
        );
        assert!(is_summary(&sent[0]), "{}", case.name);
        no_reordering_advice(&recorder);
    }
}

#[tokio::test]
async fn the_cut_moves_past_a_call_never_answered_to_the_next_message() {
    let case = cases().remove(0);
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let (req, _, _) = request(case.messages.clone());
    let res = common::call(layer(case.keep), &model, req)
        .await
        .expect("answered");
    let committed = res.history.expect("summarized");
    // Folded whole with the talk before it; kept from the message that follows it.
    assert_eq!(committed.len(), 5, "{}", dump(&committed));
    assert_eq!(committed[1].text(), "go on");
}

#[tokio::test]
async fn when_no_cut_leaves_a_valid_kept_part_nothing_is_summarized_and_a_warning_says_why() {
    // The newest messages are broken themselves: `b`'s result stands apart from its call after
    // the last text message, so every kept part holds the orphan or the call without it.
    let mut messages = talk(8);
    messages.push(Message::assistant_with_calls("", [read("a"), read("b")]));
    messages.push(answer("a"));
    messages.push(Message::assistant("still reading"));
    messages.push(answer("b"));
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let summary = summarizer("unused");
    let layer = SummarizeLayer::new(summary.clone())
        .trigger(Trigger::messages(4))
        .keep(Keep::messages(3));
    let (req, _, recorder) = request(messages);
    let res = common::call(layer, &model, req).await.expect("answered");
    assert!(res.history.is_none(), "nothing committed");
    assert_eq!(summary.request_count(), 0);
    let warnings: Vec<String> = recorder
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Warning {
                source: "summarize",
                message,
            } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("not a valid history on their own"),
        "{}",
        warnings[0]
    );
    assert!(
        warnings[0].contains("`b`"),
        "names the defect: {}",
        warnings[0]
    );
    no_reordering_advice(&recorder);
}
