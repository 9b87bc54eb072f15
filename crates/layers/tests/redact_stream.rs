//! Redaction that still streams: a stream holds back only the tail in which a match could still
//! be growing, never a raw secret.
//!
//! - The property: texts mixing prose and secrets of every built-in kind (and rules of your own)
//!   cut anywhere (one character a delta, empty deltas, the whole text at once, random cuts):
//!   after every delta, what was released is the beginning of the whole text's redaction and
//!   holds no secret that redaction removes; at the end it is that redaction. 2,000 cases by
//!   default; `PROPTEST_CASES=n` changes it.
//! - The bound: on prose (words separated by spaces, no digits), the held-back tail is never more
//!   than the word being written, so never more than [`LONGEST_WORD`] characters: at 200
//!   characters/s (5 ms each), the first visible delta comes within 50 ms of the first byte, and
//!   every character is shown within 50 ms of its arrival.

#![cfg(feature = "redact")]

use std::sync::LazyLock;

use proptest::prelude::*;
use tower_agent_layers::redact::{Replace, Rules};

/// The words of the prose: no digits (a phone number could begin), no `bearer` (a token could
/// follow it), punctuation and capitals as prose has them.
const WORDS: &[&str] = &[
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog.",
    "Streaming",
    "answers,",
    "should",
    "arrive",
    "promptly;",
    "readers",
    "notice",
    "delays!",
    "a",
    "I",
    "well-known",
    "o'clock",
    "Ada",
    "skips",
    "AKA",
    "ghosts",
    "(often)",
    "café",
    "x",
];

/// The longest word of [`WORDS`], in characters: the most a stream holds back of prose.
const LONGEST_WORD: usize = 10;

/// Prose of about `chars` characters: the words in a fixed, mixed order, a space between.
fn prose(chars: usize) -> String {
    let mut text = String::new();
    let mut state = 7u64;
    while text.chars().count() < chars {
        if !text.is_empty() {
            text.push(' ');
        }
        // A fixed linear congruential sequence.
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        text.push_str(WORDS[(state >> 33) as usize % WORDS.len()]);
    }
    text
}

fn all_built_ins() -> Rules {
    Rules::new().emails().phones().api_keys()
}

/// The built-in rules and two of your own, one with an assertion (`\b`).
fn with_custom() -> Rules {
    all_built_ins()
        .pattern("pin", r"PIN [0-9]{4}", Replace::Mask('*'))
        .and_then(|r| r.pattern("cat", r"\bcat\b", Replace::Text("dog".into())))
        .expect("valid rules")
}

/// Feed `text` one character a delta; after each, the characters held back (pushed, not
/// released). Nothing in `text` is a secret, so what is released is `text` as it came.
fn held_per_char(rules: &Rules, text: &str) -> Vec<usize> {
    let mut stream = rules.stream();
    let (mut pushed, mut released) = (String::new(), String::new());
    let mut held = Vec::new();
    for c in text.chars() {
        pushed.push(c);
        released += &stream.push(c.encode_utf8(&mut [0; 4]));
        assert!(pushed.starts_with(&released), "{released:?}");
        held.push(pushed.chars().count() - released.chars().count());
    }
    released += &stream.finish();
    assert_eq!(released, text);
    held
}

#[test]
fn on_prose_a_stream_holds_back_no_more_than_the_word_being_written() {
    let text = prose(2_000);
    for (name, rules) in [
        ("emails", Rules::new().emails()),
        ("built-ins", all_built_ins()),
        ("custom", with_custom()),
    ] {
        let held = held_per_char(&rules, &text);
        for (at, &held) in held.iter().enumerate() {
            // The characters of the word being written (since the last space).
            let word = text
                .chars()
                .take(at + 1)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .take_while(|c| *c != ' ')
                .count();
            assert!(
                held <= word,
                "{name}: {held} characters held after {at}, the word is {word}"
            );
        }
        let max = held.iter().copied().max().unwrap_or(0);
        assert!(max <= LONGEST_WORD, "{name}: {max} characters held");
        // The first visible delta: when the first word is done (at its space).
        let first = held
            .iter()
            .zip(1..)
            .position(|(&h, pushed)| h < pushed)
            .expect("something released before the end");
        let first_word = text.find(' ').expect("a space");
        assert_eq!(first, first_word, "{name}");
        assert!(first <= LONGEST_WORD, "{name}");
    }
}

