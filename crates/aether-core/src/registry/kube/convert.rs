//! Pure conversions from Kubernetes objects to [`crate::model::snapshot`] values.
//!
//! Layer 0 in spirit (STYLE.md §6.2): no IO, no async, no clock, no globals. The inputs are the
//! wire types of `k8s-openapi`, `gateway-api` and our own [`super::mesh_filter`]; the outputs are
//! plain snapshot data. Every backend that reads Kubernetes shapes (the watchers, the file
//! registry) converts through these functions, so one manifest means one thing everywhere.
//!
//! Invariants:
//! - A conversion either returns the whole value or a [`ConvertError`] naming the object, the
//!   field path and what was wrong. Nothing is guessed and nothing panics.
//! - A pod's declared ports are parsed by [`crate::model::rows::parse_declared_ports`] only; an
//!   unparseable pod becomes a [`RefusedPod`] (`annotation-unparseable`), never an error.
//! - Reserved ports are not refused here: the compiler ignores them (spec/model.md §5).

use crate::prelude::*;

mod filter;
pub mod keyed;
mod routes;

use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Namespace as K8sNamespace;
use k8s_openapi::api::core::v1::Service as K8sService;
use k8s_openapi::api::core::v1::ServicePort as K8sServicePort;
use k8s_openapi::api::discovery::v1::EndpointSlice as K8sEndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta as K8sObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString as K8sIntOrString;

use super::pod::MeshPod;
use crate::model::port::Transport;
use crate::model::rows::{
    ANNOTATION_EXCLUDE_PORTS, ANNOTATION_EXCLUDE_RANGES, ANNOTATION_INBOUND_MODE,
    ANNOTATION_MANAGED, ANNOTATION_NETNS, ANNOTATION_NETNS_FROM, ANNOTATION_REDIRECT_ALL,
    LABEL_MESH_SERVICE, parse_declared_ports_with,
};
use crate::model::snapshot::{
    EndpointSlice, Pod, RefusedPod, Row, Service, ServicePort, SliceEndpoint, SlicePort, TargetPort,
};

pub use filter::{
    DEFAULT_EXT_AUTHZ_TIMEOUT_MS, convert_mesh_filter, undecodable_mesh_filter,
    unreadable_mesh_filter,
};
pub use routes::{
    GATEWAY_GROUP, convert_grpc_route, convert_http_route, convert_reference_grant,
    convert_tcp_route, convert_tls_route, convert_udp_route, unreadable_grpc_route,
    unreadable_http_route, unreadable_tcp_route, unreadable_tls_route, unreadable_udp_route,
};

/// The label that ties an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// The ServiceAccount a pod runs as when `spec.serviceAccountName` is absent.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// The object a [`ConvertError`] is about: its kind, namespace (if namespaced) and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectKey {
    /// The object's kind (`Pod`, `HTTPRoute`, ...).
    pub kind: &'static str,
    /// Its namespace; `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// Its name (empty when the object has none, which is itself the error).
    pub name: String,
}

impl ObjectKey {
    fn of(kind: &'static str, meta: &K8sObjectMeta) -> Self {
        Self {
            kind,
            namespace: meta.namespace.clone(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }

    fn boxed(&self) -> Box<Self> {
        Box::new(self.clone())
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// Why a Kubernetes object cannot be converted. Each variant names the object and the field
/// path (`spec.rules[0].backendRefs[1].port`) and says what was wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// A field the conversion needs is absent.
    #[error("{object}: {field} is missing")]
    MissingField {
        /// The object.
        object: Box<ObjectKey>,
        /// The field path.
        field: String,
    },
    /// A text field that must hold an IP address does not.
    #[error("{object}: {field}: {value:?} is not an ip address")]
    InvalidIp {
        /// The object.
        object: Box<ObjectKey>,
        /// The field path.
        field: String,
        /// The value as written.
        value: String,
    },
    /// A port field is not a number in 1–65535.
    #[error("{object}: {field}: {value} is not a port number in 1-65535")]
    InvalidPort {
        /// The object.
        object: Box<ObjectKey>,
        /// The field path.
        field: String,
        /// The value as written.
        value: i64,
    },
    /// A number is outside the range the API allows.
    #[error("{object}: {field}: {value} is outside {min}-{max}")]
    OutOfRange {
        /// The object.
        object: Box<ObjectKey>,
        /// The field path.
        field: String,
        /// The value as written.
        value: i64,
        /// The smallest allowed value.
        min: i64,
        /// The largest allowed value.
        max: i64,
    },
    /// A duration is not a Gateway API duration (`10s`, `500ms`, `1h2m`).
    #[error(
        "{object}: {field}: {value:?} is not a gateway api duration such as 10s, 500ms or 1h2m"
    )]
    InvalidDuration {
        /// The object.
        object: Box<ObjectKey>,
        /// The field path.
        field: String,
        /// The value as written.
        value: String,
    },
    /// A value is not one the field accepts.
    #[error("{object}: {field}: {value:?} is not {expected}")]
    InvalidValue {
        /// The object.
        object: Box<ObjectKey>,
        /// The field path (an annotation is written `metadata.annotations[<name>]`).
        field: String,
        /// The value as written.
        value: String,
        /// What the field accepts.
        expected: &'static str,
    },
    /// A `MeshFilter` gives no filter configuration, or more than one.
    #[error(
        "{object}: spec must give exactly one of headerMutation, rbac and extAuthz, not {count}"
    )]
    FilterConfigCount {
        /// The object.
        object: Box<ObjectKey>,
        /// How many configurations it gives.
        count: usize,
    },
}

