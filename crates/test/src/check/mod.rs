//! A property check of your own agent stack: your layers, in your order, driven by a model
//! and tools that misbehave on purpose.
//!
//! [`StackCheck::run`] builds your agent many times from a [`CheckModel`] and [`CheckTools`]
//! (give it your tools' specs, so your approval gates and limits see the names they know) and
//! runs generated cases against it. A case starts from a generated session (sometimes a
//! crashed process's leftovers: calls saved before they ran, some of them never answered),
//! sends one to four inputs, each a run that may be cancelled at a random point (counted in
//! polls) or **killed** there (dropped where it stands, as a process that dies: the case goes
//! on from what the run saved last), answers the interrupts it gets with random decisions
//! among those allowed, and ends with one more run. Meanwhile the model answers with text or
//! tool calls (streamed as a provider closes them; some to tools that do not exist, some with
//! malformed arguments; some answers cut off at their length limit in their last call, which
//! must never run; some streams break after their first call closed) or a transient
//! failure, and summarizes when asked; the tools answer,
//! fail, take a while, or return results large enough to evict.
//!
//! **The check plays the store**: each run's request carries a saver
//! ([`AgentRequest::saver`]) that keeps every version the run saves, as a session store's
//! layer would. A stack with a session store of its own runs under
//! [`StackCheck::run_stored`]: the check names each run's session by id, and the store tells it
//! what it writes ([`CheckSaves`]).
//!
//! It asserts the transcript's invariants:
//!
//! - after every run: every tool call is answered exactly once, right after the message that
//!   made it (only the calls of a pending interrupt may wait), and no result is an orphan; a
//!   run that did not pause leaves no interrupt behind; no run fails with `BadRequest` (the
//!   agent or a layer refusing the session or its input);
//! - every saved version is valid (only the calls in flight at its end wait), and a call
//!   answered in one version is answered the same way in every later one; a call the tools
//!   ran and the loop announced as finished (`ToolFinished`) is in the version saved before
//!   the announcement; no call runs twice (a call in flight when its process died is
//!   answered, never run again); a call the tools ran stands in each version with the
//!   arguments and the key it ran with (a guard's revision, a human's edit); each call the
//!   model made has a key no other call has, the same in every version;
//! - after each input's runs: nothing the user sent is lost: each input the session took (the
//!   model answered it, or paused on it, or it is in the history) is still in the history, or
//!   in a summary of it;
//! - with [`StackCheck::secret`]: the secret (said now and then by the inputs, the model and
//!   the tools) reaches no saved version, no event and no error;
//! - with [`StackCheck::trips_on`]: an input with the word is never left in the session, and
//!   a run whose input lacks it is never stopped by a guardrail (nothing tripped sticks);
//! - at the end of a case: the session round-trips through JSON to an equal session, a last
//!   run on it does not fail (a call limit's `LimitReached` aside), and neither does a run on
//!   a version drawn at random from those the case saved (every saved version resumes).
//!
//! A summarization request is recognized as one whose last message is a user message that
//! speaks of summarizing (contains "summar"), as the summarization layer's in the stack does
//! ([`SummarizeLayer::in_stack`](https://docs.rs/tower-agent-layers)), or one that offers no
//! tools and speaks of summarizing in its system prompt or a user message, as a summarizer
//! apart is asked; it is answered with a summary naming every input it shows. Give your own
//! summarizer a prompt that says so, or its summaries will name nothing and inputs will read
//! as lost.
//!
//! A violation panics with the case's seed; `TOWER_AGENT_CHECK_SEED=<seed>` (or
//! [`StackCheck::replay`]) runs that case alone, the same way: the cases are deterministic on
//! a current-thread runtime, as long as the stack does not wait on the clock (give retry
//! policies zero delays, or run the test with tokio's paused time). The variable applies to
//! every check of the test binary and runs one case, so assertions on the [`Report`]'s counts
//! may not hold then.
//!
//! ```
//! use tower::ServiceExt;
//! use tower_agent_core::ToolSpec;
//! use tower_agent_loop::Agent;
//! use tower_agent_test::check::StackCheck;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let report = StackCheck::new()
//!     .cases(20)
//!     .tools([ToolSpec::new("search", "Search the web.", serde_json::json!({"type": "object"}))])
//!     .run(|model, tools| Agent::builder().max_rounds(8).build(model, tools))
//!     .await;
//! assert_eq!(report.cases, 20);
//! # }
//! ```

use std::fmt;
use std::sync::Arc;

use serde_json::json;
use tower_agent_core::{AgentRequest, AgentResponse, Error, Session, ToolSpec};
use tower_service::Service;

use crate::{dump, lock};

mod case;
mod invariants;
mod trace;
mod world;

use case::Case;
use world::World;
pub use world::{CheckModel, CheckTools};

/// Where a session store of yours tells the check what it wrote ([`StackCheck::run_stored`]).
#[derive(Clone, Default)]
pub struct CheckSaves {
    run: Arc<std::sync::Mutex<Option<trace::Trace>>>,
}

