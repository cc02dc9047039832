//! Ports, transports and classes: protocol is a property of a port (spec/model.md §4).
//!
//! Layer 0 (pure).

use crate::prelude::*;

use std::fmt;

use serde::{Deserialize, Serialize};

/// The one protocol value a registry row records per port: it fixes transport and class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PortProtocol {
    /// TCP carrying HTTP/1.x or h2c.
    Http,
    /// Raw TCP: bytes, never read to decide anything.
    Tcp,
    /// UDP.
    Udp,
}

impl PortProtocol {
    /// Every value, in the tie-break order of the class vote (spec/model.md §6.1).
    pub const ALL: [Self; 3] = [Self::Http, Self::Tcp, Self::Udp];

    /// The spelling used in annotations and in refusal bodies.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }

    /// Parses the annotation spelling (`http`, `tcp`, `udp`; exact, lower case).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "http" => Some(Self::Http),
            "tcp" => Some(Self::Tcp),
            "udp" => Some(Self::Udp),
            _ => None,
        }
    }

    /// The transport this protocol runs on.
    pub fn transport(self) -> Transport {
        match self {
            Self::Http | Self::Tcp => Transport::Tcp,
            Self::Udp => Transport::Udp,
        }
    }
}

impl fmt::Display for PortProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A ServicePort's `protocol`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Transport {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP: never the mesh's.
    Sctp,
}

/// What a (name, front port) is to HTTP handling (spec/model.md §9.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PortClass {
    /// The winning protocol of the port's vote.
    Known(PortProtocol),
    /// No node can know yet ("not checked"): served as HTTP, never refused on that ground.
    Unknown,
    /// The port names nothing: an unresolved named targetPort, or no served row declares it.
    None,
}

impl PortClass {
    /// Whether HTTP is served on a port of this class (HTTP or unknown, addressing.md §4.5).
    pub fn serves_http(self) -> bool {
        matches!(self, Self::Known(PortProtocol::Http) | Self::Unknown)
    }

    /// The spelling of a refusal body's `ports:` line, or `None` when the port is not listed.
    pub fn listed_as(self) -> Option<&'static str> {
        match self {
            Self::Known(p) => Some(p.as_str()),
            Self::Unknown => Some("unknown"),
            Self::None => None,
        }
    }
}

/// The reserved ports (spec/model.md §5): no pod may declare them, in any protocol.
pub const RESERVED_PORTS: [u16; 4] = [CAPTURE_PORT, MESH_HOP_PORT, PROXY_PORT, LEGACY_PORT];

/// The transparent capture listener (TPROXY target).
pub const CAPTURE_PORT: u16 = 18001;
/// The inbound mesh hop (mTLS).
pub const MESH_HOP_PORT: u16 = 18008;
/// The HTTP proxy port.
pub const PROXY_PORT: u16 = 18081;
/// The legacy raw-TCP port and the one UDP capture port.
pub const LEGACY_PORT: u16 = 18082;
/// What a port-less authority means on the proxy port.
pub const PORTLESS_PROXY_PORT: u16 = 80;
/// The default of `endpoint.aether.io/port`.
pub const DEFAULT_DECLARED_PORT: u16 = 8080;

/// Whether `port` is reserved.
pub fn is_reserved(port: u32) -> bool {
    RESERVED_PORTS.iter().any(|&r| u32::from(r) == port)
}

/// Appends `n` in decimal: what `Display` writes, without the formatting machinery (a
/// `format!` costs about 900 instructions a number).
pub(crate) fn push_decimal(out: &mut String, n: u16) {
    let mut digits = [0u8; 5];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b"0123456789"[usize::from(n % 10)];
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
}
