//! File registry tests: pure parsing over texts, computed slices, and `load_dir` on a temp dir.

use std::path::PathBuf;

use super::*;
use crate::model::port::Transport;
use crate::model::snapshot::SlicePort;

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/kube/",
            $name
        ))
    };
}

fn load(files: &[(&str, &str)]) -> FileLoad {
    let texts: Vec<(PathBuf, String)> = files
        .iter()
        .map(|(p, t)| (PathBuf::from(p), (*t).to_owned()))
        .collect();
    load_texts(&texts)
}

const APP: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: shop
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: echo
  namespace: shop
---
apiVersion: v1
kind: Service
metadata:
  name: echo
  namespace: shop
spec:
  selector:
    app: echo
  ports:
  - name: http
    port: 80
    targetPort: web
    appProtocol: http
  - name: admin
    port: 9090
---
apiVersion: v1
kind: Pod
metadata:
  name: echo-a
  namespace: shop
  labels: {app: echo}
  annotations:
    endpoint.aether.io/ports: "9090"
spec:
  serviceAccountName: echo
  containers:
  - name: echo
    image: echo
    ports:
    - {name: web, containerPort: 8080}
status:
  podIP: 10.0.0.1
---
apiVersion: v1
kind: Pod
metadata:
  name: echo-b
  namespace: shop
  labels: {app: echo}
spec:
  serviceAccountName: echo
  containers:
  - name: echo
    image: echo
    ports:
    - {name: web, containerPort: 8081}
status:
  podIP: 10.0.0.2
  conditions:
  - {type: Ready, status: "False"}
---
apiVersion: v1
kind: Pod
metadata:
  name: other
  namespace: shop
  labels: {app: other}
spec:
  containers:
  - {name: other, image: other}
status:
  podIP: 10.0.0.3
"#;

#[test]
fn a_multi_document_file_loads_every_kind() {
    let l = load(&[("app.yaml", APP)]);
    assert_eq!(l.problems, vec![]);
    let s = &l.snapshot;
    assert_eq!(s.namespaces, vec!["shop"]);
    assert_eq!(s.services.len(), 1);
    assert!(
        s.services[0].cluster_ips.is_empty(),
        "no clusterIP in the manifest: none allocated here"
    );
    assert_eq!(
        s.pods.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        vec!["echo-a", "echo-b", "other"]
    );
    assert_eq!(s.rows.len(), 3);
    assert_eq!(s.rows[0].ports, vec![8080, 9090]);
    // Readiness: no condition means Ready; an explicit False is kept.
    assert!(s.rows[0].ready);
    assert!(!s.rows[1].ready);
    assert_eq!(s.rows[2].service, "default");
}

