//! Gateway API HTTP route matching: the compiled match table of one (service, port).
//!
//! Layer 0 (pure): std, `regex` and the model's own types. Nothing here performs IO, reads a
//! clock or keeps global state. A [`RouteTable`] is built once, when the model is compiled,
//! from every route attached to one (service, port) (routes.md §2.1); it is immutable
//! afterwards and [`RouteTable::select`] answers a request by reading it.
//!
//! Invariants:
//! - Building never panics and never fails as a whole: an input the table cannot use (an
//!   invalid regular expression, a path that does not start with `/`, an unreadable creation
//!   timestamp) is reported as a [`RouteProblem`] next to the table, and the table encodes the
//!   consequence (the match is left out, the route sorts after the dated ones).
//! - Regular expressions are compiled here, once, with RE2 semantics (the `regex` crate), and
//!   always match the whole value.
//! - Two tables built from the same input are equal ([`PartialEq`] compares regexes by their
//!   source text), so the model stays comparable for determinism.

use crate::prelude::*;

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::fmt;

use http::HeaderMap;
use regex::Regex;

use crate::model::filters::{self, RuleFault};
use crate::model::path::{percent_decode, prefix_element, prefix_matches};
use crate::model::snapshot::{
    HttpMatch, HttpRouteKind, HttpRule, PathMatch, ValueMatch, ValueMatchKind,
};

/// The parts of an HTTP request that route matching reads, borrowed from the request.
///
/// The proxy builds one per request after removing the client's `x-aether-` headers
/// (addressing.md I12); nothing here is copied, the header map included (issue #38).
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a> {
    /// The method, as received (methods are case-sensitive: `GET`, not `get`).
    pub method: &'a str,
    /// The path, without the query string.
    pub path: &'a str,
    /// The query string, without the `?`, when the request has one.
    pub query: Option<&'a str>,
    /// The request's header map (names are lower case in it, and a repeated name keeps each of
    /// its values). A match reads a value as UTF-8 text, a byte that is not UTF-8 read as
    /// U+FFFD (`String::from_utf8_lossy`), so such a value matches only a test written with
    /// U+FFFD there.
    pub headers: &'a HeaderMap,
    /// The caller's namespace, a connection fact (addressing.md I4); `None` when unknown.
    /// It chooses between consumer and producer routes (routes.md §2.3).
    pub caller_namespace: Option<&'a str>,
}

/// One route attached to the (service, port) a table is built for, as [`RouteTable::build`]
/// reads it.
#[derive(Clone, Copy, Debug)]
pub struct RouteInput<'a> {
    /// Namespace of the route.
    pub namespace: &'a str,
    /// Name of the route.
    pub name: &'a str,
    /// `metadata.creationTimestamp`, RFC 3339 text.
    pub created: Option<&'a str>,
    /// HTTPRoute or GRPCRoute.
    pub kind: HttpRouteKind,
    /// Namespace of the parent Service. A route in another namespace is a consumer route
    /// (routes.md §2.3).
    pub parent_namespace: &'a str,
    /// The rules of this route (all of them: the index of a rule is its position here).
    pub rules: &'a [HttpRule],
}

/// The identity of a route in a [`RouteTable`], for tie-breaks, `explain` and problems.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteId {
    /// Namespace of the route.
    pub namespace: String,
    /// Name of the route.
    pub name: String,
    /// `metadata.creationTimestamp`, as given.
    pub created: Option<String>,
    /// HTTPRoute or GRPCRoute.
    pub kind: HttpRouteKind,
    /// Whether the route is a consumer route (its namespace is not its parent's).
    pub consumer: bool,
    /// The name of each rule (`None` for an unnamed rule), by rule index.
    pub rule_names: Vec<Option<String>>,
}

/// Something [`RouteTable::build`] (or [`crate::model::filters::FilterPlan`]) could not use as
/// written, and what the table did instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteProblem {
    /// Namespace of the route.
    pub namespace: String,
    /// Name of the route.
    pub name: String,
    /// The rule concerned, by index, when the problem is in a rule.
    pub rule: Option<usize>,
    /// What was wrong.
    pub kind: RouteProblemKind,
}

