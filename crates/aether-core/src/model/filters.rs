//! Gateway API HTTP filters as pure functions, and the compiled [`FilterPlan`] of one rule.
//!
//! Layer 0 (pure): std and the model's own types. Nothing here performs IO, reads a clock or
//! draws randomness: weighted and percentage choices take their entropy as an argument. The
//! functions work on plain request and response parts (strings, and `http` header maps), so the data
//! plane, the `explain` command and tests run exactly the same code.
//!
//! Invariants:
//! - No function here panics on any input.
//! - Header modifiers never touch an `x-aether-` header: those are the mesh's (addressing.md
//!   I12, I13); a route may not forge or remove them. [`check_rule`] reports such entries.
//! - A rule whose filters cannot be run as written is never run in part: its plan answers
//!   [`RuleAnswer::Invalid`].

use crate::prelude::*;

use std::fmt;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::model::path::{percent_decode, prefix_element, prefix_matches};
use crate::model::snapshot::{
    HeaderModifier, HttpFilter, HttpRule, Mirror, ObjectRef, PathMatch, PathModifier,
    QueryMutation, Redirect, UrlRewrite,
};

/// The prefix of the mesh's own header names.
const MESH_HEADER_PREFIX: &str = "x-aether-";

/// Whether `name` is one of the mesh's own headers (`x-aether-*`, any case).
pub fn is_mesh_header(name: &str) -> bool {
    name.len() >= MESH_HEADER_PREFIX.len()
        && name.as_bytes()[..MESH_HEADER_PREFIX.len()]
            .eq_ignore_ascii_case(MESH_HEADER_PREFIX.as_bytes())
}

/// Applies a `RequestHeaderModifier` or `ResponseHeaderModifier` to a header map, in place.
///
/// Order: every `set`, then every `add`, then every `remove` (so a name listed in `remove` is
/// absent afterwards, whatever else the modifier says). Names compare case-insensitively (the
/// map holds them in lower case).
/// - `set` replaces every value of the name with one value (added when the name is absent).
/// - `add` appends a value, keeping existing ones (`a: 1` plus add `a: 2` is `a: 1`, `a: 2`,
///   which is `a: 1,2` on the wire, as the Gateway API example shows).
/// - `remove` drops every value of the name.
///
/// Entries naming an `x-aether-` header are ignored ([`is_mesh_header`]), and so are entries
/// whose name is not a valid field name; a `set` whose text is not a valid field value leaves
/// the name without a value, an `add` of one adds nothing. The headers the modifier does not
/// touch keep their bytes exactly, whether or not they are UTF-8, and the values of one name
/// keep their order; the order of different names is not kept (it carries no meaning, RFC
/// 9110 §5.3).
///
/// Cost: no allocation beyond the values written and the map's own growth; the map is edited,
/// never rebuilt (issue #38).
pub fn apply_header_modifier(modifier: &HeaderModifier, headers: &mut HeaderMap) {
    let named = |name: &str| {
        (!is_mesh_header(name))
            .then(|| HeaderName::from_bytes(name.as_bytes()).ok())
            .flatten()
    };
    for (name, value) in &modifier.set {
        let Some(name) = named(name) else { continue };
        match HeaderValue::from_str(value) {
            Ok(value) => {
                headers.insert(name, value);
            }
            Err(_) => {
                headers.remove(name);
            }
        }
    }
    for (name, value) in &modifier.add {
        if let (Some(name), Ok(value)) = (named(name), HeaderValue::from_str(value)) {
            headers.append(name, value);
        }
    }
    for name in &modifier.remove {
        if let Some(name) = named(name) {
            headers.remove(name);
        }
    }
}

