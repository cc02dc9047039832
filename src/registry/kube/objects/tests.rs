use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, PodIP, Volume};
use serde::de::DeserializeOwned;

use super::*;
use crate::model::names::Domains;
use crate::model::{NodeContext, compile, registrar};
use crate::registry::file::{endpoint_slices_for, load_dir};
use crate::registry::kube::generated::service_object;
use crate::registry::kube::pod::{MeshPodSpec, MeshPodStatus, PodMeta};

fn typed<T: DeserializeOwned>(doc: &serde_json::Value) -> Arc<T> {
    Arc::new(serde_json::from_value(doc.clone()).expect("a fixture document deserializes"))
}

/// A pod as the watch stores it: its JSON, as the API server sends it, decoded as a [`MeshPod`].
fn stored(pod: &Pod) -> Arc<MeshPod> {
    typed(&serde_json::to_value(pod).unwrap())
}

/// The objects an API server would hold for a manifest directory: every document as written,
/// then what the cluster's controllers add (kubelet's `Ready` condition where the manifest
/// gives none, the EndpointSlice controller's slices, the registrar's generated Services with
/// the ClusterIPs the API server would allocate; here the file registry's allocator stands in).
fn cluster_objects(dir: &Path, cidr: ipnet::IpNet) -> Objects {
    let mut o = Objects::default();
    let mut pods = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let (docs, broken) = crate::yaml::documents_of(&text);
        assert_eq!(broken, None, "{}", file.display());
        for mut doc in docs {
            if doc.is_null() {
                continue;
            }
            let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
            if kind != "Namespace" && doc["metadata"]["namespace"].is_null() {
                doc["metadata"]["namespace"] = "default".into();
            }
            match kind.as_str() {
                "Pod" => {
                    let mut pod: Pod = serde_json::from_value(doc).unwrap();
                    let status = pod.status.get_or_insert_with(Default::default);
                    if status.conditions.is_none() {
                        status.conditions = Some(vec![PodCondition {
                            type_: "Ready".into(),
                            status: "True".into(),
                            ..Default::default()
                        }]);
                    }
                    pods.push(pod);
                }
                "Service" => o.services.push(typed(&doc)),
                "EndpointSlice" => o.endpoint_slices.push(typed(&doc)),
                "Namespace" => o.namespaces.push(typed(&doc)),
                "HTTPRoute" => o.http_routes.push(typed(&doc)),
                "GRPCRoute" => o.grpc_routes.push(typed(&doc)),
                "TLSRoute" => o.tls_routes.push(typed(&doc)),
                "TCPRoute" => o.tcp_routes.push(typed(&doc)),
                "UDPRoute" => o.udp_routes.push(typed(&doc)),
                "ReferenceGrant" => o.reference_grants.push(typed(&doc)),
                "MeshFilter" => o.mesh_filters.push(typed(&doc)),
                "ServiceAccount" => {}
                other => panic!("the fixture has a {other}: add it here"),
            }
        }
    }
    // The EndpointSlice controller.
    let services: Vec<&Service> = o.services.iter().map(Arc::as_ref).collect();
    let slices = endpoint_slices_for(&services, &pods.iter().collect::<Vec<_>>());
    o.pods = pods.iter().map(stored).collect();
    o.endpoint_slices.extend(slices.into_iter().map(Arc::new));
    // The registrar, then the API server's ClusterIP allocation.
    let (mut s, problems) = snapshot(&o);
    assert!(problems.is_empty(), "{problems:?}");
    let (mut generated, _) = registrar::generated_services_except(&s, &BTreeSet::new());
    let user: Vec<_> = s.services.drain(..).collect();
    generated.retain(|g| {
        !user
            .iter()
            .any(|u| u.namespace == g.namespace && u.name == g.name)
    });
    let mut all: Vec<_> = user.into_iter().chain(generated.iter().cloned()).collect();
    registrar::allocate_cluster_ips(&mut all, cidr);
    for g in all.iter().filter(|s| s.generated) {
        let mut object = service_object(g);
        let spec = object.spec.as_mut().unwrap();
        spec.cluster_ip = g.cluster_ips.first().map(ToString::to_string);
        spec.cluster_ips = Some(g.cluster_ips.iter().map(ToString::to_string).collect());
        o.services.push(Arc::new(object));
    }
    o
}

