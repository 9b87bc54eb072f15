use serde_json::json;
use tower_agent_core::{Message, RunContext, ToolCall};

use super::*;

const LONG: &str = "a line of a long tool result\n";

fn call(id: &str, tool: &str) -> ToolCall {
    ToolCall::new(id, tool, json!({ "id": id }))
}

/// A user message, then `n` rounds of one call of `tool` and its long result.
fn rounds(tools: &[&str]) -> Vec<Message> {
    let mut history = vec![Message::user("go")];
    for (i, tool) in tools.iter().enumerate() {
        let call = call(&format!("c{i}"), tool);
        history.push(Message::assistant_with_calls("", [call.clone()]));
        history.push(Message::tool_result(ToolResult::success(
            &call,
            LONG.repeat(20),
        )));
    }
    history
}

/// Clear from the first token on, one result at a time.
fn one_at_a_time() -> ClearToolResultsLayer {
    ClearToolResultsLayer::new().trigger(0).batch(1)
}

fn sent(layer: &ClearToolResultsLayer, req: &ModelRequest) -> History {
    edit(&layer.config, req).unwrap_or_else(|| req.messages.clone())
}

/// Which results of `history` were cleared, by call id.
fn cleared(history: &History) -> Vec<String> {
    history
        .iter()
        .flat_map(Message::tool_results)
        .filter(|r| r.content.starts_with("[cleared"))
        .map(|r| r.call_id.clone())
        .collect()
}

fn request(history: Vec<Message>) -> ModelRequest {
    ModelRequest::new(history)
}

#[test]
fn the_newest_results_stay_and_older_ones_keep_their_call_id_and_flag() {
    let mut history = rounds(&["read", "read", "read", "read", "read"]);
    // The oldest is an error result: cleared too, still an error.
    if let ContentPart::ToolResult(r) = &mut history[2].content[0] {
        r.is_error = true;
    }
    let req = request(history.clone());
    let out = sent(&one_at_a_time().keep(2), &req);
    assert_eq!(cleared(&out), ["c0", "c1", "c2"]);
    let first = out[2].tool_results().next().expect("a result");
    assert_eq!(
        (first.call_id.as_str(), first.name.as_str(), first.is_error),
        ("c0", "read", true)
    );
    assert_eq!(first.content, default_placeholder("read"));
    assert_eq!(
        out[10].tool_results().next().map(|r| r.content.len()),
        Some(LONG.len() * 20)
    );
    assert_eq!(out.len(), history.len(), "no message added or dropped");
    assert_eq!(
        req.messages.as_slice(),
        history.as_slice(),
        "the request's own history is untouched"
    );
    assert!(out.validate().is_ok());
}

/// The layer's count of `req`, continuing `counted`.
fn count(config: &Config, req: &ModelRequest, counted: &mut RunningCount) -> usize {
    counted.count(&*config.counter, req)
}

#[test]
fn nothing_is_cleared_under_the_trigger() {
    let req = request(rounds(&["read"; 5]));
    let size = count(
        &ClearToolResultsLayer::new().config,
        &req,
        &mut RunningCount::default(),
    );
    let layer = ClearToolResultsLayer::new().keep(1).batch(1);
    assert!(edit(&layer.clone().trigger(size + 1).config, &req).is_none());
    assert_eq!(cleared(&sent(&layer.trigger(size), &req)).len(), 4);
}

#[test]
fn batches_clear_a_whole_number_of_results_at_a_time() {
    let layer = one_at_a_time().keep(1).batch(3);
    let counts: Vec<usize> = (1..=8)
        .map(|n| cleared(&sent(&layer, &request(rounds(&vec!["read"; n])))).len())
        .collect();
    assert_eq!(counts, [0, 0, 0, 3, 3, 3, 6, 6]);
}

#[test]
fn excluded_tools_and_short_results_stay_whole() {
    let mut history = rounds(&["memory", "read", "read", "read"]);
    // c1's result is shorter than its placeholder.
    if let ContentPart::ToolResult(r) = &mut history[4].content[0] {
        r.content = "ok".into();
    }
    let layer = one_at_a_time().keep(1).exclude("memory");
    let out = sent(&layer, &request(history));
    assert_eq!(
        cleared(&out),
        ["c2"],
        "memory excluded, c1 too short, c3 kept"
    );
    assert_eq!(
        out[4].tool_results().next().map(|r| r.content.as_str()),
        Some("ok")
    );
}