/// What [`redirect`] reads of the request.
#[derive(Clone, Copy, Debug)]
pub struct RedirectInput<'a> {
    /// The scheme the request arrived with: `"http"` on the mesh.
    pub scheme: &'a str,
    /// The authority as received (host, and port when the client wrote one).
    pub authority: &'a str,
    /// The front port the request was addressed to: the Gateway API's "listener port".
    pub listener_port: u16,
    /// The request path, without the query.
    pub path: &'a str,
    /// The query string, without `?`.
    pub query: Option<&'a str>,
    /// The `PathPrefix` value that selected the rule ([`crate::model::route_match::Selected::matched_prefix`]).
    pub matched_prefix: Option<&'a str>,
}

/// The answer of a `RequestRedirect`: a status and a `Location`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedirectAnswer {
    /// The status code (302 unless the filter says otherwise).
    pub status: u16,
    /// The `Location` header value, an absolute URL.
    pub location: String,
}

/// The well-known port of a scheme, when it has one.
fn well_known_port(scheme: &str) -> Option<u16> {
    if scheme.eq_ignore_ascii_case("http") {
        Some(80)
    } else if scheme.eq_ignore_ascii_case("https") {
        Some(443)
    } else {
        None
    }
}

/// Splits an authority into host and port text (`[v6]:p` keeps the brackets on the host).
fn split_authority(authority: &str) -> (&str, Option<&str>) {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(end) => (&authority[..=end], authority[end + 1..].strip_prefix(':')),
            None => (authority, None),
        };
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    }
}

/// Computes the answer of a `RequestRedirect` filter (Gateway API `HTTPRequestRedirectFilter`).
///
/// - Scheme: the filter's, else the request's.
/// - Host: the filter's hostname, else the host of the request's authority (as received).
/// - Port: the filter's; else, when the filter sets a scheme, that scheme's well-known port
///   (80 for `http`, 443 for `https`; the listener port for a scheme without one); else the
///   listener port. The port is left out of `Location` when it is 80 with `http` or 443 with
///   `https`.
/// - Path: unchanged, `ReplaceFullPath`, or `ReplacePrefixMatch` of the matched prefix
///   ([`replace_prefix`]). The query string is kept.
/// - Status: the filter's, else 302.
pub fn redirect(filter: &Redirect, req: RedirectInput<'_>) -> RedirectAnswer {
    let scheme = filter
        .scheme
        .as_deref()
        .unwrap_or(req.scheme)
        .to_ascii_lowercase();
    let host = match &filter.hostname {
        Some(hostname) => hostname.as_str(),
        None => split_authority(req.authority).0,
    };
    let port = match (filter.port, &filter.scheme) {
        (Some(port), _) => port,
        (None, Some(scheme)) => well_known_port(scheme).unwrap_or(req.listener_port),
        (None, None) => req.listener_port,
    };
    let path = match &filter.path {
        Some(modifier) => modify_path(modifier, req.path, req.matched_prefix),
        None => req.path.to_owned(),
    };
    let mut location = format!("{scheme}://{host}");
    if well_known_port(&scheme) != Some(port) {
        location.push(':');
        location.push_str(&port.to_string());
    }
    location.push_str(&path);
    if let Some(query) = req.query {
        location.push('?');
        location.push_str(query);
    }
    RedirectAnswer {
        status: filter.status.unwrap_or(302),
        location,
    }
}

/// Applies a `URLRewrite` filter: returns the new authority (when the filter sets a hostname)
/// and the new path (the query string is not part of `path` and is kept by the caller).
///
/// A hostname rewrite replaces the whole authority, port included (it is the value of the
/// forwarded `Host`, addressing.md I3). Path modifiers are those of [`redirect`].
pub fn rewrite(
    filter: &UrlRewrite,
    path: &str,
    matched_prefix: Option<&str>,
) -> (Option<String>, String) {
    let new_authority = filter.hostname.clone();
    let new_path = match &filter.path {
        Some(modifier) => modify_path(modifier, path, matched_prefix),
        None => path.to_owned(),
    };
    (new_authority, new_path)
}

