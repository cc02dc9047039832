//! What the registrar must write to make the API server's generated Services what the rows call
//! for (spec/model.md §8): a pure diff of the desired Services against the Services the watch
//! holds.
//!
//! Pure: no IO, no clock. The desired Services come from [`crate::model::registrar`]; they are
//! rendered by [`crate::registry::kube::generated::service_object`].
//!
//! Invariants:
//! - A Service aether does not own (it lacks either of the two labels,
//!   [`crate::registry::kube::generated::is_owned`]) is never written and never deleted,
//!   whatever its name: a user Service with a mesh service's name is the user's ("Collision").
//! - A Service aether owns that no row calls for any more is deleted, with its uid and
//!   resourceVersion as preconditions, so a Service re-created in between is not removed.
//! - An owned Service whose ports, type, selector and labels already converge is not written:
//!   agreeing registrars make no writes ("Convergence" compares every port's name, number,
//!   protocol, targetPort and appProtocol).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Service as K8sService, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::model::snapshot::Service;
use crate::registry::kube::generated::{is_owned, service_object};

/// One write to the API server.
#[derive(Clone, Debug, PartialEq)]
pub enum ServiceWrite {
    /// Apply this Service (server-side apply, the registrar's field manager): create it or
    /// converge it.
    Apply(Box<K8sService>),
    /// Delete an owned Service no row calls for.
    Delete {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Its uid (precondition).
        uid: Option<String>,
        /// Its resourceVersion (precondition).
        resource_version: Option<String>,
    },
}

impl ServiceWrite {
    /// `<namespace>/<name>` of the Service written.
    pub fn subject(&self) -> String {
        match self {
            Self::Apply(s) => format!(
                "{}/{}",
                s.metadata.namespace.as_deref().unwrap_or(""),
                s.metadata.name.as_deref().unwrap_or("")
            ),
            Self::Delete {
                namespace, name, ..
            } => format!("{namespace}/{name}"),
        }
    }
}

/// The writes that bring `existing` (every Service the watch holds) to `desired` (the generated
/// Services the rows call for), in (namespace, name) order, applies before deletes.
pub fn plan(desired: &[Service], existing: &[Arc<K8sService>]) -> Vec<ServiceWrite> {
    let by_name: BTreeMap<(&str, &str), &K8sService> = existing
        .iter()
        .map(|s| {
            (
                (
                    s.metadata.namespace.as_deref().unwrap_or(""),
                    s.metadata.name.as_deref().unwrap_or(""),
                ),
                s.as_ref(),
            )
        })
        .collect();
    let mut writes = Vec::new();
    let mut wanted = BTreeSet::new();
    let mut desired: Vec<&Service> = desired.iter().collect();
    desired.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    for d in desired {
        let key = (d.namespace.as_str(), d.name.as_str());
        wanted.insert(key);
        let object = service_object(d);
        match by_name.get(&key) {
            // Collision: the user's Service; never touched.
            Some(current) if !is_owned(current) => {}
            Some(current) if converged(current, &object) => {}
            _ => writes.push(ServiceWrite::Apply(Box::new(object))),
        }
    }
    for (key, current) in &by_name {
        if is_owned(current) && !wanted.contains(key) {
            writes.push(ServiceWrite::Delete {
                namespace: key.0.to_owned(),
                name: key.1.to_owned(),
                uid: current.metadata.uid.clone(),
                resource_version: current.metadata.resource_version.clone(),
            });
        }
    }
    writes
}

/// Whether the Service the API server holds already is what `want` asks for: its labels
/// include `want`'s, it is a ClusterIP Service with no selector, and its ports are the same
/// (compared as the API server defaults them: protocol TCP, targetPort the port).
pub fn converged(current: &K8sService, want: &K8sService) -> bool {
    let labels_ok = want.metadata.labels.iter().flatten().all(|(k, v)| {
        current
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k))
            .is_some_and(|x| x == v)
    });
    let (Some(cur), Some(want)) = (&current.spec, &want.spec) else {
        return false;
    };
    let type_ok = cur.type_.as_deref().unwrap_or("ClusterIP") == "ClusterIP";
    let selector_ok = cur.selector.as_ref().is_none_or(BTreeMap::is_empty);
    labels_ok
        && type_ok
        && selector_ok
        && ports(cur.ports.as_deref()) == ports(want.ports.as_deref())
}

