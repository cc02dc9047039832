//! Gateway API routes and ReferenceGrants to snapshot values (routes.md §1–§3, §5, §9).
//!
//! Pure. The generated `gateway-api` types repeat one shape under many names (a rule filter and
//! a backend filter are distinct types with equal fields); the small macros below only pick the
//! fields out of those twins, and plain functions do the converting.

use crate::prelude::*;

use gateway_api::experimental::grpcroutes::{
    GrpcRoute as GatewayGrpcRoute,
    GrpcRouteRulesBackendRefsFiltersType as GatewayGrpcBackendFilterType,
    GrpcRouteRulesFiltersType as GatewayGrpcFilterType, GrpcRouteRulesMatches as GatewayGrpcMatch,
    GrpcRouteRulesMatchesHeadersType as GatewayGrpcHeaderMatchType,
    GrpcRouteRulesMatchesMethodType as GatewayGrpcMethodMatchType,
};
use gateway_api::experimental::httproutes::{
    HttpRoute as GatewayHttpRoute,
    HttpRouteRulesBackendRefsFiltersRequestRedirectPathType as GatewayBackendRedirectPathType,
    HttpRouteRulesBackendRefsFiltersRequestRedirectScheme as GatewayBackendRedirectScheme,
    HttpRouteRulesBackendRefsFiltersType as GatewayHttpBackendFilterType,
    HttpRouteRulesBackendRefsFiltersUrlRewritePathType as GatewayBackendRewritePathType,
    HttpRouteRulesFiltersRequestRedirectPathType as GatewayRedirectPathType,
    HttpRouteRulesFiltersRequestRedirectScheme as GatewayRedirectScheme,
    HttpRouteRulesFiltersType as GatewayHttpFilterType,
    HttpRouteRulesFiltersUrlRewritePathType as GatewayRewritePathType,
    HttpRouteRulesMatches as GatewayHttpMatch,
    HttpRouteRulesMatchesHeadersType as GatewayHeaderMatchType,
    HttpRouteRulesMatchesMethod as GatewayHttpMethod,
    HttpRouteRulesMatchesPathType as GatewayPathMatchType,
    HttpRouteRulesMatchesQueryParamsType as GatewayQueryMatchType,
};
use gateway_api::experimental::referencegrants::ReferenceGrant as GatewayReferenceGrant;
use gateway_api::experimental::tcproutes::TcpRoute as GatewayTcpRoute;
use gateway_api::experimental::tlsroutes::TlsRoute as GatewayTlsRoute;
use gateway_api::experimental::udproutes::UdpRoute as GatewayUdpRoute;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta as K8sObjectMeta;

use super::{ConvertError, ObjectKey, duration_ms, namespaced_key, ns, port_u16};
use crate::model::snapshot::{
    HeaderModifier, HttpBackendRef, HttpFilter, HttpMatch, HttpRoute, HttpRouteKind, HttpRule,
    L4BackendRef, L4Route, L4Rule, Mirror, ObjectRef, ParentRef, PathMatch, PathModifier, Redirect,
    ReferenceGrant, UrlRewrite, ValueMatch, ValueMatchKind,
};

/// The Gateway API group: the default group of a parentRef.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
/// The largest backendRef weight the Gateway API allows.
const MAX_WEIGHT: i64 = 1_000_000;

/// The fields every Gateway API object reference has, borrowed from whichever twin type.
struct RefParts<'a> {
    group: Option<&'a str>,
    kind: Option<&'a str>,
    namespace: Option<&'a str>,
    name: &'a str,
    port: Option<i32>,
}

macro_rules! ref_parts {
    ($r:expr) => {
        RefParts {
            group: $r.group.as_deref(),
            kind: $r.kind.as_deref(),
            namespace: $r.namespace.as_deref(),
            name: &$r.name,
            port: $r.port,
        }
    };
}

fn opt_port(key: &ObjectKey, field: &str, port: Option<i32>) -> Result<Option<u16>, ConvertError> {
    port.map(|p| port_u16(key, || format!("{field}.port"), i64::from(p)))
        .transpose()
}

fn object_ref(parts: &RefParts<'_>, group: &str, kind: &str) -> ObjectRef {
    ObjectRef {
        group: parts.group.unwrap_or(group).to_owned(),
        kind: parts.kind.unwrap_or(kind).to_owned(),
        namespace: parts.namespace.map(str::to_owned),
        name: parts.name.to_owned(),
    }
}

