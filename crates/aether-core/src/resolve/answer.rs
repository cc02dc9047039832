//! The mesh's own answers (addressing.md §11): a closed set of reasons, each with its status
//! and its `x-aether-error` value, and the one place they are rendered to bytes.
//!
//! Layer 0 (pure).

use crate::prelude::*;

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

// Compiled into the model, so it lives there (ARCHITECTURE.md "Who may import whom").
pub use crate::model::target::ServiceLine;

/// Every reason a mesh daemon may send (addressing.md §11.1, active values only).
///
/// The retired values (`port-required`, `name-not-in-namespace`, `primary-not-http`,
/// `no-http-port`) have no variant, so they cannot be sent. `filter-levels` is reserved: it has a
/// variant for the contract table, and no resolver produces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Reason {
    /// 400: a malformed authority.
    BadAuthority,
    /// 400: the loopback listener received bytes that are not HTTP.
    NotHttp,
    /// 404: a request without a path (CONNECT).
    NoPath,
    /// 404: the proxy port's floor for a name that is not the mesh's.
    NotAMeshName,
    /// 404: rules are attached and none matches.
    RouteNotMatched,
    /// 421: the Host names another port than the dialled one.
    PortMismatch,
    /// 421: the port is not a port of the name that serves HTTP there.
    PortNotDeclared,
    /// 421: on the proxy port, the port is raw TCP or UDP.
    PortNotHttp,
    /// 421: a short name on a connection with no caller namespace.
    CallerNamespaceUnknown,
    /// 500: the share of a route rule that goes to an invalid backendRef.
    InvalidBackend,
    /// 500 (reserved): filter levels that cannot run in their specified order.
    FilterLevels,
    /// 503: a delivery with no endpoint after the discovery hold.
    NoEndpoints,
    /// 503: the chosen endpoint or passthrough destination refused or timed out.
    UpstreamUnreachable,
    /// 400: a request head the HTTP/1 parser rejects.
    BadRequest,
    /// 431: the request head exceeds the configured limit.
    HeadersTooLarge,
    /// 403: `rbac` or `ext_authz` denies the request.
    AuthzDenied,
    /// 403: the `ext_authz` service cannot be reached: authorization fails closed.
    AuthzUnavailable,
}

impl Reason {
    /// Every reason, in the order of addressing.md §11.1.
    pub const ALL: [Self; 17] = [
        Self::BadAuthority,
        Self::NotHttp,
        Self::NoPath,
        Self::NotAMeshName,
        Self::RouteNotMatched,
        Self::PortMismatch,
        Self::PortNotDeclared,
        Self::PortNotHttp,
        Self::CallerNamespaceUnknown,
        Self::InvalidBackend,
        Self::FilterLevels,
        Self::NoEndpoints,
        Self::UpstreamUnreachable,
        Self::BadRequest,
        Self::HeadersTooLarge,
        Self::AuthzDenied,
        Self::AuthzUnavailable,
    ];

