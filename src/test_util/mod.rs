//! Test helpers: comparable verdicts and the reference evaluator (spec/model.md §13 item 5).
//!
//! Compiled only for tests and under the `testing` feature. Nothing here is used by the
//! daemon. The [`reference`](mod@reference) module answers connections and requests straight from a
//! [`crate::model::Snapshot`], by linear scans, as a second reading of addressing.md; the
//! property tests in `model::proptests` check that the compiled model answers the same.
//!
//! Both sides are reduced to the plain verdicts of this module, which keep what the
//! addressing rule decides (where a request goes, or which answer it gets) and drop what only
//! explains it (`Why`, filter descriptions, pod names).

pub mod fds;
pub mod golden;
// tower-test is a dev-dependency: only the library's own unit tests have it.
#[cfg(test)]
pub mod kube_mock;
pub mod needs_root;
pub mod reference;

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::resolve::decision::{
    ConnDecision, Fallback, HoldFor, HttpEntry, RequestDecision, SniffPlan, TcpBackend, TcpChoice,
};

/// A mesh hop TLS for tests that open no hop: no server configuration, no peer.
#[derive(Debug)]
pub struct NoTls;

impl crate::proxy::HopTls for NoTls {
    fn client(&self, _: &str, _: &str, _: &[u8]) -> std::sync::Arc<rustls::ClientConfig> {
        unreachable!("this test opens no mesh hop")
    }
    fn server(&self, _: &str, _: &str) -> Option<std::sync::Arc<rustls::ServerConfig>> {
        None
    }
    fn peer(&self, _: &[rustls::pki_types::CertificateDer<'_>]) -> Option<crate::proxy::Peer> {
        None
    }
}

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

/// The acceptance fixture (`config/examples/mp`) as the daemon holds it: read by the file
/// registry, the registrar's generated Services added (service CIDR `10.96.0.0/16`).
///
/// # Panics
/// When the fixture does not load (a test helper).
#[allow(clippy::unwrap_used)]
pub fn mp_fixture() -> crate::model::Snapshot {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut snapshot = crate::registry::file::load_dir(&root.join("config/examples/mp"))
        .unwrap()
        .snapshot;
    crate::model::registrar::complete_snapshot(&mut snapshot, "10.96.0.0/16".parse().unwrap());
    snapshot
}

/// The CPU time the calling thread has spent, in microseconds: a bound on work that must be
/// cheap (a refusal), unmoved by other threads' load.
pub fn thread_cpu_micros() -> i64 {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD)
        .expect("getrusage");
    let (user, system) = (usage.user_time(), usage.system_time());
    (user.tv_sec() + system.tv_sec()) * 1_000_000 + user.tv_usec() + system.tv_usec()
}
