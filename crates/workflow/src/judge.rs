//! Judges: what decides whether a loop goes on.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use serde::Deserialize;
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{
    AgentResponse, BoxError, Error, GenerationOptions, Message, ModelRequest, ModelResponse,
    ResponseFormat, RunContext, SideModel, Usage,
};
use tower_service::Service;

/// What a judge sees after an iteration: where, which, and the iteration's response (its
/// outcome, its final answer, the session).
#[derive(Debug, Clone)]
pub struct JudgeRequest {
    /// The loop's path.
    pub path: Arc<str>,
    /// The iteration that just ended, from 1.
    pub iteration: u32,
    /// Its response.
    pub response: AgentResponse,
    /// The loop's run context (for the cancellation token and events).
    pub ctx: RunContext,
}

impl JudgeRequest {
    /// The iteration's final answer.
    pub fn text(&self) -> String {
        self.response.text().unwrap_or_default()
    }
}

/// A judge's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Run another iteration.
    Continue {
        /// Why: it becomes the next iteration's input by default.
        reason: String,
    },
    /// The work is done: the loop completes with this iteration's answer.
    Stop {
        /// Why.
        reason: String,
    },
    /// The judge could not decide: the loop stops (`StopReason::Judge`) with this reason.
    Undecided {
        /// Why.
        reason: String,
    },
}

impl Verdict {
    /// Go on, because `reason`.
    pub fn proceed(reason: impl Into<String>) -> Self {
        Verdict::Continue {
            reason: reason.into(),
        }
    }

    /// Stop, because `reason`.
    pub fn stop(reason: impl Into<String>) -> Self {
        Verdict::Stop {
            reason: reason.into(),
        }
    }

    /// The reason given.
    pub fn reason(&self) -> &str {
        match self {
            Verdict::Continue { reason }
            | Verdict::Stop { reason }
            | Verdict::Undecided { reason } => reason,
        }
    }
}

/// Decides after each iteration of a [`Loop`](crate::Loop) whether it goes on: a service
/// separate from the work agents. Write one with [`judge_fn`], use a model with
/// [`ModelJudge`], or implement the trait.
pub trait Judge: Send + Sync + 'static {
    /// Judge the iteration `request` (borrowed: the loop goes on with its response).
    ///
    /// # Errors
    ///
    /// An infrastructure failure (the judge's model is down): the loop fails with it.
    fn judge<'a>(&'a self, request: &'a JudgeRequest) -> BoxFuture<'a, Result<Judged, Error>>;
}

/// A judge's verdict and the tokens its model calls took, which the loop adds to its usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    /// The decision.
    pub verdict: Verdict,
    /// Tokens the judge's model calls used.
    pub usage: Usage,
}

impl From<Verdict> for Judged {
    fn from(verdict: Verdict) -> Self {
        Self {
            verdict,
            usage: Usage::default(),
        }
    }
}

/// A judge from a closure that reads the request and returns a `'static` future (as
/// `observer_fn` does): take from the request what the future needs.
///
/// ```
/// use tower_agent_workflow::{judge_fn, JudgeRequest, Verdict};
///
/// let judge = judge_fn(|req: &JudgeRequest| {
///     let approved = req.text().contains("LGTM");
///     async move {
///         Ok(if approved {
///             Verdict::stop("the reviewer approved")
///         } else {
///             Verdict::proceed("address the review")
///         })
///     }
/// });
/// # let _ = judge;
/// ```
pub fn judge_fn<F, Fut>(f: F) -> JudgeFn<F>
where
    F: Fn(&JudgeRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Verdict, Error>> + Send + 'static,
{
    JudgeFn { f }
}

/// The judge [`judge_fn`] returns.
#[derive(Clone, Copy)]
pub struct JudgeFn<F> {
    f: F,
}

impl<F> fmt::Debug for JudgeFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JudgeFn").finish_non_exhaustive()
    }
}

