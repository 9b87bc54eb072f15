//! Redaction rules on whole texts and on streams cut anywhere.
#![cfg(feature = "redact")]

use proptest::prelude::*;
use tower_agent_layers::redact::{API_KEY, EMAIL, PHONE, Replace, RuleError, Rules};

fn rules() -> Rules {
    Rules::new().emails().phones().api_keys()
}

#[test]
fn the_built_in_rules_catch_what_they_name() {
    let rules = rules();
    let text = "Ada <ada.lovelace@math.example.org> (+44 20 7946 0958) used sk-ant-api03-abcdefghijklmnopqrstuvwxyz and AKIAIOSFODNN7EXAMPLE.";
    assert_eq!(
        rules.redact(text),
        "Ada <[REDACTED:email]> ([REDACTED:phone]) used [REDACTED:api_key] and [REDACTED:api_key]."
    );
    assert!(matches!(
        rules.redact("nothing secret here"),
        std::borrow::Cow::Borrowed(_)
    ));
    for pattern in [EMAIL, PHONE, API_KEY] {
        assert!(
            Rules::new().pattern("p", pattern, Replace::Label).is_ok(),
            "{pattern}"
        );
    }
}

#[test]
fn unbounded_and_invalid_patterns_are_refused_with_the_reason() {
    let unbounded = Rules::new().pattern("word", r"\w+@\w+", Replace::Label);
    assert!(matches!(unbounded, Err(RuleError::Unbounded { ref name }) if name == "word"));
    let message = unbounded.expect_err("refused").to_string();
    assert!(message.contains("bound its repetitions"), "{message}");
    let invalid = Rules::new().pattern("bad", r"(\d{3}", Replace::Label);
    assert!(matches!(invalid, Err(RuleError::Pattern { .. })));
}

#[test]
fn replacements_and_rules_with_groups_of_their_own() {
    let rules = Rules::new()
        .pattern("id", r"(ID)-([0-9]{4})", Replace::Text("<id>".into()))
        .and_then(|r| r.pattern("pin", r"PIN ([0-9]{4})", Replace::Mask('#')))
        .expect("valid rules");
    assert_eq!(rules.redact("ID-1234 and PIN 9876"), "<id> and ########");
    assert_eq!(rules.holdback(), 7);
}

#[test]
fn a_secret_split_across_two_deltas_never_shows_in_the_released_text() {
    let rules = rules();
    let key = "sk-abcdefghijklmnopqrstuvwxyz0123";
    // More text before the key than the rules hold back: the stream releases as it goes.
    let filler = "Lorem ipsum. ".repeat(rules.holdback() / 13 + 1);
    for split in 1..key.len() {
        let mut stream = rules.stream();
        let first = stream.push(&format!("{filler}the key is {}", &key[..split]));
        assert!(!first.is_empty(), "{split}: released as it streamed");
        assert!(!first.contains(&key[..split.max(3)]), "{split}: {first}");
        let rest = stream.push(&format!("{} now", &key[split..]));
        assert!(!rest.contains("sk-"), "{split}: {rest}");
        let out = first + &rest + &stream.finish();
        assert_eq!(
            out,
            format!("{filler}the key is [REDACTED:api_key] now"),
            "split at {split}"
        );
    }
}

#[test]
fn a_stream_holds_back_no_more_than_the_rules_need() {
    let rules = Rules::new()
        .pattern("pin", r"PIN [0-9]{4}", Replace::Label)
        .expect("a valid rule");
    let mut stream = rules.stream();
    // Nothing in it could be the beginning of a PIN: all of it goes up.
    let whole = "Nothing secret in this long sentence";
    assert_eq!(stream.push(whole), whole);
    // `PIN 12` could be: held, and no more (never more than `holdback`).
    assert_eq!(stream.push(", your PIN 12"), ", your ");
    assert!("PIN 12".len() <= rules.holdback());
    assert_eq!(stream.finish(), "PIN 12");
}

fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-z ]{0,12}",
        Just("ada@example.com".to_owned()),
        Just("+1 415 555 0100".to_owned()),
        Just("sk-abcdefghijklmnopqrstuvwxyz".to_owned()),
        Just("Bearer abcdefghijklmnopqrstuvwxyz0123".to_owned()),
        Just("é".to_owned()),
        Just("PIN 1234".to_owned()),
        "[0-9@.+ -]{0,6}",
        "[a-z ]{0,60}",
    ];
    // Up to about 3 KB: longer than the built-in rules hold back (about 500 bytes).
    proptest::collection::vec(piece, 0..80).prop_map(|pieces| pieces.concat())
}

/// Rules that hold back little: the stream releases almost everything as it goes.
fn small() -> Rules {
    Rules::new()
        .pattern("pin", r"PIN [0-9]{4}", Replace::Mask('*'))
        .and_then(|r| r.pattern("cat", r"\bcat\b", Replace::Text("dog".into())))
        .expect("valid rules")
}

