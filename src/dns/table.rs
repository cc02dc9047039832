//! The names mesh DNS answers and their addresses (model.md §11).
//!
//! PURE (Layer 0): built from a completed [`Snapshot`] and looked up by name; no IO.
//!
//! Records are A and AAAA only:
//! - the mesh name `<svc>.<ns>.<mesh-domain>` of every generated Service whose name no user
//!   Service owns, to its ClusterIP(s);
//! - in file mode (`include_kubernetes_names`, standing in for the cluster DNS),
//!   `<svc>.<ns>.svc.<cluster-domain>` of every Service with a ClusterIP, generated or not.
//!
//! Every other name is [`Lookup::NotOurs`] and is forwarded by the server.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::model::Snapshot;
use crate::model::names::Domains;

/// The record type a query asks for, as far as the table distinguishes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueryKind {
    /// IPv4 addresses.
    A,
    /// IPv6 addresses.
    Aaaa,
    /// Any other type (the table holds none).
    Other,
}

/// What the table says about a name and type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The name is ours and has these addresses of the type asked (never empty).
    Records(Vec<IpAddr>),
    /// The name is ours but has no record of the type asked: answer NOERROR, no answers.
    NoData,
    /// A name inside a zone this table is authoritative for (the mesh domain; with Kubernetes
    /// names, the cluster domain) that has no record: answer NXDOMAIN, so that a resolver
    /// walking its search list goes on to the next candidate.
    NxDomain,
    /// Not a name of this table: forward the query.
    NotOurs,
}

/// Names (lower case, no trailing dot) to addresses, immutable once built.
///
/// Rebuild it with [`DnsTable::build`] for each published model and swap it into the server's
/// `ArcSwap`; a lookup is a map read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DnsTable {
    names: BTreeMap<String, Vec<IpAddr>>,
    /// Zone suffixes (with a leading dot) this table answers for alone.
    zones: Vec<String>,
}

impl DnsTable {
    /// The table of a snapshot the registrar completed (generated Services present with
    /// `generated: true`).
    pub fn build(snapshot: &Snapshot, domains: &Domains, include_kubernetes_names: bool) -> Self {
        let owned_by_user: BTreeSet<(&str, &str)> = snapshot
            .services
            .iter()
            .filter(|s| !s.generated)
            .map(|s| (s.namespace.as_str(), s.name.as_str()))
            .collect();
        let mesh = normalize(&domains.mesh);
        let cluster = normalize(&domains.cluster);
        // Each name written once into a buffer of its size and lowered in place (a `format!`
        // and a lowered copy were most of a build); the table is then made from the sorted
        // list in one pass instead of an insert per name.
        let spell = |svc: &str, ns: &str, middle: &str, domain: &str| {
            let mut n =
                String::with_capacity(svc.len() + ns.len() + middle.len() + domain.len() + 2);
            for part in [svc, ".", ns, middle, ".", domain] {
                n.push_str(part);
            }
            n.make_ascii_lowercase();
            n
        };
        let mut spelled: Vec<(String, &[IpAddr])> = Vec::new();
        for svc in &snapshot.services {
            if svc.headless || svc.cluster_ips.is_empty() {
                continue;
            }
            let key = (svc.namespace.as_str(), svc.name.as_str());
            // Model.md §8 Collision, §11: a mesh service whose name a user Service owns has
            // no mesh-DNS record.
            if svc.generated && !owned_by_user.contains(&key) {
                spelled.push((
                    spell(&svc.name, &svc.namespace, "", &mesh),
                    &svc.cluster_ips,
                ));
            }
            if include_kubernetes_names {
                spelled.push((
                    spell(&svc.name, &svc.namespace, ".svc", &cluster),
                    &svc.cluster_ips,
                ));
            }
        }
        // Stable: a name spelled twice keeps its addresses in the Services' order.
        spelled.sort_by(|a, b| a.0.cmp(&b.0));
        let mut merged: Vec<(String, Vec<IpAddr>)> = Vec::with_capacity(spelled.len());
        for (name, ips) in spelled {
            if merged.last().is_none_or(|(last, _)| *last != name) {
                merged.push((name, Vec::with_capacity(ips.len())));
            }
            let entry = &mut merged.last_mut().expect("pushed, or the same name").1;
            for ip in ips {
                if !entry.contains(ip) {
                    entry.push(*ip);
                }
            }
        }
        let names: BTreeMap<String, Vec<IpAddr>> = merged.into_iter().collect();
        let mut zones = vec![format!(".{mesh}")];
        if include_kubernetes_names {
            // Standing in for the cluster DNS, the table is authoritative for the whole
            // cluster domain, so a search-list candidate such as `x.cluster.local` ends in
            // NXDOMAIN here instead of a forward that nobody answers.
            zones.push(format!(".{cluster}"));
        }
        Self { names, zones }
    }

