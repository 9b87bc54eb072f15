//! Serve a [tower-agent](https://docs.rs/tower-agent) agent over HTTP: an [axum] router a host
//! mounts, which starts runs on stored sessions, streams each run's events as server-sent
//! events, takes decisions for a paused run, cancels and steers runs, and reads sessions.
//!
//! | method and path | body | answer |
//! |---|---|---|
//! | `POST /sessions/{id}/runs` | `{"message": "..."}` | `202 {"run_id": "..."}`: a run of the session with the message |
//! | `POST /sessions/{id}/decisions` | `{"decisions": {"<call id>": <decision>}}` | `202 {"run_id": "..."}`: the paused run resumed (checked first: `400` when the decisions do not fit) |
//! | `GET /runs/{run_id}/events` | | the run's events, `text/event-stream`, from the first or from after `Last-Event-ID` |
//! | `POST /runs/{run_id}/cancel` | | `202`: the run ends cancelled |
//! | `POST /runs/{run_id}/steer` | `{"message": "..."}` | `202`: the message goes into the run at its next model call |
//! | `GET /sessions/{id}` | | the stored session (history, pending interrupts, state) |
//!
//! Each event has an `id` (its place in the run, from 0), a name and a JSON object: `run_started`,
//! `round_started`, `text_delta` (`round`, `text`), `retract` (drop the round's text so far),
//! `tool_started` and `tool_finished` (`call_id`, `name`, `ok`), `tool_recovered`,
//! `retrying`, `warning`, `truncated`, `layer` (a layer's own event: `name`, `text`), then
//! `run_finished` (`outcome`: `completed` with `text`, `interrupted` with `interrupts`, each
//! a `call_id`, `name`, `arguments`, `payload` and the decisions it `allowed`; `stopped` with
//! `reason`; `cancelled`) or `run_failed` (`error`: `kind`, `message`).
//!
//! **A run does not belong to a connection.** It runs on the server's runtime; a client that
//! disconnects cancels nothing (unless it asked, `?cancel_on_disconnect=true`), and one that
//! comes back reads on from its last event id (`Last-Event-ID`, which browsers' `EventSource`
//! sends by itself when it reconnects). A session has one run at a time (`409` for a second).
//! The last 256 ended runs stay readable.
//!
//! **Sessions live in the store.** The agent saves them there (put a `StoreLayer` of the same
//! store on it); the server reads them for `GET /sessions/{id}` and to check decisions.
//!
//! **Authentication is the host's**, with tower layers of its own on the router:
//!
//! ```
//! use axum::body::Body;
//! use axum::http::{Request, StatusCode};
//! use axum::middleware::{self, Next};
//! use axum::response::IntoResponse;
//! use axum::Router;
//! use tower_agent_loop::Agent;
//! use tower_agent_server::AgentServer;
//! use tower_agent_sessions::{InMemorySessions, StoreLayer};
//! use tower_agent_test::ScriptedModel;
//! use tower_agent_tools::ToolSet;
//!
//! let store = InMemorySessions::new();
//! let agent = Agent::builder()
//!     .with(StoreLayer::new(store.clone()))
//!     .build(ScriptedModel::new([]), ToolSet::new());
//! // The host's own check (a session cookie, a JWT...); here a bearer token.
//! let auth = middleware::from_fn(|req: Request<Body>, next: Next| async move {
//!     match req.headers().get("authorization").and_then(|v| v.to_str().ok()) {
//!         Some("Bearer a-secret-token") => next.run(req).await,
//!         _ => StatusCode::UNAUTHORIZED.into_response(),
//!     }
//! });
//! let app: Router = Router::new()
//!     .nest("/api", AgentServer::new(agent, store).router())
//!     .layer(auth);
//! # let _ = app;
//! ```
//!
//! Errors are typed JSON answers ([`ApiError`]).

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod runs;
mod wire;

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tower::ServiceExt;
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, BoxAgent, Decisions, Error, Message, Session, Shared,
};
use tower_agent_sessions::SessionStore;

