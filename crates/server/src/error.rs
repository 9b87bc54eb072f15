//! The server's errors: typed JSON answers with an HTTP status.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error the server answers: `{"error": {"kind": "...", "message": "..."}}` with its
/// status.
///
/// | kind | status | when |
/// |---|---|---|
/// | `bad_request` | 400 | a body that is not the JSON asked for, decisions that do not fit the calls that wait, nothing to continue |
/// | `not_found` | 404 | no such run (or it was forgotten), no such session |
/// | `run_in_progress` | 409 | the session already has a run going |
/// | `run_over` | 409 | steering a run that has ended |
/// | `backend` | 503 | the session store failed |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What kind of error, for a client to match on.
    pub kind: &'static str,
    /// What happened, for a person.
    pub message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.kind, self.status, self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "kind": self.kind, "message": self.message } });
        (self.status, Json(body)).into_response()
    }
}