#[test]
fn a_custom_placeholder_is_used_and_decides_what_is_too_short() {
    let layer = one_at_a_time()
        .keep(0)
        .placeholder(|r: &ToolResult| format!("[cleared {}: ask again]", r.call_id));
    let mut history = rounds(&["read", "read", "read"]);
    // Shorter than its placeholder (23 characters): sent as it is.
    if let ContentPart::ToolResult(r) = &mut history[4].content[0] {
        r.content = "twenty-two characters.".into();
    }
    let out = sent(&layer, &request(history));
    let texts: Vec<String> = out
        .iter()
        .flat_map(Message::tool_results)
        .map(|r| r.content.clone())
        .collect();
    assert_eq!(
        texts,
        [
            "[cleared c0: ask again]",
            "twenty-two characters.",
            "[cleared c2: ask again]"
        ]
    );
}

#[test]
fn a_batch_with_a_waiting_call_stays_whole_and_nothing_is_wedged_behind_it() {
    let (a, b) = (call("a", "read"), call("b", "shell"));
    let mut history = rounds(&["read", "read"]);
    // A dangling call in the middle (a crashed process's leftover): its batch is untouched,
    // the results after it are still cleared.
    let dangling = call("d", "read");
    history.push(Message::user("and then"));
    history.push(Message::assistant_with_calls("", [dangling]));
    history.push(Message::user("more"));
    history.extend(
        rounds(&["read", "read"])
            .into_iter()
            .skip(1)
            .map(|m| rename(m, "late")),
    );
    // An orphan result after a user message: answers nothing, left alone.
    history.push(Message::user("x"));
    history.push(Message::tool_result(ToolResult::success(
        &call("orphan", "read"),
        LONG.repeat(20),
    )));
    // The last batch: `a` answered, `b` waits for a human decision.
    history.push(Message::assistant_with_calls("", [a.clone(), b]));
    history.push(Message::tool_result(ToolResult::success(
        &a,
        LONG.repeat(20),
    )));
    let out = sent(&one_at_a_time().keep(1), &request(history.clone()));
    assert_eq!(
        cleared(&out),
        ["c0", "c1", "late0"],
        "late1 is the newest that qualifies"
    );
    let last = out
        .last()
        .and_then(|m| m.tool_results().next())
        .expect("a's result");
    assert_eq!(
        last.content,
        LONG.repeat(20),
        "the waiting batch is untouched"
    );
    assert_eq!(
        out.open_calls().len(),
        1,
        "b still waits, with no result made up"
    );
    let orphan = out
        .iter()
        .flat_map(Message::tool_results)
        .find(|r| r.call_id == "orphan");
    assert_eq!(orphan.map(|r| r.content.len()), Some(LONG.len() * 20));
}

/// `message` with its call and result ids prefixed by `prefix` instead of `c`.
fn rename(mut message: Message, prefix: &str) -> Message {
    for part in &mut message.content {
        match part {
            ContentPart::ToolCall(c) => c.id = c.id.replacen('c', prefix, 1),
            ContentPart::ToolResult(r) => r.call_id = r.call_id.replacen('c', prefix, 1),
            _ => {}
        }
    }
    message
}

#[test]
fn a_growing_history_in_one_run_reuses_what_was_sent_and_sends_the_same() {
    let layer = one_at_a_time().keep(1).batch(2);
    let ctx = RunContext::new();
    let mut session = History::from(rounds(&["read"; 3]));
    let mut previous: Option<History> = None;
    for round in 3..9 {
        let mut req = ModelRequest::new(session.clone());
        req.ctx = ctx.clone();
        let out = sent(&layer, &req);
        let fresh = sent(&layer, &request(session.to_vec()));
        assert_eq!(
            out.as_slice(),
            fresh.as_slice(),
            "round {round}: as edited from scratch"
        );
        if let Some(previous) = &previous {
            let same_batch = cleared(previous).len() == cleared(&out).len();
            let kept = out.kept(&previous.mark());
            if same_batch {
                assert_eq!(
                    kept,
                    previous.len(),
                    "round {round}: appended to what was sent"
                );
            } else {
                assert!(
                    kept < previous.len(),
                    "round {round}: a new batch is a new edit"
                );
            }
        }
        drop(req);
        previous = Some(out);
        let next = call(&format!("c{round}"), "read");
        session.push(Message::assistant_with_calls("", [next.clone()]));
        session.push(Message::tool_result(ToolResult::success(
            &next,
            LONG.repeat(20),
        )));
    }
}

