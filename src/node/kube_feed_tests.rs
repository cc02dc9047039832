//! The Kubernetes source feeding the kept model by changes (issue #37, [`super::kube_feed`]):
//! after every change a client makes on the API server (the lab's, through the real watches),
//! the model the feed keeps is the compile of the snapshot of the stores, retention included.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::kube_feed::KubeFeed;
use crate::model::live::Live;
use crate::model::registrar::generated_services_except;
use crate::model::retention::{GRACE_MS, advance};
use crate::model::snapshot::RetainedPort;
use crate::model::{Model, NodeContext, compile};
use crate::registry::kube::objects::{fingerprint, snapshot};
use crate::registry::kube::watch::{KubeSource, WatchSettings};
use aether_lab::lab::apiserver::store::{Key, Part};
use aether_lab::lab::apiserver::{ApiServer, Settings, resources, serve_on_loopback};

const NAMESPACES: [&str; 2] = ["shop", "web"];
const ACCOUNTS: [&str; 3] = ["api", "cart", "db"];

fn key(plural: &str, group: &str, namespace: &str, name: &str) -> Key {
    Key {
        resource: resources::by_plural(group, plural).expect("a served resource"),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    }
}

/// Puts `body` under `key` (created, or its main part replaced), then its status, as a client
/// and the kubelet would. What the server refused (a ClusterIP changed, or taken), as a
/// refusal the step names.
fn put(server: &ApiServer, key: &Key, body: &Value) -> Result<(), String> {
    server.write(|s| {
        if s.get(key).is_ok() {
            s.replace(key, body.clone(), Part::Main)
        } else {
            s.create(key, body.clone())
        }
        .map_err(|e| format!("refused: {e:?}"))?;
        if body.get("status").is_some() {
            s.replace(key, body.clone(), Part::Status)
                .map_err(|e| format!("status refused: {e:?}"))?;
        }
        Ok(())
    })
}

fn delete(server: &ApiServer, key: &Key) {
    server.write(|s| {
        let _ = s.delete(key, false);
    });
}

