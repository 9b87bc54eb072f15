//! The digest of a run: one short line per event that says what the agent does, in a bounded
//! buffer that the run's observer fills and the summary task reads.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::events::ProgressSummary;
use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{Error, Event, Observer};

/// The longest text of a model message kept in a line, in characters.
const MAX_TEXT: usize = 160;

/// The lines of one run, and what the summary task needs to know about them.
pub(super) struct Digest {
    state: Mutex<State>,
    /// Woken when `every_events` new lines have come since the last summary.
    due: Notify,
    max_lines: usize,
    every_events: usize,
}

#[derive(Default)]
struct State {
    lines: VecDeque<String>,
    /// Lines dropped from the front to keep `max_lines`.
    omitted: usize,
    /// Lines since the last summary was asked for.
    fresh: usize,
    /// The last summary, given to the next one for continuity.
    last: Option<String>,
    /// The run's own `RunFinished` / `RunFailed` was seen.
    ended: bool,
}

impl Digest {
    /// A digest keeping the last `max_lines` lines (at least one), due every `every_events`
    /// lines (0: never by count).
    pub(super) fn new(max_lines: usize, every_events: usize) -> Self {
        Self {
            state: Mutex::default(),
            due: Notify::new(),
            max_lines: max_lines.max(1),
            every_events,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Take `event` in: a line when it says what the agent does. Never waits.
    pub(super) fn record(&self, event: &Event) {
        if matches!(event, Event::RunFinished { .. } | Event::RunFailed { .. }) {
            self.lock().ended = true;
            return;
        }
        let Some(line) = line(event) else { return };
        let due = {
            let mut state = self.lock();
            state.lines.push_back(line);
            if state.lines.len() > self.max_lines {
                state.lines.pop_front();
                state.omitted += 1;
            }
            state.fresh += 1;
            self.every_events > 0 && state.fresh >= self.every_events
        };
        if due {
            // Stores a permit when the task is busy summarizing: it looks again after.
            self.due.notify_one();
        }
    }

    /// Resolves when enough new lines came (possibly stale: check [`Digest::due_by_count`]).
    pub(super) fn notified(&self) -> Notified<'_> {
        self.due.notified()
    }

    /// Whether `every_events` lines came since the last summary was asked for.
    pub(super) fn due_by_count(&self) -> bool {
        self.every_events > 0 && self.lock().fresh >= self.every_events
    }

    /// Whether the run's last event was seen.
    pub(super) fn ended(&self) -> bool {
        self.lock().ended
    }

    /// The summarizer's input, if anything happened since the last summary was asked for;
    /// the lines since then count as summarized from now on (also if the summary fails).
    pub(super) fn take(&self) -> Option<String> {
        let mut state = self.lock();
        if state.fresh == 0 || state.ended {
            return None;
        }
        state.fresh = 0;
        let mut text = String::from("The run's events, oldest first");
        if state.omitted > 0 {
            let _ = write!(text, " ({} earlier ones omitted)", state.omitted);
        }
        text.push_str(":\n");
        for line in &state.lines {
            let _ = writeln!(text, "- {line}");
        }
        if let Some(last) = &state.last {
            let _ = write!(text, "\nThe last progress line was: {last}");
        }
        Some(text)
    }

    /// Remember the summary just delivered.
    pub(super) fn remember(&self, summary: &str) {
        self.lock().last = Some(summary.to_owned());
    }
}

/// The observer that feeds a [`Digest`]: returns at once, never awaits anything.
pub(super) struct Collect(pub(super) Arc<Digest>);

impl Observer for Collect {
    fn on_event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), Error>> {
        self.0.record(event);
        Box::pin(std::future::ready(Ok(())))
    }
}

/// The digest line of `event`, with the path of a nested agent in brackets; `None` for events
/// that say nothing about the work (deltas, snapshots, summaries, the run's bounds).
fn line(event: &Event) -> Option<String> {
    let (path, event) = event.origin();
    let text = match event {
        Event::RoundStarted { round } => format!("round {round}: calling the model"),
        Event::Text { text, .. } => format!("the model said: {}", clip(text)?),
        Event::ToolStarted { name, .. } => format!("tool `{name}` started"),
        Event::ToolFinished { name, is_error, .. } => {
            let how = if *is_error { "failed" } else { "finished" };
            format!("tool `{name}` {how}")
        }
        Event::Retrying {
            round,
            attempt,
            error,
            ..
        } => format!("round {round}: retrying (attempt {attempt}) after: {error}"),
        Event::Warning { source, .. } if *source == super::SOURCE => return None,
        Event::Warning { source, message } => format!("warning from {source}: {message}"),
        Event::Layer(event) if event.downcast_ref::<ProgressSummary>().is_some() => return None,
        Event::Layer(event) => event.to_string(),
        _ => return None,
    };
    Some(match path {
        Some(path) => format!("[{path}] {text}"),
        None => text,
    })
}

/// The first non-empty line of `text`, cut at [`MAX_TEXT`] characters.
fn clip(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|line| !line.is_empty())?;
    Some(match line.char_indices().nth(MAX_TEXT) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_tools_and_paths() {
        let nested = Event::Nested {
            path: "loop/1/coder".into(),
            event: Box::new(Event::ToolFinished {
                round: 1,
                call_id: "c1".into(),
                name: "grep".into(),
                is_error: true,
            }),
        };
        assert_eq!(
            line(&nested).as_deref(),
            Some("[loop/1/coder] tool `grep` failed")
        );
        assert_eq!(
            line(&Event::layer(ProgressSummary {
                summary: "x".into()
            })),
            None
        );
    }

    /// A layer's own event type, unknown to the digest: its `Display` is its line, tagged
    /// with the nested agent's path like any other; the progress summaries are left out.
    #[test]
    fn a_layer_event_is_its_line() {
        #[derive(Debug)]
        struct Evicted;
        impl tower_agent_core::LayerEvent for Evicted {
            const NAME: &'static str = "evicted";
        }
        impl std::fmt::Display for Evicted {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a result went to storage")
            }
        }
        assert_eq!(
            line(&Event::layer(Evicted)).as_deref(),
            Some("a result went to storage")
        );
        let nested = Event::Nested {
            path: "loop/1/coder".into(),
            event: Box::new(Event::layer(Evicted)),
        };
        assert_eq!(
            line(&nested).as_deref(),
            Some("[loop/1/coder] a result went to storage")
        );
        let started = Event::layer(crate::events::AgentStarted {
            path: "loop/1/coder".into(),
        });
        assert_eq!(
            line(&started).as_deref(),
            Some("agent `loop/1/coder` started")
        );
    }

    #[test]
    fn long_text_is_clipped_to_its_first_line() {
        let text = format!("\n  {}\nsecond", "é".repeat(200));
        let clipped = clip(&text).unwrap_or_default();
        assert_eq!(clipped.chars().count(), MAX_TEXT + 1);
        assert!(clipped.ends_with('…'));
        assert_eq!(clip("  \n "), None);
    }

    #[test]
    fn the_buffer_keeps_the_last_lines() {
        let digest = Digest::new(2, 0);
        for round in 1..=3 {
            digest.record(&Event::RoundStarted { round });
        }
        let text = digest.take().unwrap_or_default();
        assert!(text.contains("(1 earlier ones omitted)"), "{text}");
        assert!(!text.contains("round 1"), "{text}");
        assert!(text.contains("round 3"), "{text}");
        assert_eq!(digest.take(), None, "nothing new");
    }
}
