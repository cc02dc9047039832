//! What the compiler refused, dropped or noticed, as values (STYLE.md §6.4).
//!
//! Layer 0 (pure).

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
    /// Two rows share one pod IP; the later is ignored for pod-IP dials.
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
}

impl DiagnosticKind {
    /// Every kind, for tables and counters.
    pub const ALL: [Self; 9] = [
        Self::RowRefused,
        Self::PodRefused,
        Self::ReservedPort,
        Self::ClassDisagreement,
        Self::DuplicateAddress,
        Self::Route,
        Self::Filter,
        Self::InboundMode,
        Self::ExtAuthzOnTcp,
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
