//! Facts in, decisions out: the types a resolver takes and returns.
//!
//! Deliver, refuse and pass through are normal outcomes carried as values (STYLE.md §6.1).
//! Layer 0 (pure).

use crate::prelude::*;

use std::net::SocketAddr;
use std::sync::Arc;

use http::HeaderMap;
use serde::Serialize;

use crate::model::names::AuthorityInput;
use crate::resolve::answer::MeshAnswer;
// The model's own types live in `model` (ARCHITECTURE.md "Who may import whom"); re-exported here,
// where the resolvers' callers have always found them.
pub use crate::model::target::{
    CaptureMode, Endpoint, HttpBackend, ServiceKey, TcpBackend, TcpChoice, TcpTarget, Why,
};

/// Who a connection comes from: connection facts, never request content (I4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Caller {
    /// The caller pod's namespace; `None` is the fault state of addressing.md §4.4.
    pub namespace: Option<String>,
    /// The caller pod's name, when known.
    pub pod: Option<String>,
    /// The caller pod's ServiceAccount, when known.
    pub service_account: Option<String>,
    /// The caller pod's capture mode.
    pub capture: CaptureMode,
}

/// How a captured connection is handled when it is accepted (addressing.md §3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum ConnDecision {
    /// Raw TCP, decided at accept: no byte is read, nothing is waited for.
    Tcp(TcpChoice),
    /// Passthrough to the dialled address, at once, without reading a byte.
    Passthrough(Why),
    /// Closed without reading (scoped capture, 18082).
    Close(Why),
    /// Wait for the client's first bytes, up to the sniff bound, then [`resolve_sniffed`].
    ///
    /// [`resolve_sniffed`]: crate::resolve::resolve_sniffed
    Sniff(SniffPlan),
}

/// What a datagram from a managed pod gets (addressing.md §10.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum UdpDecision {
    /// Forwarded in plaintext to the UDPRoute's backend.
    Forward(TcpTarget),
    /// Dropped: no UDPRoute for the address, or its backend is invalid.
    Drop(Why),
    /// Not captured: only port 18082 is.
    NotCaptured(Why),
}

/// What to do once the first bytes are known.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SniffPlan {
    /// Where HTTP goes; `None` when HTTP is not handled here.
    pub http: Option<HttpEntry>,
    /// TLSRoute rules to try on a ClientHello: (server name patterns, choice).
    pub tls: Vec<(Vec<Arc<str>>, TcpChoice)>,
    /// What happens to anything else (other bytes, an unmatched SNI, or the sniff bound).
    pub otherwise: Fallback,
    /// What decided it.
    pub why: Why,
}

/// The fallback of a [`SniffPlan`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Fallback {
    /// Passthrough to the dialled address.
    Passthrough,
    /// Raw TCP to this choice.
    Tcp(TcpChoice),
    /// Closed (scoped capture, 18082, addressing.md §3 step 4).
    Close,
}

/// What the first bytes were (spec/addressing.md §3.1), as the sniffer reports them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Sniffed {
    /// An HTTP/1.0 or HTTP/1.1 request line, or the HTTP/2 prior-knowledge preface.
    Http,
    /// A TLS ClientHello, with its SNI when it has one.
    Tls(Option<String>),
    /// Anything else.
    Other,
    /// Silence until the sniff bound.
    Timeout,
}

/// What a connection becomes after sniffing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum AfterSniff {
    /// Serve HTTP; every request is then resolved on its own.
    Http(HttpEntry),
    /// Raw TCP.
    Tcp(TcpChoice),
    /// Passthrough to the dialled address.
    Passthrough,
    /// Closed without an answer.
    Close,
}

/// How an HTTP request arrived (addressing.md §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum HttpEntry {
    /// A captured dial to `dialled` (port ≠ 18081).
    Captured {
        /// The original destination.
        dialled: SocketAddr,
    },
    /// A captured dial to the IP of a served pod, on a port its row declares HTTP.
    PodIp {
        /// The original destination.
        dialled: SocketAddr,
    },
    /// The loopback listener `127.0.0.1:18081` / `[::1]:18081`.
    Loopback,
    /// A captured dial to port 18081 of any address: the proxy port.
    ProxyCaptured {
        /// The original destination.
        dialled: SocketAddr,
    },
}