    /// The `x-aether-error` value: a public contract.
    pub fn code(self) -> &'static str {
        match self {
            Self::BadAuthority => "bad-authority",
            Self::NotHttp => "not-http",
            Self::NoPath => "no-path",
            Self::NotAMeshName => "not-a-mesh-name",
            Self::RouteNotMatched => "route-not-matched",
            Self::PortMismatch => "port-mismatch",
            Self::PortNotDeclared => "port-not-declared",
            Self::PortNotHttp => "port-not-http",
            Self::CallerNamespaceUnknown => "caller-namespace-unknown",
            Self::InvalidBackend => "invalid-backend",
            Self::FilterLevels => "filter-levels",
            Self::NoEndpoints => "no-endpoints",
            Self::UpstreamUnreachable => "upstream-unreachable",
            Self::BadRequest => "bad-request",
            Self::HeadersTooLarge => "headers-too-large",
            Self::AuthzDenied => "authz-denied",
            Self::AuthzUnavailable => "authz-unavailable",
        }
    }

    /// The HTTP status code.
    pub fn status(self) -> u16 {
        match self {
            Self::BadAuthority | Self::NotHttp | Self::BadRequest => 400,
            Self::AuthzDenied | Self::AuthzUnavailable => 403,
            Self::NoPath | Self::NotAMeshName | Self::RouteNotMatched => 404,
            Self::PortMismatch
            | Self::PortNotDeclared
            | Self::PortNotHttp
            | Self::CallerNamespaceUnknown => 421,
            Self::HeadersTooLarge => 431,
            Self::InvalidBackend | Self::FilterLevels => 500,
            Self::NoEndpoints | Self::UpstreamUnreachable => 503,
        }
    }

    /// The reason phrase of the status line.
    pub fn status_text(self) -> &'static str {
        match self.status() {
            400 => "Bad Request",
            403 => "Forbidden",
            404 => "Not Found",
            421 => "Misdirected Request",
            431 => "Request Header Fields Too Large",
            500 => "Internal Server Error",
            _ => "Service Unavailable",
        }
    }

    /// Whether the answer is immediate and runs no filter (the 400s, 404s and 421s, I6).
    pub fn is_immediate(self) -> bool {
        matches!(self.status(), 400 | 404 | 421 | 431)
    }

    /// The reason whose code is `code`, if any.
    pub fn from_code(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.code() == code)
    }
}

/// One mesh-generated answer: the reason and, for a 421 about a known service, that service.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MeshAnswer {
    /// Why.
    pub reason: Reason,
    /// The service described in the body (421 refusals of a known service only).
    pub service: Option<ServiceLine>,
}

impl MeshAnswer {
    /// An answer that describes no service (`service: -`, empty `ports:`).
    pub fn bare(reason: Reason) -> Self {
        Self {
            reason,
            service: None,
        }
    }

    /// A 421 refusal about a known service.
    pub fn about(reason: Reason, service: ServiceLine) -> Self {
        // The body describes a service on the 421 refusals only (addressing.md §11.2).
        let service = (reason.status() == 421).then_some(service);
        Self { reason, service }
    }

    /// The three-line body (addressing.md §11.2).
    pub fn body(&self) -> String {
        let mut body = String::with_capacity(64);
        let (name, ports) = match &self.service {
            Some(s) => (&*s.name, &*s.ports),
            None => ("-", ""),
        };
        // Writing to a String cannot fail.
        let _ = write!(
            body,
            "{}\nservice: {name}\nports:{}{ports}\n",
            self.reason.code(),
            if ports.is_empty() { "" } else { " " }
        );
        body
    }

    /// The answer as a status, headers and body: the only renderer of mesh answers.
    pub fn render(&self) -> Rendered {
        Rendered {
            status: self.reason.status(),
            headers: vec![
                (HEADER_ERROR, self.reason.code().to_owned()),
                ("content-type", CONTENT_TYPE.to_owned()),
            ],
            body: self.body(),
        }
    }
}

/// The reason header.
pub const HEADER_ERROR: &str = "x-aether-error";

/// The gRPC status a gRPC client derives from the HTTP status of an answer that carries none
/// (gRPC's mapping of HTTP status to gRPC status): 400 INTERNAL, 401 UNAUTHENTICATED, 403
/// PERMISSION_DENIED, 404 UNIMPLEMENTED, 429/502/503/504 UNAVAILABLE, anything else UNKNOWN.
/// The mesh sends this code with its own answers to gRPC requests, so a client that reads
/// `grpc-status` and one that derives it see the same code (docs/decisions.md).
pub fn grpc_code(http_status: u16) -> u8 {
    match http_status {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502 | 503 | 504 => 14,
        _ => 2,
    }
}
/// The prefix of the mesh's own headers (I12).
pub const MESH_HEADER_PREFIX: &str = "x-aether-";
const CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// A rendered answer, ready for any HTTP version's encoder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    /// The status code.
    pub status: u16,
    /// Headers, lower-case names.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: String,
}

