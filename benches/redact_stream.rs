//! Redaction that still streams: prose fed to a redaction stream one character a delta, as a
//! model writing 200 characters a second sends it (5 ms a character; computed, not slept).
//!
//! Printed first, for each rule set (emails, the report's; every built-in):
//!
//! - the characters held back before the first visible delta, and when it comes after the first
//!   byte at 200 characters/s (the requirement: within 50 ms; the bench fails otherwise);
//! - the most characters held back at any point (the longest word, punctuation included);
//! - for comparison, [`Rules::holdback`], what a stream used to hold back whatever the text.
//!
//! Then criterion's time for the whole text, one character a delta (`redact_stream/prose/*`,
//! throughput in deltas: the time per delta is the time over the number of characters).
//!
//! Run: `cargo bench --bench redact_stream -- --quick`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tower_agent::layers::redact::Rules;

/// A model's answer, nothing secret in it.
const PARAGRAPH: &str = "Sure, here is a short summary of the report. The service streams its \
    answer to the reader as the model writes it, one word at a time, and the redaction layer \
    removes addresses, phone numbers and keys before anyone sees them. Nothing in this \
    paragraph is secret, so every word should reach the screen a few milliseconds after the \
    model wrote it. ";

/// 5 ms a character: 200 characters a second.
const PER_CHAR: Duration = Duration::from_millis(5);

fn prose() -> String {
    PARAGRAPH.repeat(6)
}

fn rule_sets() -> [(&'static str, Rules); 2] {
    [
        ("emails", Rules::new().emails()),
        ("built_ins", Rules::new().emails().phones().api_keys()),
    ]
}

/// `text` one character a delta: the characters pushed before the first visible delta (the
/// first byte is pushed at 0), and the most held back (pushed, not released) after a delta.
fn hold_back(rules: &Rules, text: &str) -> (usize, usize) {
    let mut stream = rules.stream();
    let (mut pushed, mut released) = (0usize, 0usize);
    let (mut first, mut most) = (None, 0);
    let mut buf = [0; 4];
    for c in text.chars() {
        let out = stream.push(c.encode_utf8(&mut buf));
        released += out.chars().count();
        if first.is_none() && !out.is_empty() {
            first = Some(pushed);
        }
        pushed += 1;
        most = most.max(pushed - released);
    }
    (first.unwrap_or(pushed), most)
}

fn redact_stream(c: &mut Criterion) {
    let text = prose();
    let chars = text.chars().count();
    for (name, rules) in rule_sets() {
        let (first, most) = hold_back(&rules, &text);
        let after = PER_CHAR * u32::try_from(first).unwrap_or(u32::MAX);
        println!(
            "redact_stream/{name}: {first} characters held before the first visible delta, \
             {} ms after the first byte at 200 characters/s; at most {most} held ({} ms); \
             a fixed hold-back of `holdback()` = {} bytes would show the first at {} ms",
            after.as_millis(),
            (PER_CHAR * u32::try_from(most).unwrap_or(u32::MAX)).as_millis(),
            rules.holdback(),
            (PER_CHAR * u32::try_from(rules.holdback()).unwrap_or(u32::MAX)).as_millis(),
        );
        assert!(
            after <= Duration::from_millis(50),
            "{name}: the first visible delta {after:?} after the first byte"
        );
    }

    let mut group = c.benchmark_group("redact_stream/prose");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    group.throughput(Throughput::Elements(chars as u64));
    let pieces: Vec<String> = text.chars().map(String::from).collect();
    for (name, rules) in rule_sets() {
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut stream = rules.stream();
                for piece in &pieces {
                    black_box(stream.push(piece));
                }
                black_box(stream.finish())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, redact_stream);
criterion_main!(benches);