/// One HTTP request, as far as the resolver reads it.
#[derive(Clone, Copy, Debug)]
pub struct RequestFacts<'a> {
    /// How it arrived.
    pub entry: HttpEntry,
    /// What names its target.
    pub authority: AuthorityInput<'a>,
    /// The method, as received.
    pub method: &'a str,
    /// The path and query (origin form); `None` for a request without a path (CONNECT).
    pub path_and_query: Option<&'a str>,
    /// The request's header map, borrowed (nothing is copied per request, issue #38), with the
    /// mesh's headers already removed (I12). Route matches read its values as UTF-8, a byte
    /// that is not UTF-8 as U+FFFD ([`RequestView::headers`]).
    ///
    /// [`RequestView::headers`]: crate::model::route_match::RequestView::headers
    pub headers: &'a HeaderMap,
    /// The discovery hold for this request has run out (addressing.md §8).
    pub hold_expired: bool,
    /// Entropy for the weighted choice of a backend.
    pub entropy: u64,
    /// The caller wants the decision explained: every [`Why::detail`] is written out (`aether
    /// explain`, the debug endpoint). Without it, a detail that would be formatted for this
    /// request is left empty, so that the data plane, which reads only [`Why::rule`], formats
    /// nothing per request (issue #38); fixed details are there either way.
    pub explain: bool,
}

/// What one HTTP request gets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum RequestDecision {
    /// A mesh answer (addressing.md §11).
    Answer(MeshAnswer, Why),
    /// Forward to the dialled address outside the mesh (captured dials only).
    Passthrough(Why),
    /// Wait (at most the discovery hold) for a newer model, then resolve again; with
    /// `hold_expired` the resolver never holds.
    Hold(HoldFor, Why),
    /// A redirect that a route rule configures (carries no reason, addressing.md §11.1).
    Redirect {
        /// 301, 302, 303, 307 or 308.
        status: u16,
        /// The `Location` header.
        location: String,
        /// What decided it.
        why: Why,
    },
    /// Deliver to a mesh service's endpoints with everything that applies.
    Deliver(Box<Delivery>),
}

/// What a hold waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum HoldFor {
    /// A name of the mesh-name shape that the node knows no ports of.
    UnknownName,
    /// An endpoint of the chosen port.
    Endpoints,
}

/// A delivery: everything the data plane needs to carry one request, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Delivery {
    /// The Service the request was addressed to (`None` for a pod-IP dial).
    pub addressed: Option<ServiceKey>,
    /// The front port it was addressed on.
    pub front_port: u16,
    /// The backend that was chosen.
    pub backend: HttpBackend,
    /// The route rule that chose it, if any.
    pub rule: Option<RuleRef>,
    /// What the route rule runs, when a rule chose the delivery.
    pub route: Option<RouteRun>,
    /// Services whose service-level filters apply (routes.md §5.5 items 1 and 2; the
    /// destination adds item 3, each endpoint's own mesh service).
    pub filter_services: Vec<ServiceKey>,
    /// The service-level filters that apply (items 1–3), by the Service they target.
    pub service_filters: Vec<(ServiceKey, Arc<[crate::model::NamedFilter]>)>,
    /// The request timeout of the rule, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// What decided it.
    pub why: Why,
}

/// What a route rule runs on a delivery it chose (routes.md §4, §5): data for the data plane to
/// execute, shared with the compiled model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RouteRun {
    /// The rule's filters in the order they run (request, backend, mirrors, response).
    #[serde(skip)]
    pub plan: Arc<crate::model::filters::FilterPlan>,
    /// Which backendRef of the rule was chosen (its backend-level filters are in the plan).
    pub backend_index: usize,
    /// The `PathPrefix` value that selected the rule, for `ReplacePrefixMatch`.
    pub matched_prefix: Option<Arc<str>>,
    /// The MeshFilters the rule's ExtensionRefs name, in order (route level).
    #[serde(skip)]
    pub route_level: Arc<[(String, crate::model::snapshot::FilterConfig)]>,
}

/// A route rule, named for explain and logs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleRef {
    /// `HTTPRoute` or `GRPCRoute`.
    pub kind: &'static str,
    /// Namespace of the route.
    pub namespace: Arc<str>,
    /// Name of the route.
    pub route: Arc<str>,
    /// Index of the rule.
    pub index: usize,
    /// The rule's name, if any.
    pub name: Option<Arc<str>>,
}
