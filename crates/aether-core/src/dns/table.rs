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

use crate::prelude::*;

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
