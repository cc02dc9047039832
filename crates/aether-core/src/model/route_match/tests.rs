//! Precedence stories for [`RouteTable`]: each test is one sentence of the Gateway API rules.

use proptest::prelude::*;

use super::*;
use crate::model::snapshot::{HttpFilter, Redirect, UrlRewrite};

struct Route {
    namespace: &'static str,
    name: &'static str,
    created: Option<&'static str>,
    parent: &'static str,
    rules: Vec<HttpRule>,
}

fn route(name: &'static str, created: &'static str, rules: Vec<HttpRule>) -> Route {
    Route {
        namespace: "ns",
        name,
        created: Some(created),
        parent: "ns",
        rules,
    }
}

fn rule(matches: Vec<HttpMatch>) -> HttpRule {
    HttpRule {
        name: None,
        matches,
        filters: Vec::new(),
        backends: Vec::new(),
        request_timeout_ms: None,
        backend_request_timeout_ms: None,
    }
}

fn named(name: &str, matches: Vec<HttpMatch>) -> HttpRule {
    HttpRule {
        name: Some(name.to_owned()),
        ..rule(matches)
    }
}

fn prefix(value: &str) -> HttpMatch {
    HttpMatch {
        path: Some(PathMatch::Prefix(value.to_owned())),
        ..HttpMatch::default()
    }
}

fn exact(value: &str) -> HttpMatch {
    HttpMatch {
        path: Some(PathMatch::Exact(value.to_owned())),
        ..HttpMatch::default()
    }
}

fn regex(value: &str) -> HttpMatch {
    HttpMatch {
        path: Some(PathMatch::Regex(value.to_owned())),
        ..HttpMatch::default()
    }
}

fn value(name: &str, kind: ValueMatchKind, value: &str) -> ValueMatch {
    ValueMatch {
        name: name.to_owned(),
        kind,
        value: value.to_owned(),
    }
}

fn with_headers(mut m: HttpMatch, headers: &[(&str, &str)]) -> HttpMatch {
    m.headers = headers
        .iter()
        .map(|(n, v)| value(n, ValueMatchKind::Exact, v))
        .collect();
    m
}

fn with_query(mut m: HttpMatch, params: &[(&str, &str)]) -> HttpMatch {
    m.query_params = params
        .iter()
        .map(|(n, v)| value(n, ValueMatchKind::Exact, v))
        .collect();
    m
}

fn with_method(mut m: HttpMatch, method: &str) -> HttpMatch {
    m.method = Some(method.to_owned());
    m
}

fn build(routes: &[Route]) -> (RouteTable, Vec<RouteProblem>) {
    let inputs: Vec<RouteInput<'_>> = routes
        .iter()
        .map(|r| RouteInput {
            namespace: r.namespace,
            name: r.name,
            created: r.created,
            kind: HttpRouteKind::Http,
            parent_namespace: r.parent,
            rules: &r.rules,
        })
        .collect();
    RouteTable::build(&inputs)
}

fn table(routes: &[Route]) -> RouteTable {
    let (table, problems) = build(routes);
    assert!(problems.is_empty(), "unexpected problems: {problems:?}");
    table
}

/// A request: method, path with optional `?query`, headers, caller namespace `ns`.
struct Req {
    method: &'static str,
    target: &'static str,
    headers: HeaderMap,
    caller: Option<&'static str>,
}

fn req(target: &'static str) -> Req {
    Req {
        method: "GET",
        target,
        headers: HeaderMap::new(),
        caller: Some("ns"),
    }
}

impl Req {
    fn method(mut self, method: &'static str) -> Self {
        self.method = method;
        self
    }
    fn header(self, name: &str, value: &str) -> Self {
        self.raw_header(name, value.as_bytes())
    }
    /// A header whose value is these bytes, UTF-8 or not (the name is lower-cased, as the wire's
    /// header map does).
    fn raw_header(mut self, name: &str, value: &[u8]) -> Self {
        self.headers.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            http::HeaderValue::from_bytes(value).unwrap(),
        );
        self
    }
    fn caller(mut self, caller: &'static str) -> Self {
        self.caller = Some(caller);
        self
    }
    fn view(&self) -> RequestView<'_> {
        let (path, query) = match self.target.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (self.target, None),
        };
        RequestView {
            method: self.method,
            path,
            query,
            headers: &self.headers,
            caller_namespace: self.caller,
        }
    }
}

