//! Randomized fault injection for the agent loop, through the public API only.
//!
//! Each case chains two to four runs on one session: random model answers (text, good and
//! bad tool calls, errors, panics), tool behaviours (results, errors, panics, delays,
//! interrupts, stops), execution modes, cancellations, damaged starting sessions and inputs.
//! Every run is checked against the invariants listed at [`check`].
//!
//! Seeded and replayable (current-thread runtime, paused clock): `RANDOM_SEED` sets the base
//! seed (case `i` uses seed `base + i`, so `RANDOM_SEED=<seed> RANDOM_CASES=1` replays one
//! failing case) and `RANDOM_CASES` the number of cases (default 5,000; CI runs the default).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fmt::{Debug, Write as _};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use tower::{ServiceExt, service_fn};
use tower_agent_core::history::validate;
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, CancellationToken, ContentPart, Decisions, Error,
    ErrorKind, Interrupt, Message, ModelRequest, ModelResponse, Outcome, Role, RunContext, Session,
    ToolAction, ToolCall, ToolRequest, ToolResponse, ToolResult, ToolSpec,
};
use tower_agent_loop::Agent;
use tower_agent_test::dump;
use tower_agent_tools::ToolSet;

/// SplitMix64.
#[derive(Default)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// With `percent` chance a delay of up to `max_ms`, else none.
    fn pause(&mut self, percent: u64, max_ms: u64) -> Duration {
        let on = u64::from(self.chance(percent));
        Duration::from_millis(on * (1 + self.below(max_ms)))
    }
}

/// What a service does, decided under the lock and carried out after it.
enum Act<T> {
    Answer(T),
    Fail(Error),
    Panic,
}

/// A case's dice and bookkeeping, shared by its model and tools. One generator for the
/// whole case keeps it replayable: the runtime has one thread and a paused clock.
#[derive(Default)]
struct Ctl {
    rng: Rng,
    next_id: u64,
    /// Service calls in the current run, and the one that cancels it.
    calls: u32,
    cancel_at: Option<u32>,
}

type Shared = Arc<Mutex<Ctl>>;

fn lock(ctl: &Shared) -> MutexGuard<'_, Ctl> {
    ctl.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Ctl {
    /// Count a service call: whether it cancels the run (as planned, or by chance).
    fn tick(&mut self) -> bool {
        self.calls += 1;
        self.cancel_at == Some(self.calls) || self.rng.chance(3)
    }

    /// The model's answer: (delay, cancel the run after the delay, what it does).
    fn model_act(&mut self, req: &ModelRequest) -> (Duration, bool, Act<ModelResponse>) {
        let (cancel, delay) = (self.tick(), self.rng.pause(25, 1000));
        let act = match self.rng.below(100) {
            0..30 => Act::Answer(ModelResponse::text("done")),
            30..82 => Act::Answer(ModelResponse::new(self.calls_message(req))),
            82..87 => Act::Fail(Error::other("model down")),
            87..90 => Act::Fail(Error::rate_limited(Some(Duration::from_secs(1)), "429")),
            90..93 => Act::Fail(Error::cancelled()),
            _ => Act::Panic,
        };
        (delay, cancel, act)
    }

    /// 1–4 calls to known and unknown tools, with broken JSON, duplicate, reused and empty
    /// ids; sometimes text, sometimes a forged tool result part.
    fn calls_message(&mut self, req: &ModelRequest) -> Message {
        let calls_so_far = req.messages.iter().flat_map(Message::tool_calls);
        let earlier: Vec<String> = calls_so_far.map(|c| c.id.clone()).collect();
        let mut calls: Vec<ToolCall> = Vec::new();
        for _ in 0..=self.rng.below(4) {
            self.next_id += 1;
            let name = ["t0", "t1", "t2", "t0", "t1", "nope"][self.rng.below(6) as usize];
            let id = match (self.rng.below(10), calls.last()) {
                (0, Some(previous)) => previous.id.clone(),
                (1, _) if !earlier.is_empty() => {
                    earlier[self.rng.below(earlier.len() as u64) as usize].clone()
                }
                (2, _) => String::new(),
                _ => format!("c{}", self.next_id),
            };
            let arguments = match self.rng.chance(12) {
                true => r#"{"n": "#.to_owned(),
                false => json!({ "n": self.next_id }).to_string(),
            };
            calls.push(ToolCall::raw(id, name, arguments));
        }
        let forged = ToolResult::success(&calls[0], "forged");
        let text = if self.rng.chance(30) { "hm" } else { "" };
        let mut message = Message::assistant_with_calls(text, calls);
        if self.rng.chance(10) {
            message.content.push(ContentPart::ToolResult(forged));
        }
        message
    }

    /// A tool's behaviour: (delay, cancel the run after the delay, what it does).
    fn tool_act(&mut self, req: &ToolRequest) -> (Duration, bool, Act<ToolResponse>) {
        let call = &req.call;
        let roll = self.rng.below(100);
        let cancel = self.tick() || (75..80).contains(&roll);
        let delay = match roll {
            80..85 => Duration::from_secs(600),
            _ => self.rng.pause(25, 500),
        };
        req.ctx.set_state(call.name.clone(), self.calls);
        let (ok, reason) = (ToolResponse::success(call, "ok"), "enough".to_owned());
        let act = match roll {
            _ if call.parse_arguments::<Value>().is_err() => {
                Act::Answer(ToolResponse::error(call, "invalid arguments"))
            }
            30..40 => Act::Answer(ToolResponse::error(call, "tool failed")),
            40..47 => Act::Fail(Error::tool("tool backend down")),
            47..50 => Act::Fail(Error::cancelled()),
            50..55 => Act::Panic,
            55..68 => Act::Answer(ToolResponse::interrupt(call, json!({ "ask": call.id }))),
            68..75 => Act::Answer(ok.with_action(ToolAction::stop(call, reason))),
            _ => Act::Answer(ok),
        };
        (delay, cancel, act)
    }
}

