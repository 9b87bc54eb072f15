//! Each agent's `invoke_agent` span names it (`gen_ai.agent.name`, and `invoke_agent {name}`
//! as its OpenTelemetry name): the name given to the builder, or the workflow step's.

use std::sync::{Arc, Mutex};

use tower_agent::prelude::*;
use tower_agent_test::ScriptedModel;

/// A span's `otel.name` and `gen_ai.agent.name`.
type Named = (String, Option<String>);

/// The names of every `invoke_agent` span, in order.
#[derive(Clone, Default)]
struct Names(Arc<Mutex<Vec<Named>>>);

struct Fields(String, Option<String>);

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "otel.name" => self.0 = value.to_owned(),
            "gen_ai.agent.name" => self.1 = Some(value.to_owned()),
            _ => {}
        }
    }

    fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Names {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if attrs.metadata().name() == "invoke_agent" {
            let mut fields = Fields(String::new(), None);
            attrs.record(&mut fields);
            self.0
                .lock()
                .expect("not poisoned")
                .push((fields.0, fields.1));
        }
    }
}

async fn names_of(run: impl std::future::Future<Output = ()>) -> Vec<Named> {
    use tracing::instrument::WithSubscriber;
    let names = Names::default();
    let subscriber = tracing_subscriber::layer::SubscriberExt::with(
        tracing_subscriber::Registry::default(),
        names.clone(),
    );
    run.with_subscriber(subscriber).await;
    names.0.lock().expect("not poisoned").clone()
}

#[tokio::test]
async fn an_agent_is_named_by_its_builder() {
    let found = names_of(async {
        let agent = Agent::builder().name("planner").build(
            ScriptedModel::new([ModelResponse::text("ok")]),
            ToolSet::new(),
        );
        agent
            .oneshot(AgentRequest::new(Session::new(), "plan"))
            .await
            .expect("the run");
    })
    .await;
    assert_eq!(
        found,
        [(
            "invoke_agent planner".to_owned(),
            Some("planner".to_owned())
        )]
    );
}

#[tokio::test]
async fn a_workflow_step_names_the_agent_it_runs() {
    use tower_agent::workflow::Sequential;
    let found = names_of(async {
        let step = |text: &str| {
            Agent::new(
                ScriptedModel::new([ModelResponse::text(text.to_owned())]),
                ToolSet::new(),
            )
        };
        let flow = Sequential::new("flow")
            .step("plan", step("planned"))
            .step("build", step("built"));
        flow.oneshot(AgentRequest::new(Session::new(), "make it"))
            .await
            .expect("the run");
    })
    .await;
    assert_eq!(
        found,
        [
            ("invoke_agent plan".to_owned(), Some("plan".to_owned())),
            ("invoke_agent build".to_owned(), Some("build".to_owned())),
        ]
    );
}

#[tokio::test]
async fn an_unnamed_agent_is_invoke_agent() {
    let found = names_of(async {
        Agent::new(
            ScriptedModel::new([ModelResponse::text("ok")]),
            ToolSet::new(),
        )
        .oneshot(AgentRequest::new(Session::new(), "hi"))
        .await
        .expect("the run");
    })
    .await;
    assert_eq!(found, [("invoke_agent".to_owned(), None)]);
}