fn context() -> NodeContext {
    NodeContext {
        domains: Domains {
            mesh: "aether.internal".into(),
            cluster: "cluster.local".into(),
        },
        trust_domain: "cluster.local".into(),
        node: Some("node-a".into()),
        capture_redirect_all_default: true,
        ignored_namespaces: BTreeSet::from(["kube-system".to_owned()]),
        now_ms: 1_000_000,
        inbound_strict_default: false,
    }
}

#[test]
fn the_demo_mesh_compiles_to_the_same_model_through_the_file_registry_and_the_kubernetes_source() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/mp");
    let cidr: ipnet::IpNet = "10.96.0.0/16".parse().unwrap();
    let ctx = context();

    let file = load_dir(&dir).unwrap();
    assert!(file.problems.is_empty(), "{:?}", file.problems);
    let mut from_file = file.snapshot;
    registrar::complete_snapshot(&mut from_file, cidr);
    // The container command is the local lab's (the file registry starts it in the pod's
    // namespace); a cluster's kubelet runs it, so the Kubernetes source does not keep it.
    for pod in &mut from_file.pods {
        Arc::make_mut(pod).command.clear();
    }

    let (from_kube, problems) = snapshot(&cluster_objects(&dir, cidr));
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        from_kube.rows.len(),
        from_file.rows.len(),
        "the same rows are registered"
    );
    let (a, b) = (compile(&from_file, &ctx), compile(&from_kube, &ctx));
    assert!(a.pods().count() > 0 && a.name_count() > 0 && a.route_statuses().next().is_some());
    assert_eq!(
        a, b,
        "config/examples/mp compiles differently through the two sources"
    );
}

fn full_pod() -> Pod {
    let mut pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "web-0", "namespace": "shop", "uid": "u1", "resourceVersion": "7",
            "labels": {"app": "web"},
            "annotations": {
                "endpoint.aether.io/port": "8080",
                "endpoint.aether.io/ports": "9000=tcp",
                "capture.aether.io/exclude-outbound-ports": "5432",
                "inbound.aether.io/mode": "strict",
                "kubectl.kubernetes.io/last-applied-configuration": "{\"a very\": \"long text\"}",
                "prometheus.io/scrape": "true"
            },
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-x", "uid": "r1"}]
        },
        "spec": {
            "serviceAccountName": "web", "nodeName": "node-b",
            "containers": [{"name": "app", "image": "web:1", "command": ["web"]}],
            "tolerations": [{"operator": "Exists"}]
        },
        "status": {
            "phase": "Running", "podIP": "10.244.2.7", "podIPs": [{"ip": "10.244.2.7"}],
            "hostIP": "172.18.0.3",
            "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}
            ],
            "containerStatuses": [{"name": "app", "image": "web:1", "imageID": "sha256:1", "ready": true, "restartCount": 0}]
        }
    }))
    .unwrap();
    let spec = pod.spec.as_mut().unwrap();
    spec.volumes = Some(vec![Volume {
        name: "token".into(),
        ..Default::default()
    }]);
    spec.containers.push(Container {
        name: "sidecar".into(),
        ..Default::default()
    });
    pod
}

#[test]
fn a_pod_without_a_ready_condition_is_a_row_but_not_ready() {
    let mut pod = full_pod();
    pod.status.as_mut().unwrap().conditions = None;
    let (s, problems) = snapshot(&Objects {
        pods: vec![stored(&pod)],
        ..Objects::default()
    });
    assert!(problems.is_empty());
    assert_eq!(s.rows.len(), 1);
    assert!(
        !s.rows[0].ready,
        "Ready is the condition being True (model.md §3.5)"
    );
}

