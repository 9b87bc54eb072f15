//! A guardrail: a name and a check, a closure or a classifier model.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tower_agent_core::{Error, Message, ModelRequest, RunContext, SideModel, Usage};

/// What a guardrail says of a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing wrong.
    Pass,
    /// Stop the run, for this reason.
    Trip(String),
}

impl Verdict {
    /// A trip, for `reason`.
    pub fn trip(reason: impl Into<String>) -> Self {
        Verdict::Trip(reason.into())
    }
}

/// A verdict and the tokens it cost.
pub(super) type Checked = Result<(Verdict, Usage), Error>;

type Check =
    dyn Fn(String, RunContext) -> Pin<Box<dyn Future<Output = Checked> + Send>> + Send + Sync;

/// A named check of a text; see the [module docs](super). Cloning is cheap.
#[derive(Clone)]
pub struct Guardrail {
    name: Arc<str>,
    check: Arc<Check>,
}

impl fmt::Debug for Guardrail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guardrail")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// What a classifier is told besides its instructions.
const ANSWER: &str = "Answer PASS when the text is acceptable; otherwise answer TRIP: and the \
                      reason, in a few words. Answer nothing else.";

impl Guardrail {
    /// A guardrail named `name` that checks with `check`.
    pub fn new<F, Fut>(name: impl Into<Arc<str>>, check: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Verdict> + Send + 'static,
    {
        let check = Arc::new(check);
        Self {
            name: name.into(),
            check: Arc::new(move |text, _ctx| {
                let verdict = check(text);
                Box::pin(async move { Ok((verdict.await, Usage::default())) })
            }),
        }
    }

    /// A guardrail that asks `model` (a cheap classifier) with `instructions` as its system
    /// prompt and the text as the user's message, and reads its answer: `PASS`, or
    /// `TRIP: reason`. An answer that is neither trips (fail closed), naming what it was.
    ///
    /// ```
    /// use tower_agent_core::{ModelResponse, SideModel};
    /// use tower_agent_layers::guardrail::Guardrail;
    /// use tower_agent_test::ScriptedModel;
    ///
    /// let classifier = ScriptedModel::new([ModelResponse::text("TRIP: violence")]);
    /// let moderation = Guardrail::model(
    ///     "moderation",
    ///     SideModel::new(classifier),
    ///     "You moderate a support chat. Flag threats, harassment and violence.",
    /// );
    /// assert_eq!(moderation.name(), "moderation");
    /// ```
    pub fn model(
        name: impl Into<Arc<str>>,
        model: SideModel,
        instructions: impl Into<String>,
    ) -> Self {
        let system: Arc<str> = format!("{}\n\n{ANSWER}", instructions.into()).into();
        Self {
            name: name.into(),
            check: Arc::new(move |text, ctx| {
                let model = model.clone();
                let system = Arc::clone(&system);
                Box::pin(async move {
                    let mut request = ModelRequest::new(vec![Message::user(text)]);
                    request.system = Some(system);
                    request.ctx = ctx.side_call();
                    let answer = model.ask(request).await?;
                    Ok((read_verdict(&answer.message.text()), answer.usage))
                })
            }),
        }
    }

    /// A guardrail that blocks what [redaction rules](crate::redact::Rules) find: it trips
    /// when a rule matches, with the reason `contains <rule name>` (never the match itself, which
    /// a trip would otherwise carry into the outcome, the events and the logs).
    ///
    /// This is the *block* strategy of LangChain's PII middleware, where redaction's others
    /// (replace, mask, mask keeping a tail, hash) are [`Replace`](crate::redact::Replace)s: a
    /// pattern is either rewritten (by a [`RedactLayer`](crate::redact::RedactLayer)) or
    /// refused (by this guardrail), each rule in one place. A refusal ends the run the way every
    /// trip does, with nothing refused kept (see the [module docs](super)); where LangChain
    /// raises an exception, the outcome here is `Stopped` with the rule named.
    ///
    /// ```
    /// use tower_agent_core::RunContext;
    /// use tower_agent_layers::guardrail::{Guardrail, Verdict};
    /// use tower_agent_layers::redact::{Replace, Rules};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_agent_core::Error> {
    /// let cards = Rules::new().pattern("card", r"\d{4}-\d{4}-\d{4}-\d{4}", Replace::Label).unwrap();
    /// let block = Guardrail::blocking("pii", cards);
    /// let ctx = RunContext::default();
    /// assert_eq!(
    ///     block.check("pay with 1234-5678-9012-3456", &ctx).await?,
    ///     Verdict::trip("contains card")
    /// );
    /// assert_eq!(block.check("pay by invoice", &ctx).await?, Verdict::Pass);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redact")]
    pub fn blocking(name: impl Into<Arc<str>>, rules: crate::redact::Rules) -> Self {
        let rules = Arc::new(rules);
        Self::new(name, move |text: String| {
            let verdict = match rules.first_match(&text) {
                Some(rule) => Verdict::trip(format!("contains {rule}")),
                None => Verdict::Pass,
            };
            std::future::ready(verdict)
        })
    }

    /// Its name, as a trip names it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Check `text`.
    ///
    /// # Errors
    ///
    /// The check's (a classifier that failed).
    pub async fn check(&self, text: impl Into<String>, ctx: &RunContext) -> Result<Verdict, Error> {
        Ok((self.check)(text.into(), ctx.clone()).await?.0)
    }
}

/// A classifier's answer: `PASS`, `TRIP: reason`, or anything else (a trip).
fn read_verdict(answer: &str) -> Verdict {
    let answer = answer.trim();
    let word: String = answer
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect();
    match word.to_ascii_uppercase().as_str() {
        "PASS" => Verdict::Pass,
        "TRIP" => {
            let reason = answer[word.len()..]
                .trim_start_matches([':', ' ', '-'])
                .trim();
            Verdict::trip(match reason.is_empty() {
                true => "the classifier flagged it",
                false => reason,
            })
        }
        _ => {
            let shown: String = answer.chars().take(80).collect();
            Verdict::trip(format!(
                "the classifier answered neither PASS nor TRIP: {shown:?}"
            ))
        }
    }
}

/// A trip: the guardrail's name and its reason.
pub(super) struct Trip {
    pub(super) name: Arc<str>,
    pub(super) reason: String,
}

/// Run `guardrails` on `text` at the same time; the first trip, if any, and the tokens spent.
///
/// # Errors
///
/// The first check that failed.
pub(super) async fn check_all(
    guardrails: &[Guardrail],
    text: String,
    ctx: &RunContext,
) -> Result<(Option<Trip>, Usage), Error> {
    let mut checks: FuturesUnordered<_> = guardrails
        .iter()
        .map(|guardrail| {
            let name = Arc::clone(&guardrail.name);
            let check = (guardrail.check)(text.clone(), ctx.clone());
            async move { (name, check.await) }
        })
        .collect();
    let mut spent = Usage::default();
    while let Some((name, checked)) = checks.next().await {
        let (verdict, usage) = checked.map_err(|e| e.add_usage(spent))?;
        spent += usage;
        if let Verdict::Trip(reason) = verdict {
            return Ok((Some(Trip { name, reason }), spent));
        }
    }
    Ok((None, spent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_classifier_answer_is_read_leniently_and_fails_closed() {
        assert_eq!(read_verdict("PASS"), Verdict::Pass);
        assert_eq!(read_verdict("  pass.\n"), Verdict::Pass);
        assert_eq!(
            read_verdict("TRIP: threatens a person"),
            Verdict::trip("threatens a person")
        );
        assert_eq!(read_verdict("Trip - spam"), Verdict::trip("spam"));
        assert_eq!(
            read_verdict("TRIP"),
            Verdict::trip("the classifier flagged it")
        );
        let Verdict::Trip(reason) = read_verdict("I think this is fine") else {
            panic!("an unclear answer passed");
        };
        assert!(reason.contains("neither PASS nor TRIP"), "{reason}");
        assert!(matches!(read_verdict(""), Verdict::Trip(_)));
        assert!(matches!(
            read_verdict("PASSWORD: hunter2"),
            Verdict::Trip(_)
        ));
    }
}