impl<F, Fut> Judge for JudgeFn<F>
where
    F: Fn(&JudgeRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Verdict, Error>> + Send + 'static,
{
    fn judge<'a>(&'a self, request: &'a JudgeRequest) -> BoxFuture<'a, Result<Judged, Error>> {
        let verdict = (self.f)(request);
        Box::pin(async move { verdict.await.map(Judged::from) })
    }
}

/// The instructions of a [`ModelJudge`] unless replaced.
pub const JUDGE_PROMPT: &str = "You judge whether a piece of work is finished. You get the \
result of the latest iteration of the work. Answer with one JSON object and nothing else: \
{\"decision\": \"stop\", \"reason\": \"...\"} when the work is finished and good, or \
{\"decision\": \"continue\", \"reason\": \"...\"} with what must still be done.";

/// A judge backed by a model service: it reads the iteration's final answer and answers
/// `{"decision": "continue" | "stop", "reason": "..."}`, parsed strictly (that object and
/// nothing else). Its requests carry that shape as a strict response format (`verdict`), which
/// every provider of `tower-agent-providers` sends natively. An answer that does not parse is asked for once more, with the parse error;
/// a second one that does not parse makes the verdict [`Verdict::Undecided`], and the loop
/// stops with a clear reason.
#[derive(Clone)]
pub struct ModelJudge {
    model: SideModel,
    prompt: Arc<str>,
}

impl ModelJudge {
    /// A judge asking `model` (any model service; its calls go through whatever stack it
    /// has, a retry among them).
    pub fn new<M>(model: M) -> Self
    where
        M: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
        M::Error: Into<BoxError>,
        M::Future: Send + 'static,
    {
        Self {
            model: SideModel::new(model),
            prompt: JUDGE_PROMPT.into(),
        }
    }

    /// Replace the instructions ([`JUDGE_PROMPT`]); keep the answer format they ask for.
    pub fn prompt(mut self, prompt: impl Into<Arc<str>>) -> Self {
        self.prompt = prompt.into();
        self
    }

    async fn ask(
        &self,
        messages: Vec<Message>,
        ctx: &RunContext,
        usage: &mut Usage,
    ) -> Result<String, Error> {
        let mut req = ModelRequest::new(messages);
        req.system = Some(Arc::clone(&self.prompt));
        req.options = GenerationOptions::new()
            .response_format(verdict_format())
            .into();
        req.ctx = ctx.side_call();
        let res = self.model.ask(req).await?;
        // The loop adds the judge's tokens to the workflow's usage.
        *usage += res.usage + res.side_usage;
        Ok(res.message.text())
    }
}

impl fmt::Debug for ModelJudge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelJudge").finish_non_exhaustive()
    }
}

/// The verdict's JSON Schema, as [`parse_verdict`] reads it: both fields, nothing else.
fn verdict_format() -> ResponseFormat {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "decision": { "type": "string", "enum": ["continue", "stop"] },
            "reason": { "type": "string" }
        },
        "required": ["decision", "reason"],
        "additionalProperties": false
    });
    ResponseFormat::json_schema("verdict", schema).strict(true)
}

/// The verdict as the model must write it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Written {
    decision: WrittenDecision,
    reason: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum WrittenDecision {
    Continue,
    Stop,
}

/// Parse a verdict strictly: one JSON object with `decision` and `reason`, nothing else.
pub(crate) fn parse_verdict(text: &str) -> Result<Verdict, String> {
    let written: Written = serde_json::from_str(text.trim()).map_err(|e| e.to_string())?;
    Ok(match written.decision {
        WrittenDecision::Continue => Verdict::Continue {
            reason: written.reason,
        },
        WrittenDecision::Stop => Verdict::Stop {
            reason: written.reason,
        },
    })
}

impl Judge for ModelJudge {
    fn judge<'a>(&'a self, request: &'a JudgeRequest) -> BoxFuture<'a, Result<Judged, Error>> {
        let this = self;
        Box::pin(async move {
            let question = Message::user(format!(
                "Iteration {} of the work ended with this result:\n\n{}",
                request.iteration,
                request.text()
            ));
            let mut usage = Usage::default();
            let first = this
                .ask(vec![question.clone()], &request.ctx, &mut usage)
                .await?;
            let error = match parse_verdict(&first) {
                Ok(verdict) => return Ok(Judged { verdict, usage }),
                Err(error) => error,
            };
            let again = vec![
                question,
                Message::assistant(first),
                Message::user(format!(
                    "That is not a valid verdict ({error}). Answer with the JSON object only: \
                     {{\"decision\": \"continue\" or \"stop\", \"reason\": \"...\"}}."
                )),
            ];
            let second = this.ask(again, &request.ctx, &mut usage).await?;
            let verdict = parse_verdict(&second).unwrap_or_else(|error| {
                let shown: String = second.chars().take(200).collect();
                Verdict::Undecided {
                    reason: format!(
                        "the judge's verdict could not be read twice ({error}); its answer was \
                         {shown:?}"
                    ),
                }
            });
            Ok(Judged { verdict, usage })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_parse_strictly() {
        assert_eq!(
            parse_verdict(r#" {"decision": "stop", "reason": "done"} "#),
            Ok(Verdict::stop("done"))
        );
        assert_eq!(
            parse_verdict(r#"{"decision":"continue","reason":"tests fail"}"#),
            Ok(Verdict::proceed("tests fail"))
        );
        for bad in [
            "stop",
            r#"{"decision": "maybe", "reason": "x"}"#,
            r#"{"decision": "stop"}"#,
            r#"{"decision": "stop", "reason": "x", "score": 3}"#,
            "```json\n{\"decision\": \"stop\", \"reason\": \"x\"}\n```",
            r#"Sure! {"decision": "stop", "reason": "x"}"#,
        ] {
            assert!(parse_verdict(bad).is_err(), "{bad}");
        }
    }
}