fn modify_path(modifier: &PathModifier, path: &str, matched_prefix: Option<&str>) -> String {
    match modifier {
        PathModifier::ReplaceFullPath(full) => {
            if full.starts_with('/') {
                full.clone()
            } else {
                format!("/{full}")
            }
        }
        PathModifier::ReplacePrefixMatch(replacement) => match matched_prefix {
            Some(prefix) => replace_prefix(path, prefix, replacement),
            // Only a PathPrefix match can select a rule with this modifier (check_rule refuses
            // the rule otherwise); without one the path is left as it is.
            None => path.to_owned(),
        },
    }
}

/// `ReplacePrefixMatch`: replaces the path elements of `prefix` at the start of `path` with
/// `replacement`, as the Gateway API table specifies. Trailing `/` of the prefix and of the
/// replacement are ignored; the rest of the path, from its `/`, is kept; an empty result is
/// `/`.
///
/// | path | prefix | replacement | result |
/// |---|---|---|---|
/// | `/foo/bar` | `/foo` | `/xyz` | `/xyz/bar` |
/// | `/foo/bar` | `/foo/` | `/xyz/` | `/xyz/bar` |
/// | `/foo` | `/foo` | `/xyz` | `/xyz` |
/// | `/foo/` | `/foo` | `/xyz` | `/xyz/` |
/// | `/foo/bar` | `/foo` | `` | `/bar` |
/// | `/foo` | `/foo` | `/` | `/` |
///
/// A `path` the prefix does not match is returned unchanged.
pub fn replace_prefix(path: &str, prefix: &str, replacement: &str) -> String {
    let element = prefix_element(prefix);
    if !prefix_matches(path, element) {
        return path.to_owned();
    }
    let rest = &path[element.len()..];
    let head = replacement.trim_end_matches('/');
    let mut out = String::with_capacity(head.len() + rest.len() + 1);
    if !head.is_empty() && !head.starts_with('/') {
        out.push('/');
    }
    out.push_str(head);
    out.push_str(rest);
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// Applies query parameter mutations (a `header_mutation` filter, routes.md §5.2) to a
/// request target `path?query`, in declaration order: each mutation parses the query,
/// applies itself and writes the query back before the next one runs.
///
/// Names compare case-sensitively after percent-decoding; pairs a mutation does not touch keep
/// their bytes. Written names and values are percent-encoded (everything but RFC 3986
/// unreserved characters). `Set` replaces the first value of the name and drops the others
/// (appends when absent); `Add` appends; `Remove` drops every value. A query left empty is
/// written without `?`.
pub fn apply_query_mutations(mutations: &[QueryMutation], path_and_query: &str) -> String {
    let mut target = path_and_query.to_owned();
    for mutation in mutations {
        let (path, query) = target.split_once('?').unwrap_or((target.as_str(), ""));
        let mut pairs: Vec<String> = query
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(str::to_owned)
            .collect();
        let named = |pair: &String, name: &str| {
            let raw_name = pair.split_once('=').map_or(pair.as_str(), |(raw, _)| raw);
            percent_decode(raw_name) == name
        };
        match mutation {
            QueryMutation::Set(name, value) => {
                let written = format!("{}={}", percent_encode(name), percent_encode(value));
                match pairs.iter().position(|pair| named(pair, name)) {
                    Some(first) => {
                        let mut index = 0usize;
                        pairs.retain(|pair| {
                            let keep = index <= first || !named(pair, name);
                            index += 1;
                            keep
                        });
                        if let Some(slot) = pairs.get_mut(first) {
                            *slot = written;
                        }
                    }
                    None => pairs.push(written),
                }
            }
            QueryMutation::Add(name, value) => {
                pairs.push(format!(
                    "{}={}",
                    percent_encode(name),
                    percent_encode(value)
                ));
            }
            QueryMutation::Remove(name) => pairs.retain(|pair| !named(pair, name)),
        }
        let mut next = path.to_owned();
        if !pairs.is_empty() {
            next.push('?');
            next.push_str(&pairs.join("&"));
        }
        target = next;
    }
    target
}

/// Percent-encodes every byte that is not an RFC 3986 unreserved character.
fn percent_encode(text: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(text.len());
    for &byte in text.as_bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
    out
}

/// Chooses an index with probability proportional to its weight, deterministically from
/// `entropy` (a uniformly distributed value the caller draws).
///
/// Zero weights are never chosen; `None` when every weight is zero or there is none. Over
/// `entropy` running through any `sum(weights)` consecutive values, each index is chosen
/// exactly `weight` times.
pub fn pick_weighted(weights: &[u32], entropy: u64) -> Option<usize> {
    let total = weights
        .iter()
        .fold(0u64, |sum, &weight| sum.saturating_add(u64::from(weight)));
    if total == 0 {
        return None;
    }
    let mut point = entropy % total;
    for (index, &weight) in weights.iter().enumerate() {
        let weight = u64::from(weight);
        if point < weight {
            return Some(index);
        }
        point -= weight;
    }
    None
}

/// Whether a `RequestMirror` with `percent` mirrors this request, deterministically from
/// `entropy`: 100 or more always, 0 never, otherwise `percent` values out of every 100
/// consecutive entropy values.
pub fn mirror_fires(percent: u32, entropy: u64) -> bool {
    percent >= 100 || entropy % 100 < u64::from(percent)
}

/// Why a rule's filters cannot be run as written. The rule answers with an error instead
/// ([`RuleAnswer::Invalid`]); the route's status is expected to say `Accepted=False`
/// (`IncompatibleFilters` or `UnsupportedValue`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleFault {
    /// A filter type this build does not implement (`CORS`, ...).
    UnsupportedFilter(String),
    /// A core filter listed more than once (only `RequestMirror` and `ExtensionRef` may be).
    DuplicateFilter(&'static str),
    /// `RequestRedirect` and `URLRewrite` on one rule, which the Gateway API forbids.
    RedirectWithRewrite,
    /// `ReplacePrefixMatch` on a rule with a match that is not a `PathPrefix`.
    PrefixModifierWithoutPrefixMatch,
    /// A redirect status other than 301, 302, 303, 307 or 308.
    UnsupportedRedirectStatus(u16),
    /// A redirect scheme other than `http` or `https`.
    UnsupportedRedirectScheme(String),
    /// A filter a backendRef cannot carry (a redirect, a rewrite, or an unsupported type).
    UnsupportedBackendFilter {
        /// The backendRef, by index.
        backend: usize,
        /// The filter type.
        filter: String,
    },
}

impl fmt::Display for RuleFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnsupportedFilter(kind) => write!(f, "filter type {kind} is not supported"),
            Self::DuplicateFilter(kind) => write!(f, "filter {kind} is listed more than once"),
            Self::RedirectWithRewrite => {
                write!(f, "RequestRedirect and URLRewrite cannot be combined")
            }
            Self::PrefixModifierWithoutPrefixMatch => {
                write!(
                    f,
                    "ReplacePrefixMatch needs every match of the rule to be a PathPrefix"
                )
            }
            Self::UnsupportedRedirectStatus(status) => {
                write!(f, "redirect status {status} is not supported")
            }
            Self::UnsupportedRedirectScheme(scheme) => {
                write!(f, "redirect scheme {scheme:?} is not supported")
            }
            Self::UnsupportedBackendFilter { backend, filter } => {
                write!(
                    f,
                    "backendRef {backend}: filter {filter} is not supported on a backendRef"
                )
            }
        }
    }
}