#[test]
fn the_snapshot_does_not_depend_on_the_order_of_the_stores_and_a_bad_object_hides_no_other() {
    let pod = |name: &str, ip: &str| {
        let mut p = full_pod();
        p.metadata.name = Some(name.into());
        p.status.as_mut().unwrap().pod_ips = Some(vec![PodIP { ip: ip.into() }]);
        p.status.as_mut().unwrap().pod_ip = Some(ip.into());
        p
    };
    let mut bad = pod("web-bad", "10.244.2.9");
    bad.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("aether.io/managed".into(), "perhaps".into());
    let pod = |name: &str, ip: &str| stored(&pod(name, ip));
    let forward = Objects {
        pods: vec![
            pod("web-0", "10.244.2.7"),
            stored(&bad),
            pod("web-1", "10.244.2.8"),
        ],
        ..Objects::default()
    };
    let mut backward = forward.clone();
    backward.pods.reverse();
    let (a, problems) = snapshot(&forward);
    let (b, _) = snapshot(&backward);
    assert_eq!(a, b);
    assert_eq!(a.rows.len(), 2, "the two good pods are rows");
    assert_eq!(problems.len(), 1);
    let text = problems[0].to_string();
    assert!(text.contains("shop/web-bad"), "{text}");
    assert!(text.contains("aether.io/managed"), "{text}");
}

fn pod_on(name: &str, node: Option<&str>, ip: &str) -> Arc<MeshPod> {
    Arc::new(MeshPod {
        metadata: PodMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            ..PodMeta::default()
        },
        spec: Some(MeshPodSpec {
            node_name: node.map(Into::into),
            ..MeshPodSpec::default()
        }),
        status: Some(MeshPodStatus {
            pod_ip: Some(ip.into()),
            ..MeshPodStatus::default()
        }),
        ..MeshPod::default()
    })
}

#[test]
fn this_nodes_pods_come_from_the_node_local_view_and_every_other_pod_from_the_cluster_wide_store() {
    let cluster = vec![
        // Stale: the node-local view has it with its new IP.
        pod_on("web-0", Some("node-a"), "10.0.0.1"),
        // Gone from the node-local view: not this node's to serve any more.
        pod_on("web-9", Some("node-a"), "10.0.0.9"),
        pod_on("api-0", Some("node-b"), "10.0.1.1"),
        // Not scheduled yet: nobody's, kept as the cluster holds it.
        pod_on("job-0", None, "10.0.2.1"),
    ];
    let local = vec![
        pod_on("web-0", Some("node-a"), "10.0.0.2"),
        // Not in the cluster-wide store yet.
        pod_on("web-1", Some("node-a"), "10.0.0.3"),
        // A server that ignored the field selector: another node's pod is not taken from here.
        pod_on("api-0", Some("node-b"), "10.9.9.9"),
    ];
    let pods = with_local_view(cluster, local, "node-a");
    let mut seen: Vec<(String, String)> = pods
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap(),
                p.status.as_ref().unwrap().pod_ip.clone().unwrap(),
            )
        })
        .collect();
    seen.sort();
    let want = [
        ("api-0", "10.0.1.1"),
        ("job-0", "10.0.2.1"),
        ("web-0", "10.0.0.2"),
        ("web-1", "10.0.0.3"),
    ];
    assert_eq!(
        seen,
        want.map(|(n, ip)| (n.to_owned(), ip.to_owned())).to_vec()
    );
}