fn parent_ref(
    key: &ObjectKey,
    i: usize,
    parts: &RefParts<'_>,
    section_name: Option<&str>,
) -> Result<ParentRef, ConvertError> {
    Ok(ParentRef {
        // The object's own words are kept: the compiler must see a Service parent as
        // group "" kind "Service", and an absent group/kind as a Gateway.
        target: object_ref(parts, GATEWAY_GROUP, "Gateway"),
        port: opt_port(key, &format!("spec.parentRefs[{i}]"), parts.port)?,
        section_name: section_name.map(str::to_owned),
    })
}

fn backend_target(parts: &RefParts<'_>) -> ObjectRef {
    object_ref(parts, "", "Service")
}

fn weight(key: &ObjectKey, field: &str, weight: Option<i32>) -> Result<u32, ConvertError> {
    let Some(w) = weight else { return Ok(1) };
    u32::try_from(w)
        .ok()
        .filter(|&w| i64::from(w) <= MAX_WEIGHT)
        .ok_or_else(|| ConvertError::OutOfRange {
            object: key.boxed(),
            field: format!("{field}.weight"),
            value: i64::from(w),
            min: 0,
            max: MAX_WEIGHT,
        })
}

fn generation(meta: &K8sObjectMeta) -> i64 {
    meta.generation.unwrap_or(0)
}

fn created(meta: &K8sObjectMeta) -> Option<String> {
    meta.creation_timestamp.as_ref().map(|t| t.0.to_string())
}

fn missing(key: &ObjectKey, field: String) -> ConvertError {
    ConvertError::MissingField {
        object: key.boxed(),
        field,
    }
}

fn parents<'a>(
    key: &ObjectKey,
    refs: impl Iterator<Item = (RefParts<'a>, Option<&'a str>)>,
) -> Result<Vec<ParentRef>, ConvertError> {
    refs.enumerate()
        .map(|(i, (parts, section))| parent_ref(key, i, &parts, section))
        .collect()
}

/// The `spec.parentRefs` of any route type, converted ([`parents`]).
macro_rules! route_parents {
    ($key:expr, $route:expr) => {
        parents(
            $key,
            $route
                .spec
                .parent_refs
                .iter()
                .flatten()
                .map(|p| (ref_parts!(p), p.section_name.as_deref())),
        )
    };
}

// === filters ===

macro_rules! header_modifier {
    ($m:expr) => {
        HeaderModifier {
            set: $m
                .set
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
            add: $m
                .add
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
            remove: $m.remove.clone().unwrap_or_default(),
        }
    };
}

/// `RequestMirror`'s fields, borrowed from whichever twin type.
struct MirrorParts<'a> {
    target: RefParts<'a>,
    percent: Option<i32>,
    fraction: Option<(i32, Option<i32>)>,
}

macro_rules! mirror_parts {
    ($m:expr) => {
        MirrorParts {
            target: ref_parts!($m.backend_ref),
            percent: $m.percent,
            fraction: $m.fraction.as_ref().map(|f| (f.numerator, f.denominator)),
        }
    };
}

fn mirror(key: &ObjectKey, field: &str, parts: &MirrorParts<'_>) -> Result<Mirror, ConvertError> {
    let out_of_range = |field: String, value: i32, max: i64| ConvertError::OutOfRange {
        object: key.boxed(),
        field,
        value: i64::from(value),
        min: 0,
        max,
    };
    let percent = match (parts.percent, parts.fraction) {
        (Some(p), _) => u32::try_from(p)
            .ok()
            .filter(|&p| p <= 100)
            .ok_or_else(|| out_of_range(format!("{field}.percent"), p, 100))?,
        (None, Some((numerator, denominator))) => {
            let denominator = denominator.unwrap_or(100);
            let d = u32::try_from(denominator)
                .ok()
                .filter(|&d| d > 0)
                .ok_or_else(|| ConvertError::OutOfRange {
                    object: key.boxed(),
                    field: format!("{field}.fraction.denominator"),
                    value: i64::from(denominator),
                    min: 1,
                    max: i64::from(i32::MAX),
                })?;
            let n = u32::try_from(numerator)
                .ok()
                .filter(|&n| n <= d)
                .ok_or_else(|| {
                    out_of_range(
                        format!("{field}.fraction.numerator"),
                        numerator,
                        i64::from(d),
                    )
                })?;
            // Rounded down: a mirror never sends more than the fraction asks for.
            u32::try_from(u64::from(n) * 100 / u64::from(d)).unwrap_or(100)
        }
        (None, None) => 100,
    };
    Ok(Mirror {
        backend: backend_target(&parts.target),
        port: opt_port(key, &format!("{field}.backendRef"), parts.target.port)?,
        percent,
    })
}

