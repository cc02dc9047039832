//! The `MeshFilter` resource (`aether.io/v1alpha1`): this project's allow-listed filter
//! configuration (routes.md §5), as it is written in manifests and stored by the API server.
//!
//! Plain serde data with `deny_unknown_fields`: a misspelt field is an error, never ignored.
//! [`super::convert::convert_mesh_filter`] checks the rest (exactly one configuration, ports,
//! durations) and produces a [`crate::model::snapshot::MeshFilter`]. The schema is documented in
//! `docs/mesh-filter.md` and published as `charts/aether/crds/meshfilter.yaml`.

use crate::prelude::*;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta as K8sObjectMeta;
use serde::{Deserialize, Serialize};

/// The resource's API group.
pub const MESH_FILTER_GROUP: &str = "aether.io";
/// The resource's `apiVersion`.
pub const MESH_FILTER_API_VERSION: &str = "aether.io/v1alpha1";
/// The resource's `kind`.
pub const MESH_FILTER_KIND: &str = "MeshFilter";

/// A whole `MeshFilter` object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MeshFilterResource {
    /// `aether.io/v1alpha1`.
    pub api_version: String,
    /// `MeshFilter`.
    pub kind: String,
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: K8sObjectMeta,
    /// The filter.
    pub spec: MeshFilterSpec,
    /// What the registrar wrote of it (`conditions`: `Accepted`); read leniently, never as
    /// policy, so that no status makes the filter undecodable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<MeshFilterStatus>,
}

/// The kind as Kubernetes clients name it (`aether.io/v1alpha1`, `meshfilters`, namespaced):
/// what lets the daemon's watch list and watch it (kube reads these traits).
impl k8s_openapi::Resource for MeshFilterResource {
    const API_VERSION: &'static str = MESH_FILTER_API_VERSION;
    const GROUP: &'static str = MESH_FILTER_GROUP;
    const KIND: &'static str = MESH_FILTER_KIND;
    const VERSION: &'static str = "v1alpha1";
    const URL_PATH_SEGMENT: &'static str = "meshfilters";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for MeshFilterResource {
    type Ty = K8sObjectMeta;

    fn metadata(&self) -> &K8sObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut K8sObjectMeta {
        &mut self.metadata
    }
}

/// `status`: the conditions the registrar writes (`registrar::filter_status`). Unknown fields
/// are ignored here, unlike in `spec`: a status is what a writer said, not policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MeshFilterStatus {
    /// The conditions, `Accepted` among them.
    #[serde(default)]
    pub conditions: Vec<MeshFilterCondition>,
}

/// One condition of [`MeshFilterStatus`] (a `metav1.Condition`, every field optional here).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MeshFilterCondition {
    /// `type`.
    #[serde(default, rename = "type")]
    pub kind: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default)]
    pub status: String,
    /// `reason`.
    #[serde(default)]
    pub reason: String,
    /// `message`.
    #[serde(default)]
    pub message: String,
    /// `observedGeneration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `lastTransitionTime`, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// `spec`: optional targets and exactly one configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MeshFilterSpec {
    /// Services in the filter's namespace it applies to as a service-wide filter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<MeshFilterTargetRef>,
    /// `header_mutation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_mutation: Option<HeaderMutationSpec>,
    /// `rbac`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rbac: Option<RbacSpec>,
    /// `ext_authz`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ext_authz: Option<ExtAuthzSpec>,
}

/// A target: always a Service (`group: ""`, `kind: Service`) in the filter's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MeshFilterTargetRef {
    /// `""` (the core group).
    pub group: String,
    /// `Service`.
    pub kind: String,
    /// The Service's name.
    pub name: String,
}

/// `headerMutation`: request headers, then query parameters, and response headers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HeaderMutationSpec {
    /// Request header changes.
    #[serde(default)]
    pub request: HeaderChanges,
    /// Query parameter changes, applied in order.
    #[serde(default)]
    pub query: Vec<QueryChange>,
    /// Response header changes.
    #[serde(default)]
    pub response: HeaderChanges,
}

/// Header changes, as the Gateway API header modifiers write them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HeaderChanges {
    /// Replace (or add) these headers.
    #[serde(default)]
    pub set: Vec<NameValue>,
    /// Append these headers.
    #[serde(default)]
    pub add: Vec<NameValue>,
    /// Drop these headers.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// A header or query parameter with its value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NameValue {
    /// The name.
    pub name: String,
    /// The value.
    pub value: String,
}

/// One query parameter change: exactly one of `{set: {name, value}}`, `{add: {name, value}}`
/// or `{remove: name}`.
///
/// A struct rather than an enum: a YAML serializer writes externally tagged enums as YAML tags
/// (`!set`), not as the one-key mappings a manifest uses. The conversion checks that exactly
/// one field is given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct QueryChange {
    /// Replace (or add) a parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<NameValue>,
    /// Append a parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add: Option<NameValue>,
    /// Remove every parameter of this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove: Option<String>,
}

/// `rbac`: allow or deny callers by ServiceAccount and namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RbacSpec {
    /// `Allow` or `Deny`.
    pub action: RbacActionSpec,
    /// The callers the rule matches.
    #[serde(default)]
    pub principals: Vec<PrincipalSpec>,
}

/// `rbac.action`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RbacActionSpec {
    /// Only matching callers pass.
    Allow,
    /// Matching callers are refused.
    Deny,
}

/// A caller pattern; an absent field matches any value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrincipalSpec {
    /// The caller's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The caller's ServiceAccount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
}

/// `extAuthz`: ask an external authorization service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtAuthzSpec {
    /// `<host>:<port>`; absent means the node default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// A Gateway API duration; 200ms when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}
