//! EndpointSlices computed the way Kubernetes computes them, for the file registry.
//!
//! Pure: no IO, no clock. A directory of manifests has no controller manager, so the slices of a
//! Service with a selector are derived here from the Pods the directory holds, with the same
//! rules Kubernetes' EndpointSlice controller follows:
//! - a Service with no selector (or an empty one), or of type `ExternalName`, gets no slice;
//! - the endpoints are the Pods of the Service's namespace whose labels match the selector, that
//!   have an IP and are not terminating;
//! - a numeric `targetPort` is that number, an absent one is `port`, and a named one is looked up
//!   per pod among its containers' ports (name and protocol); pods that resolve the ports
//!   differently land in different slices, and a port a pod cannot resolve is left out for it;
//! - one slice per address family.
//!
//! Slices are named `<service>-file`, then `<service>-file-2`, `-3`, ... in a deterministic order.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::ObjectReference as K8sObjectReference;
use k8s_openapi::api::core::v1::Pod as K8sPod;
use k8s_openapi::api::core::v1::Service as K8sService;
use k8s_openapi::api::core::v1::ServicePort as K8sServicePort;
use k8s_openapi::api::discovery::v1::Endpoint as K8sEndpoint;
use k8s_openapi::api::discovery::v1::EndpointConditions as K8sEndpointConditions;
use k8s_openapi::api::discovery::v1::EndpointPort as K8sEndpointPort;
use k8s_openapi::api::discovery::v1::EndpointSlice as K8sEndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta as K8sObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString as K8sIntOrString;

use crate::registry::kube::convert::LABEL_SERVICE_NAME;

/// The `endpointslice.kubernetes.io/managed-by` value of computed slices.
pub const MANAGED_BY: &str = "file-registry.aether.io";

/// One resolved slice port: (name, number, protocol, appProtocol). Ordered, so it can key a map.
type ResolvedPort = (Option<String>, i32, String, Option<String>);

/// A selected pod: its name, the object and its IPs.
type Member<'a> = (&'a str, &'a K8sPod, Vec<IpAddr>);

fn namespace_of(meta: &K8sObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or("default")
}

fn pod_ips(pod: &K8sPod) -> Vec<IpAddr> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    match status.pod_ips.as_ref().filter(|v| !v.is_empty()) {
        Some(list) => list.iter().filter_map(|ip| ip.ip.parse().ok()).collect(),
        None => status
            .pod_ip
            .iter()
            .filter_map(|ip| ip.parse().ok())
            .collect(),
    }
}

/// Readiness as the file registry reads it: the `Ready` condition, or Ready when none is given.
fn pod_ready(pod: &K8sPod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_none_or(|c| c.status == "True")
}

fn selects(selector: &BTreeMap<String, String>, pod: &K8sPod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// The pod port a ServicePort reaches on one pod, or `None` when a named port is not found.
fn resolve_port(service_port: &K8sServicePort, pod: &K8sPod) -> Option<ResolvedPort> {
    let protocol = service_port
        .protocol
        .clone()
        .unwrap_or_else(|| "TCP".to_owned());
    let number = match &service_port.target_port {
        None => service_port.port,
        Some(K8sIntOrString::Int(n)) => *n,
        Some(K8sIntOrString::String(name)) => {
            pod.spec
                .as_ref()?
                .containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| {
                    p.name.as_deref() == Some(name.as_str())
                        && p.protocol.as_deref().unwrap_or("TCP") == protocol
                })?
                .container_port
        }
    };
    Some((
        service_port.name.clone(),
        number,
        protocol,
        service_port.app_protocol.clone(),
    ))
}

