//! The etcd registry's key and value format, version 1 (docs/etcd.md): pure, both ways.
//!
//! A node registers each of its pods once per distinct protocol among the pod's ports
//! (spec/model.md §3.4): one key a protocol, every copy holding the whole row. Keys are
//!
//! ```text
//! <prefix>/v1/endpoints/<namespace>/<service>/protocols/<P>/<address>
//! ```
//!
//! with `<P>` one of `HTTP`, `TCP`, `UDP` and `<address>` the pod IP in its canonical text form.
//! The value is one JSON object ([`Value`]) with a schema number. Mirrored keys are replayed
//! verbatim between regions, so this format never changes: a new one gets a new version segment.
//!
//! The key names the row (namespace, service, address); the value holds the rest. A key or value
//! that does not read is a [`Refusal`], as is a row that fails the one check of spec/model.md §3.3
//! ([`row_problem`]): on write ([`encode`]) and when the store is listed ([`decode`]).

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::model::port::PortProtocol;
use crate::model::rows::{RowProblem, row_problem};
use crate::model::snapshot::{ProtocolValue, Row};

/// The version segment of every key this build reads and writes.
pub const FORMAT: &str = "v1";

/// The value schema this build reads and writes.
pub const SCHEMA: u32 = 1;

/// The store's spelling of a protocol, in keys and in `port_protocols`.
pub fn protocol_name(p: PortProtocol) -> &'static str {
    match p {
        PortProtocol::Http => "HTTP",
        PortProtocol::Tcp => "TCP",
        PortProtocol::Udp => "UDP",
    }
}

/// The store's "unspecified" protocol value: a row holding it for a listed port is refused
/// (`port-without-protocol`).
pub const UNSPECIFIED: &str = "UNSPECIFIED";

fn parse_protocol(s: &str) -> Option<PortProtocol> {
    PortProtocol::ALL
        .into_iter()
        .find(|&p| protocol_name(p) == s)
}

/// Every key of the registry starts with this (`<prefix>/v1/endpoints/`): the range a node lists
/// and watches.
pub fn endpoints_prefix(prefix: &str) -> String {
    format!("{prefix}/{FORMAT}/endpoints/")
}

/// Whether `prefix` can begin keys: it starts with `/`, does not end with one, and has no empty
/// segment. `/aether` is the default.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if !prefix.starts_with('/') {
        return Err(format!("{prefix:?} does not start with '/'"));
    }
    if prefix.len() > 1 && prefix.ends_with('/') {
        return Err(format!("{prefix:?} ends with '/'"));
    }
    if prefix.len() > 1 && prefix[1..].split('/').any(str::is_empty) {
        return Err(format!("{prefix:?} has an empty segment"));
    }
    if prefix == "/" {
        return Err("the prefix is '/' alone; give it a name, such as /aether".into());
    }
    Ok(())
}

/// What one key names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointKey {
    /// The pod's namespace.
    pub namespace: String,
    /// The mesh service (the pod's ServiceAccount).
    pub service: String,
    /// The listing the key is in. Only the listing: a port's class is read from the row's
    /// `port_protocols` (spec/model.md §3.4).
    pub protocol: PortProtocol,
    /// The pod IP.
    pub address: IpAddr,
}

impl EndpointKey {
    /// The key's text under `prefix`.
    pub fn render(&self, prefix: &str) -> String {
        format!(
            "{}{}/{}/protocols/{}/{}",
            endpoints_prefix(prefix),
            self.namespace,
            self.service,
            protocol_name(self.protocol),
            self.address
        )
    }

