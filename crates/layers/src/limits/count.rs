//! What the limits count: per run in the run context, per session in the session state.

use crate::by_name::ByName;
use std::sync::{Arc, Mutex, PoisonError};

use std::collections::BTreeMap;

use tower_agent_core::{
    Error, ErrorKind, ExtensionKey, ModelResponse, RunContext, StopReason, Tentative,
};

use super::{Exit, Limit, STATE_KEY};

/// One limited scope: a limit and where its counts are.
#[derive(Debug, Clone)]
pub(super) struct Scope {
    /// In words, without "per run": `model calls`, `tool calls`, `` `search` calls ``.
    pub(super) name: String,
    /// The key of its session count.
    pub(super) key: String,
    pub(super) limit: Limit,
    /// Its index in the run counts.
    pub(super) slot: usize,
}

/// Which limit blocked a call.
pub(super) struct Blocked<'a> {
    pub(super) scope: &'a Scope,
    pub(super) limit: u32,
    pub(super) per: &'static str,
}

impl Blocked<'_> {
    pub(super) fn name(&self) -> String {
        format!("{} per {}", self.scope.name, self.per)
    }

    pub(super) fn reason(&self) -> StopReason {
        StopReason::Limit {
            name: self.name(),
            limit: self.limit,
        }
    }

    pub(super) fn message(&self) -> String {
        format!(
            "not executed: the limit of {} {} was reached; do not call it again in this {}",
            self.limit,
            self.name(),
            self.per
        )
    }

    pub(super) fn error(&self) -> Error {
        Error::new(
            ErrorKind::LimitReached,
            format!("the limit of {} {} was reached", self.limit, self.name()),
        )
    }
}

#[derive(Debug, Clone)]
pub(super) struct Config {
    /// Where this layer keeps its run counts in the run's extensions.
    pub(super) runs: ExtensionKey<RunCounts>,
    pub(super) model: Option<Scope>,
    pub(super) tools: Option<Scope>,
    pub(super) per_tool: ByName<Scope>,
    /// Whether a tool scope fails the run: the model side then checks the calls it asks for.
    pub(super) tool_errors: bool,
    pub(super) slots: usize,
}

/// One layer's run counts, one per scope slot, in the run context, and the calls it counted
/// that started early (the loop may yet discard them).
#[derive(Debug, Clone, Default)]
pub(super) struct RunCounts(Arc<Mutex<Counts>>);

#[derive(Debug, Default)]
pub(super) struct Counts {
    slots: Vec<u32>,
    early: Vec<String>,
}

/// What [`Config::admit`] is asked.
pub(super) enum Ask<'c> {
    /// One call, counted in each scope when none blocks; with its id and its [`Tentative`]
    /// when it started early (given back if the loop discards it).
    Call(Option<(&'c str, &'c Tentative)>),
    /// The calls of a model's message, by id and the index of each scope they count in: only
    /// checked (the model side's check against limits that fail the run). A call that
    /// started early is counted already.
    Check(&'c [(&'c str, usize)]),
}