/// What a pod contributes to a [`crate::model::Snapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodConversion {
    /// The pod itself (always present).
    pub pod: Pod,
    /// Its registry row, or why it was refused; `None` when the pod is not listed at all
    /// (unmanaged, no IP yet, terminating).
    pub registration: Option<Registration>,
}

/// A listed pod's registry outcome (spec/model.md §3.3, §3.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registration {
    /// The pod's row.
    Row(Row),
    /// The pod's annotations cannot be parsed: `annotation-unparseable`.
    Refused(RefusedPod),
}

/// What a pod's readiness is when its status has no `Ready` condition (spec/model.md §3.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MissingReadyCondition {
    /// The pod is Ready (the file registry: a manifest may omit status).
    Ready,
    /// The pod is not Ready (the Kubernetes backend: the kubelet has not reported yet).
    NotReady,
}

fn namespaced_key(kind: &'static str, meta: &K8sObjectMeta) -> Result<ObjectKey, ConvertError> {
    namespaced(ObjectKey::of(kind, meta))
}

/// `key`, unless its name or namespace is missing.
fn namespaced(key: ObjectKey) -> Result<ObjectKey, ConvertError> {
    if key.name.is_empty() {
        return Err(ConvertError::MissingField {
            object: key.boxed(),
            field: "metadata.name".into(),
        });
    }
    if key.namespace.as_deref().is_none_or(str::is_empty) {
        return Err(ConvertError::MissingField {
            object: Box::new(key),
            field: "metadata.namespace".into(),
        });
    }
    Ok(key)
}

/// The namespace of a key made by [`namespaced_key`].
fn ns(key: &ObjectKey) -> String {
    key.namespace.clone().unwrap_or_default()
}

/// The name of the field a value came from, for the error that refuses it: spelled only then.
/// A reload converts every object, and formatting `spec.ports[0].port` for each value that
/// converts was 13 % of a reload's conversion (callgrind, docs/performance.md).
trait FieldName {
    fn spell(self) -> String;
}

impl FieldName for &'static str {
    fn spell(self) -> String {
        self.to_owned()
    }
}

impl<F: FnOnce() -> String> FieldName for F {
    fn spell(self) -> String {
        self()
    }
}

fn port_u16(object: &ObjectKey, field: impl FieldName, value: i64) -> Result<u16, ConvertError> {
    match u16::try_from(value) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(ConvertError::InvalidPort {
            object: object.boxed(),
            field: field.spell(),
            value,
        }),
    }
}

fn parse_ip(
    object: &ObjectKey,
    field: impl FieldName,
    value: &str,
) -> Result<IpAddr, ConvertError> {
    value.parse().map_err(|_| ConvertError::InvalidIp {
        object: object.boxed(),
        field: field.spell(),
        value: value.to_owned(),
    })
}

fn annotation_field(name: &str) -> String {
    format!("metadata.annotations[{name}]")
}

fn parse_transport(
    object: &ObjectKey,
    field: impl FieldName,
    value: Option<&str>,
) -> Result<Transport, ConvertError> {
    match value {
        None | Some("TCP") => Ok(Transport::Tcp),
        Some("UDP") => Ok(Transport::Udp),
        Some("SCTP") => Ok(Transport::Sctp),
        Some(other) => Err(ConvertError::InvalidValue {
            object: object.boxed(),
            field: field.spell(),
            value: other.to_owned(),
            expected: "one of TCP, UDP, SCTP",
        }),
    }
}

