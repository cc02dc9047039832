//! The MeshFilter CRD's schema and the converter refuse the same objects (issue #35).
//!
//! The API server refuses what the schema refuses; the daemon drops what serde or
//! [`convert_mesh_filter`] refuses. These tests hold the second net to the first:
//! - every MeshFilter of `charts/aether/tests/invalid-meshfilters.yaml` (which
//!   `scripts/check-chart` shows the schema refusing, each at the field its
//!   `test.aether.io/refused-at` annotation names) is refused here at that same field, or is
//!   marked as one the converter still accepts;
//! - the schema's patterns, compiled with Rust's `regex` (which agrees with the API server's Go
//!   `regexp` on them), accept exactly the strings the converter accepts (`extAuthz.server`,
//!   `extAuthz.timeout`) or the data plane can write (header names and values).

use proptest::prelude::*;
use regex::Regex;

use crate::model::filters::is_mesh_header;
use crate::model::snapshot::MeshFilter;
use crate::registry::kube::convert::{ConvertError, convert_mesh_filter};
use crate::registry::kube::mesh_filter::{ExtAuthzSpec, MeshFilterResource, MeshFilterSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta as K8sObjectMeta;

const INVALID_MESH_FILTERS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/charts/aether/tests/invalid-meshfilters.yaml"
));
const MESH_FILTER_CRD: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/charts/aether/crds/meshfilter.yaml"
));
const REFUSED_AT: &str = "test.aether.io/refused-at";
const CONVERTER: &str = "test.aether.io/converter";

/// Where serde refused an object, spelt as the CRD check spells a field: the path the file
/// registry reports (`spec.targetRefs[0]`), with the field a missing or unknown field error
/// names.
fn serde_location(err: &impl std::fmt::Display) -> String {
    let text = err.to_string();
    let Some((path, message)) = text.split_once(": ") else {
        return text;
    };
    for named in ["missing field `", "unknown field `"] {
        if let Some(field) = message
            .strip_prefix(named)
            .and_then(|rest| rest.split('`').next())
        {
            // A missing field is named under the path of its object; an unknown one is the
            // last step of the path already.
            if path.ends_with(&format!(".{field}")) {
                return path.to_owned();
            }
            return format!("{path}.{field}");
        }
    }
    path.to_owned()
}

/// Where the converter refused an object: the field its error names (`spec` for the count).
fn convert_location(err: &ConvertError) -> String {
    match err {
        ConvertError::MissingField { field, .. }
        | ConvertError::InvalidIp { field, .. }
        | ConvertError::InvalidPort { field, .. }
        | ConvertError::OutOfRange { field, .. }
        | ConvertError::InvalidDuration { field, .. }
        | ConvertError::InvalidValue { field, .. } => field.clone(),
        ConvertError::FilterConfigCount { .. } => "spec".to_owned(),
    }
}

/// A MeshFilter read as the file registry reads one: from its generic value, with the path
/// of the field serde refused.
fn read_mesh_filter(
    object: &serde_json::Value,
) -> Result<MeshFilterResource, serde_path_to_error::Error<serde_json::Error>> {
    serde_path_to_error::deserialize(object)
}

/// One document of the file.
struct Case {
    name: String,
    /// Its `test.aether.io/refused-at` annotation: the field the CRD refuses it at.
    refused_at: String,
    /// Its `test.aether.io/converter` annotation: `refuses` or `accepts`.
    converter: String,
    /// What the daemon makes of it: the filter, or where serde or the converter refused it
    /// and whether serde did.
    verdict: Result<MeshFilter, (String, bool)>,
}

