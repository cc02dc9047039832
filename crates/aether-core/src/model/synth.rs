//! Synthetic registries shaped like spec/scale.md §2's worked example, scaled: for benchmarks,
//! load tests and property tests.
//!
//! The example is 200 services with HTTP on 80, 8080 and 9090, 20 raw-TCP ports, and 50 pods on
//! a node. [`scaled`] keeps those proportions for any number of services: every service has two
//! HTTP ports out of {80, 8080, 9090}, one in ten also has a raw-TCP port, one in ten has an
//! HTTPRoute, and each service has two pods.
//!
//! Layer 0 (pure).

use crate::prelude::*;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use crate::model::port::PortProtocol;
use crate::model::registrar::complete_snapshot;
use crate::model::snapshot::{
    HttpBackendRef, HttpMatch, HttpRoute, HttpRouteKind, HttpRule, ObjectRef, ParentRef, PathMatch,
    Pod, ProtocolValue, Row, Snapshot,
};

/// The namespaces services are spread over.
const NAMESPACES: u32 = 20;

fn pod_ip(i: u32) -> IpAddr {
    // 10.128.0.0/9 holds 8 million pods.
    IpAddr::V4(Ipv4Addr::from(0x0a80_0000 + i))
}

/// A snapshot of `services` services shaped like the scale.md §2 example, generated Services
/// and ClusterIPs included (allocated from 10.96.0.0/12).
pub fn scaled(services: u32) -> Snapshot {
    let mut s = Snapshot::default();
    for n in 0..NAMESPACES.min(services.max(1)) {
        s.namespaces.push(format!("ns-{n}"));
    }
    let http_shapes: [&[u16]; 3] = [&[80, 8080], &[8080, 9090], &[80, 9090]];
    let mut pod = 0u32;
    for i in 0..services {
        let ns = format!("ns-{}", i % NAMESPACES);
        let name = format!("svc-{i}");
        let mut ports: BTreeMap<u32, ProtocolValue> = http_shapes[(i % 3) as usize]
            .iter()
            .map(|&p| (u32::from(p), ProtocolValue::Known(PortProtocol::Http)))
            .collect();
        if i % 10 == 0 {
            ports.insert(9000, ProtocolValue::Known(PortProtocol::Tcp));
        }
        let declared = *ports.keys().next().unwrap_or(&8080);
        for replica in 0..2 {
            let pod_name = format!("{name}-{replica}");
            let address = pod_ip(pod);
            pod += 1;
            s.rows.push(Arc::new(Row {
                namespace: ns.clone(),
                service: name.clone(),
                address,
                port: declared,
                ports: ports.keys().copied().collect(),
                port_protocols: Some(ports.clone()),
                ready: true,
                pod: Some(pod_name.clone()),
                node: Some(format!("node-{}", pod % 40)),
            }));
            s.pods.push(Arc::new(Pod {
                namespace: ns.clone(),
                name: pod_name,
                service_account: name.clone(),
                node: Some(format!("node-{}", pod % 40)),
                ips: vec![address],
                labels: BTreeMap::new(),
                managed: true,
                redirect_all: None,
                exclude_outbound_ports: Vec::new(),
                exclude_outbound_ip_ranges: Vec::new(),
                ready: true,
                netns: None,
                netns_from_cni: false,
                command: Vec::new(),
                inbound_mode: None,
                host_ips: Vec::new(),
            }));
        }
        if i % 10 == 5 {
            s.http_routes.push(HttpRoute {
                kind: HttpRouteKind::Http,
                namespace: ns.clone(),
                name: format!("{name}-route"),
                generation: 1,
                created: None,
                parents: vec![ParentRef {
                    target: service_ref(&name),
                    port: None,
                    section_name: None,
                }],
                hostnames: Vec::new(),
                rules: vec![
                    HttpRule {
                        name: Some("api".into()),
                        matches: vec![HttpMatch {
                            path: Some(PathMatch::Prefix("/api".into())),
                            ..HttpMatch::default()
                        }],
                        filters: Vec::new(),
                        backends: vec![backend(&name, http_shapes[(i % 3) as usize][1])],
                        request_timeout_ms: None,
                        backend_request_timeout_ms: None,
                    },
                    HttpRule {
                        name: None,
                        matches: Vec::new(),
                        filters: Vec::new(),
                        backends: vec![backend(&name, http_shapes[(i % 3) as usize][0])],
                        request_timeout_ms: None,
                        backend_request_timeout_ms: None,
                    },
                ],
            });
        }
    }
    let cidr = "10.96.0.0/12".parse().expect("a literal CIDR parses");
    complete_snapshot(&mut s, cidr);
    s
}

fn service_ref(name: &str) -> ObjectRef {
    ObjectRef {
        group: String::new(),
        kind: "Service".into(),
        namespace: None,
        name: name.into(),
    }
}

fn backend(name: &str, port: u16) -> HttpBackendRef {
    HttpBackendRef {
        target: service_ref(name),
        port: Some(port),
        weight: 1,
        filters: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scaled_registry_keeps_the_examples_proportions() {
        let s = scaled(200);
        assert_eq!(s.rows.len(), 400);
        assert_eq!(s.services.iter().filter(|s| s.generated).count(), 200);
        let tcp = s
            .services
            .iter()
            .filter(|s| {
                s.ports
                    .iter()
                    .any(|p| p.app_protocol.as_deref() == Some("tcp"))
            })
            .count();
        assert_eq!(tcp, 20);
        assert!(s.services.iter().all(|s| s.cluster_ips.len() == 1));
    }
}