impl CheckSaves {
    /// Your store wrote `session` (call it from its `save`, once the write succeeded).
    pub fn saved(&self, session: &Session) {
        if let Some(trace) = lock(&self.run).as_ref() {
            trace.push(session);
        }
    }
}

impl fmt::Debug for CheckSaves {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckSaves").finish_non_exhaustive()
    }
}

/// The environment variable that replays one case by its seed.
pub const SEED_VAR: &str = "TOWER_AGENT_CHECK_SEED";

/// The prefix of every text the check sends as the user: what must never be lost.
const INPUT: &str = "input-";

/// The most interrupts answered in a row for one input.
const RESUMES: usize = 8;

/// The property check; see the [module](self).
#[derive(Debug, Clone)]
pub struct StackCheck {
    cases: u32,
    seed: Option<u64>,
    replay: Option<u64>,
    tools: Vec<ToolSpec>,
    secret: Option<String>,
    trip: Option<String>,
    tool_calls_per_run: Option<u32>,
}

impl Default for StackCheck {
    fn default() -> Self {
        Self::new()
    }
}

impl StackCheck {
    /// 100 cases, a seed from the clock (or [`SEED_VAR`]), three tools: `lookup` (read-only),
    /// `write` and `fetch`.
    pub fn new() -> Self {
        let object = json!({ "type": "object", "properties": { "n": { "type": "integer" } } });
        let mut lookup = ToolSpec::new("lookup", "Look something up.", object.clone());
        lookup.read_only = true;
        Self {
            cases: 100,
            seed: None,
            replay: None,
            tools: vec![
                lookup,
                ToolSpec::new("write", "Write something down.", object.clone()),
                ToolSpec::new("fetch", "Fetch a document.", object),
            ],
            secret: None,
            trip: None,
            tool_calls_per_run: None,
        }
    }

    /// A text your stack must never let through (an email address your redaction removes, an
    /// API key): the check's inputs, model answers and tool results say it now and then, and
    /// it must reach no saved version, no event and no error.
    pub fn secret(mut self, secret: impl Into<String>) -> Self {
        self.secret = Some(secret.into());
        self
    }

    /// A word your input guardrail trips on: some inputs say it. A tripped input must never
    /// stay in the session (nor reach a version saved after the run that tripped), and a run
    /// whose input does not say it must never be stopped by a guardrail: nothing tripped
    /// sticks.
    pub fn trips_on(mut self, word: impl Into<String>) -> Self {
        self.trip = Some(word.into());
        self
    }

    /// Your stack stops a run after `limit` tool calls (a call limit of
    /// `Limit::per_run(limit)` that ends the run): a run stopped by a limit of `limit`
    /// ([`StopReason::Limit`](tower_agent_core::StopReason::Limit)) must have run that many
    /// calls to a result the model sees. Counted: each call the loop announced finished
    /// (`ToolFinished`) in that run whose result is not a "not executed" or a cancelled one. A
    /// call started early that the model's message then discards, a call refused, a call of
    /// a run that never answered: none may count against the limit.
    pub fn tool_calls_per_run(mut self, limit: u32) -> Self {
        self.tool_calls_per_run = Some(limit);
        self
    }

    /// How many cases to run.
    pub fn cases(mut self, cases: u32) -> Self {
        self.cases = cases;
        self
    }

    /// The seed the cases' seeds are drawn from (instead of the clock): the same seed runs
    /// the same cases.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Run only the case of `seed`, as a failure printed it (what [`SEED_VAR`] does).
    pub fn replay(mut self, seed: u64) -> Self {
        self.replay = Some(seed);
        self
    }

    /// The tools [`CheckTools`] serves: give it your own tools' specs, so the layers that
    /// know tools by name (approval gates, limits) see them.
    pub fn tools(mut self, tools: impl IntoIterator<Item = ToolSpec>) -> Self {
        self.tools = tools.into_iter().collect();
        self
    }

    /// Run the cases against the agents `build` makes (a fresh one per case), and report
    /// what they went through.
    ///
    /// # Panics
    ///
    /// On the first violation, with the case's seed and its session.
    pub async fn run<A, F>(self, mut build: F) -> Report
    where
        F: FnMut(CheckModel, CheckTools) -> A,
        A: Service<AgentRequest, Response = AgentResponse, Error = Error>,
    {
        self.check(|model, tools, _| build(model, tools), false)
            .await
    }

    /// [`StackCheck::run`] for a stack with a session store of yours: the check sends each
    /// run the session by id (the first one whole, as a new session), and your store tells
    /// it every session it writes through the [`CheckSaves`] `build` gets (make a store per
    /// case, and call [`CheckSaves::saved`] in its `save`). A run killed goes on from what the
    /// store holds. A saved version drawn at random is not run again (the store holds the
    /// last one only).
    ///
    /// # Panics
    ///
    /// As [`StackCheck::run`].
    pub async fn run_stored<A, F>(self, mut build: F) -> Report
    where
        F: FnMut(CheckModel, CheckTools, CheckSaves) -> A,
        A: Service<AgentRequest, Response = AgentResponse, Error = Error>,
    {
        self.check(
            |model, tools, saves| build(model, tools, saves.unwrap_or_default()),
            true,
        )
        .await
    }

