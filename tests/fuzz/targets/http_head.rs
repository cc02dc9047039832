//! `http_head`: the first bytes of an HTTP connection, through what the daemon does with
//! them before and after hyper: the sniffer, the first-head check, and the resolver.
//!
//! The first-head check is the daemon's own (`proxy::http::serve::judge`, the pure part of the
//! connection's precheck); what hyper then builds from a complete head (method, `http::Uri`,
//! header names and values) is mirrored, and the request's facts are read as `serve.rs` reads
//! them (the absolute-form authority, every `Host`, the path, the headers without
//! `x-aether-*`), then `resolve_request` runs on every entry path the fixture's dials reach for
//! these bytes (`classify_connection` and `resolve_sniffed` with the sniffed verdict), for each
//! caller.
//!
//! Properties, beyond "no panic":
//! - the first-head check judges the bytes the same on every entry path, but that bytes that
//!   are not HTTP are `not-http` on the loopback listener and `bad-request` elsewhere;
//! - a head it lets through is one hyper builds a request from (method, target, fields);
//! - the resolver is deterministic (the same facts twice give the same decision);
//! - the loopback listener never passes a request through (it is nobody's destination);
//! - with the discovery hold run out, the resolver never holds again;
//! - a mesh answer renders as an HTTP/1.1 response that parses, with the reason's status,
//!   `x-aether-error` and a `content-length` that is the body's;
//! - a redirect's `Location` is a valid header value (the data plane would send the redirect
//!   without one, and log it).

use aether::model::filters::is_mesh_header;
use aether::model::names::{AuthorityInput, HttpVersion};
use aether::proxy::ProxySettings;
use aether::proxy::http::limits::Proto;
use aether::proxy::http::serve::{Judged, judge};
use aether::proxy::sniff::{Verdict, sniff};
use aether::resolve::answer::Reason;
use aether::resolve::decision::{
    AfterSniff, ConnDecision, HttpEntry, RequestDecision, RequestFacts, Sniffed,
};
use aether::resolve::{classify_connection, resolve_request, resolve_sniffed};

use crate::engine::{Target, fnv};
use crate::{fixture, outcome};

pub(crate) const TARGET: Target = Target {
    name: "http_head",
    max_len: 16 * 1024,
    dict: &[
        b"GET ",
        b"POST ",
        b"CONNECT ",
        b"OPTIONS * HTTP/1.1\r\n",
        b" HTTP/1.1\r\n",
        b" HTTP/1.0\r\n",
        b"http://",
        b"Host: ",
        b"host:",
        b"HOST: mp-multi\r\n",
        b"Host: mp-multi.mp.aether.internal:8080\r\n",
        b"mp-multi.mp.aether.internal",
        b"mp-httponly.mp.svc.cluster.local",
        b"mp-multi.mp",
        b":8080",
        b":18081",
        b":0",
        b"[::1]",
        b"user@",
        b"x-aether-error: ",
        b"x-tier: gold\r\n",
        b"x-version: v2\r\n",
        b"/exact",
        b"/api/v1/",
        b"/search?q=a%20b&page=12",
        b"/old/x",
        b"/items/12/ab",
        b"Transfer-Encoding: chunked\r\n",
        b"Content-Length: 0\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ],
    run,
};

/// What hyper would hand the service for a complete first head.
struct Head {
    method: String,
    version: HttpVersion,
    authority: Option<String>,
    hosts: Vec<String>,
    path: Option<String>,
    headers: http::HeaderMap,
}

/// The first-head check and hyper's parse, as far as they decide; `Err` names the outcome.
fn head(
    input: &[u8],
    sniffed: &Sniffed,
    dial: Option<std::net::SocketAddr>,
) -> Result<Head, &'static str> {
    let settings = ProxySettings::default();
    let loopback = judge(input, HttpEntry::Loopback, &settings);
    if let Some(dialled) = dial {
        let captured = judge(input, HttpEntry::Captured { dialled }, &settings);
        let as_captured = match loopback {
            Some(Judged::Answer(Reason::NotHttp)) => Some(Judged::Answer(Reason::BadRequest)),
            other => other,
        };
        assert_eq!(captured, as_captured, "the entry path changed the verdict");
    }
    match loopback {
        None => return Err("partial"),
        Some(Judged::Answer(reason)) => return Err(reason.code()),
        Some(Judged::Http(Proto::Http2)) => return Err("h2"),
        Some(Judged::Http(Proto::Http1)) => {}
    }
    assert_eq!(
        *sniffed,
        Sniffed::Http,
        "a head judged HTTP/1 sniffs as HTTP"
    );
    let mut slots = vec![httparse::EMPTY_HEADER; settings.max_headers];
    let mut req = httparse::Request::new(&mut slots);
    let parsed = req.parse(input);
    assert!(
        matches!(parsed, Ok(httparse::Status::Complete(_))),
        "a head let through does not parse whole: {parsed:?}"
    );
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        panic!("a complete head without a request line");
    };
    let method = http::Method::from_bytes(method.as_bytes()).map_err(|_| "hyper-method")?;
    let uri: http::Uri = target
        .parse()
        .unwrap_or_else(|e| panic!("a head let through has a target hyper refuses: {e}"));
    let mut headers = http::HeaderMap::new();
    let mut hosts = Vec::new();
    for h in req.headers.iter() {
        let name = http::HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| "hyper-name")?;
        let value = http::HeaderValue::from_bytes(h.value).map_err(|_| "hyper-value")?;
        if name == http::header::HOST {
            hosts.push(String::from_utf8_lossy(value.as_bytes()).into_owned());
        }
        if !is_mesh_header(name.as_str()) {
            headers.append(name, value);
        }
    }
    let connect = method == http::Method::CONNECT;
    Ok(Head {
        version: if version == 0 {
            HttpVersion::Http10
        } else {
            HttpVersion::Http11
        },
        authority: (!connect)
            .then(|| uri.authority().map(|a| a.as_str().to_owned()))
            .flatten(),
        hosts,
        path: (!connect).then(|| {
            uri.path_and_query()
                .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned())
        }),
        headers,
        method: method.as_str().to_owned(),
    })
}

