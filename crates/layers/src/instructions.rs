//! Instruction blocks appended to the system prompt of every model call.
//!
//! Each block is static text or a closure over the request (today's date, the user's
//! preferences from the run's state). Blocks are appended in the order they were added: a
//! request without a system prompt gets the first as its prompt, one with a prompt gets each
//! after a blank line. A closure that returns `None` (or an empty string) adds nothing that
//! call.
//!
//! For the provider's prompt cache, static blocks are stable
//! ([`ModelRequest::append_system`]) and a closure's block may change from call to call
//! ([`ModelRequest::append_system_volatile`]): nothing after it is cached, the history
//! included. Put static blocks first; turn text that only changes between sessions into a
//! static block when the layer is built.
//!
//! The edit shapes each request only; the session and the agent's configured prompt are not
//! changed, so nothing accumulates round after round.
//!
//! ```
//! use tower::{Service, ServiceExt};
//! use tower_agent_core::{Error, ModelRequest, ModelResponse};
//! use tower_agent_layers::instructions::InstructionsLayer;
//! use tower_agent_test::ScriptedModel;
//! use tower_layer::Layer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let layer = InstructionsLayer::new()
//!     .text("Answer in French.")
//!     .with(|req: &ModelRequest| Some(format!("This is round {}.", req.ctx.round())));
//! let mut model = layer.layer(ScriptedModel::new([ModelResponse::text("ok")]));
//!
//! let mut req = ModelRequest::new(vec![]);
//! req.system = Some("You are terse.".into());
//! model.ready().await?.call(req).await?;
//!
//! let seen = &model.get_ref().requests()[0];
//! assert_eq!(
//!     seen.system.as_deref(),
//!     Some("You are terse.\n\nAnswer in French.\n\nThis is round 0.")
//! );
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_agent_core::ModelRequest;
use tower_layer::Layer;
use tower_service::Service;

type Dynamic = Arc<dyn Fn(&ModelRequest) -> Option<String> + Send + Sync>;

#[derive(Clone)]
enum Block {
    Text(Arc<str>),
    Dynamic(Dynamic),
}

/// Applies [`Instructions`]; see the [module docs](self).
///
/// `From<&str>` and `From<String>` give a layer with one static block.
#[derive(Clone, Default)]
pub struct InstructionsLayer {
    blocks: Arc<[Block]>,
}

impl InstructionsLayer {
    /// A layer with no block yet (it changes nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a static block. Consecutive static blocks are joined once, here.
    pub fn text(self, text: impl AsRef<str>) -> Self {
        let text = text.as_ref();
        if text.is_empty() {
            return self;
        }
        let mut blocks = self.blocks.to_vec();
        match blocks.last_mut() {
            Some(Block::Text(last)) => *last = format!("{last}\n\n{text}").into(),
            _ => blocks.push(Block::Text(text.into())),
        }
        Self {
            blocks: blocks.into(),
        }
    }

    /// Add a block computed for each request; `None` or an empty string adds nothing.
    pub fn with<F>(self, block: F) -> Self
    where
        F: Fn(&ModelRequest) -> Option<String> + Send + Sync + 'static,
    {
        let mut blocks = self.blocks.to_vec();
        blocks.push(Block::Dynamic(Arc::new(block)));
        Self {
            blocks: blocks.into(),
        }
    }
}

impl From<&str> for InstructionsLayer {
    fn from(text: &str) -> Self {
        Self::new().text(text)
    }
}

impl From<String> for InstructionsLayer {
    fn from(text: String) -> Self {
        Self::new().text(text)
    }
}

impl fmt::Debug for InstructionsLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_blocks(f, "InstructionsLayer", &self.blocks, None)
    }
}

impl<S> Layer<S> for InstructionsLayer {
    type Service = Instructions<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Instructions {
            inner,
            blocks: Arc::clone(&self.blocks),
        }
    }
}

/// Appends instruction blocks to the system prompt, then calls the inner model service; see
/// the [module docs](self).
///
/// Zero-cost pass-through in the tower sense: `poll_ready` and the response future are the
/// inner service's.
#[derive(Clone)]
pub struct Instructions<S> {
    inner: S,
    blocks: Arc<[Block]>,
}

impl<S> Instructions<S> {
    /// Wrap `inner` with the blocks of `layer`.
    pub fn new(inner: S, layer: impl Into<InstructionsLayer>) -> Self {
        layer.into().layer(inner)
    }

    /// A layer for this service.
    pub fn layer(instructions: impl Into<InstructionsLayer>) -> InstructionsLayer {
        instructions.into()
    }

    tower_agent_core::inner_service_accessors!();
}

impl<S: fmt::Debug> fmt::Debug for Instructions<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_blocks(f, "Instructions", &self.blocks, Some(&self.inner))
    }
}

fn debug_blocks(
    f: &mut fmt::Formatter<'_>,
    name: &str,
    blocks: &[Block],
    inner: Option<&dyn fmt::Debug>,
) -> fmt::Result {
    let blocks: Vec<&str> = blocks
        .iter()
        .map(|b| match b {
            Block::Text(text) => text,
            Block::Dynamic(_) => "<closure>",
        })
        .collect();
    let mut s = f.debug_struct(name);
    if let Some(inner) = inner {
        s.field("inner", inner);
    }
    s.field("blocks", &blocks).finish()
}

impl<S> Service<ModelRequest> for Instructions<S>
where
    S: Service<ModelRequest>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: ModelRequest) -> Self::Future {
        for block in self.blocks.iter() {
            match block {
                Block::Text(text) => req.append_system(text),
                Block::Dynamic(block) => {
                    if let Some(text) = block(&req).filter(|t| !t.is_empty()) {
                        req.append_system_volatile(&text);
                    }
                }
            }
        }
        self.inner.call(req)
    }
}

/// Instruction blocks on the model, outside tool selection and summarization.
impl tower_agent_loop::Builtin for InstructionsLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::ModelSlot;
        stacks.model(ModelSlot::Instructions, self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn system_after(layer: InstructionsLayer, system: Option<&str>) -> Option<String> {
        let mut req = ModelRequest::new(vec![]);
        req.system = system.map(Into::into);
        let mut service = layer.layer(tower::service_fn(|req: ModelRequest| {
            std::future::ready(Ok::<_, std::convert::Infallible>(req.system))
        }));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match std::pin::pin!(service.call(req)).as_mut().poll(&mut cx) {
            Poll::Ready(Ok(system)) => system.map(|s| s.to_string()),
            _ => panic!("ready at once"),
        }
    }

    use std::future::Future;

    #[test]
    fn absent_is_set_present_is_appended() {
        let layer = InstructionsLayer::from("A.").text("B.");
        assert_eq!(
            system_after(layer.clone(), None).as_deref(),
            Some("A.\n\nB.")
        );
        assert_eq!(
            system_after(layer.clone(), Some("")).as_deref(),
            Some("A.\n\nB.")
        );
        assert_eq!(
            system_after(layer, Some("Base.")).as_deref(),
            Some("Base.\n\nA.\n\nB.")
        );
    }

    #[test]
    fn closures_run_per_request_and_may_add_nothing() {
        let layer = InstructionsLayer::new()
            .with(|_| None)
            .with(|_| Some(String::new()))
            .text("static")
            .with(|req| Some(format!("{} messages", req.messages.len())));
        assert_eq!(
            system_after(layer, None).as_deref(),
            Some("static\n\n0 messages")
        );
        assert_eq!(system_after(InstructionsLayer::new(), None), None);
    }
}
