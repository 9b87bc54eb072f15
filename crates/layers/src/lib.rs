//! Built-in layers of tower-agent: one module, one cargo feature and one `FooLayer`/`Foo<S>`
//! pair per layer, the way tower-http is laid out.
//!
//! | module | feature | acts at | what it does |
//! |---|---|---|---|
//! | [`patch`] | `patch` | agent and model (`before_*`) | every tool call answered exactly once, right after its message; orphans dropped |
//! | [`instructions`] | `instructions` | model (`before_model`) | instruction blocks appended to the system prompt |
//! | [`memory`] | `memory` | agent (loads) and model (shows) | memory files (`AGENTS.md`, ...) loaded once per run |
//! | [`approval`] | `approval` | tool (`before_tool`) | human approval of gated calls: inline, or interrupt and resume |
//! | [`limits`] | `limits` | model and tool (`before_*`) | model-call and tool-call limits per run and per session, global or per tool |
//! | [`checkpoint`] | `checkpoint` | tool (`before_tool`) | after every N tool calls, ask whether to go on; stop with a summary |
//! | [`retry`] | `retry` | model (innermost; tools too) | tower's `Retry` with `RetryPolicy`: backoff, the provider's wait, a budget; nothing called after a cancellation |
//! | [`fallback`] | `fallback` | model (outside retry) | the next model of a chain answers after a failure another model may not have, or a rejected response; stream readers told to discard |
//! | `structured` | `structured` | model (around, outside fallback) | the answer checked against its response format (JSON Schema) and sent back with what is wrong, bounded; tool arguments too, as an option |
//! | [`redact`] | `redact` | model and tool (around; a stream filter) | emails, phone numbers, API keys and bounded patterns of your own, replaced or masked, in the input, the streamed and whole output, tool arguments and results |
//! | [`guardrail`] | `guardrail` | model and tool (around) | named checks (closures or a classifier model) of the input (before or in parallel with the call), the output and tool results; a trip ends the run |
//! | [`evict`] | `evict` | tool (`after_tool`) | a result over a token limit goes whole to a storage backend; a preview and a read tool stay |
//! | [`summarize`] | `summarize` | model (`before_model` and around) | older messages replaced by a summary, committed to the session; summarize and retry on context overflow |
//! | [`budget`] | `budget` | model (around, outside fallback and retry) | each call's worst cost reserved on its budgets (per run, session, tenant, shared) before it is sent, settled after; a call that does not fit stops the run |
//! | [`clear`] | `clear` | model (`before_model`, inside summarize) | older tool results replaced by a placeholder in each request once it is large; the session keeps them whole |
//! | [`select`] | `select` | model (`before_model`, inside instructions) | each call offered the tools a closure or a cheap model chooses (once per run and message), plus those always kept; any call still reaches every tool |
//! | `cache` | `cache` | tool (around, inside approval) | results of read-only tools kept and reused by tool and canonical arguments, per session, shared or per key, for a time to live; identical concurrent calls run once; a write drops what its scope read |
//! | [`tool_guard`] | `tool_guard` | tool (around, inside the limits) | a policy on each call: allow it, deny it (the model gets the reason, the run goes on) or revise its arguments |
//!
//! `full` enables all of them; no feature is on by default. A layer that acts at two services
//! is one value added to both stacks (`.layer(memory.clone())` on the agent and on the model);
//! where each goes, outside in, is the canonical stack of `docs/ordering.md`.
//!
//! Each is a `tower::Layer`: add it with tower's `ServiceBuilder::layer`, or to an agent with
//! its builder's `with`, which puts it where the canonical stack has it.
//!
//! ```
//! # #[cfg(all(feature = "patch", feature = "instructions"))]
//! # {
//! use tower::ServiceBuilder;
//! use tower_agent_layers::{InstructionsLayer, PatchDanglingLayer};
//! use tower_agent_test::ScriptedModel;
//!
//! let model = ServiceBuilder::new()
//!     .layer(InstructionsLayer::from("Answer in French."))
//!     .layer(PatchDanglingLayer::new())
//!     .service(ScriptedModel::new([]));
//! # let _ = model;
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "approval")]
pub mod approval;
#[cfg(any(feature = "approval", feature = "checkpoint"))]
mod ask;
#[cfg(feature = "budget")]
pub mod budget;
#[cfg(any(feature = "approval", feature = "limits"))]
mod by_name;
#[cfg(feature = "cache")]
pub mod cache;
#[cfg(feature = "checkpoint")]
pub mod checkpoint;
#[cfg(feature = "clear")]
pub mod clear;
#[cfg(feature = "evict")]
pub mod evict;
#[cfg(feature = "fallback")]
pub mod fallback;
#[cfg(feature = "guardrail")]
pub mod guardrail;
#[cfg(feature = "instructions")]
pub mod instructions;
#[cfg(feature = "limits")]
pub mod limits;
#[cfg(feature = "memory")]
pub mod memory;
#[cfg(feature = "patch")]
pub mod patch;
#[cfg(feature = "redact")]
pub mod redact;
#[cfg(feature = "retry")]
pub mod retry;
#[cfg(any(feature = "evict", feature = "summarize"))]
mod segment;
#[cfg(feature = "select")]
pub mod select;
#[cfg(any(feature = "approval", feature = "redact"))]
mod sign;
#[cfg(feature = "structured")]
pub mod structured;
#[cfg(feature = "summarize")]
pub mod summarize;
#[cfg(any(feature = "evict", feature = "summarize"))]
mod text;
#[cfg(any(
    feature = "evict",
    feature = "summarize",
    feature = "clear",
    feature = "budget"
))]
pub mod tokens;
#[cfg(feature = "tool_guard")]
pub mod tool_guard;

#[cfg(feature = "approval")]
pub use approval::{Approval, ApprovalLayer};
#[cfg(any(feature = "approval", feature = "checkpoint"))]
pub use ask::{Human, HumanFn, human_fn};
#[cfg(feature = "budget")]
pub use budget::{Budget, BudgetLayer, Budgeted};
#[cfg(feature = "cache")]
pub use cache::{ToolCache, ToolCacheLayer};
#[cfg(feature = "checkpoint")]
pub use checkpoint::{Checkpoint, CheckpointLayer};
#[cfg(feature = "clear")]
pub use clear::{ClearToolResults, ClearToolResultsLayer};
#[cfg(feature = "evict")]
pub use evict::{Evict, EvictLayer};
#[cfg(feature = "fallback")]
pub use fallback::{Fallback, FallbackLayer};
#[cfg(feature = "guardrail")]
pub use guardrail::{Guarded, GuardrailLayer};
#[cfg(feature = "instructions")]
pub use instructions::{Instructions, InstructionsLayer};
#[cfg(feature = "limits")]
pub use limits::{CallLimits, CallLimitsLayer};
#[cfg(feature = "memory")]
pub use memory::{Memory, MemoryLayer};
#[cfg(feature = "patch")]
pub use patch::{PatchDangling, PatchDanglingLayer};
#[cfg(feature = "redact")]
pub use redact::{Redact, RedactLayer};
#[cfg(feature = "retry")]
pub use retry::{Retry, RetryLayer, RetryPolicy};
#[cfg(feature = "select")]
pub use select::{ToolSelect, ToolSelectLayer};
#[cfg(feature = "structured")]
pub use structured::{Structured, StructuredLayer};
#[cfg(feature = "summarize")]
pub use summarize::{Summarize, SummarizeLayer};
#[cfg(feature = "tool_guard")]
pub use tool_guard::{ToolGuard, ToolGuardLayer};
