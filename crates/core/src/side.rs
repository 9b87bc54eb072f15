//! A model a layer asks on the side of a run: a summarizer, a judge, progress lines.

use std::fmt;
use tower::{Service, ServiceExt};

use crate::error::{BoxError, Error};
use crate::model::{ModelRequest, ModelResponse};
use crate::{BoxModel, Shared};

/// A model service a layer asks on the side of a run (the summarizer, a loop's judge, progress
/// lines): any model service, boxed once, shared by the layer's clones.
///
/// Its calls go through whatever stack the host built around it: give it a provider with
/// `RetryLayer` (or a fallback) and the side calls are retried too, so a summarizer does
/// not kill a run the main model would have survived.
///
/// ```
/// use tower_agent_core::{Error, Message, ModelRequest, ModelResponse, SideModel};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let cheap = tower::service_fn(|req: ModelRequest| async move {
///     Ok::<_, Error>(ModelResponse::text(format!("{} messages", req.messages.len())))
/// });
/// let side = SideModel::new(cheap);
/// let answer = side.ask(ModelRequest::new(vec![Message::user("sum up")])).await?;
/// assert_eq!(answer.message.text(), "1 messages");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SideModel {
    inner: Shared<BoxModel>,
}

impl SideModel {
    /// Ask `model`.
    pub fn new<M>(model: M) -> Self
    where
        M: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
        M::Error: Into<BoxError>,
        M::Future: Send + 'static,
    {
        let model = model.map_err(|error: M::Error| Error::from_boxed(error.into()));
        Self {
            inner: Shared::new(BoxModel::new(model)),
        }
    }

    /// Ask once: the model made ready, then called with `request` (give it a context of its
    /// own, such as [`RunContext::side_call`](crate::RunContext::side_call)).
    ///
    /// # Errors
    ///
    /// The model's.
    pub async fn ask(&self, request: ModelRequest) -> Result<ModelResponse, Error> {
        self.inner.get().oneshot(request).await
    }
}

impl fmt::Debug for SideModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SideModel").finish_non_exhaustive()
    }
}
