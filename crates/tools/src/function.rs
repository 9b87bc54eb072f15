//! Typed tools built from async functions.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
#[cfg(doc)]
use tower_agent_core::ToolAction;
use tower_agent_core::{
    CallKey, DecisionKind, Error, Recovery, RunContext, ToolCall, ToolRequest, ToolResponse,
    ToolSpec,
};
use tower_service::Service;

use crate::recover::recovered;
use crate::schema::parameters_schema;
use crate::{Reconcile, ResponseFuture, Tool};

/// An async function usable as a typed tool: `Fn(Args)`, `Fn(Args, RunContext)` or
/// `Fn(Args, ToolContext)`, returning `Result<Output, Err>` where `Output:`[`ToolOutput`]
/// (anything `Serialize`, or a [`Reply`]) and `Err: Display`.
///
/// The output becomes the result's content: a string as is, anything else as JSON text. The
/// error becomes an error result the model sees (its `Display` text). A [`Reply::Interrupt`]
/// pauses the run for the host; the call is run again on resume, with the host's answer in
/// [`ToolContext::resume`].
///
/// `M` only tells the function shapes apart; you never name it.
pub trait ToolHandler<M>: Clone + Send + Sync + 'static {
    /// The arguments, deserialized from the call and described by their JSON schema.
    type Args: DeserializeOwned + JsonSchema;
    /// What the tool returns on success.
    type Output: ToolOutput;
    /// What the tool returns on failure.
    type Error: fmt::Display;
    /// The function's future.
    type Future: Future<Output = Result<Self::Output, Self::Error>> + Send + 'static;

    /// Run the function on the call's arguments; `call` and `resume` are the request's.
    fn call(
        &self,
        args: Self::Args,
        ctx: RunContext,
        call: &ToolCall,
        resume: Option<Value>,
    ) -> Self::Future;
}

impl<F, Fut, A, O, E> ToolHandler<(A,)> for F
where
    F: Fn(A) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<O, E>> + Send + 'static,
    A: DeserializeOwned + JsonSchema,
    O: ToolOutput,
    E: fmt::Display,
{
    type Args = A;
    type Output = O;
    type Error = E;
    type Future = Fut;

    fn call(&self, args: A, _ctx: RunContext, _call: &ToolCall, _resume: Option<Value>) -> Fut {
        self(args)
    }
}

impl<F, Fut, A, O, E> ToolHandler<(A, RunContext)> for F
where
    F: Fn(A, RunContext) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<O, E>> + Send + 'static,
    A: DeserializeOwned + JsonSchema,
    O: ToolOutput,
    E: fmt::Display,
{
    type Args = A;
    type Output = O;
    type Error = E;
    type Future = Fut;

    fn call(&self, args: A, ctx: RunContext, _call: &ToolCall, _resume: Option<Value>) -> Fut {
        self(args, ctx)
    }
}

impl<F, Fut, A, O, E> ToolHandler<(A, ToolContext)> for F
where
    F: Fn(A, ToolContext) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<O, E>> + Send + 'static,
    A: DeserializeOwned + JsonSchema,
    O: ToolOutput,
    E: fmt::Display,
{
    type Args = A;
    type Output = O;
    type Error = E;
    type Future = Fut;

    fn call(&self, args: A, ctx: RunContext, call: &ToolCall, resume: Option<Value>) -> Fut {
        self(
            args,
            ToolContext {
                ctx,
                call: call.clone(),
                resume,
            },
        )
    }
}