/// Parses a Gateway API duration (GEP-2257: `^([0-9]{1,5}(h|m|s|ms)){1,4}$`) into milliseconds.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    let (mut i, mut parts, mut total) = (0usize, 0usize, 0u64);
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        let digits = i - start;
        if digits == 0 || digits > 5 {
            return None;
        }
        let n: u64 = text.get(start..i)?.parse().ok()?;
        let unit_ms = match (bytes.get(i), bytes.get(i + 1)) {
            (Some(b'm'), Some(b's')) => {
                i += 2;
                1
            }
            (Some(b'h'), _) => {
                i += 1;
                3_600_000
            }
            (Some(b'm'), _) => {
                i += 1;
                60_000
            }
            (Some(b's'), _) => {
                i += 1;
                1_000
            }
            _ => return None,
        };
        parts += 1;
        if parts > 4 {
            return None;
        }
        total = total.checked_add(n.checked_mul(unit_ms)?)?;
    }
    (parts > 0).then_some(total)
}

fn duration_ms(
    object: &ObjectKey,
    field: impl Into<String>,
    value: &str,
) -> Result<u64, ConvertError> {
    parse_duration_ms(value).ok_or_else(|| ConvertError::InvalidDuration {
        object: object.boxed(),
        field: field.into(),
        value: value.to_owned(),
    })
}

fn parse_redirect_all(object: &ObjectKey, value: &str) -> Result<bool, ConvertError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(ConvertError::InvalidValue {
            object: object.boxed(),
            field: annotation_field(ANNOTATION_REDIRECT_ALL),
            value: other.to_owned(),
            expected: "\"true\" or \"false\"",
        }),
    }
}

/// Splits a comma-separated annotation; an empty (or blank) value lists nothing.
fn split_list(value: &str) -> impl Iterator<Item = &str> {
    let blank = value.trim().is_empty();
    value.split(',').map(str::trim).filter(move |_| !blank)
}

fn parse_exclude_ports(object: &ObjectKey, value: &str) -> Result<Vec<u16>, ConvertError> {
    split_list(value)
        .map(|entry| {
            let ok = !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit());
            match entry.parse::<u16>() {
                Ok(p) if ok && p != 0 => Ok(p),
                _ => Err(ConvertError::InvalidValue {
                    object: object.boxed(),
                    field: annotation_field(ANNOTATION_EXCLUDE_PORTS),
                    value: value.to_owned(),
                    expected: "a comma-separated list of port numbers in 1-65535",
                }),
            }
        })
        .collect()
}

fn parse_exclude_ranges(
    object: &ObjectKey,
    value: &str,
) -> Result<Vec<ipnet::IpNet>, ConvertError> {
    split_list(value)
        .map(|entry| {
            entry
                .parse::<ipnet::IpNet>()
                .map_err(|_| ConvertError::InvalidValue {
                    object: object.boxed(),
                    field: annotation_field(ANNOTATION_EXCLUDE_RANGES),
                    value: value.to_owned(),
                    expected: "a comma-separated list of cidrs such as 10.0.0.0/8 or fd00::/8",
                })
        })
        .collect()
}

