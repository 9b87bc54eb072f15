//! Property test of summarization: random valid histories (parallel batches of up to ten
//! calls, reasoning, long arguments, an earlier summary), random triggers, keeps, argument
//! truncation and overflows. What the model gets is always a valid history; when it was
//! shortened, it is one summary followed by an unchanged suffix of the original, and it is
//! what was committed.
//!
//! 2,000 cases by default; `PROPTEST_CASES=n` changes it.

#![cfg(feature = "summarize")]

use proptest::prelude::*;
use serde_json::json;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent_core::history::validate;
use tower_agent_core::{
    ContentPart, Error, ErrorKind, Message, ModelRequest, ModelResponse, Role, RunContext,
    ToolCall, ToolResult,
};
use tower_agent_layers::summarize::{Keep, SummarizeLayer, Trigger, summary_message, summary_text};
use tower_agent_test::{ScriptedModel, dump};

#[derive(Debug, Clone)]
enum Block {
    User(usize),
    Assistant(usize),
    /// An assistant message with `calls` calls (arguments of the given lengths), reasoning
    /// first or not, and their results in order.
    Calls {
        args: Vec<usize>,
        reasoning: bool,
    },
}

fn block() -> impl Strategy<Value = Block> {
    prop_oneof![
        2 => (0..400usize).prop_map(Block::User),
        1 => (0..400usize).prop_map(Block::Assistant),
        3 => (prop::collection::vec(0..2_000usize, 1..=10), any::<bool>())
            .prop_map(|(args, reasoning)| Block::Calls { args, reasoning }),
    ]
}

fn history(blocks: &[Block], summary_first: bool) -> Vec<Message> {
    let mut out = Vec::new();
    if summary_first {
        out.push(summary_message("what happened before"));
    }
    let mut next = 0;
    for block in blocks {
        match block {
            Block::User(n) => out.push(Message::user("u".repeat(*n))),
            Block::Assistant(n) => out.push(Message::assistant("a".repeat(*n))),
            Block::Calls { args, reasoning } => {
                let calls: Vec<ToolCall> = args
                    .iter()
                    .map(|n| {
                        next += 1;
                        ToolCall::new(format!("c{next}"), "write", json!({"text": "w".repeat(*n)}))
                    })
                    .collect();
                let mut message = Message::assistant_with_calls("", calls.clone());
                if *reasoning {
                    message.content.insert(
                        0,
                        ContentPart::Reasoning {
                            text: "thinking".into(),
                            signature: Some("sig".into()),
                        },
                    );
                }
                out.push(message);
                out.extend(
                    calls
                        .iter()
                        .map(|c| Message::tool_result(ToolResult::success(c, "done"))),
                );
            }
        }
    }
    out
}

#[derive(Debug, Clone)]
struct Setup {
    trigger: Trigger,
    keep: Keep,
    truncate: Option<usize>,
    overflow: bool,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop_oneof![
            (1..40usize).prop_map(Trigger::messages),
            (1..5_000usize).prop_map(Trigger::tokens),
        ],
        prop_oneof![
            (0..30usize).prop_map(Keep::messages),
            (0..3_000usize).prop_map(Keep::tokens),
        ],
        prop::option::of(1..500usize),
        any::<bool>(),
    )
        .prop_map(|(trigger, keep, truncate, overflow)| Setup {
            trigger,
            keep,
            truncate,
            overflow,
        })
}

