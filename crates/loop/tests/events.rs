//! Events: their order, observers that fail, and deltas from a streaming provider.

mod common;

use serde_json::json;
use tower::{ServiceExt, service_fn};
use tower_agent_core::{
    AgentRequest, Delta, Error, ErrorKind, Event, Message, ModelRequest, ModelResponse, RunContext,
    Session, StreamFilter, after_model, observer_fn,
};
use tower_agent_loop::Agent;
use tower_agent_test::{EventRecorder, ScriptedModel, assert_valid_history};

use common::{calculator, call};

#[tokio::test]
async fn are_emitted_in_order() {
    let model = ScriptedModel::new([
        ModelResponse::new(Message::assistant_with_calls(
            "let me add",
            [call("c1", "add", json!({"a": 1, "b": 1}))],
        )),
        ModelResponse::text("2"),
    ]);
    let recorder = EventRecorder::new();
    let agent = Agent::new(model, calculator());
    agent
        .oneshot(AgentRequest::new(Session::new(), "1+1").with_observer(recorder.clone()))
        .await
        .unwrap();
    assert_eq!(
        recorder.names(),
        [
            "run_started",
            "round_started",
            // A model that does not stream: its text reaches readers as one delta.
            "text_delta",
            "text",
            "round_completed",
            "tool_started",
            "tool_finished",
            "round_started",
            "text_delta",
            "text",
            "round_completed",
            "run_finished",
        ]
    );
    let events = recorder.events();
    match &events[4] {
        Event::RoundCompleted {
            round,
            message,
            history,
            ..
        } => {
            assert_eq!(*round, 1);
            assert!(message.has_tool_calls());
            let history = history.as_ref().expect("observers get the snapshot");
            assert_eq!(history.len(), 2, "user + assistant, before the tool ran");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        &events[6],
        Event::ToolFinished {
            is_error: false,
            ..
        }
    ));
}

#[tokio::test]
async fn an_observer_error_stops_the_run_and_is_returned() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "add", json!({"a": 1, "b": 1}))]),
        ModelResponse::text("2"),
    ]);
    let failing = observer_fn(|event: &Event| {
        let fail = matches!(event, Event::ToolStarted { .. });
        async move {
            if fail {
                Err(Error::other("audit log unavailable"))
            } else {
                Ok(())
            }
        }
    });
    let agent = Agent::new(model.clone(), calculator());
    let mut err = agent
        .oneshot(AgentRequest::new(Session::new(), "1+1").with_observer(failing))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Observer);
    assert!(err.to_string().contains("audit log unavailable"));
    assert_eq!(model.request_count(), 1, "the run stopped");
    let session = err.take_session().unwrap();
    assert_valid_history(&session.history);
}

#[tokio::test]
async fn a_streaming_provider_emits_deltas_inside_its_round() {
    // The contract for providers: deltas go up through the request, then the stream ends.
    let model = service_fn(|req: ModelRequest| async move {
        for delta in ["Hel", "lo"] {
            req.send_delta(Delta::Text(delta.into())).await?;
        }
        req.end_stream().await?;
        Ok::<_, Error>(ModelResponse::text("Hello"))
    });
    let recorder = EventRecorder::new();
    Agent::new(model, calculator())
        .oneshot(AgentRequest::new(Session::new(), "hi").with_observer(recorder.clone()))
        .await
        .unwrap();
    assert_eq!(
        recorder.names(),
        [
            "run_started",
            "round_started",
            "text_delta",
            "text_delta",
            "text",
            "round_completed",
            "run_finished"
        ]
    );
}

#[tokio::test]
async fn a_message_replaced_after_it_streamed_is_retracted_and_given_whole() {
    let model = ScriptedModel::new([ModelResponse::text("I will delete it all.")])
        .streaming(4, std::time::Duration::ZERO);
    let replace = after_model(|mut res: ModelResponse, _ctx: RunContext| async move {
        res.message = Message::assistant("I cannot do that.");
        Ok(res)
    });
    let recorder = EventRecorder::new();
    let res = Agent::new(tower::Layer::layer(&replace, model), calculator())
        .oneshot(AgentRequest::new(Session::new(), "wipe").with_observer(recorder.clone()))
        .await
        .unwrap();
    assert_eq!(res.text().as_deref(), Some("I cannot do that."));
    assert_eq!(recorder.streamed_text(1), "I cannot do that.");
    let names = recorder.names();
    let retract = names
        .iter()
        .position(|n| *n == "retract")
        .expect("retracted");
    assert_eq!(names[retract + 1..retract + 3], ["text_delta", "text"]);
}

#[tokio::test]
async fn a_filter_that_swallows_the_stream_leaves_the_answer_to_the_text_event() {
    /// Holds every delta back and never releases it.
    struct Swallow;
    impl StreamFilter for Swallow {
        fn delta(&mut self, _delta: Delta, _out: &mut Vec<Delta>) -> Result<(), Error> {
            Ok(())
        }
    }
    let model = ScriptedModel::new([ModelResponse::text("Hello there")])
        .streaming(2, std::time::Duration::ZERO);
    let swallow = tower::layer::layer_fn(move |inner: ScriptedModel| {
        tower::service_fn(move |mut req: ModelRequest| {
            req.deltas.filter(Swallow);
            inner.clone().oneshot(req)
        })
    });
    let recorder = EventRecorder::new();
    Agent::new(tower::Layer::layer(&swallow, model), calculator())
        .oneshot(AgentRequest::new(Session::new(), "hi").with_observer(recorder.clone()))
        .await
        .unwrap();
    // Nothing streamed: the readers get the answer as one delta when the call ends, and the
    // `Text` event carries it too.
    let names = recorder.names();
    assert_eq!(names.iter().filter(|n| **n == "text_delta").count(), 1);
    assert_eq!(recorder.streamed_text(1), "Hello there");
    assert!(names.contains(&"text"));
}

#[tokio::test]
async fn a_model_that_does_not_stream_reaches_readers_as_one_delta() {
    let recorder = EventRecorder::new();
    let model = ScriptedModel::new([ModelResponse::text("Paris.")]);
    Agent::new(model, tower_agent_tools::ToolSet::new())
        .oneshot(AgentRequest::new(Session::new(), "Capital?").with_observer(recorder.clone()))
        .await
        .expect("the run");
    let deltas: Vec<String> = recorder
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::TextDelta { delta, .. } => Some(delta),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, ["Paris."]);
    assert_eq!(recorder.streamed_text(1), "Paris.");
}
