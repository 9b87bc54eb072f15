//! Tools for [tower-agent](https://docs.rs/tower-agent): a [`ToolSet`] that routes calls by
//! name, and typed tools ([`tool_fn`]) whose JSON schema is derived from their argument type
//! with [`schemars`].
//!
//! A tool is an ordinary `tower::Service<ToolRequest>`, so tower middleware (timeout,
//! concurrency limit, rate limit) applies to one tool at a time.
//!
//! ```
//! use std::time::Duration;
//! use schemars::JsonSchema;
//! use serde::Deserialize;
//! use serde_json::json;
//! use tower::{timeout::TimeoutLayer, ServiceExt};
//! use tower_agent_core::{Error, RunContext, ToolCall, ToolRequest};
//! use tower_agent_tools::{tool_fn, ToolSet};
//!
//! #[derive(Deserialize, JsonSchema)]
//! struct AddArgs {
//!     /// The first number.
//!     a: i64,
//!     /// The second number.
//!     b: i64,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let add = tool_fn("add", "Add two numbers.", |args: AddArgs| async move {
//!     Ok::<_, Error>(args.a + args.b)
//! });
//! let tools = ToolSet::new()
//!     .tool_with_layer(add, TimeoutLayer::new(Duration::from_secs(5)));
//! assert_eq!(tools.specs()[0].parameters["properties"]["a"]["type"], "integer");
//!
//! let call = ToolCall::new("call_1", "add", json!({ "a": 2, "b": 3 }));
//! let res = tools.clone().oneshot(ToolRequest::new(call, RunContext::new())).await?;
//! assert_eq!(res.result.content, "5");
//!
//! // Bad input is an error result the model sees, not a failure.
//! let call = ToolCall::raw("call_2", "add", r#"{"a": 2"#);
//! let res = tools.oneshot(ToolRequest::new(call, RunContext::new())).await?;
//! assert!(res.result.is_error);
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod function;
mod recover;
mod schema;
mod set;

pub use function::{FnTool, Reply, ToolContext, ToolHandler, ToolOutput, tool_fn};
pub use recover::Reconcile;
pub use schema::{NoArgs, parameters_schema, response_format};
pub use set::ToolSet;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The response future of [`ToolSet`] and of typed tools ([`FnTool`]): a boxed future in a
/// named type, so that it can change without breaking users.
pub struct ResponseFuture {
    inner: Pin<Box<dyn Future<Output = Result<ToolResponse, Error>> + Send>>,
}

impl ResponseFuture {
    /// A boxed future: for a tool service written by hand.
    pub fn new(future: impl Future<Output = Result<ToolResponse, Error>> + Send + 'static) -> Self {
        Self {
            inner: Box::pin(future),
        }
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<ToolResponse, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

use tower_agent_core::{Error, ToolRequest, ToolResponse, ToolSpec};
use tower_service::Service;

/// A tool: a tool service that knows its own spec.
///
/// Its future is `Send + 'static` by definition, so a function returning `impl Tool` can be
/// handed to [`ToolSet::tool`] as it is.
pub trait Tool:
    Service<ToolRequest, Response = ToolResponse, Error = Error, Future: Send + 'static>
    + Clone
    + Send
    + Sync
    + 'static
{
    /// The spec offered to the model.
    fn spec(&self) -> ToolSpec;

    /// Its reconcile step, if it has one: what became of a call an earlier run started and
    /// did not finish ([`ToolRequest::recover`]). Without one, [`ToolSet`] answers such a call
    /// [`Recovery::Unknown`](tower_agent_core::Recovery::Unknown) (the model is told to
    /// check), unless the tool may repeat ([`ToolSpec::may_repeat`]): then it runs again.
    fn reconcile(&self) -> Option<Reconcile> {
        None
    }
}
