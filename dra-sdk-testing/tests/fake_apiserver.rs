//! The fake API server through `kube::Client` over real HTTP: CRUD, optimistic concurrency,
//! selectors, watches with kube-runtime, status subresource, patches, faults, discovery, stats.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dra_sdk_testing::apiserver::{FakeApiServer, Fault, ResourceType, Verb};
use dra_sdk_testing::assert_contains;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::Status;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

fn from_json<K: DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).unwrap()
}

fn slice(name: &str, node: &str, driver: &str) -> ResourceSlice {
    from_json(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"model": {"string": "a100"}}}],
        },
    }))
}

fn claim(name: &str) -> ResourceClaim {
    from_json(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}},
    }))
}

fn node(name: &str) -> Node {
    from_json(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
}

fn api_error(err: kube::Error) -> Box<Status> {
    match err {
        kube::Error::Api(status) => status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Polls `check` until it holds, for at most five seconds.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The next watch event that is not a BOOKMARK.
async fn next_change<K>(events: &mut BoxStream<'_, kube::Result<WatchEvent<K>>>) -> WatchEvent<K> {
    loop {
        match events.try_next().await.unwrap().expect("the watch ended") {
            WatchEvent::Bookmark(_) => continue,
            event => return event,
        }
    }
}

async fn start() -> (FakeApiServer, Client) {
    let server = FakeApiServer::builder()
        .bookmark_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    (server, client)
}

/// create, get, list, replace (with the returned resourceVersion), delete.
async fn crud<K>(api: Api<K>, mut obj: K)
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let name = obj.name_any();
    let created = api.create(&PostParams::default(), &obj).await.unwrap();
    assert!(!created.uid().unwrap().is_empty());
    assert!(created.meta().creation_timestamp.is_some());
    let rv = created.resource_version().unwrap();
    assert_eq!(
        api.get(&name).await.unwrap().resource_version(),
        Some(rv.clone())
    );
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert!(
        list.metadata
            .resource_version
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= rv.parse().unwrap()
    );

    obj.labels_mut().insert("updated".into(), "yes".into());
    obj.meta_mut().resource_version = Some(rv.clone());
    let replaced = api
        .replace(&name, &PostParams::default(), &obj)
        .await
        .unwrap();
    assert_eq!(replaced.labels()["updated"], "yes");
    assert!(replaced.resource_version().unwrap().parse::<u64>().unwrap() > rv.parse().unwrap());
    assert_eq!(replaced.uid(), created.uid());

    api.delete(&name, &DeleteParams::default()).await.unwrap();
    assert!(api.get_opt(&name).await.unwrap().is_none());
    assert!(api_error(api.get(&name).await.unwrap_err()).is_not_found());
}

#[tokio::test]
async fn crud_for_every_kind() {
    let (_server, client) = start().await;
    crud(
        Api::<ResourceSlice>::all(client.clone()),
        slice("s1", "n1", "gpu.example.com"),
    )
    .await;
    crud(
        Api::<ResourceClaim>::namespaced(client.clone(), "team-a"),
        claim("c1"),
    )
    .await;
    crud(
        Api::<DeviceClass>::all(client.clone()),
        from_json(
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                         "metadata": {"name": "gpu.example.com"}, "spec": {}}),
        ),
    )
    .await;
    crud(Api::<Node>::all(client.clone()), node("n1")).await;
    crud(
        Api::<ResourceClaimTemplate>::namespaced(client.clone(), "default"),
        from_json(
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                         "metadata": {"name": "t"}, "spec": {"spec": {"devices": {}}}}),
        ),
    )
    .await;
    crud(
        Api::<Pod>::namespaced(client.clone(), "default"),
        from_json(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                         "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
        ),
    )
    .await;
    crud(
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), "default"),
        from_json(
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"selector": {"matchLabels": {"app": "d"}}, "template": {
                "metadata": {"labels": {"app": "d"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}),
        ),
    )
    .await;
    crud(
        Api::<Namespace>::all(client),
        from_json(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}})),
    )
    .await;
}

