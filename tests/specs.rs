//! What the library itself offers a model is written for a model: the specs of its built-in
//! tools carry no rustdoc markup and no Rust-only schema formats.

#![cfg(all(feature = "evict", feature = "workflow"))]

use tower_agent::layers::evict::EvictLayer;
use tower_agent::prelude::*;
use tower_agent::storage::InMemory;
use tower_agent::workflow::AgentTool;
use tower_agent_test::ScriptedModel;

/// What a model must not read in a spec: rustdoc's link markup, Rust's number formats.
const RUSTDOC: &[&str] = &[
    "[`",
    "`]",
    "](",
    "][",
    "crate::",
    "super::",
    "\"format\":\"uint",
    "\"format\":\"int",
    "\"format\":\"double",
    "\"format\":\"float",
];

#[test]
fn the_specs_the_library_sends_are_written_for_a_model() {
    let agent = Agent::new(ScriptedModel::new([]), ToolSet::new());
    let specs = [
        EvictLayer::new(InMemory::new()).read_tool().spec(),
        AgentTool::new("researcher", "Finds things out.", agent).spec(),
    ];
    for spec in specs {
        let text = serde_json::to_string(&spec).expect("a spec serializes");
        for markup in RUSTDOC {
            assert!(
                !text.contains(markup),
                "{markup} in the spec of {}: {text}",
                spec.name
            );
        }
        assert!(!spec.description.is_empty(), "{}", spec.name);
    }
}
