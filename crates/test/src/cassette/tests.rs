//! The cassette's unit tests.

use super::scrub::{self, redact};
use super::*;
use crate::{ScriptedModel, StubTool};
use sha2::Digest;
use tower::ServiceExt;
use tower_agent_core::{AgentRequest, Message, ModelRequest, Session, ToolCall, ToolRequest};
use tower_agent_loop::Agent;
use tower_agent_tools::ToolSet;
use tower_layer::Layer;
use tower_service::Service;

#[tokio::test]
async fn tool_calls_replay_from_the_cassette_and_the_tools_do_not_run() {
    let path = std::env::temp_dir().join(format!(
        "cassette-tools-{}.jsonl",
        tower_agent_core::new_id()
    ));
    let script = || {
        ScriptedModel::new([
            ModelResponse::tool_calls([ToolCall::new(
                "c1",
                "weather",
                serde_json::json!({ "city": "Oslo" }),
            )]),
            ModelResponse::text("Rainy."),
        ])
    };
    // The replay is the recorded run again, under its run id: its calls get the same keys.
    let ask = || {
        let mut req = AgentRequest::new(Session::with_id("s"), "Weather in Oslo?");
        req.ctx = tower_agent_core::RunContext::new().with_run_id("recorded-run");
        req
    };

    // Record: the model and the tool answer; both are written.
    let weather = StubTool::returning("weather", "4°C, light rain");
    let recording = Cassette::open(&path, Mode::Record).expect("a new cassette");
    let tools = recording
        .tool_layer()
        .layer(ToolSet::new().tool(weather.clone()));
    let model = recording.layer().layer(script());
    let recorded = Agent::builder()
        .build(model, tools)
        .oneshot(ask())
        .await
        .expect("recorded");
    assert_eq!(weather.calls().len(), 1);
    assert_eq!(recording.len(), 3, "two model calls and one tool call");

    // Replay: no model, and a tool that would answer otherwise is never called.
    let other = StubTool::returning("weather", "sunny");
    let replay = Cassette::open(&path, Mode::Replay).expect("the cassette");
    let tools = replay
        .tool_layer()
        .layer(ToolSet::new().tool(other.clone()));
    let replayed = Agent::builder()
        .build(replay.model(), tools)
        .oneshot(ask())
        .await
        .expect("replayed");
    assert!(other.calls().is_empty(), "the tool ran on replay");
    assert_eq!(replayed.session.history, recorded.session.history);

    // The recorded result answers the call's own id; other arguments miss, with a diff.
    let replay = Cassette::open(&path, Mode::Replay).expect("the cassette");
    let mut tools = replay
        .tool_layer()
        .layer(ToolSet::new().tool(other.clone()));
    let call = ToolCall::new("c9", "weather", serde_json::json!({ "city": "Oslo" }));
    let res = tools
        .call(ToolRequest::new(call, Default::default()))
        .await
        .expect("replayed");
    assert_eq!(res.result.call_id, "c9");
    assert_eq!(res.result.content, "4°C, light rain");
    let call = ToolCall::new("c10", "weather", serde_json::json!({ "city": "Bergen" }));
    let miss = tools
        .call(ToolRequest::new(call, Default::default()))
        .await
        .expect_err("not recorded");
    let diff = miss.to_string();
    assert!(
        diff.lines()
            .any(|l| l.starts_with('-') && l.contains("Oslo")),
        "{diff}"
    );
    assert!(
        diff.lines()
            .any(|l| l.starts_with('+') && l.contains("Bergen")),
        "{diff}"
    );
    assert!(other.calls().is_empty());
    let _ = std::fs::remove_file(&path);
}

fn ask(text: &str) -> ModelRequest {
    ModelRequest::new(vec![Message::user(text)])
}

async fn text(
    model: impl Service<ModelRequest, Response = ModelResponse, Error = Error>,
    q: &str,
) -> String {
    model
        .oneshot(ask(q))
        .await
        .expect("an answer")
        .message
        .text()
}

