//! A property check of your own agent stack: your layers, in your order, driven by a model
//! and tools that misbehave on purpose.
//!
//! [`StackCheck::run`] builds your agent many times from a [`CheckModel`] and [`CheckTools`]
//! (give it your tools' specs, so your approval gates and limits see the names they know) and
//! runs generated cases against it. A case starts from a generated session (sometimes a
//! crashed process's leftovers: calls saved before they ran, some of them never answered),
//! sends one to four inputs, each a run that may be cancelled at a random point (counted in polls), answers the
//! interrupts it gets with random decisions among those allowed, and ends with one more run.
//! Meanwhile the model answers with text, tool calls (some to tools that do not exist, some
//! with malformed arguments) or a transient failure, and summarizes when asked; the tools
//! answer, fail, take a while, or return results large enough to evict.
//!
//! It asserts the transcript's invariants:
//!
//! - after every run: every tool call is answered exactly once, right after the message that
//!   made it (only the calls of a pending interrupt may wait), and no result is an orphan; a
//!   run that did not pause leaves no interrupt behind; no run fails with `BadRequest` (the
//!   agent or a layer refusing the session or its input);
//! - after each input's runs: nothing the user sent is lost: each input the session took (the
//!   model answered it, or paused on it, or it is in the history) is still in the history, or
//!   in a summary of it;
//! - at the end of a case: the session round-trips through JSON to an equal session, and a
//!   last run on it does not fail (a call limit's `LimitReached` aside).
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
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use serde_json::{Value, json};
use tower_agent_core::event::BoxFuture;
use tower_agent_core::history::validate;
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, CancellationToken, Decision, DecisionKind, Decisions,
    DescribeTools, Error, ErrorKind, Interrupt, Message, ModelRequest, ModelResponse, Outcome,
    Role, Session, ToolCall, ToolRequest, ToolResponse, ToolSpec,
};
use tower_service::Service;

use crate::{dump, lock};

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
        }
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
            let world = World::new(seed, self.tools.clone());
            let model = CheckModel {
                world: Arc::clone(&world),
            };
            let tools = CheckTools {
                world: Arc::clone(&world),
            };
            let agent = build(model, tools);
            let mut case = Case {
                world,
                session: Session::new(),
                sent: Vec::new(),
                markers: 0,
                last_error: None,
                report: &mut report,
            };
            let result = case.run(agent).await;
            {
                let counts = lock(&case.world.counts);
                case.report.summaries += counts.summaries;
                case.report.tool_calls += counts.tool_calls;
                case.report.large_results += counts.large_results;
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
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} cases, {} runs ({} completed, {} stopped, {} cancelled, {} interrupted, {} failed), \
             {} from leftovers, {} summaries, {} tool calls ({} large results)",
            self.cases,
            self.runs,
            self.completed,
            self.stopped,
            self.cancelled,
            self.interrupted,
            self.failed,
            self.leftovers,
            self.summaries,
            self.tool_calls,
            self.large_results
        )
    }
}

/// One case's shared state: its random numbers and its counters.
#[derive(Debug)]
struct World {
    rng: Mutex<fastrand::Rng>,
    tools: Arc<[ToolSpec]>,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    summaries: u32,
    tool_calls: u32,
    large_results: u32,
    calls_made: u32,
    /// The last run: the model answers with text only.
    finishing: bool,
}

impl World {
    fn new(seed: u64, tools: Vec<ToolSpec>) -> Arc<Self> {
        Arc::new(Self {
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            tools: tools.into(),
            counts: Mutex::new(Counts::default()),
        })
    }

    /// A number below `n`.
    fn below(&self, n: u32) -> u32 {
        lock(&self.rng).u32(..n.max(1))
    }

    /// True `percent` times in a hundred.
    fn chance(&self, percent: u32) -> bool {
        self.below(100) < percent
    }
}

/// The check's model service: text, tool calls (now and then to a tool that does not exist or
/// with malformed arguments), a transient failure now and then, and a summary naming every
/// input it was shown when asked to summarize (see the [module docs](self) for how a
/// summarization request is recognized).
#[derive(Debug, Clone)]
pub struct CheckModel {
    world: Arc<World>,
}