/// (name, port, protocol, targetPort, appProtocol), defaulted and sorted.
fn ports(ports: Option<&[ServicePort]>) -> Vec<(String, i32, String, String, Option<String>)> {
    let mut out: Vec<_> = ports
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let target = match &p.target_port {
                None => p.port.to_string(),
                Some(IntOrString::Int(n)) => n.to_string(),
                Some(IntOrString::String(s)) => s.clone(),
            };
            (
                p.name.clone().unwrap_or_default(),
                p.port,
                p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
                target,
                p.app_protocol.clone(),
            )
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::model::port::Transport;
    use crate::model::snapshot::{ServicePort as SnapPort, TargetPort};

    /// A generated Service of namespace `shop` with these (port, appProtocol) pairs.
    pub(in crate::registrar) fn desired(name: &str, ports: &[(u16, &str)]) -> Service {
        let mut s = Service {
            namespace: "shop".into(),
            name: name.into(),
            cluster_ips: Vec::new(),
            headless: false,
            generated: true,
            selector: None,
            ports: Vec::new(),
        };
        for &(port, app) in ports {
            s.ports.push(SnapPort {
                name: Some(format!("p{port}-tcp")),
                port,
                target: TargetPort::Same,
                transport: Transport::Tcp,
                app_protocol: Some(app.into()),
            });
        }
        s
    }

    fn stored(s: &Service, uid: &str, rv: &str) -> Arc<K8sService> {
        let mut o = service_object(s);
        o.metadata.uid = Some(uid.into());
        o.metadata.resource_version = Some(rv.into());
        // As the API server returns it: a ClusterIP allocated, protocol defaulted.
        if let Some(spec) = o.spec.as_mut() {
            spec.cluster_ip = Some("10.96.0.10".into());
        }
        Arc::new(o)
    }

    #[test]
    fn a_missing_generated_service_is_applied() {
        let want = desired("cart", &[(8080, "http")]);
        let writes = plan(std::slice::from_ref(&want), &[]);
        assert_eq!(writes.len(), 1);
        let ServiceWrite::Apply(s) = &writes[0] else {
            panic!("expected an apply");
        };
        assert_eq!(s.metadata.name.as_deref(), Some("cart"));
        assert!(is_owned(s));
    }

    #[test]
    fn a_converged_service_is_not_written_again() {
        let want = desired("cart", &[(8080, "http"), (9000, "tcp")]);
        let have = stored(&want, "u1", "5");
        assert_eq!(plan(&[want], &[have]), vec![]);
    }

    #[test]
    fn a_changed_app_protocol_or_a_new_port_is_converged() {
        let old = desired("cart", &[(8080, "http")]);
        let have = stored(&old, "u1", "5");
        let new_class = desired("cart", &[(8080, "tcp")]);
        assert!(matches!(
            plan(&[new_class], std::slice::from_ref(&have)).as_slice(),
            [ServiceWrite::Apply(_)]
        ));
        let new_port = desired("cart", &[(8080, "http"), (8081, "http")]);
        assert!(matches!(
            plan(&[new_port], &[have]).as_slice(),
            [ServiceWrite::Apply(_)]
        ));
    }

    #[test]
    fn a_user_service_of_the_same_name_is_never_touched() {
        let want = desired("cart", &[(8080, "http")]);
        let mut user = (*stored(&want, "u1", "5")).clone();
        user.metadata.labels = None;
        assert_eq!(plan(&[want], &[Arc::new(user.clone())]), vec![]);
        // Nor deleted when no row calls for it.
        assert_eq!(plan(&[], &[Arc::new(user)]), vec![]);
    }

    #[test]
    fn an_owned_service_no_row_calls_for_is_deleted_with_preconditions() {
        let gone = desired("old", &[(8080, "http")]);
        let have = stored(&gone, "u9", "12");
        assert_eq!(
            plan(&[], &[have]),
            vec![ServiceWrite::Delete {
                namespace: "shop".into(),
                name: "old".into(),
                uid: Some("u9".into()),
                resource_version: Some("12".into()),
            }]
        );
    }

    #[test]
    fn a_service_with_only_the_mesh_label_is_not_owned_and_not_deleted() {
        let s = desired("half", &[(8080, "http")]);
        let mut o = (*stored(&s, "u2", "3")).clone();
        if let Some(l) = o.metadata.labels.as_mut() {
            l.remove(crate::registry::kube::generated::LABEL_MANAGED_BY);
        }
        assert_eq!(plan(&[], &[Arc::new(o)]), vec![]);
    }
}