#[tokio::test]
async fn a_request_made_again_gets_its_answers_in_order_and_record_missing_adds_only_misses() {
    let path = std::env::temp_dir().join(format!(
        "cassette-unit-{}.jsonl",
        tower_agent_core::new_id()
    ));
    let real = ScriptedModel::new([ModelResponse::text("first"), ModelResponse::text("second")]);
    let cassette = Cassette::open(&path, Mode::Record).expect("a cassette");
    let model = cassette.layer().layer(real.clone());
    assert_eq!(text(model.clone(), "same").await, "first");
    assert_eq!(text(model, "same").await, "second");

    let replay = Cassette::open(&path, Mode::Replay).expect("read").model();
    assert_eq!(text(replay.clone(), "same").await, "first");
    assert_eq!(text(replay.clone(), "same").await, "second");
    // Past the recorded answers: the last one again.
    assert_eq!(text(replay, "same").await, "second");

    real.push(Ok(ModelResponse::text("new")));
    let missing = Cassette::open(&path, Mode::RecordMissing).expect("read");
    let model = missing.layer().layer(real.clone());
    assert_eq!(text(model.clone(), "same").await, "first");
    assert_eq!(text(model, "other").await, "new");
    assert_eq!(real.request_count(), 3, "only the miss reached the model");
    let lines = std::fs::read_to_string(&path).expect("the file");
    assert_eq!(lines.lines().count(), 3);
    let replay = Cassette::open(&path, Mode::Replay).expect("read").model();
    assert_eq!(text(replay, "other").await, "new");

    // A request made again past its recorded answers asks the model (and is recorded).
    real.push(Ok(ModelResponse::text("again")));
    let missing = Cassette::open(&path, Mode::RecordMissing).expect("read");
    let model = missing.layer().layer(real.clone());
    assert_eq!(text(model.clone(), "other").await, "new");
    assert_eq!(text(model, "other").await, "again");
    assert_eq!(real.request_count(), 4);
    let replay = Cassette::open(&path, Mode::Replay).expect("read").model();
    assert_eq!(text(replay.clone(), "other").await, "new");
    assert_eq!(text(replay, "other").await, "again");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_line_that_is_not_a_call_names_its_number() {
    let path =
        std::env::temp_dir().join(format!("cassette-bad-{}.jsonl", tower_agent_core::new_id()));
    std::fs::write(&path, "\n{\"key\": \"k\"}\n").expect("written");
    let error = Cassette::open(&path, Mode::Replay).expect_err("not a call");
    assert!(
        error.to_string().contains("line 2 is not a recorded call"),
        "{error}"
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn keys_and_bearer_tokens_are_redacted() {
    let line =
        r#"{"text":"use sk-proj-abcdefghijklmnop1234 or Bearer abcdefghijklmnopqrstu, sk-short"}"#;
    assert_eq!(
        redact(line),
        r#"{"text":"use [REDACTED] or [REDACTED], sk-short"}"#
    );
    assert_eq!(
        redact("héllo AIzaSyA1234567890abcdefgh!"),
        "héllo [REDACTED]!"
    );
}

// Secrets: fake credentials, each placed where scrubbing the encoded line missed it (there a
// line break is the escape `\n`, so a key right after it did not start a word).

/// After a line break, a tab, a carriage return: in the encoded line, after `\n`, `\t`, `\r`.
const AFTER_NEWLINE: &str = "sk-proj-AfterNewline0123456789";
const AFTER_TAB: &str = "sk-ant-AfterTab0123456789abcdef";
const AFTER_CR: &str = "ghp_AfterCarriageReturn0123456789";
/// After a line break inside a JSON string inside a tool result: `\\n` in the encoded line.
const NESTED: &str = "AIzaNestedInJson0123456789abcdefgh";
/// A key with no known prefix, named by its variable: `AZURE_OPENAI_API_KEY=...`.
const NAMED: &str = "0123456789abcdef0123456789abcdef";
/// In a header: `x-api-key: ...` and `Authorization: Basic ...`.
const HEADER: &str = "HeaderKey0123456789abcdef";
const BASIC: &str = "dXNlcjpwYXNzd29yZDEyMzQ=";
/// In a URL: `?key=...&api_key=...`.
const URL_KEY: &str = "UrlKey0123456789abcdef";
const URL_API_KEY: &str = "UrlApiKey0123456789abcdef";

/// Record a run (the model calls `tool` with `arguments`, the tool answers `result`, the model
/// answers `answer`), then replay it with no model and a tool that must not run. Returns the
/// cassette's text and the replayed run's history, encoded.
async fn record_and_replay(arguments: Value, result: &str, answer: &str) -> (String, String) {
    let path = std::env::temp_dir().join(format!(
        "cassette-secrets-{}.jsonl",
        tower_agent_core::new_id()
    ));
    let script = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "tool", arguments)]),
        ModelResponse::text(answer),
    ]);
    // The replay is the recorded run again, under its run id: its calls get the same keys.
    let ask = || {
        let mut req = AgentRequest::new(Session::with_id("s"), "Read the config.");
        req.ctx = tower_agent_core::RunContext::new().with_run_id("recorded-run");
        req
    };
    let recording = Cassette::open(&path, Mode::Record).expect("a new cassette");
    let tools = recording
        .tool_layer()
        .layer(ToolSet::new().tool(StubTool::returning("tool", result)));
    Agent::builder()
        .build(recording.layer().layer(script), tools)
        .oneshot(ask())
        .await
        .expect("recorded");
    let text = std::fs::read_to_string(&path).expect("the file");

    let other = StubTool::returning("tool", "not recorded");
    let replay = Cassette::open(&path, Mode::Replay).expect("the cassette");
    let tools = replay
        .tool_layer()
        .layer(ToolSet::new().tool(other.clone()));
    let replayed = Agent::builder()
        .build(replay.model(), tools)
        .oneshot(ask())
        .await
        .expect("replayed: the scrubbed requests have the recorded keys");
    assert!(other.calls().is_empty(), "the tool ran on replay");
    let history = serde_json::to_string(&replayed.session.history).expect("encoded");
    let _ = std::fs::remove_file(&path);
    (text, history)
}

