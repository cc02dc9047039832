//! Pod annotations, registry rows and `RowProblem` (spec/model.md §2, §3).
//!
//! One parser turns a pod's annotations into the ports it declares; every backend and the
//! registration path use it. One function, [`row_problem`], says whether a stored row may be
//! served; it is enforced on write, on listing and on consumption.
//!
//! Layer 0 (pure).

use crate::prelude::*;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::port::{DEFAULT_DECLARED_PORT, PortProtocol};
use crate::model::snapshot::{ProtocolValue, Row};

/// `endpoint.aether.io/ports`.
pub const ANNOTATION_PORTS: &str = "endpoint.aether.io/ports";
/// `endpoint.aether.io/protocol`.
pub const ANNOTATION_PROTOCOL: &str = "endpoint.aether.io/protocol";
/// `endpoint.aether.io/port`.
pub const ANNOTATION_PORT: &str = "endpoint.aether.io/port";
/// `capture.aether.io/redirect-all`.
pub const ANNOTATION_REDIRECT_ALL: &str = "capture.aether.io/redirect-all";
/// `capture.aether.io/exclude-outbound-ports`.
pub const ANNOTATION_EXCLUDE_PORTS: &str = "capture.aether.io/exclude-outbound-ports";
/// `capture.aether.io/exclude-outbound-ip-ranges`.
pub const ANNOTATION_EXCLUDE_RANGES: &str = "capture.aether.io/exclude-outbound-ip-ranges";
/// `aether.io/managed`.
pub const ANNOTATION_MANAGED: &str = "aether.io/managed";
/// `aether.io/netns` (file registry: the pod's network namespace).
pub const ANNOTATION_NETNS: &str = "aether.io/netns";
/// `aether.io/netns-from` (file registry): `cni` when the daemon learns the pod's network
/// namespace from a CNI ADD alone.
pub const ANNOTATION_NETNS_FROM: &str = "aether.io/netns-from";
/// `inbound.aether.io/mode`: `strict` or `permissive` (model.md §12.5 item 3).
pub const ANNOTATION_INBOUND_MODE: &str = "inbound.aether.io/mode";
/// The label on every generated Service.
pub const LABEL_MESH_SERVICE: &str = "aether.io/mesh-service";

/// The ports one pod declares, each with its protocol (spec/model.md §2, port derivation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeclaredPorts {
    /// The declared (liveness) port: `endpoint.aether.io/port`, or 8080.
    pub port: u16,
    /// Every declared port with its protocol; includes `port`.
    pub protocols: BTreeMap<u16, PortProtocol>,
}

/// Why a pod's annotations cannot be parsed (`annotation-unparseable`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidAnnotation {
    /// An entry of `endpoint.aether.io/ports` is not a port number.
    #[error("{ANNOTATION_PORTS}: entry {entry:?} is not a port number in 1-65535")]
    BadPortEntry {
        /// The entry as written.
        entry: String,
    },
    /// A suffix is not `http`, `tcp` or `udp`.
    #[error(
        "{ANNOTATION_PORTS}: entry {entry:?} has protocol {suffix:?}; expected http, tcp or udp"
    )]
    BadSuffix {
        /// The entry as written.
        entry: String,
        /// The suffix.
        suffix: String,
    },
    /// The same number appears twice with different protocols.
    #[error("{ANNOTATION_PORTS}: port {port} is declared both {first} and {second}")]
    ConflictingDuplicate {
        /// The port.
        port: u16,
        /// The first protocol.
        first: PortProtocol,
        /// The second protocol.
        second: PortProtocol,
    },
    /// `endpoint.aether.io/protocol` is not a known protocol.
    #[error("{ANNOTATION_PROTOCOL}: {value:?} is not one of http, tcp, udp")]
    BadProtocol {
        /// The value.
        value: String,
    },
    /// `endpoint.aether.io/port` is not a port number.
    #[error("{ANNOTATION_PORT}: {value:?} is not a port number in 1-65535")]
    BadPort {
        /// The value.
        value: String,
    },
}

/// Parses a port number exactly: 1–65535, ASCII digits only (surrounding whitespace ignored).
fn parse_port_number(s: &str) -> Option<u16> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match s.parse::<u32>() {
        Ok(n @ 1..=65535) => u16::try_from(n).ok(),
        _ => None,
    }
}