    /// The answer for `name` (any case, with or without the trailing dot) and `kind`.
    pub fn lookup(&self, name: &str, kind: QueryKind) -> Lookup {
        let name = normalize(name);
        let Some(ips) = self.names.get(&name) else {
            return if self.zones.iter().any(|z| name.ends_with(z.as_str())) {
                Lookup::NxDomain
            } else {
                Lookup::NotOurs
            };
        };
        let ips: Vec<IpAddr> = ips
            .iter()
            .copied()
            .filter(|ip| match kind {
                QueryKind::A => ip.is_ipv4(),
                QueryKind::Aaaa => ip.is_ipv6(),
                QueryKind::Other => false,
            })
            .collect();
        if ips.is_empty() {
            Lookup::NoData
        } else {
            Lookup::Records(ips)
        }
    }

    /// How many names the table holds.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the table holds no name.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// Lower case, one trailing dot removed.
fn normalize(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::model::registrar;
    use crate::model::snapshot::Service;

    fn domains() -> Domains {
        Domains {
            mesh: "aether.internal".to_owned(),
            cluster: "cluster.local".to_owned(),
        }
    }

    fn snapshot() -> Snapshot {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/mp");
        let load = crate::registry::file::load_dir(&dir).expect("the example registry loads");
        assert!(load.problems.is_empty(), "{:?}", load.problems);
        let mut snapshot = load.snapshot;
        registrar::complete_snapshot(&mut snapshot, "10.96.0.0/16".parse().unwrap());
        snapshot
    }

    fn service<'a>(s: &'a Snapshot, ns: &str, name: &str) -> &'a Service {
        s.services
            .iter()
            .find(|x| x.namespace == ns && x.name == name)
            .unwrap()
    }

    #[test]
    fn a_mesh_name_resolves_to_its_generated_services_cluster_ip() {
        let s = snapshot();
        let table = DnsTable::build(&s, &domains(), false);
        let multi = service(&s, "mp", "mp-multi");
        assert!(multi.generated);
        assert_eq!(
            table.lookup("mp-multi.mp.aether.internal", QueryKind::A),
            Lookup::Records(multi.cluster_ips.clone())
        );
    }

    #[test]
    fn lookups_ignore_case_and_a_trailing_dot() {
        let s = snapshot();
        let table = DnsTable::build(&s, &domains(), false);
        let want = table.lookup("mp-multi.mp.aether.internal", QueryKind::A);
        assert!(matches!(want, Lookup::Records(_)));
        assert_eq!(
            table.lookup("MP-Multi.mp.Aether.Internal.", QueryKind::A),
            want
        );
    }

    #[test]
    fn a_mesh_name_has_no_aaaa_record_on_an_ipv4_cluster() {
        let table = DnsTable::build(&snapshot(), &domains(), false);
        assert_eq!(
            table.lookup("mp-multi.mp.aether.internal", QueryKind::Aaaa),
            Lookup::NoData
        );
        assert_eq!(
            table.lookup("mp-multi.mp.aether.internal", QueryKind::Other),
            Lookup::NoData
        );
    }

    #[test]
    fn a_mesh_service_whose_name_a_user_service_owns_has_no_mesh_record() {
        let s = snapshot();
        assert!(!service(&s, "mp", "mp-owned").generated);
        let table = DnsTable::build(&s, &domains(), true);
        assert_eq!(
            table.lookup("mp-owned.mp.aether.internal", QueryKind::A),
            Lookup::NxDomain
        );
        // Its Kubernetes name is the user Service's (file mode).
        assert_eq!(
            table.lookup("mp-owned.mp.svc.cluster.local", QueryKind::A),
            Lookup::Records(vec!["10.96.100.10".parse().unwrap()])
        );
    }

    #[test]
    fn kubernetes_names_are_answered_only_in_file_mode() {
        let s = snapshot();
        let without = DnsTable::build(&s, &domains(), false);
        let with = DnsTable::build(&s, &domains(), true);
        let name = "mp-multi.mp.svc.cluster.local";
        assert_eq!(without.lookup(name, QueryKind::A), Lookup::NotOurs);
        assert_eq!(
            with.lookup(name, QueryKind::A),
            Lookup::Records(service(&s, "mp", "mp-multi").cluster_ips.clone())
        );
        // A user Service that fronts no mesh service.
        assert_eq!(
            with.lookup("ext-http.mp-ext.svc.cluster.local", QueryKind::A),
            Lookup::Records(vec!["10.96.200.10".parse().unwrap()])
        );
        // A user Service never gets a mesh name.
        assert_eq!(
            with.lookup("ext-http.mp-ext.aether.internal", QueryKind::A),
            Lookup::NxDomain
        );
    }

    #[test]
    fn other_names_are_not_ours() {
        let table = DnsTable::build(&snapshot(), &domains(), true);
        for name in [
            "example.com",
            "mp-multi.mp",
            "mp-multi.mp.svc",
            "mp-multi",
            "aether.internal",
        ] {
            assert_eq!(table.lookup(name, QueryKind::A), Lookup::NotOurs, "{name}");
        }
    }

    #[test]
    fn unknown_names_in_our_zones_are_nxdomain() {
        // A search-list walk must move on: `x.mp.aether.internal.mp.svc.cluster.local` is
        // NXDOMAIN, and so is an unknown mesh name.
        let with = DnsTable::build(&snapshot(), &domains(), true);
        for name in [
            "nope.mp.aether.internal",
            "mp-multi.mp.aether.internal.mp.svc.cluster.local",
            "nope.mp.svc.cluster.local.",
            "mp-multi.mp.aether.internal.cluster.local",
        ] {
            assert_eq!(with.lookup(name, QueryKind::A), Lookup::NxDomain, "{name}");
        }
        let without = DnsTable::build(&snapshot(), &domains(), false);
        assert_eq!(
            without.lookup("nope.mp.svc.cluster.local", QueryKind::A),
            Lookup::NotOurs
        );
    }

    #[test]
    fn a_headless_service_has_no_record_and_dual_stack_splits_by_family() {
        let mut s = Snapshot::default();
        let base = Service {
            namespace: "ns".to_owned(),
            name: "dual".to_owned(),
            cluster_ips: vec!["10.96.0.9".parse().unwrap(), "fd00::9".parse().unwrap()],
            headless: false,
            generated: true,
            selector: None,
            ports: Vec::new(),
        };
        s.services.push(base.clone());
        s.services.push(Service {
            name: "headless".to_owned(),
            cluster_ips: Vec::new(),
            headless: true,
            generated: false,
            ..base
        });
        let table = DnsTable::build(&s, &domains(), true);
        assert_eq!(
            table.lookup("dual.ns.aether.internal", QueryKind::Aaaa),
            Lookup::Records(vec!["fd00::9".parse().unwrap()])
        );
        assert_eq!(
            table.lookup("dual.ns.svc.cluster.local", QueryKind::A),
            Lookup::Records(vec!["10.96.0.9".parse().unwrap()])
        );
        assert_eq!(
            table.lookup("headless.ns.svc.cluster.local", QueryKind::A),
            Lookup::NxDomain
        );
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn a_name_two_services_spell_has_both_addresses_in_the_services_order() {
        // Kubernetes names are lowered: `Echo` and `echo` of one namespace spell one name.
        let svc = |name: &str, ip: &str| Service {
            namespace: "ns".to_owned(),
            name: name.to_owned(),
            cluster_ips: vec![ip.parse().unwrap()],
            headless: false,
            generated: false,
            selector: None,
            ports: Vec::new(),
        };
        let mut s = Snapshot::default();
        s.services.push(svc("echo", "10.96.0.2"));
        s.services.push(svc("other", "10.96.0.3"));
        s.services.push(svc("Echo", "10.96.0.1"));
        s.services.push(svc("ECHO", "10.96.0.2"));
        let table = DnsTable::build(&s, &domains(), true);
        assert_eq!(
            table.lookup("echo.ns.svc.cluster.local", QueryKind::A),
            Lookup::Records(vec![
                "10.96.0.2".parse().unwrap(),
                "10.96.0.1".parse().unwrap()
            ])
        );
        assert_eq!(table.len(), 2);
    }
}
