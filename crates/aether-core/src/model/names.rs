//! Authorities and names (addressing.md §4): splitting an authority into name and port,
//! telling malformed authorities apart, and recognising the name families.
//!
//! Layer 0 (pure). Nothing here allocates on the hot path except the lower-casing of a name
//! that is not already lower case.

use crate::prelude::*;

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// The port part of an authority (addressing.md §4.1 item 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HostPort {
    /// No port part: a port-less authority.
    None,
    /// A well-formed port, 1–65535.
    Port(u16),
    /// A port part that is not 1–5 ASCII digits without a leading zero in 1–65535.
    Malformed,
}

impl HostPort {
    /// The port, if well formed.
    pub fn port(self) -> Option<u16> {
        match self {
            Self::Port(p) => Some(p),
            Self::None | Self::Malformed => None,
        }
    }
}

/// An authority split at its first `:` (or after the `]` of an IPv6 literal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Authority<'a> {
    /// The name part, as received (case kept).
    pub name: &'a str,
    /// The port part.
    pub port: HostPort,
    /// The name is an IPv6 literal (`[...]`).
    pub ipv6_literal: bool,
}

/// Parses a port part exactly (addressing.md §4.1 item 4).
pub fn parse_port_part(s: &str) -> HostPort {
    let b = s.as_bytes();
    if b.is_empty() || b.len() > 5 || b[0] == b'0' || !b.iter().all(u8::is_ascii_digit) {
        return HostPort::Malformed;
    }
    match s.parse::<u32>() {
        Ok(n @ 1..=65535) => u16::try_from(n).map_or(HostPort::Malformed, HostPort::Port),
        _ => HostPort::Malformed,
    }
}

/// Splits an authority into name and port (addressing.md §4.1 item 1).
pub fn split_authority(authority: &str) -> Authority<'_> {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(end) => {
                let (name, rest) = authority.split_at(end + 1);
                let port = match rest.strip_prefix(':') {
                    Some(p) => parse_port_part(p),
                    None if rest.is_empty() => HostPort::None,
                    None => HostPort::Malformed,
                };
                Authority {
                    name,
                    port,
                    ipv6_literal: true,
                }
            }
            None => Authority {
                name: authority,
                port: HostPort::None,
                ipv6_literal: true,
            },
        };
    }
    match authority.split_once(':') {
        Some((name, port)) => Authority {
            name,
            port: parse_port_part(port),
            ipv6_literal: false,
        },
        None => Authority {
            name: authority,
            port: HostPort::None,
            ipv6_literal: false,
        },
    }
}

/// The HTTP version of a request, as far as the authority rules care (addressing.md §4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HttpVersion {
    /// HTTP/1.0: `Host` is optional.
    Http10,
    /// HTTP/1.1: exactly one `Host` is required.
    Http11,
    /// HTTP/2 (h2c): `:authority`, `Host`, or neither.
    H2,
}

/// What a request carried that can name its target, before any rule reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthorityInput<'a> {
    /// The request's HTTP version.
    pub version: HttpVersion,
    /// The authority of an absolute-form request-target, if the request line had one.
    pub absolute: Option<&'a str>,
    /// HTTP/2 `:authority`, if present.
    pub h2_authority: Option<&'a str>,
    /// Every `Host` field value, in order.
    pub hosts: &'a [&'a str],
}

/// Why an authority is malformed (answered `400 bad-authority`, addressing.md §4.1 item 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MalformedAuthority {
    /// An HTTP/1.1 request without a `Host` field.
    MissingHost,
    /// More than one `Host` field.
    SeveralHosts,
    /// HTTP/2 `:authority` and `Host` name different authorities.
    AuthorityDisagreesWithHost,
    /// The authority carries userinfo (`user@`).
    Userinfo,
}

impl MalformedAuthority {
    /// A short description, for explain output and logs.
    pub fn describe(self) -> &'static str {
        match self {
            Self::MissingHost => "an HTTP/1.1 request without a Host field",
            Self::SeveralHosts => "more than one Host field",
            Self::AuthorityDisagreesWithHost => "the HTTP/2 :authority and Host disagree",
            Self::Userinfo => "the authority carries userinfo",
        }
    }
}