#[test]
fn a_short_answer_streams() {
    let rules = all_built_ins();
    let mut stream = rules.stream();
    let mut out = stream.push("Yes, ");
    assert_eq!(out, "Yes, ");
    out += &stream.push("mail ada@exa");
    assert_eq!(out, "Yes, mail ");
    out += &stream.push("mple.com today");
    assert_eq!(out, "Yes, mail [REDACTED:email] ");
    out += &stream.finish();
    assert_eq!(out, "Yes, mail [REDACTED:email] today");
}

#[test]
fn a_tail_that_could_begin_a_match_across_a_space_is_held_until_it_cannot() {
    let rules = all_built_ins();
    let mut stream = rules.stream();
    // `Bearer ` may begin a token, `+1 415` a phone number: held.
    assert_eq!(stream.push("Use Bearer "), "Use ");
    assert_eq!(stream.push("of news, call +1 415"), "Bearer of news, call ");
    assert_eq!(stream.push(" 555 0100 now"), "[REDACTED:phone] ");
    assert_eq!(stream.finish(), "now");
}

#[test]
fn a_whole_match_goes_up_even_when_its_end_could_begin_another() {
    let rules = all_built_ins();
    let mut stream = rules.stream();
    assert_eq!(stream.push("ghp_abcdefghijklmnopqrstuvwxyz0123456789"), "");
    // `0123456789 ` could begin a phone number, but the key began first and cannot grow.
    assert_eq!(stream.push(" "), "[REDACTED:api_key]");
    assert_eq!(stream.finish(), " ");
}

/// The secrets the generated texts hold, of every built-in kind and of the custom rules.
const SECRETS: &[&str] = &[
    "ada@example.com",
    "ada.lovelace+work@mail.example.co.uk",
    "+1 415 555 0100",
    "020 7946 0958",
    "sk-abcdefghijklmnopqrstuvwxyz",
    "sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
    "AKIAIOSFODNN7EXAMPLE",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "xoxb-1234567890-abcdefghij",
    "AIzaSyA-abcdefghijklmnopqrstuvwxyz01234",
    "Bearer abcdefghijklmnopqrstuvwxyz0123",
    "PIN 1234",
];

fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => prop::sample::select(WORDS).prop_map(str::to_owned),
        4 => Just(" ".to_owned()),
        3 => prop::sample::select(SECRETS).prop_map(str::to_owned),
        1 => Just("cat".to_owned()),
        1 => Just("Bearer".to_owned()),
        // Characters around the secrets' edges: a secret may grow into them.
        2 => "[a-z0-9@.+_ =-]{0,8}",
        1 => Just("é日".to_owned()),
        1 => Just("\n".to_owned()),
    ];
    prop::collection::vec(piece, 0..60).prop_map(|pieces| pieces.concat())
}

/// How a text is cut into deltas.
#[derive(Debug, Clone)]
enum Cuts {
    /// One character a delta.
    Chars,
    /// The whole text in one delta.
    Whole,
    /// At these places (modulo the length, on a character boundary; equal places make empty
    /// deltas), with an empty delta first.
    At(Vec<usize>),
}

fn cuts() -> impl Strategy<Value = Cuts> {
    prop_oneof![
        1 => Just(Cuts::Chars),
        1 => Just(Cuts::Whole),
        4 => prop::collection::vec(0usize..4_000, 0..16).prop_map(Cuts::At),
    ]
}

fn deltas<'t>(text: &'t str, cuts: &Cuts) -> Vec<&'t str> {
    match cuts {
        Cuts::Chars => text
            .char_indices()
            .map(|(at, c)| &text[at..at + c.len_utf8()])
            .collect(),
        Cuts::Whole => vec![text],
        Cuts::At(places) => {
            let mut bounds: Vec<usize> = places
                .iter()
                .map(|p| {
                    let mut at = p % (text.len() + 1);
                    while !text.is_char_boundary(at) {
                        at -= 1;
                    }
                    at
                })
                .collect();
            bounds.extend([0, 0, text.len()]);
            bounds.sort_unstable();
            bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect()
        }
    }
}