/// What [`check_rule`] found in a rule's filters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleCheck {
    /// Reasons the rule cannot run as written (empty when it can).
    pub faults: Vec<RuleFault>,
    /// `x-aether-` header names its header modifiers mention (ignored when they run).
    pub mesh_headers: Vec<String>,
}

fn filter_kind(filter: &HttpFilter) -> &'static str {
    match filter {
        HttpFilter::RequestHeaderModifier(_) => "RequestHeaderModifier",
        HttpFilter::ResponseHeaderModifier(_) => "ResponseHeaderModifier",
        HttpFilter::RequestRedirect(_) => "RequestRedirect",
        HttpFilter::UrlRewrite(_) => "URLRewrite",
        HttpFilter::RequestMirror(_) => "RequestMirror",
        HttpFilter::ExtensionRef(_) => "ExtensionRef",
        HttpFilter::Unsupported(_) => "Unsupported",
    }
}

fn mesh_headers_of(modifier: &HeaderModifier, out: &mut Vec<String>) {
    let names = modifier
        .set
        .iter()
        .chain(&modifier.add)
        .map(|(name, _)| name)
        .chain(&modifier.remove);
    out.extend(names.filter(|name| is_mesh_header(name)).cloned());
}

/// Checks a rule's filters (and its backendRefs' filters) against the Gateway API's rules and
/// this implementation's support.
pub fn check_rule(rule: &HttpRule) -> RuleCheck {
    let mut check = RuleCheck::default();
    let mut seen: Vec<&'static str> = Vec::new();
    let mut prefix_modifier = false;
    for filter in &rule.filters {
        let kind = filter_kind(filter);
        let repeatable = matches!(
            filter,
            HttpFilter::RequestMirror(_) | HttpFilter::ExtensionRef(_) | HttpFilter::Unsupported(_)
        );
        if !repeatable
            && seen.contains(&kind)
            && !check.faults.contains(&RuleFault::DuplicateFilter(kind))
        {
            check.faults.push(RuleFault::DuplicateFilter(kind));
        }
        seen.push(kind);
        match filter {
            HttpFilter::RequestHeaderModifier(modifier)
            | HttpFilter::ResponseHeaderModifier(modifier) => {
                mesh_headers_of(modifier, &mut check.mesh_headers);
            }
            HttpFilter::RequestRedirect(redirect) => {
                if let Some(status) = redirect.status
                    && !matches!(status, 301 | 302 | 303 | 307 | 308)
                {
                    check
                        .faults
                        .push(RuleFault::UnsupportedRedirectStatus(status));
                }
                if let Some(scheme) = &redirect.scheme
                    && well_known_port(scheme).is_none()
                {
                    check
                        .faults
                        .push(RuleFault::UnsupportedRedirectScheme(scheme.clone()));
                }
                prefix_modifier |=
                    matches!(redirect.path, Some(PathModifier::ReplacePrefixMatch(_)));
            }
            HttpFilter::UrlRewrite(rewrite) => {
                prefix_modifier |=
                    matches!(rewrite.path, Some(PathModifier::ReplacePrefixMatch(_)));
            }
            HttpFilter::Unsupported(kind) => check
                .faults
                .push(RuleFault::UnsupportedFilter(kind.clone())),
            HttpFilter::RequestMirror(_) | HttpFilter::ExtensionRef(_) => {}
        }
    }
    if seen.contains(&"RequestRedirect") && seen.contains(&"URLRewrite") {
        check.faults.push(RuleFault::RedirectWithRewrite);
    }
    if prefix_modifier
        && rule
            .matches
            .iter()
            .any(|m| matches!(m.path, Some(PathMatch::Exact(_) | PathMatch::Regex(_))))
    {
        check
            .faults
            .push(RuleFault::PrefixModifierWithoutPrefixMatch);
    }
    for (backend, backend_ref) in rule.backends.iter().enumerate() {
        let mut seen: Vec<&'static str> = Vec::new();
        for filter in &backend_ref.filters {
            let kind = filter_kind(filter);
            match filter {
                HttpFilter::RequestHeaderModifier(modifier)
                | HttpFilter::ResponseHeaderModifier(modifier) => {
                    if seen.contains(&kind) {
                        check.faults.push(RuleFault::DuplicateFilter(kind));
                    }
                    mesh_headers_of(modifier, &mut check.mesh_headers);
                }
                HttpFilter::RequestMirror(_) | HttpFilter::ExtensionRef(_) => {}
                HttpFilter::RequestRedirect(_) | HttpFilter::UrlRewrite(_) => {
                    check.faults.push(RuleFault::UnsupportedBackendFilter {
                        backend,
                        filter: kind.to_owned(),
                    });
                }
                HttpFilter::Unsupported(name) => {
                    check.faults.push(RuleFault::UnsupportedBackendFilter {
                        backend,
                        filter: name.clone(),
                    });
                }
            }
            seen.push(kind);
        }
    }
    check
}

