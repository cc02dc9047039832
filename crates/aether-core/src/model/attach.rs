//! Gateway API routes in the compiled model: which (Service, port) each rule attaches to,
//! what each backendRef resolves to (strictly), and the route status conditions that follow
//! from the same facts (routes.md §2, §3, §6, §9).
//!
//! Layer 0 (pure).

use crate::prelude::*;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::filters::FilterPlan;
use crate::model::snapshot::{FilterConfig, HttpRouteKind, ParentRef};
use crate::model::target::{HttpBackend, TcpChoice};

/// The rules attached to one (name, front port): producer routes, and consumer routes by the
/// caller namespace they serve (routes.md §2.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortRoutes {
    /// Routes in the parent's namespace.
    pub producer: Option<RuleSet>,
    /// Routes in another namespace, for callers of that namespace only.
    pub consumers: BTreeMap<Arc<str>, RuleSet>,
}

impl PortRoutes {
    /// The rule set a caller of `namespace` sees: its consumer routes take precedence.
    pub fn for_caller(&self, namespace: Option<&str>) -> Option<&RuleSet> {
        namespace
            .and_then(|ns| self.consumers.get(ns))
            .or(self.producer.as_ref())
    }
}

/// The routes attached to one (name, front port) for one audience, in a match table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSet {
    /// The attached routes, in the order the match table was built from.
    pub routes: Vec<AttachedRoute>,
    /// The match table over every rule of every route.
    pub table: crate::model::route_match::RouteTable,
}

/// One route attached to a port, with its rules compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachedRoute {
    /// `HTTPRoute` or `GRPCRoute`.
    pub kind: HttpRouteKind,
    /// Namespace of the route.
    pub namespace: Arc<str>,
    /// Name of the route.
    pub name: Arc<str>,
    /// Its rules, in order.
    pub rules: Vec<CompiledRule>,
}

/// One rule, its backends resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledRule {
    /// The rule's name.
    pub name: Option<Arc<str>>,
    /// Its filters in the order a data plane runs them, built once (shared by every delivery).
    pub plan: Arc<FilterPlan>,
    /// The MeshFilters its ExtensionRefs name, in order (route level, routes.md §5.1).
    pub extension_filters: Arc<[(String, FilterConfig)]>,
    /// The backends with their weights.
    pub backends: Vec<CompiledBackend>,
    /// `timeouts.request`, milliseconds.
    pub timeout_ms: Option<u64>,
    /// A filter this build cannot run: every request of the rule gets `500 invalid-backend`.
    pub unsupported: Option<String>,
}

/// One backendRef of a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledBackend {
    /// Its weight.
    pub weight: u32,
    /// Where it goes, or why it is invalid. Its backend-level filters are in the rule's plan.
    pub target: Result<HttpBackend, InvalidRef>,
}

/// Why a reference is invalid (`ResolvedRefs=False`, routes.md §3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvalidRef {
    /// The Gateway API reason.
    pub reason: RefReason,
    /// The message: names the Service, the port and the pod port or targetPort name.
    pub message: String,
}

/// `ResolvedRefs=False` reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RefReason {
    /// The Service or its port does not exist, or nothing declares the pod port.
    BackendNotFound,
    /// The pod port is raw TCP or UDP.
    UnsupportedProtocol,
    /// Not a Service.
    InvalidKind,
}

impl RefReason {
    /// The Gateway API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BackendNotFound => "BackendNotFound",
            Self::UnsupportedProtocol => "UnsupportedProtocol",
            Self::InvalidKind => "InvalidKind",
        }
    }
}

/// TLSRoutes on one generated Service's ClusterIP (routes.md §9.1).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsTable {
    /// Rules restricted to one port by their parentRef.
    pub by_port: BTreeMap<u16, Vec<TlsRule>>,
    /// Rules for any port the service does not serve as HTTP.
    pub any_port: Vec<TlsRule>,
}

impl TlsTable {
    /// Whether the service has any TLSRoute.
    pub fn is_empty(&self) -> bool {
        self.by_port.is_empty() && self.any_port.is_empty()
    }

    /// The rules that apply on port `d`.
    pub fn rules_for(&self, d: u16) -> Vec<TlsRule> {
        let mut v = self.by_port.get(&d).cloned().unwrap_or_default();
        v.extend(self.any_port.iter().cloned());
        v
    }
}

/// One TLSRoute rule: server names and where matching connections go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsRule {
    /// The route's hostnames (exact, or `*.suffix`), lower case.
    pub hostnames: Vec<Arc<str>>,
    /// The weighted destinations.
    pub choice: TcpChoice,
}

/// One condition of a route's parent status.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Condition {
    /// `Accepted`, `ResolvedRefs` or `gateway.aether.io/PodPortsJudged`.
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// The reason.
    pub reason: String,
    /// The message.
    pub message: String,
}

/// The status aether writes for one parentRef of one route (routes.md §6).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RouteStatus {
    /// `HTTPRoute`, `GRPCRoute`, `TLSRoute`, `TCPRoute` or `UDPRoute`.
    pub kind: String,
    /// Namespace of the route.
    pub namespace: String,
    /// Name of the route.
    pub name: String,
    /// `metadata.generation` (`observedGeneration`).
    pub generation: i64,
    /// The parentRef, as written in the route (`<ns>/<name>[:port][#section]`).
    pub parent: String,
    /// The parentRef itself, for the status entry's `parentRef`.
    #[serde(skip)]
    pub parent_ref: Option<ParentRef>,
    /// The conditions, in a fixed order.
    pub conditions: Vec<Condition>,
}

impl RouteStatus {
    /// The status entry of one parentRef of a route.
    pub fn of(
        kind: &str,
        namespace: &str,
        name: &str,
        generation: i64,
        parent: &ParentRef,
        conditions: Vec<Condition>,
    ) -> Self {
        Self {
            kind: kind.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            generation,
            parent: describe_parent(namespace, parent),
            parent_ref: Some(parent.clone()),
            conditions,
        }
    }
}

/// Renders a parentRef for status and explain output.
pub fn describe_parent(route_ns: &str, p: &ParentRef) -> String {
    let ns = p.target.namespace.as_deref().unwrap_or(route_ns);
    let mut s = format!("{}/{}", ns, p.target.name);
    if let Some(port) = p.port {
        s.push_str(&format!(":{port}"));
    }
    if let Some(section) = &p.section_name {
        s.push('#');
        s.push_str(section);
    }
    s
}