/// (route index, rule index) selected for `req`.
fn pick(table: &RouteTable, req: &Req) -> Option<(usize, usize)> {
    table.select(&req.view()).map(|s| (s.route, s.rule))
}

const T0: &str = "2024-01-01T00:00:00Z";
const T1: &str = "2024-01-02T00:00:00Z";

#[test]
fn exact_path_wins_over_a_longer_prefix() {
    let t = table(&[route(
        "r",
        T0,
        vec![
            rule(vec![prefix("/foo/bar/baz")]),
            rule(vec![exact("/foo/bar/baz")]),
        ],
    )]);
    assert_eq!(pick(&t, &req("/foo/bar/baz")), Some((0, 1)));
    assert_eq!(pick(&t, &req("/foo/bar/baz/x")), Some((0, 0)));
}

#[test]
fn longer_prefix_wins_over_a_shorter_one_listed_first() {
    let t = table(&[route(
        "r",
        T0,
        vec![
            rule(vec![prefix("/")]),
            rule(vec![prefix("/api")]),
            rule(vec![prefix("/api/v1")]),
        ],
    )]);
    assert_eq!(pick(&t, &req("/api/v1/users")), Some((0, 2)));
    assert_eq!(pick(&t, &req("/api/v2")), Some((0, 1)));
    assert_eq!(pick(&t, &req("/other")), Some((0, 0)));
}

#[test]
fn a_prefix_matches_whole_path_elements_only() {
    let t = table(&[route("r", T0, vec![rule(vec![prefix("/foo")])])]);
    assert_eq!(pick(&t, &req("/foo")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/foo/")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/foo/bar")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/foobar")), None);
    assert_eq!(pick(&t, &req("/fo")), None);
}

#[test]
fn a_trailing_slash_of_a_prefix_is_ignored() {
    let t = table(&[route("r", T0, vec![rule(vec![prefix("/foo/")])])]);
    assert_eq!(pick(&t, &req("/foo")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/foo/bar")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/foobar")), None);
}

#[test]
fn the_prefix_slash_matches_every_path() {
    let t = table(&[route("r", T0, vec![rule(vec![prefix("/")])])]);
    for path in ["/", "/a", "/a/b/", "//x"] {
        assert_eq!(pick(&t, &req(path)), Some((0, 0)), "{path}");
    }
}

#[test]
fn a_rule_without_matches_is_one_prefix_slash_match() {
    let t = table(&[route("r", T0, vec![rule(vec![])])]);
    let request = req("/anything");
    let selected = t.select(&request.view());
    let selected = selected.as_ref();
    assert_eq!(selected.map(|s| s.matched), Some(MatchedPath::Prefix("/")));
    assert_eq!(selected.and_then(|s| s.match_index), None);
    assert_eq!(selected.and_then(Selected::matched_prefix), Some("/"));
}

#[test]
fn a_regex_path_ranks_after_every_prefix_even_slash() {
    let t = table(&[route(
        "r",
        T0,
        vec![rule(vec![regex("/items/[0-9]+")]), rule(vec![prefix("/")])],
    )]);
    assert_eq!(pick(&t, &req("/items/42")), Some((0, 1)));
    let t = table(&[route(
        "r",
        T0,
        vec![
            rule(vec![regex("/items/[0-9]+")]),
            rule(vec![prefix("/other")]),
        ],
    )]);
    assert_eq!(pick(&t, &req("/items/42")), Some((0, 0)));
}

