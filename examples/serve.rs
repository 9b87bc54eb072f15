//! Serve an agent over HTTP with a page a person uses: chat with it, watch the text stream in
//! and the tool log fill (✓/✗), approve or reject a gated call.
//!
//! ```sh
//! cargo run --example serve --features server,providers
//! # then open http://127.0.0.1:3000 (ADDR=127.0.0.1:8000 to listen elsewhere)
//! ```
//!
//! The model is the one `chat` picks from the environment, the offline demo model by default.
//! The page (`examples/web/index.html`: one file, no build step, no framework) talks to the
//! routes of `tower_agent::server::AgentServer`, nested under `/api`. Sessions are kept in
//! memory; `write_file` waits for a decision from the page (the approval layer interrupts the
//! run, the page resumes it).

use axum::Router;
use axum::response::Html;
use axum::routing::get;
use tower_agent::layers::PatchDanglingLayer;
use tower_agent::layers::approval::{ApprovalLayer, Gate};
use tower_agent::prelude::*;
use tower_agent::server::AgentServer;
use tower_agent::sessions::{InMemorySessions, StoreLayer};

#[path = "common/demo.rs"]
mod demo;

/// The page, served at `/`.
const PAGE: &str = include_str!("web/index.html");

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (model, name) = demo::model();
    let tools = demo::file_tools();
    let store = InMemorySessions::new();
    let agent = Agent::builder()
        .system("You are a helpful assistant. Use the tools for files.")
        .with(StoreLayer::new(store.clone()))
        .with(PatchDanglingLayer::new())
        .with(
            ApprovalLayer::builder()
                .gate("write_file", Gate::new().allow(["approve", "reject"]))
                .build()?,
        )
        .tool_specs(tools.specs())
        .build(model, tools);
    let app = Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .nest("/api", AgentServer::new(agent, store).router());
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("serving {name} on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