/// The kinds of [`RouteProblem`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteProblemKind {
    /// A regular expression of a match does not compile: that match is left out of the table.
    InvalidRegex {
        /// The match, by index within the rule.
        match_index: usize,
        /// The expression as written.
        pattern: String,
        /// The compiler's message.
        error: String,
    },
    /// An `Exact` or `PathPrefix` value that does not start with `/`: that match is left out.
    InvalidPath {
        /// The match, by index within the rule.
        match_index: usize,
        /// The value as written.
        value: String,
    },
    /// The creation timestamp is not RFC 3339: the route ranks after every dated route.
    InvalidCreationTimestamp {
        /// The text as given.
        value: String,
    },
    /// The rule's filters cannot be run as written: the rule still matches, and answers with
    /// an error instead of running them in part ([`crate::model::filters::RuleAnswer::Invalid`]).
    RuleNotServed(RuleFault),
    /// A header modifier names an `x-aether-` header, which is the mesh's (addressing.md I12,
    /// I13): that entry is ignored, the rest of the modifier runs.
    MeshHeaderIgnored {
        /// The header name as written.
        header: String,
    },
}

impl RouteProblemKind {
    /// A stable kebab-case name for the kind, for diagnostics and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidRegex { .. } => "route-invalid-regex",
            Self::InvalidPath { .. } => "route-invalid-path",
            Self::InvalidCreationTimestamp { .. } => "route-invalid-creation-timestamp",
            Self::RuleNotServed(_) => "route-rule-not-served",
            Self::MeshHeaderIgnored { .. } => "route-mesh-header-ignored",
        }
    }
}

impl fmt::Display for RouteProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "route {}/{}", self.namespace, self.name)?;
        if let Some(rule) = self.rule {
            write!(f, " rule {rule}")?;
        }
        match &self.kind {
            RouteProblemKind::InvalidRegex {
                match_index,
                pattern,
                error,
            } => write!(
                f,
                ": match {match_index}: regular expression {pattern:?} does not compile, the match is unused: {error}"
            ),
            RouteProblemKind::InvalidPath { match_index, value } => write!(
                f,
                ": match {match_index}: path {value:?} does not start with '/', the match is unused"
            ),
            RouteProblemKind::InvalidCreationTimestamp { value } => write!(
                f,
                ": creation timestamp {value:?} is not RFC 3339, the route ranks after dated routes"
            ),
            RouteProblemKind::RuleNotServed(fault) => {
                write!(
                    f,
                    ": rule answers with an error instead of running: {fault}"
                )
            }
            RouteProblemKind::MeshHeaderIgnored { header } => write!(
                f,
                ": header modifier entry for {header:?} ignored, x-aether- headers are the mesh's"
            ),
        }
    }
}

/// A compiled regular expression that compares, prints and matches by its source text.
///
/// The expression always matches the whole value (it is compiled as `^(?:source)$`).
#[derive(Clone)]
struct FullRegex {
    source: String,
    regex: Regex,
}

impl FullRegex {
    fn new(source: &str) -> Result<Self, regex::Error> {
        let regex = Regex::new(&format!("^(?:{source})$"))?;
        Ok(Self {
            source: source.to_owned(),
            regex,
        })
    }

    fn is_match(&self, value: &str) -> bool {
        self.regex.is_match(value)
    }
}

impl PartialEq for FullRegex {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for FullRegex {}

impl fmt::Debug for FullRegex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FullRegex({:?})", self.source)
    }
}

/// A compiled path test.
#[derive(Clone, Debug, PartialEq, Eq)]
enum PathTest {
    Exact(String),
    /// `value` as written; `element` is the value without trailing `/` (`""` for `/`).
    Prefix {
        value: String,
        element: String,
    },
    Regex(FullRegex),
}

/// A compiled header or query parameter value test.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ValueTest {
    Exact(String),
    Regex(FullRegex),
}

