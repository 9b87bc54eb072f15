//! What a server sends unasked: progress of a call, a changed tool list.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use rmcp::model::{
    ClientCapabilities, ClientInfo, Implementation, ProgressNotificationParam, ProgressToken,
};
use rmcp::service::NotificationContext;
use rmcp::{ClientHandler, RoleClient};
use tower_agent_core::{Event, RunContext, ToolCall};

use crate::Inner;

/// The client side of one connection.
pub(crate) struct Handler {
    pub(crate) inner: Weak<Inner>,
    pub(crate) index: usize,
    pub(crate) progress: Arc<Progress>,
}

impl ClientHandler for Handler {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Some((ctx, event)) = self.progress.event(params) {
            // An observer's error is the run's to see: the call's result carries on.
            let _ = ctx.emit(event).await;
        }
    }

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let conn = Arc::clone(&inner.servers[self.index]);
        if let Err(error) = conn.list(&inner, &context.peer).await {
            tracing::warn!(server = conn.name(), %error, "MCP tools not listed again");
        }
    }

    fn get_info(&self) -> ClientInfo {
        ClientInfo::new(
            ClientCapabilities::default(),
            Implementation::new("tower-agent", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// The calls waiting for their result, by progress token: where their progress goes.
#[derive(Default)]
pub(crate) struct Progress {
    calls: Mutex<Calls>,
}

#[derive(Default)]
struct Calls {
    watched: HashMap<ProgressToken, Watched>,
    /// Progress that came before its call was watched (the server can be that quick).
    early: Vec<ProgressNotificationParam>,
}

struct Watched {
    ctx: RunContext,
    call_id: String,
    name: String,
}

/// The most progress notifications kept for calls not watched yet.
const EARLY: usize = 64;

impl Progress {
    /// Send `token`'s progress to `ctx` as events of `call` until the guard drops. Returns the
    /// progress that came before, to send at once.
    pub(crate) fn watch(
        self: &Arc<Self>,
        token: ProgressToken,
        ctx: &RunContext,
        call: &ToolCall,
    ) -> (Watch, Vec<Event>) {
        let mut calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        let watched = Watched {
            ctx: ctx.clone(),
            call_id: call.id.clone(),
            name: call.name.clone(),
        };
        let mut early = Vec::new();
        calls.early.retain(|params| {
            if params.progress_token == token {
                early.push(watched.event(params.clone()));
                false
            } else {
                true
            }
        });
        calls.watched.insert(token.clone(), watched);
        let guard = Watch {
            progress: Arc::clone(self),
            token,
        };
        (guard, early)
    }

    fn event(&self, params: ProgressNotificationParam) -> Option<(RunContext, Event)> {
        let mut calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        match calls.watched.get(&params.progress_token) {
            Some(watched) => Some((watched.ctx.clone(), watched.event(params))),
            None => {
                if calls.early.len() == EARLY {
                    calls.early.remove(0);
                }
                calls.early.push(params);
                None
            }
        }
    }
}

impl Watched {
    fn event(&self, params: ProgressNotificationParam) -> Event {
        Event::ToolProgress {
            round: self.ctx.round(),
            call_id: self.call_id.clone(),
            name: self.name.clone(),
            progress: params.progress,
            total: params.total,
            message: params.message,
        }
    }
}

/// Stops watching a call's progress when dropped.
pub(crate) struct Watch {
    progress: Arc<Progress>,
    token: ProgressToken,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut calls = self
            .progress
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        calls.watched.remove(&self.token);
    }
}
