//! The server over real HTTP on 127.0.0.1: runs, their events as server-sent events, an
//! approval decided over HTTP, a client that disconnects and comes back, cancel, steering,
//! typed errors, and a host's authentication layer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::middleware::Next;
use axum::response::IntoResponse;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tower_agent_core::{Error, Message, ModelRequest, ModelResponse, Role, ToolCall};
use tower_agent_layers::approval::{ApprovalLayer, Gate};
use tower_agent_loop::Agent;
use tower_agent_server::AgentServer;
use tower_agent_sessions::{InMemorySessions, StoreLayer};
use tower_agent_test::ScriptedModel;
use tower_agent_tools::{NoArgs, ToolSet, tool_fn};

/// The model: "write" asks for a gated write, "slow" for a slow tool, "bye" in the last user
/// message says bye; otherwise it greets, streamed four characters at a time.
fn model() -> ScriptedModel {
    ScriptedModel::from_fn(|req: &ModelRequest| {
        let asked = req
            .messages
            .iter()
            .rev()
            .find(|m| m.role == Role::User)
            .map(Message::text)
            .unwrap_or_default();
        let result = req
            .messages
            .last()
            .and_then(|m| m.tool_results().next())
            .cloned();
        Ok(match result {
            _ if asked.contains("bye") => ModelResponse::text("Bye!"),
            Some(result) => ModelResponse::text(format!("Done: {}", result.content)),
            None if asked.contains("write") => {
                ModelResponse::tool_calls([ToolCall::new("w1", "write_file", json!({}))])
            }
            None if asked.contains("slow") => {
                ModelResponse::tool_calls([ToolCall::new("s1", "wait", json!({}))])
            }
            None => ModelResponse::text("Hello there, friend."),
        })
    })
    .streaming(4, Duration::from_millis(2))
}

struct App {
    base: String,
    http: reqwest::Client,
    writes: Arc<AtomicUsize>,
    waits: Arc<AtomicUsize>,
}

async fn serve(wrap: impl FnOnce(Router) -> Router) -> App {
    let (writes, waits) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (w, s) = (writes.clone(), waits.clone());
    let tools = ToolSet::new()
        .tool(tool_fn("write_file", "Writes.", move |_: NoArgs| {
            w.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Error>("wrote note.txt") }
        }))
        .tool(tool_fn("wait", "Waits.", move |_: NoArgs| {
            let s = s.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(400)).await;
                s.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>("waited")
            }
        }));
    let store = InMemorySessions::new();
    let agent = Agent::builder()
        .with(StoreLayer::new(store.clone()))
        .with(
            ApprovalLayer::builder()
                .gate("write_file", Gate::new())
                .build()
                .expect("a gate"),
        )
        .tool_specs(tools.specs())
        .build(model(), tools);
    listen(wrap(AgentServer::new(agent, store).router()), writes, waits).await
}

