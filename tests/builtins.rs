//! The agent that places its built-ins: the canonical order, pinned by what each of the
//! host's layers sees from its named place, and the full stack in one run.

use std::sync::{Arc, Mutex};
use tower_agent::GenerationOptions;
use tower_agent::ModelNext;
use tower_agent::layers::PatchDanglingLayer;
use tower_agent::layers::RetryLayer;
use tower_agent::sessions::StoreLayer;

use serde_json::json;
use tower_agent::layers::approval::{ApprovalLayer, Gate};
use tower_agent::layers::evict::{EvictLayer, READ_TOOL};
use tower_agent::layers::instructions::InstructionsLayer;
use tower_agent::layers::limits::{CallLimitsLayer, Limit};
use tower_agent::layers::memory::MemoryLayer;
use tower_agent::layers::retry::RetryPolicy;
use tower_agent::layers::summarize::{Keep, SummarizeLayer, Trigger, is_summary};
use tower_agent::prelude::*;
use tower_agent::storage::{InMemory, Storage, StoragePath};
use tower_agent_test::{ScriptedModel, StubTool, assert_valid_history};

type Log = Arc<Mutex<Vec<String>>>;

fn push(log: &Log, line: String) {
    log.lock().expect("the log").push(line);
}

#[test]
fn the_canonical_order() {
    let every = Agent::builder()
        .with(StoreLayer::new(
            tower_agent::sessions::InMemorySessions::new(),
        ))
        .with(MemoryLayer::new())
        .with(PatchDanglingLayer::new())
        .with(CallLimitsLayer::new())
        .with(InstructionsLayer::new())
        .with(tower_agent::layers::select::ToolSelectLayer::by(|_| {
            Vec::new()
        }))
        .with(SummarizeLayer::new(ScriptedModel::new([])))
        .with(tower_agent::layers::clear::ClearToolResultsLayer::new())
        .with(tower_agent::layers::budget::BudgetLayer::new(
            tower_agent::ModelPrice::per_million(1.0, 0.1, 2.0),
        ))
        .with(RetryLayer::new(RetryPolicy::new()))
        .with(tower_agent::layers::fallback::FallbackLayer::new())
        .with(tower_agent::layers::redact::RedactLayer::new(
            tower_agent::layers::redact::Rules::new().emails(),
        ))
        .with(tower_agent::layers::guardrail::GuardrailLayer::new())
        .with(tower_agent::layers::ToolGuardLayer::new(|_, _| async {
            tower_agent::layers::tool_guard::ToolVerdict::Allow
        }))
        .with(ApprovalLayer::builder().build().expect("valid"))
        .with(tower_agent::layers::checkpoint::CheckpointLayer::interrupting().every(10))
        .with(EvictLayer::new(InMemory::new()))
        .agent_layer(tower::layer::util::Identity::new())
        .model_layer(tower::layer::util::Identity::new())
        .provider_layer(tower::layer::util::Identity::new())
        .tool_layer(tower::layer::util::Identity::new());
    #[cfg(feature = "structured")]
    let every = every.with(tower_agent::layers::structured::StructuredLayer::new());
    #[cfg(feature = "cache")]
    let every = every.with(tower_agent::layers::cache::ToolCacheLayer::new());
    let [(_, agent), (_, model), (_, tools)] = every.order();
    assert_eq!(
        agent,
        [
            "store",
            "patch",
            "redact",
            "guardrail",
            "memory",
            "agent_layer",
            "loop"
        ]
    );
    assert_eq!(
        model,
        [
            "redact",
            "guardrail",
            "limits",
            "memory",
            "instructions",
            "select",
            "summarize",
            "clear",
            "model_layer",
            "patch",
            #[cfg(feature = "structured")]
            "structured",
            "budget",
            "fallback",
            "retry",
            "provider_layer",
            "provider"
        ]
    );
    assert_eq!(
        tools,
        [
            "evict",
            "redact",
            "guardrail",
            "limits",
            "tool_guard",
            "checkpoint",
            "approval",
            #[cfg(feature = "cache")]
            "cache",
            "tool_layer",
            "tools"
        ]
    );
    // The guide's picture is this order, with every slot (`--features full`).
    if !cfg!(all(feature = "structured", feature = "cache")) {
        return;
    }
    let guide = include_str!("../docs/ordering.md");
    for (stack, slots) in every.order() {
        let line = format!("{stack}: {}", slots.join(" → "));
        assert!(guide.contains(&line), "docs/ordering.md shows `{line}`");
    }
}