    async fn check<A, F>(self, mut build: F, stored: bool) -> Report
    where
        F: FnMut(CheckModel, CheckTools, Option<CheckSaves>) -> A,
        A: Service<AgentRequest, Response = AgentResponse, Error = Error>,
    {
        let from_env = std::env::var(SEED_VAR).ok().map(|text| {
            parse_seed(&text).unwrap_or_else(|| {
                panic!("{SEED_VAR}={text} is not a seed (decimal, or hex with 0x)")
            })
        });
        let seeds: Vec<u64> = match from_env.or(self.replay) {
            Some(seed) => vec![seed],
            None => {
                let mut rng = fastrand::Rng::with_seed(self.seed.unwrap_or_else(clock_seed));
                (0..self.cases).map(|_| rng.u64(..)).collect()
            }
        };
        let mut report = Report::default();
        for (index, &seed) in seeds.iter().enumerate() {
            let world = World::new(seed, self.tools.clone(), self.secret.clone());
            let model = CheckModel {
                world: Arc::clone(&world),
            };
            let tools = CheckTools {
                world: Arc::clone(&world),
            };
            let saves = stored.then(CheckSaves::default);
            let agent = build(model, tools, saves.clone());
            let mut case = Case {
                world,
                session: Session::new(),
                stored: saves,
                in_store: false,
                sent: Vec::new(),
                markers: 0,
                last_error: None,
                report: &mut report,
                trip: self.trip.clone(),
                tool_calls_per_run: self.tool_calls_per_run,
                saved: Vec::new(),
                results: Default::default(),
                keys: Default::default(),
            };
            let result = case.run(agent).await;
            {
                let counts = lock(&case.world.counts);
                case.report.summaries += counts.summaries;
                case.report.tool_calls += counts.tool_calls;
                case.report.large_results += counts.large_results;
                case.report.cut_calls += counts.cut.len() as u32;
                case.report.tally_recovered(&counts.recovered);
            }
            if let Err(violation) = result {
                panic!(
                    "stack check failed: {violation}\n\
                     case {} of {}, seed {seed:#x}: replay it alone with {SEED_VAR}={seed:#x}\n\
                     the session:\n{}",
                    index + 1,
                    seeds.len(),
                    dump(&case.session.history)
                );
            }
            report.cases += 1;
        }
        report
    }
}

fn parse_seed(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// What the cases went through: a check that never interrupted or cancelled anything proves
/// little, so look at it (or assert on it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Cases run.
    pub cases: u32,
    /// Runs (a resume counts as one).
    pub runs: u32,
    /// Cases that started from a crashed process's leftovers.
    pub leftovers: u32,
    /// Runs that ended completed.
    pub completed: u32,
    /// Runs that ended stopped (a limit, a checkpoint, a layer).
    pub stopped: u32,
    /// Runs that ended cancelled.
    pub cancelled: u32,
    /// Runs that ended interrupted (each was resumed with decisions).
    pub interrupted: u32,
    /// Runs that ended with an error.
    pub failed: u32,
    /// Model calls answered with a summary.
    pub summaries: u32,
    /// Tool calls served.
    pub tool_calls: u32,
    /// Tool results of 12,000 characters or more served.
    pub large_results: u32,
    /// Runs dropped at a random point, as a process that dies (the case went on from what
    /// they saved).
    pub killed: u32,
    /// Sessions the runs saved (each checked).
    pub versions: u32,
    /// Saved versions run again at a case's end (each must resume).
    pub resumed_versions: u32,
    /// Runs a guardrail stopped.
    pub tripped: u32,
    /// Runs a limit of [`StackCheck::tool_calls_per_run`] stopped (each checked).
    pub limited: u32,
    /// Calls of model answers cut off at their length limit (none may run).
    pub cut_calls: u32,
    /// Calls a killed run left started and the next run recovered, by what the tools said:
    /// done, not run, unknown (none may run twice).
    pub recovered: [u32; 3],
}

impl Report {
    /// Count the calls recovered, by what the tools said.
    pub(super) fn tally_recovered(&mut self, recovered: &[(tower_agent_core::CallKey, &str)]) {
        for (_, outcome) in recovered {
            match *outcome {
                "done" => self.recovered[0] += 1,
                "not_run" => self.recovered[1] += 1,
                _ => self.recovered[2] += 1,
            }
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} cases, {} runs ({} completed, {} stopped, {} cancelled, {} interrupted, {} failed, \
             {} killed, {} tripped, {} limited), {} from leftovers, {} summaries, {} tool calls \
             ({} large results), {} calls cut off, {} recovered ({} done, {} not run, {} unknown), \
             {} versions saved, {} resumed",
            self.cases,
            self.runs,
            self.completed,
            self.stopped,
            self.cancelled,
            self.interrupted,
            self.failed,
            self.killed,
            self.tripped,
            self.limited,
            self.leftovers,
            self.summaries,
            self.tool_calls,
            self.large_results,
            self.cut_calls,
            self.recovered.iter().sum::<u32>(),
            self.recovered[0],
            self.recovered[1],
            self.recovered[2],
            self.versions,
            self.resumed_versions
        )
    }
}