#[test]
fn debug_shows_the_configuration() {
    let layer = ClearToolResultsLayer::new()
        .keep(2)
        .exclude("b")
        .exclude("a");
    assert_eq!(
        format!("{layer:?}"),
        r#"ClearToolResultsLayer { trigger: 100000, keep: 2, batch: 10, clear_at_least: 0, clear_inputs: false, exclude: ["a", "b"], .. }"#
    );
}

#[test]
fn a_side_call_is_sent_whole() {
    let run = RunContext::new();
    let mut req = request(rounds(&["read"; 4]));
    req.ctx = run.side_call();
    assert!(edit(&one_at_a_time().keep(1).config, &req).is_none());
    req.ctx = run;
    assert_eq!(cleared(&sent(&one_at_a_time().keep(1), &req)).len(), 3);
}

#[test]
fn a_growing_history_is_counted_as_a_fresh_one() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // Counts as the estimate does, and how many characters it read.
    let read = Arc::new(AtomicUsize::new(0));
    let reading = Arc::clone(&read);
    let layer = ClearToolResultsLayer::new().counter(move |text: &str| {
        reading.fetch_add(text.len(), Ordering::Relaxed);
        CharEstimate.count_text(text)
    });
    let config = &layer.config;
    let mut counted = RunningCount::default();
    let mut session = History::from(rounds(&["read"; 2]));
    for round in 2..6 {
        let mut req = ModelRequest::new(session.clone());
        req.system = Some(format!("round {round}").into());
        let before = read.load(Ordering::Relaxed);
        let fresh = count(config, &req, &mut RunningCount::default());
        let whole = read.load(Ordering::Relaxed) - before;
        assert_eq!(count(config, &req, &mut counted), fresh, "round {round}");
        let again = read.load(Ordering::Relaxed) - before - whole;
        if round > 2 {
            assert!(
                again * 2 < whole,
                "round {round}: only the new messages read ({again} of {whole})"
            );
        }
        // The same request once more: nothing is read again, the frame neither.
        let before = read.load(Ordering::Relaxed);
        assert_eq!(count(config, &req, &mut counted), fresh, "round {round}");
        assert_eq!(read.load(Ordering::Relaxed), before, "round {round}");
        let next = call(&format!("c{round}"), "read");
        session.push(Message::assistant_with_calls("", [next.clone()]));
        session.push(Message::tool_result(ToolResult::success(
            &next,
            LONG.repeat(round),
        )));
    }
    // A rewritten history is counted whole again.
    let shorter = ModelRequest::new(rounds(&["read"]));
    assert_eq!(
        count(config, &shorter, &mut counted),
        count(config, &shorter, &mut RunningCount::default())
    );
}

/// LangChain's `clear_at_least`: nothing is cleared until the edit frees that many tokens.
#[test]
fn nothing_is_cleared_until_it_frees_at_least_that_many_tokens() {
    let req = request(rounds(&["read", "read", "read"]));
    // Two results may go (keep 1); each frees about 140 tokens by the character estimate.
    let layer = one_at_a_time().keep(1);
    assert_eq!(cleared(&sent(&layer, &req)), ["c0", "c1"]);
    assert!(cleared(&sent(&layer.clone().clear_at_least(100_000), &req)).is_empty());
    assert_eq!(
        cleared(&sent(&layer.clear_at_least(200), &req)),
        ["c0", "c1"],
        "two results free more than 200 tokens"
    );
}

/// LangChain's `clear_tool_inputs`: the cleared results' calls lose their arguments too, the
/// others keep theirs; the session is not touched.
#[test]
fn clearing_inputs_empties_the_arguments_of_the_cleared_calls_only() {
    let req = request(rounds(&["read", "read", "read"]));
    let out = sent(&one_at_a_time().keep(1).clear_inputs(true), &req);
    let arguments: Vec<(String, String)> = out
        .iter()
        .flat_map(Message::tool_calls)
        .map(|c| (c.id.clone(), c.arguments.clone()))
        .collect();
    assert_eq!(
        arguments,
        [
            ("c0".to_owned(), "{}".to_owned()),
            ("c1".to_owned(), "{}".to_owned()),
            ("c2".to_owned(), r#"{"id":"c2"}"#.to_owned()),
        ]
    );
    let kept: Vec<&str> = req
        .messages
        .iter()
        .flat_map(Message::tool_calls)
        .map(|c| c.arguments.as_str())
        .collect();
    assert_eq!(kept, [r#"{"id":"c0"}"#, r#"{"id":"c1"}"#, r#"{"id":"c2"}"#]);
}