fn assert_scrubbed(text: &str, history: &str, secrets: &[&str]) {
    let written: Vec<&str> = secrets
        .iter()
        .copied()
        .filter(|s| text.contains(s))
        .collect();
    assert!(
        written.is_empty(),
        "the cassette holds {written:?}:\n{text}"
    );
    let replayed: Vec<&str> = secrets
        .iter()
        .copied()
        .filter(|s| history.contains(s))
        .collect();
    assert!(
        replayed.is_empty(),
        "the replay holds {replayed:?}:\n{history}"
    );
    assert!(text.contains("[REDACTED]"), "{text}");
    assert!(history.contains("[REDACTED]"), "{history}");
}

#[tokio::test]
async fn a_key_after_a_line_break_a_tab_or_a_carriage_return_is_not_written() {
    let result = format!("A=1\n{AFTER_NEWLINE}\nB=2\n\t{AFTER_TAB}\r{AFTER_CR}\n");
    let answer = format!("Found:\n{AFTER_NEWLINE}\t{AFTER_TAB}");
    let (text, history) =
        record_and_replay(serde_json::json!({ "path": ".env" }), &result, &answer).await;
    assert_scrubbed(&text, &history, &[AFTER_NEWLINE, AFTER_TAB, AFTER_CR]);
}

#[tokio::test]
async fn a_key_in_a_json_string_inside_a_tool_result_is_not_written() {
    // The tool's result is JSON whose string holds a `.env`: a line break there is `\n` in
    // the result, `\\n` in the cassette's line.
    let result = serde_json::json!({
        "stdout": format!(
            "OPENAI_API_KEY=sk-proj-EnvFile0123456789abcdef\nPATH=/bin\n{NESTED}\nAZURE_OPENAI_API_KEY={NAMED}\nOTHER=1"
        ),
    })
    .to_string();
    let (text, history) =
        record_and_replay(serde_json::json!({ "cmd": "cat .env" }), &result, "Done.").await;
    assert_scrubbed(
        &text,
        &history,
        &["sk-proj-EnvFile0123456789abcdef", NESTED, NAMED],
    );
    assert!(text.contains("OTHER=1"), "only the secrets go: {text}");
}

