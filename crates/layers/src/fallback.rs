//! Model fallback: when the model fails in a way another model may not (an outage, a rate
//! limit, a used-up quota), or answers with a response a predicate rejects, the next model of a
//! chain answers.
//!
//! [`FallbackLayer`] wraps the primary model; [`FallbackLayer::to`] adds the models to try
//! after it, in order. Before each next model the request's stream restarts: readers that got
//! deltas of the failed call get an [`Event::Retract`] telling them to discard them, then an
//! [`Event::Retrying`] names the failure. Errors no other model can fix fail at once: a bad
//! request, refused credentials, a cancelled run ([`FallbackLayer::when`] changes the rule).
//! When every model failed, the call fails with the last model's error (its kind and message),
//! with [`Attempts`] as its source: every model's name and error, in order. The tokens of
//! failed and rejected calls are added to the answer's side usage (or the error's usage).
//! The next model is called even when the failed one's stream reached readers (they get the
//! `Retract`): `RetryPolicy::replay_streamed(false)` governs the retry only, so a reader that
//! cannot take text back uses no fallback chain.
//!
//! Place it outside the retry layer (`Agent::builder()` does, and wraps every model of the
//! chain in the same retry and provider layers as the primary): a model is given up only after
//! its own retries. A summarizer or a judge given the same stack uses the same chain.
//!
//! ```
//! use tower::{Layer, ServiceExt};
//! use tower_agent_core::{Error, ErrorKind, Message, ModelRequest, ModelResponse};
//! use tower_agent_layers::fallback::FallbackLayer;
//! use tower_agent_test::ScriptedModel;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let primary = ScriptedModel::with_results([Err(Error::new(ErrorKind::Overloaded { retry_after: None }, "busy"))]);
//! let backup = ScriptedModel::new([ModelResponse::text("from the backup")]);
//! let model = FallbackLayer::new().to("backup", backup).layer(primary);
//! let res = model.oneshot(ModelRequest::new(vec![Message::user("hi")])).await?;
//! assert_eq!(res.message.text(), "from the backup");
//! # Ok(())
//! # }
//! ```
//!
//! [`Event::Retrying`]: tower_agent_core::Event::Retrying
//! [`Event::Retract`]: tower_agent_core::Event::Retract

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::ServiceExt;
use tower_agent_core::{
    BoxError, BoxModel, Error, ErrorKind, ModelRequest, ModelResponse, Shared, Usage,
};
use tower_layer::Layer;
use tower_service::Service;

/// A model of the chain with its name.
#[derive(Clone)]
struct Link {
    name: Arc<str>,
    model: Shared<BoxModel>,
}

type ErrorRule = Arc<dyn Fn(&Error) -> bool + Send + Sync>;
type ResponseRule = Arc<dyn Fn(&ModelResponse) -> bool + Send + Sync>;

/// Whether the next model is tried after `error`, by default: the provider was unavailable or
/// rate-limited (after the retries, when a retry layer is inside), answered nothing, or the
/// quota is used up. Not after a bad request, refused credentials, a context that is too long,
/// a cancelled run or a tool failure.
pub fn falls_back(error: &Error) -> bool {
    error.kind().is_transient() || error.kind() == ErrorKind::QuotaExhausted
}

/// Model fallback; see the [module docs](self).
#[derive(Clone)]
pub struct FallbackLayer {
    models: Vec<Link>,
    when: ErrorRule,
    reject: Option<ResponseRule>,
}

impl Default for FallbackLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for FallbackLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.names().collect();
        f.debug_struct("FallbackLayer")
            .field("to", &names)
            .field("rejects_responses", &self.reject.is_some())
            .finish_non_exhaustive()
    }
}

impl FallbackLayer {
    /// No model to fall back to yet; the default rule ([`falls_back`]).
    pub fn new() -> Self {
        Self {
            models: Vec::new(),
            when: Arc::new(falls_back),
            reject: None,
        }
    }

    /// Then try `model`, named `name` (in [`Attempts`] and logs).
    pub fn to<M>(mut self, name: impl Into<Arc<str>>, model: M) -> Self
    where
        M: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
        M::Error: Into<BoxError>,
        M::Future: Send + 'static,
    {
        let model = model.map_err(|e: M::Error| Error::from_boxed(e.into()));
        self.models.push(Link {
            name: name.into(),
            model: Shared::new(BoxModel::new(model)),
        });
        self
    }

    /// Try the next model after the errors `rule` accepts (instead of [`falls_back`]).
    pub fn when(mut self, rule: impl Fn(&Error) -> bool + Send + Sync + 'static) -> Self {
        self.when = Arc::new(rule);
        self
    }

    /// Try the next model after any error of a model but a cancelled run: LangChain's
    /// `with_fallbacks` and Vercel AI's fallback providers do this. The default
    /// ([`falls_back`]) does not, since a bad request or refused credentials fail the same
    /// way on every model and each try costs a call; choose this when your models differ in
    /// what they accept.
    pub fn on_any_error(self) -> Self {
        self.when(|_| true)
    }

    /// Try the next model when `rule` rejects a response (a refusal, an empty answer).
    pub fn reject(mut self, rule: impl Fn(&ModelResponse) -> bool + Send + Sync + 'static) -> Self {
        self.reject = Some(Arc::new(rule));
        self
    }

