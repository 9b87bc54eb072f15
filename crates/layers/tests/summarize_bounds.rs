//! The bounds on sizes of the summarization layer: what one summarizer call gets, what it may
//! answer, summaries that are not smaller, how the layer counts, triggers that make no sense.

#![cfg(feature = "summarize")]

mod common;

use std::sync::Arc;

use tower::util::BoxCloneService;
use tower_agent_core::{Error, ErrorKind, Event, Message, ModelRequest, ModelResponse, Usage};
use tower_agent_layers::summarize::{Keep, SummarizeLayer, Trigger, summary_message, summary_text};
use tower_agent_layers::tokens::{CharEstimate, TokenCounter};
use tower_agent_test::ScriptedModel;

use common::{call, chat, request, summarizer, talk};

#[tokio::test]
async fn a_bounded_input_is_summarized_in_turn_oldest_first() {
    use tower_agent_layers::tokens::{CharEstimate, TokenCounter};

    // Each call answers with a numbered summary, so the next input shows which it folds in.
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let summarizer = ScriptedModel::from_fn({
        let calls = Arc::clone(&calls);
        move |_| {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            Ok(ModelResponse::text(format!("summary {n}")))
        }
    });
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    // Ten messages of about 100 tokens each, then two kept.
    let messages: Vec<Message> = (0..12)
        .map(|i| {
            let text = format!("m{i} {}", "z".repeat(396));
            if i % 2 == 0 {
                Message::user(text)
            } else {
                Message::assistant(text)
            }
        })
        .collect();
    let (req, _ctx, _) = request(messages);
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(12))
        .keep(Keep::messages(2))
        .max_input_tokens(350);
    let res = call(layer, &model, req).await.expect("ok");

    let inputs: Vec<String> = summarizer
        .requests()
        .iter()
        .map(|r| r.messages[0].text())
        .collect();
    assert!(inputs.len() >= 3, "{} calls", inputs.len());
    for (n, input) in inputs.iter().enumerate() {
        let tokens = CharEstimate.count_text(input);
        assert!(tokens <= 350, "call {n}: {tokens} tokens");
        // Each call after the first folds in the summary the one before wrote.
        if n > 0 {
            assert!(
                input.starts_with(&format!("The summary so far:\nsummary {n}\n")),
                "{input}"
            );
        }
    }
    // Every summarized message went to exactly one call, in order.
    let seen: Vec<usize> = inputs
        .iter()
        .flat_map(|input| (0..10).filter(move |i| input.contains(&format!("m{i} "))))
        .collect();
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    // The history starts with the last summary.
    let committed = res.history.clone().expect("committed");
    assert_eq!(
        summary_text(&committed[0]),
        Some(format!("summary {}", inputs.len()).as_str())
    );
    assert_eq!(committed.len(), 3);
}

#[tokio::test]
async fn a_message_over_the_bound_goes_alone() {
    let summarizer = summarizer("s");
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let mut messages = chat(4);
    messages[0] = Message::user("w".repeat(1_600)); // about 400 tokens
    let (req, _, _) = request(messages);
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(4))
        .keep(Keep::messages(1))
        .max_input_tokens(100);
    call(layer, &model, req).await.expect("ok");
    let inputs: Vec<String> = summarizer
        .requests()
        .iter()
        .map(|r| r.messages[0].text())
        .collect();
    // The long message alone, then the two short ones together.
    assert_eq!(inputs.len(), 2, "{inputs:?}");
    assert!(inputs[0].contains(&"w".repeat(100)) && !inputs[0].contains("a1"));
    assert!(
        inputs[1].contains("a1") && inputs[1].contains("q2"),
        "{}",
        inputs[1]
    );
}

#[tokio::test]
async fn the_bound_holds_for_a_counter_that_does_not_add_up() {
    // Rounds down: the pieces' counts add up to less than the whole's.
    let counter = |text: &str| text.len() / 40;
    let summarizer = summarizer("s");
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let messages: Vec<Message> = (0..9)
        .map(|i| Message::user(format!("m{i} {}", "v".repeat(75))))
        .collect();
    let (req, _, _) = request(messages);
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(9))
        .keep(Keep::messages(1))
        .counter(counter)
        .max_input_tokens(10);
    call(layer, &model, req).await.expect("ok");
    let inputs: Vec<String> = summarizer
        .requests()
        .iter()
        .map(|r| r.messages[0].text())
        .collect();
    assert!(inputs.len() > 1, "{inputs:?}");
    for input in &inputs {
        assert!(counter(input) <= 10, "{} tokens: {input}", counter(input));
    }
}

