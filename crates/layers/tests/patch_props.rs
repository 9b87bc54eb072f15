//! Property test of the patching: random histories with interruptions, reused and empty ids,
//! parallel calls, late and orphan results, results inside user messages, text inside tool
//! messages. After the repair the history is valid, and nothing that was not synthetic is lost
//! or reordered. Calls waiting for a decision (the agent side's repair) are never dropped nor
//! answered.
//!
//! 10,000 cases by default; `PROPTEST_CASES=n` changes it.

#![cfg(feature = "patch")]

use proptest::prelude::*;
use serde_json::json;
use tower_agent_core::{ContentPart, History, Message, Repair, Role, ToolCall, ToolResult};
use tower_agent_layers::patch::{MALFORMED, UNANSWERED, Unanswered, repair_history};
use tower_agent_test::{assert_valid_history, dump};

#[derive(Debug, Clone)]
enum Step {
    User,
    Assistant,
    /// An assistant message with calls (ids from a small pool: reuse is common), then results
    /// for the calls marked answered, in call order or reversed.
    Calls {
        ids: Vec<u8>,
        malformed: Vec<bool>,
        answered: Vec<bool>,
        reversed: bool,
        text: bool,
    },
    /// A tool message answering an id of the pool, wherever it lands.
    Result(u8),
    /// A user message holding a result and text (Anthropic's shape, stored as is).
    UserWithResult(u8),
    /// A tool message holding a result and text.
    ToolWithText(u8),
}

fn id(n: u8) -> String {
    if n == 6 {
        String::new()
    } else {
        format!("c{n}")
    }
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => Just(Step::User),
        1 => Just(Step::Assistant),
        5 => (1..=4usize).prop_flat_map(|n| (
            prop::collection::vec(0..7u8, n),
            prop::collection::vec(prop::bool::weighted(0.1), n),
            prop::collection::vec(prop::bool::weighted(0.75), n),
            any::<bool>(),
            any::<bool>(),
        )).prop_map(|(ids, malformed, answered, reversed, text)| Step::Calls { ids, malformed, answered, reversed, text }),
        1 => (0..7u8).prop_map(Step::Result),
        1 => (0..7u8).prop_map(Step::UserWithResult),
        1 => (0..7u8).prop_map(Step::ToolWithText),
    ]
}

/// The messages of `steps`; every text and result content is unique, so it can be followed.
fn build(steps: &[Step]) -> Vec<Message> {
    let mut messages = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let result =
            |n: u8| ToolResult::success(&ToolCall::new(id(n), "t", json!({})), format!("r{i}"));
        match step {
            Step::User => messages.push(Message::user(format!("u{i}"))),
            Step::Assistant => messages.push(Message::assistant(format!("a{i}"))),
            Step::Calls {
                ids,
                malformed,
                answered,
                reversed,
                text,
            } => {
                let calls: Vec<ToolCall> = ids
                    .iter()
                    .zip(malformed)
                    .enumerate()
                    .map(|(k, (&n, &bad))| {
                        if bad {
                            ToolCall::raw(id(n), format!("t{i}_{k}"), "{not json")
                        } else {
                            ToolCall::new(id(n), format!("t{i}_{k}"), json!({ "k": k }))
                        }
                    })
                    .collect();
                let text = if *text {
                    format!("a{i}")
                } else {
                    String::new()
                };
                messages.push(Message::assistant_with_calls(text, calls.clone()));
                let mut results: Vec<Message> = calls
                    .iter()
                    .zip(answered)
                    .enumerate()
                    .filter(|(_, (_, done))| **done)
                    .map(|(k, (call, _))| {
                        Message::tool_result(ToolResult::success(call, format!("r{i}_{k}")))
                    })
                    .collect();
                if *reversed {
                    results.reverse();
                }
                messages.extend(results);
            }
            Step::Result(n) => messages.push(Message::tool_result(result(*n))),
            Step::UserWithResult(n) => messages.push(Message {
                role: Role::User,
                content: vec![
                    ContentPart::ToolResult(result(*n)),
                    ContentPart::Text {
                        text: format!("u{i}"),
                    },
                ],
            }),
            Step::ToolWithText(n) => messages.push(Message {
                role: Role::Tool,
                content: vec![
                    ContentPart::ToolResult(result(*n)),
                    ContentPart::Text {
                        text: format!("t{i}"),
                    },
                ],
            }),
        }
    }
    messages
}

