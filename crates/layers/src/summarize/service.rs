//! The summarization service, its response future, and what happens when a trigger fires.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use pin_project_lite::pin_project;
use serde_json::json;
use tower::ServiceExt;
use tower_agent_core::event::BoxFuture;
use tower_agent_core::history::validate;
use tower_agent_core::{
    Error, ErrorKind, Event, History, Message, ModelRequest, ModelResponse, RunContext,
};
use tower_agent_storage::StoragePath;
use tower_service::Service;

use super::history::{
    RENDER_CLIP, Tally, keep_for_tokens, render, render_markdown, safe_cut, summary_message,
    summary_text, truncate_arguments,
};
use super::{Config, Keep, SummarizeLayer};

/// The session-state key under which the layer counts its summaries:
/// `{"summaries": n, "messages_summarized": m}`.
pub(crate) const STATE_KEY: &str = "tower_agent.summarization";

/// Summarizes the history of model requests; see the [module docs](super).
///
/// `poll_ready` is the inner service's. A call that needs no summary goes straight to the
/// inner service; with overflow recovery on, a clone of the inner service and of the request
/// are kept for the one retry (as tower's `Retry` does).
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
        M: Service<ModelRequest, Response = ModelResponse, Error = Error>
            + Clone
            + Send
            + Sync
            + 'static,
        M::Future: Send + 'static,
    {
        SummarizeLayer::new(summarizer)
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    fn owner(&self) -> usize {
        Arc::as_ptr(&self.config) as *const () as usize
    }
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
    type Future = ResponseFuture<S::Future, S>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ModelRequest) -> Self::Future {
        let owner = self.owner();
        let config = &self.config;
        let tokens = Tally::count(owner, &req, &*config.counter);
        let messages = req.messages.len();
        if config.triggers.iter().any(|t| t.fires(tokens, messages)) {
            // The ready service goes into the future; a clone stays for the next call.
            let clone = self.inner.clone();
            let inner = std::mem::replace(&mut self.inner, clone);
            let future = shorten_then_call(Arc::clone(config), owner, inner, req, tokens);
            return ResponseFuture::boxed(Box::pin(future));
        }
        let spare = config.recover.then(|| Spare {
            service: self.inner.clone(),
            req: req.clone(),
            config: Arc::clone(config),
            owner,
        });
        ResponseFuture {
            state: State::Direct {
                future: self.inner.call(req),
                spare,
            },
        }
    }
}

/// What an overflow retry needs.
struct Spare<S> {
    service: S,
    req: ModelRequest,
    config: Arc<Config>,
    owner: usize,
}

pin_project! {
    /// The response future of [`Summarize`].
    pub struct ResponseFuture<F, S> {
        #[pin]
        state: State<F, S>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, S> {
        Direct { #[pin] future: F, spare: Option<Spare<S>> },
        Boxed { future: BoxFuture<'static, Result<ModelResponse, Error>> },
    }
}

impl<F, S> ResponseFuture<F, S> {
    fn boxed(future: BoxFuture<'static, Result<ModelResponse, Error>>) -> Self {
        Self {
            state: State::Boxed { future },
        }
    }
}

impl<F, S> fmt::Debug for ResponseFuture<F, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, S> Future for ResponseFuture<F, S>
where
    F: Future<Output = Result<ModelResponse, Error>>,
    S: Service<ModelRequest, Response = ModelResponse, Error = Error> + Send + 'static,
    S::Future: Send + 'static,
{
    type Output = Result<ModelResponse, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::Direct { future, spare } => {
                    let result = ready!(future.poll(cx));
                    let spare = match &result {
                        Err(error) if error.kind() == ErrorKind::ContextTooLong => spare.take(),
                        _ => None,
                    };
                    match (result, spare) {
                        (Err(error), Some(spare)) => {
                            let future = recover(spare, error);
                            this.state.set(State::Boxed {
                                future: Box::pin(future),
                            });
                        }
                        (result, _) => return Poll::Ready(result),
                    }
                }
                StateProj::Boxed { future } => return future.as_mut().poll(cx),
            }
        }
    }
}