#[tokio::test]
async fn the_summarizer_is_asked_for_at_most_half_of_what_it_replaces() {
    // Ten messages of about 500 tokens each are summarized, two kept.
    let long: Vec<Message> = (0..12)
        .map(|i| Message::user(format!("m{i} {}", "word ".repeat(400))))
        .collect();
    let replaced: usize = long[..10]
        .iter()
        .map(|m| CharEstimate.count_message(m))
        .sum();
    // Derived from what it replaces; configured; never under 64 (three messages of 35
    // tokens); and never so much that the summary message would not be smaller (one message
    // of 35 tokens: 18, with the 17 of the summary's frame).
    for (messages, configured, keep, expected) in [
        (long.clone(), None, 2, replaced / 2),
        (long, Some(300), 2, 300),
        (talk(12), None, 9, 64),
        (talk(12), None, 11, 18),
    ] {
        let summarizer = summarizer("the gist");
        let mut layer = SummarizeLayer::new(summarizer.clone())
            .keep(Keep::messages(keep))
            .trigger(Trigger::messages(12));
        if let Some(tokens) = configured {
            layer = layer.max_summary_tokens(tokens);
        }
        let model = ScriptedModel::new([ModelResponse::text("ok")]);
        let (req, _, _) = request(messages);
        call(layer, &model, req).await.expect("ok");
        let asked = summarizer.requests()[0].options.max_tokens;
        assert_eq!(asked, Some(expected as u32), "{configured:?}, keep {keep}");
    }
}

/// A summarizer that writes `chars` characters whatever it is asked, as the real model of the
/// report did (3,853 tokens until its window was full).
fn verbose(chars: usize) -> ScriptedModel {
    ScriptedModel::from_fn(move |_| Ok(ModelResponse::text("blah ".repeat(chars / 5))))
}

#[tokio::test]
async fn a_summary_that_is_not_smaller_is_never_committed() {
    let summarizer = verbose(20_000);
    let model = ScriptedModel::from_fn(|_| Ok(ModelResponse::text("ok")));
    let messages = talk(6);
    let (req, ctx, recorder) = request(messages.clone());
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(6))
        .keep(Keep::messages(2));
    let res = call(layer.clone(), &model, req).await.expect("ok");
    assert_eq!(summarizer.request_count(), 1);
    assert_eq!(
        model.requests()[0].messages.as_slice(),
        messages.as_slice(),
        "the history is kept"
    );
    assert!(res.history.clone().is_none(), "nothing committed");
    assert!(!recorder.names().contains(&"summarized"));
    let warned = recorder.events().into_iter().any(|e| matches!(
        e,
        Event::Warning { source: "summarize", message } if message.contains("is not smaller than the 4 messages it would replace")
    ));
    assert!(warned, "{:?}", recorder.names());

    // The next rounds do not ask again until the request has grown by a tenth.
    let mut grown = messages.clone();
    grown.push(Message::assistant("a6"));
    let mut req = ModelRequest::new(grown.clone());
    req.ctx = ctx.clone();
    call(layer.clone(), &model, req).await.expect("ok");
    assert_eq!(summarizer.request_count(), 1, "resting");
    grown.extend(talk(2));
    let mut req = ModelRequest::new(grown);
    req.ctx = ctx.clone();
    call(layer, &model, req).await.expect("ok");
    assert_eq!(summarizer.request_count(), 2, "grown: asked again");
}

