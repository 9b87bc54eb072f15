//! What every session store must do: each store's tests run these checks.

use std::sync::Arc;

use serde_json::json;
use tower_agent_core::{CallKey, Interrupt, Message, Session, ToolCall};
use tower_agent_sessions::{ListQuery, MAX_ID_LEN, SessionStore, StoreError, Version};

fn session(id: &str) -> Session {
    let mut session = Session::new();
    session.id = id.to_owned();
    session.history.push(Message::user("hi"));
    session
}

/// Saves, loads, versions and conflicts.
async fn versions_and_conflicts(store: &dyn SessionStore) {
    let mut s = session("a");
    assert!(store.load("a").await.expect("loads").is_none());
    let v1 = store.save(&s, None).await.expect("created");
    // Created twice: the second is refused, the first kept.
    let twice = store.save(&session("a"), None).await;
    assert!(
        matches!(twice, Err(StoreError::Conflict { expected: None, found: Some(v), .. }) if v == v1),
        "{twice:?}"
    );
    // Everything a session holds comes back: history, state, pending interrupts, the
    // write-ahead record of calls that started.
    let mut call = ToolCall::new("c1", "rm", json!({ "path": "/tmp/x" }));
    call.key = Some(CallKey::from_u128(41));
    let mut paying = ToolCall::new("c2", "pay", json!({ "cents": 1 }));
    paying.key = Some(CallKey::from_u128(42));
    s.history
        .push(Message::assistant_with_calls("", [call.clone(), paying]));
    s.state.insert("k".into(), json!({ "n": 1 }));
    s.interrupts.push(Interrupt::new(call, json!("approve?")));
    s.started.push(CallKey::from_u128(42));
    let v2 = store.save(&s, Some(v1)).await.expect("updated");
    assert!(v2 > v1);
    let stored = store.load("a").await.expect("loads").expect("stored");
    assert_eq!((stored.session, stored.version), (s.clone(), v2));
    // A writer still at the first version is refused, and the second version stays.
    s.history.push(Message::user("lost update"));
    let stale = store.save(&s, Some(v1)).await;
    assert!(
        matches!(&stale, Err(StoreError::Conflict { expected: Some(e), found: Some(f), .. }) if *e == v1 && *f == v2),
        "{stale:?}"
    );
    assert!(
        stale
            .expect_err("refused")
            .to_string()
            .contains("another writer")
    );
    let kept = store.load("a").await.expect("loads").expect("stored");
    assert_eq!(kept.session.history.len(), 2);
    // Updating a session nobody created is a conflict too.
    let ghost = store.save(&session("ghost"), Some(Version(3))).await;
    assert!(matches!(
        ghost,
        Err(StoreError::Conflict { found: None, .. })
    ));
}

/// Two writers that loaded the same version race: exactly one wins.
async fn racing_writers(store: Arc<dyn SessionStore>) {
    let v1 = store.save(&session("race"), None).await.expect("created");
    let writers = (0..8).map(|n| {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let mut s = session("race");
            s.history.push(Message::user(format!("writer {n}")));
            store.save(&s, Some(v1)).await
        })
    });
    let mut won = 0;
    for writer in writers.collect::<Vec<_>>() {
        match writer.await.expect("no panic") {
            Ok(_) => won += 1,
            Err(StoreError::Conflict { .. }) => {}
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
    assert_eq!(won, 1, "exactly one writer wins");
}

/// Listing by prefix, in pages; deleting at a version.
async fn listing_and_deleting(store: &dyn SessionStore) {
    let mut versions = Vec::new();
    for id in ["u1/c1", "u1/c2", "u1/c3", "u2/c1", "u10/c1"] {
        versions.push((id, store.save(&session(id), None).await.expect("created")));
    }
    let first = store
        .list(&ListQuery::prefix("u1/").limit(2))
        .await
        .expect("lists");
    let ids: Vec<_> = first.sessions.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["u1/c1", "u1/c2"]);
    let next = first.next.expect("a second page");
    let second = store
        .list(&ListQuery::prefix("u1/").limit(2).after(next))
        .await
        .expect("lists");
    let ids: Vec<_> = second.sessions.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!((ids, second.next), (vec!["u1/c3"], None));

    // A limit past the largest page is the largest page, not an overflow.
    let mut all = ListQuery::prefix("u1/");
    all.limit = usize::MAX;
    let page = store.list(&all).await.expect("lists");
    assert_eq!((page.sessions.len(), page.next), (3, None));

    let (id, version) = versions[0];
    let wrong = store.delete(id, Version(version.0 + 1)).await;
    assert!(matches!(wrong, Err(StoreError::Conflict { .. })));
    assert!(store.delete(id, version).await.expect("deletes"));
    assert!(store.load(id).await.expect("loads").is_none());
    assert!(!store.delete(id, version).await.expect("nothing to delete"));
}

/// Ids that cannot name a session are refused, typed, before anything is written.
async fn bad_ids(store: &dyn SessionStore) {
    let huge = "x".repeat(MAX_ID_LEN + 1);
    for id in ["", huge.as_str(), "a\nb", "nul\0"] {
        let saved = store.save(&session(id), None).await;
        assert!(
            matches!(saved, Err(StoreError::InvalidId { .. })),
            "{id:?}: {saved:?}"
        );
        assert!(matches!(
            store.load(id).await,
            Err(StoreError::InvalidId { .. })
        ));
    }
    let longest = "y".repeat(MAX_ID_LEN);
    store
        .save(&session(&longest), None)
        .await
        .expect("the longest id is taken");
}