/// Serve `app` on a port of 127.0.0.1.
async fn listen(app: Router, writes: Arc<AtomicUsize>, waits: Arc<AtomicUsize>) -> App {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let base = format!("http://{}", listener.local_addr().expect("an address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    App {
        base,
        http: reqwest::Client::new(),
        writes,
        waits,
    }
}

/// An event as read from the stream.
#[derive(Debug, Clone)]
struct Sse {
    id: usize,
    name: String,
    data: Value,
}

impl App {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let res = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .expect("an answer");
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let res = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("an answer");
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    async fn start(&self, session: &str, message: &str) -> String {
        let path = format!("/sessions/{session}/runs");
        self.run_from(&path, json!({ "message": message })).await
    }

    /// Post `decisions` for the session's waiting calls; the id of the run that resumes it.
    async fn decide(&self, session: &str, decisions: Value) -> String {
        let path = format!("/sessions/{session}/decisions");
        self.run_from(&path, json!({ "decisions": decisions }))
            .await
    }

    /// Post `body` to `path`, which starts a run: accepted, the run's id.
    async fn run_from(&self, path: &str, body: Value) -> String {
        let (status, body) = self.post(path, body).await;
        assert_eq!(status, 202, "{body}");
        body["run_id"].as_str().expect("a run id").to_owned()
    }

    /// The run's events from after `last` (or the first), until `until` returns true for one
    /// (included) or the stream ends.
    async fn events(
        &self,
        run: &str,
        last: Option<usize>,
        query: &str,
        until: impl Fn(&Sse) -> bool,
    ) -> Vec<Sse> {
        let mut request = self
            .http
            .get(format!("{}/runs/{run}/events{query}", self.base));
        if let Some(last) = last {
            request = request.header("Last-Event-ID", last.to_string());
        }
        let res = request.send().await.expect("the stream");
        assert_eq!(res.status().as_u16(), 200);
        let mut bytes = res.bytes_stream();
        let (mut buffer, mut events) = (String::new(), Vec::new());
        while let Some(chunk) = bytes.next().await {
            buffer.push_str(&String::from_utf8_lossy(&chunk.expect("bytes")));
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                let field = |name: &str| {
                    block
                        .lines()
                        .find_map(|l| l.strip_prefix(&format!("{name}:")))
                        .map(|v| v.trim_start().to_owned())
                };
                let (Some(id), Some(name), Some(data)) =
                    (field("id"), field("event"), field("data"))
                else {
                    continue; // a keep-alive comment
                };
                let event = Sse {
                    id: id.parse().expect("an id"),
                    name,
                    data: serde_json::from_str(&data).expect("JSON data"),
                };
                let done = until(&event);
                events.push(event);
                if done {
                    return events;
                }
            }
        }
        events
    }

    async fn finished(&self, run: &str) -> Vec<Sse> {
        self.events(run, None, "", |e| e.name.starts_with("run_f"))
            .await
    }
}

fn names(events: &[Sse]) -> Vec<&str> {
    events.iter().map(|e| e.name.as_str()).collect()
}

#[tokio::test]
async fn a_run_streams_its_events_and_its_session_is_stored() {
    let app = serve(|r| r).await;
    let run = app.start("s1", "hi").await;
    let events = app.finished(&run).await;
    assert_eq!(names(&events).first(), Some(&"run_started"));
    assert_eq!(events[0].data["session_id"], "s1");
    let ids: Vec<usize> = events.iter().map(|e| e.id).collect();
    assert_eq!(ids, (0..events.len()).collect::<Vec<_>>(), "ids in order");
    let deltas: Vec<&str> = events
        .iter()
        .filter(|e| e.name == "text_delta")
        .map(|e| e.data["text"].as_str().expect("text"))
        .collect();
    assert!(deltas.len() > 2, "streamed in pieces: {deltas:?}");
    assert_eq!(deltas.concat(), "Hello there, friend.");
    let last = events.last().expect("an end");
    assert_eq!(last.name, "run_finished");
    assert_eq!(last.data["outcome"], "completed");
    assert_eq!(last.data["text"], "Hello there, friend.");

    let (status, session) = app.get("/sessions/s1").await;
    assert_eq!(status, 200);
    assert_eq!(session["history"].as_array().map(Vec::len), Some(2));
}

#[tokio::test]
async fn an_approval_is_asked_in_the_stream_and_decided_over_http() {
    let app = serve(|r| r).await;
    let run = app.start("s2", "write a note").await;
    let events = app.finished(&run).await;
    let last = events.last().expect("an end");
    assert_eq!(last.data["outcome"], "interrupted", "{last:?}");
    let asked = &last.data["interrupts"][0];
    assert_eq!(asked["name"], "write_file");
    assert!(
        asked["allowed"]
            .as_array()
            .is_some_and(|a| a.contains(&json!("approve")))
    );
    assert_eq!(
        app.writes.load(Ordering::SeqCst),
        0,
        "nothing ran unapproved"
    );

    // Decisions that do not fit are refused at once, and change nothing.
    let (status, body) = app
        .post(
            "/sessions/s2/decisions",
            json!({ "decisions": { "nope": { "type": "approve" } } }),
        )
        .await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    let (_, session) = app.get("/sessions/s2").await;
    assert_eq!(session["interrupts"].as_array().map(Vec::len), Some(1));

    let call_id = asked["call_id"].as_str().expect("an id");
    let resumed = app
        .decide("s2", json!({ call_id: { "type": "approve" } }))
        .await;
    let events = app.finished(&resumed).await;
    let finished: Vec<&Sse> = events
        .iter()
        .filter(|e| e.name == "tool_finished")
        .collect();
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0].data["ok"], true);
    let last = events.last().expect("an end");
    assert_eq!(last.data["text"], "Done: wrote note.txt", "{last:?}");
    assert_eq!(app.writes.load(Ordering::SeqCst), 1, "ran once");
}