#[tokio::test]
async fn each_place_sees_what_its_slot_promises() {
    let log: Log = Arc::default();
    let storage = InMemory::new();
    storage
        .put(
            &StoragePath::parse("/memories/AGENTS.md").expect("a path"),
            "Prefer metric units.".into(),
        )
        .await
        .expect("stored");
    let memory = MemoryLayer::from_storage(storage, ["/memories/AGENTS.md"]);

    // Round 1: a large result and a call the approval rejects; then a rate limit, then the
    // answer.
    let model = ScriptedModel::with_results([
        Ok(ModelResponse::tool_calls([
            ToolCall::new("c1", "fetch", json!({})),
            ToolCall::new("c2", "rm", json!({"path": "/"})),
        ])),
        Err(Error::rate_limited(
            Some(std::time::Duration::ZERO),
            "slow down",
        )),
        Ok(ModelResponse::text("done")),
    ]);
    let tools = ToolSet::new()
        .tool(StubTool::returning("fetch", "row\n".repeat(20_000)))
        .tool(StubTool::returning("rm", "removed"));
    let approval = ApprovalLayer::builder()
        .gate("rm", Gate::new())
        .inline(tower_agent::layers::approval::human_fn(
            |_review, _ctx| async { Ok(Decision::reject("not today")) },
        ))
        .build()
        .expect("valid");

    let (m, p, t) = (log.clone(), log.clone(), log.clone());
    let agent = Agent::builder()
        .system("You help.")
        .with(memory)
        .with(PatchDanglingLayer::new())
        .with(InstructionsLayer::new().text("Answer briefly."))
        .with(RetryLayer::new(RetryPolicy::new().max_attempts(3)))
        .with(approval)
        .with(EvictLayer::new(InMemory::new()).limit(1_000))
        .model_layer(around_model(
            move |req: ModelRequest, mut next: ModelNext| {
                let system = req.system.as_deref().unwrap_or_default().to_owned();
                push(
                    &m,
                    format!("model_layer: {}", system.replace("\n\n", " | ")),
                );
                async move { next.run(req).await }
            },
        ))
        .provider_layer(around_model(
            move |req: ModelRequest, mut next: ModelNext| {
                push(&p, format!("provider_layer: round {}", req.ctx.round()));
                async move { next.run(req).await }
            },
        ))
        .tool_layer(after_tool(move |res: ToolResponse, _ctx: RunContext| {
            push(
                &t,
                format!(
                    "tool_layer: {} ({} bytes)",
                    res.result.name,
                    res.result.content.len()
                ),
            );
            async move { Ok(res) }
        }))
        .build(model.clone(), tools);

    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "Fetch it."))
        .await
        .expect("the run completes");
    assert_eq!(res.text().as_deref(), Some("done"));
    assert_valid_history(&res.session.history);

    let log = log.lock().expect("the log").clone();
    const SYSTEM: &str = "model_layer: You help. | <memory path=\"/memories/AGENTS.md\">\nPrefer \
                          metric units.\n</memory> | Answer briefly.";
    assert_eq!(
        log,
        [
            // Inside memory and instructions: the final system prompt.
            SYSTEM,
            "provider_layer: round 1",
            // Inside the approval: the rejected call never reaches it; inside eviction: the
            // tool's own result.
            "tool_layer: fetch (80000 bytes)",
            // Inside the retry: each attempt; outside it: one call.
            SYSTEM,
            "provider_layer: round 2",
            "provider_layer: round 2",
        ],
        "{log:#?}"
    );
    // What the model saw: its tools and the read tool, the preview, the rejection.
    let offered: Vec<String> = model.requests()[0]
        .tools
        .iter()
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(offered, ["fetch", "rm", READ_TOOL]);
    let results: Vec<&ToolResult> = res
        .session
        .history
        .iter()
        .flat_map(|m| m.tool_results())
        .collect();
    assert!(
        results[0].content.contains("saved whole to"),
        "{}",
        results[0].content
    );
    assert!(
        results[1].content.contains("not today"),
        "{}",
        results[1].content
    );
}