fn invalid_cases() -> Vec<Case> {
    let (raw, broken) = crate::yaml::documents_of(INVALID_MESH_FILTERS);
    assert_eq!(broken, None);
    raw.into_iter()
        .filter(|object| !object.is_null())
        .map(|object| {
            let read = read_mesh_filter(&object);
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            let annotations = &object["metadata"]["annotations"];
            Case {
                name: text(&object["metadata"]["name"]),
                refused_at: text(&annotations[REFUSED_AT]),
                converter: text(&annotations[CONVERTER]),
                verdict: match read {
                    Err(e) => Err((serde_location(&e), true)),
                    Ok(f) => convert_mesh_filter(&f).map_err(|e| (convert_location(&e), false)),
                },
            }
        })
        .collect()
}

#[test]
fn every_meshfilter_the_crd_refuses_is_refused_by_the_converter_at_the_same_field() {
    let cases = invalid_cases();
    let mut converter_fields = Vec::new();
    let (mut by_serde, mut accepted) = (0, 0);
    for Case {
        name,
        refused_at: at,
        converter,
        verdict,
    } in &cases
    {
        assert!(!at.is_empty(), "{name}: no {REFUSED_AT} annotation");
        match (converter.as_str(), verdict) {
            ("refuses", Err((where_, serde))) => {
                assert_eq!(
                    where_, at,
                    "{name}: refused elsewhere than the CRD refuses it"
                );
                if *serde {
                    by_serde += 1;
                } else {
                    converter_fields.push(where_.clone());
                }
            }
            ("refuses", Ok(f)) => {
                panic!("{name}: the CRD refuses it at {at}, the converter reads {f:?}")
            }
            ("accepts", Ok(_)) => accepted += 1,
            ("accepts", Err((where_, _))) => panic!(
                "{name}: the converter now refuses it (at {where_}): mark it `{CONVERTER}: refuses`"
            ),
            (other, _) => panic!("{name}: {CONVERTER} is {other:?}, not refuses or accepts"),
        }
    }
    // Every refusal of convert_mesh_filter has a case (serde's own have theirs besides).
    converter_fields.sort();
    converter_fields.dedup();
    assert_eq!(
        converter_fields,
        [
            "spec",
            "spec.extAuthz.server",
            "spec.extAuthz.timeout",
            "spec.headerMutation.query[0]",
            "spec.targetRefs[0].group",
            "spec.targetRefs[0].kind",
            "spec.targetRefs[0].name",
        ]
    );
    assert!(
        by_serde >= 6 && accepted >= 6,
        "{by_serde} refused by serde, {accepted} accepted, of {}",
        cases.len()
    );
}

#[test]
fn serde_refusals_are_located_as_the_crd_check_locates_them() {
    let head = "apiVersion: aether.io/v1alpha1\nkind: MeshFilter\nspec:\n";
    let read = |text: String| read_mesh_filter(&crate::yaml::from_str(&text).unwrap());
    let err = read(format!("{head}  targetRefs:\n  - kind: Service\n")).unwrap_err();
    assert_eq!(serde_location(&err), "spec.targetRefs[0].group", "{err}");
    let err = read(format!("{head}  rbac:\n    action: No\n")).unwrap_err();
    assert_eq!(serde_location(&err), "spec.rbac.action", "{err}");
}

/// The MeshFilter CRD's `spec` schema.
fn spec_schema() -> serde_json::Value {
    let crd: serde_json::Value = crate::yaml::from_str(MESH_FILTER_CRD).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
}

/// A pattern of the schema, compiled as written: its own `^` and `$` anchor it, as for the API
/// server, which also finds a pattern anywhere in the value.
fn pattern(schema: &serde_json::Value) -> Regex {
    Regex::new(schema["pattern"].as_str().expect("a pattern")).unwrap()
}

fn ext_authz(server: Option<&str>, timeout: Option<&str>) -> MeshFilterResource {
    MeshFilterResource {
        api_version: "aether.io/v1alpha1".into(),
        kind: "MeshFilter".into(),
        metadata: K8sObjectMeta {
            name: Some("authz".into()),
            namespace: Some("shop".into()),
            ..K8sObjectMeta::default()
        },
        spec: MeshFilterSpec {
            ext_authz: Some(ExtAuthzSpec {
                server: server.map(str::to_owned),
                timeout: timeout.map(str::to_owned),
            }),
            ..MeshFilterSpec::default()
        },
        status: None,
    }
}