/// The authority that names the request's target, or why there is none to read
/// (addressing.md §2 and §4.1 items 5 and 6).
///
/// `Ok(None)` is a request with no name: never the mesh's.
pub fn effective_authority<'a>(
    input: &AuthorityInput<'a>,
) -> Result<Option<&'a str>, MalformedAuthority> {
    let has_userinfo = |s: &str| s.contains('@');
    if input.absolute.is_some_and(has_userinfo)
        || input.h2_authority.is_some_and(has_userinfo)
        || input.hosts.iter().any(|h| has_userinfo(h))
    {
        return Err(MalformedAuthority::Userinfo);
    }
    if input.hosts.len() > 1 {
        return Err(MalformedAuthority::SeveralHosts);
    }
    let host = input.hosts.first().copied();
    match input.version {
        HttpVersion::Http11 if host.is_none() => return Err(MalformedAuthority::MissingHost),
        HttpVersion::H2 => {
            if let (Some(a), Some(h)) = (input.h2_authority, host)
                && !a.eq_ignore_ascii_case(h)
            {
                return Err(MalformedAuthority::AuthorityDisagreesWithHost);
            }
        }
        HttpVersion::Http10 | HttpVersion::Http11 => {}
    }
    let chosen = input.absolute.or(input.h2_authority).or(host);
    Ok(chosen.filter(|a| !a.is_empty()))
}

/// The domains a node recognises names under (both lower case, without a trailing dot).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Domains {
    /// The mesh domain (`aether.internal` by default).
    pub mesh: String,
    /// The cluster domain (`cluster.local` by default).
    pub cluster: String,
}

/// Which family a name's spelling belongs to (addressing.md §4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Family {
    /// `<svc>.<ns>.<mesh-domain>`.
    Mesh,
    /// `<svc>.<ns>.svc.<cluster-domain>`, `<svc>.<ns>.svc` or `<svc>.<ns>`.
    Kubernetes,
    /// `<svc>`, in the caller's namespace.
    Short,
}

/// A name read as a mesh spelling: which (namespace, service) it means and in which family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameForm<'a> {
    /// A spelling that names `<svc>` in `<ns>`.
    Named {
        /// The family of the spelling.
        family: Family,
        /// The service label, lower case.
        service: Cow<'a, str>,
        /// The namespace label, lower case.
        namespace: Cow<'a, str>,
    },
    /// A short name `<svc>`, lower case; its namespace is the caller's.
    Short(Cow<'a, str>),
    /// Nothing the mesh answers (category (e)): an IP literal, another domain, a partial name
    /// with a trailing dot, a name under the mesh domain with the wrong number of labels.
    Foreign,
}

fn valid_label(l: &str) -> bool {
    !l.is_empty()
}

/// Whether `s` is an RFC 1123 label, as Kubernetes requires of a namespace: 1 to 63 lower-case
/// letters, digits and `-`, starting and ending with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `s` is an RFC 1123 subdomain, as Kubernetes requires of a pod's and a
/// ServiceAccount's name: labels of [`is_dns_label`] joined by `.`, at most 253 bytes.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Why an identity (a namespace and a ServiceAccount, the mesh service of a row or a pod) is not
/// one Kubernetes would take (upper case, `/`, a line break, ...); `None` when it is. Such a
/// name is refused with a diagnostic (issue #35 item 5): it could never be a workload's, and it
/// would reach certificates, SNIs and logs.
pub fn identity_problem(namespace: &str, service_account: &str) -> Option<String> {
    if !is_dns_label(namespace) {
        return Some(format!(
            "namespace {namespace:?} is not an RFC 1123 label (lower case, digits, '-', at most 63)"
        ));
    }
    if !is_dns_subdomain(service_account) {
        return Some(format!(
            "ServiceAccount {service_account:?} is not an RFC 1123 subdomain (lower case, digits, '-', '.', at most 253)"
        ));
    }
    None
}

/// Strips `.<suffix>` (a dot, then `suffix`) from the end of `s`.
fn strip_dotted<'a>(s: &'a str, suffix: &str) -> Option<&'a str> {
    s.strip_suffix(suffix)?.strip_suffix('.')
}

/// Reads `<svc>.<ns>` with two non-empty labels.
fn two_labels(prefix: &str) -> Option<(&str, &str)> {
    let (svc, ns) = prefix.split_once('.')?;
    (valid_label(svc) && valid_label(ns) && !ns.contains('.')).then_some((svc, ns))
}

/// The spelling of a lower-case name without its trailing dot, as (family, svc, ns) ranges.
fn classify<'t>(
    text: &'t str,
    trailing_dot: bool,
    domains: &Domains,
) -> Option<(Family, &'t str, &'t str)> {
    if text == domains.mesh {
        // The mesh domain itself is under the mesh domain, with too few labels (§4.5 (d)).
        return None;
    }
    if let Some(prefix) = strip_dotted(text, &domains.mesh) {
        return two_labels(prefix).map(|(s, n)| (Family::Mesh, s, n));
    }
    if let Some(prefix) = strip_dotted(text, &domains.cluster).and_then(|p| strip_dotted(p, "svc"))
    {
        return two_labels(prefix).map(|(s, n)| (Family::Kubernetes, s, n));
    }
    if trailing_dot {
        // Only the two absolute spellings may end in a dot (§4.1 item 3).
        return None;
    }
    if let Some(prefix) = strip_dotted(text, "svc") {
        return two_labels(prefix).map(|(s, n)| (Family::Kubernetes, s, n));
    }
    match text.matches('.').count() {
        0 if valid_label(text) => Some((Family::Short, text, "")),
        1 => two_labels(text).map(|(s, n)| (Family::Kubernetes, s, n)),
        _ => None,
    }
}