impl ValueTest {
    fn is_match(&self, value: &str) -> bool {
        match self {
            Self::Exact(expected) => expected == value,
            Self::Regex(regex) => regex.is_match(value),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct NamedTest {
    name: String,
    test: ValueTest,
}

/// The Gateway API precedence of a match, smaller first. See [`RouteTable::select`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    path_class: u8,
    prefix_len: Reverse<usize>,
    has_method: Reverse<bool>,
    headers: Reverse<usize>,
    query: Reverse<usize>,
    route_rank: usize,
    rule: usize,
    match_index: usize,
}

/// One match of one rule of one route, compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    rank: Rank,
    route: usize,
    rule: usize,
    /// `None` for a rule written without matches (one implicit `PathPrefix /`).
    match_index: Option<usize>,
    path: PathTest,
    method: Option<String>,
    headers: Vec<NamedTest>,
    query: Vec<NamedTest>,
}

/// Which kind of path match selected a request, with the value as configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchedPath<'t> {
    /// An `Exact` match.
    Exact(&'t str),
    /// A `PathPrefix` match, with the prefix as written (`/` for a rule without matches).
    Prefix(&'t str),
    /// A `RegularExpression` match, with the expression as written.
    Regex(&'t str),
}

/// The rule [`RouteTable::select`] chose for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Selected<'t> {
    /// The route, by its index in the slice given to [`RouteTable::build`].
    pub route: usize,
    /// The rule, by its index within the route.
    pub rule: usize,
    /// The rule's `name`, when it has one (HTTPRouteNamedRouteRule).
    pub rule_name: Option<&'t str>,
    /// The match, by index within the rule; `None` for a rule written without matches.
    pub match_index: Option<usize>,
    /// The path match that matched.
    pub matched: MatchedPath<'t>,
}

impl<'t> Selected<'t> {
    /// The prefix that matched, for `ReplacePrefixMatch`; `None` unless a `PathPrefix` matched.
    pub fn matched_prefix(&self) -> Option<&'t str> {
        match self.matched {
            MatchedPath::Prefix(prefix) => Some(prefix),
            MatchedPath::Exact(_) | MatchedPath::Regex(_) => None,
        }
    }
}

/// The compiled, immutable match table of every route attached to one (service, port).
///
/// Build it with [`RouteTable::build`] when the model is compiled; answer requests with
/// [`RouteTable::select`]. Entries are kept sorted by precedence, so selection is the first
/// entry that matches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteTable {
    routes: Vec<RouteId>,
    /// Entries of producer routes (routes in the parent's namespace), sorted by precedence.
    producer: Vec<Entry>,
    /// Entries of consumer routes, by the consumer (route) namespace, sorted by precedence.
    consumer: BTreeMap<String, Vec<Entry>>,
}