/// One filter of a [`FilterPlan`], in the shape the data plane runs and `explain` prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FilterStep {
    /// `RequestHeaderModifier`: [`apply_header_modifier`] on the request headers.
    RequestHeaders(HeaderModifier),
    /// `ResponseHeaderModifier`: [`apply_header_modifier`] on the response headers.
    ResponseHeaders(HeaderModifier),
    /// `RequestRedirect`: the rule answers with [`redirect`]; later request steps do not run.
    Redirect(Redirect),
    /// `URLRewrite`: [`rewrite`] the authority and path before forwarding.
    Rewrite(UrlRewrite),
    /// `ExtensionRef`: run the referenced filter configuration (routes.md §5) here, in order.
    Extension(ObjectRef),
}

fn write_modifier(f: &mut fmt::Formatter<'_>, modifier: &HeaderModifier) -> fmt::Result {
    for (name, value) in &modifier.set {
        write!(f, " set {name}={value}")?;
    }
    for (name, value) in &modifier.add {
        write!(f, " add {name}={value}")?;
    }
    for name in &modifier.remove {
        write!(f, " remove {name}")?;
    }
    Ok(())
}

fn write_path_modifier(f: &mut fmt::Formatter<'_>, modifier: &PathModifier) -> fmt::Result {
    match modifier {
        PathModifier::ReplaceFullPath(path) => write!(f, " path ReplaceFullPath {path}"),
        PathModifier::ReplacePrefixMatch(path) => write!(f, " path ReplacePrefixMatch {path}"),
    }
}