impl CheckModel {
    fn answer(&self, req: &ModelRequest) -> Result<ModelResponse, Error> {
        let world = &self.world;
        let finishing = lock(&world.counts).finishing;
        // Summaries fail too: a summarization that fails half-way must lose nothing either.
        if !finishing && world.chance(5) {
            return Err(Error::new(ErrorKind::Server, "check: a transient failure"));
        }
        if is_summary_request(req) {
            lock(&world.counts).summaries += 1;
            let mut inputs = Vec::new();
            inputs_of(req.system.as_deref().unwrap_or_default(), &mut inputs);
            for message in req.messages.iter() {
                inputs_of(&message.text(), &mut inputs);
            }
            return Ok(ModelResponse::text(format!(
                "Summary: {}",
                inputs.join(" ")
            )));
        }
        if finishing || req.tools.is_empty() || world.chance(30) {
            return Ok(ModelResponse::text("Done."));
        }
        let calls = (0..=world.below(3))
            .map(|_| {
                let id = {
                    let mut counts = lock(&world.counts);
                    counts.calls_made += 1;
                    format!("check_{}", counts.calls_made)
                };
                let name = if world.chance(5) {
                    "no_such_tool".to_owned()
                } else {
                    let index = world.below(req.tools.len() as u32) as usize;
                    req.tools[index].name.clone()
                };
                if world.chance(5) {
                    ToolCall::raw(id, name, "{\"n\": ")
                } else {
                    ToolCall::new(id, name, json!({ "n": world.below(100) }))
                }
            })
            .collect::<Vec<_>>();
        Ok(ModelResponse::tool_calls(calls))
    }
}

impl Service<ModelRequest> for CheckModel {
    type Response = ModelResponse;
    type Error = Error;
    type Future = BoxFuture<'static, Result<ModelResponse, Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ModelRequest) -> Self::Future {
        let model = self.clone();
        Box::pin(async move {
            // A point where the run can be cancelled.
            tokio::task::yield_now().await;
            model.answer(&req)
        })
    }
}

fn is_summary_request(req: &ModelRequest) -> bool {
    let speaks_of = |text: &str| text.to_lowercase().contains("summar");
    // The summarization layer in the stack asks at the end of the session's own prefix.
    let asks_last = req
        .messages
        .last()
        .is_some_and(|m| m.role == Role::User && speaks_of(&m.text()));
    let apart = req.tools.is_empty()
        && (req.system.as_deref().is_some_and(speaks_of)
            || req
                .messages
                .iter()
                .any(|m| m.role == Role::User && speaks_of(&m.text())));
    asks_last || apart
}

/// The inputs named in `messages`, in order, each once.
fn inputs_in<'a>(messages: impl Iterator<Item = &'a Message>) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for message in messages {
        inputs_of(&message.text(), &mut found);
    }
    found
}

/// The inputs named in `text` (words of letters, digits and `-`), added to `found`.
fn inputs_of(text: &str, found: &mut Vec<String>) {
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
        if word.starts_with(INPUT) && !found.iter().any(|f| f == word) {
            found.push(word.to_owned());
        }
    }
}

/// The check's tool service: it serves the specs given to [`StackCheck::tools`] and answers
/// each call with a short result, an error result, a result after a while, or a result of
/// 12,000 characters; an unknown tool and malformed arguments get error results.
#[derive(Debug, Clone)]
pub struct CheckTools {
    world: Arc<World>,
}

impl DescribeTools for CheckTools {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        Arc::clone(&self.world.tools)
    }
}

impl Service<ToolRequest> for CheckTools {
    type Response = ToolResponse;
    type Error = Error;
    type Future = BoxFuture<'static, Result<ToolResponse, Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        let world = Arc::clone(&self.world);
        Box::pin(async move {
            let call = req.call;
            lock(&world.counts).tool_calls += 1;
            if !world.tools.iter().any(|spec| spec.name == call.name) {
                return Ok(ToolResponse::unknown_tool(&call, &world.tools));
            }
            if serde_json::from_str::<Value>(&call.arguments).is_err() {
                return Ok(ToolResponse::error(&call, "check: malformed arguments"));
            }
            match world.below(100) {
                0..10 => Ok(ToolResponse::error(&call, "check: the tool failed")),
                10..20 => {
                    lock(&world.counts).large_results += 1;
                    Ok(ToolResponse::success(&call, "large ".repeat(2_000)))
                }
                20..35 => {
                    // A while, counted in polls: the case stays the same on every run.
                    for _ in 0..=world.below(5) {
                        tokio::task::yield_now().await;
                    }
                    Ok(ToolResponse::success(&call, format!("{} done", call.name)))
                }
                _ => Ok(ToolResponse::success(&call, format!("{} done", call.name))),
            }
        })
    }
}

/// A violated invariant.
#[derive(Debug)]
struct Violation(String);

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn violation(text: impl Into<String>) -> Violation {
    Violation(text.into())
}