fn server_converts(server: &str) -> bool {
    convert_mesh_filter(&ext_authz(Some(server), None)).is_ok()
}

fn timeout_converts(timeout: &str) -> bool {
    convert_mesh_filter(&ext_authz(None, Some(timeout))).is_ok()
}

/// What the data plane writes as a header name (proxy/filters.rs): one `http` takes, and not
/// one of the mesh's own.
fn header_name_written(name: &str) -> bool {
    http::HeaderName::from_bytes(name.as_bytes()).is_ok() && !is_mesh_header(name)
}

/// Whether a header name schema of the CRD (pattern, `not` pattern, maxLength) accepts `name`.
fn header_name_schema_accepts(schema: &serde_json::Value, name: &str) -> bool {
    let max = schema["maxLength"].as_u64().expect("a maxLength");
    pattern(schema).is_match(name)
        && !pattern(&schema["not"]).is_match(name)
        && u64::try_from(name.chars().count()).is_ok_and(|n| n <= max)
}

fn header_schemas() -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let h = &spec_schema()["properties"]["headerMutation"]["properties"];
    let (mut names, mut values) = (Vec::new(), Vec::new());
    for side in ["request", "response"] {
        let changes = &h[side]["properties"];
        for list in ["set", "add"] {
            names.push(changes[list]["items"]["properties"]["name"].clone());
            values.push(changes[list]["items"]["properties"]["value"].clone());
        }
        names.push(changes["remove"]["items"].clone());
    }
    (names, values)
}

#[test]
fn every_header_name_and_value_of_the_crd_has_the_same_schema() {
    let (names, values) = header_schemas();
    assert_eq!(names.len(), 6);
    assert!(names.iter().all(|n| *n == names[0]), "{names:?}");
    assert!(values.iter().all(|v| *v == values[0]), "{values:?}");
}

#[test]
fn the_crd_server_and_timeout_patterns_agree_with_the_converter_on_known_cases() {
    let spec = spec_schema();
    let server = pattern(&spec["properties"]["extAuthz"]["properties"]["server"]);
    for s in [
        "authz:9001",
        "authz.security.svc:9001",
        "[::1]:9000",
        "[fd00::1]:65535",
        "a:1",
        "a:0065535",
        "[]:80",
        "[a]:b]:80",
        "a b/c:80",
        "[x\ny]:80",
        "é:80",
        "authz",
        "authz:",
        "authz:0",
        "authz:000",
        "authz:65536",
        "authz:99999999999999999999",
        ":9000",
        "::1:9000",
        "[::1]",
        "[::1:9000",
        "a:b:80",
        "authz:http",
        "authz:+80",
        "authz:80\n",
        "authz: 80",
        "",
    ] {
        assert_eq!(server.is_match(s), server_converts(s), "server {s:?}");
    }
    let timeout = pattern(&spec["properties"]["extAuthz"]["properties"]["timeout"]);
    for t in [
        "200ms",
        "1s",
        "1m30s",
        "1h2m3s4ms",
        "0s",
        "99999h",
        "1ms5s",
        "1h1h",
        "",
        "200",
        "1.5s",
        "1h2m3s4ms5s",
        "100000s",
        "s",
        "1 s",
        "1S",
        "1d",
        "1sm",
        "1mss",
        "-1s",
        "1s\n",
    ] {
        assert_eq!(timeout.is_match(t), timeout_converts(t), "timeout {t:?}");
    }
}

