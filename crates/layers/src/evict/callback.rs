//! The `after_tool` decision: keep a result inline, or store it and show a preview.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{AfterCallback, Error, Event, RunContext, ToolResponse};

use super::Config;
use super::path::result_path;
use super::preview;

/// The `after_tool` callback of [`Evict`](super::Evict): stores a result over the limit and
/// replaces it with a preview. Public because [`Evict`](super::Evict)'s response future
/// names it.
#[derive(Clone)]
pub struct EvictLarge {
    pub(super) config: Arc<Config>,
}

impl fmt::Debug for EvictLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EvictLarge")
            .field("limit", &self.config.limit)
            .finish_non_exhaustive()
    }
}

type Decision = Result<ToolResponse, Error>;

/// The future of [`EvictLarge`]'s decision: ready at once for a result that stays inline
/// (nothing allocated), boxed while a large one is written.
pub struct EvictFuture {
    state: State,
}

enum State {
    Ready(Option<Decision>),
    Evicting(BoxFuture<'static, Decision>),
}

impl fmt::Debug for EvictFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Ready(_) => "ready",
            State::Evicting(_) => "evicting",
        };
        f.debug_struct("EvictFuture")
            .field("state", &state)
            .finish()
    }
}

impl Future for EvictFuture {
    type Output = Decision;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decision> {
        match &mut self.get_mut().state {
            State::Ready(decision) => Poll::Ready(
                decision
                    .take()
                    .expect("`EvictFuture` polled after completion"),
            ),
            State::Evicting(future) => future.as_mut().poll(cx),
        }
    }
}

impl AfterCallback<ToolResponse> for EvictLarge {
    type Future = EvictFuture;

    fn after(&mut self, response: ToolResponse, ctx: RunContext) -> EvictFuture {
        let keep = |response| EvictFuture {
            state: State::Ready(Some(Ok(response))),
        };
        // A paused call's result is not shown to the model.
        if response.is_interrupt() || self.config.is_excluded(&response.result.name) {
            return keep(response);
        }
        let tokens = self.config.counter.count_text(&response.result.content);
        if tokens <= self.config.limit {
            return keep(response);
        }
        EvictFuture {
            state: State::Evicting(Box::pin(evict(
                Arc::clone(&self.config),
                response,
                ctx,
                tokens,
            ))),
        }
    }
}

/// Store the content of `response` whole and replace it with a preview; on a backend failure,
/// keep it inline and warn.
async fn evict(
    config: Arc<Config>,
    mut response: ToolResponse,
    ctx: RunContext,
    tokens: usize,
) -> Decision {
    let path = match result_path(
        ctx.session_id(),
        &response.result.name,
        &response.result.call_id,
    ) {
        Ok(path) => path,
        // Cannot happen (every part is sanitized); keep the result rather than lose it.
        Err(error) => return warn(&ctx, response, &format!("{error}")).await,
    };
    let shown = path.to_string();
    // Moved, never copied: the string's buffer becomes the stored value, and comes back when
    // the write fails.
    let content = std::mem::take(&mut response.result.content);
    let preview = preview::render(&content, &shown, tokens, config.limit, config.shape);
    let bytes = Bytes::from(content);
    let written = config.storage.put(&path, bytes.clone()).await;
    match written {
        Ok(()) => {
            drop(bytes);
            response.result.content = preview;
            tracing::debug!(
                target: "tower_agent::evict",
                call_id = %response.result.call_id,
                path = %shown,
                tokens,
                "tool result evicted"
            );
            ctx.emit(Event::layer(super::ResultEvicted {
                call_id: response.result.call_id.clone(),
                name: response.result.name.clone(),
                path: shown,
                tokens,
            }))
            .await?;
            Ok(response)
        }
        Err(error) => {
            response.result.content = into_string(bytes);
            let message = format!(
                "the result of `{}` (call {}, about {tokens} tokens) could not be stored at \
                 {shown}; it stays inline: {error}",
                response.result.name, response.result.call_id
            );
            warn(&ctx, response, &message).await
        }
    }
}

/// Keep `response` as it is, with a warning.
async fn warn(ctx: &RunContext, response: ToolResponse, message: &str) -> Decision {
    tracing::warn!(target: "tower_agent::evict", "{message}");
    ctx.emit(Event::Warning {
        source: "evict",
        message: message.to_owned(),
    })
    .await?;
    Ok(response)
}

/// The string back from the bytes it was moved into: the same buffer when nothing else holds
/// it (a backend that failed dropped its handle), a copy otherwise.
fn into_string(bytes: Bytes) -> String {
    let vec = Vec::from(bytes);
    String::from_utf8(vec)
        .unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned())
}
