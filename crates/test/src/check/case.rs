//! One case: its runs, its decisions, its cancellations and the invariants after each.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use serde_json::{Value, json};
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, CallKey, CancellationToken, Decision, DecisionKind,
    Decisions, Error, ErrorKind, Interrupt, Message, Outcome, Session, StopReason, ToolCall,
};
use tower_service::Service;

use crate::lock;

use super::invariants::check_limit_counted_calls_that_ran;
use super::trace::Trace;
use super::world::{World, inputs_in};
use super::{INPUT, RESUMES, Report};

/// A violated invariant.
#[derive(Debug)]
pub(super) struct Violation(String);

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub(super) fn violation(text: impl Into<String>) -> Violation {
    Violation(text.into())
}

/// One case: its world, the session as it goes, and the inputs that must not be lost.
pub(super) struct Case<'r> {
    pub(super) world: Arc<World>,
    pub(super) session: Session,
    /// The inputs the session took: none may be lost.
    pub(super) sent: Vec<String>,
    pub(super) markers: usize,
    /// The kind of the last run's error.
    pub(super) last_error: Option<ErrorKind>,
    pub(super) report: &'r mut Report,
    /// The word the host's input guardrail trips on, if the check sends it.
    pub(super) trip: Option<String>,
    /// The host's limit of tool calls per run, if it said.
    pub(super) tool_calls_per_run: Option<u32>,
    /// Every version the case's runs saved.
    pub(super) saved: Vec<Session>,
    /// The result each answered call got in a saved version: it never changes after.
    pub(super) results: HashMap<String, String>,
    /// The key each call had in a saved version: it never changes after.
    pub(super) keys: HashMap<String, CallKey>,
    /// The store of the host's, when the check runs on one ([`StackCheck::run_stored`]).
    pub(super) stored: Option<super::CheckSaves>,
    /// The store holds the case's session: runs name it by id.
    pub(super) in_store: bool,
}

/// How a run went, for the case.
enum Ran {
    /// It paused: these calls wait for decisions.
    Paused(Vec<Interrupt>),
    /// It ended (or failed).
    Ended {
        /// The model answered the run's input.
        completed: bool,
        /// It was cancelled.
        cancelled: bool,
    },
    /// The process died: the case goes on from what the run saved last.
    Killed,
}

