//! The fake API server as a real `kube::Client` sees it, on loopback: lists and watches,
//! preconditions, patches, apply, `/status`, Leases, `410 Gone` through the daemon's own
//! [`KubeSource`], directory reloads, and the limits every listener keeps.

use std::path::PathBuf;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use aether::registry::kube::objects::fingerprint;
use aether::registry::kube::watch::{KubeSource, WatchSettings};

/// A server on an ephemeral loopback port, its address, and a client of it.
async fn serve(settings: Settings, dir: Option<PathBuf>) -> (Arc<ApiServer>, SocketAddr, Client) {
    serve_on_loopback(settings, dir).await
}

fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "labels": {"app": "web"}},
        "spec": {"nodeName": node, "serviceAccountName": "web",
                 "containers": [{"name": "app", "image": "web:1"}]},
    }))
    .unwrap()
}

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

fn api_code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn a_list_then_a_watch_see_every_added_modified_and_deleted_object() {
    let (_server, _, client) = serve(Settings::default(), None).await;
    let pods: Api<Pod> = Api::namespaced(client, "shop");
    pods.create(&PostParams::default(), &pod("web-0", "node-a"))
        .await
        .unwrap();
    let list = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let rv = list.metadata.resource_version.unwrap();
    let mut events = pods
        .watch(&WatchParams::default().timeout(30), &rv)
        .await
        .unwrap()
        .boxed();
    pods.create(&PostParams::default(), &pod("web-1", "node-a"))
        .await
        .unwrap();
    pods.patch(
        "web-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}})),
    )
    .await
    .unwrap();
    pods.delete("web-1", &DeleteParams::default())
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match within("three events", events.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(p) => seen.push(format!("ADDED {}", p.name_any())),
            WatchEvent::Modified(p) => seen.push(format!(
                "MODIFIED {} tier={}",
                p.name_any(),
                p.labels().get("tier").cloned().unwrap_or_default()
            )),
            WatchEvent::Deleted(p) => seen.push(format!("DELETED {}", p.name_any())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("watch error {e:?}"),
        }
    }
    assert_eq!(
        seen,
        ["ADDED web-1", "MODIFIED web-0 tier=front", "DELETED web-1"]
    );
}

#[tokio::test]
async fn a_node_local_watch_by_field_selector_sees_only_its_node() {
    let (_server, _, client) = serve(Settings::default(), None).await;
    let pods: Api<Pod> = Api::all(client.clone());
    let shop: Api<Pod> = Api::namespaced(client, "shop");
    shop.create(&PostParams::default(), &pod("a-0", "node-a"))
        .await
        .unwrap();
    shop.create(&PostParams::default(), &pod("b-0", "node-b"))
        .await
        .unwrap();
    let lp = ListParams::default().fields("spec.nodeName=node-a");
    let names: Vec<String> = pods
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(names, ["a-0"]);
    let wp = WatchParams::default()
        .fields("spec.nodeName=node-a")
        .timeout(30);
    let mut events = pods.watch(&wp, "0").await.unwrap().boxed();
    match within("the initial event", events.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        WatchEvent::Added(p) => assert_eq!(p.name_any(), "a-0"),
        other => panic!("{other:?}"),
    }
    shop.create(&PostParams::default(), &pod("b-1", "node-b"))
        .await
        .unwrap();
    shop.create(&PostParams::default(), &pod("a-1", "node-a"))
        .await
        .unwrap();
    match within("the node-a event", events.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        WatchEvent::Added(p) => assert_eq!(p.name_any(), "a-1", "node-b's pod was not sent"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_put_with_a_stale_resource_version_is_refused_with_409() {
    let (_server, _, client) = serve(Settings::default(), None).await;
    let leases: Api<Lease> = Api::namespaced(client, "aether-system");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "aether-registrar"},
        "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 15},
    }))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    // The holder renews with the resourceVersion it read: accepted, a new version.
    let mut renew = created.clone();
    renew.spec.as_mut().unwrap().lease_duration_seconds = Some(16);
    let renewed = leases
        .replace("aether-registrar", &PostParams::default(), &renew)
        .await
        .unwrap();
    assert_ne!(renewed.resource_version(), created.resource_version());
    // A claimant that read the old version loses.
    let mut claim = created;
    claim.spec.as_mut().unwrap().holder_identity = Some("node-b".into());
    let e = leases
        .replace("aether-registrar", &PostParams::default(), &claim)
        .await
        .unwrap_err();
    assert_eq!(api_code(e), 409);
    let now = leases.get("aether-registrar").await.unwrap();
    assert_eq!(now.spec.unwrap().holder_identity.as_deref(), Some("node-a"));
    let e = leases.get("nobody").await.unwrap_err();
    assert_eq!(api_code(e), 404);
    let e = leases
        .create(&PostParams::default(), &lease)
        .await
        .unwrap_err();
    assert_eq!(api_code(e), 409, "AlreadyExists");
}