#[test]
fn the_crd_header_schemas_agree_with_the_data_plane_on_known_cases() {
    let (names, values) = header_schemas();
    let (name, value) = (&names[0], pattern(&values[0]));
    for n in [
        "x-tenant",
        "X-Tenant",
        "!#$%&'*+-.^_`|~09azAZ",
        "x-aether",
        "x-aetherx",
        "x-aether-",
        "X-AETHER-error",
        "x-authz-caller",
        "",
        "x tenant",
        "x:y",
        "x\"y",
        "x(y)",
        "x/y",
        "é",
        "x\n",
    ] {
        assert_eq!(
            header_name_schema_accepts(name, n),
            header_name_written(n),
            "name {n:?}"
        );
    }
    let longest = "a".repeat(65535);
    assert!(header_name_written(&longest) && header_name_schema_accepts(name, &longest));
    let too_long = "a".repeat(65536);
    assert!(!header_name_written(&too_long) && !header_name_schema_accepts(name, &too_long));
    for v in [
        "", "shop", "a b", "a\tb", "café", "\u{7f}", "a\rb", "a\nb", "\0", "\u{1f}", "\u{80}",
    ] {
        assert_eq!(
            value.is_match(v),
            http::HeaderValue::from_str(v).is_ok(),
            "value {v:?}"
        );
    }
}

const UNITS: [&str; 10] = ["h", "m", "s", "ms", "h", "m", "s", "ms", "x", ""];

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// `extAuthz.server`: the CRD's pattern accepts exactly what the converter accepts, over
    /// strings shaped like a host, a colon and a port, of the characters that decide it.
    #[test]
    fn the_crd_server_pattern_is_the_converter_s_host_port(
        s in "(\\[[a0-9:\n]{0,4}\\]|[a0-9:.\\[\\] \né]{0,5}):?[0-9a:]{0,6}",
    ) {
        let server = pattern(&spec_schema()["properties"]["extAuthz"]["properties"]["server"]);
        prop_assert_eq!(server.is_match(&s), server_converts(&s));
    }

    /// `extAuthz.server` around the port's bounds: leading zeros, 0, 65535, 65536 and beyond.
    #[test]
    fn the_crd_server_pattern_takes_the_converter_s_ports(
        zeros in 0usize..3,
        port in 0u32..70_000,
    ) {
        let server = pattern(&spec_schema()["properties"]["extAuthz"]["properties"]["server"]);
        let s = format!("authz:{}{port}", "0".repeat(zeros));
        prop_assert_eq!(server.is_match(&s), server_converts(&s));
        prop_assert_eq!(server_converts(&s), (1..=65535).contains(&port));
    }

    /// `extAuthz.timeout`: the CRD's pattern accepts exactly the durations the converter reads.
    #[test]
    fn the_crd_timeout_pattern_is_the_converter_s_duration(
        // Units drawn twice as often as a wrong one or none, so that runs of 5 or 6 valid parts
        // (one too many) come up.
        parts in prop::collection::vec(
            ("[0-9]{0,6}", prop::sample::select(&UNITS[..])),
            0..=6,
        ),
    ) {
        let t: String = parts.iter().map(|(n, unit)| format!("{n}{unit}")).collect();
        let timeout = pattern(&spec_schema()["properties"]["extAuthz"]["properties"]["timeout"]);
        prop_assert_eq!(timeout.is_match(&t), timeout_converts(&t));
    }

    /// Header names and values: the CRD accepts exactly what the data plane writes.
    #[test]
    fn the_crd_header_schemas_are_what_the_data_plane_writes(
        n in "(x-aether-|X-AeThEr-|x-aethe|x-)?[\\x00-\\x7f\u{e9}]{0,3}",
        v in "[\\x00-\\x7f\u{e9}]{0,4}",
    ) {
        let (names, values) = header_schemas();
        prop_assert_eq!(header_name_schema_accepts(&names[0], &n), header_name_written(&n));
        prop_assert_eq!(pattern(&values[0]).is_match(&v), http::HeaderValue::from_str(&v).is_ok());
    }
}