    /// Reads a key under `prefix`.
    pub fn parse(prefix: &str, key: &[u8]) -> Result<Self, Refusal> {
        let bad = |why: &str| Refusal::KeyMalformed(why.to_owned());
        let key = std::str::from_utf8(key).map_err(|_| bad("not UTF-8"))?;
        let rest = key
            .strip_prefix(&endpoints_prefix(prefix))
            .ok_or_else(|| bad("not under the endpoints prefix"))?;
        let segments: Vec<&str> = rest.split('/').collect();
        let [namespace, service, protocols, protocol, address] = segments[..] else {
            return Err(bad(
                "not <namespace>/<service>/protocols/<P>/<address> after the prefix",
            ));
        };
        if protocols != "protocols" {
            return Err(bad("no /protocols/<P>/ segment"));
        }
        check_name("namespace", namespace).map_err(|e| bad(&e))?;
        check_name("service", service).map_err(|e| bad(&e))?;
        let protocol = parse_protocol(protocol)
            .ok_or_else(|| bad("the protocol segment is not HTTP, TCP or UDP"))?;
        let parsed: IpAddr = address
            .parse()
            .map_err(|_| bad("the last segment is not an IP address"))?;
        // One pod, one key: an address spelled otherwise than its canonical form would make a
        // second key for the same row.
        if parsed.to_string() != address {
            return Err(bad("the address is not in its canonical form"));
        }
        Ok(Self {
            namespace: namespace.to_owned(),
            service: service.to_owned(),
            protocol,
            address: parsed,
        })
    }
}

/// A namespace or service as a key segment: a Kubernetes name (lower-case letters, digits,
/// `-` and `.`, at most 253 characters).
fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("the {what} is empty"));
    }
    if name.len() > 253 {
        return Err(format!("the {what} is longer than 253 characters"));
    }
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    if !name.chars().all(ok) {
        return Err(format!(
            "the {what} {name:?} is not a Kubernetes name (a-z, 0-9, '-', '.')"
        ));
    }
    Ok(())
}

/// The value of one key, schema 1. Every field is required but `pod` and `node`; a field this
/// schema does not have is refused, never dropped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Value {
    /// The schema number ([`SCHEMA`]).
    pub schema: u32,
    /// The declared (liveness) port.
    pub port: u32,
    /// Every port the pod declares, `port` included.
    pub ports: Vec<u32>,
    /// The protocol of each listed port: `HTTP`, `TCP` or `UDP` by port number (a JSON object's
    /// keys are strings). `null` or absent is a row with no map (refused on listing:
    /// `port-protocols-missing`).
    #[serde(default)]
    pub port_protocols: Option<BTreeMap<String, String>>,
    /// The last delegated probe of the pod's liveness port succeeded (spec/model.md §3.5, §14).
    pub ready: bool,
    /// The pod's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The node that registered the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Why a key of the registry is not served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The key does not read as an endpoint key of this format.
    KeyMalformed(String),
    /// The value is not a schema-1 JSON object.
    ValueMalformed(String),
    /// The value names a schema this build does not read.
    SchemaUnsupported(u32),
    /// The row fails the check of spec/model.md §3.3.
    Row(RowProblem),
}

impl Refusal {
    /// The reason's stable name, for the refusal counter's label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::KeyMalformed(_) => "key-malformed",
            Self::ValueMalformed(_) => "value-malformed",
            Self::SchemaUnsupported(_) => "schema-unsupported",
            Self::Row(p) => p.as_str(),
        }
    }

    /// Every reason name, for counters that start at zero.
    pub fn reasons() -> impl Iterator<Item = &'static str> {
        ["key-malformed", "value-malformed", "schema-unsupported"]
            .into_iter()
            .chain(RowProblem::ALL.into_iter().map(RowProblem::as_str))
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::KeyMalformed(why) => write!(f, "key-malformed: {why}"),
            Self::ValueMalformed(why) => write!(f, "value-malformed: {why}"),
            Self::SchemaUnsupported(n) => write!(
                f,
                "schema-unsupported: the value's schema is {n}, this build reads {SCHEMA}"
            ),
            Self::Row(p) => write!(f, "{p} (spec/model.md §3.3)"),
        }
    }
}

