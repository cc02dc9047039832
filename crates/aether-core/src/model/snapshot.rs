//! The backend-neutral registry input: plain, comparable data.
//!
//! Every registry source (Kubernetes watches, the manifest directory, etcd) produces one
//! [`Snapshot`]; [`crate::model::compile()`] turns it into a [`crate::model::Model`]. Nothing here
//! knows where the data came from, and nothing here is derived: the compiler derives.
//!
//! Layer 0 (pure): std, ipnet and serde only.

use crate::prelude::*;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::port::{PortProtocol, Transport};

/// Everything the compiler reads, as one consistent set of inputs (spec/model.md §13).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Registry rows: one per registered pod of a mesh service (spec/model.md §3). Shared, as
    /// are the pods: a source that builds the next snapshot from this one takes each unchanged
    /// row and pod by reference instead of copying it (the Kubernetes source's reuse,
    /// docs/decisions.md).
    pub rows: Vec<Arc<Row>>,
    /// Pods refused before they became rows (an unparseable annotation), kept for diagnostics.
    pub refused_pods: Vec<RefusedPod>,
    /// Every pod the source knows, managed or not: identity, addresses, labels, capture.
    pub pods: Vec<Arc<Pod>>,
    /// Every Kubernetes Service, generated or the user's.
    pub services: Vec<Service>,
    /// EndpointSlices, as Kubernetes computes them for Services with a selector.
    pub endpoint_slices: Vec<EndpointSlice>,
    /// Namespaces the source knows.
    pub namespaces: Vec<String>,
    /// HTTPRoutes and GRPCRoutes (a GRPCRoute is converted to the HTTPRoute shape, routes.md §1).
    pub http_routes: Vec<HttpRoute>,
    /// TLSRoutes.
    pub tls_routes: Vec<L4Route>,
    /// TCPRoutes.
    pub tcp_routes: Vec<L4Route>,
    /// UDPRoutes.
    pub udp_routes: Vec<L4Route>,
    /// ReferenceGrants. They govern cross-namespace references of Gateway-parent routes only
    /// (the edge); a mesh route's backend in another namespace needs none (routes.md §3), so
    /// the compiler does not read them.
    pub reference_grants: Vec<ReferenceGrant>,
    /// Allow-listed filter configurations (`MeshFilter`, routes.md §5).
    pub mesh_filters: Vec<MeshFilter>,
    /// HTTP ports kept after their rows vanished with no evidence (spec/model.md §10).
    pub retained: Vec<RetainedPort>,
}

/// A registry row (`ServiceEndpoint`, spec/model.md §3.1), as the store holds it.
///
/// `port_protocols` is kept as the store gave it, so that the consumption-time check
/// ([`crate::model::rows::row_problem`]) sees what a bad writer wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    /// The service's namespace (the pod's namespace).
    pub namespace: String,
    /// The ServiceAccount name.
    pub service: String,
    /// The pod IP.
    pub address: IpAddr,
    /// The declared (liveness) port, `endpoint.aether.io/port`.
    pub port: u32,
    /// Every port the pod declares; includes `port`.
    pub ports: Vec<u32>,
    /// The protocol of each listed port. `None` when the store has no map at all.
    pub port_protocols: Option<BTreeMap<u32, ProtocolValue>>,
    /// Readiness (spec/model.md §3.5).
    pub ready: bool,
    /// The pod behind the row, when the backend knows it.
    pub pod: Option<String>,
    /// The node the pod runs on, when the backend knows it.
    pub node: Option<String>,
}

/// One value of a row's `port_protocols` map, including the shapes a bad writer can store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProtocolValue {
    /// A concrete protocol.
    Known(PortProtocol),
    /// The store's "unspecified" value.
    Unspecified,
    /// A value this build does not know.
    Unknown(String),
}