#[tokio::test]
async fn a_summarization_that_saved_little_rests_until_the_request_grows() {
    // The kept part holds nearly everything: summarizing the rest saves under a tenth.
    let mut messages = talk(2);
    messages.push(Message::user("k".repeat(4_000)));
    messages.push(Message::assistant("ok"));
    let summarizer = summarizer("gist");
    let model = ScriptedModel::from_fn(|_| Ok(ModelResponse::text("ok")));
    let (req, ctx, _) = request(messages);
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::tokens(1_000))
        .keep(Keep::messages(2));
    let res = call(layer.clone(), &model, req).await.expect("ok");
    assert_eq!(summarizer.request_count(), 1, "summarized once");
    let committed = res.history.clone().expect("committed");
    // The next round adds two messages: still over the trigger, but the layer rests.
    let mut history = committed.to_vec();
    history.extend(talk(2));
    let mut req = ModelRequest::new(history);
    req.ctx = ctx.clone();
    call(layer, &model, req).await.expect("ok");
    assert_eq!(summarizer.request_count(), 1, "not every round");
}

#[tokio::test]
async fn the_previous_summary_is_bounded_when_it_is_folded_in() {
    // A history whose summary came from a summarizer that ignored its bound.
    let mut messages = vec![summary_message(&"old ".repeat(20_000))];
    messages.extend(talk(6));
    let summarizer = summarizer("short");
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let (req, _, _) = request(messages);
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(7))
        .keep(Keep::messages(2))
        .max_summary_tokens(500);
    call(layer, &model, req).await.expect("ok");
    let input = summarizer.requests()[0].messages[0].text();
    let tokens = CharEstimate.count_text(&input);
    // The previous summary at most 500 tokens, and the four messages.
    assert!(tokens < 500 + 4 * 40, "{tokens} tokens");
    assert!(
        input.contains("old old") && input.contains("… [cut]"),
        "{input}"
    );
}

#[tokio::test]
async fn a_summarizer_that_says_too_long_gets_its_input_in_halves() {
    // A summarizer whose own window is 300 tokens.
    let summarizer = ScriptedModel::from_fn(|req: &ModelRequest| {
        let tokens = CharEstimate.count_text(&req.messages[0].text());
        if tokens > 300 {
            return Err(Error::new(ErrorKind::ContextTooLong, "too long"));
        }
        Ok(ModelResponse::text("gist"))
    });
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let (req, _ctx, _) = request(talk(22));
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(22))
        .keep(Keep::messages(2));
    let res = call(layer, &model, req).await.expect("summarized in parts");
    let answered = summarizer
        .requests()
        .iter()
        .filter(|r| CharEstimate.count_text(&r.messages[0].text()) <= 300)
        .count();
    assert!(answered >= 3, "{answered}");
    let committed = res.history.clone().expect("committed");
    assert_eq!(summary_text(&committed[0]), Some("gist"));
    assert_eq!(committed.len(), 3);
}

#[test]
fn triggers_that_fire_always_or_never_are_refused_when_the_layer_is_built() {
    for (trigger, says) in [
        (Trigger::tokens(0), "Trigger::tokens(0)"),
        (Trigger::messages(0), "Trigger::messages(0)"),
        (Trigger::fraction(0.0, 1_000), "(0, 1]"),
        (Trigger::fraction(-0.5, 1_000), "(0, 1]"),
        (Trigger::fraction(1.5, 1_000), "above 1 never"),
        (Trigger::fraction(f64::NAN, 1_000), "(0, 1]"),
        (Trigger::fraction(0.5, 0), "a window of 0"),
    ] {
        let panic =
            std::panic::catch_unwind(|| SummarizeLayer::new(summarizer("s")).trigger(trigger))
                .expect_err("refused");
        let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains(says), "{trigger:?}: {message}");
    }
    // The edges that make sense are accepted.
    let _ = SummarizeLayer::new(summarizer("s"))
        .trigger(Trigger::tokens(1))
        .trigger(Trigger::messages(1))
        .trigger(Trigger::fraction(1.0, 1))
        .trigger(Trigger::fraction(f64::MIN_POSITIVE, 1));
}

