//! One point, several callbacks, the first word wins (`callback::first`): the rules of
//! adk-deepagents' `_compose_callbacks(builtin, extra)`, restated. Before: the built-in runs
//! first, and when it answers the extra is not called; when it lets the request through, the
//! extra gets it (as the built-in passed it on). After: the built-in runs first, and when it
//! replaces the response the extra is not called; when it keeps it, the extra decides. A
//! missing side is the other alone; both missing let everything through.

use std::sync::{Arc, Mutex};

use tower::{Layer, ServiceExt, service_fn};
use tower_agent_core::callback::{Kept, first};
use tower_agent_core::{
    AfterLayer, BeforeLayer, Error, Flow, Message, ModelRequest, ModelResponse, RunContext,
};

/// Who was called, in order.
type Calls = Arc<Mutex<Vec<&'static str>>>;

fn model() -> impl tower::Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone {
    service_fn(|req: ModelRequest| async move {
        let last = req.messages.last().map(Message::text).unwrap_or_default();
        Ok::<_, Error>(ModelResponse::text(format!("model saw {last}")))
    })
}

fn request(text: &str) -> ModelRequest {
    ModelRequest::new(vec![Message::user(text)])
}

/// A before callback named `name`: answers when the user's text is `name`, else appends
/// `name` to it and lets it through.
fn before(
    name: &'static str,
    calls: &Calls,
) -> impl FnMut(ModelRequest) -> std::future::Ready<Result<Flow<ModelRequest, ModelResponse>, Error>>
+ Clone
+ Send
+ 'static {
    let calls = calls.clone();
    move |mut req: ModelRequest| {
        calls.lock().expect("not poisoned").push(name);
        let text = req.messages.last().map(Message::text).unwrap_or_default();
        std::future::ready(Ok(match text == name {
            true => Flow::Answer(ModelResponse::text(format!("{name} answered"))),
            false => {
                req.messages = vec![Message::user(format!("{text}+{name}"))].into();
                Flow::Continue(req)
            }
        }))
    }
}

/// An after callback named `name`: replaces a response that mentions `name`, keeps the others.
fn after(
    name: &'static str,
    calls: &Calls,
) -> impl FnMut(ModelResponse, RunContext) -> std::future::Ready<Result<Kept<ModelResponse>, Error>>
+ Clone
+ Send
+ 'static {
    let calls = calls.clone();
    move |res: ModelResponse, _ctx: RunContext| {
        calls.lock().expect("not poisoned").push(name);
        std::future::ready(Ok(match res.message.text().contains(name) {
            true => Kept::Replaced(ModelResponse::text(format!("{name} replaced"))),
            false => Kept::Kept(res),
        }))
    }
}

fn called(calls: &Calls) -> Vec<&'static str> {
    std::mem::take(&mut *calls.lock().expect("not poisoned"))
}

#[tokio::test]
async fn before_the_built_in_answers_first_and_the_extra_is_then_not_called() {
    let calls = Calls::default();
    let layer = BeforeLayer::new(first(
        before("builtin", &calls),
        Some(before("extra", &calls)),
    ));
    let ask = |text: &str| layer.layer(model()).oneshot(request(text));
    let res = ask("builtin").await.expect("answered");
    assert_eq!(res.message.text(), "builtin answered");
    assert_eq!(called(&calls), ["builtin"], "the extra is not called");
    // The built-in lets it through: the extra gets the request as the built-in passed it on.
    let res = ask("x").await.expect("through");
    assert_eq!(res.message.text(), "model saw x+builtin+extra");
    assert_eq!(called(&calls), ["builtin", "extra"]);
    // The extra answers what the built-in let through.
    let res = ask("x+builtin").await.expect("through");
    assert_eq!(res.message.text(), "model saw x+builtin+builtin+extra");
}

#[tokio::test]
async fn before_a_missing_side_is_the_other_alone() {
    let calls = Calls::default();
    type Missing = Option<
        fn(ModelRequest) -> std::future::Ready<Result<Flow<ModelRequest, ModelResponse>, Error>>,
    >;
    let only_extra = BeforeLayer::new(first(None as Missing, Some(before("extra", &calls))));
    let res = only_extra
        .layer(model())
        .oneshot(request("extra"))
        .await
        .expect("ok");
    assert_eq!(res.message.text(), "extra answered");
    let only_builtin = BeforeLayer::new(first(Some(before("builtin", &calls)), None as Missing));
    let res = only_builtin
        .layer(model())
        .oneshot(request("x"))
        .await
        .expect("ok");
    assert_eq!(res.message.text(), "model saw x+builtin");
    let neither = BeforeLayer::new(first(None as Missing, None as Missing));
    let res = neither
        .layer(model())
        .oneshot(request("x"))
        .await
        .expect("ok");
    assert_eq!(res.message.text(), "model saw x");
}

#[tokio::test]
async fn after_the_built_in_replaces_first_and_the_extra_is_then_not_called() {
    let calls = Calls::default();
    let layer = AfterLayer::new(first(
        after("builtin", &calls),
        Some(after("extra", &calls)),
    ));
    let ask = |text: &str| layer.layer(model()).oneshot(request(text));
    let res = ask("builtin").await.expect("ok");
    assert_eq!(res.message.text(), "builtin replaced");
    assert_eq!(called(&calls), ["builtin"], "the extra is not called");
    // Kept by the built-in: the extra decides, on the response as it was.
    let res = ask("extra").await.expect("ok");
    assert_eq!(res.message.text(), "extra replaced");
    assert_eq!(called(&calls), ["builtin", "extra"]);
    // Kept by both: the model's response.
    let res = ask("nobody").await.expect("ok");
    assert_eq!(res.message.text(), "model saw nobody");
    // Nested: the first of three that replaces wins.
    let three = AfterLayer::new(first(
        after("alpha", &calls),
        first(after("beta", &calls), after("gamma", &calls)),
    ));
    called(&calls);
    let res = three
        .layer(model())
        .oneshot(request("beta gamma"))
        .await
        .expect("ok");
    assert_eq!(res.message.text(), "beta replaced");
    assert_eq!(called(&calls), ["alpha", "beta"]);
}