/// A pod that produced no row, and why (spec/model.md §3.3 `annotation-unparseable`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedPod {
    /// Namespace of the pod.
    pub namespace: String,
    /// Name of the pod.
    pub name: String,
    /// What was wrong, for the operator.
    pub detail: String,
}

/// A pod as the registry knows it: identity, addresses and capture settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pod {
    /// Namespace of the pod.
    pub namespace: String,
    /// Name of the pod.
    pub name: String,
    /// `spec.serviceAccountName` (`default` when absent).
    pub service_account: String,
    /// `spec.nodeName`.
    pub node: Option<String>,
    /// `status.podIPs` (or `status.podIP`), in the order given.
    pub ips: Vec<IpAddr>,
    /// Labels, for Service selectors.
    pub labels: BTreeMap<String, String>,
    /// `false` for `aether.io/managed: "false"` or an ignored namespace.
    pub managed: bool,
    /// `capture.aether.io/redirect-all`, when present.
    pub redirect_all: Option<bool>,
    /// `capture.aether.io/exclude-outbound-ports`.
    pub exclude_outbound_ports: Vec<u16>,
    /// `capture.aether.io/exclude-outbound-ip-ranges`.
    pub exclude_outbound_ip_ranges: Vec<ipnet::IpNet>,
    /// The pod's `Ready` condition.
    pub ready: bool,
    /// The network namespace the pod lives in (`aether.io/netns`, file mode only).
    pub netns: Option<String>,
    /// `aether.io/netns-from: cni` (file mode only): the daemon learns the pod's namespace
    /// from a CNI ADD alone, as on Kubernetes; `netns` names it for the local topology.
    pub netns_from_cni: bool,
    /// The container command (file mode: what the local topology starts in the pod).
    pub command: Vec<String>,
    /// `inbound.aether.io/mode` as written (`strict`, `permissive`); `None` for the node
    /// default (model.md §12.5 item 3). Any other value makes the pod strict (fail closed),
    /// with a diagnostic.
    #[serde(default)]
    pub inbound_mode: Option<String>,
    /// `status.hostIPs` (or `status.hostIP`): the node's own addresses, whose plaintext
    /// (kubelet probes) is let through in both inbound modes.
    #[serde(default)]
    pub host_ips: Vec<IpAddr>,
}

/// A Kubernetes Service (generated or the user's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    /// Namespace of the Service.
    pub namespace: String,
    /// Name of the Service.
    pub name: String,
    /// Its cluster IPs (one per address family). Empty when none is allocated yet.
    pub cluster_ips: Vec<IpAddr>,
    /// `clusterIP: None`.
    pub headless: bool,
    /// Carries the label `aether.io/mesh-service: "true"`.
    pub generated: bool,
    /// `spec.selector`; `None` for a selectorless Service.
    pub selector: Option<BTreeMap<String, String>>,
    /// Its ports.
    pub ports: Vec<ServicePort>,
}

/// One ServicePort.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePort {
    /// `name`, if any.
    pub name: Option<String>,
    /// `port`: the front port.
    pub port: u16,
    /// `targetPort`.
    pub target: TargetPort,
    /// `protocol`.
    pub transport: Transport,
    /// `appProtocol`, if any.
    pub app_protocol: Option<String>,
}

/// A ServicePort's `targetPort`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetPort {
    /// Absent: the same number as `port`.
    Same,
    /// A number.
    Number(u16),
    /// A name, resolved through EndpointSlices (spec/model.md §9.2).
    Name(String),
}

/// An EndpointSlice of a Service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointSlice {
    /// Namespace of the slice (and of its Service).
    pub namespace: String,
    /// The Service it belongs to (`kubernetes.io/service-name`).
    pub service: String,
    /// Name of the slice.
    pub name: String,
    /// Its ports.
    pub ports: Vec<SlicePort>,
    /// Its endpoints.
    pub endpoints: Vec<SliceEndpoint>,
}

