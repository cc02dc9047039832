//! Conversion tests against object shapes as `kubectl get -o yaml` prints them
//! (`tests/fixtures/kube/`).

use std::collections::BTreeMap;

use gateway_api::experimental::grpcroutes::GrpcRoute as GatewayGrpcRoute;
use gateway_api::experimental::httproutes::HttpRoute as GatewayHttpRoute;
use gateway_api::experimental::referencegrants::ReferenceGrant as GatewayReferenceGrant;
use gateway_api::experimental::tcproutes::TcpRoute as GatewayTcpRoute;
use gateway_api::experimental::tlsroutes::TlsRoute as GatewayTlsRoute;
use gateway_api::experimental::udproutes::UdpRoute as GatewayUdpRoute;
use k8s_openapi::api::core::v1::Pod as K8sPod;
use serde::de::DeserializeOwned;

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Namespace as K8sNamespace;
use k8s_openapi::api::core::v1::Service as K8sService;
use k8s_openapi::api::discovery::v1::EndpointSlice as K8sEndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString as K8sIntOrString;

use crate::model::port::PortProtocol;
use crate::model::port::Transport;
use crate::model::rows::row_problem;
use crate::model::rows::{ANNOTATION_EXCLUDE_PORTS, ANNOTATION_EXCLUDE_RANGES};
use crate::model::snapshot::{
    ExtAuthz, FilterConfig, HeaderModifier, HttpFilter, HttpRoute, HttpRouteKind, MeshFilter,
    Mirror, ObjectRef, PathMatch, PathModifier, Principal, ProtocolValue, QueryMutation,
    RbacAction, ValueMatchKind,
};
use crate::model::snapshot::{Row, ServicePort, SliceEndpoint, SlicePort, TargetPort};
use crate::registry::kube::convert::*;
use crate::registry::kube::mesh_filter::MeshFilterResource;
use crate::registry::kube::pod::MeshPod;

// The CRD's schema against the converter, on charts/aether/tests/invalid-meshfilters.yaml.
mod crd_tests;

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/kube/",
            $name
        ))
    };
}

/// Every document of a multi-document YAML text, as `T`.
fn docs<T: DeserializeOwned>(text: &str) -> Vec<T> {
    let (docs, broken) = crate::yaml::documents_of(text);
    assert_eq!(broken, None);
    docs.into_iter()
        .filter(|d| !d.is_null())
        .map(|d| serde_json::from_value(d).unwrap())
        .collect()
}

fn pod(name: &str) -> K8sPod {
    docs::<K8sPod>(fixture!("pods.yaml"))
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .unwrap()
}

fn service(name: &str) -> K8sService {
    docs::<K8sService>(fixture!("services.yaml"))
        .into_iter()
        .find(|s| s.metadata.name.as_deref() == Some(name))
        .unwrap()
}

fn row_of(c: &PodConversion) -> &Row {
    match &c.registration {
        Some(Registration::Row(r)) => r,
        other => panic!("expected a row, got {other:?}"),
    }
}

fn protocols(row: &Row) -> Vec<(u32, PortProtocol)> {
    row.port_protocols
        .as_ref()
        .unwrap()
        .iter()
        .map(|(&p, v)| match v {
            ProtocolValue::Known(proto) => (p, *proto),
            other => panic!("port {p} has {other:?}"),
        })
        .collect()
}

// === durations ===

#[test]
fn gateway_durations_convert_to_milliseconds() {
    assert_eq!(parse_duration_ms("10s"), Some(10_000));
    assert_eq!(parse_duration_ms("500ms"), Some(500));
    assert_eq!(parse_duration_ms("1h2m"), Some(3_720_000));
    assert_eq!(parse_duration_ms("1m30s250ms"), Some(90_250));
    assert_eq!(parse_duration_ms("0s"), Some(0));
    for bad in [
        "",
        "10",
        "1.5s",
        "-1s",
        "10us",
        "123456s",
        "1h1m1s1ms1h",
        "s",
        "10 s",
    ] {
        assert_eq!(parse_duration_ms(bad), None, "{bad:?}");
    }
}

// === pods ===