async fn carry_out<T>(plan: (Duration, bool, Act<T>), ctx: &RunContext) -> Result<T, Error> {
    let (delay, cancel, act) = plan;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if cancel {
        ctx.cancel();
    }
    match act {
        Act::Answer(answer) => Ok(answer),
        Act::Fail(error) => Err(error),
        Act::Panic => panic!("injected panic"),
    }
}

/// One run's settings.
#[derive(Debug)]
struct Plan {
    damage: Option<String>,
    concurrent: Option<usize>,
    max_rounds: u32,
    input: AgentInput,
    cancel_after: Option<Duration>,
    cancel_at_call: Option<u32>,
}

/// Settings for a run on `session`, damaged first sometimes (more often on the `first`).
fn plan(rng: &mut Rng, session: &mut Session, first: bool) -> Plan {
    let damage = rng.chance(if first { 50 } else { 25 });
    let damage = damage.then(|| perturb(session, rng));
    let input = match (session.interrupts.is_empty(), rng.below(10)) {
        (false, 0..5) | (true, 0) => {
            AgentInput::Resume(Decisions::all(&session.interrupts, json!("yes")))
        }
        (_, 0..7) => AgentInput::Messages(vec![Message::user("next")]),
        _ => AgentInput::Continue,
    };
    let cancel = rng.below(4);
    Plan {
        damage,
        concurrent: rng.chance(50).then(|| 1 + rng.below(4) as usize),
        max_rounds: 1 + rng.below(6) as u32,
        input,
        cancel_after: (cancel == 0).then(|| Duration::from_millis(rng.below(1500))),
        cancel_at_call: (cancel == 1).then(|| 1 + rng.below(6) as u32),
    }
}

type Run = Result<AgentResponse, Error>;