/// One case: its world, the session as it goes, and the inputs that must not be lost.
struct Case<'r> {
    world: Arc<World>,
    session: Session,
    /// The inputs the session took: none may be lost.
    sent: Vec<String>,
    markers: usize,
    /// The kind of the last run's error.
    last_error: Option<ErrorKind>,
    report: &'r mut Report,
}

/// How a run went, for the case.
enum Ran {
    /// It paused: these calls wait for decisions.
    Paused(Vec<Interrupt>),
    /// It ended (or failed).
    Ended {
        /// The model answered the run's input.
        completed: bool,
    },
}

impl Case<'_> {
    async fn run<A>(&mut self, mut agent: A) -> Result<(), Violation>
    where
        A: Service<AgentRequest, Response = AgentResponse, Error = Error>,
    {
        self.session = self.start();
        let inputs = 1 + self.world.below(4);
        for _ in 0..inputs {
            let marker = self.marker();
            let mut input = AgentInput::from(format!("Please see to {marker}."));
            for _ in 0..RESUMES {
                let cancel_at = self.world.chance(25).then(|| self.world.below(12));
                match self.send(&mut agent, input, cancel_at).await? {
                    Ran::Paused(interrupts) => {
                        // The model asked for the paused calls: it was given the input.
                        if !self.sent.contains(&marker) {
                            self.sent.push(marker.clone());
                        }
                        self.check_nothing_lost()?;
                        input = AgentInput::Resume(self.decide(&interrupts));
                    }
                    Ran::Ended { completed } => {
                        // The model answered: the input it answered is in the session.
                        if completed && !self.sent.contains(&marker) {
                            self.sent.push(marker.clone());
                        }
                        break;
                    }
                }
            }
            // A run may fail or be cancelled before it takes its input; once in the session,
            // the input must stay.
            if !self.sent.contains(&marker)
                && inputs_in(self.session.history.iter()).contains(&marker)
            {
                self.sent.push(marker);
            }
            self.check_nothing_lost()?;
        }
        // The session round-trips and the agent resumes from it.
        let json = serde_json::to_value(&self.session)
            .map_err(|e| violation(format!("the session does not serialize: {e}")))?;
        let back: Session = serde_json::from_value(json)
            .map_err(|e| violation(format!("the session does not deserialize: {e}")))?;
        if back != self.session {
            return Err(violation("the session changed through JSON"));
        }
        self.session = back;
        lock(&self.world.counts).finishing = true;
        let input = if self.session.interrupts.is_empty() {
            AgentInput::from("Please finish.")
        } else {
            AgentInput::Resume(self.decide(&self.session.interrupts.clone()))
        };
        let failed = self.report.failed;
        self.send(&mut agent, input, None).await?;
        if self.report.failed > failed && self.last_error != Some(ErrorKind::LimitReached) {
            return Err(violation(format!(
                "the agent does not resume from the session: the run failed ({})",
                self.last_error.map_or("?", |kind| kind.name())
            )));
        }
        self.check_nothing_lost()
    }

    /// The session a case starts from: empty, a short conversation, or a crashed process's
    /// leftovers (its last calls saved before they ran, some never answered).
    fn start(&mut self) -> Session {
        let mut session = Session::new();
        let tools = Arc::clone(&self.world.tools);
        let exchanges = self.world.below(3);
        for _ in 0..exchanges {
            let marker = self.marker();
            session
                .history
                .push(Message::user(format!("Earlier, {marker}.")));
            self.sent.push(marker);
            if let Some(spec) = tools.first() {
                let call = self.call_to(&spec.name);
                session
                    .history
                    .push(Message::assistant_with_calls("", [call.clone()]));
                session
                    .history
                    .push(Message::tool_result(tower_agent_core::ToolResult::success(
                        &call,
                        "earlier result",
                    )));
            }
            session.history.push(Message::assistant("Earlier answer."));
        }
        if !tools.is_empty() && self.world.chance(30) {
            self.report.leftovers += 1;
            let marker = self.marker();
            session
                .history
                .push(Message::user(format!("Before the crash, {marker}.")));
            self.sent.push(marker);
            let calls: Vec<ToolCall> = (0..=self.world.below(2))
                .map(|_| {
                    let index = self.world.below(tools.len() as u32) as usize;
                    self.call_to(&tools[index].name)
                })
                .collect();
            session
                .history
                .push(Message::assistant_with_calls("", calls.clone()));
            let answered = self.world.below(calls.len() as u32) as usize;
            for call in &calls[..answered] {
                session
                    .history
                    .push(Message::tool_result(tower_agent_core::ToolResult::success(
                        call,
                        "answered before the crash",
                    )));
            }
        }
        session
    }

    /// A new input's name.
    fn marker(&mut self) -> String {
        self.markers += 1;
        format!("{INPUT}{}", self.markers)
    }

    fn call_to(&self, name: &str) -> ToolCall {
        let mut counts = lock(&self.world.counts);
        counts.calls_made += 1;
        ToolCall::new(
            format!("check_{}", counts.calls_made),
            name,
            json!({ "n": 1 }),
        )
    }

    /// A random decision for each interrupt, among those it allows.
    fn decide(&self, interrupts: &[Interrupt]) -> Decisions {
        let mut decisions = Decisions::new();
        for interrupt in interrupts {
            let value: Value = if interrupt.allowed.is_empty() {
                json!("ok")
            } else {
                let kind =
                    interrupt.allowed[self.world.below(interrupt.allowed.len() as u32) as usize];
                match kind {
                    DecisionKind::Approve => Decision::Approve,
                    DecisionKind::Reject => Decision::reject("check: rejected"),
                    DecisionKind::Edit => Decision::edit(json!({ "n": 0 })),
                    _ => Decision::respond("check: answered by the host"),
                }
                .into()
            };
            decisions.insert(interrupt.call.id.clone(), value);
        }
        decisions
    }

    /// One run, cancelled at its `cancel_at`-th poll if given; checks the session it leaves.
    async fn send<A>(
        &mut self,
        agent: &mut A,
        input: AgentInput,
        cancel_at: Option<u32>,
    ) -> Result<Ran, Violation>
    where
        A: Service<AgentRequest, Response = AgentResponse, Error = Error>,
    {
        self.report.runs += 1;
        let token = CancellationToken::new();
        let request =
            AgentRequest::new(self.session.clone(), input).with_cancellation(token.clone());
        std::future::poll_fn(|cx| agent.poll_ready(cx))
            .await
            .map_err(|e| violation(format!("the agent is not ready: {e}")))?;
        let run = CancelAt {
            run: Box::pin(agent.call(request)),
            token,
            at: cancel_at,
            polls: 0,
        };
        match run.await {
            Ok(response) => {
                let ran = match &response.outcome {
                    Outcome::Interrupted { interrupts } => {
                        self.report.interrupted += 1;
                        Ran::Paused(interrupts.clone())
                    }
                    outcome => {
                        match outcome {
                            Outcome::Completed { .. } => self.report.completed += 1,
                            Outcome::Stopped { .. } => self.report.stopped += 1,
                            _ => self.report.cancelled += 1,
                        }
                        if !response.session.interrupts.is_empty() {
                            self.session = response.session;
                            return Err(violation(
                                "a run that did not pause left interrupts in the session",
                            ));
                        }
                        Ran::Ended {
                            completed: matches!(outcome, Outcome::Completed { .. }),
                        }
                    }
                };
                self.session = response.session;
                self.check_pairs()?;
                Ok(ran)
            }
            Err(mut error) => {
                self.report.failed += 1;
                self.last_error = Some(error.kind());
                if let Some(session) = error.take_session() {
                    self.session = session;
                    self.check_pairs()?;
                }
                if error.kind() == ErrorKind::BadRequest {
                    return Err(violation(format!(
                        "a run failed with BadRequest (the agent or a layer refused the session \
                         or its input): {error}"
                    )));
                }
                Ok(Ran::Ended { completed: false })
            }
        }
    }

    fn check_pairs(&self) -> Result<(), Violation> {
        let pending: Vec<&str> = self
            .session
            .interrupts
            .iter()
            .map(|i| i.call.id.as_str())
            .collect();
        validate(&self.session.history, &pending)
            .map_err(|e| violation(format!("the history is broken: {e}")))
    }

    fn check_nothing_lost(&self) -> Result<(), Violation> {
        let kept = inputs_in(self.session.history.iter());
        match self.sent.iter().find(|sent| !kept.contains(sent)) {
            Some(lost) => Err(violation(format!(
                "`{lost}`, which the user sent, is neither in the history nor in a summary"
            ))),
            None => Ok(()),
        }
    }
}

/// A run that cancels its token before its `at`-th poll.
struct CancelAt<F> {
    run: Pin<Box<F>>,
    token: CancellationToken,
    at: Option<u32>,
    polls: u32,
}

impl<F: Future> Future for CancelAt<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        if self.at == Some(self.polls) {
            self.token.cancel();
        }
        self.polls += 1;
        self.run.as_mut().poll(cx)
    }
}