fn texts(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .flat_map(|m| &m.content)
        .filter_map(|p| match p {
            ContentPart::Text { text } if !text.is_empty() => Some(text.clone()),
            _ => None,
        })
        .collect()
}

fn calls(messages: &[Message]) -> Vec<(String, String)> {
    messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .flat_map(Message::tool_calls)
        .map(|c| (c.name.clone(), c.arguments.clone()))
        .collect()
}

fn is_synthetic(result: &ToolResult) -> bool {
    result.is_error && (result.content == UNANSWERED || result.content.starts_with(MALFORMED))
}

fn check(steps: &[Step], unanswered: Unanswered) -> Result<(), TestCaseError> {
    let input = build(steps);
    let mut history = History::from(input.clone());
    let report = repair_history(&mut history, unanswered);
    let show = |h: &History| format!("input:\n{}output:\n{}", dump(&input), dump(h));

    assert_valid_history(&history);
    prop_assert!(
        history.iter().all(|m| !m.content.is_empty()),
        "an empty message was left\n{}",
        show(&history)
    );
    // Texts are kept, in order.
    prop_assert_eq!(texts(&history), texts(&input), "{}", show(&history));
    // Calls are kept in order (dropped ones aside), renamed at most.
    let (before, after) = (calls(&input), calls(&history));
    match unanswered {
        Unanswered::Answer => prop_assert_eq!(&after, &before, "{}", show(&history)),
        _ => {
            prop_assert_eq!(
                after.len() + report.dropped_calls,
                before.len(),
                "{}",
                show(&history)
            );
            let mut rest = before.iter();
            prop_assert!(
                after.iter().all(|c| rest.any(|b| b == c)),
                "calls reordered\n{}",
                show(&history)
            );
        }
    }
    // Every result is synthetic or one of the input's, each input result used at most once,
    // and each answers a call of the same tool.
    let mut unused: Vec<&ToolResult> = input.iter().flat_map(Message::tool_results).collect();
    let mut synthetic = 0;
    for (index, message) in history.iter().enumerate() {
        for result in message.tool_results() {
            let call = history[..index]
                .iter()
                .rev()
                .find(|m| m.role == Role::Assistant)
                .and_then(|m| m.tool_calls().find(|c| c.id == result.call_id));
            prop_assert!(
                call.is_some(),
                "result {} answers no call\n{}",
                result.call_id,
                show(&history)
            );
            if is_synthetic(result) {
                synthetic += 1;
                continue;
            }
            let found = unused.iter().position(|r| r.content == result.content);
            prop_assert!(
                found.is_some(),
                "result {} is not from the input\n{}",
                result.content,
                show(&history)
            );
            unused.swap_remove(found.unwrap_or_default());
        }
    }
    prop_assert_eq!(synthetic, report.answered, "{}", show(&history));
    // A call answered right after its message, with an id used once, keeps its result.
    for (index, message) in input.iter().enumerate() {
        for call in message.tool_calls() {
            let used_once = input
                .iter()
                .flat_map(Message::tool_calls)
                .filter(|c| c.id == call.id)
                .count()
                == 1;
            let next = input[index + 1..]
                .iter()
                .take_while(|m| m.role == Role::Tool);
            let own = next
                .flat_map(Message::tool_results)
                .find(|r| r.call_id == call.id);
            let early = input[..index]
                .iter()
                .flat_map(Message::tool_results)
                .any(|r| r.call_id == call.id);
            if let (true, Some(own), false) = (used_once && !call.id.is_empty(), own, early) {
                let kept = history
                    .iter()
                    .flat_map(Message::tool_results)
                    .any(|r| r.content == own.content);
                prop_assert!(
                    kept,
                    "the result of {} was lost\n{}",
                    call.id,
                    show(&history)
                );
            }
        }
    }
    // Idempotent and deterministic.
    let once = history.clone();
    let second = repair_history(&mut history, unanswered);
    prop_assert!(second.is_empty(), "{:?}\n{}", second, show(&once));
    prop_assert!(
        history.ptr_eq(&once),
        "a repaired history is not copied again"
    );
    let mut again = History::from(input.clone());
    repair_history(&mut again, unanswered);
    prop_assert_eq!(&again, &once);
    // A valid input is the same `Arc`.
    if tower_agent_core::history::validate(&input, &[]).is_ok()
        && input
            .iter()
            .flat_map(Message::tool_calls)
            .all(|c| !c.id.is_empty())
    {
        let mut same = History::from(input.clone());
        let shared = same.clone();
        prop_assert!(repair_history(&mut same, unanswered).is_empty());
        prop_assert!(same.ptr_eq(&shared));
    }
    Ok(())
}