/// Reads one key and its value as a row: refused when either does not read, or when the row
/// fails the check of spec/model.md §3.3.
pub fn decode(prefix: &str, key: &[u8], value: &[u8]) -> Result<(EndpointKey, Row), Refusal> {
    let key = EndpointKey::parse(prefix, key)?;
    // The schema first, so that a later schema is named as such rather than as a bad value.
    let raw: serde_json::Value =
        serde_json::from_slice(value).map_err(|e| Refusal::ValueMalformed(e.to_string()))?;
    match raw.get("schema").and_then(serde_json::Value::as_u64) {
        Some(n) if n == u64::from(SCHEMA) => {}
        Some(n) => {
            return Err(Refusal::SchemaUnsupported(
                u32::try_from(n).unwrap_or(u32::MAX),
            ));
        }
        None => {
            return Err(Refusal::ValueMalformed(
                "no numeric \"schema\" field".to_owned(),
            ));
        }
    }
    let value: Value =
        serde_json::from_value(raw).map_err(|e| Refusal::ValueMalformed(e.to_string()))?;
    let port_protocols = match value.port_protocols {
        None => None,
        Some(map) => {
            let mut out = BTreeMap::new();
            for (port, protocol) in map {
                let port: u32 = port.parse().map_err(|_| {
                    Refusal::ValueMalformed(format!(
                        "port_protocols has the key {port:?}, not a port number"
                    ))
                })?;
                let protocol = match parse_protocol(&protocol) {
                    Some(p) => ProtocolValue::Known(p),
                    None if protocol == UNSPECIFIED => ProtocolValue::Unspecified,
                    None => ProtocolValue::Unknown(protocol),
                };
                out.insert(port, protocol);
            }
            Some(out)
        }
    };
    let row = Row {
        namespace: key.namespace.clone(),
        service: key.service.clone(),
        address: key.address,
        port: value.port,
        ports: value.ports,
        port_protocols,
        ready: value.ready,
        pod: value.pod,
        node: value.node,
    };
    if let Some(problem) = row_problem(&row) {
        return Err(Refusal::Row(problem));
    }
    Ok((key, row))
}

/// The keys and values that register `row`: one per distinct protocol among its ports. A row that
/// fails the check of spec/model.md §3.3, or whose namespace or service cannot be a key segment,
/// is refused: nothing of it is written.
pub fn encode(prefix: &str, row: &Row) -> Result<Vec<(String, String)>, Refusal> {
    if let Some(problem) = row_problem(row) {
        return Err(Refusal::Row(problem));
    }
    check_name("namespace", &row.namespace).map_err(Refusal::KeyMalformed)?;
    check_name("service", &row.service).map_err(Refusal::KeyMalformed)?;
    let mut protocols = Vec::new();
    let mut map = BTreeMap::new();
    for (&port, value) in row.port_protocols.iter().flatten() {
        // row_problem passed: every value of a listed port is known, and no other port is named.
        let ProtocolValue::Known(p) = value else {
            return Err(Refusal::Row(RowProblem::PortWithoutProtocol));
        };
        if !protocols.contains(p) {
            protocols.push(*p);
        }
        map.insert(port.to_string(), protocol_name(*p).to_owned());
    }
    protocols.sort();
    let value = Value {
        schema: SCHEMA,
        port: row.port,
        ports: row.ports.clone(),
        port_protocols: Some(map),
        ready: row.ready,
        pod: row.pod.clone(),
        node: row.node.clone(),
    };
    let text = serde_json::to_string(&value).map_err(|e| Refusal::ValueMalformed(e.to_string()))?;
    Ok(protocols
        .into_iter()
        .map(|protocol| {
            let key = EndpointKey {
                namespace: row.namespace.clone(),
                service: row.service.clone(),
                protocol,
                address: row.address,
            };
            (key.render(prefix), text.clone())
        })
        .collect())
}

#[cfg(test)]
mod tests;
