//! `authority`: authority and name parsing (crates/aether-core/src/model/names.rs): `split_authority`,
//! `parse_port_part`, `read_name` and `effective_authority`, on text a client chooses (the
//! `Host` field, `:authority`, an absolute-form target).
//!
//! The input is UTF-8 (lossily) split into lines: the first line is the authority under test;
//! the next lines, when present, are the absolute-form authority, the HTTP/2 `:authority`, and
//! further `Host` values (`-` for "absent").
//!
//! Properties, beyond "no panic":
//! - an authority with a well-formed (or no) port re-renders as `name[:port]` and splits back
//!   to the same name and port;
//! - a well-formed port part is the canonical decimal text of the port;
//! - case never changes what a name means (I7);
//! - a name read as a mesh spelling names the same service when written as its mesh name
//!   (`<svc>.<ns>.<mesh-domain>`) or, for a short name, as itself;
//! - the effective authority, when there is one, is one of the values the request carried,
//!   never empty, never with userinfo.

use std::borrow::Cow;

use aether::model::names::{
    AuthorityInput, Domains, Family, HostPort, HttpVersion, NameForm, effective_authority,
    mesh_name, parse_port_part, read_name, split_authority,
};

use crate::engine::Target;
use crate::outcome;

pub(crate) const TARGET: Target = Target {
    name: "authority",
    max_len: 1024,
    dict: &[
        b"aether.internal",
        b"cluster.local",
        b".svc",
        b".svc.cluster.local",
        b".mp",
        b"mp-multi",
        b":8080",
        b":018081",
        b":65536",
        b"[::1]",
        b"[fd00::1]:",
        b"10.96.0.1",
        b"user@",
        b"\n-\n",
        b"\n",
        b"MP-MULTI",
        b"\xc4\xb0",
        b"\xe2\x84\xaa",
    ],
    run,
};

fn render(name: &str, port: HostPort) -> Option<String> {
    match port {
        HostPort::None => Some(name.to_owned()),
        HostPort::Port(p) => Some(format!("{name}:{p}")),
        HostPort::Malformed => None,
    }
}

fn run(input: &[u8]) -> u64 {
    let domains = Domains {
        mesh: "aether.internal".into(),
        cluster: "cluster.local".into(),
    };
    let text = String::from_utf8_lossy(input);
    let mut lines = text.split('\n');
    let authority = lines.next().unwrap_or_default();
    let absolute = lines.next().filter(|l| *l != "-");
    let h2 = lines.next().filter(|l| *l != "-");
    let hosts: Vec<&str> = lines.collect();

    let a = split_authority(authority);
    if let Some(again) = render(a.name, a.port) {
        let b = split_authority(&again);
        assert_eq!(a, b, "{authority:?} re-rendered as {again:?}");
    }
    if let Some((_, port_text)) = authority.rsplit_once(':')
        && let HostPort::Port(p) = parse_port_part(port_text)
    {
        assert_eq!(
            port_text,
            p.to_string(),
            "a port part that is not canonical"
        );
    }

    let form = read_name(a.name, &domains);
    let upper = a.name.to_ascii_uppercase();
    let lower = a.name.to_ascii_lowercase();
    assert_eq!(
        read_name(&upper, &domains),
        form,
        "upper case changed the name"
    );
    assert_eq!(
        read_name(&lower, &domains),
        form,
        "lower case changed the name"
    );
    match &form {
        NameForm::Named {
            service, namespace, ..
        } => {
            let mesh = mesh_name(service, namespace, &domains);
            assert_eq!(
                read_name(&mesh, &domains),
                NameForm::Named {
                    family: Family::Mesh,
                    service: Cow::Borrowed(&**service),
                    namespace: Cow::Borrowed(&**namespace),
                },
                "{:?} names {service}/{namespace}, its mesh name {mesh:?} does not",
                a.name
            );
        }
        NameForm::Short(service) => {
            assert_eq!(read_name(service, &domains), form);
        }
        NameForm::Foreign => {}
    }

    let mut results = Vec::new();
    for version in [HttpVersion::Http10, HttpVersion::Http11, HttpVersion::H2] {
        let host_fields: Vec<&str> = std::iter::once(authority)
            .chain(hosts.iter().copied())
            .collect();
        let input = AuthorityInput {
            version,
            absolute,
            h2_authority: h2,
            hosts: &host_fields,
        };
        let got = effective_authority(&input);
        if let Ok(Some(chosen)) = got {
            assert!(!chosen.is_empty());
            assert!(!chosen.contains('@'), "userinfo in {chosen:?}");
            assert!(
                absolute == Some(chosen) || h2 == Some(chosen) || host_fields.contains(&chosen),
                "{chosen:?} is none of the request's values"
            );
        }
        results.push(got.map(|c| c.is_some()));
    }
    let family = match &form {
        NameForm::Named { family, .. } => Some(*family),
        NameForm::Short(_) => None,
        NameForm::Foreign => Some(Family::Short),
    };
    outcome(&(a.port, a.ipv6_literal, family, results))
}