impl Case<'_> {
    pub(super) async fn run<A>(&mut self, mut agent: A) -> Result<(), Violation>
    where
        A: Service<AgentRequest, Response = AgentResponse, Error = Error>,
    {
        self.session = self.start();
        let inputs = 1 + self.world.below(4);
        for _ in 0..inputs {
            let marker = self.marker();
            let tripped = self
                .trip
                .as_ref()
                .filter(|_| self.world.chance(15))
                .cloned();
            let text = match &tripped {
                Some(word) => format!("Please see to {marker}, {word}."),
                None => format!("Please see to {marker}.{}", self.world.maybe_secret()),
            };
            let mut input = AgentInput::from(text);
            for _ in 0..RESUMES {
                let cancel_at = self.world.chance(25).then(|| self.world.below(12));
                let kill_at = self.world.chance(15).then(|| self.world.below(16));
                let ran = self
                    .send(&mut agent, input, cancel_at, kill_at, tripped.is_some())
                    .await?;
                if tripped.is_some() && inputs_in(self.session.history.iter()).contains(&marker) {
                    // A run killed or cancelled after it saved the input keeps it, checked or
                    // not (the next run checks it again); any other keeps nothing tripped.
                    let unfinished = matches!(
                        ran,
                        Ran::Killed
                            | Ran::Ended {
                                cancelled: true,
                                ..
                            }
                    );
                    if !unfinished {
                        return Err(violation(format!(
                            "the input `{marker}` was tripped, yet it is in the session"
                        )));
                    }
                }
                match ran {
                    Ran::Paused(interrupts) => {
                        // The model asked for the paused calls: it was given the input.
                        if !self.sent.contains(&marker) {
                            self.sent.push(marker.clone());
                        }
                        self.check_nothing_lost()?;
                        input = AgentInput::Resume(self.decide(&interrupts));
                    }
                    Ran::Ended { completed, .. } => {
                        // The model answered: the input it answered is in the session.
                        if completed && !self.sent.contains(&marker) {
                            self.sent.push(marker.clone());
                        }
                        break;
                    }
                    Ran::Killed => break,
                }
            }
            // A run may fail or be cancelled before it takes its input; once in the session,
            // the input must stay.
            // (Not an input with the trip word: a guardrail may yet take it away.)
            if !self.sent.contains(&marker)
                && tripped.is_none()
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
        self.send(&mut agent, input, None, None, false).await?;
        if self.report.failed > failed && self.last_error != Some(ErrorKind::LimitReached) {
            return Err(violation(format!(
                "the agent does not resume from the session: the run failed ({})",
                self.last_error.map_or("?", |kind| kind.name())
            )));
        }
        self.check_nothing_lost()?;
        self.resume_a_saved_version(&mut agent).await
    }

    /// Every saved version resumes: one of them, drawn at random, is run once more (its calls
    /// in flight answered, its pauses decided) and must not fail.
    async fn resume_a_saved_version<A>(&mut self, agent: &mut A) -> Result<(), Violation>
    where
        A: Service<AgentRequest, Response = AgentResponse, Error = Error>,
    {
        // A store holds its last version only.
        if self.saved.is_empty() || self.stored.is_some() {
            return Ok(());
        }
        let index = self.world.below(self.saved.len() as u32) as usize;
        self.session = self.saved[index].clone();
        self.report.resumed_versions += 1;
        // Another timeline: from this version on, its calls in flight were never finished, and
        // the calls it decides run there for the first time.
        self.results.clear();
        self.keys.clear();
        {
            let mut counts = lock(&self.world.counts);
            counts.executed.clear();
            counts.ran_with.clear();
            counts.effects.clear();
            counts.answered.clear();
            self.report.tally_recovered(&counts.recovered);
            counts.recovered.clear();
        }
        self.check_version(&self.session.clone())?;
        let input = if self.session.interrupts.is_empty() {
            AgentInput::from("Please finish.")
        } else {
            AgentInput::Resume(self.decide(&self.session.interrupts.clone()))
        };
        let failed = self.report.failed;
        self.send(agent, input, None, None, false).await?;
        if self.report.failed > failed && self.last_error != Some(ErrorKind::LimitReached) {
            return Err(violation(format!(
                "saved version {} of {} does not resume: the run failed ({})",
                index + 1,
                self.saved.len(),
                self.last_error.map_or("?", |kind| kind.name())
            )));
        }
        Ok(())
    }

    /// The session a case starts from: empty, a short conversation, or a crashed process's
    /// leftovers (its last calls saved before they ran, some never answered).
    fn start(&mut self) -> Session {
        let mut session = Session::with_id(format!("case-{:x}", self.world.seed));
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

    /// One run, cancelled at its `cancel_at`-th poll, or dropped at its `kill_at`-th as a
    /// process that dies, if given; checks the versions it saved and the session it leaves.
    /// `tripped`: its input holds the word the host's guardrail trips on.
    async fn send<A>(
        &mut self,
        agent: &mut A,
        input: AgentInput,
        cancel_at: Option<u32>,
        kill_at: Option<u32>,
        tripped: bool,
    ) -> Result<Ran, Violation>
    where
        A: Service<AgentRequest, Response = AgentResponse, Error = Error>,
    {
        self.report.runs += 1;
        if std::env::var("DEBUG_CHECK").is_ok() {
            let last = self.session.history.last().map(|m| {
                format!(
                    "{:?} calls={:?}",
                    m.role,
                    m.tool_calls().map(|c| c.id.clone()).collect::<Vec<_>>()
                )
            });
            eprintln!(
                "SEND {input:?} kill={kill_at:?} cancel={cancel_at:?} started={:?} interrupts={:?} last={last:?}",
                self.session.started,
                self.session
                    .interrupts
                    .iter()
                    .map(|i| i.call.id.clone())
                    .collect::<Vec<_>>()
            );
        }
        let token = CancellationToken::new();
        let trace = Trace::new(self.world.secret.is_some());
        let request = match &self.stored {
            // The store's layer loads the session by id (the first time it takes it whole)
            // and saves it: the store tells the trace.
            Some(saves) => {
                *lock(&saves.run) = Some(trace.clone());
                let session = match self.in_store {
                    true => Session::with_id(self.session.id.clone()),
                    false => self.session.clone(),
                };
                AgentRequest::new(session, input)
            }
            None => AgentRequest::new(self.session.clone(), input).with_saver(trace.clone()),
        };
        let request = request
            .with_cancellation(token.clone())
            .with_observer(trace.clone());
        std::future::poll_fn(|cx| agent.poll_ready(cx))
            .await
            .map_err(|e| violation(format!("the agent is not ready: {e}")))?;
        let run = CancelAt {
            run: Some(Box::pin(agent.call(request))),
            token,
            at: cancel_at,
            kill: kill_at,
            polls: 0,
        };
        let result = run.await;
        if let Some(saves) = &self.stored {
            *lock(&saves.run) = None;
        }
        self.check_finished_saved(&trace)?;
        let saved = trace.versions();
        self.in_store |= !saved.is_empty();
        self.report.versions += saved.len() as u32;
        for version in &saved {
            self.check_version(version)?;
        }
        self.saved.extend(saved.iter().cloned());
        for event in std::mem::take(&mut lock(&trace.0).events) {
            self.check_no_secret("an event", &event)?;
        }
        self.check_executed_once()?;
        let Some(result) = result else {
            self.report.killed += 1;
            // What survives the process is what it saved.
            if let Some(last) = saved.last() {
                self.session = last.clone();
            }
            return Ok(Ran::Killed);
        };
        match result {
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
                        // A tripped input leaves the session as it came: what waited still
                        // waits.
                        let refused = tripped
                            && matches!(
                                outcome,
                                Outcome::Stopped {
                                    reason: StopReason::Guardrail { .. },
                                    ..
                                }
                            )
                            && response.session.interrupts == self.session.interrupts;
                        if !response.session.interrupts.is_empty() && !refused {
                            self.session = response.session;
                            return Err(violation(
                                "a run that did not pause left interrupts in the session",
                            ));
                        }
                        Ran::Ended {
                            completed: matches!(outcome, Outcome::Completed { .. }),
                            cancelled: matches!(outcome, Outcome::Cancelled { .. }),
                        }
                    }
                };
                if let Outcome::Stopped {
                    reason: StopReason::Guardrail { .. },
                    ..
                } = &response.outcome
                {
                    self.report.tripped += 1;
                    // The user's unanswered messages that end the session were read with the
                    // input, and leave with it: nothing tripped stays, whichever tripped.
                    let start = self
                        .session
                        .history
                        .iter()
                        .rposition(|m| m.role != tower_agent_core::Role::User)
                        .map_or(0, |at| at + 1);
                    let read = inputs_in(self.session.history[start..].iter());
                    self.sent.retain(|sent| !read.contains(sent));
                    // A run whose input lacks the word trips only on what an earlier run left
                    // (a process that died before a parallel check tripped), and takes it away.
                    if let Some(word) = self.trip.as_deref().filter(|_| !tripped) {
                        let holds = |session: &Session| {
                            session.history.iter().any(|m| m.text().contains(word))
                        };
                        if !holds(&self.session) {
                            return Err(violation(
                                "a guardrail stopped a run whose input it had no reason to trip \
                                 on: something tripped before stuck to the session",
                            ));
                        }
                        if holds(&response.session) {
                            return Err(violation(
                                "a guardrail tripped on what an earlier run left, and left it",
                            ));
                        }
                    }
                }
                if let Outcome::Stopped {
                    reason: StopReason::Limit { limit, .. },
                    ..
                } = &response.outcome
                {
                    if self.tool_calls_per_run == Some(*limit) {
                        self.report.limited += 1;
                        check_limit_counted_calls_that_ran(&trace, &response.session, *limit)?;
                    }
                }
                self.session = response.session;
                self.check_pairs()?;
                self.check_version(&self.session.clone())?;
                Ok(ran)
            }
            Err(mut error) => {
                self.report.failed += 1;
                self.last_error = Some(error.kind());
                self.check_no_secret("an error", &format!("{error} {error:?}"))?;
                if let Some(session) = error.take_session() {
                    self.session = session;
                    self.check_pairs()?;
                    self.check_version(&self.session.clone())?;
                }
                if error.kind() == ErrorKind::BadRequest {
                    return Err(violation(format!(
                        "a run failed with BadRequest (the agent or a layer refused the session \
                         or its input): {error}"
                    )));
                }
                Ok(Ran::Ended {
                    completed: false,
                    cancelled: false,
                })
            }
        }
    }
}

/// A run that cancels its token before its `at`-th poll, and is dropped before its `kill`-th
/// (`None`: the process died; nothing after its last save happened).
struct CancelAt<F> {
    run: Option<Pin<Box<F>>>,
    token: CancellationToken,
    at: Option<u32>,
    kill: Option<u32>,
    polls: u32,
}

impl<F: Future> Future for CancelAt<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        if self.kill == Some(self.polls) {
            // Dropped where it stands: its tasks aborted, nothing more saved.
            self.run = None;
        }
        if self.at == Some(self.polls) {
            self.token.cancel();
        }
        self.polls += 1;
        match self.run.as_mut() {
            None => Poll::Ready(None),
            Some(run) => run.as_mut().poll(cx).map(Some),
        }
    }
}
