//! The synthetic cluster of the scale benchmark, and a scripted API server that lists it.
//!
//! Objects are written as the API server sends them (JSON), generated from an index so that the
//! 100,000 pods are never held all at once: the server builds each list page when it is asked
//! for it. Layout for `n` pods:
//! - one mesh service (ServiceAccount, Deployment) per 10 pods, 50 services per namespace,
//!   100 pods per node;
//! - ports by service index: HTTP 8080; HTTP 8080 and 9090; HTTP 8080 and raw TCP 9000; raw TCP
//!   9000 alone (`endpoint.aether.io/*` annotations);
//! - one service in five also has a user Service of its own name (a Deployment's Service,
//!   selecting its pods), with the EndpointSlice the controller would write; half of those are
//!   routed by an HTTPRoute with two rules;
//! - the other services have the generated Service the registrar would write (computed by
//!   `aether::model::registrar` from the pods, ClusterIPs allocated as the file registry does).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::{Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Service;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use aether::model::registrar;
use aether::registry::kube::generated::service_object;
use aether::registry::kube::objects::{Objects, snapshot};
use aether::registry::kube::pod::MeshPod;
use aether::time::now;

/// Pods per mesh service (a Deployment's replicas).
pub(crate) const PODS_PER_SERVICE: usize = 10;
const SERVICES_PER_NAMESPACE: usize = 50;
const PODS_PER_NODE: usize = 100;

/// The shape of a synthetic cluster of `pods` pods.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cluster {
    pub(crate) pods: usize,
}