/// What a typed tool of the shape `Fn(Args, ToolContext)` sees besides its arguments: the run
/// context (it derefs to [`RunContext`]), its call, and the value the run was resumed with.
///
/// ```
/// use schemars::JsonSchema;
/// use serde::Deserialize;
/// use serde_json::json;
/// use tower::ServiceExt;
/// use tower_agent_core::{Error, RunContext, ToolAction, ToolCall, ToolRequest};
/// use tower_agent_tools::{tool_fn, Reply, ToolContext};
///
/// #[derive(Deserialize, JsonSchema)]
/// struct Delete {
///     pattern: String,
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// // Asks the human which of the matching files to delete, then deletes that one.
/// let delete = tool_fn("delete", "Delete a file.", |args: Delete, cx: ToolContext| async move {
///     match cx.resume_as::<String>() {
///         None => Ok(Reply::ask(json!({"question": "which file?", "options": ["a.txt", "b.txt"]}))),
///         Some(Ok(file)) => Ok(Reply::Done(format!("deleted {file} ({})", args.pattern))),
///         Some(Err(error)) => Err(format!("not a file name: {error}")),
///     }
/// });
///
/// let call = ToolCall::new("c1", "delete", json!({"pattern": "*.txt"}));
/// let first = delete.clone().oneshot(ToolRequest::new(call.clone(), RunContext::new())).await?;
/// assert!(matches!(first.action, ToolAction::Interrupt(_)));
///
/// let mut again = ToolRequest::new(call, RunContext::new());
/// again.resume = Some(json!("b.txt"));
/// let second = delete.oneshot(again).await?;
/// assert_eq!(second.result.content, "deleted b.txt (*.txt)");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ToolContext {
    ctx: RunContext,
    call: ToolCall,
    resume: Option<Value>,
}

impl ToolContext {
    /// The run context.
    pub fn run(&self) -> &RunContext {
        &self.ctx
    }

    /// The call being executed (its id, tool name and raw arguments).
    pub fn call(&self) -> &ToolCall {
        &self.call
    }

    /// The call's key ([`ToolCall::key`]): the same on every try of this call, another for
    /// every other call. Send it with the effect (an `Idempotency-Key` header, a payment's
    /// reference) so that it happens once.
    pub fn key(&self) -> Option<CallKey> {
        self.call.key
    }

    /// The value the host resumed this call with; `None` on a first execution.
    pub fn resume(&self) -> Option<&Value> {
        self.resume.as_ref()
    }

    /// The resume value as a `T`; `None` on a first execution.
    pub fn resume_as<T: DeserializeOwned>(&self) -> Option<Result<T, serde_json::Error>> {
        self.resume.as_ref().map(T::deserialize)
    }
}

impl std::ops::Deref for ToolContext {
    type Target = RunContext;

    fn deref(&self) -> &RunContext {
        &self.ctx
    }
}

/// What a typed tool returns: a value, or a pause for the host.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply<O> {
    /// The tool's output.
    Done(O),
    /// Pause the run at this call with `payload` for the host ([`ToolAction::Interrupt`]);
    /// the call runs again on resume, with the host's value in [`ToolContext::resume`].
    Interrupt {
        /// What the host needs to decide.
        payload: Value,
        /// The decisions the call takes; empty: any value.
        allowed: Vec<DecisionKind>,
    },
}

impl<O> Reply<O> {
    /// Pause the run with `payload` (for example a question); the answer may be any value.
    pub fn ask(payload: Value) -> Self {
        Reply::Interrupt {
            payload,
            allowed: Vec::new(),
        }
    }
}

/// The output of a typed tool: anything `Serialize` (a string as is, anything else as JSON
/// text), or a [`Reply`].
pub trait ToolOutput {
    /// The response for `call`.
    fn into_response(self, call: &ToolCall) -> ToolResponse;
}

impl<T: Serialize> ToolOutput for T {
    fn into_response(self, call: &ToolCall) -> ToolResponse {
        match render(&self) {
            Ok(content) => ToolResponse::success(call, content),
            Err(error) => ToolResponse::error(
                call,
                format!("the tool's output could not be serialized: {error}"),
            ),
        }
    }
}

impl<O: Serialize> ToolOutput for Reply<O> {
    fn into_response(self, call: &ToolCall) -> ToolResponse {
        match self {
            Reply::Done(output) => output.into_response(call),
            Reply::Interrupt { payload, allowed } => ToolResponse::review(call, payload, allowed),
        }
    }
}