/// One random change to the cluster: a pod put (its service account, address, readiness and
/// port annotations drawn from few values, so that addresses collide and services gain and
/// lose rows) or deleted, a Service (user or generated, its ClusterIP drawn from few) put or
/// deleted, an HTTPRoute, a MeshFilter (or one that does not decode), or a relist.
fn change(server: &ApiServer, rng: &mut fastrand::Rng) -> String {
    let ns = NAMESPACES[rng.usize(..NAMESPACES.len())];
    match rng.u8(..10) {
        0..=3 => {
            let i = rng.u8(..6);
            let name = format!("p{i}");
            let sa = ACCOUNTS[rng.usize(..ACCOUNTS.len())];
            let ip = format!("10.1.0.{}", rng.u8(1..6));
            let annotations = match rng.u8(..6) {
                0 => json!({}),
                1 => json!({"endpoint.aether.io/ports": "8080=http"}),
                2 => json!({"endpoint.aether.io/ports": "9000=tcp,8080=http"}),
                3 => json!({"endpoint.aether.io/ports": "9000=bogus"}),
                4 => json!({"aether.io/managed": "maybe"}),
                _ => json!({"aether.io/managed": "false"}),
            };
            // A pod stays on its node: half of them on this one.
            let node = if i.is_multiple_of(2) {
                "node-a"
            } else {
                "node-b"
            };
            let ready = if rng.bool() { "True" } else { "False" };
            let body = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "annotations": annotations,
                             "labels": {"app": sa}},
                "spec": {"nodeName": node, "serviceAccountName": sa,
                         "containers": [{"name": "app", "image": "app:1"}]},
                "status": {"podIP": ip, "podIPs": [{"ip": ip}],
                           "conditions": [{"type": "Ready", "status": ready}]},
            });
            let put = put(server, &key("pods", "", ns, &name), &body);
            format!("pod {ns}/{name} {sa} {ip} ready={ready} {annotations} {put:?}")
        }
        4 => {
            let name = format!("p{}", rng.u8(..6));
            delete(server, &key("pods", "", ns, &name));
            format!("pod {ns}/{name} deleted")
        }
        5 | 6 => {
            let name = ACCOUNTS[rng.usize(..ACCOUNTS.len())];
            if rng.u8(..4) == 0 {
                delete(server, &key("services", "", ns, name));
                return format!("service {ns}/{name} deleted");
            }
            let generated = rng.bool();
            let ip = format!("10.96.0.{}", rng.u8(1..4));
            let mut labels = json!({});
            if generated {
                labels = json!({"aether.io/mesh-service": "true"});
            }
            let port = if rng.bool() { 80 } else { 9000 };
            let body = json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": ns, "labels": labels},
                "spec": {"clusterIP": ip, "selector": {"app": name},
                         "ports": [{"name": "p", "port": port, "targetPort": 8080}]},
            });
            let at = key("services", "", ns, name);
            // A ClusterIP cannot change: a Service given another is made again.
            let was = server.read(|s| s.get(&at).ok().map(|v| v["spec"]["clusterIP"].clone()));
            if was.is_some_and(|was| was != json!(ip)) {
                delete(server, &at);
            }
            let put = put(server, &at, &body);
            format!("service {ns}/{name} {ip}:{port} generated={generated} {put:?}")
        }
        7 => {
            let name = format!("r{}", rng.u8(..2));
            if rng.u8(..3) == 0 {
                delete(
                    server,
                    &key("httproutes", "gateway.networking.k8s.io", ns, &name),
                );
                return format!("route {ns}/{name} deleted");
            }
            let parent = ACCOUNTS[rng.usize(..ACCOUNTS.len())];
            let backend = ACCOUNTS[rng.usize(..ACCOUNTS.len())];
            let body = json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": parent}],
                         "rules": [{"backendRefs": [{"name": backend, "port": 80}]}]},
            });
            let put = put(
                server,
                &key("httproutes", "gateway.networking.k8s.io", ns, &name),
                &body,
            );
            format!("route {ns}/{name} {parent} -> {backend} {put:?}")
        }
        8 => {
            let target = ACCOUNTS[rng.usize(..ACCOUNTS.len())];
            let spec = if rng.bool() {
                json!({"targetRefs": [{"group": "", "kind": "Service", "name": target}],
                       "headerMutation": {"request": {"set": [{"name": "x-tenant", "value": ns}]}}})
            } else {
                // Not a MeshFilter its wire type reads.
                json!({"targetRefs": "every one"})
            };
            let body = json!({
                "apiVersion": "aether.io/v1alpha1", "kind": "MeshFilter",
                "metadata": {"name": "f", "namespace": ns},
                "spec": spec,
            });
            let put = put(server, &key("meshfilters", "aether.io", ns, "f"), &body);
            format!("filter {ns}/f {spec} {put:?}")
        }
        _ => {
            server.expire();
            "relist".to_owned()
        }
    }
}

/// The fingerprint of the server's objects that deserialize (the stores' fingerprint leaves
/// the others out): every MeshFilter `f` whose spec has a `targetRefs` list.
fn readable_fingerprint(server: &ApiServer) -> u64 {
    server.fingerprint_of(|k, v| {
        k.resource.kind != "MeshFilter" || v["spec"]["targetRefs"].is_array()
    })
}

/// A snapshot's objects in an order of their own (`Debug` text, sorted): the kept model's
/// snapshot lists them by key, the stores' by kind and name.
fn same_objects(s: &crate::model::Snapshot) -> Vec<String> {
    let mut all: Vec<String> = s
        .rows
        .iter()
        .map(|o| format!("{o:?}"))
        .chain(s.pods.iter().map(|o| format!("{o:?}")))
        .chain(s.refused_pods.iter().map(|o| format!("{o:?}")))
        .chain(s.services.iter().map(|o| format!("{o:?}")))
        .chain(s.http_routes.iter().map(|o| format!("{o:?}")))
        .chain(s.mesh_filters.iter().map(|o| format!("{o:?}")))
        .chain(s.retained.iter().map(|o| format!("{o:?}")))
        .collect();
    all.sort();
    all
}