    /// The models to fall back to, each wrapped by `wrap` (the agent builder gives them the
    /// primary's retry and provider layers).
    pub fn map_models(mut self, wrap: impl Fn(BoxModel) -> BoxModel) -> Self {
        for link in &mut self.models {
            link.model = Shared::new(wrap(link.model.get()));
        }
        self
    }

    /// The names of the models to fall back to, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.models.iter().map(|link| &*link.name)
    }
}

impl<S> Layer<S> for FallbackLayer {
    type Service = Fallback<S>;

    fn layer(&self, inner: S) -> Fallback<S> {
        Fallback {
            inner,
            layer: Arc::new(self.clone()),
        }
    }
}

/// The service [`FallbackLayer`] makes.
#[derive(Clone)]
pub struct Fallback<S> {
    inner: S,
    layer: Arc<FallbackLayer>,
}

impl<S> fmt::Debug for Fallback<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fallback")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

/// Every model a failed fallback chain tried, with its error, in order: the source of the
/// error the call fails with.
#[derive(Debug, Clone)]
pub struct Attempts(Vec<(Arc<str>, Error)>);

impl Attempts {
    /// The models' names and errors, in the order they were tried.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Error)> {
        self.0.iter().map(|(name, error)| (&**name, error))
    }
}

impl fmt::Display for Attempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("every model failed: ")?;
        for (n, (name, error)) in self.0.iter().enumerate() {
            if n > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{name}: {error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Attempts {}

/// The name of the model the fallback layer wraps, in [`Attempts`].
pub const PRIMARY: &str = "primary";

/// The boxed future of [`Fallback`].
pub type ResponseFuture = tower_agent_core::event::BoxFuture<'static, Result<ModelResponse, Error>>;

impl<S> Service<ModelRequest> for Fallback<S>
where
    S: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ModelResponse;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, request: ModelRequest) -> Self::Future {
        if self.layer.models.is_empty() {
            let answer = self.inner.call(request);
            return Box::pin(async move { answer.await.map_err(|e| Error::from_boxed(e.into())) });
        }
        let clone = self.inner.clone();
        let mut primary = std::mem::replace(&mut self.inner, clone);
        let layer = Arc::clone(&self.layer);
        Box::pin(async move {
            let ctx = request.ctx.clone();
            let mut spent = Usage::default();
            let mut attempts: Vec<(Arc<str>, Error)> = Vec::new();
            let first = primary
                .call(request.clone())
                .await
                .map_err(|e| Error::from_boxed(e.into()));
            let mut outcome = layer.judge(first, &mut spent);
            let mut name: Arc<str> = Arc::from(PRIMARY);
            for link in &layer.models {
                let next = &link.name;
                let error = match outcome {
                    Judged::Answer(response) => return Ok(response.with_side_usage(spent)),
                    Judged::Final(error) => return Err(error.with_usage(spent)),
                    Judged::Next(error) => error,
                };
                if ctx.is_cancelled() {
                    return Err(Error::cancelled().with_usage(spent));
                }
                tracing::warn!(model = %name, next = %next, error = %error, "falling back to the next model");
                // The next model answers from the start: readers discard what streamed.
                request
                    .call_again(attempts.len() as u32 + 2, &error)
                    .await
                    .map_err(|e| e.with_usage(spent))?;
                attempts.push((name, error));
                let answer = link.model.get().oneshot(request.clone()).await;
                outcome = layer.judge(answer, &mut spent);
                name = Arc::clone(next);
            }
            match outcome {
                Judged::Answer(response) => Ok(response.with_side_usage(spent)),
                Judged::Final(error) => Err(error.with_usage(spent)),
                Judged::Next(last) => {
                    attempts.push((name, last.clone()));
                    let error = Error::new(last.kind(), last.message().to_owned());
                    Err(error.with_source(Attempts(attempts)).with_usage(spent))
                }
            }
        })
    }
}

/// What one model's call gave the chain.
#[allow(
    clippy::large_enum_variant,
    reason = "returned and matched at once, never stored"
)]
enum Judged {
    /// An answer to return.
    Answer(ModelResponse),
    /// An error no other model can fix.
    Final(Error),
    /// Try the next model.
    Next(Error),
}

impl FallbackLayer {
    fn judge(&self, result: Result<ModelResponse, Error>, spent: &mut Usage) -> Judged {
        match result {
            Ok(response) => match &self.reject {
                Some(reject) if reject(&response) => {
                    *spent += response.usage + response.side_usage;
                    Judged::Next(Error::new(
                        ErrorKind::InvalidResponse,
                        "the fallback layer rejected the response",
                    ))
                }
                _ => Judged::Answer(response),
            },
            Err(error) => {
                *spent += error.usage();
                if (self.when)(&error) && error.kind() != ErrorKind::Cancelled {
                    Judged::Next(error)
                } else {
                    Judged::Final(error)
                }
            }
        }
    }
}

/// The fallback on the model, outside the retry: each model of the chain gets the layers inside
/// the fallback's slot (the retry, the host's provider layers), as the primary does.
impl tower_agent_loop::Builtin for FallbackLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::ModelSlot;
        stacks.model_with(ModelSlot::Fallback, move |inside| {
            self.clone().map_models(|model| inside.wrap(model))
        });
    }
}
