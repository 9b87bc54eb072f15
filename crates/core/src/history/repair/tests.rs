//! Tests of the repair: checks, rebuilds, reports.

use std::collections::HashSet;

use super::rebuild::fresh_id;
use super::*;
use crate::History;
use crate::history::mark::tests::texts;
use crate::history::tests::{call, ids};
use crate::history::validate;

#[test]
fn a_report_names_what_changed_in_singular_or_plural() {
    let report = RepairReport {
        answered: 1,
        moved: 3,
        renamed: 2,
        ..RepairReport::default()
    };
    assert_eq!(
        report.to_string(),
        "1 call answered, 3 results moved to their call, 2 call ids renamed"
    );
    let one = RepairReport {
        moved: 1,
        orphans: 2,
        ..RepairReport::default()
    };
    assert_eq!(
        one.to_string(),
        "2 orphan results dropped, 1 result moved to its call"
    );
    assert_eq!(RepairReport::default().to_string(), "nothing");
}

/// A result of call `id` that names it.
fn answer(id: &str) -> Message {
    Message::tool_result(ToolResult::success(&call(id), format!("ok {id}")))
}

fn fix(messages: Vec<Message>) -> (History, RepairReport) {
    let mut history = History::from(messages);
    let report = history.repair(&Repair::new());
    (history, report)
}

#[test]
fn fresh_ids_skip_taken_ones() {
    let taken: HashSet<String> = ["a_2".to_owned()].into();
    assert_eq!(fresh_id("a", &taken), "a_3");
    assert_eq!(fresh_id("", &taken), "call_1");
}

#[test]
fn a_valid_history_is_the_same_arc() {
    let messages = vec![
        Message::user("go"),
        Message::assistant_with_calls("", [call("a"), call("b")]),
        answer("b"),
        answer("a"),
        Message::assistant("done"),
    ];
    let mut history = History::from(messages);
    let before = history.clone();
    assert!(history.repair(&Repair::new()).is_empty());
    assert!(history.ptr_eq(&before));
}

#[test]
fn a_result_before_its_call_is_an_orphan() {
    let (h, report) = fix(vec![
        Message::user("go"),
        answer("a"),
        Message::assistant_with_calls("", [call("a")]),
    ]);
    assert_eq!((report.orphans, report.answered), (1, 1));
    assert_eq!(h.len(), 3);
    assert_eq!(h[2].tool_results().next().map(|r| r.is_error), Some(true));
    assert_eq!(h.validate(), Ok(()));
}

#[test]
fn a_late_answer_moves_up_across_an_assistant_message() {
    let (h, report) = fix(vec![
        Message::assistant_with_calls("", [call("a")]),
        Message::assistant("thinking"),
        answer("a"),
    ]);
    assert_eq!((report.moved, report.answered, report.orphans), (1, 0, 0));
    assert_eq!(
        h[1].tool_results().next().map(|r| r.content.as_str()),
        Some("ok a")
    );
    assert_eq!(h[2].text(), "thinking");
    assert_eq!(h.len(), 3);
}

#[test]
fn reused_ids_are_matched_in_order_and_renamed() {
    let (h, report) = fix(vec![
        Message::assistant_with_calls("", [call("a")]),
        answer("a"),
        Message::assistant_with_calls("", [call("a")]),
        answer("a"),
    ]);
    assert_eq!(report.renamed, 1);
    let ids: Vec<_> = h
        .iter()
        .flat_map(Message::tool_calls)
        .map(|c| c.id.clone())
        .collect();
    assert_eq!(ids, ["a", "a_2"]);
    assert_eq!(
        h[3].tool_results().next().map(|r| r.call_id.as_str()),
        Some("a_2")
    );
    assert_eq!(h.validate(), Ok(()));
}