/// One port of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlicePort {
    /// The ServicePort name it carries.
    pub name: Option<String>,
    /// The pod port number.
    pub port: Option<u16>,
    /// Its transport.
    pub transport: Transport,
}

/// One endpoint of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceEndpoint {
    /// Its addresses.
    pub addresses: Vec<IpAddr>,
    /// The pod it points at, when the slice names one.
    pub pod: Option<String>,
    /// `conditions.ready` (absent counts as ready, as Kubernetes reads it).
    #[serde(default = "ready_by_default")]
    pub ready: bool,
}

fn ready_by_default() -> bool {
    true
}

/// A reference to an object by group, kind, namespace and name (Gateway API shapes).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectRef {
    /// API group; `""` is the core group.
    pub group: String,
    /// Kind; `Service` for a Service.
    pub kind: String,
    /// Namespace; `None` means the referring object's namespace.
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

/// A route's parentRef.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ParentRef {
    /// The parent object.
    pub target: ObjectRef,
    /// `port`, if given.
    pub port: Option<u16>,
    /// `sectionName`, if given.
    pub section_name: Option<String>,
}

/// Which Gateway API kind an [`HttpRoute`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum HttpRouteKind {
    /// `HTTPRoute`.
    Http,
    /// `GRPCRoute`, converted to the HTTPRoute shape.
    Grpc,
}

/// An HTTPRoute (or a GRPCRoute in HTTPRoute shape).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpRoute {
    /// Which kind it came from.
    pub kind: HttpRouteKind,
    /// Namespace of the route.
    pub namespace: String,
    /// Name of the route.
    pub name: String,
    /// `metadata.generation`.
    pub generation: i64,
    /// `metadata.creationTimestamp`, as RFC 3339 text (precedence ties, Gateway API).
    pub created: Option<String>,
    /// `spec.parentRefs`.
    pub parents: Vec<ParentRef>,
    /// `spec.hostnames` (ignored for Service parents, routes.md §2.1; kept for status).
    pub hostnames: Vec<String>,
    /// `spec.rules`.
    pub rules: Vec<HttpRule>,
}

/// What the text of an [`HttpFilter::Unsupported`] starts with when the source could not read
/// the route at all (issue #35 item 1): the route is kept with its parents and one rule that
/// answers every request `500 invalid-backend`, never dropped for the default delivery.
pub const UNREADABLE_ROUTE: &str = "unreadable route: ";

/// One rule of an HTTPRoute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpRule {
    /// `name` (named route rule).
    pub name: Option<String>,
    /// `matches`; an empty list means one match of prefix `/`.
    pub matches: Vec<HttpMatch>,
    /// `filters`, in order.
    pub filters: Vec<HttpFilter>,
    /// `backendRefs`.
    pub backends: Vec<HttpBackendRef>,
    /// `timeouts.request`, in milliseconds.
    pub request_timeout_ms: Option<u64>,
    /// `timeouts.backendRequest`, in milliseconds.
    pub backend_request_timeout_ms: Option<u64>,
}

/// One entry of a rule's `matches`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpMatch {
    /// `path`; `None` means prefix `/`.
    pub path: Option<PathMatch>,
    /// `headers`.
    pub headers: Vec<ValueMatch>,
    /// `queryParams`.
    pub query_params: Vec<ValueMatch>,
    /// `method`, upper case.
    pub method: Option<String>,
}

/// A path match.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PathMatch {
    /// `Exact`.
    Exact(String),
    /// `PathPrefix`.
    Prefix(String),
    /// `RegularExpression`.
    Regex(String),
}

/// A header or query parameter match.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueMatch {
    /// The header or parameter name (headers compare case-insensitively).
    pub name: String,
    /// How the value is compared.
    pub kind: ValueMatchKind,
    /// The value or the expression.
    pub value: String,
}

/// How a header or query value is compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ValueMatchKind {
    /// `Exact`.
    Exact,
    /// `RegularExpression`.
    Regex,
}

