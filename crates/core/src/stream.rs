//! A model call's streamed deltas, on their way up through the model stack.
//!
//! A provider that streams hands each piece of its answer to
//! [`ModelRequest::send_delta`](crate::ModelRequest::send_delta). The piece goes up through
//! the filters the layers put on the request, the innermost layer's first, the way an HTTP
//! body goes up through tower-http's layers, and reaches the run's readers as
//! [`Event::TextDelta`] or [`Event::ReasoningDelta`]:
//!
//! ```text
//! provider  send_delta ──▶ innermost layer's filter ──▶ … ──▶ outermost's ──▶ readers
//!           end_stream ──▶ each filter releases what it held back, in the same order
//! retry     restart_stream ──▶ each filter forgets; readers get Event::Retract
//! ```
//!
//! A filter ([`StreamFilter`]) may pass a delta on, change it, hold it back and release it
//! later, or stop the stream with an error (the provider stops reading and returns it). A
//! layer puts one on with [`Deltas::filter`]; it applies to the calls made with this request
//! and its clones, and a layer that calls its inner service again (a retry, a fallback) calls
//! [`ModelRequest::restart_stream`](crate::ModelRequest::restart_stream) first.
//!
//! A layer that only cares about the whole message needs none of this: it reads the
//! response. Without filters a delta goes straight to the readers.
//!
//! The agent settles every model call ([`Deltas::settle`]): when its message does not go on
//! from what the readers were given (an after callback replaced it, a guardrail withheld it),
//! they get an [`Event::Retract`] and then the message's text as one delta; when it does,
//! they get whatever the deltas lacked. So what a reader puts together from the deltas since
//! the last `Retract` is the message's text.
//!
//! ```
//! use tower_agent_core::stream::{Delta, StreamFilter};
//! use tower_agent_core::{Error, ModelRequest};
//!
//! /// Shouts every text delta.
//! struct Upper;
//!
//! impl StreamFilter for Upper {
//!     fn delta(&mut self, delta: Delta, out: &mut Vec<Delta>) -> Result<(), Error> {
//!         out.push(match delta {
//!             Delta::Text(text) => Delta::Text(text.to_uppercase()),
//!             other => other,
//!         });
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let (ctx, mut events) = tower_agent_core::RunContext::new().with_event_stream(8);
//! let mut req = ModelRequest::new(vec![]);
//! req.ctx = ctx;
//! req.deltas.filter(Upper);
//! req.send_delta(Delta::Text("hello".into())).await?;
//! let event = events.recv().await;
//! assert!(matches!(event, Some(tower_agent_core::Event::TextDelta { delta, .. }) if delta == "HELLO"));
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::context::{RunContext, lock};
use crate::error::Error;
use crate::event::Event;
use crate::message::{ContentPart, Message, ToolCall};

/// A piece of a streamed answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Delta {
    /// Text of the answer.
    Text(String),
    /// Reasoning ("thinking").
    Reasoning(String),
    /// A tool call whose arguments the stream has closed, as it will stand in the message.
    /// A provider sends it as soon as it knows the call is complete; readers get no event for
    /// it (the message's calls come with `RoundCompleted`), and an agent built with
    /// `early_tool_start(true)` may start a read-only tool with it. A filter passes it on
    /// unless it means to keep the call from starting early.
    ToolCall(ToolCall),
}

/// What a layer does to the deltas of the model calls below it.
///
/// Called in stream order, never at the same time. A filter that holds deltas back releases
/// them in [`end`](Self::end); one that keeps state forgets it in [`restart`](Self::restart).
pub trait StreamFilter: Send + 'static {
    /// A delta from below: push what goes on up to `out` (nothing to hold it back, several to
    /// release what was held).
    ///
    /// # Errors
    ///
    /// Stops the stream: the provider stops reading and its call fails with this error.
    fn delta(&mut self, delta: Delta, out: &mut Vec<Delta>) -> Result<(), Error>;

    /// The stream ended complete: push what was held back.
    ///
    /// # Errors
    ///
    /// Fails the call with this error.
    fn end(&mut self, out: &mut Vec<Delta>) -> Result<(), Error> {
        let _ = out;
        Ok(())
    }

    /// The call is about to be made again: forget what was seen and held.
    fn restart(&mut self) {}
}

/// The way up for a model call's deltas: the layers' filters, then the run's readers.
///
/// Lives in [`ModelRequest::deltas`](crate::ModelRequest::deltas). Cloning shares the
/// filters and the record of what reached the readers.
#[derive(Clone, Default)]
pub struct Deltas {
    /// The innermost filter; each link names the one above it.
    filters: Option<Arc<Link>>,
    /// What reached the readers since the last settle or retraction.
    given: Arc<Mutex<Given>>,
}

