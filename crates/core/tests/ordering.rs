//! Pins every row of `docs/ordering.md`: who sees the request, who sees the response, what a
//! short-circuit skips, and how "built-in first, its answer wins" comes out of the position of
//! the built-ins in a plain onion.

use std::sync::{Arc, Mutex};

use serde_json::json;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt, service_fn};
use tower_agent_core::{
    Error, Flow, ObserveLayer, RunContext, ToolCall, ToolNext, ToolRequest, ToolResponse,
    after_tool, around_tool, before_tool,
};

type Log = Arc<Mutex<Vec<String>>>;
type Svc = BoxCloneService<ToolRequest, ToolResponse, Error>;

/// A layer of a row, named by one letter.
#[derive(Clone, Copy, Debug)]
enum L {
    /// A before callback that continues.
    Before(&'static str),
    /// A before callback that answers `answer <name>`.
    Answers(&'static str),
    /// A before callback that fails.
    Fails(&'static str),
    /// An after callback that continues, appending `|<name>`.
    After(&'static str),
    /// An after callback that replaces with `replaced by <name>`.
    Replaces(&'static str),
    /// An observer.
    Observe(&'static str),
    /// An around callback that calls `next` once and returns the response untouched.
    Around(&'static str),
    /// An around callback that answers `answer <name>` without calling `next`.
    AroundAnswers(&'static str),
    /// An around callback that calls `next` twice and returns the second response.
    AroundRetries(&'static str),
    /// An around callback that turns an error into the response `rescued by <name>`.
    AroundRescues(&'static str),
}

struct Row {
    n: u32,
    /// Outer → inner.
    stack: &'static [L],
    /// Who saw the request, in order (`S` is the service).
    request: &'static [&'static str],
    /// Who saw the response, in order.
    response: &'static [&'static str],
    /// The content returned, or `None` for an error.
    result: Option<&'static str>,
    /// What the observer noticed about the response, if the row has one.
    observer_saw: Option<&'static str>,
}

use L::*;

const ROWS: &[Row] = &[
    Row {
        n: 1,
        stack: &[Before("A"), Before("B")],
        request: &["A", "B", "S"],
        response: &[],
        result: Some("S"),
        observer_saw: None,
    },
    Row {
        n: 2,
        stack: &[Answers("A"), Before("B")],
        request: &["A"],
        response: &[],
        result: Some("answer A"),
        observer_saw: None,
    },
    Row {
        n: 3,
        stack: &[Before("A"), Answers("B")],
        request: &["A", "B"],
        response: &[],
        result: Some("answer B"),
        observer_saw: None,
    },
    Row {
        n: 4,
        stack: &[After("A"), After("B")],
        request: &["S"],
        response: &["B", "A"],
        result: Some("S|B|A"),
        observer_saw: None,
    },
    Row {
        n: 5,
        stack: &[After("A"), Replaces("B")],
        request: &["S"],
        response: &["B", "A"],
        result: Some("replaced by B|A"),
        observer_saw: None,
    },
    Row {
        n: 6,
        stack: &[Replaces("A"), After("B")],
        request: &["S"],
        response: &["B", "A"],
        result: Some("replaced by A"),
        observer_saw: None,
    },
    Row {
        n: 7,
        stack: &[After("A"), Answers("B")],
        request: &["B"],
        response: &["A"],
        result: Some("answer B|A"),
        observer_saw: None,
    },
    Row {
        n: 8,
        stack: &[Answers("A"), After("B")],
        request: &["A"],
        response: &[],
        result: Some("answer A"),
        observer_saw: None,
    },
    Row {
        n: 9,
        stack: &[Observe("O"), Answers("B")],
        request: &["O", "B"],
        response: &["O"],
        result: Some("answer B"),
        observer_saw: Some("answer B"),
    },
    Row {
        n: 10,
        stack: &[Observe("O"), Replaces("A")],
        request: &["O", "S"],
        response: &["A", "O"],
        result: Some("replaced by A"),
        observer_saw: Some("replaced by A"),
    },
    Row {
        n: 11,
        stack: &[Observe("O"), After("A"), Fails("B")],
        request: &["O", "B"],
        response: &["O"],
        result: None,
        observer_saw: Some("error"),
    },
    Row {
        n: 12,
        stack: &[After("A"), Observe("O"), Replaces("B")],
        request: &["O", "S"],
        response: &["B", "O", "A"],
        result: Some("replaced by B|A"),
        observer_saw: Some("replaced by B"),
    },
    Row {
        n: 13,
        stack: &[Around("A"), Answers("B")],
        request: &["A", "B"],
        response: &["A"],
        result: Some("answer B"),
        observer_saw: None,
    },
    Row {
        n: 14,
        stack: &[Before("A"), AroundAnswers("B")],
        request: &["A", "B"],
        response: &[],
        result: Some("answer B"),
        observer_saw: None,
    },
    Row {
        n: 15,
        stack: &[Around("A"), Replaces("B")],
        request: &["A", "S"],
        response: &["B", "A"],
        result: Some("replaced by B"),
        observer_saw: None,
    },
    Row {
        n: 16,
        stack: &[After("A"), AroundRetries("B"), Before("C")],
        request: &["B", "C", "S", "C", "S"],
        response: &["B", "A"],
        result: Some("S|A"),
        observer_saw: None,
    },
    Row {
        n: 17,
        stack: &[AroundRescues("A"), Fails("B")],
        request: &["A", "B"],
        response: &["A"],
        result: Some("rescued by A"),
        observer_saw: None,
    },
    Row {
        n: 18,
        stack: &[Observe("O"), AroundAnswers("A")],
        request: &["O", "A"],
        response: &["O"],
        result: Some("answer A"),
        observer_saw: Some("answer A"),
    },
];

fn push(log: &Log, entry: String) {
    log.lock().expect("the log lock").push(entry);
}

/// Build the stack of a row around a service answering `"S"`; every layer writes to `log`:
/// `X>` when it sees a request, `X<` when it sees a response.
fn build(stack: &[L], log: &Log) -> Svc {
    let l = log.clone();
    let mut svc: Svc = BoxCloneService::new(service_fn(move |req: ToolRequest| {
        push(&l, "S>".into());
        async move { Ok::<_, Error>(ToolResponse::success(&req.call, "S")) }
    }));
    for layer in stack.iter().rev().copied() {
        let log = log.clone();
        svc = match layer {
            Before(name) => BoxCloneService::new(
                before_tool(move |req: ToolRequest| {
                    push(&log, format!("{name}>"));
                    async move { Ok(Flow::Continue(req)) }
                })
                .layer(svc),
            ),
            Answers(name) => BoxCloneService::new(
                before_tool(move |req: ToolRequest| {
                    push(&log, format!("{name}>"));
                    async move {
                        Ok(Flow::Answer(ToolResponse::success(
                            &req.call,
                            format!("answer {name}"),
                        )))
                    }
                })
                .layer(svc),
            ),
            Fails(name) => BoxCloneService::new(
                before_tool(move |_req: ToolRequest| {
                    push(&log, format!("{name}>"));
                    async move { Err(Error::other(format!("{name} failed"))) }
                })
                .layer(svc),
            ),
            After(name) => BoxCloneService::new(
                after_tool(move |mut res: ToolResponse, _ctx: RunContext| {
                    push(&log, format!("{name}<"));
                    async move {
                        res.result.content.push_str(&format!("|{name}"));
                        Ok(res)
                    }
                })
                .layer(svc),
            ),
            Replaces(name) => BoxCloneService::new(
                after_tool(move |res: ToolResponse, _ctx: RunContext| {
                    push(&log, format!("{name}<"));
                    async move {
                        let call = ToolCall::new(&res.result.call_id, &res.result.name, json!({}));
                        Ok(ToolResponse::success(&call, format!("replaced by {name}")))
                    }
                })
                .layer(svc),
            ),
            Around(name) => BoxCloneService::new(
                around_tool(move |req: ToolRequest, mut next: ToolNext| {
                    let log = log.clone();
                    async move {
                        push(&log, format!("{name}>"));
                        let res = next.run(req).await;
                        push(&log, format!("{name}<"));
                        res
                    }
                })
                .layer(svc),
            ),
            AroundAnswers(name) => BoxCloneService::new(
                around_tool(move |req: ToolRequest, _next: ToolNext| {
                    push(&log, format!("{name}>"));
                    async move { Ok(ToolResponse::success(&req.call, format!("answer {name}"))) }
                })
                .layer(svc),
            ),
            AroundRetries(name) => BoxCloneService::new(
                around_tool(move |req: ToolRequest, mut next: ToolNext| {
                    let log = log.clone();
                    async move {
                        push(&log, format!("{name}>"));
                        next.run(req.clone()).await?;
                        let res = next.run(req).await;
                        push(&log, format!("{name}<"));
                        res
                    }
                })
                .layer(svc),
            ),
            AroundRescues(name) => BoxCloneService::new(
                around_tool(move |req: ToolRequest, next: ToolNext| {
                    let log = log.clone();
                    async move {
                        push(&log, format!("{name}>"));
                        let call = req.call.clone();
                        let res = next.oneshot(req).await;
                        push(&log, format!("{name}<"));
                        res.or_else(|_| {
                            Ok(ToolResponse::success(&call, format!("rescued by {name}")))
                        })
                    }
                })
                .layer(svc),
            ),
            Observe(name) => {
                let on_req = log.clone();
                BoxCloneService::new(
                    ObserveLayer::new()
                        .on_request(move |_req: &ToolRequest| push(&on_req, format!("{name}>")))
                        .on_response(
                            move |res: Result<&ToolResponse, &Error>, _ctx: &RunContext| {
                                push(&log, format!("{name}<"));
                                let saw = match res {
                                    Ok(r) => r.result.content.clone(),
                                    Err(_) => "error".to_owned(),
                                };
                                push(&log, format!("{name} saw {saw}"));
                            },
                        )
                        .layer(svc),
                )
            }
        };
    }
    svc
}

fn call() -> ToolRequest {
    ToolRequest::new(ToolCall::new("c1", "t", json!({})), RunContext::new())
}

#[test]
fn the_documented_rows_are_the_tested_rows() {
    let doc = include_str!("../../../docs/ordering.md");
    let documented: Vec<u32> = doc
        .lines()
        .filter_map(|line| line.strip_prefix("| "))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect();
    let tested: Vec<u32> = ROWS.iter().map(|row| row.n).collect();
    assert_eq!(
        documented, tested,
        "docs/ordering.md and ROWS list the same rows"
    );
}

#[tokio::test]
async fn every_row_of_the_onion_table() {
    for row in ROWS {
        let log: Log = Arc::default();
        let result = build(row.stack, &log).oneshot(call()).await;
        let trace = log.lock().unwrap().clone();
        let seen = |suffix: char| -> Vec<String> {
            trace
                .iter()
                .filter_map(|e| e.strip_suffix(suffix).map(str::to_owned))
                .collect()
        };
        assert_eq!(
            seen('>'),
            row.request,
            "row {}: request order ({trace:?})",
            row.n
        );
        assert_eq!(
            seen('<'),
            row.response,
            "row {}: response order ({trace:?})",
            row.n
        );
        match (row.result, &result) {
            (Some(expected), Ok(res)) => {
                assert_eq!(res.result.content, expected, "row {}: result", row.n)
            }
            (None, Err(_)) => {}
            (expected, got) => panic!("row {}: expected {expected:?}, got {got:?}", row.n),
        }
        let saw: Vec<&String> = trace.iter().filter(|e| e.contains(" saw ")).collect();
        match row.observer_saw {
            Some(expected) => {
                assert_eq!(saw.len(), 1, "row {}: observer ran once ({trace:?})", row.n);
                assert!(
                    saw[0].ends_with(expected),
                    "row {}: observer saw {saw:?}",
                    row.n
                );
            }
            None => assert!(saw.is_empty(), "row {}", row.n),
        }
    }
}

/// The canonical order of `docs/ordering.md`: observer, the built-ins (after, then before),
/// the user's callbacks (after, then before), service. The built-ins are outside: their
/// answer short-circuits the user's callbacks, and their replacement is the last word.
fn canonical(
    builtin_before_answers: bool,
    user_before_answers: bool,
    builtin_after_replaces: bool,
    log: &Log,
) -> Svc {
    let mut stack = vec![Observe("O")];
    stack.push(if builtin_after_replaces {
        Replaces("builtin_after")
    } else {
        After("builtin_after")
    });
    stack.push(if builtin_before_answers {
        Answers("builtin_before")
    } else {
        Before("builtin_before")
    });
    stack.push(After("user_after"));
    stack.push(if user_before_answers {
        Answers("user_before")
    } else {
        Before("user_before")
    });
    build(&stack, log)
}

#[tokio::test]
async fn builtin_first_its_answer_wins() {
    // (builtin before answers, user before answers, builtin after replaces) -> trace, result
    type Case = ((bool, bool, bool), &'static [&'static str], &'static str);
    let cases: &[Case] = &[
        (
            (false, false, false),
            &[
                "O>",
                "builtin_before>",
                "user_before>",
                "S>",
                "user_after<",
                "builtin_after<",
                "O<",
            ],
            "S|user_after|builtin_after",
        ),
        (
            (true, false, false),
            &["O>", "builtin_before>", "builtin_after<", "O<"],
            "answer builtin_before|builtin_after",
        ),
        (
            (false, true, false),
            &[
                "O>",
                "builtin_before>",
                "user_before>",
                "user_after<",
                "builtin_after<",
                "O<",
            ],
            "answer user_before|user_after|builtin_after",
        ),
        (
            (false, false, true),
            &[
                "O>",
                "builtin_before>",
                "user_before>",
                "S>",
                "user_after<",
                "builtin_after<",
                "O<",
            ],
            "replaced by builtin_after",
        ),
    ];
    for ((bb, ub, ba), trace, result) in cases {
        let log: Log = Arc::default();
        let res = canonical(*bb, *ub, *ba, &log)
            .oneshot(call())
            .await
            .unwrap();
        let got: Vec<String> = log
            .lock()
            .unwrap()
            .iter()
            .filter(|e| !e.contains(" saw "))
            .cloned()
            .collect();
        assert_eq!(&got, trace, "case {:?}", (bb, ub, ba));
        assert_eq!(res.result.content, *result, "case {:?}", (bb, ub, ba));
    }
}