#[tokio::test]
async fn the_full_stack_in_a_dozen_lines() {
    let model = ScriptedModel::from_fn(|req| {
        let n = req.ctx.round();
        Ok(ModelResponse::tool_calls([ToolCall::new(
            format!("c{n}"),
            "look",
            json!({}),
        )]))
    });
    let summarizer = ScriptedModel::from_fn(|_| Ok(ModelResponse::text("the gist")));
    let tools = ToolSet::new().tool(StubTool::returning("look", "a long view\n".repeat(50)));

    // The host app: every built-in, one line each.
    let agent = Agent::builder()
        .with(MemoryLayer::new())
        .with(PatchDanglingLayer::new())
        .with(CallLimitsLayer::new().model_calls(Limit::per_run(6)))
        .with(ApprovalLayer::builder().build().expect("valid"))
        .with(EvictLayer::new(InMemory::new()))
        .with(
            SummarizeLayer::new(summarizer)
                .trigger(Trigger::messages(6))
                .keep(Keep::messages(2)),
        )
        .with(RetryLayer::new(RetryPolicy::new()))
        .build(model, tools);

    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "Look around."))
        .await
        .expect("the run ends");
    assert!(
        matches!(
            &res.outcome,
            Outcome::Stopped {
                reason: StopReason::Limit { .. },
                ..
            }
        ),
        "{:?}",
        res.outcome
    );
    assert!(is_summary(&res.session.history[0]), "summarized on the way");
    assert_valid_history(&res.session.history);
}

#[tokio::test(start_paused = true)]
async fn each_model_of_the_fallback_chain_gets_the_retry_and_the_provider_layers() {
    use tower_agent::layers::fallback::FallbackLayer;
    let primary = ScriptedModel::from_fn(|_| Err(Error::new(ErrorKind::Server, "down")));
    let backup = ScriptedModel::with_results([
        Err(Error::new(ErrorKind::Server, "a blip")),
        Ok(ModelResponse::text("from the backup")),
    ]);
    let seen: Log = Arc::default();
    let record = Arc::clone(&seen);
    let agent = Agent::builder()
        .with(RetryLayer::new(
            RetryPolicy::new()
                .max_attempts(2)
                .base(std::time::Duration::from_millis(10))
                .throttle(None),
        ))
        .with(FallbackLayer::new().to("backup", backup.clone()))
        .provider_layer(before_model(move |req: ModelRequest| {
            let record = Arc::clone(&record);
            async move {
                record
                    .lock()
                    .expect("not poisoned")
                    .push("provider_layer".into());
                Ok(Flow::Continue(req))
            }
        }))
        .build(primary.clone(), ToolSet::new());
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "hi"))
        .await
        .expect("the backup answers");
    assert_eq!(res.text().as_deref(), Some("from the backup"));
    // Two attempts of each model, each through the provider layer.
    assert_eq!((primary.request_count(), backup.request_count()), (2, 2));
    assert_eq!(seen.lock().expect("not poisoned").len(), 4);
}

