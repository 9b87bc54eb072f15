//! Token counts of Chinese text, and where the summarization layer fires on a Chinese
//! history: with `Tiktoken`, at the size OpenAI's tokenizer gives; with the character
//! estimate, earlier (o200k packs Chinese at about 0.6 tokens a character, the estimate counts
//! one), never later. A count of characters divided by four (what many estimates do) would
//! fire more than twice too late, past a context window set from it.

#![cfg(all(feature = "summarize", feature = "tiktoken"))]

mod common;

use tower_agent_core::{Message, ModelResponse};
use tower_agent_layers::summarize::{Keep, SummarizeLayer, Trigger};
use tower_agent_layers::tokens::{CharEstimate, Tiktoken, TokenCounter};
use tower_agent_test::ScriptedModel;

use common::{call, request, summarizer};

const SENTENCE: &str = "我们今天讨论的是智能代理的上下文管理，以及如何在长时间的会话中控制成本。";

fn history(messages: usize) -> Vec<Message> {
    (0..messages)
        .map(|i| {
            let text = SENTENCE.repeat(4);
            if i % 2 == 0 {
                Message::user(text)
            } else {
                Message::assistant(text)
            }
        })
        .collect()
}

fn tokens(counter: &dyn TokenCounter, messages: &[Message]) -> usize {
    messages.iter().map(|m| counter.count_message(m)).sum()
}

#[test]
fn the_estimate_counts_chinese_near_what_it_costs() {
    let real = Tiktoken::o200k().count_text(SENTENCE);
    let estimate = CharEstimate.count_text(SENTENCE);
    let quarter = SENTENCE.chars().count() / 4;
    let ratio = estimate as f64 / real as f64;
    // Over, not under: other tokenizers pack Chinese less tightly (SmolLM2's: 1.6 a
    // character; see the `tokens` module docs).
    assert!(
        (1.0..=1.8).contains(&ratio),
        "{estimate} estimated, {real} real"
    );
    // Characters divided by four: less than half of what it costs.
    assert!(quarter * 2 < real, "{quarter} by quarters, {real} real");
}

/// The real size (o200k) of the shortest history that makes the layer, counting with
/// `counter`, summarize at `tokens`.
async fn fires_at(counter: impl TokenCounter + Clone, tokens: usize) -> usize {
    for messages in (6..200).step_by(2) {
        let summarizer = summarizer("摘要");
        let layer = SummarizeLayer::new(summarizer.clone())
            .counter(counter.clone())
            .trigger(Trigger::tokens(tokens))
            .keep(Keep::messages(2));
        let model = ScriptedModel::new([ModelResponse::text("好")]);
        let (req, _ctx, _recorder) = request(history(messages));
        call(layer, &model, req).await.expect("answered");
        if summarizer.request_count() > 0 {
            return self::tokens(&Tiktoken::o200k(), &history(messages));
        }
    }
    panic!("never fired");
}

#[tokio::test]
async fn a_chinese_history_triggers_at_the_right_size() {
    const AT: usize = 4_000;
    let one_step = tokens(&Tiktoken::o200k(), &history(2));
    // With the tokenizer: the first history over the trigger.
    let exact = fires_at(Tiktoken::o200k(), AT).await;
    assert!((AT..AT + one_step).contains(&exact), "fired at {exact}");
    // With the estimate: before it, never after, and not before half of it.
    let estimated = fires_at(CharEstimate, AT).await;
    assert!(
        (AT / 2..=AT).contains(&estimated),
        "fired at {estimated} real tokens for a trigger at {AT}"
    );
}