fn write_object(f: &mut fmt::Formatter<'_>, target: &ObjectRef) -> fmt::Result {
    let group = if target.group.is_empty() {
        "core"
    } else {
        target.group.as_str()
    };
    write!(f, "{group}/{} ", target.kind)?;
    if let Some(namespace) = &target.namespace {
        write!(f, "{namespace}/")?;
    }
    write!(f, "{}", target.name)
}

impl fmt::Display for FilterStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RequestHeaders(modifier) => {
                f.write_str("RequestHeaderModifier")?;
                write_modifier(f, modifier)
            }
            Self::ResponseHeaders(modifier) => {
                f.write_str("ResponseHeaderModifier")?;
                write_modifier(f, modifier)
            }
            Self::Redirect(redirect) => {
                f.write_str("RequestRedirect")?;
                if let Some(scheme) = &redirect.scheme {
                    write!(f, " scheme {scheme}")?;
                }
                if let Some(hostname) = &redirect.hostname {
                    write!(f, " hostname {hostname}")?;
                }
                if let Some(port) = redirect.port {
                    write!(f, " port {port}")?;
                }
                if let Some(path) = &redirect.path {
                    write_path_modifier(f, path)?;
                }
                write!(f, " status {}", redirect.status.unwrap_or(302))
            }
            Self::Rewrite(rewrite) => {
                f.write_str("URLRewrite")?;
                if let Some(hostname) = &rewrite.hostname {
                    write!(f, " hostname {hostname}")?;
                }
                if let Some(path) = &rewrite.path {
                    write_path_modifier(f, path)?;
                }
                Ok(())
            }
            Self::Extension(target) => {
                f.write_str("ExtensionRef ")?;
                write_object(f, target)
            }
        }
    }
}

