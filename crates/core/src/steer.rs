//! Steering: messages a host sends into a run while it runs ([`AgentRequest::with_steering`]).

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::agent::AgentRequest;
use crate::error::{Error, ErrorKind};
use crate::message::Message;

/// The host's side: send messages into the run ([`Steer::send`]). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Steer {
    messages: UnboundedSender<Message>,
}

impl Steer {
    /// Send `message` (a user message, usually) into the run: the agent adds it to the
    /// session at its next safe point (before its next model call, never between a call and
    /// its result) and saves it like any input. A run that was about to end with an answer
    /// goes on for the messages that came meanwhile.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Cancelled`] when the run has ended: the message was not taken.
    pub fn send(&self, message: Message) -> Result<(), Error> {
        self.messages
            .send(message)
            .map_err(|_| Error::new(ErrorKind::Cancelled, "the run has ended: nothing to steer"))
    }
}

/// The run's side: the messages sent so far, taken at each safe point. Kept in the run's
/// context ([`RunContext::extension`](crate::RunContext::extension)) by
/// [`AgentRequest::with_steering`]; only the run of that request reads it (a nested agent's
/// context has extensions of its own).
#[derive(Clone, Debug)]
pub struct Steering {
    messages: Arc<Mutex<UnboundedReceiver<Message>>>,
}

impl Steering {
    /// The messages sent since the last take, in order.
    pub fn take(&self) -> Vec<Message> {
        let mut messages = self.messages.lock().unwrap_or_else(PoisonError::into_inner);
        let mut taken = Vec::new();
        while let Ok(message) = messages.try_recv() {
            taken.push(message);
        }
        taken
    }

    /// Whether messages wait to be taken.
    pub fn pending(&self) -> bool {
        !self
            .messages
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// No more messages: the run ends (a later [`Steer::send`] fails).
    pub fn close(&self) {
        self.messages
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .close();
    }
}

impl AgentRequest {
    /// Let the host send messages into this run while it runs: Mastra's messages queued into a
    /// running thread, OpenAI's pending input. A "stop" typed mid-run is one use: a
    /// `before_model` callback that reads it stops the run.
    ///
    /// ```
    /// use tower_agent_core::{AgentRequest, Message, Session, Steering};
    ///
    /// let (request, steer) = AgentRequest::new(Session::new(), "hi").with_steering();
    /// steer.send(Message::user("and be brief")).expect("the run takes it");
    /// let steering = request.ctx.extension::<Steering>().expect("the run reads it");
    /// assert_eq!(steering.take()[0].text(), "and be brief");
    /// ```
    pub fn with_steering(self) -> (Self, Steer) {
        let (messages, received) = unbounded_channel();
        self.ctx.insert_extension(Steering {
            messages: Arc::new(Mutex::new(received)),
        });
        (self, Steer { messages })
    }
}