/// Reads a name (without its port) as a mesh spelling (addressing.md §4.1 items 1–3, §4.2).
///
/// Borrows from `name` when it is already lower case; allocates once otherwise.
pub fn read_name<'a>(name: &'a str, domains: &Domains) -> NameForm<'a> {
    if name.is_empty() || name.starts_with('[') || name.parse::<std::net::Ipv4Addr>().is_ok() {
        return NameForm::Foreign;
    }
    fn form<'t>(text: &'t str, domains: &Domains) -> Option<(Family, &'t str, &'t str)> {
        let (body, dot) = match text.strip_suffix('.') {
            Some(b) => (b, true),
            None => (text, false),
        };
        classify(body, dot, domains)
    }
    if !name.bytes().any(|b| b.is_ascii_uppercase()) {
        return match form(name, domains) {
            Some((Family::Short, svc, _)) => NameForm::Short(Cow::Borrowed(svc)),
            Some((family, svc, ns)) => NameForm::Named {
                family,
                service: Cow::Borrowed(svc),
                namespace: Cow::Borrowed(ns),
            },
            None => NameForm::Foreign,
        };
    }
    let lower = name.to_ascii_lowercase();
    match form(&lower, domains) {
        Some((Family::Short, svc, _)) => NameForm::Short(Cow::Owned(svc.to_owned())),
        Some((family, svc, ns)) => NameForm::Named {
            family,
            service: Cow::Owned(svc.to_owned()),
            namespace: Cow::Owned(ns.to_owned()),
        },
        None => NameForm::Foreign,
    }
}