/// Run once, spawned: `Err` when a panic escapes the agent or the run hangs.
async fn run_agent(ctl: &Shared, plan: &Plan, session: Session) -> Result<Run, String> {
    let shared = Arc::clone(ctl);
    let model = service_fn(move |req: ModelRequest| {
        let act = lock(&shared).model_act(&req);
        async move { carry_out(act, &req.ctx).await }
    });
    let shared = Arc::clone(ctl);
    let tool = service_fn(move |req: ToolRequest| {
        let act = lock(&shared).tool_act(&req);
        async move { carry_out(act, &req.ctx).await }
    });
    let spec = |name| ToolSpec::new(name, "Misbehaves at random.", json!({ "type": "object" }));
    let tools = ToolSet::new().service(spec("t0"), tool.clone());
    let tools = tools
        .service(spec("t1"), tool.clone())
        .service(spec("t2"), tool);
    let builder = Agent::builder().max_rounds(plan.max_rounds);
    let builder = match plan.concurrent {
        Some(limit) => builder.concurrent_tools(limit),
        None => builder.sequential_tools(),
    };
    let agent = builder.tool_specs(tools.specs()).build(model, tools);
    let token = CancellationToken::new();
    let timer = plan.cancel_after.map(|delay| {
        let token = token.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            token.cancel();
        })
    });
    {
        let mut c = lock(ctl);
        (c.calls, c.cancel_at) = (0, plan.cancel_at_call);
    }
    let request = AgentRequest::new(session, plan.input.clone()).with_cancellation(token);
    let mut handle = tokio::spawn(agent.oneshot(request));
    let joined = tokio::time::timeout(Duration::from_secs(86_400), &mut handle).await;
    if let Some(timer) = timer {
        timer.abort();
    }
    handle.abort();
    match joined {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(error)) => Err(format!("the run's task failed: {error}")),
        Err(_) => Err("the run did not finish within a day of paused time".to_owned()),
    }
}

/// Damage a session as a crash or a careless host would: unanswered calls of the last
/// assistant message, pending interrupts (some stale, mismatched or duplicated), a user
/// message after the calls. Returns what it did.
fn perturb(session: &mut Session, rng: &mut Rng) -> String {
    let mut notes = Vec::new();
    session.interrupts.clear();
    // Calls already open are cut to, never buried under a new assistant message.
    let dangling = !open_calls(&session.history).is_empty();
    let messages = session.history.make_mut();
    match messages.iter().rposition(Message::has_tool_calls) {
        Some(at) if dangling || rng.chance(70) => {
            let tail = messages[at + 1..].iter();
            let tail = tail.take_while(|m| m.role == Role::Tool);
            let kept: Vec<Message> = tail.filter(|_| rng.chance(40)).cloned().collect();
            messages.truncate(at + 1);
            messages.extend(kept);
            notes.push("cut after a call message");
        }
        _ => {
            let tag = rng.below(1_000_000);
            let ids = (0..=rng.below(2)).map(|j| format!("d{tag}_{j}"));
            let calls = ids.map(|id| ToolCall::new(id, "t1", json!({})));
            messages.push(Message::user("checkpoint"));
            messages.push(Message::assistant_with_calls("", calls));
            notes.push("dangling calls appended");
        }
    }
    for call in open_calls(&session.history) {
        if rng.chance(50) {
            let (call, payload) = (call.clone(), json!("approve?"));
            session.interrupts.push(Interrupt::new(call, payload));
        }
    }
    let first = session.interrupts.first().cloned();
    if let (Some(mut interrupt), true) = (first.clone(), rng.chance(10)) {
        interrupt.call.arguments = r#"{"n":-1}"#.into();
        session.interrupts[0] = interrupt;
        notes.push("mismatched interrupt");
    }
    if rng.chance(8) {
        let (call, payload) = (ToolCall::new("ghost", "t0", json!({})), Value::Null);
        session.interrupts.push(Interrupt::new(call, payload));
        notes.push("stale interrupt");
    }
    if let (Some(interrupt), true) = (first, rng.chance(8)) {
        session.interrupts.push(interrupt);
        notes.push("duplicate interrupt");
    }
    if rng.chance(25) {
        session.history.push(Message::user("meanwhile"));
        notes.push("user message after the calls");
    }
    notes.join(", ")
}

/// The calls of the last assistant message without a result after it.
fn open_calls(history: &[Message]) -> Vec<&ToolCall> {
    let Some(at) = history.iter().rposition(|m| m.role == Role::Assistant) else {
        return Vec::new();
    };
    let results = history[at + 1..].iter().flat_map(Message::tool_results);
    let answered: Vec<&str> = results.map(|r| r.call_id.as_str()).collect();
    let calls = history[at].tool_calls();
    calls.filter(|c| !answered.contains(&&*c.id)).collect()
}