#[test]
fn a_conversion_that_takes_unchanged_pods_from_the_last_equals_one_from_scratch() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/mp");
    let cidr: ipnet::IpNet = "10.96.0.0/16".parse().unwrap();
    let first = cluster_objects(&dir, cidr);
    assert!(first.pods.len() >= 4, "the fixture has pods to change");
    let (s1, problems, places) = snapshot_reusing(&first, None);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(places.reused, 0);

    // The stores replace a changed object whole: a new `Arc` for each pod below.
    let mut next = first;
    let status = |p: &mut MeshPod| p.status.get_or_insert_with(MeshPodStatus::default).clone();
    // One pod flips to not Ready.
    let mut flipped = (*next.pods[0]).clone();
    let mut st = status(&mut flipped);
    for c in st.conditions.iter_mut().flatten() {
        if c.type_ == "Ready" {
            c.status = "False".into();
        }
    }
    flipped.status = Some(st);
    next.pods[0] = Arc::new(flipped);
    // One pod gets an address that does not parse: it is left out, with its reason.
    let mut bad = (*next.pods[1]).clone();
    let mut st = status(&mut bad);
    st.pod_ip = Some("not-an-address".into());
    st.pod_ips = None;
    bad.status = Some(st);
    next.pods[1] = Arc::new(bad);
    // One pod goes, and a new one comes.
    let gone = next.pods.remove(2);
    let mut new = (*gone).clone();
    new.metadata.name = Some("a-new-pod".into());
    next.pods.push(Arc::new(new));
    // And one whose name sorts after every other; the stores hand their objects out in any
    // order.
    let mut last = (*gone).clone();
    last.metadata.name = Some("zz-last-pod".into());
    next.pods.insert(3, Arc::new(last));
    next.pods.reverse();

    let (s2, p2, places2) = snapshot_reusing(&next, Some((&places, &s1)));
    let (plain, plain_problems) = snapshot(&next);
    assert_eq!(p2, plain_problems);
    assert_eq!(p2.len(), 1, "the pod with a bad address: {p2:?}");
    assert!(
        s2 == plain,
        "the reusing conversion differs from the plain one"
    );
    assert_eq!(
        places2.reused,
        next.pods.len() - 4,
        "every pod but the flipped, the bad and the two new ones"
    );
    assert_ne!(s1, s2, "the change shows");

    // Nothing changed since: every pod is taken, the one that did not convert too, whatever
    // order the stores hand them out in.
    next.pods.rotate_left(2);
    let (s3, p3, places3) = snapshot_reusing(&next, Some((&places2, &s2)));
    assert_eq!(places3.reused, next.pods.len());
    assert_eq!(p3, plain_problems);
    assert!(s3 == plain);
    // Taken, not copied: the same pods and rows as the last snapshot's.
    assert!(!s3.pods.is_empty() && !s3.rows.is_empty());
    assert!(s3.pods.iter().zip(&s2.pods).all(|(a, b)| Arc::ptr_eq(a, b)));
    assert!(s3.rows.iter().zip(&s2.rows).all(|(a, b)| Arc::ptr_eq(a, b)));
    // Places paired with another snapshot than their own are not trusted past its ends.
    let (s4, _, _) = snapshot_reusing(&next, Some((&places2, &Snapshot::default())));
    assert!(s4 == plain);
}

#[test]
fn a_mesh_filter_that_cannot_be_read_is_kept_as_one_that_refuses() {
    use crate::model::snapshot::FilterConfig;
    // issue #35 item 1: a MeshFilter the converter refuses, and one the watch could not decode.
    let doc: serde_json::Value = crate::yaml::from_str(
        r#"
apiVersion: aether.io/v1alpha1
kind: MeshFilter
metadata: {name: mp-nine-ext-authz, namespace: mp}
spec:
  targetRefs: [{group: "", kind: Service, name: mp-nine}]
  extAuthz: {server: "mp-authz.mp.aether.internal"}
"#,
    )
    .unwrap();
    let (s, problems) = snapshot(&Objects {
        mesh_filters: vec![typed(&doc)],
        undecodable_mesh_filters: vec![Undecodable {
            namespace: "other".into(),
            name: "garbled".into(),
            generation: Some(1),
            why: "unknown field `sever`".into(),
        }],
        ..Objects::default()
    });
    // The converter's refusal is still a problem (logged and counted as before).
    assert_eq!(problems.len(), 1, "{problems:?}");
    let got: Vec<(&str, &str, &[String], bool)> = s
        .mesh_filters
        .iter()
        .map(|f| match &f.config {
            FilterConfig::Unreadable(u) => (
                f.namespace.as_str(),
                f.name.as_str(),
                f.target_refs.as_slice(),
                u.whole_namespace,
            ),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "mp",
                "mp-nine-ext-authz",
                &["mp-nine".to_owned()][..],
                false
            ),
            ("other", "garbled", &[][..], true),
        ]
    );
}
