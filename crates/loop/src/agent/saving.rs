//! Where a run saves: the request's saver, what it wrote last, and the saves the run's tool
//! calls ask for while they run (a sub-agent's steps), served between the run's own saves.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedReceiver;
use tower_agent_core::{Error, RunContext, RunSaves, SaveReply, Saver, Session};

use crate::SessionMark;

/// A run's saves.
pub(super) struct Saving {
    /// Where the run saves its session (the request's saver).
    saver: Option<Arc<dyn Saver>>,
    /// What the last save wrote: a save of the same session writes nothing. Boxed: it is
    /// there only in runs that save, and every run carries its place.
    saved: Option<Box<SessionMark>>,
    /// A save failed: the run ends without saving again.
    pub(super) failed: bool,
    /// The handle the run's tool calls get, and the saves they ask for.
    calls: Option<(RunSaves, UnboundedReceiver<SaveReply>)>,
}

impl Saving {
    pub(super) fn new(saver: Option<Arc<dyn Saver>>) -> Self {
        Self {
            calls: saver.as_ref().map(|_| RunSaves::channel()),
            saver,
            saved: None,
            failed: false,
        }
    }

    /// Whether the run saves at all.
    pub(super) fn is_on(&self) -> bool {
        self.saver.is_some()
    }

    /// Put the handle calls ask for saves with in the run's context ([`RunSaves::of`]).
    pub(super) fn offer(&self, ctx: &RunContext) {
        if let Some((saves, _)) = &self.calls {
            ctx.insert_extension(saves.clone());
        }
    }

    /// Save the session as it stands (its history, the run's state, the interrupts it waits
    /// on), unless the last save wrote the same.
    pub(super) async fn save(&mut self, session: &Session, ctx: &RunContext) -> Result<(), Error> {
        let Some(saver) = &self.saver else {
            return Ok(());
        };
        let session = Session {
            id: session.id.clone(),
            history: session.history.clone(),
            state: ctx.state_snapshot(),
            interrupts: session.interrupts.clone(),
            started: session.started.clone(),
        };
        if self.saved.as_ref().is_some_and(|saved| saved.is(&session)) {
            return Ok(());
        }
        match saver.save(&session).await {
            Ok(()) => {
                self.saved = Some(Box::new(SessionMark::of(&session)));
                Ok(())
            }
            Err(error) => {
                self.failed = true;
                Err(error)
            }
        }
    }

    /// A save a tool call asked for: the session as it stands, unless an earlier save failed
    /// (the run is ending unsaved).
    pub(super) async fn serve(&mut self, reply: SaveReply, session: &Session, ctx: &RunContext) {
        let saved = if self.failed {
            Err(Error::backend("an earlier save of the run failed"))
        } else {
            self.save(session, ctx).await
        };
        // The call may have ended meanwhile.
        let _ = reply.send(saved);
    }

    /// Wait for `running` (a tool call) while serving the saves it asks for through `asks`
    /// (taken with [`Saving::take_asks`], given back here).
    pub(super) async fn serving<F: Future>(
        &mut self,
        asks: (RunSaves, UnboundedReceiver<SaveReply>),
        session: &Session,
        ctx: &RunContext,
        running: F,
    ) -> F::Output {
        let (saves, mut asked) = asks;
        let mut running = std::pin::pin!(running);
        let out = loop {
            tokio::select! {
                out = &mut running => break out,
                Some(reply) = asked.recv() => self.serve(reply, session, ctx).await,
            }
        };
        self.calls = Some((saves, asked));
        out
    }

    /// Take the receiver of the saves calls ask for, to serve them in a loop of the caller's
    /// ([`Saving::serve`]); give it back with [`Saving::put_back`].
    pub(super) fn take_asks(&mut self) -> Option<(RunSaves, UnboundedReceiver<SaveReply>)> {
        self.calls.take()
    }

    /// Give back what [`Saving::take_asks`] took.
    pub(super) fn put_back(&mut self, calls: Option<(RunSaves, UnboundedReceiver<SaveReply>)>) {
        if calls.is_some() {
            self.calls = calls;
        }
    }
}