fn status_code(
    key: &ObjectKey,
    field: &str,
    code: Option<i64>,
) -> Result<Option<u16>, ConvertError> {
    match code {
        None => Ok(None),
        Some(c @ (301 | 302 | 303 | 307 | 308)) => Ok(u16::try_from(c).ok()),
        Some(c) => Err(ConvertError::InvalidValue {
            object: key.boxed(),
            field: format!("{field}.statusCode"),
            value: c.to_string(),
            expected: "one of 301, 302, 303, 307, 308",
        }),
    }
}

macro_rules! path_modifier {
    ($key:expr, $field:expr, $p:expr, $T:ident) => {{
        let p = $p;
        match p.r#type {
            $T::ReplaceFullPath => p
                .replace_full_path
                .clone()
                .map(PathModifier::ReplaceFullPath)
                .ok_or_else(|| missing($key, format!("{}.path.replaceFullPath", $field))),
            $T::ReplacePrefixMatch => p
                .replace_prefix_match
                .clone()
                .map(PathModifier::ReplacePrefixMatch)
                .ok_or_else(|| missing($key, format!("{}.path.replacePrefixMatch", $field))),
        }
    }};
}

// The filter kinds HTTPRoute and GRPCRoute share. The gateway-api crate gives each route kind
// its own filter types, so these are macros over the field names, one per arm body.
macro_rules! request_headers {
    ($key:expr, $field:expr, $f:expr) => {
        match &$f.request_header_modifier {
            Some(m) => HttpFilter::RequestHeaderModifier(header_modifier!(m)),
            None => return Err(missing($key, format!("{}.requestHeaderModifier", $field))),
        }
    };
}

macro_rules! response_headers {
    ($key:expr, $field:expr, $f:expr) => {
        match &$f.response_header_modifier {
            Some(m) => HttpFilter::ResponseHeaderModifier(header_modifier!(m)),
            None => return Err(missing($key, format!("{}.responseHeaderModifier", $field))),
        }
    };
}

macro_rules! request_mirror {
    ($key:expr, $field:expr, $f:expr) => {
        match &$f.request_mirror {
            Some(m) => HttpFilter::RequestMirror(mirror(
                $key,
                &format!("{}.requestMirror", $field),
                &mirror_parts!(m),
            )?),
            None => return Err(missing($key, format!("{}.requestMirror", $field))),
        }
    };
}

macro_rules! extension_ref {
    ($key:expr, $field:expr, $f:expr) => {
        match &$f.extension_ref {
            Some(e) => HttpFilter::ExtensionRef(ObjectRef {
                group: e.group.clone(),
                kind: e.kind.clone(),
                namespace: None,
                name: e.name.clone(),
            }),
            None => return Err(missing($key, format!("{}.extensionRef", $field))),
        }
    };
}

macro_rules! http_filter {
    ($key:expr, $field:expr, $f:expr, $T:ident, $Scheme:ident, $RedirectPath:ident, $RewritePath:ident) => {{
        let (key, field, f) = ($key, $field, $f);
        match f.r#type {
            $T::RequestHeaderModifier => request_headers!(key, field, f),
            $T::ResponseHeaderModifier => response_headers!(key, field, f),
            $T::RequestMirror => request_mirror!(key, field, f),
            $T::RequestRedirect => match &f.request_redirect {
                Some(r) => {
                    let field = format!("{field}.requestRedirect");
                    HttpFilter::RequestRedirect(Redirect {
                        scheme: r.scheme.as_ref().map(|s| match s {
                            $Scheme::Http => "http".to_owned(),
                            $Scheme::Https => "https".to_owned(),
                        }),
                        hostname: r.hostname.clone(),
                        port: opt_port(key, &field, r.port)?,
                        path: r
                            .path
                            .as_ref()
                            .map(|p| path_modifier!(key, &field, p, $RedirectPath))
                            .transpose()?,
                        status: status_code(key, &field, r.status_code)?,
                    })
                }
                None => return Err(missing(key, format!("{field}.requestRedirect"))),
            },
            $T::UrlRewrite => match &f.url_rewrite {
                Some(r) => {
                    let field = format!("{field}.urlRewrite");
                    HttpFilter::UrlRewrite(UrlRewrite {
                        hostname: r.hostname.clone(),
                        path: r
                            .path
                            .as_ref()
                            .map(|p| path_modifier!(key, &field, p, $RewritePath))
                            .transpose()?,
                    })
                }
                None => return Err(missing(key, format!("{field}.urlRewrite"))),
            },
            $T::ExtensionRef => extension_ref!(key, field, f),
            $T::Cors => HttpFilter::Unsupported("CORS".to_owned()),
            $T::ExternalAuth => HttpFilter::Unsupported("ExternalAuth".to_owned()),
        }
    }};
}

