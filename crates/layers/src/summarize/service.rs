//! The summarization service and its response future: when to shorten before a call, and how
//! an overflow is recovered from.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::ServiceExt;
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{
    Error, ErrorKind, Event, History, ModelRequest, ModelResponse, SideModel, Usage,
};
use tower_service::Service;

use super::history::{
    Reported, Slots, clip_kept, count_request, cut_summary, drop_summary, is_summary, tool_tokens,
};
use super::shorten::{Record, Shortened, Summarizer, shorten};
use super::{Config, SummarizeLayer};

/// Summarizes the history of model requests; see the [module docs](super).
///
/// `poll_ready` is the inner service's. The ready inner service goes into the call's future
/// (a clone stays for the next call), which calls it once, or again after each step of an
/// overflow recovery.
#[derive(Clone)]
pub struct Summarize<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> Summarize<S> {
    /// Wrap `inner` with the configuration of `layer`.
    pub fn new(inner: S, layer: &SummarizeLayer) -> Self {
        tower_layer::Layer::layer(layer, inner)
    }

    pub(crate) fn from_config(inner: S, config: Arc<Config>) -> Self {
        Self { inner, config }
    }

    /// A layer for this service, summaries written by `summarizer`.
    pub fn layer<M>(summarizer: M) -> SummarizeLayer
    where
        M: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
        M::Future: Send + 'static,
    {
        SummarizeLayer::new(summarizer)
    }

    tower_agent_core::inner_service_accessors!();
}

impl<S: fmt::Debug> fmt::Debug for Summarize<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Summarize")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> Service<ModelRequest> for Summarize<S>
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = ModelResponse;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ModelRequest) -> Self::Future {
        // The ready service goes into the future; a clone stays for the next call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(run(Arc::clone(&self.config), inner, req))
    }
}

/// The response future of [`Summarize`].
pub type ResponseFuture = BoxFuture<'static, Result<ModelResponse, Error>>;

/// What the layer did during one call, for its response (or error): the history it
/// committed and the summarizer's tokens.
#[derive(Default)]
struct Effects {
    history: Option<History>,
    spent: Usage,
}

impl Effects {
    /// Commit `history`, if there is one; it is the request's from now on.
    fn commit(&mut self, history: Option<History>) -> Option<History> {
        if let Some(history) = &history {
            self.history = Some(history.clone());
        }
        history
    }

    /// Put what the layer did into the call's result.
    fn apply(self, result: Result<ModelResponse, Error>) -> Result<ModelResponse, Error> {
        match result {
            Ok(mut response) => {
                if let Some(history) = self.history {
                    response.commit(history);
                }
                response.add_side_usage(self.spent);
                Ok(response)
            }
            Err(mut error) => {
                if let Some(history) = self.history {
                    error = error.with_history(history);
                }
                let usage = error.usage() + self.spent;
                Err(error.with_usage(usage))
            }
        }
    }
}

/// One model call, with what the layer did in its response.
async fn run<S>(config: Arc<Config>, inner: S, req: ModelRequest) -> Result<ModelResponse, Error>
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let mut effects = Effects::default();
    let result = shorten_and_call(&config, inner, req, &mut effects).await;
    effects.apply(result)
}

/// Count, shorten when a trigger fires, call the (ready) inner service, and recover from an
/// overflow.
async fn shorten_and_call<S>(
    config: &Config,
    mut inner: S,
    mut req: ModelRequest,
    effects: &mut Effects,
) -> Result<ModelResponse, Error>
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let counter = &*config.counter;
    let tokens = count_request(&config.slots, &req, counter);
    let record = Record::load(&req.ctx);
    if config.recover {
        // As large as a request that overflowed: it would fail again, so it is shrunk as an
        // overflow is, before it is sent.
        if let Some(at) = record.overflow_at_tokens.filter(|at| tokens >= *at) {
            let error = Error::new(
                ErrorKind::ContextTooLong,
                format!(
                    "a request of {at} tokens overflowed the model's context in this session \
                     before, and this one has {tokens}"
                ),
            );
            return recover(config, inner, req, error, effects).await;
        }
    }
    let fires = config
        .triggers
        .iter()
        .any(|t| t.fires(tokens, req.messages.len()));
    let rested = record.wait_until_tokens.is_none_or(|at| tokens >= at);
    if fires && rested {
        let keep = config.keep_count(&req.messages);
        let summarizer = summarizer(config, &mut inner);
        let shortened = shorten(
            config,
            &summarizer,
            &req,
            tokens,
            keep,
            false,
            &mut effects.spent,
        );
        if let Shortened::Cut(history) = shortened.await? {
            effects.commit(Some(history.clone()));
            req.messages = history;
        }
        // Ready again: a summary in the stack took its readiness.
        inner.ready().await?;
    }
    if !config.recover {
        return call(&config.slots, &mut inner, req).await;
    }
    let spare = req.clone();
    match call(&config.slots, &mut inner, req).await {
        Err(error) if error.kind() == ErrorKind::ContextTooLong => {
            recover(config, inner, spare, error, effects).await
        }
        other => other,
    }
}

