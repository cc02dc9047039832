//! What the model compiles a destination into: mesh services ([`ServiceKey`]), their endpoints,
//! the raw-TCP and HTTP backends a port or route rule sends to, the service line a 421 refusal
//! describes, and why ([`Why`]).
//!
//! These are the model's own types: `resolve` hands them out in its decisions and re-exports them
//! from `resolve::decision` and `resolve::answer`, but they are defined here so that `model`
//! never names `resolve` (ARCHITECTURE.md "Who may import whom"; the purity check enforces it).
//!
//! Layer 0 (pure): plain data.

use crate::prelude::*;

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The capture mode of the pod a connection comes from (spec/model.md §12.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum CaptureMode {
    /// All outbound TCP is captured.
    RedirectAll,
    /// Only TCP to 18081 and 18082 (and UDP to 18082).
    Scoped,
}

/// A mesh service: one ServiceAccount in one namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ServiceKey {
    /// Namespace.
    pub namespace: Arc<str>,
    /// Name (the ServiceAccount, or a user Service's name).
    pub name: Arc<str>,
}

impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One pod a delivery may go to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Endpoint {
    /// The pod IP (the mesh hop goes to `<address>:18008`).
    pub address: IpAddr,
    /// The pod's name, when known.
    pub pod: Option<Arc<str>>,
    /// The node it runs on, when known.
    pub node: Option<Arc<str>>,
    /// The pod's own mesh service (its ServiceAccount): routes.md §5.5 item 3.
    pub mesh_service: ServiceKey,
}

/// One endpoint a passthrough may be carried to (model.md §12.5 item 1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct L4Endpoint {
    /// Its address.
    pub address: IpAddr,
    /// The pod port.
    pub port: u16,
    /// The mesh service of the served pod at `address` when it declares `port`: the bytes
    /// cross the mesh hop to it. `None`: not the mesh's, reached directly.
    pub mesh: Option<ServiceKey>,
}

/// Where a raw-TCP connection goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TcpTarget {
    /// The Service (or the pod's mesh service) the bytes go to.
    pub service: ServiceKey,
    /// The port the client reached (the dialled port, or the legacy target for 18082).
    pub port: u16,
    /// The pod port the bytes are delivered to.
    pub pod_port: u16,
    /// The endpoints to choose from (one, for a pod-IP dial).
    pub endpoints: Arc<[Endpoint]>,
    /// What decided it, for explain and logs.
    pub why: Why,
}

/// A raw-TCP choice: the default destination or a TCPRoute's weighted backends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TcpChoice {
    /// The weighted destinations; a single entry for the default destination. Shared: a
    /// decision clones it with a reference count, never a copy.
    pub backends: Arc<[(u32, TcpBackend)]>,
}

/// One destination of a raw-TCP choice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum TcpBackend {
    /// Deliver to these endpoints.
    Target(TcpTarget),
    /// The share of an invalid backendRef: the connection is closed.
    Invalid(Why),
}

/// The backend a delivery goes to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HttpBackend {
    /// The backend Service (or the dialled pod's mesh service).
    pub service: ServiceKey,
    /// Its front port (`None` for a pod-IP dial).
    pub port: Option<u16>,
    /// The pod port the request reaches.
    pub pod_port: u16,
    /// The endpoints to choose from.
    pub endpoints: Arc<[Endpoint]>,
    /// Reach the application as h2c (`appProtocol: kubernetes.io/h2c`).
    pub h2c: bool,
}

/// What decided an answer: the rule of the spec and the declaration behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Why {
    /// The rule of the spec (e.g. `addressing.md §5 C2`).
    pub rule: &'static str,
    /// The facts, in words. Static on the hot paths: the service, ports and endpoints are in
    /// the decision itself.
    pub detail: Cow<'static, str>,
}

impl Why {
    /// A reason with detail.
    pub fn new(rule: &'static str, detail: impl Into<Cow<'static, str>>) -> Self {
        Self {
            rule,
            detail: detail.into(),
        }
    }
}

/// The service a 421 refusal describes: its mesh name and its `ports:` line.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ServiceLine {
    /// The mesh name of the service (`<svc>.<ns>.<mesh-domain>`).
    pub name: Arc<str>,
    /// The ports, ascending, `<port>/<class>` joined by one space.
    pub ports: Arc<str>,
}