/// Derives the ports a pod declares from its annotations (spec/model.md §2).
///
/// The whole pod is refused on any bad value; an invalid pod-level value is never replaced by
/// its default.
pub fn parse_declared_ports(
    annotations: &BTreeMap<String, String>,
) -> Result<DeclaredPorts, InvalidAnnotation> {
    parse_declared_ports_with(|key| annotations.get(key).map(String::as_str))
}

/// [`parse_declared_ports`] of the annotations `annotation` gives by key.
pub fn parse_declared_ports_with<'a>(
    annotation: impl Fn(&str) -> Option<&'a str>,
) -> Result<DeclaredPorts, InvalidAnnotation> {
    let default = match annotation(ANNOTATION_PROTOCOL) {
        None => PortProtocol::Http,
        Some(v) => PortProtocol::parse(v.trim()).ok_or_else(|| InvalidAnnotation::BadProtocol {
            value: v.to_owned(),
        })?,
    };
    let port = match annotation(ANNOTATION_PORT) {
        None => DEFAULT_DECLARED_PORT,
        Some(v) => parse_port_number(v).ok_or_else(|| InvalidAnnotation::BadPort {
            value: v.to_owned(),
        })?,
    };

    let mut listed: BTreeMap<u16, PortProtocol> = BTreeMap::new();
    if let Some(list) = annotation(ANNOTATION_PORTS) {
        for entry in list.split(',').map(str::trim) {
            if entry.is_empty() && list.trim().is_empty() {
                // An empty annotation lists nothing.
                continue;
            }
            let (number, protocol) = match entry.split_once('=') {
                Some((n, s)) => {
                    let suffix = s.trim();
                    let p = PortProtocol::parse(suffix).ok_or_else(|| {
                        InvalidAnnotation::BadSuffix {
                            entry: entry.to_owned(),
                            suffix: suffix.to_owned(),
                        }
                    })?;
                    (n, p)
                }
                None => (entry, default),
            };
            let number =
                parse_port_number(number).ok_or_else(|| InvalidAnnotation::BadPortEntry {
                    entry: entry.to_owned(),
                })?;
            if let Some(&first) = listed.get(&number)
                && first != protocol
            {
                return Err(InvalidAnnotation::ConflictingDuplicate {
                    port: number,
                    first,
                    second: protocol,
                });
            }
            listed.insert(number, protocol);
        }
    }
    // The declared port repeating a listed entry takes that entry's protocol.
    listed.entry(port).or_insert(default);
    Ok(DeclaredPorts {
        port,
        protocols: listed,
    })
}

impl DeclaredPorts {
    /// The registry row these ports make for one pod.
    pub fn to_row(
        &self,
        namespace: &str,
        service: &str,
        address: std::net::IpAddr,
        ready: bool,
    ) -> Row {
        // Inserted one by one: `collect` into a B-tree buffers and sorts first, which for the
        // few ports of a pod cost more than the inserts (every pod, every reload).
        let mut port_protocols = BTreeMap::new();
        for (&p, &proto) in &self.protocols {
            port_protocols.insert(u32::from(p), ProtocolValue::Known(proto));
        }
        Row {
            namespace: namespace.to_owned(),
            service: service.to_owned(),
            address,
            port: u32::from(self.port),
            ports: self.protocols.keys().map(|&p| u32::from(p)).collect(),
            port_protocols: Some(port_protocols),
            ready,
            pod: None,
            node: None,
        }
    }
}

/// Why a row must not be served (spec/model.md §3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RowProblem {
    /// The map is absent or empty.
    PortProtocolsMissing,
    /// A listed port has no entry in the map, or an unspecified or unknown one.
    PortWithoutProtocol,
    /// The map names a port the row does not list.
    ProtocolForUnlistedPort,
    /// A port is 0 or above 65535.
    InvalidPort,
    /// (Kubernetes backend) the pod's annotations cannot be parsed.
    AnnotationUnparseable,
}

