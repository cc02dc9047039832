//! SPIFFE IDs of workloads: `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.
//!
//! PURE (Layer 0): parsing and formatting only, no IO. A workload's identity is its
//! ServiceAccount in its namespace (spec glossary, "mesh service"; model.md §14), so this is
//! the only shape of SPIFFE ID the mesh issues or accepts.

use crate::prelude::*;

use std::fmt;

/// The identity a workload certificate proves: a ServiceAccount in a namespace, in one trust
/// domain.
///
/// Build it with [`SpiffeId::new`] or [`SpiffeId::parse`]; `Display` writes the URI form that
/// goes into the certificate's URI SAN, and `parse(id.to_string()) == id`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpiffeId {
    /// The trust domain (`cluster.local` by default).
    pub trust_domain: String,
    /// The Kubernetes namespace.
    pub namespace: String,
    /// The ServiceAccount, which is also the mesh service's name.
    pub service_account: String,
}

/// Why a string is not a SPIFFE ID of the form the mesh uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSpiffeId {
    /// The string does not begin with `spiffe://`.
    #[error("a spiffe id begins with spiffe://")]
    Scheme,
    /// The trust domain is empty or holds a character other than `a-z 0-9 . - _`.
    #[error("the trust domain is empty or not lower-case letters, digits, '.', '-' or '_'")]
    TrustDomain,
    /// The path is not `/ns/<namespace>/sa/<service-account>`.
    #[error("the path is not /ns/<namespace>/sa/<service-account>")]
    Path,
    /// A namespace or ServiceAccount segment is empty, `.`, `..`, or holds a character other
    /// than letters, digits, `.`, `-` or `_`.
    #[error("a path segment is empty, '.', '..' or holds a character spiffe ids do not allow")]
    Segment,
}

const SCHEME: &str = "spiffe://";

impl SpiffeId {
    /// An identity from its three parts, checked as [`SpiffeId::parse`] checks them.
    pub fn new(
        trust_domain: &str,
        namespace: &str,
        service_account: &str,
    ) -> Result<Self, InvalidSpiffeId> {
        if !valid_trust_domain(trust_domain) {
            return Err(InvalidSpiffeId::TrustDomain);
        }
        if !valid_segment(namespace) || !valid_segment(service_account) {
            return Err(InvalidSpiffeId::Segment);
        }
        Ok(Self {
            trust_domain: trust_domain.to_owned(),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
        })
    }

    /// Parses `spiffe://<td>/ns/<ns>/sa/<sa>` and nothing else: no port, user info, query,
    /// fragment, trailing slash or extra segment.
    pub fn parse(s: &str) -> Result<Self, InvalidSpiffeId> {
        let rest = s.strip_prefix(SCHEME).ok_or(InvalidSpiffeId::Scheme)?;
        let (trust_domain, path) = rest.split_once('/').ok_or(InvalidSpiffeId::Path)?;
        if !valid_trust_domain(trust_domain) {
            return Err(InvalidSpiffeId::TrustDomain);
        }
        let mut parts = path.split('/');
        let (Some("ns"), Some(ns), Some("sa"), Some(sa), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(InvalidSpiffeId::Path);
        };
        Self::new(trust_domain, ns, sa)
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{SCHEME}{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// SPIFFE trust domains: lower-case letters, digits, `.`, `-` and `_`, not empty.
fn valid_trust_domain(td: &str) -> bool {
    !td.is_empty()
        && td.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')
        })
}

/// SPIFFE path segments: letters, digits, `.`, `-` and `_`, not empty and not `.` or `..`.
fn valid_segment(seg: &str) -> bool {
    !seg.is_empty()
        && seg != "."
        && seg != ".."
        && seg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_id_parses_into_its_parts_and_formats_back() {
        let s = "spiffe://cluster.local/ns/mp/sa/mp-multi";
        let id = SpiffeId::parse(s).unwrap();
        assert_eq!(id.trust_domain, "cluster.local");
        assert_eq!(id.namespace, "mp");
        assert_eq!(id.service_account, "mp-multi");
        assert_eq!(id.to_string(), s);
    }

    #[test]
    fn other_shapes_are_refused_with_the_reason() {
        let cases = [
            ("http://cluster.local/ns/mp/sa/x", InvalidSpiffeId::Scheme),
            ("cluster.local/ns/mp/sa/x", InvalidSpiffeId::Scheme),
            ("spiffe://cluster.local", InvalidSpiffeId::Path),
            ("spiffe:///ns/mp/sa/x", InvalidSpiffeId::TrustDomain),
            (
                "spiffe://Cluster.Local/ns/mp/sa/x",
                InvalidSpiffeId::TrustDomain,
            ),
            ("spiffe://td:443/ns/mp/sa/x", InvalidSpiffeId::TrustDomain),
            ("spiffe://user@td/ns/mp/sa/x", InvalidSpiffeId::TrustDomain),
            ("spiffe://td/ns/mp/sa/x/", InvalidSpiffeId::Path),
            ("spiffe://td/ns/mp/sa/x/y", InvalidSpiffeId::Path),
            ("spiffe://td/sa/x/ns/mp", InvalidSpiffeId::Path),
            ("spiffe://td/ns/mp", InvalidSpiffeId::Path),
            ("spiffe://td/ns//sa/x", InvalidSpiffeId::Segment),
            ("spiffe://td/ns/../sa/x", InvalidSpiffeId::Segment),
            ("spiffe://td/ns/mp/sa/x?y=1", InvalidSpiffeId::Segment),
            ("spiffe://td/ns/mp/sa/x#f", InvalidSpiffeId::Segment),
        ];
        for (input, want) in cases {
            assert_eq!(SpiffeId::parse(input), Err(want), "{input}");
        }
    }

    #[test]
    fn new_checks_its_parts_like_parse() {
        assert_eq!(
            SpiffeId::new("td", "mp", "a/b"),
            Err(InvalidSpiffeId::Segment)
        );
        assert_eq!(
            SpiffeId::new("", "mp", "x"),
            Err(InvalidSpiffeId::TrustDomain)
        );
        assert!(SpiffeId::new("td", "mp", "x").is_ok());
    }
}