#[tokio::test]
async fn a_client_that_disconnects_cancels_nothing_and_reads_on_from_its_last_event() {
    let app = serve(|r| r).await;
    let run = app.start("s3", "slow").await;
    // Read until the tool starts, then go away.
    let first = app
        .events(&run, None, "", |e| e.name == "tool_started")
        .await;
    let last = first.last().expect("events").id;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Come back: the events after the last one read, to the end.
    let rest = app
        .events(&run, Some(last), "", |e| e.name.starts_with("run_f"))
        .await;
    assert_eq!(
        rest.first().map(|e| e.id),
        Some(last + 1),
        "{:?}",
        names(&rest)
    );
    let end = rest.last().expect("an end");
    assert_eq!(end.data["outcome"], "completed", "{end:?}");
    assert_eq!(
        app.waits.load(Ordering::SeqCst),
        1,
        "the tool ran to its end"
    );
    // All of it again, from the start: the same events.
    let all = app.finished(&run).await;
    assert_eq!(all.len(), first.len() + rest.len());
}

#[tokio::test]
async fn a_client_may_ask_that_its_disconnect_cancels_the_run() {
    let app = serve(|r| r).await;
    let run = app.start("s4", "slow").await;
    app.events(&run, None, "?cancel_on_disconnect=true", |e| {
        e.name == "tool_started"
    })
    .await;
    let events = app.finished(&run).await;
    assert_eq!(events.last().expect("an end").data["outcome"], "cancelled");
    assert_eq!(
        app.waits.load(Ordering::SeqCst),
        0,
        "the tool was cut short"
    );
}

#[tokio::test]
async fn cancel_and_steer_a_running_run() {
    let app = serve(|r| r).await;
    // Steered while the tool runs: the message goes in before the next model call.
    let run = app.start("s5", "slow").await;
    app.events(&run, None, "", |e| e.name == "tool_started")
        .await;
    let (status, _) = app
        .post(
            &format!("/runs/{run}/steer"),
            json!({ "message": "and then say bye" }),
        )
        .await;
    assert_eq!(status, 202);
    let events = app.finished(&run).await;
    assert_eq!(events.last().expect("an end").data["text"], "Bye!");
    let (status, body) = app
        .post(
            &format!("/runs/{run}/steer"),
            json!({ "message": "too late" }),
        )
        .await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (409, Some("run_over"))
    );

    let run = app.start("s6", "slow").await;
    app.events(&run, None, "", |e| e.name == "tool_started")
        .await;
    let (status, _) = app.post(&format!("/runs/{run}/cancel"), json!(null)).await;
    assert_eq!(status, 202);
    let events = app.finished(&run).await;
    assert_eq!(events.last().expect("an end").data["outcome"], "cancelled");
}

#[tokio::test]
async fn errors_are_typed_answers() {
    let app = serve(|r| r).await;
    let (status, body) = app.get("/runs/nope/events").await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (404, Some("not_found"))
    );
    let (status, body) = app.get("/sessions/nope").await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (404, Some("not_found"))
    );
    let (status, body) = app.post("/sessions/x/runs", json!({ "text": "hi" })).await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    let (status, body) = app
        .post("/sessions/x/decisions", json!({ "decisions": {} }))
        .await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );

    let run = app.start("busy", "slow").await;
    let (status, body) = app
        .post("/sessions/busy/runs", json!({ "message": "hi" }))
        .await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (409, Some("run_in_progress"))
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&run))
    );
    let events = app.finished(&run).await;
    assert_eq!(events.last().expect("an end").data["outcome"], "completed");
    // The refused start changed nothing: the session holds the run that went on, alone.
    let (_, session) = app.get("/sessions/busy").await;
    let texts: Vec<&str> = session["history"]
        .as_array()
        .expect("a history")
        .iter()
        .filter_map(|m| m["content"][0]["text"].as_str())
        .collect();
    assert_eq!(texts, ["slow", "Done: waited"], "{session}");
    // The session is free as soon as the run said it ended.
    app.start("busy", "hi").await;
    // An ended run read from after its last event: nothing more comes, 204 (an `EventSource`
    // does not reconnect).
    let last = events.last().expect("an end").id;
    let res = app
        .http
        .get(format!("{}/runs/{run}/events", app.base))
        .header("Last-Event-ID", last.to_string())
        .send()
        .await
        .expect("an answer");
    assert_eq!(res.status().as_u16(), 204);
}