pub use error::ApiError;

/// The axum this crate is built on, for a host to nest the router and serve it with the same
/// version.
pub use axum;

use runs::{Run, Runs};

/// Room for a run's unread events before it waits for the server to take them.
const EVENT_CAPACITY: usize = 64;

/// An agent served over HTTP: [`AgentServer::router`] gives the routes. Cloning is cheap
/// (the runs are shared).
#[derive(Clone)]
pub struct AgentServer {
    inner: Arc<Inner>,
}

struct Inner {
    agent: Shared<BoxAgent>,
    store: Arc<dyn SessionStore>,
    runs: Runs,
}

impl fmt::Debug for AgentServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentServer").finish_non_exhaustive()
    }
}

impl AgentServer {
    /// Serve `agent`, whose sessions are kept in `store` (the agent saves them there: a
    /// `StoreLayer` of the same store on it).
    pub fn new<A>(agent: A, store: impl SessionStore) -> Self
    where
        A: tower::Service<AgentRequest, Response = AgentResponse, Error = Error>
            + Clone
            + Send
            + 'static,
        A::Future: Send + 'static,
    {
        Self {
            inner: Arc::new(Inner {
                agent: Shared::new(BoxAgent::new(agent)),
                store: Arc::new(store),
                runs: Runs::default(),
            }),
        }
    }

    /// The routes (see the [crate docs](crate)), to serve or to nest in an app of the host's.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/sessions/{id}", get(session))
            .route("/sessions/{id}/runs", post(start))
            .route("/sessions/{id}/decisions", post(decide))
            .route("/runs/{run_id}/events", get(events))
            .route("/runs/{run_id}/cancel", post(cancel))
            .route("/runs/{run_id}/steer", post(steer))
            .with_state(self.clone())
    }

    fn agent(&self) -> BoxAgent {
        self.inner.agent.get()
    }

    async fn stored(&self, id: &str) -> Result<Option<Session>, ApiError> {
        let stored = self.inner.store.load(id).await.map_err(|error| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "backend",
                error.to_string(),
            )
        })?;
        Ok(stored.map(|stored| stored.session))
    }

    /// Start `request` as the run of its session; its id. The session is claimed first: a
    /// run refused (another one is going there) never starts, so it changes nothing.
    fn spawn(&self, request: AgentRequest) -> Result<String, ApiError> {
        let session_id = request.session.id.clone();
        let run_id = request.ctx.run_id().to_owned();
        let (request, mut events) = request.with_event_stream(EVENT_CAPACITY);
        let (request, steer) = request.with_steering();
        let cancel = request.ctx.cancellation_token().clone();
        let run = Arc::new(Run::new(run_id.clone(), session_id, cancel, steer));
        if let Err(going) = self.inner.runs.start(Arc::clone(&run)) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "run_in_progress",
                format!("the session has a run going: `{going}`"),
            ));
        }
        let running = tokio::spawn(self.agent().oneshot(request));
        let server = self.clone();
        tokio::spawn(async move {
            let mut ended = false;
            while let Some(event) = events.recv().await {
                let Some((name, data)) = wire::event(&event) else {
                    continue;
                };
                // The run saved before it said it ended: its session is free from here.
                if matches!(name, "run_finished" | "run_failed") {
                    ended = true;
                    server.inner.runs.release(&run);
                }
                run.push(name, data);
            }
            // A run whose end did not reach the stream (it ended before it started, or the
            // stream was full when it was cancelled) ends there now, once.
            let (name, data) = match running.await {
                Ok(Ok(response)) => ("run_finished", wire::outcome(&response.outcome)),
                Ok(Err(error)) => ("run_failed", wire::failure(&error)),
                Err(panicked) => (
                    "run_failed",
                    json!({ "error": { "kind": "other", "message": panicked.to_string() } }),
                ),
            };
            if !ended {
                run.push(name, data);
            }
            server.inner.runs.ended(&run);
        });
        Ok(run_id)
    }

    fn run(&self, run_id: &str) -> Result<Arc<Run>, ApiError> {
        self.inner
            .runs
            .get(run_id)
            .ok_or_else(|| ApiError::not_found(format!("no run `{run_id}`")))
    }
}

