//! The source side of a delivery (routes.md §4, §5): the rule's filters (header modifiers,
//! redirects, rewrites, route-level `ExtensionRef` filters), the mirrors that fire, the
//! service-level header mutation, then the request over the mesh hop to one endpoint, and the
//! response-side modifiers on the way back. A request that switches protocols crosses a
//! dedicated HTTP/1.1 hop ([`ALPN_H1`]) and is spliced on `101`.
//!
//! May import: `super::mirror`, `super::upstream` (forms and the `101` count), `filters`, `balance`, `hop`,
//! `respond`, `upgrade`; never `super::serve`. Invariants: a delivered request carries the
//! authority it was routed on as its `Host` (addressing.md §2); every filter that applies runs
//! before the hop (I1); response modifiers apply backend, then rule, then service level.

use std::ops::ControlFlow;
use std::sync::Arc;

use http::header::HOST;
use http::{HeaderValue, Request, Response, Version};
use http_body_util::BodyExt;
use hyper::upgrade::OnUpgrade;
use tracing::warn;

use super::mirror::{fired_mirrors, send_mirrors};
use super::upstream::{count_switch, origin_form_any};
use crate::model::filters::{FilterStep, RedirectInput, RuleAnswer, redirect, rewrite};
use crate::model::snapshot::{FilterConfig, HeaderModifier, UrlRewrite};
use crate::proxy::balance::{self, Outcome, Tried};
use crate::proxy::filters::{authorize, modify_headers, mutate_request, set_path};
use crate::proxy::hop::{annotate, connect, hop_form};
use crate::proxy::{ALPN_H1, Body, BoxError, Inputs, Peer, PodCtx, count, respond, upgrade};
use crate::resolve::answer::Reason;
use crate::resolve::decision::{Delivery, Endpoint, RouteRun};

/// A delivery's mesh hop, returned beside its response by [`deliver`]: how long the hop took to
/// the response head, and the endpoint it went to. (Not a response extension: the extension map
/// cost each delivered request three allocations, issue #38.)
#[derive(Clone, Debug)]
pub struct Hopped {
    /// From sending the request on the hop to its response head.
    pub took: std::time::Duration,
    /// The endpoint's pod name, when the model knows it.
    pub pod: Option<Arc<str>>,
    /// The endpoint's address.
    pub address: std::net::IpAddr,
}

impl Hopped {
    /// The endpoint's pod name, or its address.
    pub fn pod(&self) -> String {
        self.pod
            .as_deref()
            .map_or_else(|| self.address.to_string(), str::to_owned)
    }
}

/// The response header modifiers a delivery collects on its way out, applied to the response
/// on its way back: backend level, then rule level, then service level (routes.md §5).
#[derive(Default)]
struct ResponseSteps {
    backend: Vec<HeaderModifier>,
    rule: Vec<HeaderModifier>,
    service: Vec<HeaderModifier>,
}

impl ResponseSteps {
    fn apply(&self, resp: &mut Response<Body>) {
        for m in self.backend.iter().chain(&self.rule).chain(&self.service) {
            modify_headers(resp.headers_mut(), m);
        }
    }
}

/// The caller as an identity, for route-level authorization on the source node.
fn self_peer(inputs: &Inputs, pod: &PodCtx) -> Peer {
    Peer {
        namespace: pod.namespace.clone(),
        service_account: pod.service_account.clone(),
        id: format!(
            "spiffe://{}/ns/{}/sa/{}",
            inputs.settings.trust_domain, pod.namespace, pod.service_account
        ),
    }
}

/// The answer of a rule's `RequestRedirect` for this request (routes.md §4).
fn rule_redirect(
    r: &crate::model::snapshot::Redirect,
    authority: Option<&str>,
    req: &Request<Body>,
    front_port: u16,
    run: &RouteRun,
) -> Response<Body> {
    let answer = redirect(
        r,
        RedirectInput {
            scheme: "http",
            authority: authority.unwrap_or(""),
            listener_port: front_port,
            path: req.uri().path(),
            query: req.uri().query(),
            matched_prefix: run.matched_prefix.as_deref(),
        },
    );
    respond::redirect(answer.status, &answer.location)
}