fn decision_sig(d: &RequestDecision) -> String {
    match d {
        RequestDecision::Answer(a, _) => format!("answer {}", a.reason.code()),
        RequestDecision::Passthrough(_) => "passthrough".to_owned(),
        RequestDecision::Hold(h, _) => format!("hold {h:?}"),
        RequestDecision::Redirect { status, .. } => format!("redirect {status}"),
        RequestDecision::Deliver(d) => format!(
            "deliver {}:{:?} rule {:?}",
            d.backend.service,
            d.backend.port,
            d.rule.as_ref().map(|r| r.index)
        ),
    }
}

fn check_answer(d: &RequestDecision) {
    match d {
        RequestDecision::Answer(answer, _) => {
            let reason = answer.reason;
            let bytes = answer.render().to_http1(reason.status_text());
            let mut slots = [httparse::EMPTY_HEADER; 8];
            let mut resp = httparse::Response::new(&mut slots);
            let parsed = resp.parse(&bytes);
            assert!(
                matches!(parsed, Ok(httparse::Status::Complete(_))),
                "the answer does not parse: {parsed:?}: {:?}",
                String::from_utf8_lossy(&bytes)
            );
            assert_eq!(resp.code, Some(reason.status()));
            let header = |name: &str| {
                resp.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| String::from_utf8_lossy(h.value).into_owned())
            };
            assert_eq!(header("x-aether-error").as_deref(), Some(reason.code()));
            assert_eq!(
                header("content-length"),
                Some(answer.body().len().to_string())
            );
        }
        RequestDecision::Redirect { location, .. } => {
            assert!(
                http::HeaderValue::from_str(location).is_ok(),
                "the redirect's Location {location:?} is not a header value: the client \
                 would get a redirect without one"
            );
        }
        RequestDecision::Passthrough(_)
        | RequestDecision::Hold(..)
        | RequestDecision::Deliver(_) => {}
    }
}

fn run(input: &[u8]) -> u64 {
    let fx = fixture::get();
    let verdict = sniff(input);
    let sniffed = match &verdict {
        Verdict::Known(s) => s.clone(),
        Verdict::NeedMore => Sniffed::Timeout,
    };
    let parsed = head(input, &sniffed, fx.dials.first().copied());
    let mut sig: Vec<String> = vec![format!("{verdict:?}")];
    let head = match parsed {
        Ok(h) => h,
        Err(why) => {
            sig.push(why.to_owned());
            return outcome(&sig);
        }
    };

    let mut entries = Vec::new();
    for caller in &fx.callers {
        entries.push((caller, HttpEntry::Loopback));
        for &dial in &fx.dials {
            if let ConnDecision::Sniff(plan) = classify_connection(&fx.model, caller, dial)
                && let AfterSniff::Http(entry) = resolve_sniffed(&plan, &sniffed)
            {
                entries.push((caller, entry));
            }
        }
    }
    let hosts: Vec<&str> = head.hosts.iter().map(String::as_str).collect();
    for (caller, entry) in entries {
        let facts = |hold_expired| RequestFacts {
            entry,
            authority: AuthorityInput {
                version: head.version,
                absolute: head.authority.as_deref(),
                h2_authority: None,
                hosts: &hosts,
            },
            method: &head.method,
            path_and_query: head.path.as_deref(),
            headers: &head.headers,
            hold_expired,
            entropy: fnv(input),
            explain: true,
        };
        let first = resolve_request(&fx.model, caller, &facts(false));
        assert_eq!(
            first,
            resolve_request(&fx.model, caller, &facts(false)),
            "the same request resolved twice"
        );
        if entry == HttpEntry::Loopback {
            assert!(
                !matches!(first, RequestDecision::Passthrough(_)),
                "the loopback listener passed a request through: {first:?}"
            );
        }
        check_answer(&first);
        let last = resolve_request(&fx.model, caller, &facts(true));
        assert!(
            !matches!(last, RequestDecision::Hold(..)),
            "held again after the hold ran out: {last:?}"
        );
        check_answer(&last);
        sig.push(decision_sig(&first));
    }
    sig.sort();
    sig.dedup();
    outcome(&sig)
}