struct Link {
    filter: Mutex<Box<dyn StreamFilter>>,
    up: Option<Arc<Link>>,
}

#[derive(Default)]
struct Given {
    text: String,
    reasoning: String,
    /// The round settled last, until a delta comes: settling it again adds nothing.
    settled: Option<u32>,
}

impl Deltas {
    /// Put `filter` below the filters already on: it sees the deltas before them.
    ///
    /// A layer calls it on the request it passes on, so the filters of inner layers come
    /// first, as an inner layer sees a response first.
    pub fn filter(&mut self, filter: impl StreamFilter) {
        self.filters = Some(Arc::new(Link {
            filter: Mutex::new(Box::new(filter)),
            up: self.filters.take(),
        }));
    }

    /// Pass `delta` up through the filters to the readers of `ctx`.
    pub(crate) async fn send(&self, ctx: &RunContext, delta: Delta) -> Result<(), Error> {
        match self.filters {
            None => self.give(ctx, delta).await,
            Some(_) => self.pass(ctx, vec![delta], false).await,
        }
    }

    /// The stream ended: each filter, the innermost first, gets what the ones below released
    /// and releases what it held.
    pub(crate) async fn end(&self, ctx: &RunContext) -> Result<(), Error> {
        self.pass(ctx, Vec::new(), true).await
    }

    /// Pass `batch` up through every filter (ending each, when the stream `ends`), then give
    /// what comes out to the readers.
    async fn pass(&self, ctx: &RunContext, mut batch: Vec<Delta>, ends: bool) -> Result<(), Error> {
        // Two buffers for the whole chain: what a filter gets, and what it lets through.
        let mut out = Vec::new();
        let mut link = self.filters.as_ref();
        while let Some(at) = link {
            {
                let mut filter = lock(&at.filter);
                for delta in batch.drain(..) {
                    filter.delta(delta, &mut out)?;
                }
                if ends {
                    filter.end(&mut out)?;
                }
            }
            if out.is_empty() && !ends {
                return Ok(());
            }
            std::mem::swap(&mut batch, &mut out);
            link = at.up.as_ref();
        }
        for delta in batch {
            self.give(ctx, delta).await?;
        }
        Ok(())
    }

    /// Whether readers were given deltas since the last settle or retraction: part of the
    /// current call's answer is out (a retry policy may refuse to replay it).
    pub fn delivered(&self) -> bool {
        let given = lock(&self.given);
        !given.text.is_empty() || !given.reasoning.is_empty()
    }

    /// The call is about to be made again: every filter forgets, and readers that were given
    /// deltas get an [`Event::Retract`] (as [`ModelRequest::restart_stream`] does).
    ///
    /// # Errors
    ///
    /// An observer's error.
    ///
    /// [`ModelRequest::restart_stream`]: crate::ModelRequest::restart_stream
    pub async fn restart(&self, ctx: &RunContext) -> Result<(), Error> {
        let mut link = self.filters.as_ref();
        while let Some(at) = link {
            lock(&at.filter).restart();
            link = at.up.as_ref();
        }
        self.retract(ctx).await
    }

    /// Tell the readers to discard what they were given, if anything.
    async fn retract(&self, ctx: &RunContext) -> Result<(), Error> {
        let given = {
            let mut given = lock(&self.given);
            let any = !given.text.is_empty() || !given.reasoning.is_empty();
            given.text.clear();
            given.reasoning.clear();
            any
        };
        if given {
            ctx.emit(Event::Retract { round: ctx.round() }).await?;
        }
        Ok(())
    }

    /// Settle a model call with the message it ended with (`None`: none is appended — the
    /// call failed or a layer stopped the run): the readers end up with the message's text
    /// and reasoning, as deltas since their last [`Event::Retract`].
    ///
    /// When the message goes on from what the readers were given, they get the rest; when it
    /// does not, they get an [`Event::Retract`] and the whole of it. A model that did not
    /// stream (nothing was given) reaches them as one delta of each. The agent calls this
    /// after every model call.
    ///
    /// # Errors
    ///
    /// An observer's error.
    pub async fn settle(&self, ctx: &RunContext, message: Option<&Message>) -> Result<(), Error> {
        if !ctx.events().is_enabled() {
            return Ok(());
        }
        let (text, reasoning) = {
            let mut given = lock(&self.given);
            if given.settled == Some(ctx.round()) {
                return Ok(());
            }
            given.settled = Some(ctx.round());
            (
                std::mem::take(&mut given.text),
                std::mem::take(&mut given.reasoning),
            )
        };
        let (whole_text, whole_reasoning) = message.map(streamed_parts).unwrap_or_default();
        let round = ctx.round();
        let (text, reasoning) =
            match whole_text.starts_with(&text) && whole_reasoning.starts_with(&reasoning) {
                true => (text.len(), reasoning.len()),
                false => {
                    ctx.emit(Event::Retract { round }).await?;
                    (0, 0)
                }
            };
        if whole_reasoning.len() > reasoning {
            let delta = whole_reasoning[reasoning..].to_owned();
            ctx.emit(Event::ReasoningDelta { round, delta }).await?;
        }
        if whole_text.len() > text {
            let delta = whole_text[text..].to_owned();
            ctx.emit(Event::TextDelta { round, delta }).await?;
        }
        Ok(())
    }