/// Whether the input fits the session: for `Continue` and `Resume`, every pending interrupt
/// is, once, exactly an open call of the last assistant message; `Resume` needs one. `None`
/// (the loop may refuse or repair) when, besides, a message follows the open calls.
fn fits(session: &Session, input: &AgentInput) -> Option<bool> {
    let (open, pending) = (open_calls(&session.history), &session.interrupts);
    let sound = pending.iter().enumerate().all(|(i, interrupt)| {
        let twice = pending[..i].iter().any(|p| p.call.id == interrupt.call.id);
        open.contains(&&interrupt.call) && !twice
    });
    let after = session
        .history
        .iter()
        .rev()
        .take_while(|m| m.role != Role::Assistant);
    let late = !open.is_empty() && after.into_iter().any(|m| m.role != Role::Tool);
    match input {
        AgentInput::Continue if !sound => Some(false),
        // Nothing to continue: refused before any model call.
        AgentInput::Continue if session.history.is_empty() && pending.is_empty() => Some(false),
        AgentInput::Resume(_) if !sound || pending.is_empty() => Some(false),
        AgentInput::Continue | AgentInput::Resume(_) if late => None,
        _ => Some(true),
    }
}

/// The variant name in a value's `Debug` output.
fn variant(value: &impl Debug) -> String {
    let text = format!("{value:?}");
    text.split([' ', '(']).next().unwrap_or_default().to_owned()
}

fn describe(session: &Session) -> String {
    let calls = session.interrupts.iter().map(|i| &i.call);
    let pending: Vec<String> = calls.map(|c| format!("{}{}", c.id, c.arguments)).collect();
    format!("{}  interrupts: {pending:?}\n", dump(&session.history))
}

type Failure = (String, String);

/// The invariants of one run from `start`, in the order checked:
/// 1. no panic escapes the agent, and the run ends;
/// 2. every `Err` carries the session;
/// 5. the session round-trips through serde_json;
/// 7. a refused input (`BadRequest`) leaves the session exactly as it was;
/// 3. otherwise the history is valid, calls pending in `session.interrupts` aside;
/// 4. otherwise every starting message is still there, and all but tool results in the same
///    order (the loop may put the results answering one message in call order);
/// 9. an interrupted outcome's interrupts are the session's; no other outcome leaves any;
/// 8. the input is refused exactly when it does not fit the session (see [`fits`]).
///
/// 6 (follow-up runs hold the same) is checked by the chain of runs in [`run_case`].
fn check(start: &Session, plan: &Plan, run: &Result<Run, String>) -> Result<(), Failure> {
    let input = &plan.input;
    // Damaged now, or still carrying damage a refused run left.
    let pending: Vec<&str> = start.interrupts.iter().map(|i| &*i.call.id).collect();
    let sound = validate(&start.history, &pending).is_ok()
        && fits(start, &AgentInput::Continue) == Some(true);
    let damaged = match plan.damage.is_some() || !sound {
        true => "a damaged",
        false => "an intact",
    };
    let fail = |invariant: &str, text: String| {
        let key = format!(
            "invariant {invariant} on {}, {damaged} session",
            variant(input)
        );
        Err((key, text))
    };
    let result = match run {
        Ok(result) => result,
        Err(escaped) => return fail("1 (no panic escapes)", escaped.clone()),
    };
    let session = match result.as_ref().map_err(Error::session) {
        Ok(res) => &res.session,
        Err(Some(session)) => session,
        Err(None) => return fail("2 (Err carries the session)", String::new()),
    };
    let text = serde_json::to_string(session).unwrap();
    if serde_json::from_str::<Session>(&text).unwrap() != *session {
        return fail("5 (serde round trip)", text);
    }
    let refused = matches!(result, Err(e) if e.kind() == ErrorKind::BadRequest);
    if refused && session != start {
        return fail("7 (refused input left as it was)", String::new());
    }
    if !refused {
        let pending: Vec<&str> = session.interrupts.iter().map(|i| &*i.call.id).collect();
        if let Err(error) = validate(&session.history, &pending) {
            let invariant = format!("3 (valid history: {})", variant(&error));
            return fail(&invariant, error.to_string());
        }
        let (before, after) = (start.history.iter(), session.history.iter());
        let not_tool = |m: &&Message| m.role != Role::Tool;
        let mut rest = after.filter(not_tool);
        let ordered = before.filter(not_tool).all(|m| rest.any(|r| r == m));
        if !ordered || !start.history.iter().all(|m| session.history.contains(m)) {
            return fail("4 (starting messages kept)", String::new());
        }
    }
    if let Ok(res) = result {
        let expected: &[Interrupt] = match &res.outcome {
            Outcome::Interrupted { interrupts } => interrupts,
            _ => &[],
        };
        if session.interrupts != expected {
            return fail("9 (interrupts match the outcome)", variant(&res.outcome));
        }
    }
    if fits(start, input) == Some(refused) {
        let text = format!("refused: {refused}");
        return fail("8 (refused iff the input does not fit)", text);
    }
    Ok(())
}