#[test]
fn a_regex_path_must_match_the_whole_path() {
    let t = table(&[route("r", T0, vec![rule(vec![regex("/items/[0-9]+")])])]);
    assert_eq!(pick(&t, &req("/items/42")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/items/42/x")), None);
    assert_eq!(pick(&t, &req("/x/items/42")), None);
    let selected = t.select(&req("/items/7").view()).map(|s| s.matched);
    assert_eq!(selected, Some(MatchedPath::Regex("/items/[0-9]+")));
}

#[test]
fn a_method_match_wins_over_no_method_on_the_same_path() {
    let t = table(&[route(
        "r",
        T0,
        vec![
            rule(vec![prefix("/a")]),
            rule(vec![with_method(prefix("/a"), "POST")]),
        ],
    )]);
    assert_eq!(pick(&t, &req("/a").method("POST")), Some((0, 1)));
    assert_eq!(pick(&t, &req("/a").method("GET")), Some((0, 0)));
}

#[test]
fn a_method_is_compared_exactly() {
    let t = table(&[route(
        "r",
        T0,
        vec![rule(vec![with_method(prefix("/"), "POST")])],
    )]);
    assert_eq!(pick(&t, &req("/").method("post")), None);
    assert_eq!(pick(&t, &req("/").method("POST")), Some((0, 0)));
}

#[test]
fn a_longer_prefix_wins_over_a_method_match() {
    let t = table(&[route(
        "r",
        T0,
        vec![
            rule(vec![with_method(prefix("/a"), "GET")]),
            rule(vec![prefix("/a/b")]),
        ],
    )]);
    assert_eq!(pick(&t, &req("/a/b")), Some((0, 1)));
}

#[test]
fn more_header_matches_win_on_the_same_path_and_method() {
    let t = table(&[route(
        "r",
        T0,
        vec![
            rule(vec![with_headers(prefix("/"), &[("a", "1")])]),
            rule(vec![with_headers(prefix("/"), &[("a", "1"), ("b", "2")])]),
        ],
    )]);
    assert_eq!(
        pick(&t, &req("/").header("a", "1").header("b", "2")),
        Some((0, 1))
    );
    assert_eq!(pick(&t, &req("/").header("a", "1")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/").header("b", "2")), None);
}

#[test]
fn a_method_match_wins_over_more_header_matches() {
    let t = table(&[route(
        "r",
        T0,
        vec![
            rule(vec![with_headers(prefix("/"), &[("a", "1"), ("b", "2")])]),
            rule(vec![with_method(prefix("/"), "GET")]),
        ],
    )]);
    assert_eq!(
        pick(&t, &req("/").header("a", "1").header("b", "2")),
        Some((0, 1))
    );
}

#[test]
fn header_names_compare_case_insensitively_and_values_exactly() {
    let t = table(&[route(
        "r",
        T0,
        vec![rule(vec![with_headers(
            prefix("/"),
            &[("X-Version", "Two")],
        )])],
    )]);
    assert_eq!(pick(&t, &req("/").header("x-version", "Two")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/").header("X-VERSION", "Two")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/").header("x-version", "two")), None);
}

#[test]
fn a_header_regex_must_match_the_whole_value() {
    let mut m = prefix("/");
    m.headers = vec![value("version", ValueMatchKind::Regex, "v[0-9]")];
    let t = table(&[route("r", T0, vec![rule(vec![m])])]);
    assert_eq!(pick(&t, &req("/").header("version", "v2")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/").header("version", "v22")), None);
    assert_eq!(pick(&t, &req("/").header("version", "xv2")), None);
}

#[test]
fn a_repeated_header_matches_one_of_its_values_or_all_joined_by_commas() {
    let t = table(&[route(
        "r",
        T0,
        vec![
            rule(vec![with_headers(prefix("/one"), &[("a", "2")])]),
            rule(vec![with_headers(prefix("/joined"), &[("a", "1,2")])]),
        ],
    )]);
    assert_eq!(
        pick(&t, &req("/one").header("a", "1").header("a", "2")),
        Some((0, 0))
    );
    assert_eq!(
        pick(&t, &req("/joined").header("a", "1").header("a", "2")),
        Some((0, 1))
    );
}

#[test]
fn a_header_value_that_is_not_utf8_is_read_with_each_bad_byte_as_u_fffd() {
    let t = table(&[route(
        "r",
        T0,
        vec![
            rule(vec![with_headers(
                prefix("/exact"),
                &[("x-name", "caf\u{fffd}")],
            )]),
            rule(vec![with_headers(prefix("/ascii"), &[("x-name", "caf")])]),
        ],
    )]);
    let latin1 = |path| req(path).raw_header("x-name", b"caf\xe9");
    assert_eq!(pick(&t, &latin1("/exact")), Some((0, 0)));
    assert_eq!(pick(&t, &latin1("/ascii")), None);
    // A repeated name's values are joined as read: `caf\u{fffd},x`.
    let m = with_headers(prefix("/"), &[("x-name", "caf\u{fffd},x")]);
    let t = table(&[route("r", T0, vec![rule(vec![m])])]);
    assert_eq!(
        pick(
            &t,
            &req("/")
                .raw_header("x-name", b"caf\xe9")
                .header("x-name", "x")
        ),
        Some((0, 0))
    );
}

#[test]
fn only_the_first_match_entry_of_a_header_name_counts() {
    let m = with_headers(prefix("/"), &[("a", "1"), ("A", "2")]);
    let t = table(&[route("r", T0, vec![rule(vec![m])])]);
    assert_eq!(pick(&t, &req("/").header("a", "1")), Some((0, 0)));
}

#[test]
fn a_query_param_matches_its_exact_value_and_case_sensitive_name() {
    let t = table(&[route(
        "r",
        T0,
        vec![rule(vec![with_query(prefix("/"), &[("animal", "whale")])])],
    )]);
    assert_eq!(pick(&t, &req("/?animal=whale")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/?color=blue&animal=whale")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/?Animal=whale")), None);
    assert_eq!(pick(&t, &req("/?animal=Whale")), None);
    assert_eq!(pick(&t, &req("/")), None);
}

#[test]
fn more_query_param_matches_win() {
    // The shape of the conformance test HTTPRouteQueryParamMatching.
    let t = table(&[route(
        "r",
        T0,
        vec![
            rule(vec![with_query(prefix("/"), &[("animal", "whale")])]),
            rule(vec![with_query(prefix("/"), &[("animal", "dolphin")])]),
            rule(vec![with_query(
                prefix("/"),
                &[("animal", "dolphin"), ("color", "blue")],
            )]),
        ],
    )]);
    assert_eq!(pick(&t, &req("/?animal=whale")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/?animal=dolphin")), Some((0, 1)));
    assert_eq!(pick(&t, &req("/?animal=dolphin&color=blue")), Some((0, 2)));
    assert_eq!(pick(&t, &req("/?color=blue&animal=dolphin")), Some((0, 2)));
    assert_eq!(pick(&t, &req("/?animal=bird")), None);
}

#[test]
fn header_matches_outrank_query_param_matches() {
    let t = table(&[route(
        "r",
        T0,
        vec![
            rule(vec![with_query(prefix("/"), &[("q", "1"), ("r", "2")])]),
            rule(vec![with_headers(prefix("/"), &[("h", "1")])]),
        ],
    )]);
    assert_eq!(pick(&t, &req("/?q=1&r=2").header("h", "1")), Some((0, 1)));
}

#[test]
fn the_first_value_of_a_repeated_query_param_is_the_one_compared() {
    let t = table(&[route(
        "r",
        T0,
        vec![rule(vec![with_query(prefix("/"), &[("a", "1")])])],
    )]);
    assert_eq!(pick(&t, &req("/?a=1&a=2")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/?a=2&a=1")), None);
}

#[test]
fn query_names_and_values_are_compared_percent_decoded() {
    let t = table(&[route(
        "r",
        T0,
        vec![rule(vec![with_query(prefix("/"), &[("a b", "c/d")])])],
    )]);
    assert_eq!(pick(&t, &req("/?a%20b=c%2Fd")), Some((0, 0)));
    let t = table(&[route(
        "r",
        T0,
        vec![rule(vec![with_query(prefix("/"), &[("flag", "")])])],
    )]);
    assert_eq!(pick(&t, &req("/?flag")), Some((0, 0)));
}

#[test]
fn the_oldest_route_wins_a_tie() {
    let rules = || vec![rule(vec![prefix("/")])];
    let t = table(&[route("a-new", T1, rules()), route("z-old", T0, rules())]);
    assert_eq!(pick(&t, &req("/")), Some((1, 0)));
}

#[test]
fn creation_timestamps_compare_as_instants_not_as_text() {
    let rules = || vec![rule(vec![prefix("/")])];
    // 01:00+02:00 is 23:00Z the day before: older than 2024-01-01T00:00:00Z.
    let t = table(&[
        route("a", T0, rules()),
        route("b", "2024-01-01T01:00:00+02:00", rules()),
    ]);
    assert_eq!(pick(&t, &req("/")), Some((1, 0)));
    let t = table(&[
        route("a", "2024-01-01T00:00:00.5Z", rules()),
        route("b", "2024-01-01T00:00:00.25Z", rules()),
    ]);
    assert_eq!(pick(&t, &req("/")), Some((1, 0)));
}

#[test]
fn routes_created_at_the_same_time_go_in_namespace_then_name_order() {
    let rules = || vec![rule(vec![prefix("/")])];
    let mut first = route("zeta", T0, rules());
    first.namespace = "a";
    first.parent = "a";
    let mut second = route("alpha", T0, rules());
    second.namespace = "b";
    second.parent = "b";
    let t = table(&[second, first]);
    assert_eq!(pick(&t, &req("/").caller("other")), Some((1, 0)));
    let t = table(&[route("b", T0, rules()), route("a", T0, rules())]);
    assert_eq!(pick(&t, &req("/")), Some((1, 0)));
}

#[test]
fn a_route_without_creation_timestamp_ranks_after_dated_routes() {
    let rules = || vec![rule(vec![prefix("/")])];
    let mut undated = route("a", T0, rules());
    undated.created = None;
    let t = table(&[undated, route("b", T1, rules())]);
    assert_eq!(pick(&t, &req("/")), Some((1, 0)));
}

#[test]
fn specificity_beats_route_age() {
    let t = table(&[
        route("old", T0, vec![rule(vec![prefix("/")])]),
        route("new", T1, vec![rule(vec![prefix("/v2")])]),
    ]);
    assert_eq!(pick(&t, &req("/v2/x")), Some((1, 0)));
    assert_eq!(pick(&t, &req("/v1")), Some((0, 0)));
}

#[test]
fn within_a_route_the_first_rule_then_the_first_match_wins() {
    let t = table(&[route(
        "r",
        T0,
        vec![
            rule(vec![prefix("/b"), prefix("/a")]),
            rule(vec![prefix("/a")]),
        ],
    )]);
    let request = req("/a");
    let selected = t.select(&request.view());
    assert_eq!(
        selected.map(|s| (s.route, s.rule, s.match_index)),
        Some((0, 0, Some(1)))
    );
}

#[test]
fn the_selected_rule_reports_its_name() {
    let t = table(&[route(
        "r",
        T0,
        vec![
            named("v1-rule", vec![prefix("/v1")]),
            rule(vec![prefix("/v2")]),
        ],
    )]);
    assert_eq!(
        t.select(&req("/v1").view()).and_then(|s| s.rule_name),
        Some("v1-rule")
    );
    assert_eq!(t.select(&req("/v2").view()).and_then(|s| s.rule_name), None);
}

#[test]
fn the_mesh_matching_conformance_story_holds() {
    // MeshHTTPRouteMatching: rule 0 `/` to v1; rule 1 `/v2` or header version=two to v2.
    let t = table(&[route(
        "mesh-matching",
        T0,
        vec![
            rule(vec![prefix("/")]),
            rule(vec![
                prefix("/v2"),
                with_headers(prefix("/"), &[("version", "two")]),
            ]),
        ],
    )]);
    assert_eq!(pick(&t, &req("/")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/example")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/v2")), Some((0, 1)));
    assert_eq!(pick(&t, &req("/v2/example")), Some((0, 1)));
    assert_eq!(pick(&t, &req("/").header("version", "two")), Some((0, 1)));
    assert_eq!(pick(&t, &req("/v2example")), Some((0, 0)));
}

#[test]
fn a_consumer_route_applies_only_to_callers_in_its_namespace() {
    // MeshConsumerRoute: a route in the caller's namespace, parented to a Service elsewhere.
    let consumer = Route {
        namespace: "consumer",
        name: "c",
        created: Some(T1),
        parent: "producer",
        rules: vec![named("consumer-rule", vec![])],
    };
    let producer = Route {
        namespace: "producer",
        name: "p",
        created: Some(T0),
        parent: "producer",
        rules: vec![rule(vec![])],
    };
    let t = table(&[consumer, producer]);
    assert_eq!(pick(&t, &req("/").caller("consumer")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/").caller("producer")), Some((1, 0)));
    assert_eq!(pick(&t, &req("/").caller("elsewhere")), Some((1, 0)));
    let unknown = Req {
        caller: None,
        ..req("/")
    };
    assert_eq!(pick(&t, &unknown), Some((1, 0)));
}

#[test]
fn consumer_routes_replace_the_producer_routes_for_their_namespace() {
    let consumer = Route {
        namespace: "consumer",
        name: "c",
        created: Some(T0),
        parent: "producer",
        rules: vec![rule(vec![prefix("/c")])],
    };
    let producer = Route {
        namespace: "producer",
        name: "p",
        created: Some(T0),
        parent: "producer",
        rules: vec![rule(vec![exact("/p")])],
    };
    let t = table(&[consumer, producer]);
    assert_eq!(pick(&t, &req("/p").caller("consumer")), None);
    assert_eq!(pick(&t, &req("/c").caller("producer")), None);
    assert_eq!(
        t.routes().iter().map(|r| r.consumer).collect::<Vec<_>>(),
        vec![true, false]
    );
}

#[test]
fn no_matching_rule_selects_nothing() {
    let t = table(&[route("r", T0, vec![rule(vec![exact("/only")])])]);
    assert_eq!(pick(&t, &req("/other")), None);
    assert!(!t.is_empty());
    assert!(RouteTable::default().is_empty());
}

#[test]
fn an_invalid_regex_is_reported_and_only_its_match_is_unused() {
    let (t, problems) = build(&[route(
        "r",
        T0,
        vec![rule(vec![regex("/(unclosed"), prefix("/ok")])],
    )]);
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].rule, Some(0));
    assert_eq!(problems[0].kind.code(), "route-invalid-regex");
    assert!(
        matches!(&problems[0].kind, RouteProblemKind::InvalidRegex { match_index: 0, pattern, .. } if pattern == "/(unclosed")
    );
    assert_eq!(pick(&t, &req("/ok")), Some((0, 0)));
    assert_eq!(pick(&t, &req("/(unclosed")), None);
}

#[test]
fn an_invalid_header_regex_makes_its_match_unused() {
    let mut m = prefix("/");
    m.headers = vec![value("a", ValueMatchKind::Regex, "[")];
    let (t, problems) = build(&[route("r", T0, vec![rule(vec![m])])]);
    assert_eq!(problems.len(), 1);
    assert_eq!(pick(&t, &req("/").header("a", "[")), None);
}

#[test]
fn a_path_without_a_leading_slash_is_reported_and_unused() {
    let (t, problems) = build(&[route("r", T0, vec![rule(vec![prefix("foo")])])]);
    assert_eq!(problems.len(), 1);
    assert_eq!(
        problems[0].kind,
        RouteProblemKind::InvalidPath {
            match_index: 0,
            value: "foo".to_owned()
        }
    );
    assert_eq!(pick(&t, &req("/foo")), None);
    assert_eq!(
        problems[0].to_string(),
        "route ns/r rule 0: match 0: path \"foo\" does not start with '/', the match is unused"
    );
}

#[test]
fn an_unreadable_creation_timestamp_is_reported_and_ranks_last() {
    let rules = || vec![rule(vec![prefix("/")])];
    let (t, problems) = build(&[route("a", "yesterday", rules()), route("b", T1, rules())]);
    assert_eq!(problems.len(), 1);
    assert_eq!(
        problems[0].kind,
        RouteProblemKind::InvalidCreationTimestamp {
            value: "yesterday".to_owned()
        }
    );
    assert_eq!(pick(&t, &req("/")), Some((1, 0)));
}

#[test]
fn a_rule_whose_filters_cannot_run_is_reported_but_still_matches() {
    let mut r = rule(vec![prefix("/")]);
    r.filters = vec![
        HttpFilter::RequestRedirect(Redirect::default()),
        HttpFilter::UrlRewrite(UrlRewrite::default()),
    ];
    let (t, problems) = build(&[route("r", T0, vec![r])]);
    assert_eq!(problems.len(), 1);
    assert_eq!(
        problems[0].kind,
        RouteProblemKind::RuleNotServed(RuleFault::RedirectWithRewrite)
    );
    assert_eq!(pick(&t, &req("/")), Some((0, 0)));
}

#[test]
fn tables_built_from_equal_inputs_are_equal() {
    let make = || {
        vec![route(
            "r",
            T0,
            vec![
                rule(vec![
                    regex("/a.*"),
                    with_headers(prefix("/b"), &[("x", "1")]),
                ]),
                rule(vec![exact("/c")]),
            ],
        )]
    };
    assert_eq!(table(&make()), table(&make()));
    let other = vec![route("r", T0, vec![rule(vec![regex("/b.*")])])];
    assert_ne!(table(&make()), table(&other));
    assert!(format!("{:?}", table(&make())).contains("FullRegex(\"/a.*\")"));
}

#[test]
fn rfc3339_timestamps_parse_to_instants() {
    assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some((0, 0)));
    assert_eq!(
        parse_rfc3339("2024-01-01T00:00:00Z"),
        Some((1_704_067_200, 0))
    );
    assert_eq!(
        parse_rfc3339("2024-01-01T02:00:00+02:00"),
        Some((1_704_067_200, 0))
    );
    assert_eq!(
        parse_rfc3339("2024-01-01T00:00:00.123Z"),
        Some((1_704_067_200, 123_000_000))
    );
    assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z"), Some((-1, 0)));
    assert_eq!(parse_rfc3339("2024-13-01T00:00:00Z"), None);
    assert_eq!(parse_rfc3339("2024-01-01T00:00:00"), None);
    assert_eq!(parse_rfc3339("2024-01-01T00:00:00.Z"), None);
    assert_eq!(parse_rfc3339(""), None);
}

proptest! {
    #[test]
    fn select_never_panics_on_arbitrary_requests(
        path in ".{0,40}",
        query in proptest::option::of(".{0,40}"),
        method in "[A-Za-z]{0,8}",
        headers in proptest::collection::vec(
            ("[a-zA-Z-]{0,10}", proptest::collection::vec(any::<u8>(), 0..20)),
            0..6,
        ),
        caller in proptest::option::of("[a-z]{0,6}"),
    ) {
        let mut header_match = prefix("/");
        header_match.headers = vec![value("a", ValueMatchKind::Regex, "[0-9]+")];
        header_match.query_params = vec![value("q", ValueMatchKind::Exact, "1")];
        let t = table(&[
            route("r", T0, vec![
                rule(vec![exact("/a"), prefix("/b/"), regex("/c/.*"), with_method(prefix("/"), "POST")]),
                rule(vec![header_match]),
                rule(vec![]),
            ]),
            Route { namespace: "c", name: "c", created: None, parent: "ns", rules: vec![rule(vec![prefix("/x")])] },
        ]);
        // What a header map can hold of them: any bytes but control characters, UTF-8 or not.
        let mut map = HeaderMap::new();
        for (name, value) in &headers {
            if let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(name.as_bytes()),
                http::HeaderValue::from_bytes(value),
            ) {
                map.append(n, v);
            }
        }
        let view = RequestView {
            method: &method,
            path: &path,
            query: query.as_deref(),
            headers: &map,
            caller_namespace: caller.as_deref(),
        };
        let selected = t.select(&view);
        if caller.as_deref() != Some("c") {
            // The producer route ends with a rule that matches everything.
            prop_assert!(selected.is_some());
        }
    }

    #[test]
    fn build_never_panics_on_arbitrary_patterns(pattern in ".{0,20}", path in ".{0,20}") {
        let mut m = regex(&pattern);
        m.headers = vec![value("h", ValueMatchKind::Regex, &pattern)];
        let routes = [Route {
            namespace: "ns",
            name: "r",
            created: Some("2024-01-01T00:00:00Z"),
            parent: "ns",
            rules: vec![rule(vec![m, prefix(&path), exact(&path)])],
        }];
        let (t, _problems) = build(&routes);
        let request = Req { method: "GET", target: "/", headers: HeaderMap::new(), caller: None };
        let _ = t.select(&request.view());
    }

    #[test]
    fn rfc3339_parsing_never_panics(text in ".{0,40}") {
        let _ = parse_rfc3339(&text);
    }
}
