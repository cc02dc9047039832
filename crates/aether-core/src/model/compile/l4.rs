//! PURE: where a captured connection that would be passed through is carried instead
//! (spec/model.md §12.5 item 1). A dial to a user Service's ClusterIP and TCP port, whose
//! EndpointSlices hold at least one served mesh pod declaring the slice's pod port, gets the
//! list of the Service's Ready endpoints on that port, as kube-proxy would pick among them;
//! the data plane picks one, and carries the bytes over the mesh hop when it is a mesh pod.
//! A Service whose endpoints are none of the mesh's keeps the plain passthrough.

use crate::prelude::*;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::model::PodIpEntry;
use crate::model::port::{PortProtocol, Transport};
use crate::model::snapshot::{EndpointSlice, Snapshot};
use crate::model::target::L4Endpoint;

/// Every (ClusterIP, TCP front port) of a user Service with a mesh pod among its endpoints,
/// with all of its Ready endpoints on that port. Cost: O(services + slices' endpoints), the
/// slices indexed by Service once.
pub(super) fn passthrough_targets(
    snapshot: &Snapshot,
    pod_ips: &HashMap<IpAddr, Arc<PodIpEntry>>,
) -> HashMap<SocketAddr, Arc<[L4Endpoint]>> {
    let mut slices_of: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
    for s in &snapshot.endpoint_slices {
        slices_of
            .entry((s.namespace.as_str(), s.service.as_str()))
            .or_default()
            .push(s);
    }
    let mut out = HashMap::new();
    // Two user Services that claim one ClusterIP (a registry written by hand): the first by
    // (namespace, name) has it, whatever order the source gave them in (as generated Services'
    // ClusterIPs; issue #37's property test found this one too).
    let mut users: Vec<_> = snapshot
        .services
        .iter()
        .filter(|u| !u.generated && !u.headless && !u.cluster_ips.is_empty())
        .collect();
    users
        .sort_by(|a, b| super::named_order((&a.namespace, &a.name), (&b.namespace, &b.name), a, b));
    for u in users {
        let slices = slices_of
            .get(&(u.namespace.as_str(), u.name.as_str()))
            .map_or(&[][..], Vec::as_slice);
        for p in u.ports.iter().filter(|p| p.transport == Transport::Tcp) {
            let mut endpoints = Vec::new();
            for s in slices {
                // The slice port that carries this ServicePort's name gives the pod port of the
                // slice's endpoints (spec/model.md §9.2, per slice as kube-proxy reads it).
                let Some(pod_port) = s
                    .ports
                    .iter()
                    .find(|sp| {
                        sp.transport == Transport::Tcp
                            && sp.name.as_deref().unwrap_or("") == p.name.as_deref().unwrap_or("")
                    })
                    .and_then(|sp| sp.port)
                else {
                    continue;
                };
                for e in s.endpoints.iter().filter(|e| e.ready) {
                    for &address in &e.addresses {
                        let mesh = pod_ips
                            .get(&address)
                            .filter(|m| {
                                matches!(
                                    m.declared.get(&pod_port),
                                    Some(PortProtocol::Http | PortProtocol::Tcp)
                                )
                            })
                            .map(|m| m.endpoint.mesh_service.clone());
                        endpoints.push(L4Endpoint {
                            address,
                            port: pod_port,
                            mesh,
                        });
                    }
                }
            }
            // Slices and their endpoints come in any order: the list does not depend on it.
            endpoints.sort_by_key(|e| (e.address, e.port));
            endpoints.dedup();
            for &vip in &u.cluster_ips {
                let same_family: Vec<L4Endpoint> = endpoints
                    .iter()
                    .filter(|e| e.address.is_ipv4() == vip.is_ipv4())
                    .cloned()
                    .collect();
                if same_family.iter().any(|e| e.mesh.is_some()) {
                    out.entry(SocketAddr::new(vip, p.port))
                        .or_insert_with(|| same_family.into());
                }
            }
        }
    }
    out
}
