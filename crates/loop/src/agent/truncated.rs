//! A model answer cut off at its length limit: never acted on as complete. Its calls are
//! answered, not run; the agent's [`Truncation`] says what the run does next.

use tower_agent_core::{
    BoxError, DescribeTools, Error, ErrorKind, Event, Message, ModelRequest, ModelResponse,
    Outcome, Progress, StopReason, ToolRequest, ToolResponse, ToolResult,
};
use tower_service::Service;

use super::builder::Truncation;
use super::state::Run;

/// What the round does after a cut answer.
pub(super) enum AfterCut {
    /// Send the same request again with this `max_tokens` (the answer was not kept).
    AskAgain(u32),
    /// Call the model again: the cut answer and its calls' results are in the history.
    GoOn,
    /// The run ends.
    End(Outcome),
}

impl<M, T> Run<M, T>
where
    M: Service<ModelRequest, Response = ModelResponse> + Send,
    M::Error: Into<BoxError>,
    M::Future: Send,
    T: Service<ToolRequest, Response = ToolResponse> + DescribeTools + Clone + Send + 'static,
    T::Error: Into<BoxError>,
    T::Future: Send,
{
    /// The model's answer of `round` was cut off: tell the observers, and say whether to ask
    /// again (`asked_again`: this answer is already the second ask) before it is kept.
    pub(super) async fn cut_off(
        &mut self,
        round: u32,
        message: &Message,
        max_tokens: Option<u32>,
        asked_again: bool,
    ) -> Result<Option<AfterCut>, Error> {
        let calls = message.tool_calls().count();
        emit!(
            self.ctx,
            Event::Truncated {
                round,
                calls,
                max_tokens,
            }
        )?;
        Ok(match self.config.truncation {
            Truncation::AskAgain { max_tokens } if !asked_again => {
                Some(AfterCut::AskAgain(max_tokens))
            }
            _ => None,
        })
    }

    /// The cut answer is the last message: answer its calls (none runs) and say what the run
    /// does next.
    pub(super) fn after_cut(&mut self, max_tokens: Option<u32>) -> Result<AfterCut, Error> {
        let [.., message] = &self.session.history[..] else {
            unreachable!("the cut answer was just appended");
        };
        let results: Vec<Message> = message
            .tool_calls()
            .map(|call| Message::tool_result(ToolResult::error(call, ToolResult::TRUNCATED)))
            .collect();
        self.session.history.extend(results);
        let reason = StopReason::Truncated { max_tokens };
        match self.config.truncation {
            Truncation::Continue => Ok(AfterCut::GoOn),
            Truncation::Fail => Err(Error::new(ErrorKind::Truncated, reason.to_string())),
            _ => Ok(AfterCut::End(Outcome::Stopped {
                reason,
                progress: Progress::default(),
            })),
        }
    }
}
