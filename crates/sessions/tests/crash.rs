//! A run killed with SIGKILL in the middle of a tool call is resumed by another process from
//! the store: the call that was in flight is answered (not run again), the finished one is not
//! run again, and the run completes. Real processes: this test runs itself as the agent's
//! process (`CRASH_CHILD`), starts it, kills it with `kill -9`, and starts it again.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use tower::{Layer, ServiceExt};
use tower_agent_core::{
    AgentInput, AgentRequest, ContentPart, ModelResponse, Role, Session, ToolCall, ToolResponse,
};
use tower_agent_layers::patch::PatchDanglingLayer;
use tower_agent_loop::Agent;
use tower_agent_sessions::{SessionStore, SqliteSessions, StoreLayer};
use tower_agent_test::{ScriptedModel, StubTool};
use tower_agent_tools::ToolSet;

/// How many runs are killed and resumed.
const RUNS: usize = 5;

fn main() {
    match std::env::var("CRASH_CHILD") {
        Ok(mode) => child(&mode),
        Err(_) => parent(),
    }
}

/// Append a line to the side-effect log (one `write` per line, flushed).
fn log(path: &Path, line: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("the log opens");
    writeln!(file, "{line}").expect("the log is written");
}

/// The agent's process: `run` starts session `CRASH_SESSION`, `resume` continues it.
fn child(mode: &str) {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let (db, effects, id) = (
        PathBuf::from(var("CRASH_DB")),
        PathBuf::from(var("CRASH_LOG")),
        var("CRASH_SESSION"),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        // Round 1 writes; round 2 calls a slow tool (killed there); then the model answers.
        let model = ScriptedModel::from_fn(|req| {
            let results = req.messages.iter().filter(|m| m.role == Role::Tool).count();
            Ok(match results {
                0 => ModelResponse::tool_calls([ToolCall::new("w1", "write", json!({}))]),
                1 => ModelResponse::tool_calls([ToolCall::new("s2", "slow", json!({}))]),
                _ => ModelResponse::text("finished"),
            })
        });
        let write_log = effects.clone();
        let write = StubTool::from_fn("write", move |req| {
            log(&write_log, &format!("write {}", req.call.id));
            ToolResponse::success(&req.call, "written")
        });
        let slow_log = effects.clone();
        let slow = StubTool::from_fn("slow", move |req| {
            log(&slow_log, &format!("slow {} started", req.call.id));
            std::thread::sleep(Duration::from_secs(600)); // killed meanwhile
            ToolResponse::success(&req.call, "slow done")
        });
        let store = SqliteSessions::open(&db).await.expect("the store opens");
        let agent = Agent::new(model, ToolSet::new().tool(write).tool(slow));
        let agent = StoreLayer::new(store).layer(PatchDanglingLayer::new().layer(agent));
        let input = match mode {
            "run" => AgentInput::from("go"),
            _ => AgentInput::Continue,
        };
        let res = agent
            .oneshot(AgentRequest::new(Session::with_id(id), input))
            .await
            .expect("the run completes");
        println!("answer: {}", res.text().unwrap_or_default());
    });
}

fn spawn(mode: &str, db: &Path, effects: &Path, id: &str) -> Child {
    Command::new(std::env::current_exe().expect("this test's path"))
        .env("CRASH_CHILD", mode)
        .env("CRASH_DB", db)
        .env("CRASH_LOG", effects)
        .env("CRASH_SESSION", id)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the agent's process starts")
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn parent() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("sessions.db");
    let effects = dir.path().join("effects.log");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    for run in 0..RUNS {
        let id = format!("crash/{run}");
        let started = "slow s2 started".to_owned();
        let before = lines(&effects).len();
        // The first process: killed with SIGKILL while the slow tool runs.
        let mut first = spawn("run", &db, &effects, &id);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !lines(&effects)[before..].contains(&started) {
            if let Some(status) = first.try_wait().expect("waits") {
                let output = first.wait_with_output().expect("its output");
                panic!(
                    "the agent's process ended before the kill ({status}): {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            assert!(Instant::now() < deadline, "the slow tool never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        first.kill().expect("kill -9"); // SIGKILL on Unix
        first.wait().expect("reaped");

        // What the store holds: the slow call, unanswered.
        let store = runtime
            .block_on(SqliteSessions::open(&db))
            .expect("the store opens");
        let stored = runtime
            .block_on(store.load(&id))
            .expect("loads")
            .expect("saved before the kill");
        let last = stored.session.history.last().expect("messages");
        assert_eq!(
            last.tool_calls().map(|c| c.id.as_str()).collect::<Vec<_>>(),
            ["s2"],
            "the call in flight was saved before it ran"
        );

        // The second process resumes from the session id alone.
        let second = spawn("resume", &db, &effects, &id);
        let output = second.wait_with_output().expect("the resumed run ends");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "the resumed run failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("answer: finished"), "{stdout}");

        // Every finished call ran once; the one in flight was answered, not run again.
        let effects_of_run = lines(&effects)[before..].to_vec();
        assert_eq!(effects_of_run, ["write w1", started.as_str()], "run {run}");
        let done = runtime
            .block_on(store.load(&id))
            .expect("loads")
            .expect("stored");
        done.session.history.validate().expect("a valid history");
        let answered = done
            .session
            .history
            .iter()
            .flat_map(|m| &m.content)
            .find_map(|p| match p {
                ContentPart::ToolResult(r) if r.call_id == "s2" => Some(r.clone()),
                _ => None,
            });
        let answered = answered.expect("the call in flight has a result");
        assert!(answered.is_error, "{answered:?}");
        assert_eq!(
            done.session.history.last().map(|m| m.text()).as_deref(),
            Some("finished")
        );
    }
    println!(
        "crash: {RUNS} processes killed with SIGKILL mid-tool-call; {RUNS} runs resumed by another \
         process and completed; every finished tool call ran exactly once"
    );
}