#[tokio::test]
async fn authentication_is_the_hosts_own_tower_layer() {
    // The host's check of a bearer token: a tower layer of its own on the router.
    let auth = axum::middleware::from_fn(|req: Request<Body>, next: Next| async move {
        match req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
        {
            Some("Bearer s3cret") => next.run(req).await,
            _ => StatusCode::UNAUTHORIZED.into_response(),
        }
    });
    let app = serve(|router| router.layer(auth)).await;
    let (status, _) = app
        .post("/sessions/a/runs", json!({ "message": "hi" }))
        .await;
    assert_eq!(status, 401);
    let res = app
        .http
        .post(format!("{}/sessions/a/runs", app.base))
        .bearer_auth("s3cret")
        .json(&json!({ "message": "hi" }))
        .send()
        .await
        .expect("an answer");
    assert_eq!(res.status().as_u16(), 202);
}

/// What a host serves: the built-ins in their canonical slots on a store (all but memory,
/// fallback, tool selection and the tool cache), with a host model layer that pauses before
/// the model call after a tool round until a decision says `go`.
async fn serve_canonical(store: InMemorySessions) -> App {
    use tower_agent_core::{Flow, Interrupt, ModelPrice, before_model};
    use tower_agent_layers::budget::BudgetLayer;
    use tower_agent_layers::checkpoint::CheckpointLayer;
    use tower_agent_layers::clear::ClearToolResultsLayer;
    use tower_agent_layers::evict::EvictLayer;
    use tower_agent_layers::guardrail::{Guardrail, GuardrailLayer};
    use tower_agent_layers::instructions::InstructionsLayer;
    use tower_agent_layers::limits::{CallLimitsLayer, Limit};
    use tower_agent_layers::redact::{RedactLayer, Replace, Rules};
    use tower_agent_layers::retry::{RetryLayer, RetryPolicy};
    use tower_agent_layers::summarize::{Keep, SummarizeLayer, Trigger};
    use tower_agent_layers::{PatchDanglingLayer, ToolGuardLayer};

    let writes = Arc::new(AtomicUsize::new(0));
    let w = writes.clone();
    let tools = ToolSet::new().tool(tool_fn("write_file", "Writes.", move |_: NoArgs| {
        w.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Error>("wrote note.txt") }
    }));
    let pause = before_model(|req: ModelRequest| async move {
        let after_tools = matches!(req.messages.last(), Some(m) if m.role == Role::Tool);
        Ok(match after_tools && req.ctx.resumed("go-on").is_none() {
            true => Flow::Answer(ModelResponse::pause(Interrupt::before_model(
                "go-on",
                "pause",
                json!("The note is written. Go on?"),
            ))),
            false => Flow::Continue(req),
        })
    });
    let cards = Rules::new()
        .pattern("card", r"\d{4} \d{4} \d{4} \d{4}", Replace::Label)
        .expect("a pattern");
    let agent = Agent::builder()
        .with(StoreLayer::new(store.clone()))
        .with(PatchDanglingLayer::new())
        .with(RedactLayer::new(Rules::new().emails()))
        .with(GuardrailLayer::new().input(Guardrail::blocking("pii", cards)))
        .with(CallLimitsLayer::new().model_calls(Limit::per_run(8)))
        .with(InstructionsLayer::new().text("Be brief."))
        .with(
            SummarizeLayer::in_stack()
                .trigger(Trigger::messages(40))
                .keep(Keep::messages(8)),
        )
        .with(ClearToolResultsLayer::new())
        .with(BudgetLayer::new(ModelPrice::per_million(1.0, 0.1, 2.0)))
        .with(RetryLayer::new(
            RetryPolicy::new().max_attempts(2).max_delay(Duration::ZERO),
        ))
        .with(
            ApprovalLayer::builder()
                .gate("write_file", Gate::new())
                .build()
                .expect("a gate"),
        )
        .with(CheckpointLayer::interrupting().every(20))
        .with(EvictLayer::new(tower_agent_storage::InMemory::new()))
        .with(ToolGuardLayer::new(|_: ToolCall, _| async {
            tower_agent_layers::tool_guard::ToolVerdict::Allow
        }))
        .model_layer(pause)
        .tool_specs(tools.specs())
        .build(model(), tools);
    listen(
        AgentServer::new(agent, store).router(),
        writes,
        Arc::default(),
    )
    .await
}

