//! The fallback layer: the next model after a failure another model may not have, a
//! rejected response, fail-fast errors, every model failing, cancellation, retries first.
#![cfg(feature = "fallback")]

use tower::{Layer, ServiceExt};
use tower_agent_core::{
    Error, ErrorKind, Event, Message, ModelRequest, ModelResponse, RunContext, Usage,
};
use tower_agent_layers::fallback::{Attempts, FallbackLayer, PRIMARY};
use tower_agent_test::{EventRecorder, ScriptedModel};

fn failing(kind: ErrorKind) -> ScriptedModel {
    ScriptedModel::from_fn(move |_| Err(Error::new(kind, format!("{kind}"))))
}

fn overloaded() -> ErrorKind {
    ErrorKind::Overloaded { retry_after: None }
}

fn request() -> (ModelRequest, EventRecorder) {
    let recorder = EventRecorder::new();
    let mut request = ModelRequest::new(vec![Message::user("hi")]);
    request.ctx = RunContext::new()
        .with_observer(recorder.clone())
        .with_round(3);
    (request, recorder)
}

#[tokio::test]
async fn an_overloaded_model_falls_back_and_readers_are_told_to_discard() {
    let backup = ScriptedModel::new([ModelResponse::text("from the backup")]);
    let model = FallbackLayer::new()
        .to("backup", backup.clone())
        .layer(failing(overloaded()));
    let (request, events) = request();
    let res = model.oneshot(request).await.expect("the backup answers");
    assert_eq!(res.message.text(), "from the backup");
    assert_eq!(backup.request_count(), 1);
    let retrying: Vec<(u32, u32, ErrorKind)> = events
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Retrying {
                round,
                attempt,
                error,
                ..
            } => Some((*round, *attempt, error.kind())),
            _ => None,
        })
        .collect();
    assert_eq!(retrying, [(3, 2, overloaded())]);
}

#[tokio::test]
async fn a_primary_that_streamed_then_failed_is_retracted_before_the_backup_streams() {
    let primary = ScriptedModel::new([]).streaming(3, std::time::Duration::ZERO);
    primary.push_broken("The primary bega", Error::new(overloaded(), "overloaded"));
    let backup = ScriptedModel::new([ModelResponse::text("The backup's whole answer.")])
        .streaming(3, std::time::Duration::ZERO);
    let model = FallbackLayer::new().to("backup", backup).layer(primary);
    let (request, events) = request();
    let res = model.oneshot(request).await.expect("the backup answers");
    assert_eq!(res.message.text(), "The backup's whole answer.");
    let names = events.names();
    let retract = names
        .iter()
        .position(|n| *n == "retract")
        .expect("retracted");
    assert_eq!(names[retract + 1], "retrying");
    assert_eq!(names.iter().filter(|n| **n == "retract").count(), 1);
    assert_eq!(events.streamed_text(3), "The backup's whole answer.");
}

#[tokio::test]
async fn errors_no_other_model_can_fix_fail_at_once() {
    for kind in [
        ErrorKind::BadRequest,
        ErrorKind::Auth,
        ErrorKind::ContextTooLong,
    ] {
        let backup = ScriptedModel::new([ModelResponse::text("never")]);
        let model = FallbackLayer::new()
            .to("backup", backup.clone())
            .layer(failing(kind));
        let error = model.oneshot(request().0).await.expect_err("fails");
        assert_eq!((error.kind(), backup.request_count()), (kind, 0), "{kind}");
    }
    // Another rule: a bad request falls back too.
    let backup = ScriptedModel::new([ModelResponse::text("taken")]);
    let model = FallbackLayer::new()
        .to("backup", backup)
        .when(|e| e.kind() == ErrorKind::BadRequest)
        .layer(failing(ErrorKind::BadRequest));
    let res = model.oneshot(request().0).await.expect("falls back");
    assert_eq!(res.message.text(), "taken");
}