macro_rules! grpc_filter {
    ($key:expr, $field:expr, $f:expr, $T:ident) => {{
        let (key, field, f) = ($key, $field, $f);
        match f.r#type {
            $T::RequestHeaderModifier => request_headers!(key, field, f),
            $T::ResponseHeaderModifier => response_headers!(key, field, f),
            $T::RequestMirror => request_mirror!(key, field, f),
            $T::ExtensionRef => extension_ref!(key, field, f),
        }
    }};
}

// === HTTPRoute ===

fn http_method(m: &GatewayHttpMethod) -> &'static str {
    match m {
        GatewayHttpMethod::Get => "GET",
        GatewayHttpMethod::Head => "HEAD",
        GatewayHttpMethod::Post => "POST",
        GatewayHttpMethod::Put => "PUT",
        GatewayHttpMethod::Delete => "DELETE",
        GatewayHttpMethod::Connect => "CONNECT",
        GatewayHttpMethod::Options => "OPTIONS",
        GatewayHttpMethod::Trace => "TRACE",
        GatewayHttpMethod::Patch => "PATCH",
    }
}

fn http_match(m: &GatewayHttpMatch) -> HttpMatch {
    HttpMatch {
        path: m.path.as_ref().map(|p| {
            let value = p.value.clone().unwrap_or_else(|| "/".to_owned());
            match p.r#type {
                Some(GatewayPathMatchType::Exact) => PathMatch::Exact(value),
                Some(GatewayPathMatchType::RegularExpression) => PathMatch::Regex(value),
                Some(GatewayPathMatchType::PathPrefix) | None => PathMatch::Prefix(value),
            }
        }),
        headers: m
            .headers
            .iter()
            .flatten()
            .map(|h| ValueMatch {
                name: h.name.clone(),
                kind: match h.r#type {
                    Some(GatewayHeaderMatchType::RegularExpression) => ValueMatchKind::Regex,
                    Some(GatewayHeaderMatchType::Exact) | None => ValueMatchKind::Exact,
                },
                value: h.value.clone(),
            })
            .collect(),
        query_params: m
            .query_params
            .iter()
            .flatten()
            .map(|q| ValueMatch {
                name: q.name.clone(),
                kind: match q.r#type {
                    Some(GatewayQueryMatchType::RegularExpression) => ValueMatchKind::Regex,
                    Some(GatewayQueryMatchType::Exact) | None => ValueMatchKind::Exact,
                },
                value: q.value.clone(),
            })
            .collect(),
        method: m.method.as_ref().map(|m| http_method(m).to_owned()),
    }
}