#[tokio::test]
async fn a_merge_patch_with_a_stale_resource_version_is_refused_and_other_patch_types_are_415() {
    let (_server, _, client) = serve(Settings::default(), None).await;
    let pods: Api<Pod> = Api::namespaced(client, "shop");
    let p = pods
        .create(&PostParams::default(), &pod("web-0", "node-a"))
        .await
        .unwrap();
    let rv = p.resource_version().unwrap();
    let patched = pods
        .patch(
            "web-0",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"resourceVersion": rv, "labels": {"app": null, "v": "2"}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(patched.labels().get("v").map(String::as_str), Some("2"));
    assert!(
        !patched.labels().contains_key("app"),
        "null removes (RFC 7386)"
    );
    let e = pods
        .patch(
            "web-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": rv, "labels": {"v": "3"}}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(e), 409);
    let e = pods
        .patch(
            "web-0",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"v": "4"}}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(e), 415);
}

#[tokio::test]
async fn apply_creates_then_updates_keeps_the_cluster_ip_and_is_counted_per_field_manager() {
    let mut settings = Settings::default();
    settings
        .cluster_ips
        .insert("mp/mp-multi".into(), "10.96.44.44".parse().unwrap());
    let (server, _, client) = serve(settings, None).await;
    let services: Api<Service> = Api::namespaced(client, "mp");
    let pp = PatchParams::apply("aether-registrar");
    let svc = |port: i32| {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "mp-multi", "namespace": "mp", "labels": {"aether.io/generated": "true"}},
               "spec": {"ports": [{"name": format!("p{port}-tcp"), "port": port}]}})
    };
    let created = services
        .patch("mp-multi", &pp, &Patch::Apply(svc(9090)))
        .await
        .unwrap();
    let spec = created.spec.unwrap();
    assert_eq!(
        spec.cluster_ip.as_deref(),
        Some("10.96.44.44"),
        "the planned address"
    );
    let updated = services
        .patch("mp-multi", &pp, &Patch::Apply(svc(8080)))
        .await
        .unwrap();
    let spec = updated.spec.unwrap();
    assert_eq!(
        spec.ports.unwrap()[0].port,
        8080,
        "the applied list replaced the old one"
    );
    assert_eq!(
        spec.cluster_ip.as_deref(),
        Some("10.96.44.44"),
        "kept on update"
    );
    let e = services
        .patch("mp-multi", &PatchParams::default(), &Patch::Apply(svc(1)))
        .await
        .unwrap_err();
    assert_eq!(api_code(e), 400, "apply needs a field manager");
    let writes = server.read(|s| s.writes().clone());
    assert_eq!(
        writes.get(&("apply".into(), "services".into(), "aether-registrar".into())),
        Some(&2)
    );
}