/// Deliver a request over the mesh hop with every filter that applies (routes.md §4, §5),
/// sending the mirrors that fire. An upgrade request crosses a dedicated HTTP/1.1 hop and is
/// spliced on `101`. `authority` is the request's as received (the absolute-form target's, or
/// its `:authority` or `Host`). The response comes with its [`Hopped`] when the hop answered it,
/// and without when the mesh did.
pub async fn deliver(
    inputs: &Arc<Inputs>,
    pod: &Arc<PodCtx>,
    authority: Option<&str>,
    d: Delivery,
    mut req: Request<Body>,
    client_upgrade: Option<OnUpgrade>,
) -> (Response<Body>, Option<Hopped>) {
    set_routed_host(&mut req, authority);
    let mut steps = ResponseSteps::default();
    if let Some(run) = &d.route
        && let ControlFlow::Break(answer) =
            run_rule(inputs, pod, authority, &d, run, &mut req, &mut steps).await
    {
        return (answer, None);
    }
    // The copies see the request as the rule's filters left it (routes.md §4 item 4).
    let mirrors = fired_mirrors(&d);
    if !mirrors.is_empty() {
        req = send_mirrors(inputs, pod, &d, mirrors, req, client_upgrade.is_some()).await;
    }
    if let ControlFlow::Break(answer) = run_service_level(&d, &mut req, &mut steps) {
        return (answer, None);
    }
    let endpoints = &d.backend.endpoints;
    if endpoints.is_empty() {
        return (respond::reason(Reason::NoEndpoints), None);
    }
    let version = req.version();
    count(&inputs.stats.deliveries);
    let hop_started = crate::time::now();
    let port = d.backend.pod_port;
    // The endpoint is chosen, and a second one tried when the first cannot be reached, by
    // `balance` (issue #38): the route's timeout covers both tries.
    let send = async {
        match client_upgrade {
            None => {
                annotate(&mut req, &d.filter_services, version, d.backend.h2c);
                let req = hop_form(req);
                match balance::send(inputs, pod, endpoints, port, req).await {
                    Outcome::Reached { value, index, .. } => Outcome::Reached {
                        value: value.map(|b| b.map_err(BoxError::from).boxed()),
                        index,
                        load: balance::Load::none(),
                    },
                    Outcome::Failed(e) => Outcome::Failed(BoxError::from(e)),
                    Outcome::NoEndpoint => Outcome::NoEndpoint,
                }
            }
            Some(up) => {
                annotate(&mut req, &d.filter_services, Version::HTTP_11, false);
                hop_upgrade(inputs, pod, endpoints, port, req, up).await
            }
        }
    };
    let outcome = match d.timeout_ms {
        Some(ms) => match tokio::time::timeout(std::time::Duration::from_millis(ms), send).await {
            Ok(r) => r,
            Err(_) => return (respond::reason(Reason::UpstreamUnreachable), None),
        },
        None => send.await,
    };
    let (mut resp, endpoint) = match outcome {
        Outcome::Reached { value, index, .. } => (value, &endpoints[index]),
        Outcome::NoEndpoint => return (respond::reason(Reason::NoEndpoints), None),
        Outcome::Failed(e) => {
            log_hop_failed(inputs, &d, &*e);
            return (respond::reason(Reason::UpstreamUnreachable), None);
        }
    };
    let hopped = Hopped {
        took: hop_started.elapsed(),
        pod: endpoint.pod.clone(),
        address: endpoint.address,
    };
    steps.apply(&mut resp);
    (resp, Some(hopped))
}

/// A delivery no endpoint took: logged at debug level, and as a warning at most once a second
/// (a client that floods and cancels its requests would otherwise write a line per request;
/// every failure is answered and counted).
fn log_hop_failed(inputs: &Inputs, d: &Delivery, e: &dyn std::error::Error) {
    tracing::debug!(error = %crate::DisplayChain(e), service = %d.backend.service,
        "mesh hop failed");
    if let Some(left_out) = inputs.stats.hop_failed_log.pass() {
        warn!(error = %crate::DisplayChain(e), service = %d.backend.service,
            left_out, "mesh hop failed (and {left_out} more since the last line)");
    }
}

/// addressing.md §2: a delivered request carries the authority it was routed on as its `Host`
/// (an absolute-form target's, not a `Host` field that says otherwise), so routing, filters and
/// the application see the same authority. The common case, one `Host` that is the authority
/// already, allocates nothing.
fn set_routed_host(req: &mut Request<Body>, authority: Option<&str>) {
    if let Some(a) = authority {
        let mut hosts = req.headers().get_all(HOST).iter();
        let kept =
            matches!((hosts.next(), hosts.next()), (Some(h), None) if h.as_bytes() == a.as_bytes());
        if !kept && let Ok(v) = HeaderValue::from_str(a) {
            req.headers_mut().insert(HOST, v);
        }
    }
}

