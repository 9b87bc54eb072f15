//! The memory layer on a real agent.

#![cfg(feature = "memory")]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{
    AgentRequest, Error, ErrorKind, Event, Message, ModelResponse, Session, ToolCall,
};
use tower_agent_layers::memory::{Directory, MemoryLayer, MemorySource};
use tower_agent_loop::Agent;
use tower_agent_test::{EventRecorder, ScriptedModel, StubTool};
use tower_agent_tools::ToolSet;

/// A source that counts its reads and fails for one path.
#[derive(Clone, Default)]
struct Counting {
    reads: Arc<AtomicUsize>,
}

impl MemorySource for Counting {
    fn read<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<String>, Error>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            match path {
                "broken.md" => Err(Error::backend(format!(
                    "memory file `{path}`: permission denied"
                ))),
                "missing.md" => Ok(None),
                _ => Ok(Some(format!("notes of {path}"))),
            }
        })
    }
}

/// Three rounds, the same memory layer on the agent and the model.
async fn run(memory: MemoryLayer, recorder: &EventRecorder) -> Result<ScriptedModel, Error> {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "ls", json!({}))]),
        ModelResponse::tool_calls([ToolCall::new("c2", "ls", json!({}))]),
        ModelResponse::text("done"),
    ]);
    let stub = model.clone();
    let model = ServiceBuilder::new().layer(memory.clone()).service(model);
    let agent = Agent::builder().system("Base.").build(
        model,
        ToolSet::new().tool(StubTool::returning("ls", "a.txt")),
    );
    let req = AgentRequest::new(Session::with_id("s"), "go").with_observer(recorder.clone());
    ServiceBuilder::new()
        .layer(memory)
        .service(agent)
        .oneshot(req)
        .await?;
    Ok(stub)
}

#[tokio::test]
async fn files_are_read_once_per_run_and_shown_every_round_in_order() {
    let source = Counting::default();
    let memory = MemoryLayer::new()
        .file(source.clone(), "AGENTS.md")
        .file(source.clone(), "missing.md")
        .file(source.clone(), "team.md");
    let recorder = EventRecorder::new();
    let model = run(memory, &recorder).await.expect("completes");
    assert_eq!(
        source.reads.load(Ordering::SeqCst),
        3,
        "one read per file, not per round"
    );
    let expected = "Base.\n\n<memory path=\"AGENTS.md\">\nnotes of AGENTS.md\n</memory>\n\n\
                    <memory path=\"team.md\">\nnotes of team.md\n</memory>";
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    for req in &requests {
        assert_eq!(req.system.as_deref(), Some(expected), "nothing accumulates");
    }
    let warnings: Vec<_> = recorder
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Warning {
                source: "memory",
                message,
            } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("missing.md"), "{}", warnings[0]);
}

#[tokio::test]
async fn an_unreadable_file_fails_the_run_naming_it_and_keeps_the_session() {
    let memory = MemoryLayer::new()
        .file(Counting::default(), "AGENTS.md")
        .file(Counting::default(), "broken.md");
    let model = ScriptedModel::new([ModelResponse::text("never")]);
    let mut session = Session::with_id("kept");
    session.history.push(Message::user("earlier"));
    let agent = ServiceBuilder::new()
        .layer(memory.clone())
        .service(Agent::new(
            ServiceBuilder::new().layer(memory).service(model.clone()),
            ToolSet::new(),
        ));
    let err = agent
        .oneshot(AgentRequest::new(session, "go"))
        .await
        .expect_err("the file cannot be read");
    assert_eq!(err.kind(), ErrorKind::Backend);
    assert!(err.message().contains("broken.md"), "{}", err.message());
    let session = err.session().expect("the session comes back");
    assert_eq!((session.id.as_str(), session.history.len()), ("kept", 1));
    assert_eq!(model.request_count(), 0);
}

#[tokio::test]
async fn a_large_file_is_clipped_with_a_note() {
    let files = HashMap::from([("big.md".to_owned(), "é".repeat(100))]);
    let memory = MemoryLayer::new().file(files, "big.md").max_bytes(51);
    let model = run(memory, &EventRecorder::new()).await.expect("completes");
    let system = model.requests()[0].system.clone().unwrap_or_default();
    let body = format!(
        "{}\n[clipped: this file has 200 bytes; the first 50 are shown]",
        "é".repeat(25)
    );
    assert!(system.contains(&body), "{system}");
}