/// A typed tool from an async function; its parameters' schema is derived from the argument
/// type. See the [crate docs](crate) for an example.
///
/// ```
/// use schemars::JsonSchema;
/// use serde::Deserialize;
/// use tower_agent_core::{Error, RunContext};
/// use tower_agent_tools::{tool_fn, Tool};
///
/// #[derive(Deserialize, JsonSchema)]
/// struct Note {
///     text: String,
/// }
///
/// // A tool that writes into the session state through the run context.
/// let remember = tool_fn("remember", "Remember a note.", |note: Note, ctx: RunContext| async move {
///     ctx.set_state("note", &note.text);
///     Ok::<_, Error>("saved")
/// });
/// assert_eq!(remember.spec().name, "remember");
/// ```
///
/// # Panics
///
/// When the argument type is not a JSON object (see [`parameters_schema`]).
pub fn tool_fn<H, M>(
    name: impl Into<String>,
    description: impl Into<String>,
    handler: H,
) -> FnTool<H, M>
where
    H: ToolHandler<M>,
{
    FnTool::new(name, description, handler)
}

/// The tool [`tool_fn`] builds.
pub struct FnTool<H, M> {
    spec: Arc<ToolSpec>,
    handler: H,
    reconcile: Option<Reconcile>,
    _marker: PhantomData<fn() -> M>,
}

impl<H: ToolHandler<M>, M> FnTool<H, M> {
    /// A tool named `name`.
    ///
    /// # Panics
    ///
    /// When the argument type is not a JSON object (see [`parameters_schema`]).
    pub fn new(name: impl Into<String>, description: impl Into<String>, handler: H) -> Self {
        let spec = ToolSpec::new(name, description, parameters_schema::<H::Args>());
        Self {
            spec: Arc::new(spec),
            handler,
            reconcile: None,
            _marker: PhantomData,
        }
    }

    /// Mark the tool as one that only reads ([`ToolSpec::read_only`]): an agent built with
    /// `early_tool_start(true)` may start it while the model still streams.
    pub fn read_only(mut self) -> Self {
        Arc::make_mut(&mut self.spec).read_only = true;
        self
    }

    /// Mark the tool as idempotent ([`ToolSpec::idempotent`]): a second call with the same
    /// arguments changes nothing more, so a call an earlier run started and did not finish
    /// runs again (with the same key) instead of being reconciled.
    pub fn idempotent(mut self) -> Self {
        Arc::make_mut(&mut self.spec).idempotent = true;
        self
    }

    /// The tool's reconcile step: given the arguments and context of a call an earlier run
    /// started and did not finish (the process running it died), say what became of it by
    /// looking the effect up by the call's key ([`ToolContext::key`]). Never make the effect
    /// here: [`Recovery::NotRun`] tells the model, which may make the call again (a new call,
    /// through every gate). Arguments that do not parse never ran: [`Recovery::NotRun`].
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use schemars::JsonSchema;
    /// use serde::Deserialize;
    /// use serde_json::json;
    /// use tower::ServiceExt;
    /// use tower_agent_core::{CallKey, Error, Recovery, RunContext, ToolCall, ToolRequest};
    /// use tower_agent_tools::{ToolContext, ToolSet, tool_fn};
    ///
    /// #[derive(Deserialize, JsonSchema)]
    /// struct Pay {
    ///     cents: u64,
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Error> {
    /// // The ledger the payments go to, by key.
    /// let ledger: Arc<Mutex<Vec<(CallKey, u64)>>> = Arc::default();
    /// let (paid, looked) = (ledger.clone(), ledger.clone());
    /// let pay = tool_fn("pay", "Pay.", move |args: Pay, cx: ToolContext| {
    ///     let ledger = paid.clone();
    ///     async move {
    ///         let key = cx.key().ok_or_else(|| Error::bad_request("a call without a key"))?;
    ///         ledger.lock().unwrap().push((key, args.cents));
    ///         Ok::<_, Error>(format!("paid {}", args.cents))
    ///     }
    /// })
    /// .reconcile(move |_: Pay, cx: ToolContext| {
    ///     let ledger = looked.clone();
    ///     async move {
    ///         let paid = ledger.lock().unwrap().iter().find(|(key, _)| Some(*key) == cx.key()).copied();
    ///         match paid {
    ///             Some((_, cents)) => Recovery::done(format!("paid {cents}")),
    ///             None => Recovery::NotRun,
    ///         }
    ///     }
    /// });
    /// let tools = ToolSet::new().tool(pay);
    ///
    /// let mut call = ToolCall::new("c1", "pay", json!({"cents": 250}));
    /// call.key = Some(CallKey::from_u128(7));
    /// let paid = tools.clone().oneshot(ToolRequest::new(call.clone(), RunContext::new())).await?;
    /// assert_eq!(paid.result.content, "paid 250");
    ///
    /// // The process died before the result was saved: the next run recovers the call.
    /// let mut again = ToolRequest::new(call, RunContext::new());
    /// again.recover = true;
    /// let recovered = tools.oneshot(again).await?;
    /// assert_eq!(recovered.result.content, "paid 250");
    /// assert_eq!(ledger.lock().unwrap().len(), 1, "paid once");
    /// # Ok(())
    /// # }
    /// ```
    pub fn reconcile<R, Fut>(mut self, step: R) -> Self
    where
        R: Fn(H::Args, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Recovery> + Send + 'static,
    {
        self.reconcile = Some(Reconcile::new(move |req: ToolRequest| {
            let ToolRequest {
                call, ctx, resume, ..
            } = req;
            let asked = parse_object::<H::Args>(&call).map(|args| {
                let cx = ToolContext { ctx, call, resume };
                step(args, cx)
            });
            async move {
                match asked {
                    Ok(asked) => asked.await,
                    Err(_) => Recovery::NotRun,
                }
            }
        }));
        self
    }
}

impl<H: Clone, M> Clone for FnTool<H, M> {
    fn clone(&self) -> Self {
        Self {
            spec: self.spec.clone(),
            handler: self.handler.clone(),
            reconcile: self.reconcile.clone(),
            _marker: PhantomData,
        }
    }
}

impl<H, M> fmt::Debug for FnTool<H, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnTool")
            .field("name", &self.spec.name)
            .finish_non_exhaustive()
    }
}