proptest! {
    /// Cut anywhere, a stream releases exactly the redaction of the whole text.
    #[test]
    fn a_stream_cut_anywhere_redacts_as_the_whole_text(text in text(), cuts in proptest::collection::vec(0usize..200, 0..8)) {
        let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c % (text.len() + 1)).filter(|c| text.is_char_boundary(*c)).collect();
        bounds.push(0);
        bounds.push(text.len());
        bounds.sort_unstable();
        bounds.dedup();
        for rules in [rules(), small()] {
            let mut stream = rules.stream();
            let mut out = String::new();
            for pair in bounds.windows(2) {
                out += &stream.push(&text[pair[0]..pair[1]]);
            }
            // Text well past the hold-back went up before the end.
            if text.len() > 2 * rules.holdback() + 64 {
                prop_assert!(!out.is_empty(), "nothing released of {} bytes", text.len());
            }
            out += &stream.finish();
            prop_assert_eq!(out, rules.redact(&text).into_owned());
        }
    }
}

mod layer {
    use serde_json::json;
    use std::time::Duration;
    use tower::{Layer, ServiceExt};

    use tower_agent_core::{AgentRequest, ModelResponse, Session, ToolCall};
    use tower_agent_layers::redact::{RedactLayer, Rules};
    use tower_agent_loop::Agent;
    use tower_agent_test::{EventRecorder, ScriptedModel, StubTool, assert_valid_history};
    use tower_agent_tools::ToolSet;