/// A `RequestMirror` of a plan, printable on one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorStep(pub Mirror);

impl fmt::Display for MirrorStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RequestMirror ")?;
        write_object(f, &self.0.backend)?;
        if let Some(port) = self.0.port {
            write!(f, ":{port}")?;
        }
        write!(f, " {}%", self.0.percent)
    }
}

/// What a rule does once its request filters have run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleAnswer {
    /// Forward to a backend chosen by weight ([`FilterPlan::pick_backend`]).
    Forward,
    /// Answer with this redirect ([`redirect`]); no backend is contacted. It carries no
    /// `x-aether-error` (addressing.md §11.1).
    Redirect(Redirect),
    /// The rule has no backendRef and no filter that answers: 500 `invalid-backend`
    /// (routes.md §4).
    NoBackends,
    /// The rule's filters cannot be run as written: the rule answers with an error and runs
    /// none of them.
    Invalid(RuleFault),
}

impl fmt::Display for RuleAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Forward => f.write_str("forward to a backend by weight"),
            Self::Redirect(redirect) => {
                write!(f, "answer {} redirect", redirect.status.unwrap_or(302))
            }
            Self::NoBackends => f.write_str("answer 500 invalid-backend (no backendRef)"),
            Self::Invalid(fault) => write!(f, "answer an error, the rule is not served: {fault}"),
        }
    }
}

/// The filters of one backendRef of a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendPlan {
    /// Its weight.
    pub weight: u32,
    /// Request filters, run after the rule's, in order.
    pub request: Vec<FilterStep>,
    /// Response filters, run before the rule's, in order.
    pub response: Vec<FilterStep>,
    /// Mirrors, in addition to the rule's.
    pub mirrors: Vec<MirrorStep>,
}

/// The compiled filters of one rule, in the order a data plane runs them.
///
/// Build it with [`FilterPlan::for_rule`] at model compile time. To serve a request matched to
/// the rule:
/// 1. If `answer` is [`RuleAnswer::Invalid`], answer the error and run nothing else.
/// 2. Run `request` in order. An [`FilterStep::Extension`] (rbac, ext_authz, header_mutation)
///    may end the request; a [`FilterStep::Redirect`] answers it.
/// 3. For [`RuleAnswer::Forward`], pick a backend ([`FilterPlan::pick_backend`]), run its
///    `request` steps, send `mirrors` (the rule's and the backend's, each with
///    [`mirror_fires`]), forward.
/// 4. On the response (or on the rule's own redirect answer), run the chosen backend's
///    `response` steps, then the rule's `response` steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterPlan {
    /// Request-phase steps of the rule, in the rule's order.
    pub request: Vec<FilterStep>,
    /// Response-phase steps of the rule, in the rule's order.
    pub response: Vec<FilterStep>,
    /// The rule's mirrors.
    pub mirrors: Vec<MirrorStep>,
    /// What the rule does after its request steps.
    pub answer: RuleAnswer,
    /// One plan per backendRef, by index.
    pub backends: Vec<BackendPlan>,
}

impl FilterPlan {
    /// Whether a step rewrites or redirects by `ReplacePrefixMatch`, which needs the matched
    /// prefix of the request.
    pub fn uses_prefix(&self) -> bool {
        let prefix =
            |m: &Option<PathModifier>| matches!(m, Some(PathModifier::ReplacePrefixMatch(_)));
        let step = |s: &FilterStep| match s {
            FilterStep::Redirect(r) => prefix(&r.path),
            FilterStep::Rewrite(r) => prefix(&r.path),
            FilterStep::RequestHeaders(_)
            | FilterStep::ResponseHeaders(_)
            | FilterStep::Extension(_) => false,
        };
        let answer = matches!(&self.answer, RuleAnswer::Redirect(r) if prefix(&r.path));
        answer
            || self.request.iter().any(step)
            || self.backends.iter().any(|b| b.request.iter().any(step))
    }

