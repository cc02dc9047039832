//! The registrar role as a pure function (spec/model.md §8): the generated Service of every
//! mesh service whose name no other Service owns, and deterministic ClusterIPs where no API
//! server allocates them.
//!
//! Layer 0 (pure).

use crate::prelude::*;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::port::{
    LEGACY_PORT, PROXY_PORT, PortProtocol, Transport, is_reserved, push_decimal,
};
use crate::model::rows::{PortProtocols, row_problem, served_protocols};
use crate::model::snapshot::{Service, ServicePort, Snapshot, TargetPort};
use crate::model::vote::vote;

/// What the registrar decided besides the Services themselves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistrarReport {
    /// Mesh services whose name a user Service owns: no generated Service, no mesh VIP.
    pub collisions: Vec<(String, String)>,
    /// Reserved ports left off a generated Service: (namespace, service, port).
    pub reserved_skipped: Vec<(String, String, u16)>,
}

/// The generated Services the rows call for (spec/model.md §8), without ClusterIPs.
///
/// A mesh service is the (namespace, ServiceAccount) of served rows. Its Service has one port
/// per declared port of any served row (the one-truth protocol), reserved ports left off, plus
/// the anchor ports `mesh` 18081 and `mesh-tcp` 18082.
pub fn generated_services(snapshot: &Snapshot) -> (Vec<Service>, RegistrarReport) {
    generated_services_except(snapshot, &BTreeSet::new())
}

/// [`generated_services`], leaving out the rows of `ignored` namespaces: their pods are not
/// registered (spec/model.md §2), so they make no mesh service.
pub fn generated_services_except(
    snapshot: &Snapshot,
    ignored: &BTreeSet<String>,
) -> (Vec<Service>, RegistrarReport) {
    // The rows grouped by mesh service. The rows of one service mostly come one after another
    // (a source lists them by pod), so a row of the previous row's service joins its group
    // without a lookup; the groups are sorted by name once at the end. (A sorted map searched
    // per row compared names about log n times a row: 30 % of this function at 2,000
    // services.)
    let mut groups: Vec<((&str, &str), Vec<PortProtocols>)> =
        Vec::with_capacity(snapshot.rows.len());
    let mut group_of: HashMap<(&str, &str), usize> = HashMap::with_capacity(snapshot.rows.len());
    let registered = snapshot
        .rows
        .iter()
        .filter(|r| !ignored.contains(&r.namespace) && row_problem(r).is_none());
    for row in registered {
        let k = (row.namespace.as_str(), row.service.as_str());
        let g = match groups.last() {
            Some((last, _)) if *last == k => groups.len() - 1,
            _ => *group_of.entry(k).or_insert_with(|| {
                groups.push((k, Vec::new()));
                groups.len() - 1
            }),
        };
        groups[g].1.push(served_protocols(row));
    }
    drop(group_of);
    // Stable, so that groups already in order (rows listed by pod name, one service's pods
    // together) cost one pass.
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    let rows_by_service = groups;
    let user_owned: BTreeSet<(&str, &str)> = snapshot
        .services
        .iter()
        .filter(|s| !s.generated)
        .map(|s| (s.namespace.as_str(), s.name.as_str()))
        .collect();

    let mut report = RegistrarReport::default();
    let mut out = Vec::with_capacity(rows_by_service.len());
    for ((ns, name), rows) in rows_by_service {
        if user_owned.contains(&(ns, name)) {
            report.collisions.push((ns.to_owned(), name.to_owned()));
            continue;
        }
        let tallies = vote(rows.iter());
        // The voted ports and the two anchors.
        let mut ports = Vec::with_capacity(tallies.len() + 2);
        for (port, tally) in tallies {
            if is_reserved(u32::from(port)) {
                report
                    .reserved_skipped
                    .push((ns.to_owned(), name.to_owned(), port));
                continue;
            }
            let Some(class) = tally.winner() else {
                continue;
            };
            let (suffix, transport, app) = match class {
                PortProtocol::Http => ("tcp", Transport::Tcp, Some("http")),
                PortProtocol::Tcp => ("tcp", Transport::Tcp, Some("tcp")),
                PortProtocol::Udp => ("udp", Transport::Udp, None),
            };
            ports.push(ServicePort {
                name: Some({
                    let mut n = String::with_capacity(10);
                    n.push('p');
                    push_decimal(&mut n, port);
                    n.push('-');
                    n.push_str(suffix);
                    n
                }),
                port,
                target: TargetPort::Number(port),
                transport,
                app_protocol: app.map(str::to_owned),
            });
        }
        for (anchor, number) in [("mesh", PROXY_PORT), ("mesh-tcp", LEGACY_PORT)] {
            ports.push(ServicePort {
                name: Some(anchor.to_owned()),
                port: number,
                target: TargetPort::Number(number),
                transport: Transport::Tcp,
                app_protocol: None,
            });
        }
        out.push(Service {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            cluster_ips: Vec::new(),
            headless: false,
            generated: true,
            selector: None,
            ports,
        });
    }
    (out, report)
}