/// The model that writes summaries: the configured one, or the model below.
///
/// In the stack, `inner` gives its readiness up first (it is replaced by an unready clone): a
/// concurrency limit or a buffer below keeps its permit in the service made ready, and the
/// summary, asked of another clone, would wait for it forever. Ready `inner` again before
/// calling it.
fn summarizer<S>(config: &Config, inner: &mut S) -> Summarizer
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    match &config.summarizer {
        Some(model) => Summarizer::Model(model.clone()),
        None => {
            *inner = inner.clone();
            Summarizer::Stack(SideModel::new(inner.clone()))
        }
    }
}

/// Call the ready `inner` with `req`; on success, remember what the provider counted.
async fn call<S>(slots: &Slots, inner: &mut S, req: ModelRequest) -> Result<ModelResponse, Error>
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error>,
{
    let (ctx, sent) = (req.ctx.clone(), req.messages.clone());
    let response = inner.call(req).await?;
    Reported::store(&ctx, slots, &sent, response.usage);
    Ok(response)
}

/// The characters the kept tool results and arguments are clipped to, step by step, once
/// summarizing can cut nothing more.
const CLIPS: [usize; 3] = [2_000, 500, 100];

/// How many times the summary is cut in half, once nothing else can be cut, before it is
/// dropped.
const SUMMARY_CUTS: usize = 3;

/// The call overflowed: shrink the request step by step, trying after each step, until it
/// fits or nothing more can be cut: summarize keeping half as much, down to the newest message
/// (or call and results); clip the kept results and arguments; cut the summary in half, then
/// drop it.
async fn recover<S>(
    config: &Config,
    mut inner: S,
    mut req: ModelRequest,
    mut error: Error,
    effects: &mut Effects,
) -> Result<ModelResponse, Error>
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let counter = &*config.counter;
    // Halved before each summary, down to one message (tried once); no more summaries once
    // the summarizer failed.
    let mut keep = Some(config.keep_count(&req.messages));
    let mut summarizer_failed = None;
    let mut clips = CLIPS.iter();
    let mut summary_cuts = 0;
    let mut dropped = false;
    loop {
        let tokens = count_request(&config.slots, &req, counter);
        Record::overflowed(&req.ctx, tokens);
        let shorter = if let Some(more) = keep {
            let less = (more / 2).max(1);
            keep = (less > 1).then_some(less);
            let summarizer = summarizer(config, &mut inner);
            let shortened = shorten(
                config,
                &summarizer,
                &req,
                tokens,
                less,
                true,
                &mut effects.spent,
            );
            match shortened.await? {
                Shortened::Cut(history) => effects.commit(Some(history)),
                Shortened::Uncut => None,
                Shortened::Failed(error) => {
                    keep = None;
                    summarizer_failed = Some(error);
                    None
                }
            }
        } else if let Some(&max) = clips.next() {
            effects.commit(clip_kept(&req.messages, max, counter))
        } else if summary_cuts < SUMMARY_CUTS {
            summary_cuts += 1;
            effects.commit(cut_summary(&req.messages, counter))
        } else if !dropped {
            dropped = true;
            let shorter = effects.commit(drop_summary(&req.messages));
            if shorter.is_some() {
                let message = "the summary did not fit the model's context window with the \
                               newest messages and was dropped"
                    .to_owned();
                tracing::warn!(target: "tower_agent::summarize", "{message}");
                req.ctx
                    .emit(Event::Warning {
                        source: "summarize",
                        message,
                    })
                    .await?;
            }
            shorter
        } else {
            return Err(does_not_fit(config, &req, error, summarizer_failed));
        };
        let Some(history) = shorter else {
            continue;
        };
        req.messages = history;
        match call(&config.slots, inner.ready().await?, req.clone()).await {
            Err(again) if again.kind() == ErrorKind::ContextTooLong => error = again,
            other => return other,
        }
    }
}

/// The error of a request that does not fit even shrunk as far as it goes: what is in it,
/// and why the summarizer could not help, if it failed.
fn does_not_fit(
    config: &Config,
    req: &ModelRequest,
    error: Error,
    summarizer_failed: Option<Error>,
) -> Error {
    let counter = &*config.counter;
    let mut parts = Vec::new();
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        let tokens = counter.count_text(system);
        parts.push(format!("the system prompt (~{tokens} tokens)"));
    }
    if !req.tools.is_empty() {
        let tokens = tool_tokens(&req.tools, counter);
        parts.push(format!("{} tool specs (~{tokens} tokens)", req.tools.len()));
    }
    let messages = req.messages.as_slice();
    let newest = match messages.split_first() {
        Some((first, rest)) if is_summary(first) => {
            let tokens = counter.count_message(first);
            parts.push(format!("the summary (~{tokens} tokens)"));
            rest
        }
        _ => messages,
    };
    let tokens: usize = newest.iter().map(|m| counter.count_message(m)).sum();
    parts.push(match newest.len() {
        1 => format!("the newest message (~{tokens} tokens)"),
        n => format!("the {n} newest messages (~{tokens} tokens)"),
    });
    let last = parts.pop().unwrap_or_default();
    let what = match parts.is_empty() {
        true => last,
        false => format!("{} and {last}", parts.join(", ")),
    };
    let how = match &summarizer_failed {
        None => "every older message summarized".to_owned(),
        Some(failed) => format!("the older messages kept, as the summarizer failed ({failed})"),
    };
    Error::new(
        ErrorKind::ContextTooLong,
        format!(
            "the request does not fit the model's context window even with {how}, the kept tool \
             results clipped and the summary dropped; what is left is over it: {what}, \
             estimated; the last refusal: {error}"
        ),
    )
    .with_source(error)
}