    #[tokio::test]
    async fn arguments_a_call_ran_with_instead_of_the_model_s_are_redacted() {
        let redact = RedactLayer::new(Rules::new().emails());
        // A human edited the call (an approval): it ran with an address typed by hand.
        let send = StubTool::from_fn("send", |req| {
            tower_agent_core::ToolResponse::success(&req.call, "sent")
                .ran_with(json!({ "to": "ada@example.com" }).to_string())
        });
        let model = ScriptedModel::new([
            ModelResponse::tool_calls([ToolCall::new("c1", "send", json!({ "to": "x" }))]),
            ModelResponse::text("Sent."),
        ]);
        let tools = redact.layer(ToolSet::new().tool(send));
        let res = Agent::new(redact.layer(model), tools)
            .oneshot(AgentRequest::new(Session::new(), "send it"))
            .await
            .expect("the run");
        let saved = serde_json::to_string(&res.session).expect("serializes");
        assert!(!saved.contains("ada@example.com"), "{saved}");
        let call = res.session.history[1]
            .tool_calls()
            .next()
            .expect("the call");
        assert_eq!(call.arguments, r#"{"to":"[REDACTED:email]"}"#);
    }

    #[tokio::test]
    async fn input_output_arguments_and_results_are_redacted_and_the_session_keeps_it() {
        let redact = RedactLayer::new(Rules::new().emails().api_keys());
        let model = ScriptedModel::new([
            ModelResponse::tool_calls([ToolCall::new(
                "c1",
                "send",
                json!({ "to": "bob@example.com", "body": "hi" }),
            )]),
            ModelResponse::text("Sent. The key was sk-abcdefghijklmnopqrstuvwx."),
        ]);
        let send = StubTool::returning("send", "sent with key sk-zyxwvutsrqponmlkjihgfedc");
        let tools = redact.layer(ToolSet::new().tool(send.clone()));
        let agent = Agent::new(redact.layer(model.clone()), tools);
        let res = agent
            .oneshot(AgentRequest::new(
                Session::new(),
                "I am ada@example.com, mail Bob",
            ))
            .await
            .expect("runs");
        let requests = model.requests();
        // The model never read the user's address, nor the key the tool returned.
        assert_eq!(
            requests[0].messages[0].text(),
            "I am [REDACTED:email], mail Bob"
        );
        let result = requests[1]
            .messages
            .iter()
            .flat_map(|m| m.tool_results())
            .next();
        assert_eq!(
            result.map(|r| r.content.as_str()),
            Some("sent with key [REDACTED:api_key]")
        );
        // The tool was called with the redacted arguments.
        let args: serde_json::Value =
            serde_json::from_str(&send.calls()[0].arguments).expect("JSON arguments");
        assert_eq!(args, json!({ "to": "[REDACTED:email]", "body": "hi" }));
        // The session holds no secret; its history is valid.
        let saved = serde_json::to_string(&res.session).expect("serializes");
        for secret in [
            "ada@example.com",
            "bob@example.com",
            "sk-abcdef",
            "sk-zyxwv",
        ] {
            assert!(!saved.contains(secret), "{secret} in the session");
        }
        assert_eq!(
            res.text().as_deref(),
            Some("Sent. The key was [REDACTED:api_key].")
        );
        assert_valid_history(&res.session.history);
        // The second request starts with the first one's messages, kept in place.
        let (first, second) = (&requests[0].messages, &requests[1].messages);
        assert_eq!(second.kept(&first.mark()), first.len());
    }

    #[tokio::test]
    async fn a_streamed_secret_never_reaches_a_reader_and_what_they_assemble_is_the_message() {
        let rules = Rules::new().emails().api_keys();
        // Text around the secrets, longer than the rules hold back, so deltas go up before
        // the end.
        let filler = "Lorem ipsum dolor sit amet. ".repeat(rules.holdback() / 20 + 1);
        let answer = format!(
            "{filler}Mail ada.lovelace@example.org, {filler}key sk-abcdefghijklmnopqrstuvwx, thanks"
        );
        // Three characters a delta: every secret is split across many deltas.
        let model = ScriptedModel::new([ModelResponse::text(answer)]).streaming(3, Duration::ZERO);
        let agent = Agent::new(RedactLayer::new(rules).layer(model), ToolSet::new());
        let recorder = EventRecorder::new();
        let res = agent
            .oneshot(AgentRequest::new(Session::new(), "hi").with_observer(recorder.clone()))
            .await
            .expect("runs");
        let expected =
            format!("{filler}Mail [REDACTED:email], {filler}key [REDACTED:api_key], thanks");
        assert_eq!(res.text().as_deref(), Some(expected.as_str()));
        assert_eq!(recorder.streamed_text(1), expected);
        // The filter's deltas add up to the message: the agent had nothing to take back.
        assert!(!recorder.names().contains(&"retract"));
        let deltas = recorder.text_deltas();
        assert!(deltas.len() > 20, "{deltas:?}");
        for secret in ["ada", "lovelace", "example", "sk-", "abcdef"] {
            assert!(
                deltas.iter().all(|d| !d.contains(secret)),
                "{secret} in {deltas:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_started_early_runs_with_its_arguments_redacted() {
        let call = ToolCall::new("c1", "lookup", json!({"who": "ada@example.com"}));
        let then = ToolCall::new("c2", "note", json!({}));
        let model = ScriptedModel::new([
            ModelResponse::tool_calls([call, then]),
            ModelResponse::text("Found."),
        ])
        .streaming(4, Duration::from_millis(50));
        let lookup = StubTool::returning("lookup", "someone")
            .read_only()
            .taking(Duration::from_millis(500));
        let note = StubTool::returning("note", "noted").taking(Duration::from_millis(500));
        let agent = tower_agent_loop::AgentBuilder::new()
            .early_tool_start(true)
            .build(
                RedactLayer::new(Rules::new().emails()).layer(model),
                ToolSet::new().tool(lookup.clone()).tool(note),
            );
        let started = tokio::time::Instant::now();
        let res = agent
            .oneshot(AgentRequest::new(Session::new(), "Who?"))
            .await
            .expect("runs");
        // Started early with the redacted arguments, and kept: the message has the same.
        let calls = lookup.calls();
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert_eq!(calls[0].arguments, r#"{"who":"[REDACTED:email]"}"#);
        assert_valid_history(&res.session.history);
        // `lookup` closed at 50 ms and started then, not when the stream ended at 100: it is
        // done at 550, `note` (not read-only) runs to 1,050, the answer takes 100.
        assert_eq!(started.elapsed(), Duration::from_millis(1_150));
    }
}

/// LangChain's strategies, restated: a card masked but for its last four digits; a value
/// hashed with a key, the same hash for the same value (another process, the same key), and a
/// key that never shows.
#[test]
fn a_card_keeps_its_last_four_and_a_hash_is_stable_per_value_and_key() {
    let card = r"[0-9]{4}(?:[ -]?[0-9]{4}){3}";
    let last_four = Rules::new()
        .pattern("card", card, Replace::mask_keeping('X', 4))
        .expect("a rule");
    assert_eq!(
        last_four.redact("pay with 4111 1111 1111 1234 today"),
        "pay with XXXX XXXX XXXX 1234 today"
    );
    assert_eq!(last_four.redact("4111111111111234"), "XXXXXXXXXXXX1234");
    let hashing = |key: &str| {
        Rules::new()
            .emails()
            .pattern("card", card, Replace::hash(key))
            .expect("a rule")
    };
    let (one, other_process) = (hashing("k1"), hashing("k1"));
    let first = one.redact("4111 1111 1111 1234").into_owned();
    assert!(
        first.starts_with("[card:") && first.len() == "[card:]".len() + 16,
        "{first}"
    );
    assert_eq!(other_process.redact("4111 1111 1111 1234"), first);
    assert_ne!(one.redact("4111 1111 1111 9999"), first, "another value");
    assert_ne!(
        hashing("k2").redact("4111 1111 1111 1234"),
        first,
        "another key"
    );
    assert!(!format!("{:?}", Replace::hash("k1-secret")).contains("k1-secret"));
}