    /// Compiles the plan of one rule. A rule [`check_rule`] finds fault with gets
    /// [`RuleAnswer::Invalid`] with its first fault.
    pub fn for_rule(rule: &HttpRule) -> Self {
        let check = check_rule(rule);
        let (request, response, mirrors, redirect) = split_filters(&rule.filters);
        let backends = rule
            .backends
            .iter()
            .map(|backend| {
                let (request, response, mirrors, _) = split_filters(&backend.filters);
                BackendPlan {
                    weight: backend.weight,
                    request,
                    response,
                    mirrors,
                }
            })
            .collect();
        let answer = match (check.faults.into_iter().next(), redirect) {
            (Some(fault), _) => RuleAnswer::Invalid(fault),
            (None, Some(redirect)) => RuleAnswer::Redirect(redirect),
            (None, None) if rule.backends.is_empty() => RuleAnswer::NoBackends,
            (None, None) => RuleAnswer::Forward,
        };
        Self {
            request,
            response,
            mirrors,
            answer,
            backends,
        }
    }

    /// The backendRef weights, by index.
    pub fn weights(&self) -> Vec<u32> {
        self.backends.iter().map(|backend| backend.weight).collect()
    }

    /// Chooses a backendRef by weight ([`pick_weighted`]); `None` when every weight is zero.
    pub fn pick_backend(&self, entropy: u64) -> Option<usize> {
        pick_weighted(&self.weights(), entropy)
    }
}

type SplitFilters = (
    Vec<FilterStep>,
    Vec<FilterStep>,
    Vec<MirrorStep>,
    Option<Redirect>,
);

fn split_filters(filters: &[HttpFilter]) -> SplitFilters {
    let mut request = Vec::new();
    let mut response = Vec::new();
    let mut mirrors = Vec::new();
    let mut redirect = None;
    for filter in filters {
        match filter {
            HttpFilter::RequestHeaderModifier(modifier) => {
                request.push(FilterStep::RequestHeaders(modifier.clone()))
            }
            HttpFilter::ResponseHeaderModifier(modifier) => {
                response.push(FilterStep::ResponseHeaders(modifier.clone()));
            }
            HttpFilter::RequestRedirect(filter) => {
                request.push(FilterStep::Redirect(filter.clone()));
                redirect.get_or_insert_with(|| filter.clone());
            }
            HttpFilter::UrlRewrite(filter) => request.push(FilterStep::Rewrite(filter.clone())),
            HttpFilter::RequestMirror(mirror) => mirrors.push(MirrorStep(mirror.clone())),
            HttpFilter::ExtensionRef(target) => request.push(FilterStep::Extension(target.clone())),
            // Refused by check_rule: the plan answers RuleAnswer::Invalid.
            HttpFilter::Unsupported(_) => {}
        }
    }
    (request, response, mirrors, redirect)
}

impl fmt::Display for FilterPlan {
    /// One line per step: the rule's request steps, mirrors, the answer, then each backend's
    /// steps and the rule's response steps.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for step in &self.request {
            writeln!(f, "request: {step}")?;
        }
        for mirror in &self.mirrors {
            writeln!(f, "mirror: {mirror}")?;
        }
        writeln!(f, "then: {}", self.answer)?;
        for (index, backend) in self.backends.iter().enumerate() {
            writeln!(f, "backend {index}: weight {}", backend.weight)?;
            for step in &backend.request {
                writeln!(f, "backend {index} request: {step}")?;
            }
            for mirror in &backend.mirrors {
                writeln!(f, "backend {index} mirror: {mirror}")?;
            }
            for step in &backend.response {
                writeln!(f, "backend {index} response: {step}")?;
            }
        }
        for step in &self.response {
            writeln!(f, "response: {step}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