#[test]
fn named_target_ports_that_pods_resolve_differently_make_one_slice_per_number() {
    let l = load(&[("app.yaml", APP)]);
    let slices = &l.snapshot.endpoint_slices;
    assert_eq!(
        slices.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        vec!["echo-file", "echo-file-2"]
    );
    assert!(
        slices
            .iter()
            .all(|s| s.service == "echo" && s.namespace == "shop")
    );
    let http_port = |i: usize| {
        slices[i]
            .ports
            .iter()
            .find(|p| p.name.as_deref() == Some("http"))
            .unwrap()
            .port
    };
    let pods = |i: usize| {
        slices[i]
            .endpoints
            .iter()
            .map(|e| e.pod.clone().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        (http_port(0), pods(0)),
        (Some(8080), vec!["echo-a".to_owned()])
    );
    assert_eq!(
        (http_port(1), pods(1)),
        (Some(8081), vec!["echo-b".to_owned()])
    );
    assert_eq!(
        slices[0].ports[1],
        SlicePort {
            name: Some("admin".into()),
            port: Some(9090),
            transport: Transport::Tcp
        }
    );
    assert_eq!(
        slices[1].endpoints[0].addresses,
        vec!["10.0.0.2".parse::<std::net::IpAddr>().unwrap()]
    );
}

#[test]
fn computed_slices_skip_terminating_pods_other_namespaces_and_selectorless_services() {
    let svc: K8sService = crate::yaml::from_str(
        "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: a}\nspec:\n  selector: {app: x}\n  ports:\n  - {port: 80, targetPort: 8080, appProtocol: http}\n",
    )
    .unwrap();
    let bare: K8sService =
        crate::yaml::from_str("apiVersion: v1\nkind: Service\nmetadata: {name: bare, namespace: a}\nspec:\n  ports:\n  - {port: 80}\n").unwrap();
    let pod = |name: &str, ns: &str, extra: &str| -> K8sPod {
        crate::yaml::from_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels: {{app: x}}\n{extra}spec:\n  containers: [{{name: c}}]\nstatus:\n  podIPs: [{{ip: 10.1.0.1}}, {{ip: 'fd00::1'}}]\n"
        ))
        .unwrap()
    };
    let live = pod("live", "a", "");
    let gone = pod(
        "gone",
        "a",
        "  deletionTimestamp: \"2025-03-01T00:00:00Z\"\n",
    );
    let elsewhere = pod("elsewhere", "b", "");
    let slices = endpoint_slices_for(&[&svc, &bare], &[&live, &gone, &elsewhere]);
    // One slice per address family, for the Service with a selector only.
    assert_eq!(slices.len(), 2);
    assert_eq!(
        (
            slices[0].address_type.as_str(),
            slices[1].address_type.as_str()
        ),
        ("IPv4", "IPv6")
    );
    assert_eq!(slices[0].metadata.name.as_deref(), Some("s-file"));
    assert_eq!(slices[1].metadata.name.as_deref(), Some("s-file-2"));
    for s in &slices {
        assert_eq!(s.endpoints.len(), 1);
        assert_eq!(
            s.endpoints[0].target_ref.as_ref().unwrap().name.as_deref(),
            Some("live")
        );
        let port = &s.ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.port, port.app_protocol.as_deref()),
            (Some(8080), Some("http"))
        );
    }
    assert_eq!(slices[1].endpoints[0].addresses, vec!["fd00::1"]);

    // A selector that picks nothing still gets one empty slice that names no port.
    let empty = endpoint_slices_for(&[&svc], &[&elsewhere]);
    assert_eq!(empty.len(), 1);
    assert!(empty[0].endpoints.is_empty());
    assert_eq!(empty[0].ports.as_deref(), Some(&[][..]));
}