/// A body read as JSON, refused with a typed error.
fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(value)| value)
        .map_err(|rejection| ApiError::bad_request(rejection.body_text()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageBody {
    message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionsBody {
    decisions: Decisions,
}

fn accepted(run_id: String) -> Response {
    (StatusCode::ACCEPTED, Json(json!({ "run_id": run_id }))).into_response()
}

async fn start(
    State(server): State<AgentServer>,
    Path(id): Path<String>,
    message: Result<Json<MessageBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let message = body(message)?.message;
    let request = AgentRequest::new(Session::with_id(id), message);
    server.spawn(request).map(accepted)
}

async fn decide(
    State(server): State<AgentServer>,
    Path(id): Path<String>,
    decisions: Result<Json<DecisionsBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let decisions = body(decisions)?.decisions;
    let session = server
        .stored(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no session `{id}`")))?;
    let input = AgentInput::Resume(decisions);
    // Refused now, with the reason, rather than as a failed run.
    tower_agent_loop::check_input(&session, &input)
        .map_err(|error| ApiError::bad_request(error.to_string()))?;
    server
        .spawn(AgentRequest::new(Session::with_id(id), input))
        .map(accepted)
}

async fn session(
    State(server): State<AgentServer>,
    Path(id): Path<String>,
) -> Result<Json<Session>, ApiError> {
    match server.stored(&id).await? {
        Some(session) => Ok(Json(session)),
        None => Err(ApiError::not_found(format!("no session `{id}`"))),
    }
}

async fn cancel(
    State(server): State<AgentServer>,
    Path(run_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    server.run(&run_id)?.cancel.cancel();
    Ok(StatusCode::ACCEPTED)
}

async fn steer(
    State(server): State<AgentServer>,
    Path(run_id): Path<String>,
    message: Result<Json<MessageBody>, JsonRejection>,
) -> Result<StatusCode, ApiError> {
    let run = server.run(&run_id)?;
    let message = body(message)?.message;
    run.steer
        .send(Message::user(message))
        .map_err(|error| ApiError::new(StatusCode::CONFLICT, "run_over", error.to_string()))?;
    Ok(StatusCode::ACCEPTED)
}

#[derive(Deserialize)]
struct EventsQuery {
    #[serde(default)]
    cancel_on_disconnect: bool,
}

/// Cancels its run when dropped before the run ended: a client that asked for it went away.
struct CancelOnDrop(Option<Arc<Run>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(run) = self.0.take() {
            if !run.ended() {
                run.cancel.cancel();
            }
        }
    }
}

async fn events(
    State(server): State<AgentServer>,
    Path(run_id): Path<String>,
    Query(query): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let run = server.run(&run_id)?;
    let from = match headers.get("last-event-id") {
        None => 0,
        Some(last) => last
            .to_str()
            .ok()
            .and_then(|last| last.trim().parse::<usize>().ok())
            .and_then(|last| last.checked_add(1))
            .ok_or_else(|| ApiError::bad_request("Last-Event-ID is not an event id"))?,
    };
    // Nothing more will come: 204 tells an `EventSource` not to reconnect.
    if run.ended() && from >= run.len() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let guard = CancelOnDrop(query.cancel_on_disconnect.then(|| Arc::clone(&run)));
    let stream =
        futures_util::stream::unfold((run, from, guard), |(run, index, guard)| async move {
            let (name, data) = run.event(index).await?;
            let event = SseEvent::default()
                .event(name)
                .id(index.to_string())
                .data(data.to_string());
            Some((Ok::<_, Infallible>(event), (run, index + 1, guard)))
        });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}