impl RouteTable {
    /// Compiles the match table of the routes attached to one (service, port).
    ///
    /// `routes` must hold every route attached there; `Selected::route` indexes this slice.
    /// Pass the routes in a canonical order (for example by namespace and name) so that equal
    /// inputs give equal tables; precedence itself does not depend on the order.
    ///
    /// Never fails: what cannot be used is returned as [`RouteProblem`]s, and the table leaves
    /// it out (see [`RouteProblemKind`] for what each problem does).
    pub fn build(routes: &[RouteInput<'_>]) -> (Self, Vec<RouteProblem>) {
        let mut problems = Vec::new();

        // Route order for ties: oldest creation timestamp first (undated last), then
        // "{namespace}/{name}" alphabetically, then input order.
        let mut order: Vec<RouteOrderKey<'_>> = Vec::with_capacity(routes.len());
        for (index, route) in routes.iter().enumerate() {
            let created = match route.created {
                Some(text) => {
                    let parsed = parse_rfc3339(text);
                    if parsed.is_none() {
                        problems.push(RouteProblem {
                            namespace: route.namespace.to_owned(),
                            name: route.name.to_owned(),
                            rule: None,
                            kind: RouteProblemKind::InvalidCreationTimestamp {
                                value: text.to_owned(),
                            },
                        });
                    }
                    parsed
                }
                None => None,
            };
            order.push((
                created.is_none(),
                created.unwrap_or((0, 0)),
                route.namespace,
                route.name,
                index,
            ));
        }
        order.sort();
        let mut route_rank = vec![0; routes.len()];
        for (rank, entry) in order.iter().enumerate() {
            route_rank[entry.4] = rank;
        }

        let mut table = Self::default();
        for (route_index, route) in routes.iter().enumerate() {
            let consumer = route.namespace != route.parent_namespace;
            table.routes.push(RouteId {
                namespace: route.namespace.to_owned(),
                name: route.name.to_owned(),
                created: route.created.map(str::to_owned),
                kind: route.kind,
                consumer,
                rule_names: route.rules.iter().map(|rule| rule.name.clone()).collect(),
            });
            let problem = |rule: Option<usize>, kind: RouteProblemKind| RouteProblem {
                namespace: route.namespace.to_owned(),
                name: route.name.to_owned(),
                rule,
                kind,
            };
            for (rule_index, rule) in route.rules.iter().enumerate() {
                let check = filters::check_rule(rule);
                for fault in check.faults {
                    problems.push(problem(
                        Some(rule_index),
                        RouteProblemKind::RuleNotServed(fault),
                    ));
                }
                for header in check.mesh_headers {
                    problems.push(problem(
                        Some(rule_index),
                        RouteProblemKind::MeshHeaderIgnored { header },
                    ));
                }

                let implicit = [HttpMatch::default()];
                let (matches, explicit) = if rule.matches.is_empty() {
                    (&implicit[..], false)
                } else {
                    (&rule.matches[..], true)
                };
                for (match_index, m) in matches.iter().enumerate() {
                    let compiled = compile_match(m, match_index);
                    let (path, method, headers, query) = match compiled {
                        Ok(parts) => parts,
                        Err(kind) => {
                            problems.push(problem(Some(rule_index), kind));
                            continue;
                        }
                    };
                    let (path_class, prefix_len) = match &path {
                        PathTest::Exact(_) => (0, 0),
                        PathTest::Prefix { element, .. } => (1, element.len()),
                        PathTest::Regex(_) => (2, 0),
                    };
                    let entry = Entry {
                        rank: Rank {
                            path_class,
                            prefix_len: Reverse(prefix_len),
                            has_method: Reverse(method.is_some()),
                            headers: Reverse(headers.len()),
                            query: Reverse(query.len()),
                            route_rank: route_rank[route_index],
                            rule: rule_index,
                            match_index,
                        },
                        route: route_index,
                        rule: rule_index,
                        match_index: explicit.then_some(match_index),
                        path,
                        method,
                        headers,
                        query,
                    };
                    if consumer {
                        table
                            .consumer
                            .entry(route.namespace.to_owned())
                            .or_default()
                            .push(entry);
                    } else {
                        table.producer.push(entry);
                    }
                }
            }
        }
        table.producer.sort_by_key(|entry| entry.rank);
        for entries in table.consumer.values_mut() {
            entries.sort_by_key(|entry| entry.rank);
        }
        (table, problems)
    }

    /// Chooses the rule that answers `req`, or `None` when no rule matches (routes.md §4:
    /// 404 `route-not-matched`).
    ///
    /// Which routes are considered: when the caller's namespace has consumer routes attached
    /// here, only those; otherwise only the producer routes (routes.md §2.3, GAMMA). A
    /// consumer caller whose request matches none of its consumer routes' rules is therefore
    /// not matched against the producer routes.
    ///
    /// Among the matches of every rule of the routes considered, the first of this order that
    /// matches wins (Gateway API `HTTPRouteRule.matches`):
    ///
    /// 1. An `Exact` path match.
    /// 2. A `PathPrefix` match, longer prefix first (the length without trailing `/`; a rule
    ///    without matches is one `PathPrefix /`, the shortest).
    /// 3. A `RegularExpression` path match. Its rank is implementation-specific in the Gateway
    ///    API; here it ranks after every prefix, `PathPrefix /` included.
    /// 4. A match with a method, before one without.
    /// 5. More header matches first.
    /// 6. More query parameter matches first.
    /// 7. The route with the oldest creation timestamp (routes without a readable timestamp
    ///    last).
    /// 8. The route first in alphabetical order of namespace, then name.
    /// 9. The rule first in the route's list.
    /// 10. The match first in the rule's list.
    ///
    /// How each part matches:
    /// - Path `Exact`: byte equality. `PathPrefix`: by path element, ignoring a trailing `/`
    ///   of the prefix, so `/foo` matches `/foo`, `/foo/` and `/foo/bar`, never `/foobar`.
    ///   `RegularExpression`: the whole path.
    /// - Method: exact (methods are case-sensitive).
    /// - Header: name case-insensitive; the value (exact, or a regular expression matching the
    ///   whole value) is compared with each value of the name and, when the name is repeated,
    ///   with the values joined by `,` (RFC 9110 §5.3). Only the first match entry of a name
    ///   counts, as the Gateway API requires.
    /// - Query parameter: name case-sensitive; the first value of the name, percent-decoded,
    ///   is compared (the Gateway API's recommendation). A parameter without `=` has the value
    ///   `""`.
    pub fn select(&self, req: &RequestView<'_>) -> Option<Selected<'_>> {
        let entries = req
            .caller_namespace
            .and_then(|namespace| self.consumer.get(namespace))
            .unwrap_or(&self.producer);
        let entry = entries.iter().find(|entry| entry.is_match(req))?;
        let rule_name = self
            .routes
            .get(entry.route)
            .and_then(|route| route.rule_names.get(entry.rule))
            .and_then(|name| name.as_deref());
        let matched = match &entry.path {
            PathTest::Exact(value) => MatchedPath::Exact(value),
            PathTest::Prefix { value, .. } => MatchedPath::Prefix(value),
            PathTest::Regex(regex) => MatchedPath::Regex(&regex.source),
        };
        Some(Selected {
            route: entry.route,
            rule: entry.rule,
            rule_name,
            match_index: entry.match_index,
            matched,
        })
    }

    /// The identities of the routes, in the order given to [`RouteTable::build`].
    pub fn routes(&self) -> &[RouteId] {
        &self.routes
    }

    /// Whether the table holds no usable match. A table built from attached routes whose
    /// every match was unusable still answers `route-not-matched`: emptiness is not "no rule
    /// attached" (routes.md §4), which the caller decides from the attachment itself.
    pub fn is_empty(&self) -> bool {
        self.producer.is_empty() && self.consumer.is_empty()
    }
}

/// (undated, (seconds, nanos), namespace, name, input index): the tie-break order of routes.
type RouteOrderKey<'a> = (bool, (i64, u32), &'a str, &'a str, usize);

type CompiledMatch = (PathTest, Option<String>, Vec<NamedTest>, Vec<NamedTest>);

fn compile_match(m: &HttpMatch, match_index: usize) -> Result<CompiledMatch, RouteProblemKind> {
    let regex = |pattern: &str| {
        FullRegex::new(pattern).map_err(|error| RouteProblemKind::InvalidRegex {
            match_index,
            pattern: pattern.to_owned(),
            error: error.to_string(),
        })
    };
    let path = match &m.path {
        None => PathTest::Prefix {
            value: "/".to_owned(),
            element: String::new(),
        },
        Some(PathMatch::Exact(value)) => {
            if !value.starts_with('/') {
                return Err(RouteProblemKind::InvalidPath {
                    match_index,
                    value: value.clone(),
                });
            }
            PathTest::Exact(value.clone())
        }
        Some(PathMatch::Prefix(value)) => {
            if !value.starts_with('/') {
                return Err(RouteProblemKind::InvalidPath {
                    match_index,
                    value: value.clone(),
                });
            }
            PathTest::Prefix {
                value: value.clone(),
                element: prefix_element(value).to_owned(),
            }
        }
        Some(PathMatch::Regex(pattern)) => PathTest::Regex(regex(pattern)?),
    };
    let mut headers: Vec<NamedTest> = Vec::new();
    for header in &m.headers {
        // Only the first entry of a name counts (names compare case-insensitively).
        if headers
            .iter()
            .any(|seen| seen.name.eq_ignore_ascii_case(&header.name))
        {
            continue;
        }
        headers.push(NamedTest {
            name: header.name.to_ascii_lowercase(),
            test: value_test(header, &regex)?,
        });
    }
    let mut query: Vec<NamedTest> = Vec::new();
    for param in &m.query_params {
        if query.iter().any(|seen| seen.name == param.name) {
            continue;
        }
        query.push(NamedTest {
            name: param.name.clone(),
            test: value_test(param, &regex)?,
        });
    }
    Ok((path, m.method.clone(), headers, query))
}

fn value_test(
    value: &ValueMatch,
    regex: &impl Fn(&str) -> Result<FullRegex, RouteProblemKind>,
) -> Result<ValueTest, RouteProblemKind> {
    Ok(match value.kind {
        ValueMatchKind::Exact => ValueTest::Exact(value.value.clone()),
        ValueMatchKind::Regex => ValueTest::Regex(regex(&value.value)?),
    })
}

impl Entry {
    fn is_match(&self, req: &RequestView<'_>) -> bool {
        let path_ok = match &self.path {
            PathTest::Exact(value) => req.path == value,
            PathTest::Prefix { element, .. } => prefix_matches(req.path, element),
            PathTest::Regex(regex) => regex.is_match(req.path),
        };
        path_ok
            && self
                .method
                .as_deref()
                .is_none_or(|method| method == req.method)
            && self
                .headers
                .iter()
                .all(|header| header_matches(req.headers, header))
            && self.query.iter().all(|param| {
                first_query_value(req.query, &param.name)
                    .is_some_and(|value| param.test.is_match(&value))
            })
    }
}

/// Whether `test` matches the values of its name in `headers`: one of them, or all of them
/// joined by `,` when the name is repeated. Allocates only for a value that is not UTF-8 and for
/// the joined form of a repeated name that no single value matched.
fn header_matches(headers: &HeaderMap, test: &NamedTest) -> bool {
    // `NamedTest::name` is lower case; a name no header map can hold finds no value.
    let values = headers.get_all(test.name.as_str());
    let mut count = 0usize;
    for value in values.iter() {
        count += 1;
        if test
            .test
            .is_match(&String::from_utf8_lossy(value.as_bytes()))
        {
            return true;
        }
    }
    if count < 2 {
        return false;
    }
    let mut joined = String::new();
    for (i, value) in values.iter().enumerate() {
        if i > 0 {
            joined.push(',');
        }
        joined.push_str(&String::from_utf8_lossy(value.as_bytes()));
    }
    test.test.is_match(&joined)
}

/// The first value of query parameter `name`, percent-decoded; `""` for a bare `name`.
fn first_query_value<'q>(query: Option<&'q str>, name: &str) -> Option<Cow<'q, str>> {
    query?.split('&').find_map(|pair| {
        let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(raw_name) == name).then(|| percent_decode(raw_value))
    })
}