#[tokio::test]
async fn the_provider_s_count_of_the_previous_call_is_used() {
    // The first call reports 990 input tokens for what the estimate calls ~40.
    let model = ScriptedModel::new([
        ModelResponse::text("a1").with_usage(Usage::new(990, 30)),
        ModelResponse::text("ok"),
    ]);
    let summarizer = summarizer("gist");
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::tokens(1_000))
        .keep(Keep::messages(1));
    let (req, ctx, _) = request(talk(1));
    // The next round's history is this one, grown (as the agent's is).
    let mut messages = req.messages.clone();
    call(layer.clone(), &model, req).await.expect("ok");
    assert_eq!(
        summarizer.request_count(),
        0,
        "the estimate is under the trigger"
    );
    // The next call: the previous request and answer (1,020 by the provider) and a new
    // message: over the trigger, though the estimate alone is not.
    messages.push(Message::assistant("a1"));
    messages.push(Message::user("q2: and then?"));
    let estimate: usize = messages.iter().map(|m| CharEstimate.count_message(m)).sum();
    assert!(estimate < 100, "{estimate}");
    let mut req = ModelRequest::new(messages);
    req.ctx = ctx.clone();
    call(layer, &model, req).await.expect("ok");
    assert_eq!(summarizer.request_count(), 1, "counted as the provider did");
}

#[tokio::test]
async fn a_summarizer_need_not_be_sync() {
    let summarizer: BoxCloneService<ModelRequest, ModelResponse, Error> =
        BoxCloneService::new(summarizer("the gist"));
    let layer = SummarizeLayer::new(summarizer)
        .trigger(Trigger::messages(4))
        .keep(Keep::messages(1));
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let (req, _ctx, _) = request(talk(4));
    let res = call(layer, &model, req).await.expect("ok");
    let committed = res.history.clone().expect("committed");
    assert_eq!(summary_text(&committed[0]), Some("the gist"));
}

#[tokio::test]
async fn a_trailing_call_that_a_layer_inside_answers_does_not_stop_a_summary() {
    // Driven directly: the last message asks for a call the patch layer inside answers.
    let mut messages = talk(6);
    messages.push(Message::assistant_with_calls(
        "",
        [tower_agent_core::ToolCall::new(
            "c1",
            "ls",
            serde_json::json!({}),
        )],
    ));
    let summarizer = summarizer("gist");
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let (req, _, _) = request(messages);
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(7))
        .keep(Keep::messages(1));
    call(layer, &model, req).await.expect("ok");
    assert_eq!(summarizer.request_count(), 1);
    assert_eq!(model.requests()[0].messages.len(), 2);

    // A kept part that would be broken in the middle (a call never answered, then more talk):
    // the cut moves past the call, which is summarized with the messages before it.
    let ls = |id: &str| tower_agent_core::ToolCall::new(id, "ls", serde_json::json!({}));
    let mut messages = talk(4);
    messages.push(Message::assistant_with_calls("", [ls("c1")]));
    messages.push(Message::user("and?"));
    messages.push(Message::assistant("well"));
    let (req, _, recorder) = request(messages);
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(7))
        .keep(Keep::messages(3));
    let res = call(layer, &model_ok(), req).await.expect("ok");
    assert_eq!(summarizer.request_count(), 2, "summarized past the call");
    let committed = res.history.expect("committed");
    assert_eq!(committed.len(), 3, "the summary, `and?` and `well`");
    assert_eq!(committed[1].text(), "and?");
    assert_eq!(committed.validate(), Ok(()));
    assert!(
        recorder
            .events()
            .iter()
            .all(|e| !matches!(e, Event::Warning { .. }))
    );

    // The newest messages broken themselves (a result after a later message): no cut leaves
    // a valid kept part, nothing is summarized, and an event says why.
    let mut messages = talk(4);
    messages.push(Message::assistant_with_calls("", [ls("c1"), ls("c2")]));
    messages.push(Message::tool_result(tower_agent_core::ToolResult::success(
        &ls("c1"),
        "a.txt",
    )));
    messages.push(Message::assistant("well"));
    messages.push(Message::tool_result(tower_agent_core::ToolResult::success(
        &ls("c2"),
        "b.txt",
    )));
    let (req, _, recorder) = request(messages);
    let layer = SummarizeLayer::new(summarizer.clone())
        .trigger(Trigger::messages(7))
        .keep(Keep::messages(3));
    call(layer, &model_ok(), req).await.expect("ok");
    assert_eq!(summarizer.request_count(), 2, "no third summary");
    let said = recorder.events().into_iter().any(|e| matches!(
        e,
        Event::Warning { source: "summarize", message } if message.contains("not a valid history on their own")
    ));
    assert!(said);
}

fn model_ok() -> ScriptedModel {
    ScriptedModel::from_fn(|_| Ok(ModelResponse::text("ok")))
}