fn family(ip: &IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// Computes the EndpointSlices of every Service with a selector (see the module doc).
///
/// `services` and `pods` are the objects as the manifests give them; a missing namespace means
/// `default`. The result is deterministic: services in the order given, groups by their ports,
/// endpoints by pod name.
pub fn endpoint_slices_for(services: &[&K8sService], pods: &[&K8sPod]) -> Vec<K8sEndpointSlice> {
    let mut out = Vec::new();
    for service in services {
        let (Some(spec), Some(name)) = (service.spec.as_ref(), service.metadata.name.as_deref())
        else {
            continue;
        };
        if spec.type_.as_deref() == Some("ExternalName") {
            continue;
        }
        let Some(selector) = spec.selector.as_ref().filter(|s| !s.is_empty()) else {
            continue;
        };
        let namespace = namespace_of(&service.metadata);
        let mut selected: Vec<Member<'_>> = pods
            .iter()
            .copied()
            .filter(|p| namespace_of(&p.metadata) == namespace)
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| selects(selector, p))
            .filter_map(|p| {
                let ips = pod_ips(p);
                let name = p.metadata.name.as_deref()?;
                (!ips.is_empty()).then_some((name, p, ips))
            })
            .collect();
        selected.sort_by(|a, b| a.0.cmp(b.0));

        let service_ports = spec.ports.as_deref().unwrap_or_default();
        let mut groups: BTreeMap<Vec<ResolvedPort>, Vec<Member<'_>>> = BTreeMap::new();
        for entry in selected {
            let ports = service_ports
                .iter()
                .filter_map(|sp| resolve_port(sp, entry.1))
                .collect();
            groups.entry(ports).or_default().push(entry);
        }
        let families: Vec<String> = match spec.ip_families.as_ref().filter(|f| !f.is_empty()) {
            Some(f) => f.clone(),
            None => vec!["IPv4".to_owned(), "IPv6".to_owned()],
        };

        let mut slices = Vec::new();
        for (ports, members) in &groups {
            for fam in &families {
                let endpoints: Vec<K8sEndpoint> = members
                    .iter()
                    .filter_map(|(pod_name, pod, ips)| {
                        let ip = ips.iter().find(|ip| family(ip) == fam)?;
                        let ready = pod_ready(pod);
                        Some(K8sEndpoint {
                            addresses: vec![ip.to_string()],
                            conditions: Some(K8sEndpointConditions {
                                ready: Some(ready),
                                serving: Some(ready),
                                terminating: Some(false),
                            }),
                            node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                            target_ref: Some(K8sObjectReference {
                                kind: Some("Pod".to_owned()),
                                name: Some((*pod_name).to_owned()),
                                namespace: Some(namespace.to_owned()),
                                ..K8sObjectReference::default()
                            }),
                            ..K8sEndpoint::default()
                        })
                    })
                    .collect();
                if !endpoints.is_empty() {
                    slices.push((fam.clone(), ports, endpoints));
                }
            }
        }
        if slices.is_empty() {
            // Kubernetes keeps one empty slice for a selector that picks nothing; it names no
            // port, so a named targetPort stays unresolved (spec/model.md §9.2).
            let fam = families
                .first()
                .cloned()
                .unwrap_or_else(|| "IPv4".to_owned());
            out.push(slice(namespace, name, 0, fam, &[], Vec::new()));
            continue;
        }
        for (i, (fam, ports, endpoints)) in slices.into_iter().enumerate() {
            out.push(slice(namespace, name, i, fam, ports, endpoints));
        }
    }
    out
}

fn slice(
    namespace: &str,
    service: &str,
    index: usize,
    address_type: String,
    ports: &[ResolvedPort],
    endpoints: Vec<K8sEndpoint>,
) -> K8sEndpointSlice {
    let name = match index {
        0 => format!("{service}-file"),
        i => format!("{service}-file-{}", i + 1),
    };
    let labels = BTreeMap::from([
        (LABEL_SERVICE_NAME.to_owned(), service.to_owned()),
        (
            "endpointslice.kubernetes.io/managed-by".to_owned(),
            MANAGED_BY.to_owned(),
        ),
    ]);
    K8sEndpointSlice {
        address_type,
        endpoints,
        metadata: K8sObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            ..K8sObjectMeta::default()
        },
        ports: Some(
            ports
                .iter()
                .map(|(name, port, protocol, app)| K8sEndpointPort {
                    name: name.clone(),
                    port: Some(*port),
                    protocol: Some(protocol.clone()),
                    app_protocol: app.clone(),
                })
                .collect(),
        ),
    }
}