impl Rendered {
    /// The HTTP/1.1 bytes of the answer (status line, headers, content-length, body).
    pub fn to_http1(&self, reason_phrase: &str) -> Vec<u8> {
        let mut out = format!("HTTP/1.1 {} {reason_phrase}\r\n", self.status);
        for (k, v) in &self.headers {
            let _ = write!(out, "{k}: {v}\r\n");
        }
        let _ = write!(
            out,
            "content-length: {}\r\n\r\n{}",
            self.body.len(),
            self.body
        );
        out.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contract table of addressing.md §11.1: variant, code, status.
    const TABLE: &[(Reason, &str, u16)] = &[
        (Reason::BadAuthority, "bad-authority", 400),
        (Reason::NotHttp, "not-http", 400),
        (Reason::NoPath, "no-path", 404),
        (Reason::NotAMeshName, "not-a-mesh-name", 404),
        (Reason::RouteNotMatched, "route-not-matched", 404),
        (Reason::PortMismatch, "port-mismatch", 421),
        (Reason::PortNotDeclared, "port-not-declared", 421),
        (Reason::PortNotHttp, "port-not-http", 421),
        (
            Reason::CallerNamespaceUnknown,
            "caller-namespace-unknown",
            421,
        ),
        (Reason::InvalidBackend, "invalid-backend", 500),
        (Reason::FilterLevels, "filter-levels", 500),
        (Reason::NoEndpoints, "no-endpoints", 503),
        (Reason::UpstreamUnreachable, "upstream-unreachable", 503),
        (Reason::BadRequest, "bad-request", 400),
        (Reason::HeadersTooLarge, "headers-too-large", 431),
        (Reason::AuthzDenied, "authz-denied", 403),
        (Reason::AuthzUnavailable, "authz-unavailable", 403),
    ];

    #[test]
    fn every_reason_has_the_code_and_status_of_the_contract() {
        assert_eq!(TABLE.len(), Reason::ALL.len());
        for &(reason, code, status) in TABLE {
            assert_eq!(reason.code(), code);
            assert_eq!(reason.status(), status, "{code}");
            assert_eq!(Reason::from_code(code), Some(reason));
        }
    }

    #[test]
    fn variant_names_are_the_camel_case_of_their_codes() {
        for reason in Reason::ALL {
            let camel: String = reason
                .code()
                .split('-')
                .map(|w| {
                    let mut c = w.chars();
                    c.next()
                        .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                        .unwrap_or_default()
                })
                .collect();
            assert_eq!(format!("{reason:?}"), camel);
        }
    }

    #[test]
    fn retired_reasons_cannot_be_sent() {
        for retired in [
            "port-required",
            "name-not-in-namespace",
            "primary-not-http",
            "no-http-port",
        ] {
            assert_eq!(Reason::from_code(retired), None);
        }
    }

    #[test]
    fn a_refusal_body_lists_the_services_ports() {
        let a = MeshAnswer::about(
            Reason::PortNotDeclared,
            ServiceLine {
                name: "mp-multi.mp.aether.internal".into(),
                ports: "8080/http 9090/http".into(),
            },
        );
        assert_eq!(
            a.body(),
            "port-not-declared\nservice: mp-multi.mp.aether.internal\nports: 8080/http 9090/http\n"
        );
        let r = a.render();
        assert_eq!(r.status, 421);
        assert!(
            r.headers
                .contains(&(HEADER_ERROR, "port-not-declared".to_owned()))
        );
    }

    #[test]
    fn answers_other_than_421_describe_no_service() {
        let a = MeshAnswer::about(
            Reason::NoEndpoints,
            ServiceLine {
                name: "x.y.aether.internal".into(),
                ports: "80/http".into(),
            },
        );
        assert_eq!(a.body(), "no-endpoints\nservice: -\nports:\n");
        let http1 = String::from_utf8(a.render().to_http1("Service Unavailable")).unwrap();
        assert!(http1.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(http1.contains("x-aether-error: no-endpoints\r\n"));
        assert!(http1.ends_with("\r\n\r\nno-endpoints\nservice: -\nports:\n"));
    }
}