impl<H, M> Service<ToolRequest> for FnTool<H, M>
where
    H: ToolHandler<M>,
    M: 'static,
{
    type Response = ToolResponse;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        if let Some(answer) = recovered(Some(&self.spec), self.reconcile.as_ref(), &req) {
            return answer;
        }
        let ToolRequest {
            call, ctx, resume, ..
        } = req;
        let args = match parse_object::<H::Args>(&call) {
            Ok(args) => args,
            Err(error) => {
                let message = format!(
                    "invalid arguments for tool `{}`: {error}. Expected arguments matching this JSON schema: {}",
                    self.spec.name, self.spec.parameters
                );
                return ResponseFuture::new(std::future::ready(Ok(ToolResponse::error(
                    &call, message,
                ))));
            }
        };
        let future = self.handler.call(args, ctx, &call, resume);
        ResponseFuture::new(async move {
            Ok(match future.await {
                Ok(output) => output.into_response(&call),
                Err(error) => ToolResponse::error(&call, error.to_string()),
            })
        })
    }
}

impl<H, M> Tool for FnTool<H, M>
where
    H: ToolHandler<M>,
    M: 'static,
{
    fn spec(&self) -> ToolSpec {
        (*self.spec).clone()
    }

    fn reconcile(&self) -> Option<Reconcile> {
        self.reconcile.clone()
    }
}

/// The arguments, which must be a JSON object (or empty, meaning `{}`): serde's derived
/// deserializer would also map a JSON array onto a struct's fields by position, so a model
/// that swapped two values would make a silently wrong call.
fn parse_object<A: DeserializeOwned>(call: &ToolCall) -> Result<A, String> {
    match call.arguments.trim_start().as_bytes().first() {
        None | Some(b'{') => call.parse_arguments().map_err(|e| e.to_string()),
        Some(_) => Err("the arguments are not a JSON object".to_owned()),
    }
}

