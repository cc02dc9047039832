//! `annotations`: a pod's annotations, as a user writes them (crates/aether-core/src/model/rows.rs
//! `parse_declared_ports`, crates/aether-core/src/registry/kube/convert.rs `convert_pod`), and the capture ruleset
//! a converted pod gets (crates/aether-core/src/capture/plan.rs).
//!
//! The input is UTF-8 (lossily), one `key=value` per line, `\n` in a value standing for a line
//! end and `\\` for a backslash. `metadata.name`,
//! `metadata.namespace`, `status.podIP`, `status.hostIP` and `spec.serviceAccountName` set
//! those fields of the Pod; every other key is an annotation (the corpus uses the real ones:
//! `endpoint.aether.io/ports`, `capture.aether.io/exclude-outbound-ip-ranges`, ...).
//!
//! Properties, beyond "no panic":
//! - parsed declared ports include the declared port, and written back as an annotation
//!   (`<port>=<protocol>,...`) parse to the same ports;
//! - the row a pod makes is one the registry serves (`row_problem` is `None`), and names its
//!   declared port;
//! - a listed pod is refused exactly when its port annotations do not parse;
//! - the capture ruleset's first line (a comment naming the pod) stays one line: nothing a
//!   manifest names is read by `nft` as a rule.

use std::collections::BTreeMap;

use aether::capture::plan::{Mode, PodCapture, plan};
use aether::model::rows::{parse_declared_ports, row_problem};
use aether::registry::kube::convert::{MissingReadyCondition, Registration, convert_pod};
use aether::registry::kube::pod::MeshPod;
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::engine::Target;
use crate::outcome;

pub(crate) const TARGET: Target = Target {
    name: "annotations",
    max_len: 2048,
    dict: &[
        b"endpoint.aether.io/ports=",
        b"endpoint.aether.io/protocol=",
        b"endpoint.aether.io/port=",
        b"capture.aether.io/redirect-all=",
        b"capture.aether.io/exclude-outbound-ports=",
        b"capture.aether.io/exclude-outbound-ip-ranges=",
        b"aether.io/managed=",
        b"aether.io/netns=",
        b"aether.io/netns-from=cni",
        b"inbound.aether.io/mode=",
        b"metadata.name=",
        b"metadata.namespace=",
        b"status.podIP=",
        b"status.hostIP=",
        b"spec.serviceAccountName=",
        b"=http",
        b"=tcp",
        b"=udp",
        b"=HTTP",
        b"8080",
        b"65535",
        b"0",
        b"true",
        b"false",
        b"strict",
        b"permissive",
        b"10.0.0.0/8",
        b"fd00::/8",
        b"::ffff:10.0.0.1",
        b"/33",
        b",",
        b"\n",
        b"\\n",
        b"\\n#",
    ],
    run,
};

const HEADER: &str =
    "# The next two lines remove any earlier version, so applying this again replaces it.";

/// `\n` to a line end, `\\` to a backslash; any other backslash stays.
fn unescape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

fn run(input: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(input);
    let mut annotations = BTreeMap::new();
    let mut meta = ObjectMeta {
        name: Some("fuzz-pod".into()),
        namespace: Some("mp".into()),
        ..ObjectMeta::default()
    };
    let mut status = PodStatus {
        pod_ip: Some("10.244.0.9".into()),
        ..PodStatus::default()
    };
    let mut spec = PodSpec::default();
    for line in text.split('\n') {
        let (key, value) = line.split_once('=').unwrap_or((line, ""));
        let value = &unescape(value);
        match key {
            "metadata.name" => meta.name = Some(value.to_owned()),
            "metadata.namespace" => meta.namespace = Some(value.to_owned()),
            "status.podIP" => status.pod_ip = Some(value.to_owned()),
            "status.hostIP" => status.host_ip = Some(value.to_owned()),
            "spec.serviceAccountName" => spec.service_account_name = Some(value.to_owned()),
            _ => {
                annotations.insert(key.to_owned(), value.to_owned());
            }
        }
    }

    let declared = parse_declared_ports(&annotations);
    if let Ok(d) = &declared {
        assert!(d.protocols.contains_key(&d.port), "{d:?} lacks its port");
        let written: Vec<String> = d
            .protocols
            .iter()
            .map(|(p, proto)| format!("{p}={proto}"))
            .collect();
        let again = BTreeMap::from([
            ("endpoint.aether.io/ports".to_owned(), written.join(",")),
            ("endpoint.aether.io/port".to_owned(), d.port.to_string()),
        ]);
        assert_eq!(
            parse_declared_ports(&again).as_ref(),
            Ok(d),
            "written back as {again:?}"
        );
        let row = d.to_row("mp", "svc", "10.0.0.1".parse().expect("an ip"), true);
        assert_eq!(row_problem(&row), None, "{row:?}");
    }

    meta.annotations = Some(annotations);
    let pod = Pod {
        metadata: meta,
        spec: Some(spec),
        status: Some(status),
    };
    // As the API server sends it, decoded as the watch decodes it.
    let json = serde_json::to_value(&pod).expect("a pod serializes");
    let pod: MeshPod = serde_json::from_value(json).expect("a pod the API could send decodes");
    let mut sig = vec![format!(
        "{:?}",
        declared
            .as_ref()
            .map(|_| ())
            .map_err(std::mem::discriminant)
    )];
    for missing in [
        MissingReadyCondition::Ready,
        MissingReadyCondition::NotReady,
    ] {
        let conv = match convert_pod(&pod, missing) {
            Ok(c) => c,
            Err(e) => {
                // The error displays; its variant is the outcome.
                let _ = e.to_string();
                sig.push(
                    format!("{e:?}")
                        .chars()
                        .take_while(char::is_ascii_alphabetic)
                        .collect(),
                );
                continue;
            }
        };
        match &conv.registration {
            Some(Registration::Row(row)) => {
                assert!(declared.is_ok(), "a row for annotations that do not parse");
                assert_eq!(row_problem(row), None, "{row:?}");
                assert!(row.ports.contains(&row.port));
                sig.push("row".into());
            }
            Some(Registration::Refused(r)) => {
                assert!(
                    declared.is_err(),
                    "refused though the annotations parse: {r:?}"
                );
                sig.push("refused".into());
            }
            None => sig.push("unlisted".into()),
        }
        let p = &conv.pod;
        let capture = PodCapture {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            ipv4: p.ips.iter().find_map(|ip| match ip {
                std::net::IpAddr::V4(v) => Some(*v),
                std::net::IpAddr::V6(_) => None,
            }),
            ipv6: p.ips.iter().find_map(|ip| match ip {
                std::net::IpAddr::V6(v) => Some(*v),
                std::net::IpAddr::V4(_) => None,
            }),
            mode: if p.redirect_all.unwrap_or(true) {
                Mode::RedirectAll
            } else {
                Mode::Scoped
            },
            exclude_ports: p.exclude_outbound_ports.clone(),
            exclude_ranges: p.exclude_outbound_ip_ranges.clone(),
            udp: false,
            inbound_refused_ports: Vec::new(),
            inbound_trusted: p
                .host_ips
                .iter()
                .map(|&ip| ipnet::IpNet::from(ip))
                .collect(),
        };
        let ruleset = plan(&capture).ruleset();
        assert_eq!(
            ruleset.lines().nth(1),
            Some(HEADER),
            "the ruleset's opening comment spans more than one line:\n{ruleset}"
        );
    }
    outcome(&sig)
}