#[test]
fn unanswered_calls_are_answered_in_place_and_in_call_order() {
    let mut h = History::from(vec![
        Message::user("go"),
        Message::assistant_with_calls("", [call("a"), call("b"), call("c")]),
        answer("b"),
        Message::user("later"),
        Message::assistant_with_calls("", [call("d")]),
    ]);
    let answered = h
        .repair(&Repair::new().answer(&ToolResult::cancelled))
        .answered;
    assert_eq!(answered, 3);
    let shape: Vec<Vec<&str>> = h.iter().map(ids).collect();
    assert_eq!(
        shape,
        [
            vec![],
            vec!["a", "b", "c"],
            vec!["a"],
            vec!["b"],
            vec!["c"],
            vec![],
            vec!["d"],
            vec!["d"],
        ]
    );
    assert_eq!(h[3].tool_results().next().map(|r| r.is_error), Some(false));
    assert_eq!(h.validate(), Ok(()));
}

#[test]
fn calls_that_wait_stay_open_only_at_the_end() {
    let mut h = History::from(vec![
        Message::assistant_with_calls("", [call("a")]),
        Message::user("moved on"),
        Message::assistant_with_calls("", [call("b"), call("c")]),
        answer("c"),
    ]);
    // `a` cannot wait: a message follows its results. `b` can.
    let wait = |c: &ToolCall| c.id == "a" || c.id == "b";
    let how = Repair::new().wait(&wait).answer(&ToolResult::cancelled);
    let answered = h.repair(&how).answered;
    assert_eq!(answered, 1);
    assert_eq!(ids(&h[1]), ["a"]);
    assert_eq!(
        h.open_calls()
            .iter()
            .map(|c| c.id.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );
    assert_eq!(validate(&h, &["b"]), Ok(()));
}

#[test]
fn the_last_message_only_when_asked() {
    let mut h = History::from(vec![
        Message::assistant_with_calls("", [call("a")]),
        Message::user("x"),
        Message::assistant_with_calls("", [call("b")]),
        Message::user("y"),
    ]);
    let last = Repair::new().last_message_only();
    assert_eq!(h.repair(&last.answer(&ToolResult::cancelled)).answered, 1);
    assert_eq!(ids(&h[3]), ["b"], "b answered right after its message");
    assert!(h.validate().is_err(), "`a` was not looked at");
    assert_eq!(h.repair(&Repair::new()).answered, 1);
    assert_eq!(h.validate(), Ok(()));
}

#[test]
fn a_valid_history_is_not_copied() {
    let mut h = History::from(vec![
        Message::assistant_with_calls("", [call("a")]),
        answer("a"),
    ]);
    let shared = h.clone();
    assert!(h.repair(&Repair::new()).is_empty());
    h.order_results();
    assert!(h.ptr_eq(&shared), "nothing to repair: no copy");
}

#[test]
fn a_repair_keeps_the_messages_before_the_first_it_changed() {
    let mut h = texts(4);
    h.push(Message::assistant_with_calls("", [call("a")]));
    h.push(Message::user("moved on"));
    let mark = h.mark();
    assert_eq!(h.repair(&Repair::new()).answered, 1);
    assert_eq!(h.kept(&mark), 5, "the answer goes in after message 4");
    h.order_results();
    let mut waiting = History::from(vec![
        Message::assistant_with_calls("", [call("a"), call("b")]),
        answer("b"),
        answer("a"),
    ]);
    let mark = waiting.mark();
    waiting.order_results();
    assert_eq!(waiting.kept(&mark), 1);
}

/// The ids of the calls waiting at the end of `h`.
fn open(h: &History) -> Vec<&str> {
    h.open_calls().iter().map(|c| c.id.as_str()).collect()
}

#[test]
fn waiting_calls_are_kept_and_moved_to_the_end_whatever_the_policy() {
    let input = vec![
        Message::user("go"),
        Message::assistant_with_calls("", [call("a"), call("b")]),
        answer("a"),
        Message::user("still there?"),
        Message::assistant_with_calls("", [call("c")]),
        answer("c"),
        Message::assistant("meanwhile"),
    ];
    let wait = |c: &ToolCall| c.id == "b";
    for unanswered in [Unanswered::Answer, Unanswered::Drop] {
        let how = Repair::new()
            .unanswered(unanswered)
            .keep_frontier()
            .wait(&wait)
            .keep_waiting();
        let mut h = History::from(input.clone());
        let report = h.repair(&how);
        assert_eq!(
            report,
            RepairReport {
                moved_to_end: 1,
                ..RepairReport::default()
            },
            "{unanswered:?}"
        );
        assert_eq!(
            report.to_string(),
            "1 batch waiting for a decision moved to the end"
        );
        let shape: Vec<Vec<&str>> = h.iter().map(ids).collect();
        assert_eq!(
            shape,
            [
                vec![],
                vec![],
                vec!["c"],
                vec!["c"],
                vec![],
                vec!["a", "b"],
                vec!["a"]
            ],
            "{unanswered:?}"
        );
        assert_eq!(h[1].text(), "still there?");
        assert_eq!(open(&h), ["b"]);
        assert_eq!(validate(&h, &["b"]), Ok(()));
        // Idempotent: the repaired history is left as it is.
        let once = h.clone();
        assert!(h.repair(&how).is_empty());
        assert!(h.ptr_eq(&once));
    }
}

#[test]
fn a_waiting_call_at_the_end_stays_where_it_is() {
    let wait = |c: &ToolCall| c.id == "b";
    let how = Repair::new()
        .unanswered(Unanswered::Drop)
        .wait(&wait)
        .keep_waiting();
    // The orphan makes the history fail the check: it is rebuilt, and the block stays last.
    let mut h = History::from(vec![
        Message::user("go"),
        answer("z"),
        Message::assistant_with_calls("", [call("a"), call("b")]),
        answer("a"),
    ]);
    let report = h.repair(&how);
    assert_eq!((report.orphans, report.moved_to_end), (1, 0));
    assert_eq!(open(&h), ["b"]);
    assert_eq!(h.len(), 3);
}

#[test]
fn a_waiting_batch_with_text_in_its_results_keeps_the_text_before_it() {
    let wait = |c: &ToolCall| c.id == "b";
    let how = Repair::new().wait(&wait).keep_waiting();
    // A result moved up makes the block rebuilt; the text of its tool message then follows
    // the results as a user message, and the waiting block moves after it.
    let mut with_text = answer("a");
    with_text.content.push(ContentPart::Text {
        text: "note".into(),
    });
    let mut h = History::from(vec![
        Message::assistant_with_calls("", [call("a"), call("b")]),
        with_text,
        answer("a"),
    ]);
    let report = h.repair(&how);
    assert_eq!(
        (report.orphans, report.moved_to_end, report.answered),
        (1, 1, 0)
    );
    assert_eq!(h[0].text(), "note");
    assert_eq!(open(&h), ["b"]);
    assert_eq!(validate(&h, &["b"]), Ok(()));
}

#[test]
fn only_the_last_waiting_batch_can_wait_at_the_end_and_none_is_made_up() {
    // Two messages hold waiting calls (a session edited by hand): the later one waits at the
    // end; the earlier one stays open where it is, for the loop to decide.
    let wait = |c: &ToolCall| c.id == "a" || c.id == "b";
    let how = Repair::new().wait(&wait).keep_waiting();
    let mut h = History::from(vec![
        Message::assistant_with_calls("", [call("a")]),
        Message::user("x"),
        Message::assistant_with_calls("", [call("b")]),
        Message::user("y"),
    ]);
    let report = h.repair(&how);
    assert_eq!((report.answered, report.moved_to_end), (0, 1));
    let shape: Vec<Vec<&str>> = h.iter().map(ids).collect();
    assert_eq!(shape, [vec!["a"], vec![], vec![], vec!["b"]]);
    assert_eq!(open(&h), ["b"]);
    // Repairing again changes nothing more.
    let once = h.clone();
    assert!(h.repair(&how).is_empty());
    assert_eq!(h, once);
}