#[test]
fn annotated_pod_converts_every_annotation_and_its_row_names_every_port() {
    let c = convert_pod(
        &MeshPod::from(&pod("web-0")),
        MissingReadyCondition::NotReady,
    )
    .unwrap();
    let p = &c.pod;
    assert_eq!((p.namespace.as_str(), p.name.as_str()), ("shop", "web-0"));
    assert_eq!(p.service_account, "web");
    assert_eq!(p.node.as_deref(), Some("node-a"));
    assert_eq!(
        p.ips,
        vec![
            "10.244.1.7".parse::<IpAddr>().unwrap(),
            "fd00:10:244:1::7".parse().unwrap()
        ]
    );
    assert_eq!(p.labels.get("app").map(String::as_str), Some("web"));
    assert!(p.managed);
    assert!(p.ready);
    assert_eq!(p.redirect_all, Some(false));
    assert_eq!(p.exclude_outbound_ports, vec![5432, 6379]);
    assert_eq!(
        p.exclude_outbound_ip_ranges,
        vec![
            "10.0.0.0/8".parse::<ipnet::IpNet>().unwrap(),
            "fd00::/8".parse().unwrap()
        ]
    );
    assert_eq!(p.netns.as_deref(), Some("/var/run/netns/web-0"));
    assert_eq!(
        p.command,
        vec!["/bin/web", "--listen=:8080", "--admin=:9090"]
    );

    let row = row_of(&c);
    assert_eq!(
        (row.namespace.as_str(), row.service.as_str()),
        ("shop", "web")
    );
    assert_eq!(row.address, "10.244.1.7".parse::<IpAddr>().unwrap());
    assert_eq!(row.port, 8080);
    // The declared port repeats `8080=tcp` and takes that suffix; 9090 takes the pod default.
    assert_eq!(
        protocols(row),
        vec![
            (8080, PortProtocol::Tcp),
            (9000, PortProtocol::Tcp),
            (9090, PortProtocol::Http)
        ]
    );
    assert_eq!(row.ports, vec![8080, 9000, 9090]);
    assert!(row.ready);
    assert_eq!(row.pod.as_deref(), Some("web-0"));
    assert_eq!(row.node.as_deref(), Some("node-a"));
    assert_eq!(row_problem(row), None);
}

#[test]
fn pod_without_annotations_declares_8080_http_as_the_default_account() {
    let c = convert_pod(
        &MeshPod::from(&pod("plain-0")),
        MissingReadyCondition::Ready,
    )
    .unwrap();
    assert_eq!(c.pod.service_account, DEFAULT_SERVICE_ACCOUNT);
    assert_eq!(c.pod.redirect_all, None);
    assert!(c.pod.exclude_outbound_ports.is_empty());
    assert!(c.pod.command.is_empty());
    // The Ready condition says False: that wins over the file default.
    assert!(!c.pod.ready);
    let row = row_of(&c);
    assert_eq!(row.service, "default");
    assert_eq!(row.port, 8080);
    assert_eq!(protocols(row), vec![(8080, PortProtocol::Http)]);
    assert!(!row.ready);
    assert_eq!(row.node.as_deref(), Some("node-b"));
    assert_eq!(row_problem(row), None);
}

#[test]
fn missing_ready_condition_follows_the_backend_default() {
    let p = pod("grpc-0");
    assert!(
        convert_pod(&MeshPod::from(&p), MissingReadyCondition::Ready)
            .unwrap()
            .pod
            .ready
    );
    assert!(
        !convert_pod(&MeshPod::from(&p), MissingReadyCondition::NotReady)
            .unwrap()
            .pod
            .ready
    );
}

#[test]
fn invalid_pod_level_annotations_refuse_the_pod_as_unparseable() {
    for (name, needle) in [("grpc-0", "grpc"), ("badport-0", "abc")] {
        let c = convert_pod(&MeshPod::from(&pod(name)), MissingReadyCondition::Ready).unwrap();
        match &c.registration {
            Some(Registration::Refused(r)) => {
                assert_eq!((r.namespace.as_str(), r.name.as_str()), ("shop", name));
                assert!(r.detail.contains(needle), "{}", r.detail);
            }
            other => panic!("{name}: expected a refusal, got {other:?}"),
        }
        // The pod itself is still known (capture, pod-IP dials).
        assert_eq!(c.pod.name, name);
    }
}