#[tokio::test]
async fn namespaces_isolate_claims() {
    let (_server, client) = start().await;
    let team_a = Api::<ResourceClaim>::namespaced(client.clone(), "team-a");
    let team_b = Api::<ResourceClaim>::namespaced(client.clone(), "team-b");
    team_a
        .create(&PostParams::default(), &claim("c"))
        .await
        .unwrap();
    team_b
        .create(&PostParams::default(), &claim("c"))
        .await
        .unwrap();
    assert_eq!(
        team_a
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let all = Api::<ResourceClaim>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap();
    let namespaces: Vec<_> = all.items.iter().map(|c| c.namespace().unwrap()).collect();
    assert_eq!(namespaces, ["team-a", "team-b"]);
}

#[tokio::test]
async fn stale_resource_version_conflicts() {
    let (_server, client) = start().await;
    let api = Api::<ResourceSlice>::all(client);
    let v1 = api
        .create(&PostParams::default(), &slice("s", "n1", "d.example.com"))
        .await
        .unwrap();
    let mut v2 = v1.clone();
    v2.spec.pool.generation = 2;
    api.replace("s", &PostParams::default(), &v2).await.unwrap();

    // A writer still holding v1 loses, on PUT and on a merge patch carrying the old version.
    let mut stale = v1.clone();
    stale.spec.pool.generation = 3;
    let err = api_error(
        api.replace("s", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert!(err.is_conflict(), "{err:?}");
    assert_contains(&err.message, "the object has been modified");
    let patch = json!({"metadata": {"resourceVersion": v1.resource_version()}, "spec": {"pool": {"generation": 4}}});
    let err = api_error(
        api.patch("s", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);

    // Without a resourceVersion, an update is unconditional.
    stale.metadata.resource_version = None;
    let updated = api
        .replace("s", &PostParams::default(), &stale)
        .await
        .unwrap();
    assert_eq!(updated.spec.pool.generation, 3);
    assert_eq!(
        updated.metadata.generation,
        Some(3),
        "each spec change bumps metadata.generation"
    );
}

#[tokio::test]
async fn noop_writes_keep_the_resource_version() {
    let (server, client) = start().await;
    let api = Api::<ResourceSlice>::all(client);
    let created = api
        .create(&PostParams::default(), &slice("s", "n1", "d.example.com"))
        .await
        .unwrap();
    let before = server.resource_version();
    let same = api
        .replace("s", &PostParams::default(), &created)
        .await
        .unwrap();
    assert_eq!(same.resource_version(), created.resource_version());
    let patched = api
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"driver": "d.example.com"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.resource_version(), created.resource_version());
    assert_eq!(server.resource_version(), before);
}

#[tokio::test]
async fn create_errors_are_api_statuses() {
    let (server, client) = start().await;
    let api = Api::<ResourceSlice>::all(client.clone());

    let mut generated = slice("", "n1", "d.example.com");
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("n1-d-".into());
    let a = api
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    let b = api
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    assert!(a.name_any().starts_with("n1-d-") && a.name_any().len() == "n1-d-".len() + 5);
    assert_ne!(a.name_any(), b.name_any());

    let err = api_error(api.create(&PostParams::default(), &a).await.unwrap_err());
    assert_eq!(
        (err.code, err.message.as_str()),
        (
            500,
            "resourceVersion should not be set on objects to be created"
        )
    );
    let mut dup = a.clone();
    dup.metadata.resource_version = None;
    let err = api_error(api.create(&PostParams::default(), &dup).await.unwrap_err());
    assert!(err.is_already_exists());

    generated.metadata.generate_name = None;
    let err = api_error(
        api.create(&PostParams::default(), &generated)
            .await
            .unwrap_err(),
    );
    assert!(err.is_invalid());
    assert_contains(&err.message, "metadata.name: Required value");

    let mut invalid = slice("bad", "n1", "");
    invalid.spec.pool.resource_slice_count = 0;
    let err = api_error(
        api.create(&PostParams::default(), &invalid)
            .await
            .unwrap_err(),
    );
    assert!(err.is_invalid());
    let causes: Vec<_> = err
        .details
        .unwrap()
        .causes
        .into_iter()
        .map(|c| c.field)
        .collect();
    assert_eq!(causes, ["spec.driver", "spec.pool.resourceSliceCount"]);

    let err = api_error(
        api.create(&PostParams::default(), &slice("Upper", "n1", "d"))
            .await
            .unwrap_err(),
    );
    assert!(err.is_invalid());

    // Garbage bodies and unknown paths: Status bodies, no panic.
    let request = http::Request::post("/apis/resource.k8s.io/v1/resourceslices")
        .header("content-type", "application/json")
        .body(b"{not json".to_vec())
        .unwrap();
    let err = api_error(client.request_text(request).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (400, "BadRequest"));
    let request = http::Request::get("/apis/example.com/v1/widgets")
        .body(Vec::new())
        .unwrap();
    assert!(api_error(client.request_text(request).await.unwrap_err()).is_not_found());
    let request = http::Request::patch("/apis/resource.k8s.io/v1/resourceslices/bad")
        .header("content-type", "text/plain")
        .body(b"x".to_vec())
        .unwrap();
    assert_eq!(
        api_error(client.request_text(request).await.unwrap_err()).code,
        415
    );
    assert!(server.get::<ResourceSlice>(None, "bad").unwrap().is_none());
}

#[tokio::test]
async fn field_and_label_selectors_on_list() {
    let (_server, client) = start().await;
    let api = Api::<ResourceSlice>::all(client);
    for (name, node, driver) in [
        ("a", "n1", "x.example.com"),
        ("b", "n1", "y.example.com"),
        ("c", "n2", "x.example.com"),
    ] {
        let mut s = slice(name, node, driver);
        s.labels_mut().insert("driver".into(), driver.into());
        api.create(&PostParams::default(), &s).await.unwrap();
    }
    let names = |lp: ListParams| {
        let api = api.clone();
        async move {
            api.list(&lp)
                .await
                .unwrap()
                .items
                .iter()
                .map(ResourceExt::name_any)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        names(ListParams::default().fields("spec.nodeName=n1")).await,
        ["a", "b"]
    );
    assert_eq!(
        names(ListParams::default().fields("spec.driver==x.example.com")).await,
        ["a", "c"]
    );
    assert_eq!(
        names(ListParams::default().fields("spec.nodeName=n1,spec.driver=x.example.com")).await,
        ["a"]
    );
    assert_eq!(
        names(ListParams::default().fields("spec.nodeName!=n1")).await,
        ["c"]
    );
    assert_eq!(
        names(ListParams::default().fields("metadata.name=b")).await,
        ["b"]
    );
    assert_eq!(
        names(ListParams::default().labels("driver in (y.example.com)")).await,
        ["b"]
    );
    assert_eq!(
        names(ListParams::default().labels("driver!=y.example.com")).await,
        ["a", "c"]
    );
    let err = api_error(
        api.list(&ListParams::default().fields("spec.pool.name=n1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);
    assert_eq!(err.message, "field label not supported: spec.pool.name");
}

#[tokio::test]
async fn watch_applies_field_selectors_to_events() {
    let (_server, client) = start().await;
    let api = Api::<ResourceSlice>::all(client);
    api.create(
        &PostParams::default(),
        &slice("before", "n1", "x.example.com"),
    )
    .await
    .unwrap();
    api.create(
        &PostParams::default(),
        &slice("other-node", "n2", "x.example.com"),
    )
    .await
    .unwrap();
    let wp = WatchParams::default().fields("spec.nodeName=n1,spec.driver=x.example.com");
    let mut events = api.watch(&wp, "0").await.unwrap().boxed();
    match next_change(&mut events).await {
        WatchEvent::Added(s) => assert_eq!(s.name_any(), "before"),
        other => panic!("expected the initial ADDED, got {other:?}"),
    }
    api.create(
        &PostParams::default(),
        &slice("n2-new", "n2", "x.example.com"),
    )
    .await
    .unwrap();
    api.create(
        &PostParams::default(),
        &slice("other-driver", "n1", "y.example.com"),
    )
    .await
    .unwrap();
    let mut live = slice("after", "n1", "x.example.com");
    live = api.create(&PostParams::default(), &live).await.unwrap();
    live.spec.pool.generation = 2;
    api.replace("after", &PostParams::default(), &live)
        .await
        .unwrap();
    api.delete("after", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(match next_change(&mut events).await {
            WatchEvent::Added(s) => format!("ADDED {}", s.name_any()),
            WatchEvent::Modified(s) => {
                format!("MODIFIED {} {}", s.name_any(), s.spec.pool.generation)
            }
            WatchEvent::Deleted(s) => format!("DELETED {}", s.name_any()),
            other => panic!("unexpected {other:?}"),
        });
    }
    assert_eq!(seen, ["ADDED after", "MODIFIED after 2", "DELETED after"]);
}

#[tokio::test]
async fn label_changes_move_objects_in_and_out_of_a_watch() {
    let (_server, client) = start().await;
    let api = Api::<Node>::all(client);
    let rv = api
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap()
        .resource_version()
        .unwrap();
    let mut events = api
        .watch(&WatchParams::default().labels("gpu=true"), &rv)
        .await
        .unwrap()
        .boxed();
    let set = |value: Value| Patch::Merge(json!({"metadata": {"labels": {"gpu": value}}}));
    api.patch("n1", &PatchParams::default(), &set(json!("true")))
        .await
        .unwrap();
    api.patch("n1", &PatchParams::default(), &set(Value::Null))
        .await
        .unwrap();
    assert!(matches!(
        next_change(&mut events).await,
        WatchEvent::Added(_)
    ));
    match next_change(&mut events).await {
        WatchEvent::Deleted(n) => assert!(
            n.labels().contains_key("gpu"),
            "the last state that matched"
        ),
        other => panic!("expected DELETED, got {other:?}"),
    }
}

#[tokio::test]
async fn watch_replays_history_and_expires() {
    let server = FakeApiServer::builder()
        .history_limit(3)
        .start()
        .await
        .unwrap();
    let api = Api::<Node>::all(server.client().unwrap());
    let first = api
        .create(&PostParams::default(), &node("n0"))
        .await
        .unwrap()
        .resource_version()
        .unwrap();
    api.create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &node("n2"))
        .await
        .unwrap();
    // Replay of everything after `first`.
    let mut events = api
        .watch(&WatchParams::default(), &first)
        .await
        .unwrap()
        .boxed();
    for expected in ["n1", "n2"] {
        match next_change(&mut events).await {
            WatchEvent::Added(n) => assert_eq!(n.name_any(), expected),
            other => panic!("unexpected {other:?}"),
        }
    }
    // Two more writes push `first` out of the three-event history.
    api.create(&PostParams::default(), &node("n3"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &node("n4"))
        .await
        .unwrap();
    let mut events = api
        .watch(&WatchParams::default(), &first)
        .await
        .unwrap()
        .boxed();
    match next_change(&mut events).await {
        WatchEvent::Error(status) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected ERROR 410, got {other:?}"),
    }
    assert!(
        events.try_next().await.unwrap().is_none(),
        "the stream ends after the error"
    );
}

#[tokio::test]
async fn bookmarks_and_timeout() {
    let (_server, client) = start().await;
    let api = Api::<ResourceSlice>::all(client);
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let started = Instant::now();
    let events: Vec<_> = api
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(3),
        "{elapsed:?}"
    );
    assert!(
        events.len() >= 5,
        "a bookmark every 50 ms: {}",
        events.len()
    );
    for event in events {
        match event {
            WatchEvent::Bookmark(b) => assert_eq!(b.metadata.resource_version, rv),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn streaming_list_watch_mode() {
    let (_server, client) = start().await;
    let api = Api::<ResourceSlice>::all(client);
    api.create(&PostParams::default(), &slice("a", "n1", "x.example.com"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &slice("b", "n2", "x.example.com"))
        .await
        .unwrap();
    let config = watcher::Config::default()
        .streaming_lists()
        .fields("spec.nodeName=n1");
    let mut stream = watcher(api.clone(), config).boxed();
    let mut initial = Vec::new();
    loop {
        match stream.try_next().await.unwrap().unwrap() {
            watcher::Event::Init => {}
            watcher::Event::InitApply(s) => initial.push(s.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial, ["a"]);
    api.create(&PostParams::default(), &slice("c", "n1", "x.example.com"))
        .await
        .unwrap();
    match stream.try_next().await.unwrap().unwrap() {
        watcher::Event::Apply(s) => assert_eq!(s.name_any(), "c"),
        other => panic!("unexpected {other:?}"),
    }

    // The server enforces the streaming-list parameter rules (kube checks this one client-side too).
    let request = http::Request::get(
        "/apis/resource.k8s.io/v1/resourceslices?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
    )
    .body(Vec::new())
    .unwrap();
    let err = api_error(api.into_client().request_text(request).await.unwrap_err());
    assert!(err.is_invalid());
    assert_contains(&err.message, "allowWatchBookmarks");
}

#[tokio::test]
async fn reflector_follows_changes_and_recovers_from_dropped_watches() {
    let (server, client) = start().await;
    let api = Api::<ResourceSlice>::all(client);
    api.create(&PostParams::default(), &slice("a", "n1", "x.example.com"))
        .await
        .unwrap();
    let (store, writer) = reflector::store();
    let stream = watcher(
        api.clone(),
        watcher::Config::default().fields("spec.nodeName=n1"),
    )
    .default_backoff()
    .reflect(writer)
    .touched_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    store.wait_until_ready().await.unwrap();
    assert_eq!(store.state().len(), 1);
    eventually("the watch to open", || server.active_watches() == 1).await;

    let mut b = api
        .create(&PostParams::default(), &slice("b", "n1", "x.example.com"))
        .await
        .unwrap();
    api.create(
        &PostParams::default(),
        &slice("elsewhere", "n2", "x.example.com"),
    )
    .await
    .unwrap();
    eventually("b in the store", || store.state().len() == 2).await;
    b.spec.pool.generation = 7;
    api.replace("b", &PostParams::default(), &b).await.unwrap();
    let b_ref = reflector::ObjectRef::new("b");
    eventually("b modified", || {
        store
            .get(&b_ref)
            .is_some_and(|s| s.spec.pool.generation == 7)
    })
    .await;
    api.delete("a", &DeleteParams::default()).await.unwrap();
    eventually("a deleted", || store.state().len() == 1).await;

    // A dropped watch: kube re-watches from its last resourceVersion and the server replays what
    // happened in between, without a new list.
    let before = server.stats();
    server.faults().drop_watches();
    api.create(&PostParams::default(), &slice("c", "n1", "x.example.com"))
        .await
        .unwrap();
    eventually("c after the dropped watch", || {
        store.get(&reflector::ObjectRef::new("c")).is_some()
    })
    .await;
    let after = server.stats().resource("resourceslices");
    assert_eq!(
        after.list,
        before.resource("resourceslices").list,
        "recovery replays, it does not re-list"
    );
    assert_eq!(after.watch, before.resource("resourceslices").watch + 1);
    task.abort();
}

#[tokio::test]
async fn watcher_relists_after_the_history_expired() {
    let server = FakeApiServer::builder()
        .history_limit(2)
        .start()
        .await
        .unwrap();
    let api = Api::<Node>::all(server.client().unwrap());
    server.insert(&node("gone")).unwrap();
    let (store, writer) = reflector::store();
    // No backoff: the rejected re-watches below retry at once, and the test stays fast.
    let stream = watcher(api, watcher::Config::default())
        .reflect(writer)
        .touched_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    store.wait_until_ready().await.unwrap();
    eventually("the watch to open", || server.active_watches() == 1).await;
    let lists = server.stats().resource("nodes").list;

    // Disconnected long enough for the history to move past the watcher's resourceVersion.
    let faults = server.faults();
    faults.reject_watches(500);
    faults.drop_watches();
    for name in ["n1", "n2", "n3"] {
        server.insert(&node(name)).unwrap();
    }
    server.delete::<Node>(None, "gone").unwrap();
    faults.clear();

    // The re-watch gets ERROR 410, and the watcher re-lists.
    eventually("the re-listed state", || {
        let mut names: Vec<_> = store.state().iter().map(|n| n.name_any()).collect();
        names.sort();
        names == ["n1", "n2", "n3"]
    })
    .await;
    assert_eq!(server.stats().resource("nodes").list, lists + 1);
    task.abort();
}

#[tokio::test]
async fn delete_collection_with_field_selector() {
    let (_server, client) = start().await;
    let api = Api::<ResourceSlice>::all(client);
    for (name, node, driver) in [
        ("a", "n1", "x.example.com"),
        ("b", "n1", "y.example.com"),
        ("c", "n2", "x.example.com"),
    ] {
        api.create(&PostParams::default(), &slice(name, node, driver))
            .await
            .unwrap();
    }
    // What the kubelet does for a driver that went away.
    let lp = ListParams::default().fields("spec.nodeName=n1,spec.driver=x.example.com");
    let deleted = api
        .delete_collection(&DeleteParams::default(), &lp)
        .await
        .unwrap();
    let deleted = deleted.left().expect("the deleted objects");
    assert_eq!(
        deleted
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>(),
        ["a"]
    );
    // And at kubelet start: everything on the node.
    let lp = ListParams::default().fields("spec.nodeName=n1");
    api.delete_collection(&DeleteParams::default(), &lp)
        .await
        .unwrap();
    let left = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        left.items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>(),
        ["c"]
    );
}

#[tokio::test]
async fn delete_preconditions_and_responses() {
    let (_server, client) = start().await;
    let slices = Api::<ResourceSlice>::all(client.clone());
    let s = slices
        .create(&PostParams::default(), &slice("s", "n1", "x.example.com"))
        .await
        .unwrap();
    let err = api_error(
        slices
            .delete(
                "s",
                &DeleteParams::default().preconditions(kube::api::Preconditions {
                    uid: Some("not-the-uid".into()),
                    resource_version: None,
                }),
            )
            .await
            .unwrap_err(),
    );
    assert!(err.is_conflict());
    assert_contains(&err.message, "Precondition failed: UID in precondition");
    let err = api_error(
        slices
            .delete(
                "s",
                &DeleteParams::default().preconditions(kube::api::Preconditions {
                    uid: None,
                    resource_version: Some("1".into()),
                }),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    let matching = kube::api::Preconditions {
        uid: s.uid(),
        resource_version: s.resource_version(),
    };
    let deleted = slices
        .delete("s", &DeleteParams::default().preconditions(matching))
        .await
        .unwrap();
    assert_eq!(
        deleted.left().unwrap().name_any(),
        "s",
        "resource.k8s.io kinds return the object"
    );

    let nodes = Api::<Node>::all(client);
    nodes
        .create(&PostParams::default(), &node("n"))
        .await
        .unwrap();
    let status = nodes
        .delete("n", &DeleteParams::default())
        .await
        .unwrap()
        .right()
        .unwrap();
    assert!(status.is_success(), "core nodes return a Status");
    assert!(
        api_error(
            nodes
                .delete("n", &DeleteParams::default())
                .await
                .unwrap_err()
        )
        .is_not_found()
    );
}

#[tokio::test]
async fn finalizers_defer_deletion() {
    let (_server, client) = start().await;
    let api = Api::<ResourceClaim>::namespaced(client, "default");
    let mut c = claim("c");
    c.metadata.finalizers = Some(vec!["resource.kubernetes.io/delete-protection".into()]);
    api.create(&PostParams::default(), &c).await.unwrap();
    let marked = api
        .delete("c", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert!(api.get_opt("c").await.unwrap().is_some());
    api.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(api.get_opt("c").await.unwrap().is_none());
}

#[tokio::test]
async fn status_subresource_is_separate() {
    let (_server, client) = start().await;
    let api = Api::<ResourceClaim>::namespaced(client, "default");
    let mut c = claim("c");
    c.status = Some(from_json(
        json!({"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}),
    ));
    let created = api.create(&PostParams::default(), &c).await.unwrap();
    assert!(
        created.status.is_none(),
        "create drops the status of a ResourceClaim"
    );

    let allocation = json!({"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}]}}},
        "metadata": {"labels": {"ignored": "yes"}}});
    let patched = api
        .patch_status("c", &PatchParams::default(), &Patch::Merge(&allocation))
        .await
        .unwrap();
    let allocation = patched
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .unwrap();
    assert_eq!(
        allocation
            .devices
            .as_ref()
            .unwrap()
            .results
            .as_ref()
            .unwrap()[0]
            .device,
        "gpu-0"
    );
    assert!(
        patched.labels().is_empty(),
        "status writes change only status"
    );

    // Main-resource writes keep the stored status; spec is immutable.
    let mut main = patched.clone();
    main.status = None;
    main.labels_mut().insert("kept".into(), "yes".into());
    let replaced = api
        .replace("c", &PostParams::default(), &main)
        .await
        .unwrap();
    assert!(replaced.status.is_some());
    assert_eq!(replaced.labels()["kept"], "yes");
    main = replaced.clone();
    let devices = main.spec.as_mut().and_then(|s| s.devices.as_mut()).unwrap();
    devices.requests.as_mut().unwrap()[0].name = "other".into();
    let err = api_error(
        api.replace("c", &PostParams::default(), &main)
            .await
            .unwrap_err(),
    );
    assert!(err.is_invalid());
    assert_contains(&err.message, "spec: Invalid value");

    let mut status_only = replaced.clone();
    status_only.status = None;
    let cleared = api
        .replace_status("c", &PostParams::default(), &status_only)
        .await
        .unwrap();
    assert!(cleared.status.is_none());
    assert_eq!(
        api.get_status("c").await.unwrap().resource_version(),
        cleared.resource_version()
    );
    let nodes = Api::<DeviceClass>::all(api.into_client());
    assert!(api_error(nodes.get_status("x").await.unwrap_err()).is_not_found());
}

#[tokio::test]
async fn merge_json_and_apply_patches() {
    let (_server, client) = start().await;
    let api = Api::<ResourceSlice>::all(client);
    api.create(&PostParams::default(), &slice("s", "n1", "x.example.com"))
        .await
        .unwrap();

    let merged = api
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.labels()["a"], "1");
    let strategic = api
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"b": "2"}}})),
        )
        .await
        .unwrap();
    assert_eq!(strategic.labels().len(), 2);
    let ops: json_patch::Patch = from_json(json!([
        {"op": "test", "path": "/spec/pool/generation", "value": 1},
        {"op": "replace", "path": "/spec/pool/generation", "value": 2},
        {"op": "remove", "path": "/metadata/labels/a"},
    ]));
    let patched = api
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::<()>::Json(ops.clone()),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.pool.generation, 2);
    assert!(!patched.labels().contains_key("a"));
    let err = api_error(
        api.patch("s", &PatchParams::default(), &Patch::<()>::Json(ops))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422, "failed JSON patch test op");

    // Server-side apply: creates, merges, and removes what the manager stops applying.
    let pp = PatchParams::apply("dra-sdk-test").force();
    let mut desired = slice("applied", "n2", "x.example.com");
    desired.labels_mut().insert("owner".into(), "me".into());
    let created = api
        .patch("applied", &pp, &Patch::Apply(&desired))
        .await
        .unwrap();
    assert_eq!(created.labels()["owner"], "me");
    assert_eq!(created.metadata.generation, Some(1));
    desired.labels_mut().clear();
    desired
        .spec
        .devices
        .as_mut()
        .unwrap()
        .push(from_json(json!({"name": "gpu-1"})));
    let updated = api
        .patch("applied", &pp, &Patch::Apply(&desired))
        .await
        .unwrap();
    assert!(updated.labels().is_empty());
    assert_eq!(updated.spec.devices.as_ref().unwrap().len(), 2);
    assert_eq!(updated.metadata.generation, Some(2));
    let again = api
        .patch("applied", &pp, &Patch::Apply(&desired))
        .await
        .unwrap();
    assert_eq!(
        again.resource_version(),
        updated.resource_version(),
        "re-applying is a no-op"
    );
}

#[tokio::test]
async fn injected_faults() {
    let (server, client) = start().await;
    let api = Api::<Node>::all(client);
    api.create(&PostParams::default(), &node("n"))
        .await
        .unwrap();
    let faults = server.faults();

    faults.fail_next(1, 500);
    let err = api_error(api.get("n").await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (500, "InternalError"));
    api.get("n").await.unwrap();

    faults.inject(
        Fault::status(409)
            .verb(Verb::Update)
            .resource("nodes")
            .message("try again"),
    );
    let n = api.get("n").await.unwrap();
    let err = api_error(
        api.replace("n", &PostParams::default(), &n)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.message.as_str()), (409, "try again"));
    api.replace("n", &PostParams::default(), &n).await.unwrap();

    // 503 is retried by kube's default retry policy: the caller sees success.
    faults.inject(Fault::status(503).verb(Verb::Get).times(2));
    api.get("n").await.unwrap();
    assert_eq!(faults.injected(), 4);
    assert_eq!(server.stats().resource("nodes").get, 6);

    faults.set_latency(Duration::from_millis(100));
    let started = Instant::now();
    api.get("n").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(100));
    faults.clear();

    faults.reject_watches(500);
    let err = api_error(api.watch(&WatchParams::default(), "0").await.err().unwrap());
    assert_eq!(err.code, 500);
    faults.clear();
    assert!(api.watch(&WatchParams::default(), "0").await.is_ok());
}

#[tokio::test]
async fn disabled_feature_gates_drop_fields() {
    let (server, client) = start().await;
    server.drop_fields(
        "resourceslices",
        &[
            "spec.devices[].taints",
            "spec.devices[].capacity.*.requestPolicy",
        ],
    );
    let api = Api::<ResourceSlice>::all(client);
    let s: ResourceSlice = from_json(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
        "spec": {"driver": "x.example.com", "nodeName": "n1",
                 "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0",
                              "taints": [{"key": "k", "effect": "NoSchedule"}],
                              "capacity": {"memory": {"value": "80Gi", "requestPolicy": {"default": "1Gi"}}}}]},
    }));
    let stored = api.create(&PostParams::default(), &s).await.unwrap();
    let device = &stored.spec.devices.as_ref().unwrap()[0];
    assert!(device.taints.is_none());
    let capacity = &device.capacity.as_ref().unwrap()["memory"];
    assert_eq!(capacity.value.0, "80Gi");
    assert!(capacity.request_policy.is_none());
    server.clear_write_hooks();
    let mut with_taints = s.clone();
    with_taints.metadata.name = Some("t".into());
    assert!(
        api.create(&PostParams::default(), &with_taints)
            .await
            .unwrap()
            .spec
            .devices
            .unwrap()[0]
            .taints
            .is_some()
    );
}

/// Like a real 1.36 server with `DRAListTypeAttributes` off: the list value is dropped and the
/// attribute left without a value is refused (422), naming the attribute, not stored without it.
#[tokio::test]
async fn list_attributes_without_their_gate_are_refused() {
    let (server, client) = start().await;
    let api = Api::<ResourceSlice>::all(client);
    let s: ResourceSlice = from_json(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
        "spec": {"driver": "x.example.com", "nodeName": "n1",
                 "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "nic",
                              "attributes": {"vlans": {"ints": [10, 20]}, "model": {"string": "x"}}}]},
    }));
    // With the gate on: stored as sent.
    let stored = api.create(&PostParams::default(), &s).await.unwrap();
    let attributes = stored.spec.devices.unwrap()[0].attributes.clone().unwrap();
    assert_eq!(
        serde_json::to_value(&attributes["vlans"]).unwrap(),
        json!({"ints": [10, 20]})
    );

    server.drop_fields(
        "resourceslices",
        &[
            "spec.devices[].attributes.*.ints",
            "spec.devices[].attributes.*.bools",
            "spec.devices[].attributes.*.strings",
            "spec.devices[].attributes.*.versions",
        ],
    );
    let mut again = s.clone();
    again.metadata.name = Some("t".into());
    let status = api_error(
        api.create(&PostParams::default(), &again)
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 422);
    let causes = status.details.unwrap().causes;
    assert_eq!(causes.len(), 1, "{causes:?}");
    assert_eq!(causes[0].field, "spec.devices[0].attributes[vlans]");
    assert!(
        causes[0]
            .message
            .contains("exactly one value must be specified")
    );
    assert!(server.get::<ResourceSlice>(None, "t").unwrap().is_none());
}

