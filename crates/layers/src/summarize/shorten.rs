//! One shortening of a request's history: truncate old arguments, summarize the older
//! messages, check that the summary is smaller, offload, and remember it.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tower_agent_core::history::validate;
use tower_agent_core::{
    Error, ErrorKind, Event, History, Message, ModelRequest, RunContext, SideModel, StateKey,
    ToolChoice, Usage,
};
use tower_agent_storage::StoragePath;

use super::Config;
use super::cut::{Cut, choose_cut, trailing_calls};
use super::history::{
    RENDER_CLIP, Tally, clip_to_tokens, render, render_markdown, summary_message, summary_text,
    truncate_arguments,
};

/// Where the layer keeps its [`Record`] in the session's state.
pub(crate) const STATE_KEY: StateKey<Record> = StateKey::new("tower_agent.summarization");

/// What the layer remembers of a session, in its state under [`STATE_KEY`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// Summaries committed.
    #[serde(default)]
    pub(crate) summaries: u64,
    /// Messages they replaced (previous summaries not counted).
    #[serde(default)]
    pub(crate) messages_summarized: u64,
    /// After a summarization that saved little or was not committed: the triggers rest until
    /// the request reaches this many tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) wait_until_tokens: Option<usize>,
    /// The smallest request (in counted tokens) the provider refused as too long: a request
    /// this large is shrunk before it is sent. It stays with the session; a host that moves
    /// the session to a model with a larger window removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) overflow_at_tokens: Option<usize>,
}

impl Record {
    /// The record of the run's session (a default one when there is none or it is not ours).
    pub(crate) fn load(ctx: &RunContext) -> Self {
        ctx.get(&STATE_KEY)
    }

    /// Keep it in the session's state (replacing what cannot be read there).
    pub(crate) fn save(&self, ctx: &RunContext) {
        ctx.update_or_reset(&STATE_KEY, |record| *record = self.clone());
    }

    /// Remember that a request of `tokens` overflowed the model's context.
    pub(crate) fn overflowed(ctx: &RunContext, tokens: usize) {
        let mut record = Record::load(ctx);
        if record.overflow_at_tokens.is_none_or(|at| tokens < at) {
            record.overflow_at_tokens = Some(tokens);
            record.save(ctx);
        }
    }
}

/// The fewest tokens a summary must have room for to be asked for.
const MIN_ROOM: usize = 8;

/// A summarization is worth it when it saves at least this share of the request.
const WORTH: f64 = 0.1;

/// What one shortening did.
#[derive(Debug)]
pub(super) enum Shortened {
    /// The new history, committed.
    Cut(History),
    /// Nothing was cut: nothing to summarize, nothing worth a summary, no cut that leaves a
    /// valid kept part, or a summary that is not smaller than what it replaces.
    Uncut,
    /// The summarizer failed (said in an event; the history is kept and the triggers rest).
    Failed(Error),
}

/// The model that writes a summary.
pub(super) enum Summarizer {
    /// A model of its own, asked with the messages rendered as text.
    Model(SideModel),
    /// The model below the layer, asked with the request's own prefix first.
    Stack(SideModel),
}

/// What the model below the layer is told after the messages to summarize.
const IN_STACK: &str = "Do not call any tool now. Write the summary of the conversation above, \
as the instructions below say, and answer with the summary only.";