/// The session stored under `id`.
async fn stored(store: &dyn SessionStore, id: &str) -> Session {
    let loaded = store.load(id).await.expect("loads");
    loaded.unwrap_or_else(|| panic!("{id} is stored")).session
}

/// Whatever a save writes of a history (all of it, or what was added since), the session
/// comes back whole: after appends, an edit in the middle, a shortened history, a save from
/// another handle on the same store, and a session deleted and made again elsewhere.
async fn histories_round_trip(store: &dyn SessionStore, other: &dyn SessionStore) {
    let mut s = session("h");
    let mut v = store.save(&s, None).await.expect("created");
    for n in 0..5 {
        s.history.push(Message::assistant(format!("a{n}")));
        s.history.push(Message::user(format!("u{n}")));
        v = store.save(&s, Some(v)).await.expect("appended");
    }
    assert_eq!(stored(store, "h").await, s);
    s.history.make_mut()[3] = Message::assistant("edited in the middle");
    v = store.save(&s, Some(v)).await.expect("edited");
    assert_eq!(stored(other, "h").await, s);
    s.history.make_mut().truncate(4);
    v = store.save(&s, Some(v)).await.expect("shortened");
    assert_eq!(stored(other, "h").await, s);

    // Another handle goes on from what it loaded; this one has to load again.
    let mut theirs = other.load("h").await.expect("loads").expect("stored");
    theirs
        .session
        .history
        .push(Message::user("from the other handle"));
    let w = other
        .save(&theirs.session, Some(theirs.version))
        .await
        .expect("saved");
    s.history.push(Message::user("stale"));
    assert!(matches!(
        store.save(&s, Some(v)).await,
        Err(StoreError::Conflict { .. })
    ));
    let mut ours = store.load("h").await.expect("loads").expect("stored");
    assert_eq!(ours.session, theirs.session);
    ours.session.history.push(Message::assistant("and back"));
    let x = store.save(&ours.session, Some(w)).await.expect("saved");

    // Deleted, then made again elsewhere: a save naming the old incarnation's version is
    // refused; this handle loads the new one, goes on from it, and what it stores is exactly
    // what it saved (no message of the old incarnation mixed in).
    assert!(other.delete("h", x).await.expect("deleted"));
    let mut fresh = session("h");
    let mut y = other.save(&fresh, None).await.expect("made again");
    for _ in 0..3 {
        fresh.history.push(Message::user("again"));
        y = other.save(&fresh, Some(y)).await.expect("saved");
    }
    ours.session.history.push(Message::user("after the delete"));
    assert!(matches!(
        store.save(&ours.session, Some(x)).await,
        Err(StoreError::Conflict { .. })
    ));
    let mut again = store.load("h").await.expect("loads").expect("stored");
    assert_eq!((&again.session, again.version), (&fresh, y));
    again
        .session
        .history
        .push(Message::user("after the delete"));
    store
        .save(&again.session, Some(y))
        .await
        .expect("saved on the new incarnation");
    let back = other.load("h").await.expect("loads").expect("stored");
    assert_eq!(
        back.session, again.session,
        "no message of the other incarnation mixed in"
    );
}

/// A version never repeats for an id, even across a delete and a re-create: a writer that
/// holds a version of the deleted session can neither save over the new one nor delete it.
async fn deleted_and_made_again(store: &dyn SessionStore, other: &dyn SessionStore) {
    let mut old = session("again");
    let v1 = store.save(&old, None).await.expect("created");
    old.history.push(Message::assistant("old"));
    let v2 = store.save(&old, Some(v1)).await.expect("saved");
    // A writer loads the session at its second version...
    let mut stale = store.load("again").await.expect("loads").expect("stored");
    assert_eq!(stale.version, v2);
    stale
        .session
        .history
        .push(Message::user("the stale writer"));
    // ...meanwhile another deletes it and makes it again, saving it a few times.
    assert!(other.delete("again", v2).await.expect("deleted"));
    let mut fresh = session("again");
    fresh.history.push(Message::assistant("new"));
    let mut seen = vec![v1, v2];
    let mut version = None;
    for n in 0..4 {
        fresh.history.push(Message::user(format!("new {n}")));
        let saved = other.save(&fresh, version).await.expect("saved");
        version = Some(saved);
        // At every version of the new session, the stale writer is refused...
        let save = store.save(&stale.session, Some(stale.version)).await;
        assert!(
            matches!(&save, Err(StoreError::Conflict { expected: Some(e), found: Some(f), .. }) if *e == v2 && *f == saved),
            "{save:?}"
        );
        let delete = store.delete("again", stale.version).await;
        assert!(
            matches!(&delete, Err(StoreError::Conflict { expected: Some(e), found: Some(f), .. }) if *e == v2 && *f == saved),
            "{delete:?}"
        );
        // ...and overwrites nothing.
        let kept = other.load("again").await.expect("loads").expect("stored");
        assert_eq!((&kept.session, kept.version), (&fresh, saved));
        // No version of the old session comes back; each save's version is above the last.
        assert!(seen.iter().all(|v| *v < saved), "{saved} after {seen:?}");
        seen.push(saved);
    }
}

/// Every check, on `store` and `other`, a second handle on the same sessions.
pub(crate) async fn conformance(store: Arc<dyn SessionStore>, other: Arc<dyn SessionStore>) {
    versions_and_conflicts(store.as_ref()).await;
    racing_writers(Arc::clone(&store)).await;
    listing_and_deleting(store.as_ref()).await;
    bad_ids(store.as_ref()).await;
    histories_round_trip(store.as_ref(), other.as_ref()).await;
    deleted_and_made_again(store.as_ref(), other.as_ref()).await;
}
