//! Comparable verdicts and the reference evaluator (spec/model.md §13 item 5), for tests: this
//! crate's property tests and the daemon's (the `testing` feature).
//!
//! The [`evaluator`] answers connections and requests straight from a [`crate::model::Snapshot`],
//! by linear scans, as a second reading of addressing.md; the property tests in
//! `model::proptests` check that the compiled model answers the same. Both sides are reduced to
//! the plain verdicts of this module, which keep what the addressing rule decides (where a
//! request goes, or which answer it gets) and drop what only explains it (`Why`, filter
//! descriptions, pod names).

use crate::prelude::*;

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::resolve::decision::{
    ConnDecision, Fallback, HoldFor, HttpEntry, RequestDecision, SniffPlan, TcpBackend, TcpChoice,
};

pub mod evaluator;

/// A Service or mesh service, as (namespace, name).
pub type Key = (String, String);

/// What one HTTP request gets, reduced to what the addressing rule decides.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RequestVerdict {
    /// A mesh answer.
    Answer {
        /// The status code.
        status: u16,
        /// The `x-aether-error` value.
        reason: String,
        /// The body's `service:` and `ports:` lines, when the answer describes a service.
        service: Option<(String, String)>,
    },
    /// Forwarded to the dialled address outside the mesh.
    Passthrough,
    /// Held for a newer model.
    Hold(HoldKind),
    /// A redirect a route rule configures.
    Redirect,
    /// Delivered to a mesh service's endpoints.
    Deliver {
        /// The Service the request was addressed to (`None` for a pod-IP dial).
        addressed: Option<Key>,
        /// The front port it was addressed on.
        front_port: u16,
        /// The backend Service (or the dialled pod's mesh service).
        backend: Key,
        /// The pod port.
        pod_port: u16,
        /// The endpoint addresses, sorted.
        endpoints: Vec<IpAddr>,
    },
}

/// What a hold waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum HoldKind {
    /// A mesh-domain name the node knows no ports of.
    UnknownName,
    /// An endpoint of the chosen port.
    Endpoints,
}

/// One raw-TCP destination, reduced.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TcpVerdict {
    /// Deliver to these endpoints.
    Target {
        /// The Service (or the pod's mesh service).
        service: Key,
        /// The port the client reached.
        port: u16,
        /// The pod port.
        pod_port: u16,
        /// The endpoint addresses, sorted.
        endpoints: Vec<IpAddr>,
    },
    /// The share of an invalid backendRef.
    Invalid,
}

/// Which kind of HTTP entry a sniffed connection leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum EntryKind {
    /// A captured dial (addressing.md §5).
    Captured,
    /// A pod-IP dial (§5.1).
    PodIp,
    /// The loopback listener (§6).
    Loopback,
    /// A captured dial to 18081 (§6).
    ProxyCaptured,
}

/// What a sniffed connection does with anything that is not HTTP or a matching ClientHello.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FallbackVerdict {
    /// Passthrough to the dialled address.
    Passthrough,
    /// Raw TCP to this set of destinations.
    Tcp(BTreeSet<TcpVerdict>),
    /// Closed.
    Close,
}

/// How a captured connection is handled at accept, reduced.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConnVerdict {
    /// Raw TCP at accept: the set of weighted destinations.
    Tcp(BTreeSet<TcpVerdict>),
    /// Passthrough at accept.
    Passthrough,
    /// Closed at accept.
    Close,
    /// Sniff first.
    Sniff {
        /// Where HTTP goes, if it is handled.
        http: Option<EntryKind>,
        /// How many TLSRoute rules are tried on a ClientHello.
        tls_rules: usize,
        /// Everything else.
        fallback: FallbackVerdict,
    },
}

fn key(k: &crate::resolve::decision::ServiceKey) -> Key {
    (k.namespace.to_string(), k.name.to_string())
}

/// The kind of an HTTP entry.
pub fn entry_kind(e: &HttpEntry) -> EntryKind {
    match e {
        HttpEntry::Captured { .. } => EntryKind::Captured,
        HttpEntry::PodIp { .. } => EntryKind::PodIp,
        HttpEntry::Loopback => EntryKind::Loopback,
        HttpEntry::ProxyCaptured { .. } => EntryKind::ProxyCaptured,
    }
}

/// Reduces a compiled request decision.
pub fn verdict_of(d: &RequestDecision) -> RequestVerdict {
    match d {
        RequestDecision::Answer(a, _) => RequestVerdict::Answer {
            status: a.reason.status(),
            reason: a.reason.code().to_owned(),
            service: a
                .service
                .as_ref()
                .map(|s| (s.name.to_string(), s.ports.to_string())),
        },
        RequestDecision::Passthrough(_) => RequestVerdict::Passthrough,
        RequestDecision::Hold(k, _) => RequestVerdict::Hold(match k {
            HoldFor::UnknownName => HoldKind::UnknownName,
            HoldFor::Endpoints => HoldKind::Endpoints,
        }),
        RequestDecision::Redirect { .. } => RequestVerdict::Redirect,
        RequestDecision::Deliver(d) => {
            let mut endpoints: Vec<IpAddr> =
                d.backend.endpoints.iter().map(|e| e.address).collect();
            endpoints.sort();
            RequestVerdict::Deliver {
                addressed: d.addressed.as_ref().map(key),
                front_port: d.front_port,
                backend: key(&d.backend.service),
                pod_port: d.backend.pod_port,
                endpoints,
            }
        }
    }
}