/// A Gateway API HTTP filter, as data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HttpFilter {
    /// `RequestHeaderModifier`.
    RequestHeaderModifier(HeaderModifier),
    /// `ResponseHeaderModifier`.
    ResponseHeaderModifier(HeaderModifier),
    /// `RequestRedirect`.
    RequestRedirect(Redirect),
    /// `URLRewrite`.
    UrlRewrite(UrlRewrite),
    /// `RequestMirror`.
    RequestMirror(Mirror),
    /// `ExtensionRef` (to a [`MeshFilter`] when its group and kind are ours).
    ExtensionRef(ObjectRef),
    /// A filter type this build does not implement (`CORS`, ...): the rule is not served.
    Unsupported(String),
}

/// `RequestHeaderModifier` / `ResponseHeaderModifier`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderModifier {
    /// `set`: replace (or add) these headers.
    pub set: Vec<(String, String)>,
    /// `add`: append these headers.
    pub add: Vec<(String, String)>,
    /// `remove`: drop these headers.
    pub remove: Vec<String>,
}

/// `RequestRedirect`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redirect {
    /// `scheme`.
    pub scheme: Option<String>,
    /// `hostname`.
    pub hostname: Option<String>,
    /// `port`.
    pub port: Option<u16>,
    /// `path`.
    pub path: Option<PathModifier>,
    /// `statusCode` (302 when absent).
    pub status: Option<u16>,
}

/// `URLRewrite`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UrlRewrite {
    /// `hostname`.
    pub hostname: Option<String>,
    /// `path`.
    pub path: Option<PathModifier>,
}

/// A path modifier of a redirect or rewrite.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PathModifier {
    /// `ReplaceFullPath`.
    ReplaceFullPath(String),
    /// `ReplacePrefixMatch`.
    ReplacePrefixMatch(String),
}

/// `RequestMirror`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mirror {
    /// The backend to mirror to.
    pub backend: ObjectRef,
    /// Its port.
    pub port: Option<u16>,
    /// `percent` (or the fraction, converted), 100 when absent.
    pub percent: u32,
}

/// A backendRef of an HTTP rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpBackendRef {
    /// The backend object.
    pub target: ObjectRef,
    /// Its port (a Service front port).
    pub port: Option<u16>,
    /// `weight` (1 when absent).
    pub weight: u32,
    /// Backend-level filters.
    pub filters: Vec<HttpFilter>,
}

/// A TLSRoute, TCPRoute or UDPRoute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct L4Route {
    /// Namespace of the route.
    pub namespace: String,
    /// Name of the route.
    pub name: String,
    /// `metadata.generation`.
    pub generation: i64,
    /// `metadata.creationTimestamp`, RFC 3339.
    pub created: Option<String>,
    /// `spec.parentRefs`.
    pub parents: Vec<ParentRef>,
    /// `spec.hostnames` (TLSRoute: matched against the SNI).
    pub hostnames: Vec<String>,
    /// `spec.rules`.
    pub rules: Vec<L4Rule>,
}

/// One rule of an L4 route.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct L4Rule {
    /// `name`.
    pub name: Option<String>,
    /// `backendRefs`.
    pub backends: Vec<L4BackendRef>,
}

/// A backendRef of an L4 rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct L4BackendRef {
    /// The backend object.
    pub target: ObjectRef,
    /// Its port.
    pub port: Option<u16>,
    /// `weight` (1 when absent).
    pub weight: u32,
    /// Whether `weight` was given explicitly (UDPRoute refuses weighted splits, routes.md §9.3).
    pub weight_given: bool,
}

/// A ReferenceGrant: lets objects of `from` refer to objects of `to` in the grant's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReferenceGrant {
    /// Namespace of the grant (the namespace of the referents).
    pub namespace: String,
    /// Name of the grant.
    pub name: String,
    /// `spec.from`: (group, kind, namespace).
    pub from: Vec<(String, String, String)>,
    /// `spec.to`: (group, kind, optional name).
    pub to: Vec<(String, String, Option<String>)>,
}