#[tokio::test]
async fn a_key_in_a_header_or_a_url_is_not_written() {
    // The model asks a fetch tool with headers and a query string; the tool echoes headers.
    let arguments = serde_json::json!({
        "url": format!("https://api.example.com/v1/forecast?key={URL_KEY}&api_key={URL_API_KEY}&q=Oslo"),
        "headers": { "X-Api-Key": HEADER, "Authorization": format!("Basic {BASIC}") },
    });
    let result = format!(
        "HTTP/1.1 200 OK\r\nx-api-key: {HEADER}\r\nauthorization: Basic {BASIC}\r\n\r\n{{}}"
    );
    let (text, history) = record_and_replay(arguments, &result, "Rainy.").await;
    assert_scrubbed(&text, &history, &[HEADER, BASIC, URL_KEY, URL_API_KEY]);
    assert!(text.contains("q=Oslo"), "only the secrets go: {text}");
}

#[tokio::test]
async fn a_request_holding_a_key_replays_from_its_scrubbed_line() {
    let path = std::env::temp_dir().join(format!(
        "cassette-secret-request-{}.jsonl",
        tower_agent_core::new_id()
    ));
    let question = format!("Is this key valid?\n{AFTER_NEWLINE}");
    let real = ScriptedModel::new([ModelResponse::text(format!("Yes:\t{AFTER_TAB}"))]);
    let cassette = Cassette::open(&path, Mode::Record).expect("a cassette");
    text(cassette.layer().layer(real), &question).await;
    let written = std::fs::read_to_string(&path).expect("the file");
    let held: Vec<&str> = [AFTER_NEWLINE, AFTER_TAB]
        .into_iter()
        .filter(|s| written.contains(s))
        .collect();
    assert!(held.is_empty(), "the cassette holds {held:?}:\n{written}");
    // The same request, key and all, is answered from the cassette, the answer scrubbed.
    let replay = Cassette::open(&path, Mode::Replay).expect("read").model();
    assert_eq!(text(replay, &question).await, "Yes:\t[REDACTED]");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn escapes_and_names_mark_secrets_and_prose_stays() {
    let cases = [
        // JSON held in a string, a URL: the escape of a break or a space starts a word.
        (
            r#"{"env":"A=1\nsk-proj-abcdefghijklmnop1234"}"#,
            r#"{"env":"A=1\n[REDACTED]"}"#,
        ),
        (r"x\u000aAIzaSyA1234567890abcdefgh", r"x\u000a[REDACTED]"),
        ("q=a%0Aghp_abcdefghijklmnop1234&b", "q=a%0A[REDACTED]&b"),
        // Named values: env, query, header, JSON, the scheme kept.
        (
            "AZURE_OPENAI_API_KEY=0123456789abcdef",
            "AZURE_OPENAI_API_KEY=[REDACTED]",
        ),
        ("/v1?key=abcdefgh1234&q=Oslo", "/v1?key=[REDACTED]&q=Oslo"),
        ("x-api-key: abcdefgh1234\r\n", "x-api-key: [REDACTED]\r\n"),
        (
            "Authorization: Basic dXNlcjpwYXNz",
            "Authorization: Basic [REDACTED]",
        ),
        (
            r#"{"client_secret": "abcdefgh1234"}"#,
            r#"{"client_secret": "[REDACTED]"}"#,
        ),
        (
            r#"{\"password\":\"hunter2hunter2\"}"#,
            r#"{\"password\":\"[REDACTED]\"}"#,
        ),
        // Prose and short or unnamed values stay.
        ("token: the unit of text", "token: the unit of text"),
        (
            "max_tokens=1024, sort_key=created_at_desc",
            "max_tokens=1024, sort_key=created_at_desc",
        ),
        ("key: a value of some length", "key: a value of some length"),
        (
            "ask-for-something-else-entirely",
            "ask-for-something-else-entirely",
        ),
    ];
    for (text, scrubbed) in cases {
        assert_eq!(redact(text), scrubbed, "{text}");
        // Scrubbing scrubbed text changes nothing: a replayed answer keys as recorded.
        assert_eq!(redact(scrubbed), scrubbed, "{scrubbed}");
    }
}

#[test]
fn the_scrubbing_encoder_writes_what_serde_json_writes_but_the_secrets() {
    // Nothing secret: the same text, so cassettes recorded before keep their keys.
    let plain = serde_json::json!({
        "text": "quote \" backslash \\ slash / \u{8}\u{c}\n\r\t\u{1}\u{1f} é 🦀",
        "numbers": [1, -2, 2.5, null, true],
        "key": "0482d3c2f79997b053945b822161209fe6b77f89d1cb58e8fd44b80ee79221cd",
        "token": 3,
    });
    assert_eq!(
        scrub::to_string(&plain).expect("encoded"),
        serde_json::to_string(&plain).expect("encoded")
    );
    let numbered = std::collections::BTreeMap::from([(1_u32, "one"), (2, "two")]);
    assert_eq!(
        scrub::to_string(&numbered).expect("encoded"),
        serde_json::to_string(&numbered).expect("encoded")
    );
    let request = ask("Capital of France?");
    let before: String = sha2::Sha256::digest(
        serde_json::to_string(&key::Canonical::of(&request)).expect("encoded"),
    )
    .iter()
    .map(|byte| format!("{byte:02x}"))
    .collect();
    assert_eq!(
        key::key_of(&key::Canonical::of(&request)).expect("a key"),
        before
    );

    // A header map: the value of a key that names a secret goes whole; strings as text.
    let secret = serde_json::json!({
        "headers": { "X-Api-Key": "abcdefgh1234", "Accept": "text/plain" },
        "log": "a\nsk-proj-abcdefghijklmnop1234",
        "token": { "kind": "short" },
    });
    let scrubbed: Value =
        serde_json::from_str(&scrub::to_string(&secret).expect("encoded")).expect("JSON");
    assert_eq!(
        scrubbed,
        serde_json::json!({
            "headers": { "X-Api-Key": "[REDACTED]", "Accept": "text/plain" },
            "log": "a\n[REDACTED]",
            "token": { "kind": "short" },
        })
    );
}

#[tokio::test]
async fn a_miss_does_not_show_the_secret_of_its_request() {
    let path = std::env::temp_dir().join(format!(
        "cassette-secret-miss-{}.jsonl",
        tower_agent_core::new_id()
    ));
    let cassette = Cassette::open(&path, Mode::Record).expect("a cassette");
    let real = ScriptedModel::new([ModelResponse::text("Yes.")]);
    text(cassette.layer().layer(real), "Is it set?").await;
    let replay = Cassette::open(&path, Mode::Replay).expect("read").model();
    let miss = replay
        .oneshot(ask(&format!("Is it set?\n{AFTER_NEWLINE}")))
        .await
        .expect_err("not recorded")
        .to_string();
    assert!(!miss.contains(AFTER_NEWLINE), "{miss}");
    assert!(
        miss.lines()
            .any(|l| l.starts_with('+') && l.contains("[REDACTED]")),
        "{miss}"
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn scrubbing_twice_is_scrubbing_once() {
    // Generated text of the pieces that matter: a replayed request keys as its recording only
    // if what was scrubbed is not scrubbed again differently.
    const PIECES: [&str; 42] = [
        "sk-",
        "sk-ant-",
        "AIza",
        "ghp_",
        "Bearer ",
        "basic ",
        "abcdefgh",
        "0123456789",
        "a",
        "A",
        "u",
        "n",
        "_",
        "-",
        "api_key",
        "X-Api-Key",
        "Authorization",
        "token",
        "secret",
        "key",
        "auth",
        "password",
        "=",
        ":",
        " ",
        "\"",
        "'",
        "\\",
        "\\\"",
        "%",
        "%0A",
        "\\u000a",
        "\n",
        "\t",
        "\r",
        "\u{1}",
        "&",
        "/",
        "]",
        "[REDACTED]",
        "é",
        "🦀",
    ];
    let scrub = |value: &Value| {
        let text = scrub::to_string(value).expect("encoded");
        serde_json::from_str::<Value>(&text).expect("valid JSON")
    };
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..10_000 {
        let text: String = (0..rng.usize(1..24))
            .map(|_| PIECES[rng.usize(..PIECES.len())])
            .collect();
        let once = redact(&text).into_owned();
        assert_eq!(redact(&once), once, "{text:?}");
        // Strings, object keys, the value of a key naming a secret.
        let value = serde_json::json!({
            "a": text, "api_key": text, "b": [text], text.clone(): { "token": [text] },
        });
        let once = scrub(&value);
        assert_eq!(scrub(&once), once, "{text:?}");
    }
}