/// Reduces a compiled raw-TCP choice to its set of destinations.
pub fn tcp_verdicts(c: &TcpChoice) -> BTreeSet<TcpVerdict> {
    c.backends
        .iter()
        .map(|(_, b)| match b {
            TcpBackend::Target(t) => {
                let mut endpoints: Vec<IpAddr> = t.endpoints.iter().map(|e| e.address).collect();
                endpoints.sort();
                TcpVerdict::Target {
                    service: key(&t.service),
                    port: t.port,
                    pod_port: t.pod_port,
                    endpoints,
                }
            }
            TcpBackend::Invalid(_) => TcpVerdict::Invalid,
        })
        .collect()
}

fn sniff_verdict(p: &SniffPlan) -> ConnVerdict {
    ConnVerdict::Sniff {
        http: p.http.as_ref().map(entry_kind),
        tls_rules: p.tls.len(),
        fallback: match &p.otherwise {
            Fallback::Passthrough => FallbackVerdict::Passthrough,
            Fallback::Tcp(c) => FallbackVerdict::Tcp(tcp_verdicts(c)),
            Fallback::Close => FallbackVerdict::Close,
        },
    }
}

/// Reduces a compiled connection decision.
pub fn conn_verdict_of(d: &ConnDecision) -> ConnVerdict {
    match d {
        ConnDecision::Tcp(c) => ConnVerdict::Tcp(tcp_verdicts(c)),
        ConnDecision::Passthrough(_) => ConnVerdict::Passthrough,
        ConnDecision::Close(_) => ConnVerdict::Close,
        ConnDecision::Sniff(p) => sniff_verdict(p),
    }
}

/// A small deterministic generator for shuffles (splitmix64).
#[derive(Debug)]
pub struct Mix(pub u64);

impl Mix {
    /// The next number of the sequence (never ends, so not an `Iterator`).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Where two models differ, table by table and key by key (a readable failure message; the
/// `Debug` of a whole model lists its hash tables in no stable order).
pub fn model_difference(a: &crate::model::Model, b: &crate::model::Model) -> Option<String> {
    use std::fmt::Debug;
    fn table<K: Debug + Ord + std::hash::Hash + Eq + Clone, V: Debug + PartialEq>(
        what: &str,
        a: &crate::model::table::Table<K, V>,
        b: &crate::model::table::Table<K, V>,
    ) -> Option<String> {
        let keys: BTreeSet<&K> = a.keys().chain(b.keys()).collect();
        for k in keys {
            if a.get(k) != b.get(k) {
                return Some(format!(
                    "{what}[{k:?}]:\n  kept:    {:?}\n  compile: {:?}",
                    a.get(k),
                    b.get(k)
                ));
            }
        }
        None
    }
    if a.context != b.context {
        return Some(format!("context: {:?} / {:?}", a.context, b.context));
    }
    let namespaces: BTreeSet<&Box<str>> = a.names.keys().chain(b.names.keys()).collect();
    for ns in namespaces {
        match (a.names.get(ns), b.names.get(ns)) {
            (Some(x), Some(y)) => {
                if let Some(d) = table(&format!("names[{ns}]"), x, y) {
                    return Some(d);
                }
            }
            (x, y) => {
                return Some(format!(
                    "names[{ns}]: {:?} / {:?}",
                    x.map(|t| t.len()),
                    y.map(|t| t.len())
                ));
            }
        }
    }
    table("cluster_ips", &a.cluster_ips, &b.cluster_ips)
        .or_else(|| table("pod_ips", &a.pod_ips, &b.pod_ips))
        .or_else(|| table("l4", &a.l4, &b.l4))
        .or_else(|| table("service_filters", &a.service_filters, &b.service_filters))
        .or_else(|| table("classes", &a.classes, &b.classes))
        .or_else(|| (a.pods != b.pods).then(|| format!("pods:\n  {:?}\n  {:?}", a.pods, b.pods)))
        .or_else(|| {
            (a.statuses != b.statuses)
                .then(|| format!("statuses:\n  {:?}\n  {:?}", a.statuses, b.statuses))
        })
        .or_else(|| {
            (a.diagnostics != b.diagnostics)
                .then(|| format!("diagnostics:\n  {:?}\n  {:?}", a.diagnostics, b.diagnostics))
        })
        .or_else(|| (a != b).then(|| "the models differ outside the tables compared".to_owned()))
}
