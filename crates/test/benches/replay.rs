//! A 100-round run replayed from its cassette: the agent loop with a stub tool, every model
//! call answered by the cassette (each request encoded, hashed and looked up). Recorded once
//! from a scripted model: 99 rounds calling a tool, then the answer. Run:
//! `cargo bench -p tower-agent-test --bench replay`.

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use tower::ServiceExt;
use tower_agent_core::{AgentRequest, ModelResponse, Session, ToolCall};
use tower_agent_loop::Agent;
use tower_agent_test::cassette::{Cassette, Mode};
use tower_agent_test::{ScriptedModel, StubTool};
use tower_agent_tools::ToolSet;

const ROUNDS: usize = 100;

fn agent<M>(model: M) -> Agent<M, ToolSet> {
    Agent::builder()
        .max_rounds(ROUNDS as u32)
        .build(model, tools())
}

fn tools() -> ToolSet {
    ToolSet::new().tool(StubTool::returning("lookup", "a result of a few words"))
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let path =
        std::env::temp_dir().join(format!("tower-agent-replay-{}.jsonl", std::process::id()));
    let script = (1..ROUNDS)
        .map(|i| {
            ModelResponse::tool_calls([ToolCall::new(
                format!("c{i}"),
                "lookup",
                json!({"q": format!("question {i}")}),
            )])
        })
        .chain([ModelResponse::text("done")]);
    let recording = Cassette::open(&path, Mode::Record).expect("a cassette");
    let model = tower::Layer::layer(&recording.layer(), ScriptedModel::new(script));
    let recorded = rt
        .block_on(agent(model).oneshot(AgentRequest::new(Session::new(), "go")))
        .expect("recorded");
    assert_eq!(recording.len(), ROUNDS);

    c.bench_function("replay_100_rounds", |b| {
        b.iter(|| {
            let replay = Cassette::open(&path, Mode::Replay).expect("the cassette");
            let replayed = rt
                .block_on(agent(replay.model()).oneshot(AgentRequest::new(Session::new(), "go")))
                .expect("replayed");
            assert_eq!(replayed.rounds, recorded.rounds);
        });
    });
    let _ = std::fs::remove_file(&path);
}

criterion_group!(benches, bench);
criterion_main!(benches);