/// The agent side's repair of a session whose calls named by `waiting` wait for a decision:
/// none of them is dropped or answered, the last message holding them ends the history (its
/// calls open there), and the rest is valid and kept.
fn check_waiting(
    steps: &[Step],
    pick: usize,
    mask: &[bool],
    unanswered: Unanswered,
) -> Result<(), TestCaseError> {
    let input = build(steps);
    let blocks: Vec<&Message> = input.iter().filter(|m| m.has_tool_calls()).collect();
    let Some(block) = blocks.get(pick % blocks.len().max(1)) else {
        return Ok(());
    };
    // Calls are told apart by name (`t{i}_{k}`): ids repeat, and a reused one is renamed.
    let waiting: Vec<String> = block
        .tool_calls()
        .enumerate()
        .filter(|(k, _)| mask[k % mask.len()])
        .map(|(_, c)| c.name.clone())
        .collect();
    let wait = |c: &ToolCall| waiting.contains(&c.name);
    let how = Repair::new()
        .unanswered(unanswered)
        .keep_frontier()
        .wait(&wait)
        .keep_waiting();
    let mut history = History::from(input.clone());
    let report = history.repair(&how);
    let show = |h: &History| format!("input:\n{}output:\n{}", dump(&input), dump(h));

    for name in &waiting {
        let call = history
            .iter()
            .flat_map(Message::tool_calls)
            .find(|c| &c.name == name);
        prop_assert!(call.is_some(), "{name} was dropped\n{}", show(&history));
        let id = call.map(|c| c.id.clone()).unwrap_or_default();
        let made_up = history
            .iter()
            .flat_map(Message::tool_results)
            .any(|r| r.call_id == id && is_synthetic(r));
        prop_assert!(!made_up, "{name} was answered\n{}", show(&history));
    }
    // What is left open waits at the end; everything else is valid.
    let open: Vec<&str> = history.open_calls().iter().map(|c| c.id.as_str()).collect();
    prop_assert!(
        tower_agent_core::history::validate(&history, &open).is_ok(),
        "{}",
        show(&history)
    );
    let answered: Vec<&str> = history
        .iter()
        .flat_map(Message::tool_results)
        .map(|r| r.call_id.as_str())
        .collect();
    let at_end = history
        .iter()
        .flat_map(Message::tool_calls)
        .filter(|c| wait(c) && !answered.contains(&c.id.as_str()))
        .all(|c| open.contains(&c.id.as_str()));
    prop_assert!(
        at_end,
        "a waiting call is not at the end\n{}",
        show(&history)
    );
    // Texts are kept (the waiting message's moved to the end).
    let (mut before, mut after) = (texts(&input), texts(&history));
    before.sort();
    after.sort();
    prop_assert_eq!(after, before, "{}", show(&history));
    // Idempotent.
    let once = history.clone();
    prop_assert!(
        history.repair(&how).is_empty(),
        "{:?}\n{}",
        report,
        show(&once)
    );
    prop_assert_eq!(&history, &once);
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn repaired_histories_are_valid_and_lose_nothing(steps in prop::collection::vec(step(), 0..14)) {
        check(&steps, Unanswered::Answer)?;
    }

    #[test]
    fn dropping_unanswered_calls_keeps_the_rest(steps in prop::collection::vec(step(), 0..14)) {
        check(&steps, Unanswered::Drop)?;
    }

    #[test]
    fn calls_waiting_for_a_decision_are_never_dropped_nor_answered(
        steps in prop::collection::vec(step(), 0..14),
        pick in 0..8usize,
        mask in prop::collection::vec(prop::bool::weighted(0.6), 1..4),
        drop in any::<bool>(),
    ) {
        let unanswered = if drop { Unanswered::Drop } else { Unanswered::Answer };
        check_waiting(&steps, pick, &mask, unanswered)?;
    }
}