fn hex(seed: usize, len: usize) -> String {
    // A fixed mix, so names look like Kubernetes' generated suffixes and never collide by index.
    let mut x = (seed as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1_e995;
    (0..len)
        .map(|_| {
            x = x.rotate_left(5).wrapping_mul(0x2545_f491_4f6c_dd1d);
            const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            char::from(ALPHABET[(x % ALPHABET.len() as u64) as usize])
        })
        .collect()
}

fn uid(kind: u8, i: usize) -> String {
    format!("{kind:02x}{i:06x}-5c1e-4b6a-9d2f-{:012x}", i * 7919)
}

impl Cluster {
    pub(crate) fn mesh_services(&self) -> usize {
        self.pods.div_ceil(PODS_PER_SERVICE)
    }

    fn namespaces(&self) -> usize {
        self.mesh_services().div_ceil(SERVICES_PER_NAMESPACE)
    }

    fn nodes(&self) -> usize {
        self.pods.div_ceil(PODS_PER_NODE).max(1)
    }

    fn namespace(s: usize) -> String {
        format!("team-{}", s / SERVICES_PER_NAMESPACE)
    }

    fn pod_ip(p: usize) -> String {
        let v = 0x0a80_0000u32 + p as u32;
        std::net::Ipv4Addr::from(v).to_string()
    }

    /// Whether service `s` has a user Service of its own name, and whether a route names it.
    fn user_service(s: usize) -> bool {
        s % 5 == 4
    }

    fn routed(s: usize) -> bool {
        Self::user_service(s) && s.is_multiple_of(2)
    }

    /// The mesh annotations of service `s`'s pods.
    fn mesh_annotations(s: usize) -> Value {
        match s % 4 {
            0 => json!({"endpoint.aether.io/port": "8080", "endpoint.aether.io/protocol": "http"}),
            1 => json!({"endpoint.aether.io/port": "8080", "endpoint.aether.io/protocol": "http",
                        "endpoint.aether.io/ports": "9090"}),
            2 => json!({"endpoint.aether.io/port": "8080", "endpoint.aether.io/protocol": "http",
                        "endpoint.aether.io/ports": "9000=tcp"}),
            _ => json!({"endpoint.aether.io/port": "9000", "endpoint.aether.io/protocol": "tcp"}),
        }
    }

    /// Pod `p` as the API server holds it: a Deployment's pod with an application container and
    /// a log shipper, the service-account token volume, managed fields, five conditions.
    pub(crate) fn pod(&self, p: usize) -> Value {
        let s = p / PODS_PER_SERVICE;
        let svc = format!("svc-{s}");
        let ns = Self::namespace(s);
        let rs_hash = hex(s, 10);
        let name = format!("{svc}-{rs_hash}-{}", hex(p, 5));
        let node_i = p % self.nodes();
        let node = format!("node-{node_i}");
        let host_ip = std::net::Ipv4Addr::from(0xac10_0000u32 + node_i as u32).to_string();
        let ip = Self::pod_ip(p);
        let ready = if p % 50 == 7 { "False" } else { "True" };
        let t = "2026-11-30T08:14:22Z";
        let mut annotations = Self::mesh_annotations(s);
        let extra = json!({
            "kubectl.kubernetes.io/restartedAt": "2026-11-30T08:13:57Z",
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "9102",
        });
        if let (Some(a), Some(e)) = (annotations.as_object_mut(), extra.as_object()) {
            a.extend(e.clone());
        }
        let env = json!([
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
            {"name": "LOG_LEVEL", "value": "info"},
            {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel-collector.observability:4317"},
            {"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": format!("{svc}-db"), "key": "url"}}},
        ]);
        let probe = |path: &str| {
            json!({"httpGet": {"path": path, "port": 8080, "scheme": "HTTP"}, "initialDelaySeconds": 5,
                   "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3})
        };
        let status = |c: &str, started: bool| {
            json!({"name": c, "image": format!("registry.example.com/{ns}/{c}:1.{}.3", s % 17),
                   "imageID": format!("registry.example.com/{ns}/{c}@sha256:{}", "3f2a9c".repeat(10) + "4e1d"),
                   "containerID": format!("containerd://{}", "9b1c7e2d".repeat(8)),
                   "ready": ready == "True", "restartCount": 0, "started": started,
                   "state": {"running": {"startedAt": t}}, "lastState": {}})
        };
        let condition = |ty: &str, st: &str| json!({"type": ty, "status": st, "lastProbeTime": null, "lastTransitionTime": t});
        let managed = json!([
            {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
             "time": t, "fieldsType": "FieldsV1", "fieldsV1": {
                "f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/restartedAt": {},
                    "f:prometheus.io/port": {}, "f:prometheus.io/scrape": {},
                    "f:endpoint.aether.io/port": {}, "f:endpoint.aether.io/protocol": {}},
                    "f:generateName": {}, "f:labels": {".": {}, "f:app": {},
                    "f:app.kubernetes.io/name": {}, "f:app.kubernetes.io/part-of": {},
                    "f:pod-template-hash": {}, "f:version": {}},
                    "f:ownerReferences": {".": {}, format!("k:{{\"uid\":\"{}\"}}", uid(2, s)): {}}},
                "f:spec": {"f:containers": {
                    "k:{\"name\":\"app\"}": {".": {}, "f:env": {".": {}, "k:{\"name\":\"POD_NAME\"}": {".": {}, "f:name": {}, "f:valueFrom": {".": {}, "f:fieldRef": {}}}},
                        "f:image": {}, "f:imagePullPolicy": {}, "f:livenessProbe": {".": {}, "f:httpGet": {".": {}, "f:path": {}, "f:port": {}, "f:scheme": {}}},
                        "f:name": {}, "f:ports": {".": {}, "k:{\"containerPort\":8080,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}, "f:name": {}, "f:protocol": {}}},
                        "f:readinessProbe": {".": {}, "f:httpGet": {".": {}, "f:path": {}, "f:port": {}, "f:scheme": {}}},
                        "f:resources": {".": {}, "f:limits": {".": {}, "f:cpu": {}, "f:memory": {}}, "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}}},
                        "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}, "f:volumeMounts": {}},
                    "k:{\"name\":\"log-shipper\"}": {".": {}, "f:image": {}, "f:name": {}, "f:resources": {}, "f:volumeMounts": {}}},
                    "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {}, "f:schedulerName": {},
                    "f:securityContext": {}, "f:serviceAccount": {}, "f:serviceAccountName": {},
                    "f:terminationGracePeriodSeconds": {}, "f:volumes": {".": {}, "k:{\"name\":\"config\"}": {".": {}, "f:configMap": {}, "f:name": {}}}}}},
            {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": t,
             "fieldsType": "FieldsV1", "subresource": "status", "fieldsV1": {"f:status": {
                "f:conditions": {"k:{\"type\":\"ContainersReady\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
                    "k:{\"type\":\"Initialized\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
                    "k:{\"type\":\"PodReadyToStartContainers\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
                    "k:{\"type\":\"Ready\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}}},
                "f:containerStatuses": {}, "f:hostIP": {}, "f:hostIPs": {}, "f:phase": {}, "f:podIP": {},
                "f:podIPs": {".": {}, format!("k:{{\"ip\":\"{ip}\"}}"): {".": {}, "f:ip": {}}}, "f:startTime": {}}}}
        ]);
        let spec = json!({
        "volumes": [
            {"name": "config", "configMap": {"name": format!("{svc}-config"), "defaultMode": 420}},
            {"name": "logs", "emptyDir": {}},
            {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}
        ],
        "containers": [
            {"name": "app", "image": format!("registry.example.com/{ns}/app:1.{}.3", s % 17),
             "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                       {"name": "metrics", "containerPort": 9102, "protocol": "TCP"}],
             "env": env,
             "resources": {"limits": {"cpu": "1", "memory": "512Mi"}, "requests": {"cpu": "100m", "memory": "256Mi"}},
             "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}, {"name": "logs", "mountPath": "/var/log/app"},
                              {"name": "kube-api-access-x7k2p", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
             "livenessProbe": probe("/healthz"), "readinessProbe": probe("/ready"),
             "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
             "imagePullPolicy": "IfNotPresent"},
            {"name": "log-shipper", "image": "registry.example.com/platform/log-shipper:3.2.1",
             "args": ["--input=/var/log/app/*.log", "--output=otlp"],
             "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "10m", "memory": "32Mi"}},
             "volumeMounts": [{"name": "logs", "mountPath": "/var/log/app", "readOnly": true},
                              {"name": "kube-api-access-x7k2p", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
             "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
             "imagePullPolicy": "IfNotPresent"}
        ],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "serviceAccountName": svc, "serviceAccount": svc, "nodeName": node,
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "schedulerName": "default-scheduler",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        ],
        "priority": 0, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority"
        });
        let status = json!({
        "phase": "Running",
        "conditions": [condition("PodReadyToStartContainers", "True"), condition("Initialized", "True"),
                       condition("Ready", ready), condition("ContainersReady", ready),
                       condition("PodScheduled", "True")],
        "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "podIP": ip, "podIPs": [{"ip": ip}],
        "startTime": t,
        "containerStatuses": [status("app", true), status("log-shipper", true)],
        "qosClass": "Burstable"
        });
        json!({
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {
                "name": name, "generateName": format!("{svc}-{rs_hash}-"), "namespace": ns,
                "uid": uid(1, p), "resourceVersion": (1_000_000 + p).to_string(),
                "creationTimestamp": t,
                "labels": {"app": svc, "app.kubernetes.io/name": svc, "app.kubernetes.io/part-of": ns,
                           "pod-template-hash": rs_hash, "version": "v1"},
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": format!("{svc}-{rs_hash}"), "uid": uid(2, s), "controller": true,
                    "blockOwnerDeletion": true}],
                "managedFields": managed,
            },
            "spec": spec,
            "status": status
        })
    }

    /// The user Service of service `s` (a Deployment's Service, same name, selecting its pods).
    fn user_service_object(s: usize) -> Value {
        let svc = format!("svc-{s}");
        let ip = std::net::Ipv4Addr::from(0x0a64_0000u32 + s as u32).to_string();
        let port = if s % 4 == 3 {
            json!({"name": "tcp", "protocol": "TCP", "port": 9000, "targetPort": 9000})
        } else {
            json!({"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080})
        };
        json!({
            "kind": "Service", "apiVersion": "v1",
            "metadata": {"name": svc, "namespace": Self::namespace(s), "uid": uid(3, s),
                         "resourceVersion": (500_000 + s).to_string(), "creationTimestamp": "2026-11-30T08:00:00Z",
                         "labels": {"app": svc}},
            "spec": {"ports": [port], "selector": {"app": svc}, "clusterIP": ip, "clusterIPs": [ip],
                     "type": "ClusterIP", "sessionAffinity": "None", "ipFamilies": ["IPv4"],
                     "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster"},
            "status": {"loadBalancer": {}}
        })
    }

    /// The EndpointSlice the controller writes for service `s`'s user Service.
    fn endpoint_slice(&self, s: usize) -> Value {
        let svc = format!("svc-{s}");
        let ns = Self::namespace(s);
        let endpoints: Vec<Value> = (s * PODS_PER_SERVICE..((s + 1) * PODS_PER_SERVICE).min(self.pods))
            .map(|p| {
                let ready = p % 50 != 7;
                json!({"addresses": [Self::pod_ip(p)],
                       "conditions": {"ready": ready, "serving": ready, "terminating": false},
                       "nodeName": format!("node-{}", p % self.nodes()),
                       "targetRef": {"kind": "Pod", "namespace": ns,
                                     "name": format!("{svc}-{}-{}", hex(s, 10), hex(p, 5)), "uid": uid(1, p)}})
            })
            .collect();
        let port = if s % 4 == 3 {
            json!({"name": "tcp", "port": 9000, "protocol": "TCP"})
        } else {
            json!({"name": "http", "port": 8080, "protocol": "TCP"})
        };
        json!({
            "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"name": format!("{svc}-{}", hex(s + 7, 5)), "generateName": format!("{svc}-"),
                         "namespace": ns, "uid": uid(4, s), "resourceVersion": (600_000 + s).to_string(),
                         "labels": {"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                                    "kubernetes.io/service-name": svc, "app": svc},
                         "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-30T08:14:22Z"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": svc, "uid": uid(3, s),
                                              "controller": true, "blockOwnerDeletion": true}]},
            "addressType": "IPv4", "endpoints": endpoints, "ports": [port]
        })
    }

    /// The HTTPRoute of service `s`: two rules on its user Service's port 80.
    fn http_route(s: usize) -> Value {
        let svc = format!("svc-{s}");
        let backend =
            json!([{"group": "", "kind": "Service", "name": svc, "port": 80, "weight": 1}]);
        json!({
            "kind": "HTTPRoute", "apiVersion": "gateway.networking.k8s.io/v1",
            "metadata": {"name": format!("{svc}-route"), "namespace": Self::namespace(s), "generation": 1,
                         "uid": uid(5, s), "resourceVersion": (700_000 + s).to_string()},
            "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": svc, "port": 80}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}], "backendRefs": backend},
                               {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": backend}]}
        })
    }

    fn namespace_object(name: &str, i: usize) -> Value {
        json!({"kind": "Namespace", "apiVersion": "v1",
               "metadata": {"name": name, "uid": uid(6, i), "resourceVersion": (800_000 + i).to_string(),
                            "labels": {"kubernetes.io/metadata.name": name}},
               "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
    }

    /// The Services the cluster holds: the user Services, then the generated ones the registrar
    /// writes for every other mesh service (from the pods as every node reads them).
    fn services(&self) -> Vec<Value> {
        let user: Vec<Value> = (0..self.mesh_services())
            .filter(|&s| Self::user_service(s))
            .map(Self::user_service_object)
            .collect();
        let mut objects = Objects::default();
        for p in 0..self.pods {
            let pod: MeshPod =
                serde_json::from_value(self.pod(p)).expect("a generated pod deserializes");
            objects.pods.push(Arc::new(pod));
        }
        for u in &user {
            let service: Service =
                serde_json::from_value(u.clone()).expect("a generated Service deserializes");
            objects.services.push(Arc::new(service));
        }
        let (mut s, problems) = snapshot(&objects);
        assert!(problems.is_empty(), "{problems:?}");
        let (generated, _) = registrar::generated_services_except(&s, &BTreeSet::new());
        let user_snapshot: Vec<_> = s.services.drain(..).collect();
        let mut all: Vec<_> = user_snapshot.into_iter().chain(generated).collect();
        registrar::allocate_cluster_ips(&mut all, "10.96.0.0/16".parse().expect("a CIDR"));
        let mut out = user;
        for g in all.iter().filter(|g| g.generated) {
            let mut object = service_object(g);
            if let Some(spec) = object.spec.as_mut() {
                spec.cluster_ip = g.cluster_ips.first().map(ToString::to_string);
                spec.cluster_ips = Some(g.cluster_ips.iter().map(ToString::to_string).collect());
            }
            object.metadata.resource_version = Some("900000".into());
            out.push(serde_json::to_value(object).expect("a Service serializes"));
        }
        out
    }

    /// Every kind the source watches, as the API server's collections: pods alone, or the whole
    /// cluster.
    pub(crate) fn collections(&self, whole: bool) -> Vec<Collection> {
        let pods = {
            let c = *self;
            Collection {
                path: "/api/v1/pods",
                len: self.pods,
                item: Arc::new(move |i| c.pod(i)),
            }
        };
        if !whole {
            return vec![pods];
        }
        let fixed = |path, items: Vec<Value>| {
            let items = Arc::new(items);
            Collection {
                path,
                len: items.len(),
                item: Arc::new(move |i| items[i].clone()),
            }
        };
        let user: Vec<usize> = (0..self.mesh_services())
            .filter(|&s| Self::user_service(s))
            .collect();
        let mut namespaces: Vec<Value> = (0..self.namespaces())
            .map(|i| Self::namespace_object(&format!("team-{i}"), i))
            .collect();
        namespaces.push(Self::namespace_object("kube-system", 1_000_000));
        namespaces.push(Self::namespace_object("default", 1_000_001));
        vec![
            pods,
            fixed("/api/v1/services", self.services()),
            fixed(
                "/apis/discovery.k8s.io/v1/endpointslices",
                user.iter().map(|&s| self.endpoint_slice(s)).collect(),
            ),
            fixed("/api/v1/namespaces", namespaces),
            fixed(
                "/apis/gateway.networking.k8s.io/v1/httproutes",
                (0..self.mesh_services())
                    .filter(|&s| Self::routed(s))
                    .map(Self::http_route)
                    .collect(),
            ),
        ]
    }

    /// How many of each kind the whole cluster has, for the report.
    pub(crate) fn describe(&self) -> String {
        let user = (0..self.mesh_services())
            .filter(|&s| Self::user_service(s))
            .count();
        let routed = (0..self.mesh_services())
            .filter(|&s| Self::routed(s))
            .count();
        format!(
            "{} pods, {} mesh services in {} namespaces on {} nodes; {} user Services with an \
             EndpointSlice each, {} HTTPRoutes, {} generated Services",
            self.pods,
            self.mesh_services(),
            self.namespaces(),
            self.nodes(),
            user,
            routed,
            self.mesh_services() - user
        )
    }
}

/// One collection the scripted server lists: item `i` is built when a page asks for it.
#[derive(Clone)]
pub(crate) struct Collection {
    pub(crate) path: &'static str,
    pub(crate) len: usize,
    pub(crate) item: Arc<dyn Fn(usize) -> Value + Send + Sync>,
}

/// A scripted API server: lists each collection in pages (`limit`, `continue`), answers every
/// other watched kind with an empty list, and holds every watch open with nothing to say until
/// [`Server::event`] gives it a line: the watch then answers with that event and ends, as a
/// server's watch may, and the watcher opens the next one.
pub(crate) struct Server {
    task: JoinHandle<()>,
    /// Time spent building and serializing list pages (the server's work, not the client's).
    generating_ns: Arc<AtomicU64>,
    /// Bytes of list bodies sent.
    pub(crate) sent: Arc<AtomicU64>,
    events: tokio::sync::mpsc::UnboundedSender<(&'static str, Vec<u8>)>,
}

impl Server {
    /// Start the server; returns it and a client that talks to it.
    pub(crate) fn start(collections: Vec<Collection>) -> (Self, kube::Client) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let generating_ns = Arc::new(AtomicU64::new(0));
        let sent = Arc::new(AtomicU64::new(0));
        let (gen_ns, sent_bytes) = (generating_ns.clone(), sent.clone());
        let (events, mut to_send) =
            tokio::sync::mpsc::unbounded_channel::<(&'static str, Vec<u8>)>();
        let answer = |body: Vec<u8>| {
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(Body::from(body))
                .expect("a response")
        };
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            let mut waiting: Vec<(&'static str, Vec<u8>)> = Vec::new();
            loop {
                tokio::select! {
                    next = handle.next_request() => {
                        let Some((req, send)) = next else { break };
                        let query = req.uri().query().unwrap_or("").to_owned();
                        let path = req.uri().path().to_owned();
                        if query.contains("watch=true") {
                            match waiting.iter().position(|(p, _)| *p == path) {
                                Some(i) => send.send_response(answer(waiting.remove(i).1)),
                                None => held.push((path, send)),
                            }
                            continue;
                        }
                        let t0 = now();
                        let body = list_page(&collections, &path, &query);
                        gen_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        sent_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                        send.send_response(answer(body));
                    }
                    Some((path, line)) = to_send.recv() => {
                        match held.iter().position(|(p, _)| *p == path) {
                            Some(i) => held.remove(i).1.send_response(answer(line)),
                            None => waiting.push((path, line)),
                        }
                    }
                }
            }
        });
        let client = kube::Client::new(service, "default");
        (
            Self {
                task,
                generating_ns,
                sent,
                events,
            },
            client,
        )
    }

    /// Seconds the server spent building pages.
    pub(crate) fn generating_secs(&self) -> f64 {
        self.generating_ns.load(Ordering::Relaxed) as f64 / 1e9
    }

    /// Sends `event` (a watch event's JSON) on the watch of the collection at `path`.
    pub(crate) fn event(&self, path: &'static str, event: &Value) {
        let mut line = serde_json::to_vec(event).expect("an event serializes");
        line.push(b'\n');
        let _ = self.events.send((path, line));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn query_value<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// One page of a list, as the API server's JSON body.
fn list_page(collections: &[Collection], path: &str, query: &str) -> Vec<u8> {
    let (items, next) = match collections.iter().find(|c| c.path == path) {
        Some(c) => {
            let from: usize = query_value(query, "continue")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let limit: usize = query_value(query, "limit")
                .and_then(|v| v.parse().ok())
                .unwrap_or(usize::MAX);
            let to = from.saturating_add(limit).min(c.len);
            let items: Vec<Value> = (from..to).map(|i| (c.item)(i)).collect();
            (items, (to < c.len).then(|| to.to_string()))
        }
        None => (Vec::new(), None),
    };
    let mut metadata = json!({"resourceVersion": "2000000"});
    if let Some(next) = next {
        metadata["continue"] = next.into();
    }
    serde_json::to_vec(
        &json!({"apiVersion": "v1", "kind": "List", "metadata": metadata, "items": items}),
    )
    .expect("a list serializes")
}