impl Config {
    /// Check the scopes and, when none blocks, count the call in each (one step, so
    /// concurrent calls cannot both take the last one).
    pub(super) fn admit<'a>(
        &'a self,
        ctx: &RunContext,
        scopes: &[&'a Scope],
        ask: Ask<'_>,
    ) -> Result<(), Blocked<'a>> {
        if scopes.is_empty() {
            return Ok(());
        }
        let runs = ctx.extension_at_or_insert_with(&self.runs, RunCounts::default);
        let mut counts = runs.0.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.slots.len() < self.slots {
            counts.slots.resize(self.slots, 0);
        }
        let mut asked = vec![1; scopes.len()];
        if let Ask::Check(calls) = &ask {
            asked.fill(0);
            for (id, scope) in calls.iter() {
                if !counts.early.iter().any(|early| early == id) {
                    asked[*scope] += 1;
                }
            }
        }
        let counting = matches!(ask, Ask::Call(_));
        let check = |saved: Option<&BTreeMap<String, u32>>| {
            for (index, scope) in scopes.iter().enumerate() {
                let asked = asked[index];
                let per_run = scope
                    .limit
                    .run
                    .map(|limit| (limit, counts.slots[scope.slot], "run"));
                let per_session = scope.limit.session.zip(saved).map(|(limit, saved)| {
                    let count = saved.get(&scope.key).copied().unwrap_or(0);
                    (limit, count, "session")
                });
                for (limit, count, per) in per_run.into_iter().chain(per_session) {
                    if count.saturating_add(asked) > limit {
                        return Err(Blocked { scope, limit, per });
                    }
                }
            }
            Ok(())
        };
        if !scopes.iter().any(|s| s.limit.session.is_some()) {
            // Run limits only: the session's state is not touched.
            check(None)?;
        } else {
            // Counts that cannot be read (a host wrote something else there) start again.
            ctx.update_or_reset(&STATE_KEY, |saved| {
                check(Some(saved))?;
                if counting {
                    for scope in scopes.iter().filter(|s| s.limit.session.is_some()) {
                        *saved.entry(scope.key.clone()).or_default() += 1;
                    }
                }
                Ok(())
            })?;
        }
        if counting {
            for scope in scopes {
                counts.slots[scope.slot] += 1;
            }
        }
        if let Ask::Call(Some((id, tentative))) = ask {
            counts.early.push(id.to_owned());
            // Not under the lock: a call discarded already gives back at once, which locks.
            drop(counts);
            let slots: Vec<usize> = scopes.iter().map(|s| s.slot).collect();
            let keys: Vec<String> = scopes
                .iter()
                .filter(|s| s.limit.session.is_some())
                .map(|s| s.key.clone())
                .collect();
            let (runs, ctx, id) = (runs.clone(), ctx.clone(), id.to_owned());
            tentative.on_discard(move || give_back(&runs, &ctx, &slots, &keys, &id));
        }
        Ok(())
    }

    /// Give back the model call counted last: the layers further in refused it
    /// ([`ModelResponse::refused`]), so it ran to no answer.
    pub(super) fn give_back_model_call(&self, ctx: &RunContext) {
        let Some(scope) = &self.model else {
            return;
        };
        let runs = ctx.extension_at_or_insert_with(&self.runs, RunCounts::default);
        let keys: Vec<String> = match scope.limit.session {
            Some(_) => vec![scope.key.clone()],
            None => Vec::new(),
        };
        give_back(&runs, ctx, &[scope.slot], &keys, "");
    }

    /// Give back a call of `tool` counted in this run: it paused, so it did not run (it
    /// counts when it resumes). `early`: its id if it started early (given back once).
    pub(super) fn give_back_tool_call(&self, ctx: &RunContext, tool: &str, early: &str) {
        let scopes: Vec<&Scope> = self.tool_scopes(tool).into_iter().flatten().collect();
        let runs = ctx.extension_at_or_insert_with(&self.runs, RunCounts::default);
        let slots: Vec<usize> = scopes.iter().map(|s| s.slot).collect();
        let keys: Vec<String> = scopes
            .iter()
            .filter(|s| s.limit.session.is_some())
            .map(|s| s.key.clone())
            .collect();
        give_back(&runs, ctx, &slots, &keys, early);
    }

    /// The global tool scope and the tool's own, when set.
    pub(super) fn tool_scopes(&self, tool: &str) -> [Option<&Scope>; 2] {
        let own = self.per_tool.get(tool);
        [self.tools.as_ref(), own]
    }
}

/// The model side's check of the calls a message asks for, against limits that fail the run.
pub(super) fn check_calls(
    config: &Config,
    ctx: &RunContext,
    response: &ModelResponse,
) -> Result<(), Error> {
    let mut scopes: Vec<&Scope> = Vec::new();
    let mut calls: Vec<(&str, usize)> = Vec::new();
    for call in response.message.tool_calls() {
        for scope in config.tool_scopes(&call.name).into_iter().flatten() {
            if scope.limit.exit != Exit::Error {
                continue;
            }
            let index = match scopes.iter().position(|s| std::ptr::eq(*s, scope)) {
                Some(index) => index,
                None => {
                    scopes.push(scope);
                    scopes.len() - 1
                }
            };
            calls.push((&call.id, index));
        }
    }
    config
        .admit(ctx, &scopes, Ask::Check(&calls))
        .map_err(|blocked| blocked.error())
}

/// Give back what was counted for a call that did not run (an early call the loop discarded,
/// a call that paused, a model call refused further in); `id`: the call's, if it started
/// early.
fn give_back(runs: &RunCounts, ctx: &RunContext, slots: &[usize], keys: &[String], id: &str) {
    let mut counts = runs.0.lock().unwrap_or_else(PoisonError::into_inner);
    // An early call is given back once (it paused, or the loop discarded it).
    if !id.is_empty() {
        let Some(at) = counts.early.iter().position(|early| early == id) else {
            return;
        };
        counts.early.swap_remove(at);
    }
    for slot in slots {
        counts.slots[*slot] = counts.slots[*slot].saturating_sub(1);
    }
    drop(counts);
    if !keys.is_empty() {
        ctx.update_or_reset(&STATE_KEY, |saved| {
            for key in keys {
                if let Some(count) = saved.get_mut(key) {
                    *count = count.saturating_sub(1);
                }
            }
        });
    }
}
