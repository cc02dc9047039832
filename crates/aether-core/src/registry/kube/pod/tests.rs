//! A pod decoded as the mesh reads it: what it keeps, what it refuses, what it no longer reads.

use k8s_openapi::api::core::v1::Pod as K8sPod;

use super::MeshPod;
use crate::registry::kube::convert::{MissingReadyCondition, convert_pod};

/// A pod as an API server sends it: managed fields, labels, containers, statuses.
fn wire() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "shop",
            "uid": "7c1f0e0a-4a59-4d8e-9d43-6d0b2f1c2e11",
            "resourceVersion": "4711",
            "labels": {"app": "web", "pod-template-hash": "5d4f"},
            "annotations": {
                "aether.io/ports": "8080=http, 9000=tcp",
                "capture.aether.io/exclude-outbound-ports": "15000",
                "kubectl.kubernetes.io/last-applied-configuration": "{\"a\":1}",
                "prometheus.io/scrape": "true"
            },
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1"}],
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d4f", "uid": "u"}]
        },
        "spec": {
            "serviceAccountName": "web",
            "nodeName": "node-a",
            "containers": [{"name": "web", "image": "web:1", "command": ["/web"], "args": ["--port", "8080"]}],
            "volumes": [{"name": "token", "projected": {"sources": []}}]
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.7",
            "podIPs": [{"ip": "10.0.0.7"}, {"ip": "fd00::7"}],
            "hostIP": "192.168.1.4",
            "hostIPs": [{"ip": "192.168.1.4"}],
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T00:00:01Z"},
                {"type": "ContainersReady", "status": "True"}
            ],
            "containerStatuses": [{"name": "web", "ready": true, "restartCount": 0, "image": "web:1", "imageID": "x"}]
        }
    })
}

#[test]
fn a_pod_from_the_api_keeps_what_its_conversion_reads_and_converts_as_the_whole_pod_does() {
    let json = wire();
    let mesh: MeshPod = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(
        mesh.annotations.as_ref(),
        &[
            (
                "aether.io/ports".to_owned(),
                "8080=http, 9000=tcp".to_owned()
            ),
            (
                "capture.aether.io/exclude-outbound-ports".to_owned(),
                "15000".to_owned()
            ),
        ]
    );
    assert_eq!(
        mesh.metadata.labels, None,
        "labels are not read on this source"
    );
    assert_eq!(mesh.metadata.resource_version.as_deref(), Some("4711"));
    assert!(mesh.command.is_empty(), "no container is read from the API");
    let status = mesh.status.as_ref().unwrap();
    assert_eq!(status.conditions.as_ref().unwrap().len(), 1);
    assert_eq!(status.conditions.as_ref().unwrap()[0].type_, "Ready");
    for list in [status.pod_ips.as_ref(), status.host_ips.as_ref()] {
        let list = list.unwrap();
        assert_eq!(list.capacity(), list.len(), "held at its length");
    }

    // The same pod decoded whole by k8s-openapi and made a MeshPod converts to the same row,
    // but for the labels and command only the file registry reads.
    let whole: K8sPod = serde_json::from_value(json).unwrap();
    let from_whole = convert_pod(&MeshPod::from(&whole), MissingReadyCondition::NotReady).unwrap();
    let from_wire = convert_pod(&mesh, MissingReadyCondition::NotReady).unwrap();
    assert_eq!(from_wire.registration, from_whole.registration);
    assert_eq!(from_whole.pod.command, ["/web", "--port", "8080"]);
    assert_eq!(
        from_whole.pod.labels.get("app").map(String::as_str),
        Some("web")
    );
    let mut expected = from_whole.pod;
    expected.labels.clear();
    expected.command.clear();
    assert_eq!(from_wire.pod, expected);
    assert_eq!(from_wire.pod.ips.len(), 2);
    assert!(from_wire.pod.ready);
    assert_eq!(from_wire.pod.exclude_outbound_ports, [15000]);
}

#[test]
fn a_pod_whose_read_fields_do_not_decode_is_refused_as_before() {
    type Spoil = fn(&mut serde_json::Value);
    let cases: [(&str, Spoil); 6] = [
        ("podIPs not a list", |j| {
            j["status"]["podIPs"] = "10.0.0.7".into()
        }),
        ("an ip not a string", |j| {
            j["status"]["podIPs"] = serde_json::json!([{"ip": 7}])
        }),
        ("a condition's status not a string", |j| {
            j["status"]["conditions"] = serde_json::json!([{"type": "Ready", "status": true}]);
        }),
        ("hostNetwork not a boolean", |j| {
            j["spec"]["hostNetwork"] = "yes".into()
        }),
        ("another kind", |j| j["kind"] = "Service".into()),
        ("another version", |j| j["apiVersion"] = "v2".into()),
    ];
    for (case, spoil) in cases {
        let mut json = wire();
        spoil(&mut json);
        assert!(
            serde_json::from_value::<MeshPod>(json.clone()).is_err(),
            "{case}: decoded"
        );
        assert!(
            serde_json::from_value::<K8sPod>(json).is_err(),
            "{case}: k8s-openapi decodes it, so the mesh should too"
        );
    }
}

#[test]
fn a_missing_string_reads_as_empty_as_k8s_openapi_reads_it() {
    let mut json = wire();
    json["status"]["podIPs"] = serde_json::json!([{}]);
    json["status"]["conditions"] = serde_json::json!([{"type": "Ready"}]);
    let whole: K8sPod = serde_json::from_value(json.clone()).unwrap();
    let mesh: MeshPod = serde_json::from_value(json).unwrap();
    let a = convert_pod(&mesh, MissingReadyCondition::Ready);
    let b = convert_pod(&MeshPod::from(&whole), MissingReadyCondition::Ready);
    assert_eq!(a, b);
    let e = a.unwrap_err().to_string();
    assert!(e.contains("status.podIPs[0].ip"), "{e}");
    json = wire();
    json["status"]["conditions"] = serde_json::json!([{"type": "Ready"}]);
    let mesh: MeshPod = serde_json::from_value(json).unwrap();
    let c = convert_pod(&mesh, MissingReadyCondition::Ready).unwrap();
    assert!(
        !c.pod.ready,
        "a Ready condition without a status is not True"
    );
}

#[test]
fn a_field_the_mesh_does_not_read_does_not_keep_the_pod_out() {
    let mut json = wire();
    json["spec"]["containers"] = serde_json::json!("not a list");
    json["status"]["containerStatuses"] = serde_json::json!(7);
    assert!(serde_json::from_value::<K8sPod>(json.clone()).is_err());
    let mesh: MeshPod = serde_json::from_value(json).unwrap();
    let c = convert_pod(&mesh, MissingReadyCondition::NotReady).unwrap();
    assert!(
        c.registration.is_some(),
        "served: the mesh reads nothing of its containers"
    );
}