#[test]
fn a_bad_document_is_reported_with_file_document_and_field_and_the_rest_loads() {
    let text = format!(
        "{APP}---\napiVersion: v1\nkind: Service\nmetadata:\n  name: broken\n  namespace: shop\nspec:\n  ports:\n  - port: eighty\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n---\napiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: echo-a\n  namespace: shop\nstatus:\n  podIP: 10.0.0.9\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: nocap\n  annotations:\n    capture.aether.io/exclude-outbound-ports: \"80,http\"\nstatus:\n  podIP: 10.0.0.10\n"
    );
    let l = load(&[("dir/app.yaml", &text)]);
    // The good documents still load.
    assert_eq!(l.snapshot.services.len(), 1);
    assert_eq!(l.snapshot.pods.len(), 3);
    let p = &l.problems;
    assert_eq!(p.len(), 5, "{p:#?}");
    assert!(p.iter().all(|p| p.file == Path::new("dir/app.yaml")));

    assert_eq!(
        (p[0].document, p[0].kind.as_deref(), p[0].name.as_deref()),
        (7, Some("Service"), Some("shop/broken"))
    );
    match &p[0].issue {
        ManifestIssue::Invalid {
            kind: "Service",
            message,
        } => {
            assert!(
                message.starts_with("spec.ports[0].port: invalid type: string \"eighty\""),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(&p[1].issue, ManifestIssue::UnsupportedKind { kind, .. } if kind == "Deployment")
    );
    assert_eq!(p[1].document, 8);
    assert!(
        p[1].to_string()
            .contains("not supported by the file registry"),
        "{}",
        p[1]
    );
    assert!(
        matches!(&p[2].issue, ManifestIssue::UnknownKind { kind, api_version } if kind == "Widget" && api_version == "example.com/v1")
    );
    assert_eq!(
        p[3].issue,
        ManifestIssue::Duplicate {
            first_file: PathBuf::from("dir/app.yaml"),
            first_document: 4
        }
    );
    assert_eq!(p[3].document, 10);
    // The pod without a namespace is in `default`, and its bad annotation names the field.
    assert_eq!(
        (p[4].document, p[4].name.as_deref()),
        (11, Some("default/nocap"))
    );
    assert!(
        matches!(&p[4].issue, ManifestIssue::Convert(ConvertError::InvalidValue { field, .. }) if field == "metadata.annotations[capture.aether.io/exclude-outbound-ports]")
    );
    assert_eq!(
        p[0].to_string(),
        format!(
            "dir/app.yaml document 7 (Service shop/broken): {}",
            p[0].issue
        )
    );
}

#[test]
fn a_yaml_syntax_error_stops_that_file_but_not_the_others() {
    let l = load(&[
        (
            "a.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: one}\n---\nfoo: [\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: lost}\n",
        ),
        (
            "b.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: two}\n---\n",
        ),
    ]);
    assert_eq!(l.snapshot.namespaces, vec!["one", "two"]);
    assert_eq!(l.problems.len(), 1);
    assert_eq!(
        (l.problems[0].file.as_path(), l.problems[0].document),
        (Path::new("a.yaml"), 2)
    );
    assert!(matches!(l.problems[0].issue, ManifestIssue::Syntax { .. }));
}

#[test]
fn every_fixture_loads_without_problems_except_the_bad_pods() {
    let l = load(&[
        ("endpointslice.yaml", fixture!("endpointslice.yaml")),
        ("grpcroute.yaml", fixture!("grpcroute.yaml")),
        ("httproute.yaml", fixture!("httproute.yaml")),
        ("l4routes.yaml", fixture!("l4routes.yaml")),
        ("meshfilters.yaml", fixture!("meshfilters.yaml")),
        ("pods.yaml", fixture!("pods.yaml")),
        ("referencegrant.yaml", fixture!("referencegrant.yaml")),
        ("services.yaml", fixture!("services.yaml")),
    ]);
    let s = &l.snapshot;
    // Only `badcapture-0` fails conversion; grpc-0 and badport-0 are refused rows, not problems.
    assert_eq!(l.problems.len(), 1, "{:#?}", l.problems);
    assert_eq!(l.problems[0].name.as_deref(), Some("shop/badcapture-0"));
    assert_eq!(
        s.refused_pods
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        vec!["grpc-0", "badport-0"]
    );
    assert_eq!(s.http_routes.len(), 2);
    assert_eq!(
        (s.tls_routes.len(), s.tcp_routes.len(), s.udp_routes.len()),
        (1, 1, 1)
    );
    assert_eq!(s.reference_grants.len(), 1);
    assert_eq!(s.mesh_filters.len(), 4);
    assert_eq!(s.services.len(), 4);
    // The explicit slice plus computed ones for echo, db and api (selectors; web has none).
    let names: Vec<&str> = s.endpoint_slices.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, vec!["api-8kx7w", "echo-file", "db-file", "api-file"]);
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "aether-file-registry-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("nested")).unwrap();
    dir
}

#[test]
fn load_dir_reads_yaml_files_recursively_in_sorted_order() {
    let dir = temp_dir("sorted");
    std::fs::write(
        dir.join("b.yaml"),
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("nested/a.yml"),
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: nested}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("a.yaml"),
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n",
    )
    .unwrap();
    std::fs::write(dir.join("notes.txt"), "not yaml: [").unwrap();
    std::fs::write(
        dir.join("c.yaml"),
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n",
    )
    .unwrap();
    let l = load_dir(&dir).unwrap();
    assert_eq!(l.snapshot.namespaces, vec!["a", "b", "nested"]);
    assert_eq!(l.problems.len(), 1);
    assert_eq!(l.problems[0].file, dir.join("c.yaml"));
    assert_eq!(
        l.problems[0].issue,
        ManifestIssue::Duplicate {
            first_file: dir.join("a.yaml"),
            first_document: 1
        }
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn load_dir_on_a_missing_directory_is_a_file_error() {
    let dir = std::env::temp_dir().join(format!(
        "aether-file-registry-{}-missing",
        std::process::id()
    ));
    match load_dir(&dir) {
        Err(FileError::ReadDir { path, source }) => {
            assert_eq!(path, dir);
            assert_eq!(source.kind(), io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
}

/// A Pod document in flow style, so that a cut inside it is a YAML syntax error.
fn pod(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{serviceAccountName: echo, nodeName: node-a}}\nstatus: {{podIP: {ip}}}\n---\n"
    )
}

/// The pods of a load, as `name=ip`.
fn pods_of(l: &FileLoad) -> Vec<String> {
    let mut out: Vec<String> = l
        .snapshot
        .pods
        .iter()
        .map(|p| {
            format!(
                "{}={}",
                p.name,
                p.ips.first().map(ToString::to_string).unwrap_or_default()
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_file_read_half_written_keeps_its_last_good_content_and_other_files_still_update() {
    let dir = temp_dir("half-written");
    let a = format!("{}{}", pod("a-0", "10.0.0.1"), pod("a-1", "10.0.0.2"));
    std::fs::write(dir.join("a.yaml"), &a).unwrap();
    std::fs::write(dir.join("b.yaml"), pod("b-0", "10.0.1.1")).unwrap();
    let mut last = LastGood::default();
    let l = load_dir_keeping(&dir, &mut last).unwrap();
    assert_eq!(
        pods_of(&l),
        ["a-0=10.0.0.1", "a-1=10.0.0.2", "b-0=10.0.1.1"]
    );
    assert_eq!(l.faults, []);

    // a.yaml is being rewritten in place: read with the second pod cut in its metadata. b.yaml
    // changes at the same time.
    let cut = a.find("a-1").unwrap() + 2;
    std::fs::write(dir.join("a.yaml"), &a[..cut]).unwrap();
    std::fs::write(
        dir.join("b.yaml"),
        format!("{}{}", pod("b-0", "10.0.1.1"), pod("b-1", "10.0.1.2")),
    )
    .unwrap();
    let l = load_dir_keeping(&dir, &mut last).unwrap();
    assert_eq!(
        pods_of(&l),
        [
            "a-0=10.0.0.1",
            "a-1=10.0.0.2",
            "b-0=10.0.1.1",
            "b-1=10.0.1.2"
        ],
        "a half-written file took its pods out of the registry"
    );
    assert_eq!(l.faults.len(), 1, "{:?}", l.faults);
    assert_eq!(l.faults[0].file, dir.join("a.yaml"));
    assert!(l.faults[0].kept_last_good);
    assert!(
        matches!(l.faults[0].issue, FileIssue::Syntax { document: 2, .. }),
        "{:?}",
        l.faults[0]
    );
    assert!(
        l.faults[0]
            .to_string()
            .contains("last content that read whole is used"),
        "{}",
        l.faults[0]
    );

    // Truncated to be rewritten: empty, still the last good content.
    std::fs::write(dir.join("a.yaml"), "").unwrap();
    let l = load_dir_keeping(&dir, &mut last).unwrap();
    assert_eq!(pods_of(&l).len(), 4);
    assert_eq!(l.faults[0].issue, FileIssue::Emptied);

    // Whole again: what it says now is used, and nothing is reported.
    std::fs::write(dir.join("a.yaml"), pod("a-0", "10.0.0.1")).unwrap();
    let l = load_dir_keeping(&dir, &mut last).unwrap();
    assert_eq!(
        pods_of(&l),
        ["a-0=10.0.0.1", "b-0=10.0.1.1", "b-1=10.0.1.2"]
    );
    assert_eq!(l.faults, []);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_syntax_error_in_the_middle_of_a_file_keeps_the_whole_last_good_file() {
    let dir = temp_dir("syntax-middle");
    std::fs::write(
        dir.join("a.yaml"),
        format!("{}{}", pod("a-0", "10.0.0.1"), pod("a-1", "10.0.0.2")),
    )
    .unwrap();
    let mut last = LastGood::default();
    load_dir_keeping(&dir, &mut last).unwrap();
    // A broken document between the two pods, and a-1 moved: the file is not taken in part.
    std::fs::write(
        dir.join("a.yaml"),
        format!(
            "{}foo: [\n---\n{}",
            pod("a-0", "10.0.0.1"),
            pod("a-1", "10.0.0.9")
        ),
    )
    .unwrap();
    let l = load_dir_keeping(&dir, &mut last).unwrap();
    assert_eq!(
        pods_of(&l),
        ["a-0=10.0.0.1", "a-1=10.0.0.2"],
        "the documents after a syntax error were dropped (or the file taken in part)"
    );
    assert!(
        matches!(
            &l.faults[..],
            [FileFault {
                issue: FileIssue::Syntax { document: 2, .. },
                kept_last_good: true,
                ..
            }]
        ),
        "{:?}",
        l.faults
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_non_utf8_file_is_held_and_every_other_file_still_updates() {
    let dir = temp_dir("non-utf8");
    std::fs::write(dir.join("a.yaml"), pod("a-0", "10.0.0.1")).unwrap();
    std::fs::write(dir.join("b.yaml"), pod("b-0", "10.0.1.1")).unwrap();
    let mut last = LastGood::default();
    load_dir_keeping(&dir, &mut last).unwrap();
    let mut bytes = pod("a-0", "10.0.0.7").into_bytes();
    bytes.insert(10, 0xff);
    std::fs::write(dir.join("a.yaml"), &bytes).unwrap();
    // A new file that was never whole: skipped, reported.
    std::fs::write(dir.join("c.yaml"), [0xfe, 0xff, b'\n']).unwrap();
    std::fs::write(dir.join("b.yaml"), pod("b-0", "10.0.1.2")).unwrap();
    let l = load_dir_keeping(&dir, &mut last)
        .unwrap_or_else(|e| panic!("one non-UTF-8 file blocked the whole load: {e}"));
    assert_eq!(pods_of(&l), ["a-0=10.0.0.1", "b-0=10.0.1.2"]);
    assert_eq!(
        l.faults,
        [
            FileFault {
                file: dir.join("a.yaml"),
                issue: FileIssue::NotUtf8 { offset: 10 },
                kept_last_good: true,
            },
            FileFault {
                file: dir.join("c.yaml"),
                issue: FileIssue::NotUtf8 { offset: 0 },
                kept_last_good: false,
            },
        ]
    );
    assert!(
        l.faults[1]
            .to_string()
            .ends_with("skipped: it never read whole")
    );
    // The fingerprint reads bytes: it does not fail on the file, and it sees it change.
    let before = fingerprint(&dir).unwrap();
    std::fs::write(dir.join("c.yaml"), [0xfe, 0xfe, b'\n']).unwrap();
    assert_ne!(fingerprint(&dir).unwrap(), before);
    // A deleted file is forgotten: its last good content is not used again.
    std::fs::remove_file(dir.join("a.yaml")).unwrap();
    let l = load_dir_keeping(&dir, &mut last).unwrap();
    assert_eq!(pods_of(&l), ["b-0=10.0.1.2"]);
    assert_eq!(last.len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn without_a_last_good_content_a_file_that_does_not_read_whole_is_skipped_whole() {
    let dir = temp_dir("never-whole");
    std::fs::write(
        dir.join("a.yaml"),
        format!("{}foo: [\n", pod("a-0", "10.0.0.1")),
    )
    .unwrap();
    std::fs::write(dir.join("b.yaml"), pod("b-0", "10.0.1.1")).unwrap();
    let l = load_dir(&dir).unwrap();
    assert_eq!(pods_of(&l), ["b-0=10.0.1.1"]);
    assert!(
        matches!(
            &l.faults[..],
            [FileFault {
                issue: FileIssue::Syntax { document: 2, .. },
                kept_last_good: false,
                ..
            }]
        ),
        "{:?}",
        l.faults
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

mod never_panics {
    use proptest::prelude::*;

    use super::*;

    const FIXTURE: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/examples/mp/10-mp-mixed.yaml"
    ));

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Bad manifests are reported, never a panic: arbitrary text.
        #[test]
        fn arbitrary_text_loads_or_is_reported(text in "\\PC{0,400}") {
            let out = load(&[("x.yaml", &text)]);
            for p in &out.problems {
                prop_assert_eq!(p.file.to_str(), Some("x.yaml"));
                prop_assert!(p.document >= 1);
            }
        }

        /// A real manifest with one byte range cut out or replaced: still no panic, and every
        /// document either converts or is reported with its file and document number.
        #[test]
        fn a_damaged_fixture_loads_or_is_reported(cut in 0usize..2000, len in 0usize..40, with in "[ :a-z0-9\\-\\n\"]{0,6}") {
            let start = cut.min(FIXTURE.len());
            let end = (start + len).min(FIXTURE.len());
            if FIXTURE.is_char_boundary(start) && FIXTURE.is_char_boundary(end) {
                let text = format!("{}{with}{}", &FIXTURE[..start], &FIXTURE[end..]);
                let out = load(&[("damaged.yaml", &text)]);
                for p in &out.problems {
                    prop_assert_eq!(p.file.to_str(), Some("damaged.yaml"));
                    prop_assert!(p.document >= 1);
                }
            }
        }
    }
}

#[test]
fn a_mesh_filter_that_cannot_be_read_is_kept_as_one_that_refuses() {
    use crate::model::snapshot::FilterConfig;
    // issue #35 item 1: before, each of these was reported and dropped, and the Services it
    // named were served without it.
    let l = load(&[(
        "filters.yaml",
        r#"
apiVersion: aether.io/v1alpha1
kind: MeshFilter
metadata: {name: no-port, namespace: mp}
spec:
  targetRefs: [{group: "", kind: Service, name: mp-nine}]
  extAuthz: {server: "mp-authz.mp.aether.internal"}
---
apiVersion: aether.io/v1alpha1
kind: MeshFilter
metadata: {name: bad-target, namespace: mp}
spec:
  targetRefs: [{group: "", kind: Deployment, name: mp-nine}]
  rbac: {action: Allow, principals: []}
---
apiVersion: aether.io/v1alpha1
kind: MeshFilter
metadata: {name: misspelt, namespace: mp}
spec:
  targetRefs: [{group: "", kind: Service, name: mp-multi}]
  extAuthz: {sever: "mp-authz.mp.aether.internal:9191"}
---
apiVersion: aether.io/v1beta1
kind: MeshFilter
metadata: {name: newer, namespace: other}
spec: {}
"#,
    )]);
    // Each is still reported, once.
    assert_eq!(l.problems.len(), 4, "{:#?}", l.problems);
    let got: Vec<(String, Vec<String>, bool)> = l
        .snapshot
        .mesh_filters
        .iter()
        .map(|f| match &f.config {
            FilterConfig::Unreadable(u) => {
                (f.name.clone(), f.target_refs.clone(), u.whole_namespace)
            }
            other => panic!("{}: {other:?}", f.name),
        })
        .collect();
    assert_eq!(
        got,
        [
            // Its targets read: those are refused.
            ("no-port".to_owned(), vec!["mp-nine".to_owned()], false),
            // Its targets do not read (or it does not decode at all): its whole namespace.
            ("bad-target".to_owned(), vec![], true),
            ("misspelt".to_owned(), vec![], true),
            ("newer".to_owned(), vec![], true),
        ]
    );
}