#[tokio::test]
async fn discovery() {
    let server = FakeApiServer::builder()
        .git_version("v1.35.4")
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(
        (
            version.git_version.as_str(),
            version.major.as_str(),
            version.minor.as_str()
        ),
        ("v1.35.4", "1", "35")
    );

    let groups = client.list_api_groups().await.unwrap();
    let resource = groups
        .groups
        .iter()
        .find(|g| g.name == "resource.k8s.io")
        .unwrap();
    assert_eq!(
        resource.preferred_version.as_ref().unwrap().group_version,
        "resource.k8s.io/v1"
    );
    let list = client
        .list_api_group_resources("resource.k8s.io/v1")
        .await
        .unwrap();
    let names: Vec<_> = list.resources.iter().map(|r| r.name.as_str()).collect();
    assert!(
        names.contains(&"resourceslices") && names.contains(&"resourceclaims/status"),
        "{names:?}"
    );
    let request = http::Request::get("/readyz").body(Vec::new()).unwrap();
    assert_eq!(client.request_text(request).await.unwrap(), "ok");
    let core = client.list_core_api_resources("v1").await.unwrap();
    assert!(
        core.resources
            .iter()
            .any(|r| r.name == "nodes" && !r.namespaced)
    );

    for discovery in [
        kube::Discovery::new(client.clone()).run().await.unwrap(),
        kube::Discovery::new(client.clone())
            .run_aggregated()
            .await
            .unwrap(),
    ] {
        let group = discovery
            .get("resource.k8s.io")
            .expect("resource.k8s.io is served");
        let (ar, caps) = group.recommended_kind("ResourceSlice").unwrap();
        assert_eq!(
            (ar.version.as_str(), ar.plural.as_str()),
            ("v1", "resourceslices")
        );
        assert_eq!(caps.scope, kube::discovery::Scope::Cluster);
        assert!(discovery.has_group(""));
    }

    // A server that serves only v1beta2: clients can tell v1 is missing.
    let old = FakeApiServer::builder()
        .git_version("v1.33.0")
        .resource_types([ResourceType::RESOURCE_SLICES.with_version("v1beta2")])
        .start()
        .await
        .unwrap();
    let client = old.client().unwrap();
    assert!(
        client
            .list_api_group_resources("resource.k8s.io/v1")
            .await
            .is_err()
    );
    assert!(
        client
            .list_api_group_resources("resource.k8s.io/v1beta2")
            .await
            .is_ok()
    );
    assert!(
        Api::<ResourceSlice>::all(client)
            .list(&ListParams::default())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn stats_count_requests() {
    let (server, client) = start().await;
    let slices = Api::<ResourceSlice>::all(client.clone());
    let s = slices
        .create(&PostParams::default(), &slice("s", "n1", "x.example.com"))
        .await
        .unwrap();
    slices.get("s").await.unwrap();
    slices.list(&ListParams::default()).await.unwrap();
    server.reset_stats();

    // A no-op republish: reads only.
    slices
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(server.stats().writes(), 0);

    slices
        .replace("s", &PostParams::default(), &s)
        .await
        .unwrap();
    slices
        .patch("s", &PatchParams::default(), &Patch::Merge(json!({})))
        .await
        .unwrap();
    slices.delete("s", &DeleteParams::default()).await.unwrap();
    let claims = Api::<ResourceClaim>::namespaced(client, "default");
    claims
        .create(&PostParams::default(), &claim("c"))
        .await
        .unwrap();
    claims
        .patch_status(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {}})),
        )
        .await
        .unwrap();
    let stats = server.stats();
    let s = stats.resource("resourceslices");
    assert_eq!(
        (s.list, s.update, s.patch, s.delete, s.writes()),
        (1, 1, 1, 1, 3)
    );
    assert_eq!(stats.resource("resourceclaims").create, 1);
    assert_eq!(stats.resource("resourceclaims/status").patch, 1);
    assert_eq!(stats.writes(), 5);
    assert_eq!(stats.total.reads(), 1);
}

