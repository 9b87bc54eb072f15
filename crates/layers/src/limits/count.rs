//! What the limits count: per run in the run context, per session in the session state.

use crate::by_name::ByName;
use std::sync::{Arc, Mutex, PoisonError};

use std::collections::BTreeMap;

use tower_agent_core::{Error, ErrorKind, ExtensionKey, ModelResponse, RunContext, StopReason};

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

/// One layer's run counts, one per scope slot, in the run context.
#[derive(Debug, Clone, Default)]
pub(super) struct RunCounts(Arc<Mutex<Vec<u32>>>);

impl Config {
    /// Check the scopes and, when none blocks, count the call in each (one step, so
    /// concurrent calls cannot both take the last one). `extra`: calls asked for at once (the
    /// model side's check of a message's calls), only checked.
    pub(super) fn admit<'a>(
        &'a self,
        ctx: &RunContext,
        scopes: &[&'a Scope],
        extra: Option<&[u32]>,
    ) -> Result<(), Blocked<'a>> {
        if scopes.is_empty() {
            return Ok(());
        }
        let runs = ctx.extension_at_or_insert_with(&self.runs, RunCounts::default);
        let mut counts = runs.0.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.len() < self.slots {
            counts.resize(self.slots, 0);
        }
        let check = |saved: Option<&BTreeMap<String, u32>>| {
            for (index, scope) in scopes.iter().enumerate() {
                let asked = extra.map_or(1, |extra| extra[index]);
                let per_run = scope
                    .limit
                    .run
                    .map(|limit| (limit, counts[scope.slot], "run"));
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
                if extra.is_none() {
                    for scope in scopes.iter().filter(|s| s.limit.session.is_some()) {
                        *saved.entry(scope.key.clone()).or_default() += 1;
                    }
                }
                Ok(())
            })?;
        }
        if extra.is_none() {
            for scope in scopes {
                counts[scope.slot] += 1;
            }
        }
        Ok(())
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
    let mut asked: Vec<u32> = Vec::new();
    for call in response.message.tool_calls() {
        for scope in config.tool_scopes(&call.name).into_iter().flatten() {
            if scope.limit.exit != Exit::Error {
                continue;
            }
            match scopes.iter().position(|s| std::ptr::eq(*s, scope)) {
                Some(index) => asked[index] += 1,
                None => {
                    scopes.push(scope);
                    asked.push(1);
                }
            }
        }
    }
    config
        .admit(ctx, &scopes, Some(&asked))
        .map_err(|blocked| blocked.error())
}
