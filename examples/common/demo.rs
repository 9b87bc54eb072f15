//! What the chat and serve examples share: file tools inside the current directory, and the
//! model the environment names (or the offline demo model).

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tower::util::BoxCloneService;
use tower_agent::Role;
use tower_agent::prelude::*;
use tower_agent::providers::{Anthropic, Gemini, OpenAi};
use tower_agent_test::ScriptedModel;

/// A model service, boxed.
pub(crate) type Model = BoxCloneService<ModelRequest, ModelResponse, Error>;

/// `list_dir`, `read_file` and `write_file`, inside the current directory.
pub(crate) fn file_tools() -> ToolSet {
    ToolSet::new()
        .tool(tool_fn(
            "list_dir",
            "List a directory (relative path).",
            list_dir,
        ))
        .tool(tool_fn(
            "read_file",
            "Read a text file (relative path).",
            read_file,
        ))
        .tool(tool_fn(
            "write_file",
            "Write a text file (relative path).",
            write_file,
        ))
}

#[derive(Deserialize, JsonSchema)]
struct PathArgs {
    /// A path relative to the current directory.
    path: String,
}

#[derive(Deserialize, JsonSchema)]
struct WriteArgs {
    /// A path relative to the current directory.
    path: String,
    /// The text to write.
    content: String,
}

/// `path` inside the current directory, or an error the model sees.
fn inside(path: &str) -> Result<PathBuf, String> {
    let relative = Path::new(path);
    if relative
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        Ok(relative.to_path_buf())
    } else {
        Err(format!("`{path}` is outside the current directory"))
    }
}

async fn list_dir(args: PathArgs) -> Result<String, String> {
    let mut entries = tokio::fs::read_dir(inside(&args.path)?)
        .await
        .map_err(|e| format!("cannot list `{}`: {e}", args.path))?;
    let mut names = Vec::new();
    while let Ok(Some(entry)) = entries.next_entry().await {
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names.join("\n"))
}

async fn read_file(args: PathArgs) -> Result<String, String> {
    let text = tokio::fs::read_to_string(inside(&args.path)?)
        .await
        .map_err(|e| format!("cannot read `{}`: {e}", args.path))?;
    Ok(text.chars().take(4000).collect())
}

async fn write_file(args: WriteArgs) -> Result<String, String> {
    tokio::fs::write(inside(&args.path)?, &args.content)
        .await
        .map_err(|e| format!("cannot write `{}`: {e}", args.path))?;
    Ok(format!(
        "wrote {} bytes to {}",
        args.content.len(),
        args.path
    ))
}

/// The model the environment names, or the offline demo model.
pub(crate) fn model() -> (Model, String) {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if var("OPENAI_BASE_URL").is_some() || var("OPENAI_API_KEY").is_some() {
        let name = var("OPENAI_MODEL").unwrap_or_else(|| "gpt-4o-mini".into());
        return (
            BoxCloneService::new(OpenAi::new(name.clone())),
            format!("openai {name}"),
        );
    }
    if var("ANTHROPIC_API_KEY").is_some() {
        let name = var("ANTHROPIC_MODEL").unwrap_or_else(|| "claude-sonnet-4-5".into());
        return (
            BoxCloneService::new(Anthropic::new(name.clone())),
            format!("anthropic {name}"),
        );
    }
    if var("GEMINI_API_KEY").is_some() {
        let name = var("GEMINI_MODEL").unwrap_or_else(|| "gemini-2.5-flash".into());
        return (
            BoxCloneService::new(Gemini::new(name.clone())),
            format!("gemini {name}"),
        );
    }
    (
        BoxCloneService::new(demo_model().streaming(3, Duration::from_millis(15))),
        "the offline demo model".into(),
    )
}

/// Offline: lists the directory when asked about files, writes a note when asked to, echoes
/// otherwise.
fn demo_model() -> ScriptedModel {
    ScriptedModel::from_fn(|req: &ModelRequest| {
        let asked = req
            .messages
            .iter()
            .rev()
            .find(|m| m.role == Role::User)
            .map(Message::text)
            .unwrap_or_default()
            .to_lowercase();
        let last_result = req
            .messages
            .last()
            .and_then(|m| m.tool_results().next())
            .cloned();
        let id = |n: &str| format!("demo_{}_{n}", req.messages.len());
        Ok(match last_result {
            Some(result) if result.name == "list_dir" => ModelResponse::text(format!(
                "This directory holds {} entries: {}.",
                result.content.lines().count(),
                result.content.lines().collect::<Vec<_>>().join(", ")
            )),
            Some(result) => ModelResponse::text(format!("Done: {}", result.content)),
            None if asked.contains("file") || asked.contains("list") => ModelResponse::tool_calls(
                [ToolCall::new(id("ls"), "list_dir", json!({ "path": "." }))],
            ),
            None if asked.contains("write") || asked.contains("note") => {
                ModelResponse::tool_calls([ToolCall::new(
                    id("w"),
                    "write_file",
                    json!({ "path": "note.txt", "content": "a note from the demo model\n" }),
                )])
            }
            None => ModelResponse::text(format!(
                "(offline demo model) You said: {asked}. Ask me to list the files, or to write a note."
            )),
        })
    })
}