/// Converts a pod into a [`Pod`] and, when it is listed, its [`Registration`].
///
/// A pod is listed when it is managed (`aether.io/managed` is not `"false"`, and the pod is not
/// on the host network), has an IP and is not terminating (spec/model.md §3.4). A listed pod's row uses the first of its IPs (the
/// primary, `status.podIP`), and carries the pod's name and node. Capture annotations are parsed
/// strictly: a bad value is an error for the whole pod.
pub fn convert_pod(
    pod: &MeshPod,
    missing_ready: MissingReadyCondition,
) -> Result<PodConversion, ConvertError> {
    let key = namespaced(ObjectKey {
        kind: "Pod",
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone().unwrap_or_default(),
    })?;
    let annotation = |k: &str| pod.annotation(k);
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();

    let mut ips = Vec::new();
    match status
        .and_then(|s| s.pod_ips.as_ref())
        .filter(|v| !v.is_empty())
    {
        Some(list) => {
            for (i, ip) in list.iter().enumerate() {
                ips.push(parse_ip(&key, || format!("status.podIPs[{i}].ip"), &ip.ip)?);
            }
        }
        None => {
            if let Some(ip) = status
                .and_then(|s| s.pod_ip.as_deref())
                .filter(|s| !s.is_empty())
            {
                ips.push(parse_ip(&key, "status.podIP", ip)?);
            }
        }
    }

    let ready = match status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
    {
        Some(c) => c.status == "True",
        None => missing_ready == MissingReadyCondition::Ready,
    };

    let managed = match annotation(ANNOTATION_MANAGED) {
        Some("false") => false,
        None | Some("true") => true,
        Some(other) => {
            return Err(ConvertError::InvalidValue {
                object: Box::new(key),
                field: annotation_field(ANNOTATION_MANAGED),
                value: other.to_owned(),
                expected: "\"true\" or \"false\"",
            });
        }
    };
    // A host-network pod shares the node's network namespace and address: the mesh cannot
    // capture it without capturing the node, and its "pod IP" is the node's, which several such
    // pods share. It is never managed (project decision, docs/decisions.md).
    let managed = managed && !spec.and_then(|s| s.host_network).unwrap_or(false);
    let inbound_mode = annotation(ANNOTATION_INBOUND_MODE).map(str::to_owned);
    let mut host_ips = Vec::new();
    match status
        .and_then(|s| s.host_ips.as_ref())
        .filter(|v| !v.is_empty())
    {
        Some(list) => {
            for (i, h) in list.iter().enumerate() {
                host_ips.push(parse_ip(&key, || format!("status.hostIPs[{i}].ip"), &h.ip)?);
            }
        }
        None => {
            if let Some(ip) = status
                .and_then(|s| s.host_ip.as_deref())
                .filter(|s| !s.is_empty())
            {
                host_ips.push(parse_ip(&key, "status.hostIP", ip)?);
            }
        }
    }
    let redirect_all = annotation(ANNOTATION_REDIRECT_ALL)
        .map(|v| parse_redirect_all(&key, v))
        .transpose()?;
    let exclude_outbound_ports = match annotation(ANNOTATION_EXCLUDE_PORTS) {
        Some(v) => parse_exclude_ports(&key, v)?,
        None => Vec::new(),
    };
    let exclude_outbound_ip_ranges = match annotation(ANNOTATION_EXCLUDE_RANGES) {
        Some(v) => parse_exclude_ranges(&key, v)?,
        None => Vec::new(),
    };
    let command = pod.command.clone();
    let service_account = spec
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| DEFAULT_SERVICE_ACCOUNT.to_owned());
    let node = spec
        .and_then(|s| s.node_name.clone())
        .filter(|s| !s.is_empty());
    let terminating = pod.metadata.deleting;

    let out = Pod {
        namespace: ns(&key),
        name: key.name.clone(),
        service_account,
        node,
        ips,
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        managed,
        redirect_all,
        exclude_outbound_ports,
        exclude_outbound_ip_ranges,
        ready,
        netns: annotation(ANNOTATION_NETNS).map(str::to_owned),
        netns_from_cni: annotation(ANNOTATION_NETNS_FROM).is_some_and(|v| v == "cni"),
        command,
        inbound_mode,
        host_ips,
    };

    let registration = match out.ips.first() {
        Some(&address) if managed && !terminating => {
            Some(match parse_declared_ports_with(annotation) {
                Ok(declared) => {
                    let mut row =
                        declared.to_row(&out.namespace, &out.service_account, address, ready);
                    row.pod = Some(out.name.clone());
                    row.node.clone_from(&out.node);
                    Registration::Row(row)
                }
                Err(e) => Registration::Refused(RefusedPod {
                    namespace: out.namespace.clone(),
                    name: out.name.clone(),
                    detail: e.to_string(),
                }),
            })
        }
        _ => None,
    };
    Ok(PodConversion {
        pod: out,
        registration,
    })
}

fn convert_service_port(
    key: &ObjectKey,
    i: usize,
    p: &K8sServicePort,
) -> Result<ServicePort, ConvertError> {
    let field = |f: &'static str| move || format!("spec.ports[{i}].{f}");
    let port = port_u16(key, field("port"), i64::from(p.port))?;
    let target = match &p.target_port {
        None => TargetPort::Same,
        Some(K8sIntOrString::Int(n)) => {
            TargetPort::Number(port_u16(key, field("targetPort"), i64::from(*n))?)
        }
        Some(K8sIntOrString::String(s)) if s.is_empty() => {
            return Err(ConvertError::InvalidValue {
                object: key.boxed(),
                field: field("targetPort")(),
                value: s.clone(),
                expected: "a port number or a port name",
            });
        }
        Some(K8sIntOrString::String(s)) => TargetPort::Name(s.clone()),
    };
    Ok(ServicePort {
        name: p.name.clone().filter(|n| !n.is_empty()),
        port,
        target,
        transport: parse_transport(key, field("protocol"), p.protocol.as_deref())?,
        app_protocol: p.app_protocol.clone(),
    })
}

