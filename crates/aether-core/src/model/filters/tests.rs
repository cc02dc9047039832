//! Filter behaviour as the Gateway API spec and its conformance tests state it.

use proptest::prelude::*;

use super::*;
use crate::model::snapshot::{HttpBackendRef, HttpMatch};

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

/// A header map with these fields, in this order.
fn map(list: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in list {
        h.append(
            HeaderName::from_bytes(n.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

/// The fields of a header map by name (lower case), each name's values in their order: what
/// a modifier keeps (the order of different names carries no meaning, RFC 9110 §5.3).
fn fields(h: &HeaderMap) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = h
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap().to_owned()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// [`fields`] of the expected list.
fn headers(list: &[(&str, &str)]) -> Vec<(String, String)> {
    fields(&map(list))
}

fn modifier(set: &[(&str, &str)], add: &[(&str, &str)], remove: &[&str]) -> HeaderModifier {
    HeaderModifier {
        set: pairs(set),
        add: pairs(add),
        remove: remove.iter().map(|n| (*n).to_owned()).collect(),
    }
}

// ---- header modifiers -------------------------------------------------------------------

#[test]
fn set_replaces_every_value_of_the_name_case_insensitively() {
    let mut h = map(&[("x-header-set", "a"), ("other", "o"), ("X-Header-Set", "b")]);
    apply_header_modifier(
        &modifier(&[("X-Header-Set", "set-overwrites-values")], &[], &[]),
        &mut h,
    );
    assert_eq!(
        fields(&h),
        headers(&[("x-header-set", "set-overwrites-values"), ("other", "o")])
    );
}

#[test]
fn set_adds_an_absent_header() {
    let mut h = map(&[("some-other-header", "val")]);
    apply_header_modifier(&modifier(&[("X-Header-Set", "v")], &[], &[]), &mut h);
    assert_eq!(
        fields(&h),
        headers(&[("some-other-header", "val"), ("x-header-set", "v")])
    );
}

#[test]
fn add_appends_a_value_after_existing_ones() {
    let mut h = map(&[("x-header-add", "some-other-value")]);
    apply_header_modifier(
        &modifier(&[], &[("X-Header-Add", "add-appends-values")], &[]),
        &mut h,
    );
    assert_eq!(
        fields(&h),
        headers(&[
            ("x-header-add", "some-other-value"),
            ("x-header-add", "add-appends-values")
        ])
    );
}

#[test]
fn remove_drops_every_value_of_the_name_case_insensitively() {
    let mut h = map(&[
        ("x-header-remove", "1"),
        ("keep", "k"),
        ("X-HEADER-REMOVE", "2"),
    ]);
    apply_header_modifier(&modifier(&[], &[], &["X-Header-Remove"]), &mut h);
    assert_eq!(fields(&h), headers(&[("keep", "k")]));
}

#[test]
fn the_conformance_multiple_modifier_case_gives_the_expected_headers() {
    // MeshHTTPRouteRequestHeaderModifier, path /multiple.
    let m = modifier(
        &[
            ("X-Header-Set-1", "header-set-1"),
            ("X-Header-Set-2", "header-set-2"),
        ],
        &[
            ("X-Header-Add-1", "header-add-1"),
            ("X-Header-Add-2", "header-add-2"),
            ("X-Header-Add-3", "header-add-3"),
        ],
        &["X-Header-Remove-1", "X-Header-Remove-2"],
    );
    let mut h = map(&[
        ("x-header-set-2", "set-val-2"),
        ("x-header-add-2", "add-val-2"),
        ("x-header-remove-2", "remove-val-2"),
        ("another-header", "another-header-val"),
    ]);
    apply_header_modifier(&m, &mut h);
    assert_eq!(
        fields(&h),
        headers(&[
            ("x-header-set-2", "header-set-2"),
            ("x-header-add-2", "add-val-2"),
            ("another-header", "another-header-val"),
            ("x-header-set-1", "header-set-1"),
            ("x-header-add-1", "header-add-1"),
            ("x-header-add-2", "header-add-2"),
            ("x-header-add-3", "header-add-3"),
        ])
    );
}

#[test]
fn remove_wins_over_set_and_add_of_the_same_name() {
    let mut h = HeaderMap::new();
    apply_header_modifier(&modifier(&[("a", "1")], &[("a", "2")], &["A"]), &mut h);
    assert!(h.is_empty());
}

#[test]
fn a_modifier_keeps_the_bytes_of_values_it_does_not_touch_and_skips_what_is_not_a_field() {
    let mut h = HeaderMap::new();
    h.append("x-raw", HeaderValue::from_bytes(b"caf\xe9").unwrap());
    h.append("x-old", HeaderValue::from_static("1"));
    apply_header_modifier(
        &modifier(
            &[("x-old", "bad\nvalue"), ("bad name", "v")],
            &[("x-new", "n"), ("x-new", "bad\rvalue")],
            &[],
        ),
        &mut h,
    );
    assert_eq!(h.get("x-raw").unwrap().as_bytes(), b"caf\xe9");
    // A `set` whose text is no field value leaves the name without one; an invalid `add` adds
    // nothing; an invalid name is no header.
    assert!(h.get("x-old").is_none());
    assert_eq!(h.get_all("x-new").iter().count(), 1);
    assert_eq!(h.len(), 2);
}

#[test]
fn header_modifiers_never_touch_mesh_headers() {
    let mut h = map(&[("x-aether-error", "route-not-matched")]);
    apply_header_modifier(
        &modifier(
            &[("X-Aether-Error", "forged")],
            &[("x-aether-caller", "ns")],
            &["x-aether-error"],
        ),
        &mut h,
    );
    assert_eq!(
        fields(&h),
        headers(&[("x-aether-error", "route-not-matched")])
    );
    assert!(is_mesh_header("X-AETHER-anything"));
    assert!(!is_mesh_header("x-aether"));
}

// ---- redirects ----------------------------------------------------------------------------

fn input<'a>(authority: &'a str, path: &'a str) -> RedirectInput<'a> {
    RedirectInput {
        scheme: "http",
        authority,
        listener_port: 80,
        path,
        query: None,
        matched_prefix: None,
    }
}

fn location(filter: &Redirect, req: RedirectInput<'_>) -> (u16, String) {
    let answer = redirect(filter, req);
    (answer.status, answer.location)
}

#[test]
fn a_scheme_redirect_to_https_implies_port_443_and_omits_it() {
    let filter = Redirect {
        scheme: Some("https".to_owned()),
        ..Redirect::default()
    };
    assert_eq!(
        location(&filter, input("echo", "/scheme")),
        (302, "https://echo/scheme".to_owned())
    );
    // The request's own port is not carried over when the scheme changes.
    let req = RedirectInput {
        listener_port: 8080,
        ..input("echo:8080", "/scheme")
    };
    assert_eq!(location(&filter, req).1, "https://echo/scheme");
}

#[test]
fn a_scheme_redirect_with_host_and_status_uses_all_three() {
    let filter = Redirect {
        scheme: Some("https".to_owned()),
        hostname: Some("example.org".to_owned()),
        status: Some(301),
        ..Redirect::default()
    };
    assert_eq!(
        location(&filter, input("echo", "/scheme-and-host")),
        (301, "https://example.org/scheme-and-host".to_owned())
    );
}

#[test]
fn a_port_redirect_writes_the_port() {
    let filter = Redirect {
        port: Some(8083),
        ..Redirect::default()
    };
    assert_eq!(
        location(&filter, input("echo", "/port")),
        (302, "http://echo:8083/port".to_owned())
    );
    let filter = Redirect {
        port: Some(8083),
        hostname: Some("example.org".to_owned()),
        ..Redirect::default()
    };
    assert_eq!(
        location(&filter, input("echo", "/port-and-host")).1,
        "http://example.org:8083/port-and-host"
    );
}

#[test]
fn an_explicit_well_known_port_is_omitted_and_a_mismatched_one_is_written() {
    let filter = Redirect {
        port: Some(80),
        ..Redirect::default()
    };
    assert_eq!(location(&filter, input("echo:8080", "/")).1, "http://echo/");
    let filter = Redirect {
        scheme: Some("https".to_owned()),
        port: Some(80),
        ..Redirect::default()
    };
    assert_eq!(location(&filter, input("echo", "/")).1, "https://echo:80/");
}

#[test]
fn without_scheme_or_port_the_listener_port_is_used() {
    let filter = Redirect {
        hostname: Some("example.org".to_owned()),
        ..Redirect::default()
    };
    assert_eq!(
        location(&filter, input("echo", "/a")).1,
        "http://example.org/a"
    );
    let req = RedirectInput {
        listener_port: 8080,
        ..input("echo", "/a")
    };
    assert_eq!(location(&filter, req).1, "http://example.org:8080/a");
    let req = RedirectInput {
        listener_port: 8080,
        ..input("echo:8080", "/a")
    };
    assert_eq!(location(&Redirect::default(), req).1, "http://echo:8080/a");
}

#[test]
fn a_scheme_redirect_to_http_implies_port_80() {
    let filter = Redirect {
        scheme: Some("http".to_owned()),
        ..Redirect::default()
    };
    let req = RedirectInput {
        scheme: "https",
        listener_port: 443,
        ..input("echo", "/x")
    };
    assert_eq!(location(&filter, req).1, "http://echo/x");
}

#[test]
fn the_redirect_keeps_the_host_as_received_and_ipv6_brackets() {
    let req = RedirectInput {
        listener_port: 8080,
        ..input("[fd00::1]:8080", "/p")
    };
    assert_eq!(
        location(&Redirect::default(), req).1,
        "http://[fd00::1]:8080/p"
    );
    assert_eq!(
        location(&Redirect::default(), input("Echo.NS", "/p")).1,
        "http://Echo.NS/p"
    );
}

#[test]
fn every_supported_redirect_status_is_used_as_given() {
    for status in [301, 302, 303, 307, 308] {
        let filter = Redirect {
            status: Some(status),
            ..Redirect::default()
        };
        assert_eq!(redirect(&filter, input("echo", "/")).status, status);
    }
}

#[test]
fn the_query_string_is_kept_on_a_redirect() {
    let filter = Redirect {
        hostname: Some("example.org".to_owned()),
        ..Redirect::default()
    };
    let req = RedirectInput {
        query: Some("a=1&b=2"),
        ..input("echo", "/q")
    };
    assert_eq!(location(&filter, req).1, "http://example.org/q?a=1&b=2");
}

#[test]
fn a_prefix_redirect_replaces_only_the_matched_prefix() {
    // MeshHTTPRouteRedirectPath.
    let filter = Redirect {
        path: Some(PathModifier::ReplacePrefixMatch(
            "/replacement-prefix".to_owned(),
        )),
        ..Redirect::default()
    };
    let req = RedirectInput {
        matched_prefix: Some("/original-prefix"),
        ..input("echo", "/original-prefix/lemon")
    };
    assert_eq!(
        location(&filter, req).1,
        "http://echo/replacement-prefix/lemon"
    );
    let req = RedirectInput {
        matched_prefix: Some("/path-and-host"),
        ..input("echo", "/path-and-host")
    };
    assert_eq!(location(&filter, req).1, "http://echo/replacement-prefix");
}

#[test]
fn a_full_path_redirect_replaces_the_whole_path() {
    let filter = Redirect {
        path: Some(PathModifier::ReplaceFullPath(
            "/full-path-replacement".to_owned(),
        )),
        ..Redirect::default()
    };
    let req = RedirectInput {
        matched_prefix: Some("/full"),
        ..input("echo", "/full/path/original")
    };
    assert_eq!(
        location(&filter, req).1,
        "http://echo/full-path-replacement"
    );
}

// ---- ReplacePrefixMatch and rewrites -------------------------------------------------------

#[test]
fn replace_prefix_follows_the_gateway_api_table() {
    let table = [
        ("/foo/bar", "/foo", "/xyz", "/xyz/bar"),
        ("/foo/bar", "/foo", "/xyz/", "/xyz/bar"),
        ("/foo/bar", "/foo/", "/xyz", "/xyz/bar"),
        ("/foo/bar", "/foo/", "/xyz/", "/xyz/bar"),
        ("/foo", "/foo", "/xyz", "/xyz"),
        ("/foo/", "/foo", "/xyz", "/xyz/"),
        ("/foo/bar", "/foo", "", "/bar"),
        ("/foo/", "/foo", "", "/"),
        ("/foo", "/foo", "", "/"),
        ("/foo/", "/foo", "/", "/"),
        ("/foo", "/foo", "/", "/"),
    ];
    for (path, prefix, replacement, expected) in table {
        assert_eq!(
            replace_prefix(path, prefix, replacement),
            expected,
            "{path} {prefix} {replacement:?}"
        );
    }
}

#[test]
fn replace_prefix_of_slash_puts_the_replacement_in_front() {
    assert_eq!(replace_prefix("/bar", "/", "/xyz"), "/xyz/bar");
    assert_eq!(replace_prefix("/bar", "/", ""), "/bar");
}

#[test]
fn replace_prefix_leaves_a_path_it_does_not_match() {
    assert_eq!(replace_prefix("/foobar", "/foo", "/xyz"), "/foobar");
}

#[test]
fn the_conformance_rewrite_path_cases_give_the_expected_paths() {
    // MeshHTTPRouteRewritePath.
    let prefix = |replacement: &str| UrlRewrite {
        hostname: None,
        path: Some(PathModifier::ReplacePrefixMatch(replacement.to_owned())),
    };
    let full = |replacement: &str| UrlRewrite {
        hostname: None,
        path: Some(PathModifier::ReplaceFullPath(replacement.to_owned())),
    };
    assert_eq!(
        rewrite(&prefix("/one"), "/prefix/one/two", Some("/prefix/one")).1,
        "/one/two"
    );
    assert_eq!(
        rewrite(&prefix(""), "/strip-prefix/three", Some("/strip-prefix")).1,
        "/three"
    );
    assert_eq!(
        rewrite(&prefix(""), "/strip-prefix", Some("/strip-prefix")).1,
        "/"
    );
    assert_eq!(
        rewrite(&full("/one"), "/full/one/two", Some("/full/one")).1,
        "/one"
    );
    assert_eq!(
        rewrite(
            &full("/test"),
            "/full/rewrite-path-and-modify-headers/test",
            Some("/full/rewrite-path-and-modify-headers")
        )
        .1,
        "/test"
    );
    assert_eq!(
        rewrite(
            &prefix("/prefix"),
            "/prefix/rewrite-path-and-modify-headers/one",
            Some("/prefix/rewrite-path-and-modify-headers")
        )
        .1,
        "/prefix/one"
    );
}

#[test]
fn a_hostname_rewrite_replaces_the_whole_authority() {
    let filter = UrlRewrite {
        hostname: Some("elsewhere.example".to_owned()),
        path: None,
    };
    assert_eq!(
        rewrite(&filter, "/p", None),
        (Some("elsewhere.example".to_owned()), "/p".to_owned())
    );
    assert_eq!(
        rewrite(&UrlRewrite::default(), "/p", None),
        (None, "/p".to_owned())
    );
}

// ---- query mutations ---------------------------------------------------------------------

#[test]
fn query_set_replaces_the_first_value_and_drops_the_others() {
    let out = apply_query_mutations(
        &[QueryMutation::Set("a".into(), "9".into())],
        "/p?a=1&b=2&a=3",
    );
    assert_eq!(out, "/p?a=9&b=2");
}

#[test]
fn query_set_appends_an_absent_parameter_and_adds_the_question_mark() {
    assert_eq!(
        apply_query_mutations(&[QueryMutation::Set("a".into(), "1".into())], "/p"),
        "/p?a=1"
    );
}

#[test]
fn query_add_appends_and_remove_drops_every_value() {
    let out = apply_query_mutations(
        &[
            QueryMutation::Add("a".into(), "2".into()),
            QueryMutation::Remove("b".into()),
        ],
        "/p?b=1&a=1&b=2",
    );
    assert_eq!(out, "/p?a=1&a=2");
}

#[test]
fn query_mutations_run_in_declaration_order() {
    let set_then_remove = [
        QueryMutation::Set("a".into(), "1".into()),
        QueryMutation::Remove("a".into()),
    ];
    assert_eq!(apply_query_mutations(&set_then_remove, "/p?x=0"), "/p?x=0");
    let remove_then_set = [
        QueryMutation::Remove("a".into()),
        QueryMutation::Set("a".into(), "1".into()),
    ];
    assert_eq!(
        apply_query_mutations(&remove_then_set, "/p?x=0"),
        "/p?x=0&a=1"
    );
}

#[test]
fn a_query_left_empty_is_written_without_question_mark() {
    assert_eq!(
        apply_query_mutations(&[QueryMutation::Remove("a".into())], "/p?a=1"),
        "/p"
    );
}

#[test]
fn written_query_values_are_percent_encoded_and_untouched_pairs_keep_their_bytes() {
    let out = apply_query_mutations(
        &[QueryMutation::Set("k y".into(), "a&b=c".into())],
        "/p?x=%2F+y",
    );
    assert_eq!(out, "/p?x=%2F+y&k%20y=a%26b%3Dc");
    // A later mutation reads what the earlier one wrote.
    let out = apply_query_mutations(
        &[
            QueryMutation::Set("k y".into(), "1".into()),
            QueryMutation::Remove("k y".into()),
        ],
        "/p?k%20y=0",
    );
    assert_eq!(out, "/p");
}

#[test]
fn no_query_mutation_leaves_the_target_unchanged() {
    assert_eq!(apply_query_mutations(&[], "/p?a=1&&b"), "/p?a=1&&b");
}

// ---- weighted choice and mirrors ------------------------------------------------------------

#[test]
fn zero_weights_are_never_chosen_and_all_zero_chooses_nothing() {
    for entropy in 0..1000 {
        assert_eq!(pick_weighted(&[0, 3, 0], entropy), Some(1));
    }
    assert_eq!(pick_weighted(&[0, 0], 7), None);
    assert_eq!(pick_weighted(&[], 7), None);
}

#[test]
fn weights_split_a_sweep_of_entropy_exactly() {
    let mut counts = [0u32; 3];
    for entropy in 0..600 {
        if let Some(index) = pick_weighted(&[1, 2, 3], entropy) {
            counts[index] += 1;
        }
    }
    assert_eq!(counts, [100, 200, 300]);
}

#[test]
fn huge_weights_do_not_overflow() {
    assert_eq!(pick_weighted(&[u32::MAX, u32::MAX], u64::MAX), Some(1));
}

#[test]
fn a_mirror_fires_for_its_percentage_of_entropy_values() {
    assert_eq!((0..1000).filter(|&e| mirror_fires(25, e)).count(), 250);
    assert!((0..100).all(|e| mirror_fires(100, e)));
    assert!(!(0..100).any(|e| mirror_fires(0, e)));
}

proptest! {
    #[test]
    fn pick_weighted_is_proportional_over_a_deterministic_sweep(
        weights in proptest::collection::vec(0u32..50, 1..8),
        rounds in 1u64..4,
        offset in any::<u64>(),
    ) {
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        let mut counts = vec![0u64; weights.len()];
        // `total * rounds` consecutive entropy values starting anywhere (wrapping).
        for step in 0..total * rounds {
            match pick_weighted(&weights, offset.wrapping_add(step)) {
                Some(index) => counts[index] += 1,
                None => prop_assert!(false, "a positive total always picks"),
            }
        }
        if total > 0 {
            // Exactly proportional unless the sweep wraps around u64::MAX.
            if offset.checked_add(total * rounds).is_some() {
                let expected: Vec<u64> = weights.iter().map(|&w| u64::from(w) * rounds).collect();
                prop_assert_eq!(counts, expected);
            }
        } else {
            prop_assert_eq!(pick_weighted(&weights, offset), None);
        }
    }

    #[test]
    fn pick_weighted_never_picks_a_zero_weight(weights in proptest::collection::vec(0u32..4, 0..8), entropy in any::<u64>()) {
        if let Some(index) = pick_weighted(&weights, entropy) {
            prop_assert!(weights[index] > 0);
        } else {
            prop_assert!(weights.iter().all(|&w| w == 0));
        }
    }

    #[test]
    fn filter_functions_never_panic(
        path in ".{0,30}",
        authority in ".{0,20}",
        prefix in ".{0,10}",
        replacement in ".{0,10}",
        query in ".{0,30}",
        name in ".{0,5}",
    ) {
        let _ = replace_prefix(&path, &prefix, &replacement);
        let filter = Redirect { path: Some(PathModifier::ReplacePrefixMatch(replacement)), ..Redirect::default() };
        let req = RedirectInput { scheme: "http", authority: &authority, listener_port: 80, path: &path, query: Some(&query), matched_prefix: Some(&prefix) };
        let _ = redirect(&filter, req);
        let target = format!("{path}?{query}");
        let _ = apply_query_mutations(&[QueryMutation::Set(name.clone(), "v".into()), QueryMutation::Remove(name)], &target);
    }
}

// ---- rule checks and plans -----------------------------------------------------------------

fn rule(filters: Vec<HttpFilter>, backends: Vec<HttpBackendRef>) -> HttpRule {
    HttpRule {
        name: None,
        matches: vec![HttpMatch {
            path: Some(PathMatch::Prefix("/p".into())),
            ..HttpMatch::default()
        }],
        filters,
        backends,
        request_timeout_ms: None,
        backend_request_timeout_ms: None,
    }
}

fn service(name: &str) -> ObjectRef {
    ObjectRef {
        group: String::new(),
        kind: "Service".into(),
        namespace: None,
        name: name.into(),
    }
}

fn backend(name: &str, weight: u32, filters: Vec<HttpFilter>) -> HttpBackendRef {
    HttpBackendRef {
        target: service(name),
        port: Some(8080),
        weight,
        filters,
    }
}

#[test]
fn a_redirect_cannot_be_combined_with_a_rewrite() {
    let r = rule(
        vec![
            HttpFilter::RequestRedirect(Redirect::default()),
            HttpFilter::UrlRewrite(UrlRewrite::default()),
        ],
        vec![],
    );
    assert_eq!(check_rule(&r).faults, vec![RuleFault::RedirectWithRewrite]);
    assert_eq!(
        FilterPlan::for_rule(&r).answer,
        RuleAnswer::Invalid(RuleFault::RedirectWithRewrite)
    );
}

#[test]
fn a_core_filter_listed_twice_is_a_fault_but_mirrors_may_repeat() {
    let header = HttpFilter::RequestHeaderModifier(HeaderModifier::default());
    let mirror = HttpFilter::RequestMirror(Mirror {
        backend: service("m"),
        port: Some(80),
        percent: 100,
    });
    let r = rule(
        vec![header.clone(), header, mirror.clone(), mirror],
        vec![backend("b", 1, vec![])],
    );
    assert_eq!(
        check_rule(&r).faults,
        vec![RuleFault::DuplicateFilter("RequestHeaderModifier")]
    );
}

#[test]
fn unsupported_redirect_status_and_scheme_are_faults() {
    let r = rule(
        vec![HttpFilter::RequestRedirect(Redirect {
            scheme: Some("ftp".into()),
            status: Some(200),
            ..Redirect::default()
        })],
        vec![],
    );
    assert_eq!(
        check_rule(&r).faults,
        vec![
            RuleFault::UnsupportedRedirectStatus(200),
            RuleFault::UnsupportedRedirectScheme("ftp".into())
        ]
    );
}

#[test]
fn replace_prefix_match_needs_prefix_matches_only() {
    let mut r = rule(
        vec![HttpFilter::UrlRewrite(UrlRewrite {
            hostname: None,
            path: Some(PathModifier::ReplacePrefixMatch("/x".into())),
        })],
        vec![backend("b", 1, vec![])],
    );
    assert!(check_rule(&r).faults.is_empty());
    r.matches.push(HttpMatch {
        path: Some(PathMatch::Exact("/e".into())),
        ..HttpMatch::default()
    });
    assert_eq!(
        check_rule(&r).faults,
        vec![RuleFault::PrefixModifierWithoutPrefixMatch]
    );
}

#[test]
fn unsupported_filters_fail_the_rule_instead_of_being_skipped() {
    let r = rule(
        vec![HttpFilter::Unsupported("CORS".into())],
        vec![backend("b", 1, vec![])],
    );
    let plan = FilterPlan::for_rule(&r);
    assert_eq!(
        plan.answer,
        RuleAnswer::Invalid(RuleFault::UnsupportedFilter("CORS".into()))
    );
    let r = rule(
        vec![],
        vec![backend(
            "b",
            1,
            vec![HttpFilter::RequestRedirect(Redirect::default())],
        )],
    );
    assert_eq!(
        check_rule(&r).faults,
        vec![RuleFault::UnsupportedBackendFilter {
            backend: 0,
            filter: "RequestRedirect".into()
        }]
    );
}

#[test]
fn mesh_header_names_in_modifiers_are_reported() {
    let r = rule(
        vec![HttpFilter::ResponseHeaderModifier(modifier(
            &[("x-aether-error", "x")],
            &[],
            &["ok"],
        ))],
        vec![backend(
            "b",
            1,
            vec![HttpFilter::RequestHeaderModifier(modifier(
                &[],
                &[],
                &["X-Aether-Caller"],
            ))],
        )],
    );
    let check = check_rule(&r);
    assert!(check.faults.is_empty());
    assert_eq!(
        check.mesh_headers,
        vec!["x-aether-error".to_owned(), "X-Aether-Caller".to_owned()]
    );
}

#[test]
fn a_rule_without_backends_or_redirect_answers_invalid_backend() {
    let plan = FilterPlan::for_rule(&rule(
        vec![HttpFilter::RequestHeaderModifier(HeaderModifier::default())],
        vec![],
    ));
    assert_eq!(plan.answer, RuleAnswer::NoBackends);
}

#[test]
fn a_redirect_rule_answers_itself() {
    let filter = Redirect {
        port: Some(8083),
        ..Redirect::default()
    };
    let plan = FilterPlan::for_rule(&rule(
        vec![HttpFilter::RequestRedirect(filter.clone())],
        vec![],
    ));
    assert_eq!(plan.answer, RuleAnswer::Redirect(filter.clone()));
    assert_eq!(plan.request, vec![FilterStep::Redirect(filter)]);
}

#[test]
fn the_plan_keeps_rule_order_and_separates_phases_and_backends() {
    let ext = ObjectRef {
        group: "aether.io".into(),
        kind: "MeshFilter".into(),
        namespace: None,
        name: "authz".into(),
    };
    let r = rule(
        vec![
            HttpFilter::ExtensionRef(ext),
            HttpFilter::ResponseHeaderModifier(modifier(&[("x-r", "1")], &[], &[])),
            HttpFilter::RequestHeaderModifier(modifier(&[("x-a", "1")], &[("x-b", "2")], &["x-c"])),
            HttpFilter::RequestMirror(Mirror {
                backend: service("shadow"),
                port: Some(80),
                percent: 50,
            }),
            HttpFilter::UrlRewrite(UrlRewrite {
                hostname: Some("h".into()),
                path: None,
            }),
        ],
        vec![
            backend(
                "v1",
                3,
                vec![HttpFilter::RequestHeaderModifier(modifier(
                    &[("x-backend", "v1")],
                    &[],
                    &[],
                ))],
            ),
            backend(
                "v2",
                1,
                vec![HttpFilter::ResponseHeaderModifier(modifier(
                    &[],
                    &[],
                    &["server"],
                ))],
            ),
        ],
    );
    let plan = FilterPlan::for_rule(&r);
    assert_eq!(plan.answer, RuleAnswer::Forward);
    let request: Vec<String> = plan.request.iter().map(ToString::to_string).collect();
    assert_eq!(
        request,
        vec![
            "ExtensionRef aether.io/MeshFilter authz",
            "RequestHeaderModifier set x-a=1 add x-b=2 remove x-c",
            "URLRewrite hostname h",
        ]
    );
    assert_eq!(
        plan.response
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        vec!["ResponseHeaderModifier set x-r=1"]
    );
    assert_eq!(
        plan.mirrors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        vec!["RequestMirror core/Service shadow:80 50%"]
    );
    assert_eq!(plan.weights(), vec![3, 1]);
    assert_eq!(
        plan.backends[0].request,
        vec![FilterStep::RequestHeaders(modifier(
            &[("x-backend", "v1")],
            &[],
            &[]
        ))]
    );
    assert_eq!(
        plan.backends[1].response,
        vec![FilterStep::ResponseHeaders(modifier(&[], &[], &["server"]))]
    );
    assert_eq!(
        (0..4)
            .filter_map(|e| plan.pick_backend(e))
            .collect::<Vec<_>>(),
        vec![0, 0, 0, 1]
    );
    let text = plan.to_string();
    assert!(
        text.contains("then: forward to a backend by weight\n"),
        "{text}"
    );
    assert!(
        text.contains("backend 1 response: ResponseHeaderModifier remove server\n"),
        "{text}"
    );
}

#[test]
fn redirect_and_rewrite_steps_print_on_one_line() {
    let step = FilterStep::Redirect(Redirect {
        scheme: Some("https".into()),
        hostname: Some("example.org".into()),
        port: Some(8443),
        path: Some(PathModifier::ReplacePrefixMatch("/new".into())),
        status: None,
    });
    assert_eq!(
        step.to_string(),
        "RequestRedirect scheme https hostname example.org port 8443 path ReplacePrefixMatch /new status 302"
    );
    let step = FilterStep::Rewrite(UrlRewrite {
        hostname: None,
        path: Some(PathModifier::ReplaceFullPath("/one".into())),
    });
    assert_eq!(step.to_string(), "URLRewrite path ReplaceFullPath /one");
}