/// The loop's settings and the host slots go anywhere in the chain: before the built-ins,
/// between them, after them (a first build of `Agent::builder().with(PatchDanglingLayer::new()).system(..)` used to
/// fail to compile, and a host slot needed a built-in before it).
#[tokio::test]
async fn the_builder_takes_its_settings_in_any_order() {
    let seen: Log = Arc::default();
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let provider_layer = {
        let seen = Arc::clone(&seen);
        tower::layer::layer_fn(move |inner: tower_agent::BoxModel| {
            let seen = Arc::clone(&seen);
            tower::service_fn(move |req: ModelRequest| {
                push(&seen, format!("provider: {:?}", req.options.max_tokens));
                inner.clone().oneshot(req)
            })
        })
    };
    // A host slot first, then a built-in, then the loop's settings.
    let agent = Agent::builder()
        .provider_layer(provider_layer)
        .with(PatchDanglingLayer::new())
        .system("Be brief.")
        .max_rounds(3)
        .options(GenerationOptions::new().max_tokens(64))
        .name("desk")
        .build(model.clone(), ToolSet::new());
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "hi"))
        .await
        .expect("the run");
    assert_eq!(res.text().as_deref(), Some("ok"));
    let request = &model.requests()[0];
    assert_eq!(request.system.as_deref(), Some("Be brief."));
    assert_eq!(request.options.max_tokens, Some(64));
    assert_eq!(*seen.lock().expect("lock"), ["provider: Some(64)"]);
}

/// The picture of the canonical stack in `docs/ordering.md` is written from the slot lists:
/// reordering a list (or adding a slot) fails here until the guide shows it, and
/// `UPDATE_DOCS=1 cargo test --features full --test builtins` writes it there (nobody copies it by hand).
#[test]
fn the_ordering_guide_is_written_from_the_slot_lists() {
    use tower_agent::stack::{AgentSlot, ModelSlot, ToolSlot};
    fn line(
        stack: &str,
        names: impl Iterator<Item = &'static str>,
        innermost: &'static str,
    ) -> String {
        let names: Vec<&str> = names.chain([innermost]).collect();
        format!("{stack}: {}", names.join(" → "))
    }
    let picture = [
        line(
            "agent",
            AgentSlot::ALL.iter().map(|slot| slot.name()),
            AgentSlot::INNERMOST,
        ),
        line(
            "model",
            ModelSlot::ALL.iter().map(|slot| slot.name()),
            ModelSlot::INNERMOST,
        ),
        line(
            "tools",
            ToolSlot::ALL.iter().map(|slot| slot.name()),
            ToolSlot::INNERMOST,
        ),
    ]
    .join("\n");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/ordering.md");
    let guide = std::fs::read_to_string(path).expect("the guide");
    let block = format!("```text\n{picture}\n```");
    if guide.contains(&block) {
        return;
    }
    let start = guide.find("```text\nagent: ").expect("the guide's picture");
    let end = start + 3 + guide[start + 3..].find("```").expect("its end") + 3;
    if std::env::var("UPDATE_DOCS").is_ok_and(|v| v == "1") {
        let written = format!("{}{block}{}", &guide[..start], &guide[end..]);
        std::fs::write(path, written).expect("the guide written");
        return;
    }
    panic!(
        "docs/ordering.md shows\n{}\nwhere the slot lists say\n{block}\n\
         (UPDATE_DOCS=1 cargo test --features full --test builtins writes it)",
        &guide[start..end]
    );
}

/// A tool stack boxed by tower does not describe itself; given with its specs
/// (`BoxTools::with_specs`), the builder takes it, offers its tools and routes calls to it.
#[tokio::test]
async fn a_tool_stack_boxed_by_tower_is_taken_with_its_specs() {
    let tools = ToolSet::new().tool(StubTool::returning("clock", "12:00"));
    let specs = tools.specs().to_vec();
    let boxed = tower::util::BoxCloneSyncService::new(tools);
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "clock", json!({}))]),
        ModelResponse::text("It is noon."),
    ]);
    let agent = Agent::builder()
        .with(PatchDanglingLayer::new())
        .build(model.clone(), BoxTools::with_specs(boxed, specs));
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "What time is it?"))
        .await
        .expect("a run");
    assert_eq!(res.text().as_deref(), Some("It is noon."));
    assert_eq!(model.requests()[0].tools[0].name, "clock");
    let result = res.session.history[2]
        .tool_results()
        .next()
        .expect("a result");
    assert_eq!((result.content.as_str(), result.is_error), ("12:00", false));
}