/// A `MeshFilter` (group `aether.io`): one allow-listed filter configuration (routes.md §5).
///
/// With `target_refs` it is a service-wide filter on each targeted Service; a route rule's
/// `ExtensionRef` may refer to it as a route-level filter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshFilter {
    /// Namespace of the filter.
    pub namespace: String,
    /// Name of the filter.
    pub name: String,
    /// Services it targets (same namespace).
    pub target_refs: Vec<String>,
    /// The filter itself.
    pub config: FilterConfig,
}

/// The allow-list (routes.md §5.1). Each variant has a combination rule (routes.md §5.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FilterConfig {
    /// `header_mutation`.
    HeaderMutation(HeaderMutation),
    /// `rbac`.
    Rbac(Rbac),
    /// `ext_authz`.
    ExtAuthz(ExtAuthz),
    /// A `MeshFilter` the source could not read (issue #35 item 1): it could be an
    /// authorization, so wherever it would run, it refuses (`403 authz-unavailable`, a byte
    /// stream closed, plaintext refused) until it is fixed.
    Unreadable(Unreadable),
}

/// What is known of a `MeshFilter` that could not be read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unreadable {
    /// Why it could not be read, for the operator.
    pub why: String,
    /// Its targets could not be read either: it may guard any Service of its namespace, so
    /// every Service and mesh service of the namespace is its target (the filter's own
    /// `target_refs` is then empty).
    pub whole_namespace: bool,
}

/// A header (and query parameter) mutation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderMutation {
    /// Request header changes.
    pub request: HeaderModifier,
    /// Query parameter changes, in declaration order.
    pub query: Vec<QueryMutation>,
    /// Response header changes.
    pub response: HeaderModifier,
}

/// One query parameter mutation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum QueryMutation {
    /// Set (replace or add) a parameter.
    Set(String, String),
    /// Append a parameter.
    Add(String, String),
    /// Remove every parameter of a name.
    Remove(String),
}

/// Authorization by the caller's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rbac {
    /// `Allow`: only matching callers pass. `Deny`: matching callers are refused.
    pub action: RbacAction,
    /// The callers the rule matches.
    pub principals: Vec<Principal>,
}

impl Rbac {
    /// Whether the caller with this namespace and ServiceAccount passes.
    pub fn allows(&self, namespace: &str, service_account: &str) -> bool {
        let hit = self.principals.iter().any(|p| {
            p.namespace.as_deref().is_none_or(|ns| ns == namespace)
                && p.service_account
                    .as_deref()
                    .is_none_or(|sa| sa == service_account)
        });
        match self.action {
            RbacAction::Allow => hit,
            RbacAction::Deny => !hit,
        }
    }
}

/// What an [`Rbac`] does with a matching caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RbacAction {
    /// Only matching callers are allowed.
    Allow,
    /// Matching callers are denied.
    Deny,
}

/// A caller identity pattern; `None` matches any value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// The caller's namespace.
    pub namespace: Option<String>,
    /// The caller's ServiceAccount.
    pub service_account: Option<String>,
}

/// External authorization over HTTP.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtAuthz {
    /// The authorization service, `<host>:<port>`; `None` uses the node default.
    pub server: Option<String>,
    /// Timeout of one check, in milliseconds.
    pub timeout_ms: u64,
}

/// A (service, port) kept as HTTP after its rows vanished with no evidence (spec/model.md §10).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RetainedPort {
    /// Namespace of the mesh service.
    pub namespace: String,
    /// The mesh service.
    pub service: String,
    /// The front port (a generated Service's port is the pod port).
    pub port: u16,
    /// When the loss was first seen, in milliseconds of the caller's clock.
    pub since_ms: u64,
}