#[test]
fn unmanaged_pending_and_terminating_pods_are_not_listed() {
    let unmanaged = convert_pod(
        &MeshPod::from(&pod("legacy-0")),
        MissingReadyCondition::Ready,
    )
    .unwrap();
    assert!(!unmanaged.pod.managed);
    assert_eq!(unmanaged.registration, None);

    let pending = convert_pod(
        &MeshPod::from(&pod("pending-0")),
        MissingReadyCondition::Ready,
    )
    .unwrap();
    assert!(pending.pod.ips.is_empty());
    assert_eq!(pending.registration, None);

    let terminating =
        convert_pod(&MeshPod::from(&pod("web-1")), MissingReadyCondition::Ready).unwrap();
    assert_eq!(
        terminating.pod.ips,
        vec!["10.244.1.11".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(terminating.registration, None);
}

#[test]
fn a_bad_capture_annotation_is_an_error_naming_the_annotation() {
    let err = convert_pod(
        &MeshPod::from(&pod("badcapture-0")),
        MissingReadyCondition::Ready,
    )
    .unwrap_err();
    match &err {
        ConvertError::InvalidValue {
            object,
            field,
            value,
            ..
        } => {
            assert_eq!(object.to_string(), "Pod shop/badcapture-0");
            assert_eq!(
                field,
                "metadata.annotations[capture.aether.io/redirect-all]"
            );
            assert_eq!(value, "yes");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "Pod shop/badcapture-0: metadata.annotations[capture.aether.io/redirect-all]: \"yes\" is not \"true\" or \"false\""
    );
}

#[test]
fn bad_exclude_lists_are_errors() {
    let mut p = pod("plain-0");
    let set = |p: &mut K8sPod, k: &str, v: &str| {
        p.metadata.annotations = Some(BTreeMap::from([(k.to_owned(), v.to_owned())]));
    };
    set(&mut p, ANNOTATION_EXCLUDE_PORTS, "80,0");
    assert!(matches!(
        convert_pod(&MeshPod::from(&p), MissingReadyCondition::Ready),
        Err(ConvertError::InvalidValue { ref field, .. }) if field.contains(ANNOTATION_EXCLUDE_PORTS)
    ));
    set(&mut p, ANNOTATION_EXCLUDE_RANGES, "10.0.0.0/8,10.1.2.3");
    assert!(matches!(
        convert_pod(&MeshPod::from(&p), MissingReadyCondition::Ready),
        Err(ConvertError::InvalidValue { ref field, .. }) if field.contains(ANNOTATION_EXCLUDE_RANGES)
    ));
    set(&mut p, ANNOTATION_EXCLUDE_PORTS, "");
    assert!(
        convert_pod(&MeshPod::from(&p), MissingReadyCondition::Ready)
            .unwrap()
            .pod
            .exclude_outbound_ports
            .is_empty()
    );
}

#[test]
fn reserved_ports_are_not_a_conversion_error() {
    let c = convert_pod(
        &MeshPod::from(&pod("reserved-0")),
        MissingReadyCondition::Ready,
    )
    .unwrap();
    let row = row_of(&c);
    assert_eq!(row.port, 9000);
    assert_eq!(
        protocols(row),
        vec![
            (7000, PortProtocol::Udp),
            (9000, PortProtocol::Tcp),
            (18081, PortProtocol::Http)
        ]
    );
}

#[test]
fn a_pod_without_a_name_is_an_error() {
    let mut p = pod("plain-0");
    p.metadata.name = None;
    assert!(matches!(
        convert_pod(&MeshPod::from(&p), MissingReadyCondition::Ready),
        Err(ConvertError::MissingField { ref field, .. }) if field == "metadata.name"
    ));
}

// === services and slices ===

#[test]
fn dual_stack_service_keeps_both_cluster_ips_and_its_ports() {
    let s = convert_service(&service("echo")).unwrap();
    assert_eq!(
        s.cluster_ips,
        vec![
            "10.96.12.34".parse::<IpAddr>().unwrap(),
            "fd00:10:96::1234".parse().unwrap()
        ]
    );
    assert!(!s.headless && !s.generated);
    assert_eq!(
        s.selector,
        Some(BTreeMap::from([("app".to_owned(), "echo".to_owned())]))
    );
    assert_eq!(
        s.ports,
        vec![
            ServicePort {
                name: Some("http".into()),
                port: 80,
                target: TargetPort::Number(8080),
                transport: Transport::Tcp,
                app_protocol: Some("http".into()),
            },
            ServicePort {
                name: Some("dns".into()),
                port: 53,
                target: TargetPort::Number(5353),
                transport: Transport::Udp,
                app_protocol: None,
            },
        ]
    );
}

#[test]
fn headless_named_target_and_generated_services_convert() {
    let db = convert_service(&service("db")).unwrap();
    assert!(db.headless);
    assert!(db.cluster_ips.is_empty());

    let api = convert_service(&service("api")).unwrap();
    assert_eq!(api.ports[0].target, TargetPort::Name("grpc-port".into()));
    assert_eq!(
        api.ports[0].app_protocol.as_deref(),
        Some("kubernetes.io/h2c")
    );
    assert_eq!(api.ports[1].target, TargetPort::Same);
    assert_eq!(api.ports[1].name, None);

    let web = convert_service(&service("web")).unwrap();
    assert!(web.generated);
    assert_eq!(web.selector, None);
}

#[test]
fn a_service_port_out_of_range_names_the_field() {
    let mut s = service("echo");
    s.spec.as_mut().unwrap().ports.as_mut().unwrap()[1].target_port =
        Some(K8sIntOrString::Int(70000));
    let err = convert_service(&s).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Service shop/echo: spec.ports[1].targetPort: 70000 is not a port number in 1-65535"
    );
}

/// The field an error names, whatever the variant.
fn field_of(e: ConvertError) -> String {
    match e {
        ConvertError::InvalidIp { field, .. }
        | ConvertError::InvalidPort { field, .. }
        | ConvertError::InvalidValue { field, .. } => field,
        other => panic!("not a value error: {other}"),
    }
}

#[test]
fn a_refused_value_names_its_field_with_its_index() {
    let mut p = pod("web-0");
    let status = p.status.as_mut().unwrap();
    status.pod_ips.as_mut().unwrap()[1].ip = "fd00::zz".into();
    assert_eq!(
        field_of(
            convert_pod(&MeshPod::from(&p), MissingReadyCondition::NotReady)
                .err()
                .unwrap()
        ),
        "status.podIPs[1].ip"
    );
    let mut p = pod("web-0");
    let status = p.status.as_mut().unwrap();
    status.host_ips = None;
    status.host_ip = Some("host".into());
    assert_eq!(
        field_of(
            convert_pod(&MeshPod::from(&p), MissingReadyCondition::NotReady)
                .err()
                .unwrap()
        ),
        "status.hostIP"
    );

    // The field `echo` is refused on once `change` has been made to its spec.
    let refused_on = |change: &dyn Fn(&mut k8s_openapi::api::core::v1::ServiceSpec)| {
        let mut s = service("echo");
        change(s.spec.as_mut().unwrap());
        field_of(convert_service(&s).unwrap_err())
    };
    assert_eq!(
        refused_on(&|spec| spec.cluster_ips.as_mut().unwrap()[1] = "fd00::zz".into()),
        "spec.clusterIPs[1]"
    );
    assert_eq!(
        refused_on(&|spec| {
            spec.cluster_ips = None;
            spec.cluster_ip = Some("10.96".into());
        }),
        "spec.clusterIP"
    );
    assert_eq!(
        refused_on(&|spec| spec.ports.as_mut().unwrap()[1].protocol = Some("QUIC".into())),
        "spec.ports[1].protocol"
    );
    assert_eq!(
        refused_on(&|spec| {
            spec.ports.as_mut().unwrap()[0].target_port =
                Some(K8sIntOrString::String(String::new()));
        }),
        "spec.ports[0].targetPort"
    );

    let mut slice: K8sEndpointSlice =
        crate::yaml::from_str(fixture!("endpointslice.yaml")).unwrap();
    slice.ports.as_mut().unwrap()[0].port = Some(0);
    assert_eq!(
        field_of(convert_endpoint_slice(&slice).unwrap_err()),
        "ports[0].port"
    );
    let mut slice: K8sEndpointSlice =
        crate::yaml::from_str(fixture!("endpointslice.yaml")).unwrap();
    slice.ports.as_mut().unwrap()[0].protocol = Some("ICMP".into());
    assert_eq!(
        field_of(convert_endpoint_slice(&slice).unwrap_err()),
        "ports[0].protocol"
    );
}

#[test]
fn endpoint_slice_converts_ports_addresses_and_pods() {
    let slice: K8sEndpointSlice = crate::yaml::from_str(fixture!("endpointslice.yaml")).unwrap();
    let s = convert_endpoint_slice(&slice).unwrap();
    assert_eq!(
        (s.namespace.as_str(), s.service.as_str(), s.name.as_str()),
        ("shop", "api", "api-8kx7w")
    );
    assert_eq!(
        s.ports,
        vec![
            SlicePort {
                name: Some("grpc".into()),
                port: Some(9000),
                transport: Transport::Tcp
            },
            SlicePort {
                name: None,
                port: Some(8443),
                transport: Transport::Tcp
            },
        ]
    );
    assert_eq!(
        s.endpoints,
        vec![
            SliceEndpoint {
                addresses: vec!["10.244.1.20".parse().unwrap()],
                pod: Some("api-7d9f8c6b5-x2k4q".into()),
                ready: true,
            },
            SliceEndpoint {
                addresses: vec!["10.244.2.21".parse().unwrap()],
                pod: Some("api-7d9f8c6b5-m8n2p".into()),
                // `conditions.ready: false` in the fixture.
                ready: false,
            },
        ]
    );
}

#[test]
fn endpoint_slice_without_service_label_or_with_bad_address_is_an_error() {
    let mut slice: K8sEndpointSlice =
        crate::yaml::from_str(fixture!("endpointslice.yaml")).unwrap();
    slice.endpoints[1].addresses[0] = "10.244.2".into();
    let err = convert_endpoint_slice(&slice).unwrap_err();
    assert_eq!(
        err.to_string(),
        "EndpointSlice shop/api-8kx7w: endpoints[1].addresses[0]: \"10.244.2\" is not an ip address"
    );
    slice.metadata.labels = None;
    assert!(matches!(
        convert_endpoint_slice(&slice),
        Err(ConvertError::MissingField { ref field, .. }) if field == "metadata.labels[kubernetes.io/service-name]"
    ));
}

#[test]
fn namespace_converts_to_its_name() {
    let ns: K8sNamespace = crate::yaml::from_str(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n  labels:\n    kubernetes.io/metadata.name: shop\nspec:\n  finalizers: [kubernetes]\nstatus:\n  phase: Active\n",
    )
    .unwrap();
    assert_eq!(convert_namespace(&ns).unwrap(), "shop");
}

// === routes ===

fn http_route() -> HttpRoute {
    let route: GatewayHttpRoute = crate::yaml::from_str(fixture!("httproute.yaml")).unwrap();
    convert_http_route(&route).unwrap()
}

#[test]
fn http_route_metadata_parents_and_hostnames_convert() {
    let r = http_route();
    assert_eq!(r.kind, HttpRouteKind::Http);
    assert_eq!(
        (r.namespace.as_str(), r.name.as_str(), r.generation),
        ("shop", "echo-routes", 3)
    );
    assert_eq!(r.created.as_deref(), Some("2025-03-02T08:30:00Z"));
    assert_eq!(r.hostnames, vec!["echo.shop.svc.cluster.local"]);
    assert_eq!(r.parents.len(), 2);
    assert_eq!(
        r.parents[0].target,
        ObjectRef {
            group: "".into(),
            kind: "Service".into(),
            namespace: None,
            name: "echo".into()
        }
    );
    assert_eq!(r.parents[0].port, Some(80));
    // No group or kind: the Gateway API defaults, so the compiler sees a Gateway parent.
    assert_eq!(r.parents[1].target.group, GATEWAY_GROUP);
    assert_eq!(r.parents[1].target.kind, "Gateway");
    assert_eq!(r.parents[1].section_name.as_deref(), Some("https"));
}

#[test]
fn http_route_matches_convert_every_kind() {
    let r = http_route();
    let m = &r.rules[0].matches;
    assert_eq!(r.rules[0].name.as_deref(), Some("all-matches"));
    assert_eq!(m[0].path, Some(PathMatch::Exact("/exact".into())));
    assert_eq!(m[0].method.as_deref(), Some("GET"));
    assert_eq!(m[1].path, Some(PathMatch::Prefix("/prefix".into())));
    assert_eq!(
        m[1].headers
            .iter()
            .map(|h| (h.name.as_str(), h.kind, h.value.as_str()))
            .collect::<Vec<_>>(),
        vec![
            ("x-env", ValueMatchKind::Exact, "canary"),
            ("x-user", ValueMatchKind::Regex, "^u[0-9]+$")
        ]
    );
    assert_eq!(
        m[1].query_params
            .iter()
            .map(|q| (q.name.as_str(), q.kind, q.value.as_str()))
            .collect::<Vec<_>>(),
        vec![
            ("debug", ValueMatchKind::Exact, "1"),
            ("id", ValueMatchKind::Regex, "[a-f]+")
        ]
    );
    assert_eq!(m[2].path, Some(PathMatch::Regex("/v[0-9]+/items".into())));
    assert_eq!(m[3].path, None);
    assert_eq!(m[3].headers[0].name, "x-only");
    // A path without a type is a prefix.
    assert_eq!(
        r.rules[1].matches[0].path,
        Some(PathMatch::Prefix("/old".into()))
    );
}

#[test]
fn http_route_filters_convert_every_kind() {
    let r = http_route();
    let f = &r.rules[0].filters;
    assert_eq!(
        f[0],
        HttpFilter::RequestHeaderModifier(HeaderModifier {
            set: vec![("x-set".into(), "one".into())],
            add: vec![("x-add".into(), "two".into())],
            remove: vec!["x-drop".into()],
        })
    );
    assert_eq!(
        f[1],
        HttpFilter::ResponseHeaderModifier(HeaderModifier {
            set: vec![],
            add: vec![("x-resp".into(), "three".into())],
            remove: vec![],
        })
    );
    assert_eq!(
        f[2],
        HttpFilter::RequestMirror(Mirror {
            backend: ObjectRef {
                group: "".into(),
                kind: "Service".into(),
                namespace: None,
                name: "echo-shadow".into()
            },
            port: Some(80),
            percent: 25,
        })
    );
    // 1/3 is 33 percent, rounded down.
    match &f[3] {
        HttpFilter::RequestMirror(m) => {
            assert_eq!(m.percent, 33);
            assert_eq!(m.backend.namespace.as_deref(), Some("audit"));
            assert_eq!(m.port, Some(8080));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        f[4],
        HttpFilter::ExtensionRef(ObjectRef {
            group: "aether.io".into(),
            kind: "MeshFilter".into(),
            namespace: None,
            name: "add-tenant".into(),
        })
    );
    assert_eq!(f[5], HttpFilter::Unsupported("CORS".into()));

    match &r.rules[1].filters[0] {
        HttpFilter::RequestRedirect(red) => {
            assert_eq!(red.scheme.as_deref(), Some("https"));
            assert_eq!(red.hostname.as_deref(), Some("new.example.com"));
            assert_eq!(red.port, Some(8443));
            assert_eq!(
                red.path,
                Some(PathModifier::ReplacePrefixMatch("/new".into()))
            );
            assert_eq!(red.status, Some(301));
        }
        other => panic!("{other:?}"),
    }
    match &r.rules[2].filters[0] {
        HttpFilter::UrlRewrite(rw) => {
            assert_eq!(rw.hostname.as_deref(), Some("internal.shop"));
            assert_eq!(
                rw.path,
                Some(PathModifier::ReplaceFullPath("/rewritten".into()))
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn http_route_backends_and_timeouts_convert() {
    let r = http_route();
    let b = &r.rules[0].backends;
    assert_eq!(b[0].target.name, "echo-v1");
    assert_eq!(
        (b[0].target.group.as_str(), b[0].target.kind.as_str()),
        ("", "Service")
    );
    assert_eq!((b[0].port, b[0].weight), (Some(80), 90));
    assert!(b[0].filters.is_empty());
    assert_eq!(b[1].target.namespace.as_deref(), Some("shop"));
    assert_eq!(b[1].weight, 1);
    assert_eq!(
        b[1].filters,
        vec![HttpFilter::RequestHeaderModifier(HeaderModifier {
            set: vec![("x-version".into(), "v2".into())],
            ..HeaderModifier::default()
        })]
    );
    assert_eq!(r.rules[0].request_timeout_ms, Some(10_000));
    assert_eq!(r.rules[0].backend_request_timeout_ms, Some(90_500));
    assert_eq!(r.rules[1].request_timeout_ms, None);
    assert!(r.rules[1].backends.is_empty());
}

#[test]
fn http_route_errors_name_the_field_path() {
    let base: GatewayHttpRoute = crate::yaml::from_str(fixture!("httproute.yaml")).unwrap();

    let mut route = base.clone();
    route.spec.rules.as_mut().unwrap()[0]
        .backend_refs
        .as_mut()
        .unwrap()[1]
        .port = Some(0);
    assert_eq!(
        convert_http_route(&route).unwrap_err().to_string(),
        "HTTPRoute shop/echo-routes: spec.rules[0].backendRefs[1].port: 0 is not a port number in 1-65535"
    );

    let mut route = base.clone();
    route.spec.rules.as_mut().unwrap()[0]
        .timeouts
        .as_mut()
        .unwrap()
        .request = Some("10 seconds".into());
    assert!(matches!(
        convert_http_route(&route),
        Err(ConvertError::InvalidDuration { ref field, ref value, .. })
            if field == "spec.rules[0].timeouts.request" && value == "10 seconds"
    ));

    let mut route = base.clone();
    route.spec.rules.as_mut().unwrap()[0]
        .backend_refs
        .as_mut()
        .unwrap()[0]
        .weight = Some(-1);
    assert!(matches!(
        convert_http_route(&route),
        Err(ConvertError::OutOfRange { ref field, value: -1, .. }) if field == "spec.rules[0].backendRefs[0].weight"
    ));

    let mut route = base.clone();
    route.spec.rules.as_mut().unwrap()[0]
        .filters
        .as_mut()
        .unwrap()[0]
        .request_header_modifier = None;
    assert!(matches!(
        convert_http_route(&route),
        Err(ConvertError::MissingField { ref field, .. }) if field == "spec.rules[0].filters[0].requestHeaderModifier"
    ));

    let mut route = base;
    route.spec.rules.as_mut().unwrap()[1]
        .filters
        .as_mut()
        .unwrap()[0]
        .request_redirect
        .as_mut()
        .unwrap()
        .status_code = Some(300);
    assert!(matches!(
        convert_http_route(&route),
        Err(ConvertError::InvalidValue { ref field, .. }) if field == "spec.rules[1].filters[0].requestRedirect.statusCode"
    ));
}

#[test]
fn grpc_route_methods_become_path_matches_without_forcing_post() {
    let route: GatewayGrpcRoute = crate::yaml::from_str(fixture!("grpcroute.yaml")).unwrap();
    let r = convert_grpc_route(&route).unwrap();
    assert_eq!(r.kind, HttpRouteKind::Grpc);
    assert_eq!(r.parents[0].port, Some(9000));
    let m = &r.rules[0].matches;
    assert_eq!(
        m[0].path,
        Some(PathMatch::Exact("/helloworld.Greeter/SayHello".into()))
    );
    assert_eq!(
        m[1].path,
        Some(PathMatch::Prefix("/helloworld.Greeter/".into()))
    );
    assert_eq!(m[2].path, Some(PathMatch::Regex("/[^/]+/Check".into())));
    assert_eq!(
        m[3].path,
        Some(PathMatch::Regex("/(?:helloworld\\..*)/(?:Say.*)".into()))
    );
    assert!(m.iter().all(|m| m.method.is_none()));
    assert_eq!(
        m[3].headers
            .iter()
            .map(|h| (h.name.as_str(), h.kind))
            .collect::<Vec<_>>(),
        vec![
            ("x-tenant", ValueMatchKind::Exact),
            ("x-trace", ValueMatchKind::Regex)
        ]
    );
    assert_eq!(
        r.rules[0].filters[1],
        HttpFilter::ExtensionRef(ObjectRef {
            group: "aether.io".into(),
            kind: "MeshFilter".into(),
            namespace: None,
            name: "only-frontend".into(),
        })
    );
    match &r.rules[0].backends[0].filters[0] {
        HttpFilter::RequestMirror(m) => {
            assert_eq!(m.backend.name, "api-shadow");
            assert_eq!(m.percent, 100);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.rules[0].request_timeout_ms, None);
}

#[test]
fn grpc_method_regex_escapes_an_exact_method_alone() {
    let mut route: GatewayGrpcRoute = crate::yaml::from_str(fixture!("grpcroute.yaml")).unwrap();
    let rule = &mut route.spec.rules.as_mut().unwrap()[0];
    rule.matches.as_mut().unwrap()[2]
        .method
        .as_mut()
        .unwrap()
        .method = Some("Get.All".into());
    let r = convert_grpc_route(&route).unwrap();
    assert_eq!(
        r.rules[0].matches[2].path,
        Some(PathMatch::Regex("/[^/]+/Get\\.All".into()))
    );
}

fn l4_docs() -> Vec<serde_json::Value> {
    docs(fixture!("l4routes.yaml"))
}

#[test]
fn tls_tcp_and_udp_routes_convert_with_explicit_weights_marked() {
    let docs = l4_docs();
    let tls: GatewayTlsRoute = serde_json::from_value(docs[0].clone()).unwrap();
    let tls = convert_tls_route(&tls).unwrap();
    assert_eq!(tls.hostnames, vec!["secure.example.com"]);
    assert_eq!(
        (tls.generation, tls.created.as_deref()),
        (2, Some("2025-03-02T10:00:00Z"))
    );
    assert_eq!(tls.parents[0].port, Some(8200));
    assert_eq!(tls.rules[0].backends[0].port, Some(8200));
    assert!(!tls.rules[0].backends[0].weight_given);

    let tcp: GatewayTcpRoute = serde_json::from_value(docs[1].clone()).unwrap();
    let tcp = convert_tcp_route(&tcp).unwrap();
    assert_eq!(tcp.parents[0].section_name.as_deref(), Some("p5432-tcp"));
    assert_eq!(tcp.rules[0].name.as_deref(), Some("split"));
    let b = &tcp.rules[0].backends;
    assert_eq!(
        (b[0].target.name.as_str(), b[0].weight, b[0].weight_given),
        ("db-a", 3, true)
    );
    assert_eq!(
        (b[1].target.name.as_str(), b[1].weight, b[1].weight_given),
        ("db-b", 1, false)
    );
    assert!(tcp.hostnames.is_empty());

    let udp: GatewayUdpRoute = serde_json::from_value(docs[2].clone()).unwrap();
    let udp = convert_udp_route(&udp).unwrap();
    assert_eq!(udp.parents[0].port, None);
    assert_eq!(udp.rules[0].backends[0].port, Some(5353));
    assert!(udp.rules[0].backends[0].weight_given);
}

#[test]
fn reference_grant_converts() {
    let g: GatewayReferenceGrant = crate::yaml::from_str(fixture!("referencegrant.yaml")).unwrap();
    let g = convert_reference_grant(&g).unwrap();
    assert_eq!(
        (g.namespace.as_str(), g.name.as_str()),
        ("audit", "allow-shop-routes")
    );
    assert_eq!(
        g.from,
        vec![(GATEWAY_GROUP.into(), "HTTPRoute".into(), "shop".into())]
    );
    assert_eq!(
        g.to,
        vec![
            ("".into(), "Service".into(), Some("echo-audit".into())),
            ("".into(), "Service".into(), None),
        ]
    );
}

// === MeshFilter ===

fn mesh_filters() -> Vec<MeshFilterResource> {
    docs(fixture!("meshfilters.yaml"))
}

#[test]
fn mesh_filters_convert_each_configuration() {
    let f: Vec<MeshFilter> = mesh_filters()
        .iter()
        .map(|f| convert_mesh_filter(f).unwrap())
        .collect();
    match &f[0].config {
        FilterConfig::HeaderMutation(h) => {
            assert_eq!(
                h.request.set,
                vec![("x-tenant".to_owned(), "shop".to_owned())]
            );
            assert_eq!(h.request.remove, vec!["x-internal"]);
            assert_eq!(
                h.query,
                vec![
                    QueryMutation::Set("lang".into(), "en".into()),
                    QueryMutation::Add("tag".into(), "a".into()),
                    QueryMutation::Remove("debug".into()),
                ]
            );
            assert_eq!(
                h.response.add,
                vec![("x-served-by".to_owned(), "mesh".to_owned())]
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(f[0].target_refs.is_empty());

    assert_eq!(f[1].target_refs, vec!["api"]);
    match &f[1].config {
        FilterConfig::Rbac(r) => {
            assert_eq!(r.action, RbacAction::Allow);
            assert_eq!(
                r.principals,
                vec![
                    Principal {
                        namespace: Some("shop".into()),
                        service_account: Some("frontend".into())
                    },
                    Principal {
                        namespace: Some("ops".into()),
                        service_account: None
                    },
                ]
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        f[2].config,
        FilterConfig::ExtAuthz(ExtAuthz {
            server: Some("authz.security.svc:9001".into()),
            timeout_ms: 200
        })
    );
    assert_eq!(
        f[3].config,
        FilterConfig::ExtAuthz(ExtAuthz {
            server: None,
            timeout_ms: 50
        })
    );
}

fn mesh_filter_yaml(spec: &str) -> Result<MeshFilterResource, crate::yaml::YamlError> {
    crate::yaml::from_str(&format!(
        "apiVersion: aether.io/v1alpha1\nkind: MeshFilter\nmetadata:\n  name: bad\n  namespace: shop\nspec:\n{spec}"
    ))
}

#[test]
fn mesh_filter_with_zero_or_two_configurations_is_an_error() {
    let none = mesh_filter_yaml("  targetRefs: []\n").unwrap();
    assert_eq!(
        convert_mesh_filter(&none),
        Err(ConvertError::FilterConfigCount {
            object: Box::new(ObjectKey {
                kind: "MeshFilter",
                namespace: Some("shop".into()),
                name: "bad".into()
            }),
            count: 0,
        })
    );
    let two = mesh_filter_yaml("  rbac:\n    action: Deny\n  extAuthz: {}\n").unwrap();
    assert!(matches!(
        convert_mesh_filter(&two),
        Err(ConvertError::FilterConfigCount { count: 2, .. })
    ));
}

#[test]
fn bad_mesh_filters_are_refused() {
    // Unknown fields are refused by serde, at any depth.
    let err = mesh_filter_yaml("  rbac:\n    action: Allow\n    principal: []\n").unwrap_err();
    assert!(
        err.to_string().contains("unknown field `principal`"),
        "{err}"
    );
    assert!(mesh_filter_yaml("  rbac:\n    action: Maybe\n").is_err());
    assert!(mesh_filter_yaml("  headerMutation:\n    query:\n    - rename: x\n").is_err());
    let f = mesh_filter_yaml(
        "  headerMutation:\n    query:\n    - remove: a\n      add: {name: b, value: c}\n",
    )
    .unwrap();
    assert_eq!(
        convert_mesh_filter(&f).unwrap_err().to_string(),
        "MeshFilter shop/bad: spec.headerMutation.query[0]: \"add, remove\" is not exactly one of set, add, remove"
    );

    let f = mesh_filter_yaml("  extAuthz:\n    timeout: 2 seconds\n").unwrap();
    assert!(matches!(
        convert_mesh_filter(&f),
        Err(ConvertError::InvalidDuration { ref field, .. }) if field == "spec.extAuthz.timeout"
    ));
    for server in ["authz", "authz:0", ":9000", "authz:http", "::1:9000"] {
        let f = mesh_filter_yaml(&format!("  extAuthz:\n    server: \"{server}\"\n")).unwrap();
        assert!(
            matches!(convert_mesh_filter(&f), Err(ConvertError::InvalidValue { ref field, .. }) if field == "spec.extAuthz.server"),
            "{server}"
        );
    }
    let ok = mesh_filter_yaml("  extAuthz:\n    server: \"[::1]:9000\"\n").unwrap();
    assert!(convert_mesh_filter(&ok).is_ok());
    let f = mesh_filter_yaml("  targetRefs:\n  - group: apps\n    kind: Deployment\n    name: web\n  rbac:\n    action: Deny\n").unwrap();
    assert!(matches!(
        convert_mesh_filter(&f),
        Err(ConvertError::InvalidValue { ref field, .. }) if field == "spec.targetRefs[0].group"
    ));
}

#[test]
fn the_crd_schema_names_exactly_the_fields_the_resource_reads() {
    let crd: serde_json::Value = crate::yaml::from_str(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/charts/aether/crds/meshfilter.yaml"
    )))
    .unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let keys = |v: &serde_json::Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(
        keys(schema),
        vec!["extAuthz", "headerMutation", "rbac", "targetRefs"]
    );
    assert_eq!(
        keys(&schema["headerMutation"]["properties"]),
        vec!["query", "request", "response"]
    );
    assert_eq!(
        keys(&schema["rbac"]["properties"]),
        vec!["action", "principals"]
    );
    assert_eq!(
        keys(&schema["extAuthz"]["properties"]),
        vec!["server", "timeout"]
    );
    // Every example in the fixtures is also valid against the serde definition (tested above),
    // and the serde definition refuses any field the schema lacks.
    let all = mesh_filters();
    let json = serde_json::to_value(&all[1].spec).unwrap();
    assert_eq!(json["rbac"]["principals"][0]["serviceAccount"], "frontend");
}

#[test]
fn a_host_network_pod_is_not_managed_and_not_listed() {
    let mut p = pod("plain-0");
    p.spec.as_mut().unwrap().host_network = Some(true);
    let c = convert_pod(&MeshPod::from(&p), MissingReadyCondition::Ready).unwrap();
    assert!(!c.pod.managed, "it shares the node's namespace and address");
    assert!(c.registration.is_none(), "{:?}", c.registration);
    p.spec.as_mut().unwrap().host_network = Some(false);
    let c = convert_pod(&MeshPod::from(&p), MissingReadyCondition::Ready).unwrap();
    assert!(c.pod.managed && c.registration.is_some());
}
