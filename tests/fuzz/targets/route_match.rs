//! `route_match`: Gateway API route matching (crates/aether-core/src/model/route_match.rs
//! `RouteTable::select`) on request facts a client chooses, against the route tables of the
//! fixture (the variants' HTTPRoutes and GRPCRoutes, and `tests/fuzz/routes/`, whose matches
//! use every kind the Gateway API has), then through `resolve_request` on the compiled model.
//!
//! The input is UTF-8 (lossily), in lines: the method; the path with its query; the caller's
//! namespace (`-` for unknown); then header fields `name: value`.
//!
//! Properties, beyond "no panic":
//! - selection is deterministic, and so is the resolver's decision;
//! - header names match whatever their case;
//! - what was selected exists (route, rule, rule name), and the path match it reports does
//!   match: an `Exact` value is the path, a `PathPrefix` is a whole-element prefix of it.

use aether::model::names::{AuthorityInput, HttpVersion};
use aether::model::route_match::{MatchedPath, RequestView};
use aether::resolve::decision::{HttpEntry, RequestDecision, RequestFacts};
use aether::resolve::resolve_request;

use crate::engine::{Target, fnv};
use crate::{fixture, outcome};

pub(crate) const TARGET: Target = Target {
    name: "route_match",
    max_len: 2048,
    dict: &[
        b"GET\n",
        b"POST\n",
        b"/exact",
        b"/api",
        b"/api/v1/",
        b"/search?q=a%20b&page=12",
        b"?q=a+b",
        b"&page=0",
        b"%2F",
        b"%2f",
        b"/items/12/ab",
        b"/CASE/x",
        b"/old/x",
        b"/rewrite/x",
        b"/other",
        b"/aether.echo.v1.Echo/Echo",
        b"/aether.echo.v1.Echo/Other",
        b"\nmp\n",
        b"\nmp-other\n",
        b"\n-\n",
        b"x-tier: gold\n",
        b"X-Tier: gold\n",
        b"x-version: v2.1\n",
        b"x-older: 1\n",
        b"host: mp-httponly.mp.aether.internal:8080\n",
        b"host: mp-grpc.mp.aether.internal:50051\n",
        b"content-type: application/grpc\n",
        b", ",
    ],
    run,
};

fn prefix_holds(path: &str, prefix: &str) -> bool {
    let element = prefix.trim_end_matches('/');
    element.is_empty()
        || path
            .strip_prefix(element)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

fn run(input: &[u8]) -> u64 {
    let fx = fixture::get();
    let text = String::from_utf8_lossy(input);
    let mut lines = text.split('\n');
    let method = lines.next().unwrap_or_default();
    let target = lines.next().unwrap_or("/");
    let caller_ns = lines.next().filter(|l| *l != "-");
    // The header map a request with these lines arrives with (a line that is no field is not in
    // it), and the same built from the names in upper case.
    let mut headers = http::HeaderMap::new();
    let mut upper = http::HeaderMap::new();
    for line in lines {
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.trim_start_matches([' ', '\t']);
        let Ok(value) = http::HeaderValue::from_str(value) else {
            continue;
        };
        let lower = http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes());
        let shouted = http::HeaderName::from_bytes(name.to_ascii_uppercase().as_bytes());
        if let (Ok(lower), Ok(shouted)) = (lower, shouted) {
            headers.append(lower, value.clone());
            upper.append(shouted, value);
        }
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let view = RequestView {
        method,
        path,
        query,
        headers: &headers,
        caller_namespace: caller_ns,
    };

    let mut sig = Vec::new();
    for (parent, table) in &fx.tables {
        let selected = table.select(&view);
        assert_eq!(selected, table.select(&view), "{parent}: selected twice");
        let shouted = table.select(&RequestView {
            headers: &upper,
            ..view
        });
        assert_eq!(
            selected, shouted,
            "{parent}: upper-case header names changed the selection"
        );
        let Some(sel) = selected else {
            sig.push(None);
            continue;
        };
        let route = table
            .routes()
            .get(sel.route)
            .unwrap_or_else(|| panic!("{parent}: route {} does not exist", sel.route));
        let name = route
            .rule_names
            .get(sel.rule)
            .unwrap_or_else(|| panic!("{parent}: rule {} does not exist", sel.rule));
        assert_eq!(sel.rule_name, name.as_deref());
        match sel.matched {
            MatchedPath::Exact(v) => assert_eq!(v, path, "{parent}: an Exact match"),
            MatchedPath::Prefix(p) => assert!(
                prefix_holds(path, p),
                "{parent}: prefix {p:?} selected for the path {path:?}"
            ),
            MatchedPath::Regex(_) => {}
        }
        sig.push(Some((sel.route, sel.rule, sel.match_index)));
    }

    let hosts: Vec<&str> = headers
        .get_all(http::header::HOST)
        .iter()
        .filter_map(|v| std::str::from_utf8(v.as_bytes()).ok())
        .collect();
    let hosts = if hosts.is_empty() {
        vec!["mp-httponly.mp.aether.internal:8080"]
    } else {
        hosts
    };
    for caller in &fx.callers {
        let facts = RequestFacts {
            entry: HttpEntry::Loopback,
            authority: AuthorityInput {
                version: HttpVersion::Http11,
                absolute: None,
                h2_authority: None,
                hosts: &hosts,
            },
            method,
            path_and_query: Some(target),
            headers: &headers,
            hold_expired: true,
            entropy: fnv(input),
            explain: true,
        };
        let d = resolve_request(&fx.model, caller, &facts);
        assert_eq!(
            d,
            resolve_request(&fx.model, caller, &facts),
            "resolved twice"
        );
        if let RequestDecision::Deliver(d) = &d {
            sig.push(d.rule.as_ref().map(|r| (0, r.index, None)));
        }
    }
    outcome(&sig)
}