fn check(messages: Vec<Message>, setup: Setup) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    runtime.block_on(async move {
        let mut script = Vec::new();
        if setup.overflow {
            script.push(Err(Error::new(ErrorKind::ContextTooLong, "too long")));
        }
        script.push(Ok(ModelResponse::text("ok")));
        let model = ScriptedModel::with_results(script);
        let mut n = 0;
        let summarizer = ScriptedModel::from_fn(move |_| {
            n += 1;
            Ok(ModelResponse::text(format!("a summary {n}")))
        });
        let mut layer = SummarizeLayer::new(summarizer)
            .trigger(setup.trigger)
            .keep(setup.keep);
        if let Some(max) = setup.truncate {
            layer = layer.truncate_arguments(max);
        }
        let mut service = ServiceBuilder::new().layer(layer).service(model.clone());
        let mut req = ModelRequest::new(messages.clone());
        req.ctx = RunContext::new();
        let result = service
            .ready()
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?
            .call(req)
            .await;
        let committed = match &result {
            Ok(res) => res.history.clone(),
            Err(error) => error.history().cloned(),
        };
        let requests = model.requests();
        // Each request is compared with the one before it (a truncation commits changed
        // arguments that a later summary then keeps).
        let mut before = messages.clone();
        for seen in &requests {
            let seen = seen.messages.as_slice();
            prop_assert!(
                validate(seen, &[]).is_ok(),
                "invalid history sent:\n{}",
                dump(seen)
            );
            let summarized = seen
                .first()
                .and_then(summary_text)
                .is_some_and(|text| text.starts_with("a summary"))
                && seen.first() != before.first();
            // The last step of a recovery drops the summary.
            let dropped = before.first().is_some_and(|m| summary_text(m).is_some())
                && seen.len() + 1 == before.len()
                && seen == &before[1..];
            if dropped {
                before = seen.to_vec();
                continue;
            }
            if !summarized {
                prop_assert_eq!(seen.len(), before.len());
                // Unchanged, or arguments truncated in place: the same shape.
                for (a, b) in seen.iter().zip(&before) {
                    prop_assert_eq!(a.role, b.role);
                    prop_assert_eq!(a.content.len(), b.content.len());
                }
            } else {
                let kept = &seen[1..];
                prop_assert!(kept.len() < before.len());
                prop_assert_eq!(kept, &before[before.len() - kept.len()..]);
                prop_assert!(kept.first().is_none_or(|m| m.role != Role::Tool));
            }
            before = seen.to_vec();
        }
        let last = requests.last().map(|r| r.messages.clone());
        match (&committed, &last) {
            (Some(committed), Some(last)) => prop_assert_eq!(committed, last),
            (None, Some(last)) => prop_assert_eq!(last.as_slice(), messages.as_slice()),
            _ => {}
        }
        if let Err(error) = result {
            // Only an overflow that nothing could shorten (or a second one) is returned.
            prop_assert_eq!(error.kind(), ErrorKind::ContextTooLong);
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(2_000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn summarization_never_yields_an_invalid_history(
        blocks in prop::collection::vec(block(), 0..25),
        summary_first in prop::bool::weighted(0.2),
        setup in setup(),
    ) {
        check(history(&blocks, summary_first), setup)?;
    }
}

/// Counted as the layer estimates: the messages of a request.
fn size(messages: &[Message]) -> usize {
    use tower_agent_layers::tokens::{CharEstimate, TokenCounter};
    messages.iter().map(|m| CharEstimate.count_message(m)).sum()
}

/// A model whose context window holds `window` estimated tokens.
fn windowed(window: usize) -> ScriptedModel {
    ScriptedModel::from_fn(move |req: &ModelRequest| {
        let tokens = size(&req.messages);
        if tokens > window {
            return Err(Error::new(
                ErrorKind::ContextTooLong,
                format!("{tokens} > {window}"),
            ));
        }
        Ok(ModelResponse::text("ok"))
    })
}

/// One turn of the layer over a model with `window`, a summarizer that writes up to
/// `summary` characters (stopping at its `max_tokens`, as a server does): it completes, or
/// fails with the error that says what does not fit, and never sends a request twice.
async fn turn(
    messages: Vec<Message>,
    state: serde_json::Map<String, serde_json::Value>,
    window: usize,
    keep: usize,
    summary: usize,
) -> Result<(Result<ModelResponse, Error>, RunContext, Vec<Message>), TestCaseError> {
    let model = windowed(window);
    let summarizer = ScriptedModel::from_fn(move |req: &ModelRequest| {
        let most = req
            .options
            .max_tokens
            .map_or(usize::MAX, |n| n as usize * 4);
        Ok(ModelResponse::text("s".repeat(summary.min(most).max(1))))
    });
    let layer = SummarizeLayer::new(summarizer)
        .trigger(Trigger::messages(1_000))
        .keep(Keep::messages(keep));
    let mut service = ServiceBuilder::new().layer(layer).service(model.clone());
    let mut req = ModelRequest::new(messages.clone());
    req.ctx = RunContext::new();
    req.ctx.absorb_state(state);
    let ctx = req.ctx.clone();
    let result = service
        .ready()
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?
        .call(req)
        .await;
    let sizes: Vec<usize> = model.requests().iter().map(|r| size(&r.messages)).collect();
    prop_assert!(
        sizes.windows(2).all(|w| w[1] < w[0]),
        "a request sent twice, or grown: {:?}",
        sizes
    );
    if let Err(error) = &result {
        prop_assert_eq!(error.kind(), ErrorKind::ContextTooLong);
        prop_assert!(
            error
                .message()
                .starts_with("the request does not fit the model's context window"),
            "{}",
            error
        );
    }
    let committed = match &result {
        Ok(res) => res.history.clone(),
        Err(error) => error.history().cloned(),
    };
    let history = committed.map_or(messages, |history| history.to_vec());
    Ok((result, ctx, history))
}

fn converge(
    messages: Vec<Message>,
    window: usize,
    keep: usize,
    summary: usize,
) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    runtime.block_on(async move {
        let (_, ctx, mut history) =
            turn(messages, Default::default(), window, keep, summary).await?;
        prop_assert!(validate(&history, &[]).is_ok(), "{}", dump(&history));
        // A later turn with a new short question fits: the session is never left failing
        // the same way on every turn.
        history.push(Message::user("next?"));
        let (result, _, _) = turn(history, ctx.state_snapshot(), window, keep, summary).await?;
        prop_assert!(result.is_ok(), "the later turn failed: {:?}", result.err());
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(1_000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn overflow_recovery_converges_for_any_window_and_history(
        blocks in prop::collection::vec(block(), 0..25),
        summary_first in prop::bool::weighted(0.2),
        // From a summary and a short question up: a smaller window holds no conversation.
        window in 64..6_000usize,
        keep in 0..30usize,
        summary in 1..20_000usize,
    ) {
        converge(history(&blocks, summary_first), window, keep, summary)?;
    }
}

/// How one batch of a valid history is broken: some of its results never came, or its last
/// result came after the next message.
#[cfg(feature = "patch")]
#[derive(Debug, Clone)]
enum Break {
    Missing(Vec<bool>),
    Apart,
}

/// `messages` with the batch `pick` (modulo their number) broken as `how` says; `None` when
/// there is no batch.
#[cfg(feature = "patch")]
fn broken(mut messages: Vec<Message>, pick: usize, how: &Break) -> Option<Vec<Message>> {
    let batches: Vec<usize> = (0..messages.len())
        .filter(|&i| messages[i].has_tool_calls())
        .collect();
    let at = *batches.get(pick % batches.len().max(1))?;
    let results = messages[at + 1..]
        .iter()
        .take_while(|m| m.role == Role::Tool)
        .count();
    match how {
        Break::Missing(mask) => {
            let mut k = 0;
            messages.retain(|_| {
                k += 1;
                let i = k - 1;
                !(i > at && i <= at + results && !mask[(i - at - 1) % mask.len()])
            });
        }
        Break::Apart => {
            let last = messages.remove(at + results);
            let next = at + results;
            if next < messages.len() {
                messages.insert(next + 1, last);
            }
        }
    }
    Some(messages)
}

/// Every batch of `input` (its message and its results, wherever they stand) that has a
/// message in `kept` has them all there.
#[cfg(feature = "patch")]
fn batches_whole(input: &[Message], kept: &[Message]) -> bool {
    let ids_of = |m: &Message| -> Vec<String> {
        m.tool_calls()
            .map(|c| c.id.clone())
            .chain(m.tool_results().map(|r| r.call_id.clone()))
            .collect()
    };
    input.iter().filter(|m| m.has_tool_calls()).all(|calls| {
        let ids: Vec<String> = calls.tool_calls().map(|c| c.id.clone()).collect();
        let of = |m: &&Message| ids_of(m).iter().any(|id| ids.contains(id));
        let (all, held) = (
            input.iter().filter(of).count(),
            kept.iter().filter(of).count(),
        );
        held == 0 || held == all
    })
}

/// A history with one batch broken, summarized by the layer alone and with the patch inside:
/// what it commits is a summary and a valid suffix holding each batch whole or not at all; no
/// warning tells to reorder the layers; with the patch inside, the model gets a valid history.
#[cfg(feature = "patch")]
fn check_broken(
    messages: Vec<Message>,
    trigger: Trigger,
    keep: Keep,
    patch: bool,
) -> Result<(), TestCaseError> {
    use tower_agent_layers::PatchDanglingLayer;
    use tower_agent_test::EventRecorder;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    runtime.block_on(async move {
        let model = ScriptedModel::from_fn(|_| Ok(ModelResponse::text("ok")));
        let summarizer = ScriptedModel::from_fn(|_| Ok(ModelResponse::text("a summary")));
        let layer = SummarizeLayer::new(summarizer).trigger(trigger).keep(keep);
        let recorder = EventRecorder::new();
        let mut req = ModelRequest::new(messages.clone());
        req.ctx = RunContext::new().with_observer(recorder.clone());
        let result = if patch {
            ServiceBuilder::new()
                .layer(layer)
                .layer(PatchDanglingLayer::new())
                .service(model.clone())
                .oneshot(req)
                .await
        } else {
            ServiceBuilder::new()
                .layer(layer)
                .service(model.clone())
                .oneshot(req)
                .await
        };
        let response = result.map_err(|e| TestCaseError::fail(e.to_string()))?;
        if let Some(committed) = &response.history {
            prop_assert!(
                committed
                    .first()
                    .is_some_and(|m| summary_text(m) == Some("a summary")),
                "{}",
                dump(committed)
            );
            let kept = &committed[1..];
            prop_assert_eq!(kept, &messages[messages.len() - kept.len()..]);
            let pending: Vec<&str> = match kept.iter().rev().find(|m| m.role != Role::Tool) {
                Some(last) if last.role == Role::Assistant => {
                    last.tool_calls().map(|c| c.id.as_str()).collect()
                }
                _ => Vec::new(),
            };
            prop_assert!(
                validate(kept, &pending).is_ok(),
                "an invalid kept part:\n{}",
                dump(committed)
            );
            prop_assert!(
                batches_whole(&messages, kept),
                "a batch cut apart:\ninput:\n{}committed:\n{}",
                dump(&messages),
                dump(committed)
            );
        }
        for event in recorder.events() {
            if let tower_agent_core::Event::Warning { message, .. } = event {
                prop_assert!(!message.contains("patch layer"), "{}", message);
            }
        }
        if patch {
            for seen in model.requests() {
                prop_assert!(
                    validate(&seen.messages, &[]).is_ok(),
                    "invalid history sent:\n{}",
                    dump(&seen.messages)
                );
            }
        }
        Ok(())
    })
}

#[cfg(feature = "patch")]
fn break_how() -> impl Strategy<Value = Break> {
    prop_oneof![
        prop::collection::vec(any::<bool>(), 1..4).prop_map(Break::Missing),
        Just(Break::Apart),
    ]
}

#[cfg(feature = "patch")]
proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(1_000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_partly_answered_batch_is_summarized_or_kept_whole(
        blocks in prop::collection::vec(block(), 1..25),
        summary_first in prop::bool::weighted(0.2),
        pick in 0..10usize,
        how in break_how(),
        trigger in (1..40usize).prop_map(Trigger::messages),
        keep in (0..30usize).prop_map(Keep::messages),
        patch in any::<bool>(),
    ) {
        if let Some(messages) = broken(history(&blocks, summary_first), pick, &how) {
            check_broken(messages, trigger, keep, patch)?;
        }
    }
}