#[tokio::test]
async fn typed_store_access() {
    let (server, client) = start().await;
    let inserted = server.insert(&slice("s", "n1", "x.example.com")).unwrap();
    assert_eq!(inserted.metadata.generation, Some(1));
    let api = Api::<ResourceSlice>::all(client.clone());
    assert_eq!(api.get("s").await.unwrap().uid(), inserted.uid());
    assert_eq!(server.list::<ResourceSlice>().unwrap().len(), 1);

    let c = server.insert(&claim("c")).unwrap();
    assert_eq!(c.namespace().as_deref(), Some("default"));
    let mut with_status = c.clone();
    with_status.status = Some(from_json(
        json!({"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}),
    ));
    server.update_status(&with_status).unwrap();
    let read = server
        .get::<ResourceClaim>(Some("default"), "c")
        .unwrap()
        .unwrap();
    assert_eq!(read.status.unwrap().reserved_for.unwrap()[0].name, "p");
    let err = server.update_status(&with_status).unwrap_err();
    assert!(
        matches!(err, dra_sdk_testing::apiserver::Error::Api(ref s) if s.is_conflict()),
        "{err}"
    );

    server.delete::<ResourceSlice>(None, "s").unwrap();
    assert!(server.get::<ResourceSlice>(None, "s").unwrap().is_none());
    assert_eq!(server.stats().total.total(), 1, "only the HTTP get counted");
    let err = server.delete::<ResourceSlice>(None, "s").unwrap_err();
    assert!(matches!(err, dra_sdk_testing::apiserver::Error::Api(ref s) if s.is_not_found()));
}

#[tokio::test]
async fn kubeconfig_for_other_processes() {
    let (server, _client) = start().await;
    server.insert(&node("n1")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
    let nodes = Api::<Node>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(nodes.items[0].name_any(), "n1");
}

#[tokio::test]
async fn metadata_only_requests() {
    let (server, client) = start().await;
    server.insert(&slice("s", "n1", "x.example.com")).unwrap();
    let api = Api::<ResourceSlice>::all(client);
    let list = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items[0].name_any(), "s");
    let meta = api.get_metadata("s").await.unwrap();
    assert_eq!(meta.metadata.generation, Some(1));
    let mut events = api
        .watch_metadata(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(next_change(&mut events).await, WatchEvent::Added(m) if m.name_any() == "s"));
}

#[tokio::test]
async fn shutdown_ends_watches() {
    let (server, client) = start().await;
    let api = Api::<Node>::all(client);
    let events = api.watch(&WatchParams::default(), "0").await.unwrap();
    let collected = tokio::spawn(events.collect::<Vec<_>>());
    let handle = Arc::new(server);
    eventually("the watch to open", || handle.active_watches() == 1).await;
    Arc::try_unwrap(handle).unwrap().shutdown().await;
    let events = tokio::time::timeout(Duration::from_secs(5), collected)
        .await
        .unwrap()
        .unwrap();
    assert!(events.is_empty());
}

/// A slice with every 1.37 device-model field, as JSON.
fn slice_with_1_37_fields() -> ResourceSlice {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "s137"},
        "spec": {
            "driver": "gpu.example.com", "nodeName": "n1",
            "pool": {"name": "n1", "generation": 0, "resourceSliceCount": 1},
            "partitionTypeAttribute": "gpu.example.com/profile",
            "skipNodeOperations": ["NodePrepareResources", "NodeUnprepareResources"],
            "devices": [{
                "name": "mig-0",
                "attributes": {"gpu.example.com/profile": {"string": "1g"}},
                "consumesCounters": [{"counterSet": "gpu-0",
                    "counters": {"memory": {"value": "10Gi"}}, "compatibilityGroups": ["mig"]}],
                "nodeAllocatableResources": {"memory": {"overhead": {"perPod": "1Gi"}}},
            }],
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn a_pre_1_37_server_drops_the_1_37_slice_fields_and_a_1_37_one_keeps_them() {
    let fields = |slice: &ResourceSlice| {
        let spec = serde_json::to_value(&slice.spec).unwrap();
        [
            !spec["partitionTypeAttribute"].is_null(),
            !spec["skipNodeOperations"].is_null(),
            !spec["devices"][0]["consumesCounters"][0]["compatibilityGroups"].is_null(),
            !spec["devices"][0]["nodeAllocatableResources"].is_null(),
        ]
    };
    let old = FakeApiServer::start().await.unwrap(); // v1.36.2
    let stored = old.insert(&slice_with_1_37_fields()).unwrap();
    assert_eq!(fields(&stored), [false; 4]);

    let new = FakeApiServer::builder()
        .git_version("v1.37.0")
        .start()
        .await
        .unwrap();
    let stored = new.insert(&slice_with_1_37_fields()).unwrap();
    assert_eq!(fields(&stored), [true; 4]);
    assert!(new.disable_feature_gate("DRADeviceCompatibilityGroups"));
    assert!(!new.disable_feature_gate("DRANoSuchGate"));
    let mut second = slice_with_1_37_fields();
    second.metadata.name = Some("s137b".into());
    let stored = new.insert(&second).unwrap();
    assert_eq!(fields(&stored), [true, true, false, true]);
}