#[tokio::test]
async fn a_rejected_response_falls_back_and_its_tokens_count() {
    let mut refusal = ModelResponse::text("I cannot help with that.");
    refusal.usage = Usage {
        input_tokens: 100,
        output_tokens: 7,
        ..Usage::default()
    };
    let primary = ScriptedModel::new([refusal]);
    let backup = ScriptedModel::new([ModelResponse::text("Here you go.")]);
    let model = FallbackLayer::new()
        .to("backup", backup)
        .reject(|res| res.message.text().starts_with("I cannot"))
        .layer(primary);
    let res = model
        .oneshot(request().0)
        .await
        .expect("the backup answers");
    assert_eq!(res.message.text(), "Here you go.");
    assert_eq!(
        (res.side_usage.input_tokens, res.side_usage.output_tokens),
        (100, 7)
    );
}

#[tokio::test]
async fn when_every_model_fails_the_last_error_comes_back_with_every_attempt() {
    let model = FallbackLayer::new()
        .to("second", failing(ErrorKind::Server))
        .to("third", failing(ErrorKind::QuotaExhausted))
        .layer(failing(ErrorKind::RateLimited { retry_after: None }));
    let error = model.oneshot(request().0).await.expect_err("all fail");
    assert_eq!(error.kind(), ErrorKind::QuotaExhausted);
    let attempts = std::error::Error::source(&error)
        .and_then(|s| s.downcast_ref::<Attempts>())
        .expect("the attempts");
    let tried: Vec<(&str, ErrorKind)> = attempts.iter().map(|(n, e)| (n, e.kind())).collect();
    assert_eq!(
        tried,
        [
            (PRIMARY, ErrorKind::RateLimited { retry_after: None }),
            ("second", ErrorKind::Server),
            ("third", ErrorKind::QuotaExhausted),
        ]
    );
    assert!(
        attempts
            .to_string()
            .starts_with("every model failed: primary: "),
        "{attempts}"
    );
}

#[tokio::test]
async fn a_cancelled_run_tries_no_other_model() {
    let backup = ScriptedModel::new([ModelResponse::text("never")]);
    let model = FallbackLayer::new()
        .to("backup", backup.clone())
        .layer(failing(overloaded()));
    let (request, _) = request();
    request.ctx.cancel();
    let error = model.oneshot(request).await.expect_err("cancelled");
    assert_eq!(
        (error.kind(), backup.request_count()),
        (ErrorKind::Cancelled, 0)
    );
}

#[cfg(feature = "retry")]
#[tokio::test(start_paused = true)]
async fn a_model_is_given_up_only_after_its_own_retries() {
    use std::time::Duration;
    use tower_agent_layers::retry::{RetryLayer, RetryPolicy};
    let primary = failing(ErrorKind::Server);
    let backup = ScriptedModel::new([ModelResponse::text("from the backup")]);
    let retry = RetryLayer::new(
        RetryPolicy::new()
            .max_attempts(3)
            .base(Duration::from_millis(10)),
    );
    let model = FallbackLayer::new()
        .to("backup", backup.clone())
        .layer(retry.layer(primary.clone()));
    let res = model
        .oneshot(request().0)
        .await
        .expect("the backup answers");
    assert_eq!(res.message.text(), "from the backup");
    assert_eq!((primary.request_count(), backup.request_count()), (3, 1));
}

/// LangChain's and Vercel AI's rule: any error of the primary falls back. Asked for with
/// `on_any_error`; an unclassified error does not fall back by default; a cancelled run never.
#[tokio::test]
async fn on_any_error_an_unclassified_error_falls_back_as_the_peers_do() {
    let backup = || ScriptedModel::new([ModelResponse::text("from the backup")]);
    let (req, _) = request();
    let res = FallbackLayer::new()
        .on_any_error()
        .to("backup", backup())
        .layer(failing(ErrorKind::Other))
        .oneshot(req)
        .await
        .expect("the backup answers");
    assert_eq!(res.message.text(), "from the backup");
    let (req, _) = request();
    let error = FallbackLayer::new()
        .to("backup", backup())
        .layer(failing(ErrorKind::Other))
        .oneshot(req)
        .await
        .expect_err("not by default");
    assert_eq!(error.kind(), ErrorKind::Other);
    let (req, _) = request();
    let error = FallbackLayer::new()
        .on_any_error()
        .to("backup", backup())
        .layer(failing(ErrorKind::Cancelled))
        .oneshot(req)
        .await
        .expect_err("a cancelled run stays cancelled");
    assert_eq!(error.kind(), ErrorKind::Cancelled);
}