impl RowProblem {
    /// Every reason, for tables and counters.
    pub const ALL: [Self; 5] = [
        Self::PortProtocolsMissing,
        Self::PortWithoutProtocol,
        Self::ProtocolForUnlistedPort,
        Self::InvalidPort,
        Self::AnnotationUnparseable,
    ];

    /// The reason's stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PortProtocolsMissing => "port-protocols-missing",
            Self::PortWithoutProtocol => "port-without-protocol",
            Self::ProtocolForUnlistedPort => "protocol-for-unlisted-port",
            Self::InvalidPort => "invalid-port",
            Self::AnnotationUnparseable => "annotation-unparseable",
        }
    }
}

impl fmt::Display for RowProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The one definition of a row that must not be served (spec/model.md §3.3).
pub fn row_problem(row: &Row) -> Option<RowProblem> {
    let valid = |p: u32| (1..=65535).contains(&p);
    if !valid(row.port) || row.ports.iter().any(|&p| !valid(p)) {
        return Some(RowProblem::InvalidPort);
    }
    let map = match &row.port_protocols {
        Some(m) if !m.is_empty() => m,
        _ => return Some(RowProblem::PortProtocolsMissing),
    };
    // One walk of the map (it was walked twice and searched once per listed port): every listed
    // port has a protocol when the listed keys with a known protocol are as many as the
    // distinct listed ports.
    let listed = |p: u32| p == row.port || row.ports.contains(&p);
    let mut known = 0;
    let mut unlisted = false;
    for (&p, v) in map {
        if !valid(p) {
            return Some(RowProblem::InvalidPort);
        }
        if !listed(p) {
            unlisted = true;
        } else if matches!(v, ProtocolValue::Known(_)) {
            known += 1;
        }
    }
    if known != distinct_listed(row) {
        return Some(RowProblem::PortWithoutProtocol);
    }
    if unlisted {
        return Some(RowProblem::ProtocolForUnlistedPort);
    }
    None
}

/// How many distinct ports `row` lists (its declared port and its ports).
fn distinct_listed(row: &Row) -> usize {
    let ports = &row.ports;
    let declared = usize::from(!ports.contains(&row.port));
    if ports.len() <= 16 {
        // A pod lists a few ports: comparing each with those before it allocates nothing.
        declared
            + (0..ports.len())
                .filter(|&i| !ports[..i].contains(&ports[i]))
                .count()
    } else {
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        declared + sorted.len()
    }
}

/// A served row's ports and protocols, read after [`row_problem`] found nothing.
pub fn served_protocols(row: &Row) -> PortProtocols {
    let mut out = Vec::new();
    if let Some(map) = &row.port_protocols {
        out.reserve_exact(map.len());
        // The map ascends by port, and so does the list.
        for (&p, v) in map {
            if let (Ok(p), ProtocolValue::Known(proto)) = (u16::try_from(p), v) {
                out.push((p, *proto));
            }
        }
    }
    PortProtocols(out)
}

/// A served row's ports and their protocols, ascending by port without repeats: a list where
/// a `BTreeMap` was (every row of every reload made one, for the few ports a pod declares; the
/// list is one allocation and a search by halves).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortProtocols(Vec<(u16, PortProtocol)>);

impl PortProtocols {
    /// The protocol of `port`.
    pub fn get(&self, port: &u16) -> Option<&PortProtocol> {
        self.0
            .binary_search_by_key(port, |&(p, _)| p)
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// Takes `port` out.
    pub fn remove(&mut self, port: &u16) -> Option<PortProtocol> {
        let i = self.0.binary_search_by_key(port, |&(p, _)| p).ok()?;
        Some(self.0.remove(i).1)
    }

    /// The ports and their protocols, ascending.
    pub fn iter(&self) -> PortProtocolsIter<'_> {
        self.0.iter().map(|(p, v)| (p, v))
    }

    /// The ports, ascending.
    pub fn keys(&self) -> impl Iterator<Item = &u16> {
        self.0.iter().map(|(p, _)| p)
    }

    /// The protocols, by ascending port.
    pub fn values(&self) -> impl Iterator<Item = &PortProtocol> {
        self.0.iter().map(|(_, v)| v)
    }