/// Converts an HTTPRoute into an [`HttpRoute`] of kind [`HttpRouteKind::Http`].
pub fn convert_http_route(route: &GatewayHttpRoute) -> Result<HttpRoute, ConvertError> {
    let key = namespaced_key("HTTPRoute", &route.metadata)?;
    let spec = &route.spec;
    let parents = route_parents!(&key, route)?;
    let mut rules = Vec::new();
    for (i, rule) in spec.rules.iter().flatten().enumerate() {
        let rfield = format!("spec.rules[{i}]");
        let mut filters = Vec::new();
        for (j, f) in rule.filters.iter().flatten().enumerate() {
            let field = format!("{rfield}.filters[{j}]");
            filters.push(http_filter!(
                &key,
                &field,
                f,
                GatewayHttpFilterType,
                GatewayRedirectScheme,
                GatewayRedirectPathType,
                GatewayRewritePathType
            ));
        }
        let mut backends = Vec::new();
        for (j, b) in rule.backend_refs.iter().flatten().enumerate() {
            let bfield = format!("{rfield}.backendRefs[{j}]");
            let mut bfilters = Vec::new();
            for (k, f) in b.filters.iter().flatten().enumerate() {
                let field = format!("{bfield}.filters[{k}]");
                bfilters.push(http_filter!(
                    &key,
                    &field,
                    f,
                    GatewayHttpBackendFilterType,
                    GatewayBackendRedirectScheme,
                    GatewayBackendRedirectPathType,
                    GatewayBackendRewritePathType
                ));
            }
            backends.push(HttpBackendRef {
                target: backend_target(&ref_parts!(b)),
                port: opt_port(&key, &bfield, b.port)?,
                weight: weight(&key, &bfield, b.weight)?,
                filters: bfilters,
            });
        }
        let timeouts = rule.timeouts.as_ref();
        rules.push(HttpRule {
            name: rule.name.clone(),
            matches: rule.matches.iter().flatten().map(http_match).collect(),
            filters,
            backends,
            request_timeout_ms: timeouts
                .and_then(|t| t.request.as_deref())
                .map(|d| duration_ms(&key, format!("{rfield}.timeouts.request"), d))
                .transpose()?,
            backend_request_timeout_ms: timeouts
                .and_then(|t| t.backend_request.as_deref())
                .map(|d| duration_ms(&key, format!("{rfield}.timeouts.backendRequest"), d))
                .transpose()?,
        });
    }
    Ok(HttpRoute {
        kind: HttpRouteKind::Http,
        namespace: ns(&key),
        name: key.name.clone(),
        generation: generation(&route.metadata),
        created: created(&route.metadata),
        parents,
        hostnames: spec.hostnames.clone().unwrap_or_default(),
        rules,
    })
}

// === GRPCRoute ===

/// A gRPC method match as a path match (`/<service>/<method>`), or `None` to match every path.
fn grpc_path(m: &GatewayGrpcMatch) -> Option<PathMatch> {
    let method = m.method.as_ref()?;
    let service = method.service.as_deref().filter(|s| !s.is_empty());
    let name = method.method.as_deref().filter(|s| !s.is_empty());
    match method.r#type {
        Some(GatewayGrpcMethodMatchType::RegularExpression) => {
            if service.is_none() && name.is_none() {
                return None;
            }
            let part =
                |p: Option<&str>| p.map_or_else(|| "[^/]+".to_owned(), |p| format!("(?:{p})"));
            Some(PathMatch::Regex(format!(
                "/{}/{}",
                part(service),
                part(name)
            )))
        }
        Some(GatewayGrpcMethodMatchType::Exact) | None => match (service, name) {
            (Some(s), Some(n)) => Some(PathMatch::Exact(format!("/{s}/{n}"))),
            (Some(s), None) => Some(PathMatch::Prefix(format!("/{s}/"))),
            (None, Some(n)) => Some(PathMatch::Regex(format!("/[^/]+/{}", regex::escape(n)))),
            (None, None) => None,
        },
    }
}

fn grpc_match(m: &GatewayGrpcMatch) -> HttpMatch {
    HttpMatch {
        path: grpc_path(m),
        headers: m
            .headers
            .iter()
            .flatten()
            .map(|h| ValueMatch {
                name: h.name.clone(),
                kind: match h.r#type {
                    Some(GatewayGrpcHeaderMatchType::RegularExpression) => ValueMatchKind::Regex,
                    Some(GatewayGrpcHeaderMatchType::Exact) | None => ValueMatchKind::Exact,
                },
                value: h.value.clone(),
            })
            .collect(),
        query_params: Vec::new(),
        // gRPC is POST, but the Gateway API does not make a GRPCRoute match on the method.
        method: None,
    }
}