#[tokio::test]
async fn a_directory_reads_files_and_refuses_to_leave_its_root() {
    let root = std::env::temp_dir().join(format!("tower-agent-memory-{}", std::process::id()));
    tokio::fs::create_dir_all(root.join("docs"))
        .await
        .expect("temp dir");
    tokio::fs::write(root.join("AGENTS.md"), "be careful")
        .await
        .expect("write");
    tokio::fs::write(root.join("docs/x.md"), "nested")
        .await
        .expect("write");
    let dir = Directory::new(&root);
    assert_eq!(
        dir.read("AGENTS.md").await.expect("read").as_deref(),
        Some("be careful")
    );
    assert_eq!(
        dir.read("docs/x.md").await.expect("read").as_deref(),
        Some("nested")
    );
    assert_eq!(
        dir.read("nope.md").await.expect("missing is not an error"),
        None
    );
    for escape in ["../etc/passwd", "/etc/passwd", "docs/../../x"] {
        let err = dir.read(escape).await.expect_err(escape);
        assert_eq!(err.kind(), ErrorKind::BadRequest, "{escape}");
    }
    // A link inside the root that points out of it is refused.
    #[cfg(unix)]
    {
        let outside =
            std::env::temp_dir().join(format!("tower-agent-outside-{}.md", std::process::id()));
        tokio::fs::write(&outside, "secret").await.expect("write");
        let _ = tokio::fs::remove_file(root.join("link.md")).await;
        std::os::unix::fs::symlink(&outside, root.join("link.md")).expect("symlink");
        let err = dir.read("link.md").await.expect_err("resolves outside");
        assert_eq!(err.kind(), ErrorKind::BadRequest);
        let _ = tokio::fs::remove_file(&outside).await;
    }
    // A directory where a file is expected cannot be read: an error naming the path.
    let err = dir.read("docs").await.expect_err("a directory");
    assert!(err.message().contains("docs"), "{}", err.message());

    let memory = MemoryLayer::from_dir(&root, ["AGENTS.md", "docs/x.md"]);
    let model = run(memory, &EventRecorder::new()).await.expect("completes");
    let system = model.requests()[0].system.clone().unwrap_or_default();
    assert!(
        system.contains("be careful") && system.contains("nested"),
        "{system}"
    );
    let _ = tokio::fs::remove_dir_all(&root).await;
}

#[tokio::test]
async fn files_load_from_a_storage_backend() {
    use tower_agent_storage::{InMemory, LocalFs, Storage, StoragePath};

    let dir = tempfile::tempdir().expect("tempdir");
    let fs = LocalFs::new(dir.path());
    let memory_store = InMemory::new();
    for storage in [&fs as &dyn Storage, &memory_store as &dyn Storage] {
        let path = StoragePath::parse("/memories/AGENTS.md").expect("path");
        storage
            .put(&path, "Always run the tests.".into())
            .await
            .expect("put");
    }
    for layer in [
        MemoryLayer::from_storage(fs.clone(), ["/memories/AGENTS.md", "/memories/gone.md"]),
        MemoryLayer::from_storage(memory_store, ["/memories/AGENTS.md", "/memories/gone.md"]),
    ] {
        let recorder = EventRecorder::new();
        let model = run(layer, &recorder).await.expect("completes");
        let system = model.requests()[2].system.clone().unwrap_or_default();
        assert_eq!(
            &*system,
            "Base.\n\n<memory path=\"/memories/AGENTS.md\">\nAlways run the tests.\n</memory>"
        );
        assert!(
            recorder.events().iter().any(|e| matches!(
                e,
                Event::Warning { source: "memory", message } if message.contains("gone.md")
            )),
            "a missing file is a warning"
        );
    }

    // A path the backend refuses fails the run before it starts, naming the path.
    let recorder = EventRecorder::new();
    let error = run(MemoryLayer::from_storage(fs, ["../etc/passwd"]), &recorder)
        .await
        .expect_err("refused");
    assert_eq!(error.kind(), ErrorKind::BadRequest);
    assert!(error.to_string().contains("../etc/passwd"), "{error}");
}