/// A trigger fired: shorten the history, call the (ready) inner service, and recover from
/// one overflow.
async fn shorten_then_call<S>(
    config: Arc<Config>,
    owner: usize,
    mut inner: S,
    mut req: ModelRequest,
    tokens: usize,
) -> Result<ModelResponse, Error>
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error> + Send,
    S::Future: Send,
{
    if let Some(history) = shorten(&config, owner, &req, tokens, false).await? {
        req.messages = history;
    }
    if !config.recover {
        return inner.call(req).await;
    }
    match inner.call(req.clone()).await {
        Err(error) if error.kind() == ErrorKind::ContextTooLong => {
            recover(
                Spare {
                    service: inner,
                    req,
                    config,
                    owner,
                },
                error,
            )
            .await
        }
        other => other,
    }
}

/// The call overflowed: summarize whatever the triggers say and try once more.
async fn recover<S>(spare: Spare<S>, error: Error) -> Result<ModelResponse, Error>
where
    S: Service<ModelRequest, Response = ModelResponse, Error = Error> + Send,
    S::Future: Send,
{
    let Spare {
        mut service,
        mut req,
        config,
        owner,
    } = spare;
    let tokens = Tally::count(owner, &req, &*config.counter);
    match shorten(&config, owner, &req, tokens, true).await? {
        // Nothing can be cut: the overflow stands.
        None => Err(error),
        Some(history) => {
            req.messages = history;
            service.ready().await?.call(req).await
        }
    }
}

/// Shorten the history of `req` (truncate, then summarize), commit it, and return it; `None`
/// when nothing could be cut.
async fn shorten(
    config: &Config,
    owner: usize,
    req: &ModelRequest,
    tokens_before: usize,
    forced: bool,
) -> Result<Option<History>, Error> {
    let ctx = &req.ctx;
    let messages = req.messages.as_slice();
    let counter = &*config.counter;
    let keep = match config.keep {
        Keep::Messages(n) => n,
        Keep::Tokens(n) => keep_for_tokens(messages, n, counter),
    };
    // The provider refused what the estimate let through: keep half as much.
    let keep = if forced { (keep / 2).max(1) } else { keep };
    let Some(cut) = safe_cut(messages, messages.len().saturating_sub(keep)) else {
        return Ok(None);
    };
    let kept = &messages[cut..];
    let fixed = tokens_before.saturating_sub(
        messages
            .iter()
            .map(|m| counter.count_message(m))
            .sum::<usize>(),
    );
    let kept_tokens: usize = kept.iter().map(|m| counter.count_message(m)).sum();
    let tools = Tally::tools(ctx, owner);

    let mut older = messages[..cut].to_vec();
    if let Some(max) = config.truncate {
        let truncated = truncate_arguments(&mut older, max);
        if truncated > 0 && !forced {
            let older_tokens: usize = older.iter().map(|m| counter.count_message(m)).sum();
            let tokens = fixed + older_tokens + kept_tokens;
            let len = messages.len();
            if !config.triggers.iter().any(|t| t.fires(tokens, len)) {
                older.extend_from_slice(kept);
                let history = History::from(older);
                if validate(&history, &[]).is_err() {
                    return Ok(None);
                }
                ctx.commit_history(history.clone());
                Tally::store(ctx, owner, &history, older_tokens + kept_tokens, tools);
                ctx.emit(Event::Warning {
                    source: "summarize",
                    message: format!(
                        "truncated long arguments of {truncated} older tool calls \
                         ({tokens_before} -> {tokens} estimated tokens); no summary needed"
                    ),
                })
                .await?;
                return Ok(Some(history));
            }
        }
    }

    // The kept part must stand on its own after a summary.
    let mut shortened = Vec::with_capacity(1 + kept.len());
    shortened.push(Message::user(String::new()));
    shortened.extend_from_slice(kept);
    if validate(&shortened, &[]).is_err() {
        return Ok(None);
    }

    let previous = older.first().and_then(summary_text);
    let since = &older[usize::from(previous.is_some())..];
    let summary = fold(config, ctx, previous, since).await?;

    if let Some(storage) = &config.offload {
        offload(storage.as_ref(), ctx, &messages[..cut]).await?;
    }

    shortened[0] = summary_message(&summary);
    let summary_tokens = counter.count_message(&shortened[0]);
    let history = History::from(shortened);
    ctx.commit_history(history.clone());
    Tally::store(ctx, owner, &history, summary_tokens + kept_tokens, tools);
    ctx.with_state(|state| {
        let entry = state
            .entry(STATE_KEY)
            .or_insert_with(|| json!({"summaries": 0, "messages_summarized": 0}));
        let count = |key: &str| entry.get(key).and_then(|v| v.as_u64()).unwrap_or(0);
        let (summaries, summarized) = (count("summaries"), count("messages_summarized"));
        *entry = json!({
            "summaries": summaries + 1,
            "messages_summarized": summarized + since.len() as u64,
        });
    });
    ctx.emit(Event::Summarized {
        round: ctx.round(),
        summarized: cut,
        kept: kept.len(),
        tokens_before,
        tokens_after: fixed + summary_tokens + kept_tokens,
    })
    .await?;
    Ok(Some(history))
}