/// One case: two to four runs, each on the session the previous run left (sometimes damaged
/// first), starting from an empty one.
async fn run_case(seed: u64) -> Result<(), Failure> {
    let ctl = Shared::default();
    lock(&ctl).rng = Rng(seed);
    let mut session = Session::with_id(format!("case-{seed}"));
    session.state.insert("seed".into(), json!(seed));
    let mut trace = format!("seed {seed}\n");
    let runs = 2 + lock(&ctl).rng.below(3);
    for run in 0..runs {
        let plan = plan(&mut lock(&ctl).rng, &mut session, run == 0);
        let _ = write!(
            trace,
            "run {run}: {plan:?}\n start:\n{}",
            describe(&session)
        );
        let start = session.clone();
        let result = run_agent(&ctl, &plan, session).await;
        let (outcome, end) = match &result {
            Ok(Ok(res)) => (variant(&res.outcome), Some(&res.session)),
            Ok(Err(error)) => (format!("Err({error})"), error.session()),
            Err(escaped) => (escaped.clone(), None),
        };
        let end = end.map(describe).unwrap_or_default();
        let _ = writeln!(trace, " result: {outcome}\n end:\n{end}");
        check(&start, &plan, &result).map_err(|(key, text)| (key, trace.clone() + &text))?;
        session = match result {
            Ok(Ok(res)) => res.session,
            Ok(Err(mut error)) => error.take_session().unwrap(),
            Err(_) => unreachable!("checked"),
        };
    }
    Ok(())
}

fn env_number(name: &str, default: u64) -> u64 {
    let parse = |text: String| text.trim().parse().expect(name);
    std::env::var(name).map_or(default, parse)
}

/// Keep the output readable: the injected panics are expected.
fn silence_injected_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<&str>() != Some(&"injected panic") {
            default(info);
        }
    }));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn random_faults_keep_sessions_valid() {
    silence_injected_panics();
    let base = env_number("RANDOM_SEED", 1_592_590_336);
    let cases = env_number("RANDOM_CASES", 5000);
    // Distinct failures: their seeds, and the first one's report.
    let mut failures: BTreeMap<String, (Vec<u64>, String)> = BTreeMap::new();
    for seed in (0..cases).map(|i| base.wrapping_add(i)) {
        if let Err((key, text)) = run_case(seed).await {
            let (seeds, _) = failures.entry(key).or_insert((Vec::new(), text));
            seeds.push(seed);
        }
    }
    if failures.is_empty() {
        return;
    }
    let failed: usize = failures.values().map(|(seeds, _)| seeds.len()).sum();
    let mut report = format!("{failed} of {cases} cases failed (base seed {base}); ");
    report.push_str("replay one with RANDOM_SEED=<seed> RANDOM_CASES=1\n");
    for (key, (seeds, _)) in &failures {
        let some = &seeds[..seeds.len().min(8)];
        let _ = writeln!(report, "- {key}: {} cases, seeds {some:?}", seeds.len());
    }
    for (key, (_, text)) in &failures {
        let _ = writeln!(report, "\n=== {key}, first case:\n{text}");
    }
    panic!("{report}");
}