/// A string as is; anything else as compact JSON.
fn render<O: Serialize>(output: &O) -> serde_json::Result<String> {
    Ok(match serde_json::to_value(output)? {
        Value::String(text) => text,
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;
    use tower::ServiceExt;

    #[derive(Deserialize, JsonSchema)]
    struct Args {
        n: u32,
    }

    fn req(args: &str) -> ToolRequest {
        ToolRequest::new(ToolCall::raw("c1", "t", args), RunContext::new())
    }

    #[tokio::test]
    async fn outputs_render_as_text_or_json() {
        let text = tool_fn("t", "", |a: Args| async move {
            Ok::<_, Error>(format!("n={}", a.n))
        });
        let res = text.oneshot(req(r#"{"n":1}"#)).await.unwrap();
        assert_eq!(res.result.content, "n=1");
        assert_eq!(res.result.call_id, "c1");
        assert!(!res.result.is_error);

        let json = tool_fn("t", "", |a: Args| async move {
            Ok::<_, Error>(json!({ "double": a.n * 2 }))
        });
        let res = json.oneshot(req(r#"{"n":4}"#)).await.unwrap();
        assert_eq!(res.result.content, r#"{"double":8}"#);
    }

    #[tokio::test]
    async fn bad_arguments_and_failures_are_error_results() {
        let tool = tool_fn("t", "", |a: Args| async move {
            if a.n == 0 {
                Err("n must be positive")
            } else {
                Ok(a.n)
            }
        });
        let res = tool.clone().oneshot(req("not json")).await.unwrap();
        assert!(res.result.is_error);
        assert!(
            res.result
                .content
                .contains("invalid arguments for tool `t`"),
            "{}",
            res.result.content
        );

        let res = tool.clone().oneshot(req(r#"{"n":"three"}"#)).await.unwrap();
        assert!(res.result.is_error);
        assert!(
            res.result.content.contains("invalid type"),
            "{}",
            res.result.content
        );

        let res = tool.clone().oneshot(req(r#"{"n":0}"#)).await.unwrap();
        assert!(res.result.is_error);
        assert_eq!(res.result.content, "n must be positive");

        // An array would fill the struct's fields by position: refused, the schema named.
        for not_an_object in ["[1]", " [1]", "1", "\"n\"", "null", "true"] {
            let res = tool.clone().oneshot(req(not_an_object)).await.unwrap();
            assert!(res.result.is_error, "{not_an_object}");
            assert!(
                res.result.content.contains("not a JSON object")
                    && res.result.content.contains(r#""type":"object""#),
                "{not_an_object}: {}",
                res.result.content
            );
        }
    }

    #[tokio::test]
    async fn positional_arrays_do_not_swap_fields() {
        #[derive(Deserialize, JsonSchema)]
        struct Move {
            from: String,
            to: String,
        }
        let tool = tool_fn("mv", "", |m: Move| async move {
            Ok::<_, Error>(format!("{} -> {}", m.from, m.to))
        });
        let res = tool.oneshot(req(r#"["b", "a"]"#)).await.unwrap();
        assert!(res.result.is_error, "{}", res.result.content);
    }

    #[tokio::test]
    async fn empty_arguments_mean_no_arguments() {
        let tool = tool_fn("t", "", |_: crate::NoArgs| async { Ok::<_, Error>("ran") });
        let res = tool.oneshot(req("  ")).await.unwrap();
        assert_eq!(res.result.content, "ran");
    }

    /// A function returning `impl Tool` goes into a `ToolSet` without naming its future.
    fn make_tool() -> impl Tool {
        tool_fn("made", "", |_: crate::NoArgs| async {
            Ok::<_, Error>("made")
        })
    }

    #[tokio::test]
    async fn impl_tool_goes_into_a_tool_set() {
        let set = crate::ToolSet::new().tool(make_tool());
        let request = ToolRequest::new(ToolCall::raw("c1", "made", "{}"), RunContext::new());
        let res = set.oneshot(request).await.unwrap();
        assert_eq!(res.result.content, "made");
    }

    #[tokio::test]
    async fn context_is_handed_to_two_argument_functions() {
        let tool = tool_fn("t", "", |a: Args, ctx: RunContext| async move {
            ctx.set_state("last", a.n);
            Ok::<_, Error>("ok")
        });
        let ctx = RunContext::new();
        let request = ToolRequest::new(ToolCall::raw("c", "t", r#"{"n":7}"#), ctx.clone());
        tool.oneshot(request).await.unwrap();
        assert_eq!(ctx.state::<u32>("last"), Some(7));
    }
}