#[tokio::test]
async fn a_status_write_changes_only_the_status_and_a_main_write_keeps_it() {
    let (server, _, client) = serve(Settings::default(), None).await;
    let pods: Api<Pod> = Api::namespaced(client, "shop");
    pods.create(&PostParams::default(), &pod("web-0", "node-a"))
        .await
        .unwrap();
    let mut p = pods.get("web-0").await.unwrap();
    p.spec.as_mut().unwrap().node_name = Some("node-z".into());
    p.status = Some(serde_json::from_value(json!({"podIP": "10.244.1.5"})).unwrap());
    let after = pods
        .replace_status("web-0", &PostParams::default(), &p)
        .await
        .unwrap();
    assert_eq!(
        after.status.as_ref().unwrap().pod_ip.as_deref(),
        Some("10.244.1.5")
    );
    assert_eq!(
        after.spec.as_ref().unwrap().node_name.as_deref(),
        Some("node-a")
    );
    // A main write with another status keeps the stored one.
    let mut main = after.clone();
    main.status = Some(serde_json::from_value(json!({"podIP": "6.6.6.6"})).unwrap());
    main.metadata.labels = Some([("v".to_owned(), "2".to_owned())].into());
    let kept = pods
        .replace("web-0", &PostParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(kept.status.unwrap().pod_ip.as_deref(), Some("10.244.1.5"));
    let writes = server.read(|s| s.writes().clone());
    assert_eq!(
        writes.get(&("update".into(), "pods/status".into(), String::new())),
        Some(&1)
    );
}

/// Until `f` holds of the source (bounded).
async fn until(source: &KubeSource, what: &str, f: impl Fn(&KubeSource) -> bool) {
    within(what, async {
        while !f(source) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

fn pod_names(source: &KubeSource) -> Vec<String> {
    let mut names: Vec<String> = source
        .objects()
        .0
        .pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    names.sort();
    names
}

fn relists(source: &KubeSource) -> u64 {
    source
        .kinds()
        .iter()
        .find(|k| k.kind == "Pod")
        .map_or(0, |k| k.relists.load(std::sync::atomic::Ordering::Relaxed))
}

/// The daemon's source as node-a's daemon runs it (with the node-local pod view), once every
/// kind is listed. Its change ticks are dropped.
async fn synced_source_of_node_a(client: &Client) -> KubeSource {
    let (tx, _) = tokio::sync::mpsc::channel(1);
    let settings = WatchSettings {
        node: Some("node-a".into()),
        ..WatchSettings::default()
    };
    let source = KubeSource::start(client, &settings, &tx);
    until(&source, "every kind is listed", KubeSource::synced).await;
    source
}

#[tokio::test]
async fn after_an_expiry_the_daemons_source_relists_and_holds_no_deleted_object() {
    let (server, _, client) = serve(Settings::default(), None).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    for name in ["web-0", "web-1"] {
        pods.create(&PostParams::default(), &pod(name, "node-a"))
            .await
            .unwrap();
    }
    let source = synced_source_of_node_a(&client).await;
    assert_eq!(pod_names(&source), ["web-0", "web-1"]);
    assert_eq!(
        fingerprint(&source.objects().0),
        server.fingerprint(),
        "the daemon's fingerprint of what it holds is the server's"
    );
    // An open watch gets 410 Gone: the source relists. Synced means listed, not yet watching: a
    // watch that starts after an expiry starts at the new floor and is not refused, so expire
    // until a watch was open to see it.
    within("the pods are relisted", async {
        while relists(&source) == 0 {
            server.expire();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // A deletion the watch never sees: the server is down while web-1 goes and the history is
    // dropped, so the watch resumes into a 410 and only the relist can tell.
    server.stop();
    server.write(|s| {
        let key = store::Key {
            resource: resources::by_plural("", "pods").unwrap(),
            namespace: "shop".into(),
            name: "web-1".into(),
        };
        s.delete(&key, false).unwrap();
        s.expire();
    });
    let before = relists(&source);
    assert_eq!(
        pod_names(&source),
        ["web-0", "web-1"],
        "stopped: the last state is kept"
    );
    server.start();
    until(&source, "the pods are relisted again", |s| {
        relists(s) > before
    })
    .await;
    until(&source, "web-1 is gone", |s| pod_names(s) == ["web-0"]).await;
    assert_eq!(fingerprint(&source.objects().0), server.fingerprint());
}

fn pods_resource() -> ResourceType {
    resources::by_plural("", "pods").unwrap()
}

/// The HTTP status of `request` sent by the client behind `api`.
async fn client_status(api: &Api<Pod>, request: ::http::Request<kube::client::Body>) -> u16 {
    let client: Client = api.clone().into_client();
    client.send(request).await.unwrap().status().as_u16()
}

/// As the real server: a refused list or new watch is `403 Forbidden` with a `Status` that
/// says who may not do what; a watch open before the refusal goes on until it ends (as its
/// timeout ends it); `allow` lifts the refusal.
#[tokio::test]
async fn a_refused_read_is_403_an_open_watch_goes_on_until_ended_and_allow_lifts_it() {
    let (server, _, client) = serve(Settings::default(), None).await;
    let pods: Api<Pod> = Api::all(client.clone());
    let shop: Api<Pod> = Api::namespaced(client, "shop");
    shop.create(&PostParams::default(), &pod("web-0", "node-a"))
        .await
        .unwrap();
    let rv = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut open = pods
        .watch(&WatchParams::default().timeout(60), &rv)
        .await
        .unwrap()
        .boxed();
    server.forbid(pods_resource(), &[ReadVerb::List, ReadVerb::Watch]);
    let e = pods.list(&ListParams::default()).await.unwrap_err();
    let kube::Error::Api(status) = e else {
        panic!("not an API error: {e}")
    };
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        status.message,
        "pods is forbidden: User \"system:anonymous\" cannot list resource \"pods\" in API group \"\" at the cluster scope"
    );
    // A watch is refused before it starts: an HTTP 403 with the Status as its body, which the
    // client reads as the stream's one error.
    let raw = ::http::Request::get(format!(
        "/api/v1/namespaces/shop/pods?watch=true&resourceVersion={rv}"
    ))
    .body(kube::client::Body::from(Vec::new()))
    .unwrap();
    assert_eq!(client_status(&shop, raw).await, 403);
    let mut refused = shop
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match within("the refused watch's error", refused.try_next()).await {
        Err(e) => assert_eq!(api_code(e), 403),
        other => panic!("{other:?}"),
    }
    // Get was not refused.
    assert!(shop.get("web-0").await.is_ok());
    // The watch open before the refusal still delivers.
    shop.create(&PostParams::default(), &pod("web-1", "node-a"))
        .await
        .unwrap();
    match within("an event on the open watch", open.try_next()).await {
        Ok(Some(WatchEvent::Added(p))) => assert_eq!(p.name_any(), "web-1"),
        other => panic!("{other:?}"),
    }
    // Ended as its timeout would end it: the stream just ends.
    server.end_watches(pods_resource());
    loop {
        match within("the watch ends", open.try_next()).await {
            Ok(None) => break,
            Ok(Some(WatchEvent::Bookmark(_))) => {}
            other => panic!("{other:?}"),
        }
    }
    server.allow(pods_resource());
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );
}

/// Issue #35 item 2 through the daemon's own [`KubeSource`] and real sockets: Pods refused
/// (403) after the source synced, once its open watches end. The source stays synced and keeps
/// its pods; a pod created meanwhile arrives once the refusal is lifted, with no relist.
#[tokio::test]
async fn a_refusal_after_the_sync_keeps_the_source_synced_and_is_recovered_without_a_relist() {
    let (server, _, client) = serve(Settings::default(), None).await;
    let shop: Api<Pod> = Api::namespaced(client.clone(), "shop");
    shop.create(&PostParams::default(), &pod("web-0", "node-a"))
        .await
        .unwrap();
    let source = synced_source_of_node_a(&client).await;
    let refused = |s: &KubeSource| {
        s.kinds()
            .iter()
            .filter(|k| k.kind.starts_with("Pod") && k.is_forbidden())
            .count()
    };
    // Ended until both pod watches were open to see it, then refused at their next watch.
    server.forbid(pods_resource(), ReadVerb::ALL);
    within("both pod watches are refused", async {
        while refused(&source) < 2 {
            server.end_watches(pods_resource());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        source.synced(),
        "a refusal after the sync unsynced the source"
    );
    assert_eq!(
        pod_names(&source),
        ["web-0"],
        "the last store stays in force"
    );
    // Created while the daemon may not read pods: not seen.
    shop.create(&PostParams::default(), &pod("web-1", "node-a"))
        .await
        .unwrap();
    server.allow(pods_resource());
    until(&source, "web-1 arrives", |s| {
        pod_names(s) == ["web-0", "web-1"]
    })
    .await;
    until(&source, "both refusals end", |s| refused(s) == 0).await;
    for k in source.kinds().iter().filter(|k| k.kind.starts_with("Pod")) {
        assert_eq!(
            k.relists.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "{}",
            k.kind
        );
        assert!(
            k.recoveries.load(std::sync::atomic::Ordering::Relaxed) >= 1,
            "{}",
            k.kind
        );
    }
    assert_eq!(fingerprint(&source.objects().0), server.fingerprint());
}

#[tokio::test]
async fn a_stopped_server_refuses_requests_and_serves_again_once_started() {
    let (server, _, client) = serve(Settings::default(), None).await;
    let pods: Api<Pod> = Api::namespaced(client, "shop");
    server.stop();
    assert!(
        within("a refused list", pods.list(&ListParams::default()))
            .await
            .is_err()
    );
    server.start();
    assert!(
        within("a list", pods.list(&ListParams::default()))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn a_directory_reload_turns_into_watch_events() {
    let dir = std::env::temp_dir().join(format!("aether-apiserver-reload-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let route = |port: u16| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r, namespace: mp}}\n\
             spec:\n  parentRefs: [{{group: \"\", kind: Service, name: mp-multi, port: {port}}}]\n"
        )
    };
    std::fs::write(dir.join("a.yaml"), route(9090)).unwrap();
    let (server, _, client) = serve(Settings::default(), Some(dir.clone())).await;
    let routes: Api<gateway_api::experimental::httproutes::HttpRoute> =
        Api::namespaced(client, "mp");
    let list = routes.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let rv = list.metadata.resource_version.unwrap();
    let mut events = routes
        .watch(&WatchParams::default().timeout(30), &rv)
        .await
        .unwrap()
        .boxed();
    let reload = |server: &Arc<ApiServer>| {
        let s = server.clone();
        async move {
            tokio::task::spawn_blocking(move || s.reload())
                .await
                .unwrap()
                .unwrap()
        }
    };
    std::fs::write(dir.join("a.yaml"), route(8080)).unwrap();
    std::fs::write(dir.join("b.yaml"), route(1).replace("name: r,", "name: s,")).unwrap();
    reload(&server).await;
    std::fs::remove_file(dir.join("b.yaml")).unwrap();
    let fp = reload(&server).await;
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let e = within("the reload's events", events.try_next())
            .await
            .unwrap()
            .unwrap();
        let (kind, r) = match e {
            WatchEvent::Added(r) => ("ADDED", r),
            WatchEvent::Modified(r) => ("MODIFIED", r),
            WatchEvent::Deleted(r) => ("DELETED", r),
            _ => continue,
        };
        let port = r.spec.parent_refs.as_ref().unwrap()[0].port.unwrap_or(0);
        seen.push(format!("{kind} {} {port}", r.name_any()));
    }
    assert_eq!(seen, ["MODIFIED r 8080", "ADDED s 1", "DELETED s 1"]);
    assert_eq!(fp, server.fingerprint());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_body_over_the_cap_is_413_a_slow_head_is_cut_and_connections_are_capped() {
    let settings = Settings {
        max_body: 1024,
        head_timeout: Duration::from_millis(300),
        max_connections: 2,
        ..Settings::default()
    };
    let (_server, addr, client) = serve(settings, None).await;
    let pods: Api<Pod> = Api::namespaced(client, "shop");
    let mut big = pod("web-0", "node-a");
    big.metadata.annotations = Some([("x".to_owned(), "y".repeat(4096))].into());
    let e = pods.create(&PostParams::default(), &big).await.unwrap_err();
    assert_eq!(api_code(e), 413);
    // A peer that sends half a head is closed after the head timeout.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /api/v1/pods HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let cut = tokio::time::timeout(Duration::from_secs(3), slow.read_to_end(&mut buf)).await;
    assert!(
        cut.is_ok(),
        "the connection stayed open past the head timeout"
    );
    // Two held connections fill the cap: the third is closed without an answer.
    let _a = TcpStream::connect(addr).await.unwrap();
    let _b = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .ok();
    let mut buf = Vec::new();
    let _ = within("the third connection is closed", c.read_to_end(&mut buf)).await;
    assert!(
        buf.is_empty(),
        "no answer over the cap: {}",
        String::from_utf8_lossy(&buf)
    );
}

#[tokio::test]
async fn the_control_api_answers_every_listed_request() {
    let (server, _, _client) = serve(Settings::default(), None).await;
    for (method, path) in control::CONTROL_ENDPOINTS {
        let path = match *path {
            p if p.ends_with('/') => format!("{p}core/pods"),
            p @ ("/lab/forbid" | "/lab/allow" | "/lab/end-watches") => {
                format!("{p}?resource=core/pods")
            }
            p => p.to_owned(),
        };
        let req = ::http::Request::builder()
            .method(*method)
            .uri(&path)
            .body(())
            .unwrap();
        let r = control::handle(&server, &req).await;
        assert_eq!(r.status(), 200, "{method} {path}");
    }
    server.start();
    let req = ::http::Request::builder()
        .uri("/lab/nothing")
        .body(())
        .unwrap();
    assert_eq!(control::handle(&server, &req).await.status(), 404);
}

/// The daemon's Kubernetes writers against the fake with a real client: the registrar takes the
/// Lease and applies a generated Service, which gets a ClusterIP; the status writer puts
/// aether's entry beside another controller's.
#[tokio::test]
async fn the_registrar_and_the_status_writer_write_through_a_real_client() {
    use std::sync::atomic::Ordering;

    use aether::registrar::{RegistrarInput, RegistrarState};
    use aether_core::model::port::Transport;
    use aether_core::model::snapshot::{ServicePort as SnapPort, TargetPort};

    let (_server, _, client) = serve(Settings::default(), None).await;
    let desired = aether_core::model::snapshot::Service {
        namespace: "shop".into(),
        name: "cart".into(),
        cluster_ips: Vec::new(),
        headless: false,
        generated: true,
        selector: None,
        ports: vec![SnapPort {
            name: Some("p8080-tcp".into()),
            port: 8080,
            target: TargetPort::Same,
            transport: Transport::Tcp,
            app_protocol: Some("http".into()),
        }],
    };
    let (tx, rx) = watch::channel(Arc::new(RegistrarInput {
        desired: vec![desired],
        existing: Vec::new(),
        filters: Vec::new(),
    }));
    let state = Arc::new(RegistrarState::default());
    let task = tokio::spawn(aether::registrar::run(
        client.clone(),
        node_a_registrar(),
        rx,
        state.clone(),
        Arc::default(),
    ));
    let services: Api<Service> = Api::namespaced(client.clone(), "shop");
    let svc = within("the generated Service", async {
        loop {
            if let Some(s) = services.get_opt("cart").await.unwrap() {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(state.leader.load(Ordering::Acquire));
    assert!(aether::registry::kube::generated::is_owned(&svc));
    let spec = svc.spec.unwrap();
    assert!(spec.cluster_ip.is_some_and(|ip| !ip.is_empty()));
    assert_eq!(spec.ports.unwrap()[0].app_protocol.as_deref(), Some("http"));
    let leases: Api<Lease> = Api::namespaced(client.clone(), "aether-system");
    let lease = leases.get("aether-registrar").await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("node-a-1")
    );
    drop(tx);
    task.await.unwrap();

    // Route status: an HTTPRoute holding another controller's entry.
    let ar = aether::route_status::api_resource("HTTPRoute").unwrap();
    let routes: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), "shop", &ar);
    let route: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "cart", "port": 8080}]},
    }))
    .unwrap();
    let made = routes.create(&PostParams::default(), &route).await.unwrap();
    let mut with_other = made.clone();
    let other = json!({"parentRef": {"name": "gw"}, "controllerName": "example.com/other",
        "conditions": []});
    with_other.data["status"] = json!({"parents": [other.clone()]});
    routes
        .replace_status("web", &PostParams::default(), &with_other)
        .await
        .unwrap();
    let parent = aether_core::model::snapshot::ParentRef {
        target: aether_core::model::snapshot::ObjectRef {
            group: String::new(),
            kind: "Service".into(),
            namespace: None,
            name: "cart".into(),
        },
        port: Some(8080),
        section_name: None,
    };
    let status = aether_core::model::attach::RouteStatus::of(
        "HTTPRoute",
        "shop",
        "web",
        1,
        &parent,
        vec![aether_core::model::attach::Condition {
            type_: "Accepted".into(),
            status: "True".into(),
            reason: "Accepted".into(),
            message: String::new(),
        }],
    );
    let key = ("HTTPRoute".to_owned(), "shop".to_owned(), "web".to_owned());
    let (stx, srx) = watch::channel(Arc::new(aether::route_status::StatusInput {
        statuses: vec![status],
        held: BTreeMap::from([(key, aether::route_status::HeldRoute { ours: Vec::new() })]),
    }));
    let pending = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn(aether::route_status::run(
        client.clone(),
        srx,
        pending,
        || false,
        Arc::default(),
    ));
    let parents = within("aether's status entry", async {
        loop {
            let r = routes.get("web").await.unwrap();
            let parents = r.data["status"]["parents"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if parents.len() == 2 {
                return parents;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(parents[0], other);
    assert_eq!(
        parents[1]["controllerName"],
        json!(aether::route_status::CONTROLLER_NAME)
    );
    assert_eq!(parents[1]["conditions"][0]["status"], json!("True"));
    drop(stx);
    writer.await.unwrap();
}

/// issue #35 item 1: the registrar writes each MeshFilter's `Accepted` condition through a real
/// client: `False` with the converter's words for one whose `extAuthz.server` has no port and
/// for one that does not decode, `True` for a good one; once written, the daemon's own source
/// reads the object with its status (a status never makes a filter undecodable) and finds
/// nothing left to write.
#[tokio::test]
async fn the_registrar_writes_why_a_mesh_filter_is_not_accepted() {
    use aether::registrar::{RegistrarInput, RegistrarState};

    let (_server, _, client) = serve(Settings::default(), None).await;
    let resource = kube::api::ApiResource {
        group: "aether.io".into(),
        version: "v1alpha1".into(),
        api_version: "aether.io/v1alpha1".into(),
        kind: "MeshFilter".into(),
        plural: "meshfilters".into(),
    };
    let filters: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), "shop", &resource);
    for (name, ext_authz) in [
        ("no-port", json!({"server": "authz.shop.aether.internal"})),
        ("good", json!({"server": "authz.shop.aether.internal:9191"})),
        (
            "garbled",
            json!({"sever": "authz.shop.aether.internal:9191"}),
        ),
    ] {
        let f: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "aether.io/v1alpha1", "kind": "MeshFilter",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "cart"}],
                     "extAuthz": ext_authz},
        }))
        .unwrap();
        filters.create(&PostParams::default(), &f).await.unwrap();
    }
    let source = synced_source_of_node_a(&client).await;
    let input = || {
        let (objects, _) = source.objects();
        let (snapshot, _) = aether::registry::kube::objects::snapshot(&objects);
        Arc::new(RegistrarInput {
            desired: Vec::new(),
            existing: Vec::new(),
            filters: aether::registrar::filter_status::wanted(&objects, &snapshot),
        })
    };
    let (tx, rx) = watch::channel(input());
    let state = Arc::new(RegistrarState::default());
    let task = tokio::spawn(aether::registrar::run(
        client.clone(),
        node_a_registrar(),
        rx,
        state.clone(),
        Arc::default(),
    ));
    let accepted = |o: &kube::api::DynamicObject| {
        let c = o.data["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Accepted").cloned())?;
        Some((
            c["status"].as_str()?.to_owned(),
            c["reason"].as_str()?.to_owned(),
            c["message"].as_str().unwrap_or_default().to_owned(),
        ))
    };
    for (name, want, why) in [
        ("no-port", "False", "extAuthz.server"),
        ("garbled", "False", "sever"),
        ("good", "True", ""),
    ] {
        let got = within("the filter's status", async {
            loop {
                if let Some(c) = accepted(&filters.get(name).await.unwrap()) {
                    return c;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert_eq!(got.0, want, "{name}: {got:?}");
        assert!(got.2.contains(why), "{name}: {got:?}");
        if want == "False" {
            assert_eq!(got.1, "Invalid");
        }
    }
    // The source reads the written objects (status and all) and nothing is left to write.
    within("the source holds the written statuses", async {
        loop {
            let i = input();
            let typed = i.filters.iter().filter(|w| w.held.is_some()).count();
            if typed == 2 && i.filters.iter().all(|w| w.written() != Some(false)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    drop(tx);
    task.await.unwrap();
}

/// Issue #36 item 3: with the release namespace missing, every Lease create failed with 404
/// and was logged at debug only (no registrar, no generated Services, the node ready anyway).
/// Now the problem is kept for `/ready` and `aether debug`, logged, counted by code, and ends
/// once the namespace exists. The fake refuses a create in a missing namespace as the real
/// server does (`namespaces_must_exist`).
#[tokio::test]
async fn a_missing_release_namespace_is_a_lease_problem_until_it_exists() {
    use std::sync::atomic::Ordering;

    use k8s_openapi::api::core::v1::Namespace;

    use aether::registrar::{RegistrarInput, RegistrarState};

    let settings = Settings {
        namespaces_must_exist: true,
        ..Settings::default()
    };
    let (_server, _, client) = serve(settings, None).await;
    let (tx, rx) = watch::channel(Arc::new(RegistrarInput {
        desired: Vec::new(),
        existing: Vec::new(),
        filters: Vec::new(),
    }));
    let state = Arc::new(RegistrarState::default());
    let stats = Arc::new(aether::registrar::RegistrarStats::default());
    let task = tokio::spawn(aether::registrar::run(
        client.clone(),
        node_a_registrar(),
        rx,
        state.clone(),
        stats.clone(),
    ));
    let problem = within("the Lease problem", async {
        loop {
            if let Some(p) = state.lease_problem.lock().clone() {
                return p;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(problem.code, Some(404));
    assert_eq!(problem.lease, "aether-system/aether-registrar");
    assert!(problem.error.contains("not found"), "{}", problem.error);
    let report = problem.report();
    assert!(
        report.starts_with("registrar: its Lease aether-system/aether-registrar cannot be taken (HTTP 404) (does its namespace exist?)"),
        "{report}"
    );
    assert!(
        stats
            .lease_errors
            .get_or_create(&[("code", "404".to_owned())])
            .get()
            >= 1
    );
    assert!(!state.leader.load(Ordering::Acquire));

    // The namespace is made: the Lease is taken and the problem ends.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "aether-system"}
    }))
    .unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    within("the Lease taken", async {
        while !state.leader.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(state.lease_problem.lock().is_none());
    drop(tx);
    within("the registrar ends", task).await.unwrap();
}

/// The registrar settings of node-a's daemon, its Lease in `aether-system`.
fn node_a_registrar() -> aether::registrar::RegistrarSettings {
    aether::registrar::RegistrarSettings {
        namespace: "aether-system".into(),
        lease_name: aether::registrar::LEASE_NAME.into(),
        identity: "node-a-1".into(),
        timing: aether_core::registrar::lease::LeaseTiming::default(),
    }
}