/// Converts a GRPCRoute into an [`HttpRoute`] of kind [`HttpRouteKind::Grpc`] (routes.md §1).
///
/// Each method match becomes a path match: service and method `Exact` is the path
/// `/<service>/<method>`, a service alone the prefix `/<service>/`, a method alone the
/// expression `/[^/]+/<method>`; `RegularExpression` matches become path expressions.
pub fn convert_grpc_route(route: &GatewayGrpcRoute) -> Result<HttpRoute, ConvertError> {
    let key = namespaced_key("GRPCRoute", &route.metadata)?;
    let spec = &route.spec;
    let parents = route_parents!(&key, route)?;
    let mut rules = Vec::new();
    for (i, rule) in spec.rules.iter().flatten().enumerate() {
        let rfield = format!("spec.rules[{i}]");
        let mut filters = Vec::new();
        for (j, f) in rule.filters.iter().flatten().enumerate() {
            let field = format!("{rfield}.filters[{j}]");
            filters.push(grpc_filter!(&key, &field, f, GatewayGrpcFilterType));
        }
        let mut backends = Vec::new();
        for (j, b) in rule.backend_refs.iter().flatten().enumerate() {
            let bfield = format!("{rfield}.backendRefs[{j}]");
            let mut bfilters = Vec::new();
            for (k, f) in b.filters.iter().flatten().enumerate() {
                let field = format!("{bfield}.filters[{k}]");
                bfilters.push(grpc_filter!(&key, &field, f, GatewayGrpcBackendFilterType));
            }
            backends.push(HttpBackendRef {
                target: backend_target(&ref_parts!(b)),
                port: opt_port(&key, &bfield, b.port)?,
                weight: weight(&key, &bfield, b.weight)?,
                filters: bfilters,
            });
        }
        rules.push(HttpRule {
            name: rule.name.clone(),
            matches: rule.matches.iter().flatten().map(grpc_match).collect(),
            filters,
            backends,
            request_timeout_ms: None,
            backend_request_timeout_ms: None,
        });
    }
    Ok(HttpRoute {
        kind: HttpRouteKind::Grpc,
        namespace: ns(&key),
        name: key.name.clone(),
        generation: generation(&route.metadata),
        created: created(&route.metadata),
        parents,
        hostnames: spec.hostnames.clone().unwrap_or_default(),
        rules,
    })
}

// === L4 routes ===

macro_rules! l4_route {
    ($route:expr, $kind:literal, $hostnames:expr) => {{
        let route = $route;
        let key = namespaced_key($kind, &route.metadata)?;
        let parents = route_parents!(&key, route)?;
        let mut rules = Vec::new();
        for (i, rule) in route.spec.rules.iter().enumerate() {
            let mut backends = Vec::new();
            for (j, b) in rule.backend_refs.iter().enumerate() {
                let field = format!("spec.rules[{i}].backendRefs[{j}]");
                backends.push(L4BackendRef {
                    target: backend_target(&ref_parts!(b)),
                    port: opt_port(&key, &field, b.port)?,
                    weight: weight(&key, &field, b.weight)?,
                    weight_given: b.weight.is_some(),
                });
            }
            rules.push(L4Rule {
                name: rule.name.clone(),
                backends,
            });
        }
        Ok(L4Route {
            namespace: ns(&key),
            name: key.name.clone(),
            generation: generation(&route.metadata),
            created: created(&route.metadata),
            parents,
            hostnames: $hostnames,
            rules,
        })
    }};
}

/// Converts a TLSRoute (its hostnames are matched against the SNI, routes.md §9.1).
pub fn convert_tls_route(route: &GatewayTlsRoute) -> Result<L4Route, ConvertError> {
    l4_route!(route, "TLSRoute", route.spec.hostnames.clone())
}

/// Converts a TCPRoute.
pub fn convert_tcp_route(route: &GatewayTcpRoute) -> Result<L4Route, ConvertError> {
    l4_route!(route, "TCPRoute", Vec::new())
}

/// Converts a UDPRoute (`weight_given` lets the compiler refuse weighted splits, routes.md §9.3).
pub fn convert_udp_route(route: &GatewayUdpRoute) -> Result<L4Route, ConvertError> {
    l4_route!(route, "UDPRoute", Vec::new())
}

// === routes the converter refused (issue #35 item 1) ===

macro_rules! unreadable {
    ($route:expr, $kind:literal, $error:expr, $make:expr) => {{
        let route = $route;
        let key = namespaced_key($kind, &route.metadata).ok()?;
        let parents = route_parents!(&key, route).ok()?;
        ($make)(key, parents, $error.to_string())
    }};
}