    /// How many ports.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// No port at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The iterator of [`PortProtocols::iter`].
pub type PortProtocolsIter<'a> = std::iter::Map<
    std::slice::Iter<'a, (u16, PortProtocol)>,
    fn(&'a (u16, PortProtocol)) -> (&'a u16, &'a PortProtocol),
>;

impl<'a> IntoIterator for &'a PortProtocols {
    type Item = (&'a u16, &'a PortProtocol);
    type IntoIter = PortProtocolsIter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl IntoIterator for PortProtocols {
    type Item = (u16, PortProtocol);
    type IntoIter = std::vec::IntoIter<(u16, PortProtocol)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// `ListEndpoints(service, protocol)` (spec/model.md §3.4): every served row of the service that
/// declares at least one port with `protocol`. The listing is a key space only: a port's class is
/// read from the row's `port_protocols`, never from the listing the row was found in.
pub fn list_endpoints<'r>(
    rows: &'r [Row],
    namespace: &str,
    service: &str,
    protocol: PortProtocol,
) -> Vec<&'r Row> {
    rows.iter()
        .filter(|r| r.namespace == namespace && r.service == service)
        .filter(|r| row_problem(r).is_none())
        .filter(|r| served_protocols(r).values().any(|&p| p == protocol))
        .collect()
}

/// Merges several listings into one set of rows, de-duplicated per (namespace, service,
/// address) as every consumer of more than one listing must (spec/model.md §3.4). The first
/// listing's copy of a row is kept.
pub fn merge_listings<'r>(listings: &[Vec<&'r Row>]) -> Vec<&'r Row> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for row in listings.iter().flatten() {
        if seen.insert((row.namespace.as_str(), row.service.as_str(), row.address)) {
            out.push(*row);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn ports(d: &DeclaredPorts) -> Vec<(u16, &'static str)> {
        d.protocols
            .iter()
            .map(|(&p, proto)| (p, proto.as_str()))
            .collect()
    }

    #[test]
    fn no_annotations_declare_8080_http() {
        let d = parse_declared_ports(&ann(&[])).unwrap();
        assert_eq!(d.port, 8080);
        assert_eq!(ports(&d), vec![(8080, "http")]);
    }

    #[test]
    fn unsuffixed_entries_take_the_pod_level_default() {
        let d = parse_declared_ports(&ann(&[
            (ANNOTATION_PROTOCOL, "tcp"),
            (ANNOTATION_PORT, "9000"),
            (ANNOTATION_PORTS, "8080=http, 7000"),
        ]))
        .unwrap();
        assert_eq!(
            ports(&d),
            vec![(7000, "tcp"), (8080, "http"), (9000, "tcp")]
        );
    }

    #[test]
    fn declared_port_repeating_an_entry_takes_the_entry_suffix() {
        let d = parse_declared_ports(&ann(&[
            (ANNOTATION_PROTOCOL, "http"),
            (ANNOTATION_PORT, "8080"),
            (ANNOTATION_PORTS, "8080=tcp"),
        ]))
        .unwrap();
        assert_eq!(ports(&d), vec![(8080, "tcp")]);
    }

    #[test]
    fn every_bad_shape_refuses_the_whole_pod() {
        let cases: &[&[(&str, &str)]] = &[
            &[(ANNOTATION_PORTS, "0")],
            &[(ANNOTATION_PORTS, "65536")],
            &[(ANNOTATION_PORTS, "80,abc")],
            &[(ANNOTATION_PORTS, "80=grpc")],
            &[(ANNOTATION_PORTS, "80=http,80=tcp")],
            &[(ANNOTATION_PORTS, "80,,90")],
            &[(ANNOTATION_PORTS, "+80")],
            &[(ANNOTATION_PROTOCOL, "grpc")],
            &[(ANNOTATION_PROTOCOL, "HTTP")],
            &[(ANNOTATION_PORT, "abc")],
            &[(ANNOTATION_PORT, "")],
        ];
        for case in cases {
            assert!(
                parse_declared_ports(&ann(case)).is_err(),
                "{case:?} must be refused"
            );
        }
    }

    #[test]
    fn a_repeated_entry_with_the_same_protocol_is_not_a_conflict() {
        let d = parse_declared_ports(&ann(&[(ANNOTATION_PORTS, "9090, 9090=http")])).unwrap();
        assert_eq!(ports(&d), vec![(8080, "http"), (9090, "http")]);
    }

    fn row(port: u32, ports: &[u32], map: Option<&[(u32, ProtocolValue)]>) -> Row {
        Row {
            namespace: "ns".into(),
            service: "svc".into(),
            address: "10.0.0.1".parse().unwrap(),
            port,
            ports: ports.to_vec(),
            port_protocols: map.map(|m| m.iter().cloned().collect()),
            ready: true,
            pod: None,
            node: None,
        }
    }

    #[test]
    fn served_protocols_ascend_by_port_and_leave_out_what_is_not_known() {
        use PortProtocol::{Http, Tcp, Udp};
        let r = row(
            8080,
            &[9090, 80, 8080, 53, 7000],
            Some(&[
                (9090, ProtocolValue::Known(Tcp)),
                (80, ProtocolValue::Known(Http)),
                (8080, ProtocolValue::Known(Http)),
                (53, ProtocolValue::Known(Udp)),
                (7000, ProtocolValue::Unknown("sctp".into())),
            ]),
        );
        let mut p = served_protocols(&r);
        let all: Vec<(u16, PortProtocol)> = p.iter().map(|(&k, &v)| (k, v)).collect();
        assert_eq!(all, [(53, Udp), (80, Http), (8080, Http), (9090, Tcp)]);
        assert_eq!(p.get(&9090), Some(&Tcp));
        assert_eq!(p.get(&7000), None);
        assert_eq!(p.get(&81), None);
        assert_eq!(p.remove(&80), Some(Http));
        assert_eq!(p.remove(&80), None);
        assert_eq!(p.keys().copied().collect::<Vec<_>>(), [53, 8080, 9090]);
        assert_eq!(p.len(), 3);
        assert!(served_protocols(&row(80, &[80], None)).is_empty());
    }

    #[test]
    fn row_problem_names_each_reason() {
        use ProtocolValue::*;
        let http = Known(PortProtocol::Http);
        assert_eq!(
            row_problem(&row(8080, &[8080], Some(&[(8080, http.clone())]))),
            None
        );
        assert_eq!(
            row_problem(&row(8080, &[8080], None)),
            Some(RowProblem::PortProtocolsMissing)
        );
        assert_eq!(
            row_problem(&row(8080, &[8080], Some(&[]))),
            Some(RowProblem::PortProtocolsMissing)
        );
        assert_eq!(
            row_problem(&row(8080, &[8080, 9090], Some(&[(8080, http.clone())]))),
            Some(RowProblem::PortWithoutProtocol)
        );
        assert_eq!(
            row_problem(&row(8080, &[8080], Some(&[(8080, Unspecified)]))),
            Some(RowProblem::PortWithoutProtocol)
        );
        assert_eq!(
            row_problem(&row(8080, &[8080], Some(&[(8080, Unknown("grpc".into()))]))),
            Some(RowProblem::PortWithoutProtocol)
        );
        assert_eq!(
            row_problem(&row(
                8080,
                &[8080],
                Some(&[(8080, http.clone()), (9090, http.clone())])
            )),
            Some(RowProblem::ProtocolForUnlistedPort)
        );
        assert_eq!(
            row_problem(&row(70000, &[70000], Some(&[(70000, http)]))),
            Some(RowProblem::InvalidPort)
        );
    }

    /// The checks of spec/model.md §3.3 written out one by one, in their order.
    fn plain_row_problem(row: &Row) -> Option<RowProblem> {
        let listed: Vec<u32> = std::iter::once(row.port).chain(row.ports.clone()).collect();
        let in_range = |p: &u32| (1..=65535).contains(p);
        let map = row.port_protocols.clone().unwrap_or_default();
        let known = |p: &u32| matches!(map.get(p), Some(ProtocolValue::Known(_)));
        let checks = [
            (!listed.iter().all(in_range), RowProblem::InvalidPort),
            (map.is_empty(), RowProblem::PortProtocolsMissing),
            (!map.keys().all(in_range), RowProblem::InvalidPort),
            (!listed.iter().all(known), RowProblem::PortWithoutProtocol),
            (
                !map.keys().all(|p| listed.contains(p)),
                RowProblem::ProtocolForUnlistedPort,
            ),
        ];
        checks.into_iter().find(|(fails, _)| *fails).map(|(_, p)| p)
    }

    proptest::proptest! {
        /// The one walk finds what the checks one by one find, repeated and unlisted ports,
        /// ports out of range and long lists included.
        #[test]
        fn row_problem_is_the_plain_check(
            port in proptest::sample::select(vec![0u32, 80, 8080, 9090, 70000]),
            ports in proptest::collection::vec(
                proptest::sample::select(vec![80u32, 8080, 9090, 53, 7000]),
                0..24,
            ),
            map in proptest::option::of(proptest::collection::btree_map(
                proptest::sample::select(vec![0u32, 80, 8080, 9090, 53, 7000, 70000]),
                proptest::sample::select(vec![
                    ProtocolValue::Known(PortProtocol::Http),
                    ProtocolValue::Known(PortProtocol::Tcp),
                    ProtocolValue::Unspecified,
                    ProtocolValue::Unknown("grpc".into()),
                ]),
                0..5,
            )),
        ) {
            let mut r = row(port, &ports, None);
            r.port_protocols = map;
            proptest::prop_assert_eq!(row_problem(&r), plain_row_problem(&r));
        }
    }

    #[test]
    fn a_mixed_pod_is_listed_under_each_protocol_and_merged_once() {
        let ann_mixed = ann(&[(ANNOTATION_PORTS, "9000=tcp")]);
        let mixed = parse_declared_ports(&ann_mixed).unwrap().to_row(
            "mp",
            "mp-mixed",
            "10.0.0.1".parse().unwrap(),
            true,
        );
        let http_only = parse_declared_ports(&ann(&[])).unwrap().to_row(
            "mp",
            "mp-mixed",
            "10.0.0.2".parse().unwrap(),
            true,
        );
        let mut bad = mixed.clone();
        bad.address = "10.0.0.3".parse().unwrap();
        bad.port_protocols = None;
        let rows = vec![mixed, http_only, bad];
        let http = list_endpoints(&rows, "mp", "mp-mixed", PortProtocol::Http);
        let tcp = list_endpoints(&rows, "mp", "mp-mixed", PortProtocol::Tcp);
        let addrs = |l: &[&Row]| l.iter().map(|r| r.address.to_string()).collect::<Vec<_>>();
        assert_eq!(addrs(&http), vec!["10.0.0.1", "10.0.0.2"]);
        assert_eq!(addrs(&tcp), vec!["10.0.0.1"]);
        assert!(list_endpoints(&rows, "mp", "mp-mixed", PortProtocol::Udp).is_empty());
        let merged = merge_listings(&[tcp, http]);
        assert_eq!(addrs(&merged), vec!["10.0.0.1", "10.0.0.2"]);
        // The class comes from the row, whichever listing it was found in.
        assert_eq!(
            served_protocols(merged[0]).get(&8080),
            Some(&PortProtocol::Http)
        );
    }

    #[test]
    fn every_parsed_pod_makes_a_row_that_names_every_port() {
        let shapes: &[&[(&str, &str)]] = &[
            &[],
            &[(ANNOTATION_PORTS, "9090")],
            &[(ANNOTATION_PORTS, "9000=tcp"), (ANNOTATION_PORT, "8080")],
            &[
                (ANNOTATION_PROTOCOL, "tcp"),
                (ANNOTATION_PORT, "9000"),
                (ANNOTATION_PORTS, "8080=http"),
            ],
            &[
                (ANNOTATION_PROTOCOL, "http"),
                (ANNOTATION_PORT, "8080"),
                (ANNOTATION_PORTS, "8080=tcp"),
            ],
            &[(ANNOTATION_PROTOCOL, "udp"), (ANNOTATION_PORT, "5353")],
        ];
        for shape in shapes {
            let d = parse_declared_ports(&ann(shape)).unwrap();
            let r = d.to_row("ns", "svc", "10.0.0.1".parse().unwrap(), true);
            assert_eq!(row_problem(&r), None, "{shape:?}");
            assert!(r.ports.contains(&r.port));
        }
    }
}