/// Waits until the stores hold what the server holds.
async fn caught_up(server: &ApiServer, source: &KubeSource, step: &str) {
    let deadline = crate::time::now() + Duration::from_secs(60);
    loop {
        if source.synced() && fingerprint(&source.objects().0) == readable_fingerprint(server) {
            return;
        }
        assert!(
            crate::time::now() < deadline,
            "the watches did not bring {step}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_kept_model_fed_by_watch_events_is_the_compile_of_the_stores() {
    let seed = std::env::var("AETHER_FEED_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let steps: usize = std::env::var("AETHER_FEED_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    eprintln!("seed {seed} (AETHER_FEED_SEED={seed} replays it), {steps} steps");
    let mut rng = fastrand::Rng::with_seed(seed);
    let (server, _, client) = serve_on_loopback(Settings::default(), None).await;
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let settings = WatchSettings {
        node: Some("node-a".into()),
        ..WatchSettings::default()
    };
    let source = Arc::new(KubeSource::start(&client, &settings, &tx));
    caught_up(&server, &source, "the first list").await;

    let mut ctx = NodeContext {
        node: Some("node-a".into()),
        now_ms: 1_000_000,
        ..NodeContext::default()
    };
    let mut feed = KubeFeed::default();
    let mut live = Live::new(ctx.clone());
    let mut previous: Option<(Model, Vec<RetainedPort>)> = None;
    let mut whole = 0;
    let mut desired_before = Vec::new();
    for step in 0..steps {
        let what = change(&server, &mut rng);
        caught_up(&server, &source, &what).await;
        // Now and then past a retained port's grace.
        ctx.now_ms += if rng.u8(..5) == 0 { GRACE_MS } else { 1_000 };
        // A watch records its key just after the store took the change: a load may come
        // between the two and see it at the next, as the node's next tick brings it.
        let deadline = crate::time::now() + Duration::from_secs(60);
        // Whether the loads took pods alone, and said the desired Services may have changed.
        let (mut only_pods, mut said) = (true, false);
        let fed = loop {
            let fed = feed.load(
                &source,
                &mut live,
                &ctx,
                previous.as_ref().map(|(m, r)| (m, r.as_slice())),
            );
            whole += usize::from(fed.whole);
            only_pods &= fed.only_pods;
            said |= fed.desired_changed;
            if fed.fingerprint == readable_fingerprint(&server) {
                break fed;
            }
            assert!(
                crate::time::now() < deadline,
                "seed {seed}, step {step} ({what}): the feed did not take it"
            );
            previous = Some((live.model().clone(), fed.retained));
            tokio::time::sleep(Duration::from_millis(5)).await;
        };

        let mut reference = snapshot(&source.objects().0).0;
        // The registrar's desired Services: a load of pods alone says when they may change
        // (the writers' inputs are made again only then).
        let desired = generated_services_except(&reference, &ctx.ignored_namespaces).0;
        assert!(
            said || !only_pods || desired == desired_before,
            "seed {seed}, step {step} ({what}): the desired Services changed and the load said not"
        );
        desired_before = desired;
        if let Some((model, retained)) = &previous {
            reference.retained = advance(&model.http_ports(), retained, &reference, ctx.now_ms);
        }
        assert_eq!(
            fed.retained, reference.retained,
            "seed {seed}, step {step} ({what}): the retained ports"
        );
        // The objects themselves, beyond what the model makes of them (a stale row of a pod
        // now unmanaged is not served, but is still wrong).
        let held = live.snapshot();
        assert_eq!(
            same_objects(&held),
            same_objects(&reference),
            "seed {seed}, step {step} ({what}): the objects held"
        );
        let expected = compile(&reference, &ctx);
        if let Some(difference) = crate::test_util::model_difference(live.model(), &expected) {
            panic!(
                "seed {seed}, step {step} ({what}): the kept model is not the compile of the stores: {difference}"
            );
        }
        previous = Some((live.model().clone(), fed.retained));
    }
    // Most steps were applied by their changes alone (a relist reads everything again).
    assert!(
        whole < steps / 2,
        "seed {seed}: {whole} of {steps} loads read everything"
    );
}
