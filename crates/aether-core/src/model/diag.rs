//! What the compiler refused, dropped or noticed, as values (STYLE.md §6.4).
//!
//! Layer 0 (pure).

use crate::prelude::*;

use serde::{Deserialize, Serialize};

/// One thing the compiler refused or dropped, and why. Never an error: the model encodes the
/// consequence (a refusing entry, a row not served), and the diagnostic says what happened.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Diagnostic {
    /// A stable kind, counted in `aether_model_diagnostics{kind}`.
    pub kind: DiagnosticKind,
    /// What it is about (`<ns>/<name>`, a row's address, a route).
    pub subject: String,
    /// The details, for the operator.
    pub detail: String,
}

/// The stable kinds of [`Diagnostic`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DiagnosticKind {
    /// A row failed `RowProblem` and is not served.
    RowRefused,
    /// A pod's annotations could not be parsed.
    PodRefused,
    /// A row declares a reserved port; the port is ignored.
    ReservedPort,
    /// The rows of a service disagree on a port's protocol.
    ClassDisagreement,
    /// Rows of more than one mesh service claim one pod IP: nobody's until one goes
    /// (docs/security.md, "An address two rows claim").
    DuplicateAddress,
    /// A route, parent or backend the compiler could not model.
    Route,
    /// A MeshFilter that targets nothing the model knows, or a bad reference.
    Filter,
    /// An `inbound.aether.io/mode` that is neither `strict` nor `permissive`: the pod is strict.
    InboundMode,
    /// A service-level `ext_authz` guards pods with raw-TCP ports: it is defined per HTTP request,
    /// so connections to those ports are refused (model.md §12.5 item 2).
    ExtAuthzOnTcp,
    /// A MeshFilter the source could not read: the Services it names refuse (issue #35 item 1).
    FilterUnreadable,
    /// A route the source could not read: its parents refuse what it would have routed.
    RouteUnreadable,
    /// An object whose name, namespace or ServiceAccount Kubernetes would refuse: not served.
    InvalidName,
    /// Pods that name one network namespace (`aether.io/netns`): none of them is served.
    NetnsShared,
}

impl DiagnosticKind {
    /// Every kind, for tables and counters.
    pub const ALL: [Self; 13] = [
        Self::RowRefused,
        Self::PodRefused,
        Self::ReservedPort,
        Self::ClassDisagreement,
        Self::DuplicateAddress,
        Self::Route,
        Self::Filter,
        Self::InboundMode,
        Self::ExtAuthzOnTcp,
        Self::FilterUnreadable,
        Self::RouteUnreadable,
        Self::InvalidName,
        Self::NetnsShared,
    ];

    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RowRefused => "row-refused",
            Self::PodRefused => "pod-refused",
            Self::ReservedPort => "reserved-port",
            Self::ClassDisagreement => "class-disagreement",
            Self::DuplicateAddress => "duplicate-address",
            Self::Route => "route",
            Self::Filter => "filter",
            Self::InboundMode => "inbound-mode",
            Self::ExtAuthzOnTcp => "ext-authz-on-tcp",
            Self::FilterUnreadable => "filter-unreadable",
            Self::RouteUnreadable => "route-unreadable",
            Self::InvalidName => "invalid-name",
            Self::NetnsShared => "netns-shared",
        }
    }
}

impl Diagnostic {
    /// A new diagnostic.
    pub fn new(
        kind: DiagnosticKind,
        subject: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            subject: subject.into(),
            detail: detail.into(),
        }
    }
}
