//! One case: its runs, its decisions, its cancellations and the invariants after each.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use serde_json::{Value, json};
use tower_agent_core::history::validate;
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, CancellationToken, Decision, DecisionKind, Decisions,
    Error, ErrorKind, Interrupt, Message, Outcome, Session, ToolCall,
};
use tower_service::Service;

use crate::lock;

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

fn violation(text: impl Into<String>) -> Violation {
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
    pub(super) async fn run<A>(&mut self, mut agent: A) -> Result<(), Violation>
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