/// FNV-1a of the concatenation of `parts`: a stable hash, the same on every build and
/// platform (fed piece by piece, so that `<namespace>/<name>` is hashed without being written).
fn stable_hash(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Gives every non-headless Service without a ClusterIP one from `cidr`, deterministically.
///
/// Each Service starts at a slot chosen by a stable hash of `<namespace>/<name>` and takes the
/// next free address from there; Services are visited in (namespace, name) order, and addresses
/// already in use are never taken. The network and broadcast addresses are skipped. Returns the
/// Services that found no free address.
pub fn allocate_cluster_ips(services: &mut [Service], cidr: IpNet) -> Vec<(String, String)> {
    // A hash set, made at its final size: only asked whether an address is taken.
    let mut used: HashSet<IpAddr> = HashSet::with_capacity(
        services
            .iter()
            .map(|s| s.cluster_ips.len().max(usize::from(!s.headless)))
            .sum(),
    );
    used.extend(services.iter().flat_map(|s| s.cluster_ips.iter().copied()));
    let mut order: Vec<usize> = (0..services.len())
        .filter(|&i| !services[i].headless && services[i].cluster_ips.is_empty())
        .collect();
    order.sort_by(|&a, &b| {
        (&services[a].namespace, &services[a].name)
            .cmp(&(&services[b].namespace, &services[b].name))
    });
    let (base, size) = match cidr {
        IpNet::V4(n) => (
            u128::from(u32::from(n.network())),
            1u128 << (32 - u32::from(n.prefix_len())),
        ),
        IpNet::V6(n) => (
            u128::from(n.network()),
            1u128
                .checked_shl(128 - u32::from(n.prefix_len()))
                .unwrap_or(u128::MAX),
        ),
    };
    let usable = size.saturating_sub(2).max(1);
    let mut exhausted = Vec::new();
    for i in order {
        let key = [
            services[i].namespace.as_str(),
            "/",
            services[i].name.as_str(),
        ];
        let start = u128::from(stable_hash(&key)) % usable;
        let mut found = None;
        for step in 0..usable.min(1 << 20) {
            let offset = 1 + (start + step) % usable;
            let ip = match cidr {
                IpNet::V4(_) => u32::try_from(base + offset)
                    .ok()
                    .map(|v| IpAddr::V4(v.into())),
                IpNet::V6(_) => Some(IpAddr::V6((base + offset).into())),
            };
            if let Some(ip) = ip
                && !used.contains(&ip)
            {
                found = Some(ip);
                break;
            }
        }
        match found {
            Some(ip) => {
                used.insert(ip);
                services[i].cluster_ips.push(ip);
            }
            None => exhausted.push((services[i].namespace.clone(), services[i].name.clone())),
        }
    }
    exhausted
}

/// Completes a snapshot read where no API server runs (the file registry): adds the generated
/// Services the rows call for (keeping any already present) and allocates missing ClusterIPs.
pub fn complete_snapshot(snapshot: &mut Snapshot, cidr: IpNet) -> RegistrarReport {
    complete_snapshot_except(snapshot, cidr, &BTreeSet::new())
}

/// [`complete_snapshot`] for a node that ignores some namespaces.
pub fn complete_snapshot_except(
    snapshot: &mut Snapshot,
    cidr: IpNet,
    ignored: &BTreeSet<String>,
) -> RegistrarReport {
    let report = add_generated_except(snapshot, ignored);
    allocate_cluster_ips(&mut snapshot.services, cidr);
    report
}

/// [`complete_snapshot_except`] but for the ClusterIPs: the generated Services the rows call
/// for, added after the snapshot's own (a generated Service already present, the first of its
/// name, takes the ports the rows give it and keeps its addresses).
pub fn add_generated_except(
    snapshot: &mut Snapshot,
    ignored: &BTreeSet<String>,
) -> RegistrarReport {
    let (mut generated, report) = generated_services_except(snapshot, ignored);
    // Each generated Service matched against the first Service of its (namespace, name) in one
    // pass over the snapshot: a scan of the snapshot per generated Service was quadratic
    // (n²/2 comparisons of names: 200 million at 20,000 services).
    let mut matched: Vec<Option<usize>> = vec![None; generated.len()];
    {
        let mut wanted: HashMap<(&str, &str), usize> = generated
            .iter()
            .enumerate()
            .map(|(i, g)| ((g.namespace.as_str(), g.name.as_str()), i))
            .collect();
        for (si, s) in snapshot.services.iter().enumerate() {
            if let Some(gi) = wanted.remove(&(s.namespace.as_str(), s.name.as_str())) {
                matched[gi] = Some(si);
            }
        }
    }
    for (gi, g) in generated.iter_mut().enumerate() {
        if let Some(si) = matched[gi]
            && snapshot.services[si].generated
        {
            snapshot.services[si].ports = std::mem::take(&mut g.ports);
        }
    }
    snapshot.services.extend(
        generated
            .into_iter()
            .zip(matched)
            .filter_map(|(g, m)| m.is_none().then_some(g)),
    );
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rows::{
        ANNOTATION_PORT, ANNOTATION_PORTS, ANNOTATION_PROTOCOL, parse_declared_ports,
    };

    fn row(
        ns: &str,
        sa: &str,
        ip: &str,
        ann: &[(&str, &str)],
    ) -> std::sync::Arc<crate::model::snapshot::Row> {
        let a = ann
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        std::sync::Arc::new(parse_declared_ports(&a).unwrap().to_row(
            ns,
            sa,
            ip.parse().unwrap(),
            true,
        ))
    }

    fn port_names(s: &Service) -> Vec<(String, u16, Option<String>)> {
        s.ports
            .iter()
            .map(|p| {
                (
                    p.name.clone().unwrap_or_default(),
                    p.port,
                    p.app_protocol.clone(),
                )
            })
            .collect()
    }

    #[test]
    fn a_cluster_ip_is_the_one_earlier_versions_gave() {
        // FNV-1a of "mp/mp-multi" is 0x5095e488d66bb8f8: its slot in 10.96.0.0/16 (65,534
        // usable addresses) is 10.96.124.167, what the demo has always printed for mp-multi.
        // A daemon upgraded in file mode must give every Service the address it had.
        assert_eq!(stable_hash(&["mp", "/", "mp-multi"]), 0x5095_e488_d66b_b8f8);
        let mut s = vec![Service {
            namespace: "mp".into(),
            name: "mp-multi".into(),
            cluster_ips: vec![],
            headless: false,
            generated: true,
            selector: None,
            ports: vec![],
        }];
        assert!(allocate_cluster_ips(&mut s, "10.96.0.0/16".parse().unwrap()).is_empty());
        assert_eq!(s[0].cluster_ips, vec![IpAddr::from([10, 96, 124, 167])]);
    }

    #[test]
    fn rows_of_one_service_apart_in_the_list_make_one_service_and_the_services_come_sorted() {
        let http = [(ANNOTATION_PORT, "8080"), (ANNOTATION_PROTOCOL, "http")];
        let tcp = [(ANNOTATION_PORT, "9000"), (ANNOTATION_PROTOCOL, "tcp")];
        let snap = Snapshot {
            rows: vec![
                row("mp", "zeta", "10.0.0.1", &http),
                row("mp", "alpha", "10.0.0.2", &http),
                row("mp", "zeta", "10.0.0.3", &tcp),
                row("aa", "zeta", "10.0.0.4", &tcp),
            ],
            ..Snapshot::default()
        };
        let (svcs, _) = generated_services(&snap);
        let names: Vec<(&str, &str)> = svcs
            .iter()
            .map(|s| (s.namespace.as_str(), s.name.as_str()))
            .collect();
        assert_eq!(names, [("aa", "zeta"), ("mp", "alpha"), ("mp", "zeta")]);
        let ports: Vec<u16> = svcs[2].ports.iter().map(|p| p.port).collect();
        assert_eq!(ports, [8080, 9000, PROXY_PORT, LEGACY_PORT]);
    }

    #[test]
    fn the_generated_service_has_real_ports_and_the_two_anchors_m7_x5() {
        let snap = Snapshot {
            rows: vec![row(
                "mp",
                "mp-tcpfirst",
                "10.0.0.1",
                &[
                    (ANNOTATION_PORT, "9000"),
                    (ANNOTATION_PROTOCOL, "tcp"),
                    (ANNOTATION_PORTS, "8080=http"),
                ],
            )],
            ..Snapshot::default()
        };
        let (svcs, _) = generated_services(&snap);
        assert_eq!(svcs.len(), 1);
        assert!(svcs[0].generated && svcs[0].selector.is_none());
        assert_eq!(
            port_names(&svcs[0]),
            vec![
                ("p8080-tcp".into(), 8080, Some("http".into())),
                ("p9000-tcp".into(), 9000, Some("tcp".into())),
                ("mesh".into(), 18081, None),
                ("mesh-tcp".into(), 18082, None),
            ]
        );
    }

    #[test]
    fn reserved_ports_never_reach_the_generated_service_u4() {
        let snap = Snapshot {
            rows: vec![row(
                "mp",
                "svc",
                "10.0.0.1",
                &[(ANNOTATION_PORTS, "18081,9090")],
            )],
            ..Snapshot::default()
        };
        let (svcs, report) = generated_services(&snap);
        assert!(
            svcs[0]
                .ports
                .iter()
                .all(|p| p.name.as_deref() != Some("p18081-tcp"))
        );
        assert_eq!(
            report.reserved_skipped,
            vec![("mp".into(), "svc".into(), 18081)]
        );
    }

    #[test]
    fn a_user_service_of_the_same_name_is_never_touched() {
        let mut snap = Snapshot {
            rows: vec![row("mp", "mp-owned", "10.0.0.1", &[])],
            ..Snapshot::default()
        };
        snap.services.push(Service {
            namespace: "mp".into(),
            name: "mp-owned".into(),
            cluster_ips: vec![],
            headless: false,
            generated: false,
            selector: None,
            ports: vec![],
        });
        let (svcs, report) = generated_services(&snap);
        assert!(svcs.is_empty());
        assert_eq!(report.collisions, vec![("mp".into(), "mp-owned".into())]);
    }

    #[test]
    fn cluster_ips_are_deterministic_and_unique() {
        let mk = |name: &str| Service {
            namespace: "mp".into(),
            name: name.into(),
            cluster_ips: vec![],
            headless: false,
            generated: true,
            selector: None,
            ports: vec![],
        };
        let cidr: IpNet = "10.96.0.0/16".parse().unwrap();
        let mut a: Vec<Service> = (0..200).map(|i| mk(&format!("s{i}"))).collect();
        let mut b: Vec<Service> = a.iter().rev().cloned().collect();
        assert!(allocate_cluster_ips(&mut a, cidr).is_empty());
        allocate_cluster_ips(&mut b, cidr);
        let ips: BTreeSet<IpAddr> = a.iter().map(|s| s.cluster_ips[0]).collect();
        assert_eq!(ips.len(), 200);
        for s in &a {
            let same = b.iter().find(|t| t.name == s.name).unwrap();
            assert_eq!(s.cluster_ips, same.cluster_ips);
            assert!(cidr.contains(&s.cluster_ips[0]));
        }
    }
}