fn check(rules: &Rules, text: &str, cuts: &Cuts) -> Result<(), TestCaseError> {
    let expected = rules.redact(text).into_owned();
    // The secrets the whole text's redaction removes (one that grew into a neighbour and was
    // cut differently may show in it, then the stream shows it as well).
    let removed: Vec<&str> = SECRETS
        .iter()
        .copied()
        .filter(|s| text.contains(s) && !expected.contains(s))
        .collect();
    let mut stream = rules.stream();
    let mut released = String::new();
    for delta in deltas(text, cuts) {
        released += &stream.push(delta);
        prop_assert!(
            expected.starts_with(&released),
            "released {:?}, not the beginning of {:?}",
            released,
            expected
        );
        for secret in &removed {
            prop_assert!(!released.contains(secret), "{} in {:?}", secret, released);
        }
    }
    released += &stream.finish();
    prop_assert_eq!(released, expected);
    Ok(())
}

/// The rule sets of the property, compiled once.
static RULES: LazyLock<[Rules; 3]> =
    LazyLock::new(|| [Rules::new().emails(), all_built_ins(), with_custom()]);

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(2_000),
        ..ProptestConfig::default()
    })]

    /// Cut anywhere, no secret is ever released, and the stream ends as the whole text's
    /// redaction.
    #[test]
    fn cut_anywhere_no_secret_is_ever_released(text in text(), cuts in cuts()) {
        for rules in &*RULES {
            check(rules, &text, &cuts)?;
        }
    }
}

mod layer {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tower::{Layer, ServiceExt};
    use tower_agent_core::{Event, Message, ModelRequest, ModelResponse, RunContext, observer_fn};
    use tower_agent_layers::redact::{RedactLayer, Rules};
    use tower_agent_test::ScriptedModel;

    /// At 200 characters/s (5 ms before each one-character delta), a short answer's first
    /// words are on screen within 50 ms of its first byte, and the readers put the redacted
    /// answer together.
    #[tokio::test(start_paused = true)]
    async fn at_200_characters_per_second_the_first_delta_is_shown_within_50_ms() {
        let answer = "Sure, write to ada@example.com and I will answer today.";
        let model = ScriptedModel::new([ModelResponse::text(answer)])
            .streaming(1, Duration::from_millis(5));
        let model = RedactLayer::new(Rules::new().emails().phones().api_keys()).layer(model);
        let start = tokio::time::Instant::now();
        let deltas = Arc::new(Mutex::new(Vec::<(Duration, String)>::new()));
        let seen = Arc::clone(&deltas);
        let mut request = ModelRequest::new(vec![Message::user("Where do I write?")]);
        request.ctx = RunContext::new().with_observer(observer_fn(move |event: &Event| {
            if let Event::TextDelta { delta, .. } = event {
                let mut seen = seen.lock().expect("not poisoned");
                seen.push((start.elapsed(), delta.clone()));
            }
            async { Ok(()) }
        }));
        let response = model.oneshot(request).await.expect("answers");
        let deltas = deltas.lock().expect("not poisoned").clone();
        let expected = "Sure, write to [REDACTED:email] and I will answer today.";
        assert_eq!(response.message.text(), expected);
        let streamed: String = deltas.iter().map(|(_, d)| d.as_str()).collect();
        assert_eq!(streamed, expected);
        assert!(
            deltas.iter().all(|(_, d)| !d.contains("ada@")),
            "{deltas:?}"
        );
        // The first byte comes at 5 ms; `Sure,` is released with its comma, the 5th byte (no
        // match can hold a comma, nor begin with one).
        let (first, text) = &deltas[0];
        assert_eq!(text, "Sure,");
        assert_eq!(*first, Duration::from_millis(25));
        assert!(*first - Duration::from_millis(5) <= Duration::from_millis(50));
        assert!(deltas.len() > 5, "{deltas:?}");
    }
}