/// Parses an RFC 3339 timestamp into (seconds since the Unix epoch, nanoseconds), for ordering
/// creation timestamps written with different offsets or precisions.
pub(crate) fn parse_rfc3339(text: &str) -> Option<(i64, u32)> {
    let b = text.as_bytes();
    let digits = |from: usize, len: usize| -> Option<i64> {
        let slice = b.get(from..from + len)?;
        slice.iter().try_fold(0i64, |acc, &c| {
            c.is_ascii_digit().then(|| acc * 10 + i64::from(c - b'0'))
        })
    };
    let year = digits(0, 4)?;
    let month = digits(5, 2)?;
    let day = digits(8, 2)?;
    let hour = digits(11, 2)?;
    let minute = digits(14, 2)?;
    let second = digits(17, 2)?;
    if b.get(4) != Some(&b'-')
        || b.get(7) != Some(&b'-')
        || !matches!(b.get(10), Some(b'T' | b't' | b' '))
        || b.get(13) != Some(&b':')
        || b.get(16) != Some(&b':')
    {
        return None;
    }
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut nanos: u32 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        let mut scale = 100_000_000u32;
        while let Some(c) = b.get(i).filter(|c| c.is_ascii_digit()) {
            nanos += u32::from(c - b'0') * scale;
            scale /= 10;
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    let offset = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b.get(i + 3) == Some(&b':') => {
            let hours = digits(i + 1, 2)?;
            let minutes = digits(i + 4, 2)?;
            if hours > 23 || minutes > 59 {
                return None;
            }
            let seconds = hours * 3600 + minutes * 60;
            if *sign == b'+' { seconds } else { -seconds }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    Some((
        days * 86_400 + hour * 3600 + minute * 60 + second - offset,
        nanos,
    ))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = if year >= 0 { year } else { year - 399 } / 400;
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests;
