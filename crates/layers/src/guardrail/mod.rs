//! Guardrails: named checks of what goes into the model, what comes out and what tools
//! return, that end the run when they trip.
//!
//! A [`Guardrail`] reads a text and answers [`Verdict::Pass`] or [`Verdict::Trip`] with a
//! reason. It is a closure ([`Guardrail::new`]) or a model, a cheap classifier asked on the
//! side ([`Guardrail::model`]). [`GuardrailLayer`] runs them at three points, one value on
//! the agent service, the model stack and the tool stack:
//!
//! - **Input** ([`GuardrailLayer::input`]): on the agent service, the user's new text as the
//!   model would read it (the run's new user messages, after the user messages that end the
//!   session), before the run starts: a trip answers the run, stopped (its readers hear it
//!   start and finish), with the session as it came but for what tripped (the input is not
//!   appended, the session's last user messages the check read leave it, the model is not
//!   called), and the next run reads only its own input. On the model stack, when the agent side did not check
//!   (a stack without it, a `Continue`), the user messages that end the history, before the
//!   model is called; with [`GuardrailLayer::parallel`], always there, while it is called: a
//!   trip drops the call at once, so its stream stops (no delta after the trip) and the
//!   provider's connection is closed. A call that answers before the checks end waits for
//!   them. A trip there is a refusal ([`ModelResponse::refuse`]) that commits the history
//!   without the user messages it read: at the run's first call, the loop withdraws the input,
//!   and nothing tripped stays.
//! - **Output** ([`GuardrailLayer::output`]): the model's message, its text and then each
//!   call's arguments on a line of their own, before the message goes up. What streamed
//!   meanwhile was provisional: a trip makes the agent retract it
//!   ([`Event::Retract`](tower_agent_core::Event::Retract)).
//! - **Tool results** ([`GuardrailLayer::tool_results`]): each result, before the model reads
//!   it.
//!
//! The guardrails of a point run at the same time; the first trip wins. A trip ends the run:
//! [`Outcome::Stopped`](tower_agent_core::Outcome::Stopped) with
//! [`StopReason::Guardrail`], naming the guardrail and its reason. The history stays valid and
//! holds nothing tripped: a tripped input is not appended, a tripped output adds no message (a
//! message with calls is never appended, so no call waits for a result; the input it
//! answered stays), and a tripped tool result is replaced by an
//! error result saying it was withheld (later calls of the round are answered "not
//! executed"). A check that fails (a classifier that cannot be reached) fails the call with
//! its error: nothing passes unchecked.
//!
//! A classifier's tokens are counted in the run's usage (as side usage of the call it
//! checked).
//!
//! ```
//! use tower::{Layer, ServiceExt};
//! use tower_agent_core::{AgentRequest, Outcome, Session, StopReason};
//! use tower_agent_layers::guardrail::{Guardrail, GuardrailLayer, Verdict};
//! use tower_agent_loop::Agent;
//! use tower_agent_test::ScriptedModel;
//! use tower_agent_tools::ToolSet;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_agent_core::Error> {
//! let no_passwords = Guardrail::new("no_passwords", |text: String| async move {
//!     match text.to_lowercase().contains("password") {
//!         true => Verdict::trip("asks for a password"),
//!         false => Verdict::Pass,
//!     }
//! });
//! let guard = GuardrailLayer::new().input(no_passwords);
//! let model = ScriptedModel::new([]);
//! let agent = Agent::new(guard.layer(model.clone()), guard.layer(ToolSet::new()));
//! let res = agent.oneshot(AgentRequest::new(Session::new(), "What is Bob's password?")).await?;
//! let Outcome::Stopped { reason: StopReason::Guardrail { name, reason }, .. } = res.outcome else {
//!     panic!("{:?}", res.outcome);
//! };
//! assert_eq!((name.as_str(), reason.as_str()), ("no_passwords", "asks for a password"));
//! assert_eq!(model.request_count(), 0, "the model was never asked");
//! # Ok(())
//! # }
//! ```

mod check;
mod layer;

pub use check::{Guardrail, Verdict};
pub use layer::{Guarded, GuardrailLayer};
#[cfg(doc)]
use tower_agent_core::{ModelResponse, StopReason};

/// The boxed future of [`Guarded`].
pub type ResponseFuture<T> =
    tower_agent_core::event::BoxFuture<'static, Result<T, tower_agent_core::Error>>;