/// What a route rule runs on the request (routes.md §4, §5): its request filters, then its
/// chosen backend's, in order; the response modifiers of the rule and the backend go to
/// `steps`. `Break` with the answer when the rule answers itself (a redirect, a denial by a
/// route-level filter, a backend that is not valid).
async fn run_rule(
    inputs: &Inputs,
    pod: &PodCtx,
    authority: Option<&str>,
    d: &Delivery,
    run: &RouteRun,
    req: &mut Request<Body>,
    steps: &mut ResponseSteps,
) -> ControlFlow<Response<Body>> {
    let plan = &run.plan;
    if matches!(plan.answer, RuleAnswer::Invalid(_) | RuleAnswer::NoBackends) {
        return ControlFlow::Break(respond::reason(Reason::InvalidBackend));
    }
    let backend = plan.backends.get(run.backend_index);
    let request_steps = plan
        .request
        .iter()
        .chain(backend.into_iter().flat_map(|b| b.request.iter()));
    for step in request_steps {
        match step {
            FilterStep::RequestHeaders(m) => modify_headers(req.headers_mut(), m),
            FilterStep::ResponseHeaders(m) => steps.rule.push(m.clone()),
            FilterStep::Redirect(r) => {
                let mut resp = rule_redirect(r, authority, req, d.front_port, run);
                steps.apply(&mut resp);
                return ControlFlow::Break(resp);
            }
            FilterStep::Rewrite(rw) => rewrite_request(req, rw, run),
            // A route-level filter (routes.md §5): a header mutation runs here, an
            // authorization filter checks the caller on the source node. (Awaited here, not in
            // a function of its own: the delivery's future is boxed per request and would hold
            // that function's arguments too.)
            FilterStep::Extension(obj) => match route_level(run, &obj.name) {
                None => return ControlFlow::Break(respond::reason(Reason::InvalidBackend)),
                Some(FilterConfig::HeaderMutation(m)) => {
                    mutate_request(req, m);
                    steps.rule.push(m.response.clone());
                }
                Some(config) => {
                    let peer = self_peer(inputs, pod);
                    let key = d.backend.service.clone();
                    if let Some(denied) = authorize(inputs, pod, config, &key, &peer, req).await {
                        return ControlFlow::Break(denied);
                    }
                }
            },
        }
    }
    let response_steps = |list: &[FilterStep], to: &mut Vec<HeaderModifier>| {
        for step in list {
            if let FilterStep::ResponseHeaders(m) = step {
                to.push(m.clone());
            }
        }
    };
    if let Some(b) = backend {
        response_steps(&b.response, &mut steps.backend);
    }
    response_steps(&plan.response, &mut steps.rule);
    if let RuleAnswer::Redirect(r) = &plan.answer {
        let mut resp = rule_redirect(r, authority, req, d.front_port, run);
        steps.apply(&mut resp);
        return ControlFlow::Break(resp);
    }
    ControlFlow::Continue(())
}

/// A rule's `URLRewrite` (routes.md §4): the path (the query kept) and, when it says so, the
/// `Host`.
fn rewrite_request(req: &mut Request<Body>, rw: &UrlRewrite, run: &RouteRun) {
    let (authority, path) = rewrite(rw, req.uri().path(), run.matched_prefix.as_deref());
    let target = match req.uri().query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    set_path(req, &target);
    if let Some(a) = authority
        && let Ok(v) = HeaderValue::from_str(&a)
    {
        req.headers_mut().insert(HOST, v);
    }
}

/// The MeshFilter a rule's `ExtensionRef` names (`name`), among the rule's route-level filters.
fn route_level<'r>(run: &'r RouteRun, name: &str) -> Option<&'r FilterConfig> {
    run.route_level
        .iter()
        .find(|(n, _)| n.rsplit('/').next() == Some(name))
        .map(|(_, config)| config)
}

/// routes.md §5.5: service-level header mutation runs on the source node, its response side
/// going to `steps`. A MeshFilter the node cannot read refuses here already (`Break` with the
/// answer): it could be a mutation this node should make (issue #35 item 1); the destination
/// refuses it too.
fn run_service_level(
    d: &Delivery,
    req: &mut Request<Body>,
    steps: &mut ResponseSteps,
) -> ControlFlow<Response<Body>> {
    for (_, filters) in &d.service_filters {
        for f in filters.iter() {
            match &f.config {
                FilterConfig::HeaderMutation(m) => {
                    mutate_request(req, m);
                    steps.service.push(m.response.clone());
                }
                FilterConfig::Unreadable(_) => {
                    return ControlFlow::Break(respond::reason(Reason::AuthzUnavailable));
                }
                FilterConfig::Rbac(_) | FilterConfig::ExtAuthz(_) => {}
            }
        }
    }
    ControlFlow::Continue(())
}

/// A request that switches protocols: HTTP/2 cannot, so it gets an HTTP/1.1 hop of its own
/// (ALPN [`ALPN_H1`]), and the application is reached as HTTP/1.1 whatever `appProtocol` says;
/// a `101` splices the two sides.
///
/// Not an `async fn`: the future is `balance::deliver_to`'s own, so that the request is not
/// held once more by a future of this function (a delivery's future is boxed per request).
fn hop_upgrade<'a>(
    inputs: &'a Inputs,
    pod: &'a PodCtx,
    endpoints: &'a [Endpoint],
    port: u16,
    req: Request<Body>,
    up: OnUpgrade,
) -> impl Future<Output = Outcome<Response<Body>, BoxError>> + Send + 'a {
    let req = origin_form_any(req);
    balance::deliver_to(
        inputs,
        endpoints,
        port,
        (req, up),
        move |i, (req, up)| async move {
            let endpoint = &endpoints[i];
            let tls = match connect(inputs, pod, endpoint, port, ALPN_H1).await {
                Ok(tls) => tls,
                Err(e) => return balance::hop_not_reached(e, (req, up)),
            };
            match upgrade::forward(tls, req, up, inputs.settings.tcp_idle_timeout).await {
                Ok(resp) => {
                    count_switch(inputs, &resp);
                    Tried::Done(resp)
                }
                Err(e) => Tried::Failed(BoxError::from(e)),
            }
        },
    )
}