    /// Hand a delta to the readers, keeping a record of it.
    async fn give(&self, ctx: &RunContext, delta: Delta) -> Result<(), Error> {
        if !ctx.events().is_enabled() {
            return Ok(());
        }
        let round = ctx.round();
        let event = {
            let mut given = lock(&self.given);
            given.settled = None;
            match delta {
                Delta::Text(delta) => {
                    given.text.push_str(&delta);
                    Event::TextDelta { round, delta }
                }
                Delta::Reasoning(delta) => {
                    given.reasoning.push_str(&delta);
                    Event::ReasoningDelta { round, delta }
                }
                // Not text: the calls reach readers with the message.
                Delta::ToolCall(_) => return Ok(()),
            }
        };
        ctx.emit(event).await
    }
}

/// A message's text and reasoning, each as one string, the way a stream delivers them.
fn streamed_parts(message: &Message) -> (String, String) {
    let mut reasoning = String::new();
    for part in &message.content {
        if let ContentPart::Reasoning { text, .. } = part {
            reasoning.push_str(text);
        }
    }
    (message.text(), reasoning)
}

impl fmt::Debug for Deltas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut filters = 0;
        let mut link = self.filters.as_ref();
        while let Some(at) = link {
            filters += 1;
            link = at.up.as_ref();
        }
        f.debug_struct("Deltas").field("filters", &filters).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventStream;
    use crate::model::ModelRequest;

    /// Appends `tag` to every text delta; counts restarts.
    struct Tag(&'static str, Arc<Mutex<u32>>);

    impl StreamFilter for Tag {
        fn delta(&mut self, delta: Delta, out: &mut Vec<Delta>) -> Result<(), Error> {
            out.push(match delta {
                Delta::Text(text) => Delta::Text(text + self.0),
                other => other,
            });
            Ok(())
        }

        fn restart(&mut self) {
            *lock(&self.1) += 1;
        }
    }

    /// Holds every text delta back until the end; fails on "stop".
    #[derive(Default)]
    struct Hold(String);

    impl StreamFilter for Hold {
        fn delta(&mut self, delta: Delta, out: &mut Vec<Delta>) -> Result<(), Error> {
            match delta {
                Delta::Text(text) if text.contains("stop") => Err(Error::other("stopped")),
                Delta::Text(text) => {
                    self.0.push_str(&text);
                    Ok(())
                }
                other => {
                    out.push(other);
                    Ok(())
                }
            }
        }

        fn end(&mut self, out: &mut Vec<Delta>) -> Result<(), Error> {
            out.push(Delta::Text(std::mem::take(&mut self.0)));
            Ok(())
        }

        fn restart(&mut self) {
            self.0.clear();
        }
    }

    fn request() -> (ModelRequest, EventStream) {
        let (ctx, events) = RunContext::new().with_event_stream(64);
        let mut req = ModelRequest::new(vec![]);
        req.ctx = ctx.with_round(3);
        (req, events)
    }

    /// The events received so far, as `name:payload` strings.
    async fn drain(req: ModelRequest, mut events: EventStream) -> Vec<String> {
        drop(req);
        let mut seen = Vec::new();
        while let Some(event) = events.recv().await {
            seen.push(match event {
                Event::TextDelta { round, delta } => format!("text{round}:{delta}"),
                Event::ReasoningDelta { round, delta } => format!("reasoning{round}:{delta}"),
                Event::Retract { round } => format!("retract{round}"),
                other => other.name().to_owned(),
            });
        }
        seen
    }

    fn text(delta: &str) -> Delta {
        Delta::Text(delta.to_owned())
    }

    #[tokio::test]
    async fn without_filters_a_delta_goes_straight_to_the_readers() {
        let (req, events) = request();
        req.send_delta(text("Hel")).await.unwrap();
        req.send_delta(Delta::Reasoning("hm".into())).await.unwrap();
        req.end_stream().await.unwrap();
        assert_eq!(drain(req, events).await, ["text3:Hel", "reasoning3:hm"]);
    }

    #[tokio::test]
    async fn the_innermost_filter_sees_a_delta_first() {
        let (mut req, events) = request();
        let restarts = Arc::new(Mutex::new(0));
        req.deltas.filter(Tag("+outer", Arc::clone(&restarts)));
        req.deltas.filter(Tag("+inner", Arc::clone(&restarts)));
        req.send_delta(text("a")).await.unwrap();
        assert_eq!(drain(req, events).await, ["text3:a+inner+outer"]);
    }

    #[tokio::test]
    async fn held_deltas_are_released_at_the_end_through_the_filters_above() {
        let (mut req, events) = request();
        let restarts = Arc::new(Mutex::new(0));
        req.deltas.filter(Tag("!", Arc::clone(&restarts)));
        req.deltas.filter(Hold::default());
        req.send_delta(text("one ")).await.unwrap();
        req.send_delta(text("two")).await.unwrap();
        req.send_delta(Delta::Reasoning("r".into())).await.unwrap();
        req.end_stream().await.unwrap();
        assert_eq!(drain(req, events).await, ["reasoning3:r", "text3:one two!"]);
    }

    #[tokio::test]
    async fn a_filter_error_stops_the_stream_and_nothing_of_it_goes_up() {
        let (mut req, events) = request();
        req.deltas.filter(Hold::default());
        req.send_delta(text("fine")).await.unwrap();
        let error = req.send_delta(text("stop now")).await.unwrap_err();
        assert_eq!(error.message(), "stopped");
        assert!(drain(req, events).await.is_empty());

        /// Passes text on; stops at "stop", after pushing what it had.
        struct Stop;
        impl StreamFilter for Stop {
            fn delta(&mut self, delta: Delta, out: &mut Vec<Delta>) -> Result<(), Error> {
                match delta {
                    Delta::Text(text) if text.contains("stop") => {
                        out.push(Delta::Text("half".into()));
                        Err(Error::other("stopped"))
                    }
                    other => {
                        out.push(other);
                        Ok(())
                    }
                }
            }
        }
        // Below a filter that passes everything: what went up before the error stays, the
        // stopping delta and what the filter pushed with its error never go up.
        let (mut req, events) = request();
        req.deltas.filter(Tag("", Arc::new(Mutex::new(0))));
        req.deltas.filter(Stop);
        req.send_delta(text("fine")).await.unwrap();
        let error = req.send_delta(text("stop now")).await.unwrap_err();
        assert_eq!(error.message(), "stopped");
        assert_eq!(drain(req, events).await, ["text3:fine"]);
    }

    #[tokio::test]
    async fn a_restart_resets_every_filter_and_retracts_only_what_was_given() {
        let (mut req, events) = request();
        let restarts = Arc::new(Mutex::new(0));
        req.deltas.filter(Tag("", Arc::clone(&restarts)));
        let clone = req.clone();
        // Nothing given yet: no retraction.
        clone.restart_stream().await.unwrap();
        req.send_delta(text("draft")).await.unwrap();
        clone.restart_stream().await.unwrap();
        req.send_delta(text("final")).await.unwrap();
        assert_eq!(*lock(&restarts), 2);
        drop(clone);
        assert_eq!(
            drain(req, events).await,
            ["text3:draft", "retract3", "text3:final"]
        );
    }

    #[tokio::test]
    async fn settling_gives_the_readers_what_the_deltas_lacked() {
        let (req, events) = request();
        req.send_delta(text("Hello")).await.unwrap();
        let message = Message::assistant("Hello, world");
        req.deltas.settle(&req.ctx, Some(&message)).await.unwrap();
        // Settled: a second settle has nothing to add.
        req.deltas.settle(&req.ctx, Some(&message)).await.unwrap();
        assert_eq!(drain(req, events).await, ["text3:Hello", "text3:, world"]);
    }

    #[tokio::test]
    async fn settling_a_replaced_message_retracts_and_gives_it_whole() {
        let (req, events) = request();
        req.send_delta(text("I will rm -rf")).await.unwrap();
        let message = Message::assistant("I cannot help with that.");
        req.deltas.settle(&req.ctx, Some(&message)).await.unwrap();
        assert_eq!(
            drain(req, events).await,
            [
                "text3:I will rm -rf",
                "retract3",
                "text3:I cannot help with that."
            ]
        );
    }

    #[tokio::test]
    async fn settling_without_a_message_retracts_what_was_given() {
        let (req, events) = request();
        req.send_delta(Delta::Reasoning("plan".into()))
            .await
            .unwrap();
        req.deltas.settle(&req.ctx, None).await.unwrap();
        assert_eq!(drain(req, events).await, ["reasoning3:plan", "retract3"]);
    }

    #[tokio::test]
    async fn settling_what_never_streamed_gives_it_whole_once() {
        let (req, events) = request();
        let message = Message::assistant("whole, not streamed");
        req.deltas.settle(&req.ctx, Some(&message)).await.unwrap();
        req.deltas.settle(&req.ctx, None).await.unwrap();
        assert_eq!(drain(req, events).await, ["text3:whole, not streamed"]);
    }
}