/// The mesh name of a service: `<svc>.<ns>.<mesh-domain>`.
pub fn mesh_name(service: &str, namespace: &str, domains: &Domains) -> String {
    // Joined by hand: the compiler spells one per name entry, and `format!` cost some 1,800
    // instructions each (callgrind, docs/performance.md).
    let mesh = domains.mesh.as_str();
    let mut s = String::with_capacity(service.len() + namespace.len() + mesh.len() + 2);
    for part in [service, ".", namespace, ".", mesh] {
        s.push_str(part);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domains() -> Domains {
        Domains {
            mesh: "aether.internal".into(),
            cluster: "cluster.local".into(),
        }
    }

    fn named(family: Family, svc: &str, ns: &str) -> NameForm<'static> {
        NameForm::Named {
            family,
            service: Cow::Owned(svc.into()),
            namespace: Cow::Owned(ns.into()),
        }
    }

    #[test]
    fn port_parts_are_strict() {
        assert_eq!(parse_port_part("8080"), HostPort::Port(8080));
        assert_eq!(parse_port_part("65535"), HostPort::Port(65535));
        for bad in [
            "",
            "08080",
            "0",
            "65536",
            "abc",
            "8080:8080",
            "+80",
            "123456",
            " 80",
        ] {
            assert_eq!(parse_port_part(bad), HostPort::Malformed, "{bad:?}");
        }
    }

    #[test]
    fn an_authority_splits_at_its_first_colon() {
        let a = split_authority("mp-multi.mp.aether.internal:8080:8080");
        assert_eq!(a.name, "mp-multi.mp.aether.internal");
        assert_eq!(a.port, HostPort::Malformed);
        assert_eq!(split_authority("x:").port, HostPort::Malformed);
        assert_eq!(split_authority("x").port, HostPort::None);
    }

    #[test]
    fn an_ipv6_literal_takes_the_port_after_its_bracket() {
        let a = split_authority("[fd00::1]:18081");
        assert_eq!(a.name, "[fd00::1]");
        assert_eq!(a.port, HostPort::Port(18081));
        assert!(a.ipv6_literal);
        assert_eq!(read_name(a.name, &domains()), NameForm::Foreign);
    }

    #[test]
    fn every_family_names_the_same_service() {
        let d = domains();
        assert_eq!(
            read_name("mp-multi.mp.aether.internal", &d),
            named(Family::Mesh, "mp-multi", "mp")
        );
        assert_eq!(
            read_name("MP-MULTI.MP.SVC.CLUSTER.LOCAL", &d),
            named(Family::Kubernetes, "mp-multi", "mp")
        );
        assert_eq!(
            read_name("mp-multi.mp.svc", &d),
            named(Family::Kubernetes, "mp-multi", "mp")
        );
        assert_eq!(
            read_name("mp-multi.mp", &d),
            named(Family::Kubernetes, "mp-multi", "mp")
        );
        assert_eq!(
            read_name("Mp-Multi", &d),
            NameForm::Short(Cow::Owned("mp-multi".into()))
        );
    }

    #[test]
    fn a_trailing_dot_is_ignored_on_the_two_absolute_spellings_only() {
        let d = domains();
        assert_eq!(
            read_name("mp-multi.mp.aether.internal.", &d),
            named(Family::Mesh, "mp-multi", "mp")
        );
        assert_eq!(
            read_name("mp-multi.mp.svc.cluster.local.", &d),
            named(Family::Kubernetes, "mp-multi", "mp")
        );
        for partial in ["mp-multi.", "mp-multi.mp.", "mp-multi.mp.svc."] {
            assert_eq!(read_name(partial, &d), NameForm::Foreign, "{partial}");
        }
    }

    #[test]
    fn names_that_are_never_the_meshs() {
        let d = domains();
        for name in [
            "10.96.0.1",
            "a.b.c.aether.internal",
            "aether.internal",
            "x.aether.internal",
            "a..b",
            "",
            "www.example.com",
        ] {
            assert_eq!(read_name(name, &d), NameForm::Foreign, "{name}");
        }
    }

    #[test]
    fn malformed_authorities_are_told_apart() {
        let one = ["mp-multi.mp.aether.internal:8080"];
        let two = [one[0], one[0]];
        let ok = |v, abs, h2, hosts| {
            effective_authority(&AuthorityInput {
                version: v,
                absolute: abs,
                h2_authority: h2,
                hosts,
            })
        };
        assert_eq!(
            ok(HttpVersion::Http11, None, None, &[]),
            Err(MalformedAuthority::MissingHost)
        );
        assert_eq!(
            ok(HttpVersion::Http11, None, None, &two),
            Err(MalformedAuthority::SeveralHosts)
        );
        assert_eq!(
            ok(
                HttpVersion::H2,
                None,
                Some("mp-multi.mp.aether.internal:8080"),
                &["mp-eighty.mp.aether.internal:8080"]
            ),
            Err(MalformedAuthority::AuthorityDisagreesWithHost)
        );
        assert_eq!(
            ok(
                HttpVersion::H2,
                None,
                Some("MP-MULTI.mp.aether.internal:8080"),
                &one
            ),
            Ok(Some("MP-MULTI.mp.aether.internal:8080"))
        );
        assert_eq!(
            ok(
                HttpVersion::Http11,
                None,
                None,
                &["user@mp-multi.mp.aether.internal:8080"]
            ),
            Err(MalformedAuthority::Userinfo)
        );
        assert_eq!(ok(HttpVersion::Http10, None, None, &[]), Ok(None));
        assert_eq!(ok(HttpVersion::Http11, None, None, &[""]), Ok(None));
        assert_eq!(
            ok(
                HttpVersion::Http11,
                Some("mp-multi.mp.aether.internal:9090"),
                None,
                &one
            ),
            Ok(Some("mp-multi.mp.aether.internal:9090"))
        );
    }
}

#[cfg(test)]
mod never_panics {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Malformed Hosts get an answer, never a panic: every parser here is total.
        #[test]
        fn any_authority_is_read_without_panicking(host in "\\PC{0,64}", second in proptest::option::of("\\PC{0,16}")) {
            let d = Domains { mesh: "aether.internal".into(), cluster: "cluster.local".into() };
            let a = split_authority(&host);
            let _ = read_name(a.name, &d);
            let hosts: Vec<&str> = std::iter::once(host.as_str()).chain(second.as_deref()).collect();
            for version in [HttpVersion::Http10, HttpVersion::Http11, HttpVersion::H2] {
                let _ = effective_authority(&AuthorityInput { version, absolute: None, h2_authority: Some(&host), hosts: &hosts });
            }
        }

        /// Upper and mixed case never change what a name means (I7).
        #[test]
        fn case_never_changes_a_name(svc in "[a-z][a-z0-9-]{0,8}", ns in "[a-z][a-z0-9-]{0,8}", flips in proptest::collection::vec(any::<bool>(), 40)) {
            let d = Domains { mesh: "aether.internal".into(), cluster: "cluster.local".into() };
            for name in [format!("{svc}.{ns}.aether.internal"), format!("{svc}.{ns}.svc.cluster.local"), format!("{svc}.{ns}"), svc] {
                let mixed: String = name.chars().zip(flips.iter().cycle()).map(|(c, &up)| if up { c.to_ascii_uppercase() } else { c }).collect();
                prop_assert_eq!(read_name(&mixed, &d), read_name(&name, &d));
            }
        }
    }
}