/// Shorten the history of `req`, keeping its last `keep` messages (or more, for a safe cut;
/// or fewer, past a batch only partly answered, see [`choose_cut`]): truncate old arguments
/// (unless `forced`), then summarize, and commit the new history.
///
/// # Errors
///
/// A failed observer, or a cancelled run. A summarizer's failure is not an error here:
/// [`Shortened::Failed`].
pub(super) async fn shorten(
    config: &Config,
    summarizer: &Summarizer,
    req: &ModelRequest,
    tokens_before: usize,
    keep: usize,
    forced: bool,
    spent: &mut Usage,
) -> Result<Shortened, Error> {
    let ctx = &req.ctx;
    let messages = req.messages.as_slice();
    let counter = &*config.counter;
    let cut = match choose_cut(messages, messages.len().saturating_sub(keep)) {
        Cut::At(cut) => cut,
        Cut::Nothing => return Ok(Shortened::Uncut),
        Cut::Broken(error) => {
            rest(ctx, tokens_before);
            warn(
                ctx,
                format!(
                    "nothing was summarized: wherever the cut falls, the newest messages are not \
                     a valid history on their own ({error}); the history is kept as it is"
                ),
            )
            .await?;
            return Ok(Shortened::Uncut);
        }
    };
    let kept = &messages[cut..];
    let replaced: usize = messages[..cut]
        .iter()
        .map(|m| counter.count_message(m))
        .sum();
    let kept_tokens: usize = kept.iter().map(|m| counter.count_message(m)).sum();
    // What a summary may take and still be smaller than what it replaces; with no room for
    // a few words, no summarizer call can save anything.
    let room = replaced.saturating_sub(counter.count_message(&summary_message("")) + 1);
    let worthless = room < MIN_ROOM;

    let mut older = messages[..cut].to_vec();
    if let Some(max) = config.truncate {
        let truncated = truncate_arguments(&mut older, max, counter);
        if truncated > 0 && !forced {
            let older_tokens: usize = older.iter().map(|m| counter.count_message(m)).sum();
            let tokens = tokens_before.saturating_sub(replaced) + older_tokens;
            let len = messages.len();
            if !config.triggers.iter().any(|t| t.fires(tokens, len)) {
                let mut whole = older.clone();
                whole.extend_from_slice(kept);
                // Committed only as a valid history: a broken older part is summarized instead.
                if validate(&whole, &trailing_calls(&whole)).is_ok() {
                    let history = History::from(whole);
                    Tally::store(ctx, &config.slots, &history, older_tokens + kept_tokens);
                    ctx.emit(Event::Warning {
                        source: "summarize",
                        message: format!(
                            "truncated long arguments of {truncated} older tool calls \
                             ({tokens_before} -> {tokens} estimated tokens); no summary needed"
                        ),
                    })
                    .await?;
                    return Ok(Shortened::Cut(history));
                }
            }
        }
    }

    if worthless {
        return Ok(Shortened::Uncut);
    }

    // The kept part stands on its own after a summary (`choose_cut`); calls of its last
    // message may still wait for results (a layer inside answers them).
    let mut shortened = Vec::with_capacity(1 + kept.len());
    shortened.push(Message::user(String::new()));
    shortened.extend_from_slice(kept);

    let bound = config.summary_bound(replaced).min(room);
    let previous = older.first().and_then(summary_text);
    let since = &older[usize::from(previous.is_some())..];
    let summary = match summarizer {
        Summarizer::Stack(model) => match in_stack(config, model, req, cut, bound, spent).await {
            Err(error) if error.kind() == ErrorKind::ContextTooLong => {
                fold(config, model, ctx, previous, since, bound, spent).await
            }
            other => other,
        },
        Summarizer::Model(model) => fold(config, model, ctx, previous, since, bound, spent).await,
    };
    let summary = match summary {
        Ok(summary) => summary,
        Err(error) if error.kind() == ErrorKind::Cancelled => return Err(error),
        // The request may still fit: the history is kept, and the triggers rest.
        Err(error) => {
            rest(ctx, tokens_before);
            warn(
                ctx,
                format!("{error}; the history is kept, and summarizing rests until it grows"),
            )
            .await?;
            return Ok(Shortened::Failed(error));
        }
    };

    shortened[0] = summary_message(&summary);
    let summary_tokens = counter.count_message(&shortened[0]);
    let tokens_after = tokens_before.saturating_sub(replaced) + summary_tokens;
    if summary_tokens >= replaced {
        rest(ctx, tokens_before);
        warn(
            ctx,
            format!(
                "the summary ({summary_tokens} tokens) is not smaller than the {cut} messages it \
                 would replace ({replaced} tokens); it was not committed and the history is kept"
            ),
        )
        .await?;
        return Ok(Shortened::Uncut);
    }

    if let Some(storage) = &config.offload {
        offload(storage.as_ref(), ctx, &messages[..cut]).await?;
    }

    let history = History::from(shortened);
    Tally::store(ctx, &config.slots, &history, summary_tokens + kept_tokens);
    let mut record = Record::load(ctx);
    record.summaries += 1;
    record.messages_summarized += since.len() as u64;
    let saved = tokens_before.saturating_sub(tokens_after) as f64;
    record.wait_until_tokens = (saved < WORTH * tokens_before as f64).then(|| grown(tokens_before));
    record.save(ctx);
    ctx.emit(Event::layer(super::Summarized {
        round: ctx.round(),
        summarized: cut,
        kept: kept.len(),
        tokens_before,
        tokens_after,
    }))
    .await?;
    Ok(Shortened::Cut(history))
}

/// The size a request must reach before the triggers fire again after a summarization that
/// saved little at `tokens`.
fn grown(tokens: usize) -> usize {
    tokens + (tokens / 10).max(1)
}

/// Rest the triggers until the request has grown past `tokens` by a tenth.
fn rest(ctx: &RunContext, tokens: usize) {
    let mut record = Record::load(ctx);
    record.wait_until_tokens = Some(grown(tokens));
    record.save(ctx);
}

async fn warn(ctx: &RunContext, message: String) -> Result<(), Error> {
    tracing::warn!(target: "tower_agent::summarize", "{message}");
    ctx.emit(Event::Warning {
        source: "summarize",
        message,
    })
    .await
}

/// The fewest characters a message is clipped to when a summarizer input must shrink.
const MIN_CLIP: usize = 100;

