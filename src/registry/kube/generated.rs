//! A generated Service as the registrar writes it to the API server (pure).
//!
//! [`crate::model::registrar`] decides which generated Services the rows call for, as snapshot
//! values; [`service_object`] renders one as the Kubernetes object the registrar applies
//! (spec/model.md §8): ClusterIP, no selector, the mesh-service label and the label that says
//! aether owns it. The ClusterIP is left to the API server. [`super::convert::convert_service`]
//! of the rendered object gives back the same ports and the generated flag.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service as K8sService, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::model::port::Transport;
use crate::model::rows::LABEL_MESH_SERVICE;
use crate::model::snapshot::{Service, TargetPort};

/// The label on everything aether writes (`app.kubernetes.io/managed-by`).
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// Its value.
pub const MANAGED_BY: &str = "aether";

/// The field manager of the registrar's server-side applies.
pub const FIELD_MANAGER: &str = "aether-registrar";

/// Render a generated Service (its namespace, name and ports) as the object the registrar
/// applies. Labels: `aether.io/mesh-service: "true"` and `app.kubernetes.io/managed-by: aether`.
pub fn service_object(service: &Service) -> K8sService {
    let labels = BTreeMap::from([
        (LABEL_MESH_SERVICE.to_owned(), "true".to_owned()),
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
    ]);
    let ports = service
        .ports
        .iter()
        .map(|p| ServicePort {
            name: p.name.clone(),
            port: i32::from(p.port),
            target_port: match &p.target {
                TargetPort::Same => Some(IntOrString::Int(i32::from(p.port))),
                TargetPort::Number(n) => Some(IntOrString::Int(i32::from(*n))),
                TargetPort::Name(n) => Some(IntOrString::String(n.clone())),
            },
            protocol: Some(
                match p.transport {
                    Transport::Tcp => "TCP",
                    Transport::Udp => "UDP",
                    Transport::Sctp => "SCTP",
                }
                .to_owned(),
            ),
            app_protocol: p.app_protocol.clone(),
            ..ServicePort::default()
        })
        .collect();
    K8sService {
        metadata: ObjectMeta {
            name: Some(service.name.clone()),
            namespace: Some(service.namespace.clone()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// Whether a Service object is one aether wrote: it carries both labels. The registrar prunes
/// and overwrites only these (spec/model.md §8, "Collision", "Pruning").
pub fn is_owned(service: &K8sService) -> bool {
    let labels = service.metadata.labels.as_ref();
    let has = |k: &str, v: &str| labels.and_then(|l| l.get(k)).is_some_and(|x| x == v);
    has(LABEL_MESH_SERVICE, "true") && has(LABEL_MANAGED_BY, MANAGED_BY)
}