/// Fold `since` into the summary so far (`previous`): one summarizer call, or, under
/// [`SummarizeLayer::max_input_tokens`](super::SummarizeLayer::max_input_tokens), as many as it
/// takes for each input to fit, oldest messages first.
async fn fold(
    config: &Config,
    ctx: &RunContext,
    previous: Option<&str>,
    since: &[Message],
) -> Result<String, Error> {
    let max = match config.max_input {
        Some(max) if !since.is_empty() => max,
        _ => return summarize(config, ctx, input(previous, &render(since, RENDER_CLIP))).await,
    };
    let counter = config.counter.as_ref();
    let rendered: Vec<String> = since
        .iter()
        .map(|message| render(std::slice::from_ref(message), RENDER_CLIP))
        .collect();
    let mut summary = previous.map(str::to_owned);
    let mut start = 0;
    while start < rendered.len() {
        // The summary so far and the prompt's frame, then as many messages as fit (one at
        // least); counted piece by piece.
        let mut used = counter.count_text(&input(summary.as_deref(), ""));
        let mut end = start;
        while end < rendered.len() {
            let tokens = counter.count_text(&rendered[end]);
            if end > start && used + tokens > max {
                break;
            }
            used += tokens;
            end += 1;
        }
        // Counted whole: a counter need not add up piece by piece.
        let mut text = input(summary.as_deref(), &rendered[start..end].concat());
        while end > start + 1 && counter.count_text(&text) > max {
            end -= 1;
            text = input(summary.as_deref(), &rendered[start..end].concat());
        }
        summary = Some(summarize(config, ctx, text).await?);
        start = end;
    }
    Ok(summary.unwrap_or_default())
}

/// One summarizer input: the summary so far, if any, and the rendered messages since.
fn input(previous: Option<&str>, messages: &str) -> String {
    let mut input = String::new();
    if let Some(previous) = previous {
        input.push_str("The summary so far:\n");
        input.push_str(previous);
        input.push_str("\n\n");
    }
    input.push_str("The messages since:\n");
    input.push_str(messages);
    input
}

/// Ask the summarizer; its failure (or an empty answer) is the call's error.
async fn summarize(config: &Config, ctx: &RunContext, input: String) -> Result<String, Error> {
    let mut req = ModelRequest::new(vec![Message::user(input)]);
    req.system = Some(Arc::clone(&config.prompt));
    req.ctx = ctx.side_call();
    let mut summarizer = config.summarizer.clone();
    let failed = |error: Error| {
        Error::new(error.kind(), format!("summarization failed: {error}")).with_source(error)
    };
    let response = summarizer
        .ready()
        .await
        .map_err(failed)?
        .call(req)
        .await
        .map_err(failed)?;
    // The summarizer's tokens count in the run's usage.
    ctx.record_usage(response.usage);
    let text = response.message.text();
    if text.trim().is_empty() {
        return Err(Error::new(
            ErrorKind::EmptyResponse,
            "summarization failed: the summarizer answered with no text",
        ));
    }
    Ok(text)
}

/// Append the summarized messages to the session's conversation file; a failure is a warning.
async fn offload(
    storage: &dyn tower_agent_storage::Storage,
    ctx: &RunContext,
    messages: &[Message],
) -> Result<(), Error> {
    let name = format!(
        "/conversation_history/{}.md",
        crate::segment::segment(ctx.session_id(), 128)
    );
    let text = render_markdown(messages, ctx.round());
    let written = match StoragePath::parse(&name) {
        Ok(path) => storage
            .append(&path, Bytes::from(text))
            .await
            .map_err(|e| e.to_string()),
        Err(error) => Err(error.to_string()),
    };
    if let Err(error) = written {
        let message = format!(
            "the summarized messages could not be saved to {name}: {error}; the run goes on"
        );
        tracing::warn!(target: "tower_agent::summarize", "{message}");
        ctx.emit(Event::Warning {
            source: "summarize",
            message,
        })
        .await?;
    }
    Ok(())
}
