//! The checkpoint's response future.

use super::allowance::Allowance;
use crate::ask::response_future;

response_future! {
    /// The response future of [`Checkpoint`](super::Checkpoint): the inner future (its result
    /// recorded for the next question), a ready answer, or a boxed wait for the checkpoint
    /// (inline mode, once per allowance).
    pub struct ResponseFuture<F, E>(After = Allowance);
}