/// Fold `since` into the summary so far (`previous`, clipped to `bound` tokens): one
/// summarizer call, or, under [`SummarizeLayer::max_input_tokens`](super::SummarizeLayer::max_input_tokens)
/// or when the summarizer says its input is too long, as many as it takes, oldest messages
/// first. Each answer is bounded by `bound` tokens.
async fn fold(
    config: &Config,
    model: &SideModel,
    ctx: &RunContext,
    previous: Option<&str>,
    since: &[Message],
    bound: usize,
    spent: &mut Usage,
) -> Result<String, Error> {
    let counter = config.counter.as_ref();
    let mut summary = previous.map(|text| clip_to_tokens(text, bound, counter).into_owned());
    let mut summary_bound = bound;
    let mut max = config.max_input;
    let mut clip = RENDER_CLIP;
    let mut start = 0;
    loop {
        let rendered = |i: usize| render(std::slice::from_ref(&since[i]), clip);
        // The summary so far and the prompt's frame, then as many messages as fit (one at
        // least; all of them without a bound).
        let mut used = counter.count_text(&input(summary.as_deref(), ""));
        let mut end = start;
        let mut body = String::new();
        while end < since.len() {
            let next = rendered(end);
            let tokens = counter.count_text(&next);
            if end > start && max.is_some_and(|max| used + tokens > max) {
                break;
            }
            used += tokens;
            body.push_str(&next);
            end += 1;
        }
        let mut text = input(summary.as_deref(), &body);
        // Counted whole: a counter need not add up piece by piece.
        if let Some(max) = max {
            while end > start + 1 && counter.count_text(&text) > max {
                end -= 1;
                let body: String = (start..end).map(rendered).collect();
                text = input(summary.as_deref(), &body);
            }
        }
        let tokens = counter.count_text(&text);
        let mut req = ModelRequest::new(vec![Message::user(text)]);
        req.system = Some(Arc::clone(&config.prompt));
        req.ctx = ctx.side_call();
        match summarize(model, req, bound, spent).await {
            Ok(answer) => {
                summary = Some(answer);
                start = end;
                if start >= since.len() {
                    return Ok(summary.unwrap_or_default());
                }
            }
            // Too long for the summarizer: half as much per call, or, for one message, each
            // message clipped shorter and the summary so far with it.
            Err(error) if error.kind() == ErrorKind::ContextTooLong => {
                if end > start + 1 {
                    max = Some((tokens / 2).max(1));
                } else if clip > MIN_CLIP {
                    clip = (clip / 2).max(MIN_CLIP);
                    summary_bound = (summary_bound / 2).max(1);
                    summary =
                        summary.map(|s| clip_to_tokens(&s, summary_bound, counter).into_owned());
                } else {
                    return Err(error);
                }
            }
            Err(error) => return Err(error),
        }
    }
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

/// Ask the model below the layer for the summary of `req`'s first `cut` messages, with the
/// request's own system prompt and tools (the prefix its provider cached for the rounds
/// before), the prompt and [`IN_STACK`] as a last user message.
async fn in_stack(
    config: &Config,
    model: &SideModel,
    req: &ModelRequest,
    cut: usize,
    bound: usize,
    spent: &mut Usage,
) -> Result<String, Error> {
    let mut ask = req.clone();
    let mut messages = req.messages.as_slice()[..cut].to_vec();
    messages.push(Message::user(format!("{IN_STACK}\n\n{}", config.prompt)));
    ask.messages = History::from(messages);
    ask.options_mut().response_format = None;
    // A forced tool would make every summary a call; the cached history is lost then, not
    // the summary.
    if matches!(
        ask.options.tool_choice,
        Some(ToolChoice::Required | ToolChoice::Tool(_))
    ) {
        ask.options_mut().tool_choice = Some(ToolChoice::None);
    }
    ask.ctx = req.ctx.side_call();
    ask.deltas = Default::default();
    summarize(model, ask, bound, spent).await
}

/// Ask `model` for at most `bound` tokens; its failure (or an answer with no text, or with a
/// tool call) is the call's error.
async fn summarize(
    model: &SideModel,
    mut req: ModelRequest,
    bound: usize,
    spent: &mut Usage,
) -> Result<String, Error> {
    req.options_mut().max_tokens = Some(u32::try_from(bound).unwrap_or(u32::MAX));
    let failed = |error: Error| {
        Error::new(error.kind(), format!("summarization failed: {error}")).with_source(error)
    };
    let response = match model.ask(req).await {
        Ok(response) => response,
        Err(error) => {
            // What a failed summary cost still counts (a fallback's attempts, say).
            *spent += error.usage();
            return Err(failed(error));
        }
    };
    // The summarizer's tokens count in the run's usage, and those of calls made for it (a
    // fallback's, a repair's).
    *spent += response.usage;
    *spent += response.side_usage;
    if response.message.tool_calls().next().is_some() {
        return Err(Error::new(
            ErrorKind::InvalidResponse,
            "summarization failed: the summarizer called a tool",
        ));
    }
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
        warn(
            ctx,
            format!(
                "the summarized messages could not be saved to {name}: {error}; the run goes on"
            ),
        )
        .await?;
    }
    Ok(())
}