/// The HTTP shape of a route that cannot be read: its parents, one rule that matches every
/// request and whose filter this build cannot run, so it answers `500 invalid-backend`.
fn unreadable_http(
    kind: HttpRouteKind,
    key: &ObjectKey,
    meta: &K8sObjectMeta,
    parents: Vec<ParentRef>,
    why: &str,
) -> HttpRoute {
    HttpRoute {
        kind,
        namespace: ns(key),
        name: key.name.clone(),
        generation: generation(meta),
        created: created(meta),
        parents,
        hostnames: Vec::new(),
        rules: vec![HttpRule {
            name: None,
            matches: Vec::new(),
            filters: vec![HttpFilter::Unsupported(format!(
                "{}{why}",
                crate::model::snapshot::UNREADABLE_ROUTE
            ))],
            backends: Vec::new(),
            request_timeout_ms: None,
            backend_request_timeout_ms: None,
        }],
    }
}

/// What the model keeps of an HTTPRoute the converter refused (issue #35 item 1): a route
/// written for its parents, which could hold filters or an authorization, is never replaced by
/// the default delivery; it answers every request it would route `500 invalid-backend` until it
/// is fixed (a diagnostic says why). `None` when its parents do not read either: it attaches
/// nowhere, and is only reported.
pub fn unreadable_http_route(route: &GatewayHttpRoute, error: &ConvertError) -> Option<HttpRoute> {
    unreadable!(
        route,
        "HTTPRoute",
        error,
        |key: ObjectKey, parents, why: String| {
            Some(unreadable_http(
                HttpRouteKind::Http,
                &key,
                &route.metadata,
                parents,
                &why,
            ))
        }
    )
}

/// [`unreadable_http_route`] for a GRPCRoute.
pub fn unreadable_grpc_route(route: &GatewayGrpcRoute, error: &ConvertError) -> Option<HttpRoute> {
    unreadable!(
        route,
        "GRPCRoute",
        error,
        |key: ObjectKey, parents, why: String| {
            Some(unreadable_http(
                HttpRouteKind::Grpc,
                &key,
                &route.metadata,
                parents,
                &why,
            ))
        }
    )
}

macro_rules! unreadable_l4 {
    ($route:expr, $kind:literal, $error:expr) => {{
        unreadable!(
            $route,
            $kind,
            $error,
            |key: ObjectKey, parents, _why: String| {
                Some(L4Route {
                    namespace: ns(&key),
                    name: key.name.clone(),
                    generation: generation(&$route.metadata),
                    created: created(&$route.metadata),
                    parents,
                    hostnames: Vec::new(),
                    // One rule with no backend: its connections (or datagrams) go nowhere.
                    rules: vec![L4Rule {
                        name: None,
                        backends: Vec::new(),
                    }],
                })
            }
        )
    }};
}

/// What the model keeps of a TLSRoute the converter refused: its parents and one rule with no
/// backend, so that the connections it would route are closed, never passed to the default
/// (issue #35 item 1). `None` when its parents do not read either.
pub fn unreadable_tls_route(route: &GatewayTlsRoute, error: &ConvertError) -> Option<L4Route> {
    unreadable_l4!(route, "TLSRoute", error)
}

/// [`unreadable_tls_route`] for a TCPRoute.
pub fn unreadable_tcp_route(route: &GatewayTcpRoute, error: &ConvertError) -> Option<L4Route> {
    unreadable_l4!(route, "TCPRoute", error)
}

/// [`unreadable_tls_route`] for a UDPRoute.
pub fn unreadable_udp_route(route: &GatewayUdpRoute, error: &ConvertError) -> Option<L4Route> {
    unreadable_l4!(route, "UDPRoute", error)
}

/// Converts a ReferenceGrant.
pub fn convert_reference_grant(
    grant: &GatewayReferenceGrant,
) -> Result<ReferenceGrant, ConvertError> {
    let key = namespaced_key("ReferenceGrant", &grant.metadata)?;
    Ok(ReferenceGrant {
        namespace: ns(&key),
        name: key.name.clone(),
        from: grant
            .spec
            .from
            .iter()
            .map(|f| (f.group.clone(), f.kind.clone(), f.namespace.clone()))
            .collect(),
        to: grant
            .spec
            .to
            .iter()
            .map(|t| (t.group.clone(), t.kind.clone(), t.name.clone()))
            .collect(),
    })
}