/// Everything a client of the server can read: every event of the run and the stored session.
async fn everything(app: &App, events: &[Sse], session: &str) -> String {
    let (status, stored) = app.get(&format!("/sessions/{session}")).await;
    assert_eq!(status, 200, "{stored}");
    let events: Vec<&Value> = events.iter().map(|e| &e.data).collect();
    format!("{} {stored}", json!(events))
}

/// The canonical stack served: an email never reaches the stream or the stored session; an
/// approval asked by one server process is decided on another over the same store (a restart)
/// and the tool runs once; a pause before a model call is decided over HTTP; a card number in
/// the input is refused, never stored, and the session goes on.
#[tokio::test]
async fn the_canonical_stack_served_keeps_its_promises_across_a_restart() {
    let store = InMemorySessions::new();
    let first = serve_canonical(store.clone()).await;
    let run = first.start("c1", "write a note to ada@example.com").await;
    let events = first.finished(&run).await;
    let last = events.last().expect("an end");
    assert_eq!(last.data["outcome"], "interrupted", "{last:?}");
    assert_eq!(last.data["interrupts"][0]["name"], "write_file");
    let seen = everything(&first, &events, "c1").await;
    assert!(!seen.contains("ada@example.com"), "{seen}");
    assert!(
        seen.contains("note"),
        "the input is there, redacted: {seen}"
    );
    let call_id = last.data["interrupts"][0]["call_id"]
        .as_str()
        .expect("an id")
        .to_owned();

    // Another process on the same store: the approval is decided there.
    let second = serve_canonical(store.clone()).await;
    let run = second
        .decide("c1", json!({ call_id: { "type": "approve" } }))
        .await;
    let events = second.finished(&run).await;
    let last = events.last().expect("an end");
    assert_eq!(last.data["outcome"], "interrupted", "paused: {last:?}");
    let pause = &last.data["interrupts"][0];
    assert_eq!(
        (&pause["call_id"], &pause["before_model"]),
        (&json!("go-on"), &json!(true)),
        "{pause}"
    );
    assert_eq!(
        (
            first.writes.load(Ordering::SeqCst),
            second.writes.load(Ordering::SeqCst)
        ),
        (0, 1),
        "the write ran once, where it was approved"
    );

    let run = second.decide("c1", json!({ "go-on": "go" })).await;
    let events = second.finished(&run).await;
    let last = events.last().expect("an end");
    assert_eq!(last.data["outcome"], "completed", "{last:?}");
    assert_eq!(last.data["text"], "Done: wrote note.txt");
    assert_eq!(second.writes.load(Ordering::SeqCst), 1, "not run again");
    let seen = everything(&second, &events, "c1").await;
    assert!(!seen.contains("ada@example.com"), "{seen}");

    // A card number: refused, named by its rule, never stored; the session goes on.
    let run = second.start("c1", "pay with 4111 1111 1111 1111").await;
    let events = second.finished(&run).await;
    let last = events.last().expect("an end");
    assert_eq!(last.data["outcome"], "stopped", "{last:?}");
    let reason = last.data["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("pii") && reason.contains("card"),
        "named by its rule: {reason}"
    );
    let seen = everything(&second, &events, "c1").await;
    assert!(!seen.contains("4111 1111"), "{seen}");
    let run = second.start("c1", "bye").await;
    let events = second.finished(&run).await;
    assert_eq!(events.last().expect("an end").data["text"], "Bye!");
    let (status, session) = second.get("/sessions/c1").await;
    assert_eq!(status, 200, "{session}");
    let texts: Vec<String> = session["history"]
        .as_array()
        .expect("a history")
        .iter()
        .map(Value::to_string)
        .collect();
    assert!(
        texts.iter().any(|m| m.contains("Bye!"))
            && texts.iter().any(|m| m.contains("wrote note.txt")),
        "the session goes on after the refusal: {texts:?}"
    );
    assert_eq!(session.get("interrupts"), None, "nothing waits: {session}");
}