/// Converts a Service: cluster IPs (`clusterIP: None` is headless), the generated label,
/// the selector and the ports.
pub fn convert_service(service: &K8sService) -> Result<Service, ConvertError> {
    let key = namespaced_key("Service", &service.metadata)?;
    let spec = service.spec.as_ref();
    let mut headless = false;
    let mut cluster_ips = Vec::new();
    // The field is `spec.clusterIPs[i]`, or `spec.clusterIP` (`None` for the index) when the
    // list is absent.
    let listed: Vec<(Option<usize>, &str)> = match spec
        .and_then(|s| s.cluster_ips.as_ref())
        .filter(|v| !v.is_empty())
    {
        Some(ips) => ips
            .iter()
            .enumerate()
            .map(|(i, ip)| (Some(i), ip.as_str()))
            .collect(),
        None => spec
            .and_then(|s| s.cluster_ip.as_deref())
            .map(|ip| vec![(None, ip)])
            .unwrap_or_default(),
    };
    for (i, ip) in listed {
        match ip {
            "None" => headless = true,
            "" => {}
            ip => cluster_ips.push(parse_ip(
                &key,
                || match i {
                    Some(i) => format!("spec.clusterIPs[{i}]"),
                    None => "spec.clusterIP".to_owned(),
                },
                ip,
            )?),
        }
    }
    let generated = service
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_MESH_SERVICE))
        .is_some_and(|v| v == "true");
    let ports = spec
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, p)| convert_service_port(&key, i, p))
        .collect::<Result<_, _>>()?;
    Ok(Service {
        namespace: ns(&key),
        name: key.name.clone(),
        cluster_ips,
        headless,
        generated,
        selector: spec.and_then(|s| s.selector.clone()),
        ports,
    })
}

/// Converts an EndpointSlice. Its Service comes from the `kubernetes.io/service-name` label.
pub fn convert_endpoint_slice(slice: &K8sEndpointSlice) -> Result<EndpointSlice, ConvertError> {
    let key = namespaced_key("EndpointSlice", &slice.metadata)?;
    let service = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SERVICE_NAME))
        .filter(|s| !s.is_empty())
        .cloned()
        .ok_or_else(|| ConvertError::MissingField {
            object: key.boxed(),
            field: format!("metadata.labels[{LABEL_SERVICE_NAME}]"),
        })?;
    if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        return Err(ConvertError::InvalidValue {
            object: Box::new(key),
            field: "addressType".into(),
            value: slice.address_type.clone(),
            expected: "IPv4 or IPv6",
        });
    }
    let mut ports = Vec::new();
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        ports.push(SlicePort {
            name: p.name.clone().filter(|n| !n.is_empty()),
            port: p
                .port
                .map(|n| port_u16(&key, || format!("ports[{i}].port"), i64::from(n)))
                .transpose()?,
            transport: parse_transport(
                &key,
                || format!("ports[{i}].protocol"),
                p.protocol.as_deref(),
            )?,
        });
    }
    let mut endpoints = Vec::new();
    for (i, e) in slice.endpoints.iter().enumerate() {
        let addresses = e
            .addresses
            .iter()
            .enumerate()
            .map(|(j, a)| parse_ip(&key, || format!("endpoints[{i}].addresses[{j}]"), a))
            .collect::<Result<_, _>>()?;
        let pod = e
            .target_ref
            .as_ref()
            .filter(|r| r.kind.as_deref() == Some("Pod"))
            .and_then(|r| r.name.clone());
        let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
        endpoints.push(SliceEndpoint {
            addresses,
            pod,
            ready,
        });
    }
    Ok(EndpointSlice {
        namespace: ns(&key),
        service,
        name: key.name.clone(),
        ports,
        endpoints,
    })
}

/// Converts a Namespace to its name.
pub fn convert_namespace(namespace: &K8sNamespace) -> Result<String, ConvertError> {
    match namespace.metadata.name.as_deref() {
        Some(name) if !name.is_empty() => Ok(name.to_owned()),
        _ => Err(ConvertError::MissingField {
            object: Box::new(ObjectKey::of("Namespace", &namespace.metadata)),
            field: "metadata.name".into(),
        }),
    }
}
