//! The summary task of one run: wakes on the timer or the event count, asks the summarizer,
//! delivers the line. Runs beside the run, never in its way.

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tower_agent_core::{
    CancellationToken, Event, EventSink, Message, ModelRequest, ModelResponse, RunContext,
};

use super::digest::Digest;
use super::{Config, SOURCE};

/// What the task of one run needs.
pub(super) struct Summaries {
    pub(super) config: Arc<Config>,
    pub(super) digest: Arc<Digest>,
    /// The run's sink and token, not its context: holding a clone of the context would make
    /// every inner layer that adds an observer copy the run's state.
    pub(super) events: EventSink,
    pub(super) token: CancellationToken,
    pub(super) session_id: Arc<str>,
}

impl Summaries {
    /// Summarize until the run is cancelled (or the task aborted when the run ends). One
    /// summary at a time: events that come meanwhile wait for the next one.
    async fn run(self) {
        let every = (!self.config.every.is_zero()).then_some(self.config.every);
        let mut deadline = every.map(|every| Instant::now() + every);
        loop {
            let timer = async {
                match deadline {
                    Some(deadline) => sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            let by_time = tokio::select! {
                () = self.token.cancelled() => return,
                () = timer => true,
                () = self.digest.notified() => false,
            };
            if !by_time && !self.digest.due_by_count() {
                continue; // a permit left by lines an earlier summary took
            }
            deadline = every.map(|every| Instant::now() + every);
            let Some(input) = self.digest.take() else {
                continue;
            };
            let answer = tokio::select! {
                () = self.token.cancelled() => return,
                answer = self.summarize(input) => answer,
            };
            self.deliver(answer).await;
        }
    }

    /// Ask the summarizer, with a context of its own (its events are not the run's) that the
    /// run's cancellation reaches.
    async fn summarize(&self, input: String) -> Result<ModelResponse, tower_agent_core::Error> {
        let mut request = ModelRequest::new(vec![Message::user(input)]);
        request.system = Some(Arc::clone(&self.config.prompt));
        request.ctx = RunContext::new()
            .with_session_id(Arc::clone(&self.session_id))
            .with_cancellation(self.token.child_token());
        self.config.summarizer.ask(request).await
    }

    async fn deliver(&self, answer: Result<ModelResponse, tower_agent_core::Error>) {
        if self.digest.ended() || self.token.is_cancelled() {
            return;
        }
        let text = answer.map(|response| response.message.text());
        let summary = match &text {
            Ok(text) => text.lines().map(str::trim).find(|line| !line.is_empty()),
            Err(_) => None,
        };
        let event = if let Some(summary) = summary {
            self.digest.remember(summary);
            if let Some(on_summary) = &self.config.on_summary {
                on_summary(summary);
            }
            Event::layer(crate::events::ProgressSummary {
                summary: summary.to_owned(),
            })
        } else {
            let message = match &text {
                Err(error) => format!("the progress summary failed: {error}"),
                Ok(_) => "the progress summarizer answered with no text".to_owned(),
            };
            tracing::warn!(target: "tower_agent::progress", "{message}");
            Event::Warning {
                source: SOURCE,
                message,
            }
        };
        // An observer refusing a summary does not concern the run.
        if let Err(error) = self.events.emit_until_cancelled(event, &self.token).await {
            tracing::warn!(target: "tower_agent::progress", %error, "an observer refused a progress event");
        }
    }
}

/// The task of one run; aborted when dropped, so a run dropped midway stops it too.
pub(super) struct Background(Option<JoinHandle<()>>);

impl Background {
    /// Spawn the task on the current runtime; without one, the run goes on without summaries.
    pub(super) fn spawn(summaries: Summaries) -> Self {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => Self(Some(runtime.spawn(summaries.run()))),
            Err(_) => {
                tracing::warn!(
                    target: "tower_agent::progress",
                    "no tokio runtime: the run goes on without progress summaries"
                );
                Self(None)
            }
        }
    }

    /// Abort the task, a summarizer call in flight with it, and wait until it is gone: it
    /// stops at its next await point, so no summary comes after this returns.
    pub(super) async fn stop(mut self) {
        if let Some(handle) = self.0.take() {
            handle.abort();
            if let Err(error) = handle.await {
                if error.is_panic() {
                    tracing::warn!(target: "tower_agent::progress", "the progress task panicked (in `on_summary`?)");
                }
            }
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(handle) = &self.0 {
            handle.abort();
        }
    }
}
