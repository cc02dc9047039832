//! A Pod as the mesh reads it (pure): the fields [`super::convert::convert_pod`] reads and
//! nothing else, decoded straight from the API server's JSON.
//!
//! Every node holds every pod of the cluster, so what one stored pod costs is most of the
//! daemon's memory (issue #37: 4,150 bytes a pod held as a trimmed `k8s_openapi` `Pod`, whose
//! spec alone takes about 1.3 KiB inline however little of it is kept). A [`MeshPod`] is decoded
//! with serde skipping what it does not name (containers, volumes, statuses, managed fields are
//! parsed over, never allocated), and then trimmed to what a conversion reads:
//!
//! - metadata ([`PodMeta`], not an `ObjectMeta`): name, namespace, resourceVersion, whether it
//!   is terminating (and the labels only when the file registry made it from a manifest: the
//!   model reads a pod's labels there, never on this source, whose EndpointSlices say which pods
//!   back a Service);
//! - the mesh's own annotations (`aether.io/…`, `*.aether.io/…`), as a sorted list rather than the
//!   metadata's map, whose first node is 540 bytes however few entries it has;
//! - `spec.serviceAccountName`, `spec.nodeName`, `spec.hostNetwork`;
//! - `status.podIP(s)`, `status.hostIP(s)`, and the `Ready` condition (type and status).
//!
//! Invariants:
//! - A field it keeps decodes as `k8s_openapi` decodes it (the same names and types; a missing
//!   required string, such as a `podIPs` entry without `ip`, is empty, as there); `apiVersion`
//!   and `kind`, when present, must be `v1` and `Pod`.
//!   A field it does not read is not checked: a pod whose containers do not decode is still
//!   served (the mesh reads nothing of them).
//! - Every list is held at its length (no spare room).
//! - A watch decodes an [`ApiPod`] (a `Resource`, in `watch.rs`: the watch reads its
//!   resourceVersion), whose store keeps the [`MeshPod`] inside alone.
//! - Pure: no IO, and no crate but serde and k8s-openapi (`tests/purity.rs`).

use crate::prelude::*;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod as K8sPod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::{self, Deserializer};

/// A Pod as the mesh reads it (module docs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MeshPod {
    /// What it keeps of `metadata`.
    pub metadata: PodMeta,
    /// The mesh's annotations, sorted by key (each key once).
    pub annotations: Box<[(String, String)]>,
    /// What it keeps of the spec.
    pub spec: Option<MeshPodSpec>,
    /// What it keeps of the status.
    pub status: Option<MeshPodStatus>,
    /// The first container's command and arguments: the file registry's lab pods name the
    /// program they run; never read from the API server.
    pub command: Vec<String>,
}

impl MeshPod {
    /// `(namespace, name, resourceVersion)`, each empty when not set: what a fingerprint and a
    /// watch's bookkeeping read of a pod.
    pub fn version(&self) -> (&str, &str, &str) {
        let meta = &self.metadata;
        (
            meta.namespace.as_deref().unwrap_or(""),
            meta.name.as_deref().unwrap_or(""),
            meta.resource_version.as_deref().unwrap_or(""),
        )
    }
}

/// What a [`MeshPod`] keeps of `metadata`: not an `ObjectMeta`, whose fifteen fields take
/// 360 bytes however few are set. The annotations are in [`MeshPod::annotations`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodMeta {
    /// `metadata.name`.
    pub name: Option<String>,
    /// `metadata.namespace`.
    pub namespace: Option<String>,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
    /// `metadata.deletionTimestamp` is set: the pod is terminating.
    pub deleting: bool,
    /// `metadata.labels`: only from the file registry (module docs).
    pub labels: Option<BTreeMap<String, String>>,
}

/// A pod as the API server sends it, decoded for a watch: a [`MeshPod`] under the metadata the
/// watch reads (name, namespace, resourceVersion). The store keeps the [`MeshPod`] alone
/// ([`ApiPod::into_pod`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApiPod {
    metadata: ObjectMeta,
    pod: MeshPod,
}

/// A pod as Kubernetes clients name it (`v1`, `pods`, namespaced): what lets the daemon's watch
/// list and watch it (kube reads these traits).
impl k8s_openapi::Resource for ApiPod {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Pod";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "pods";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for ApiPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl ApiPod {
    /// The pod the store keeps.
    pub fn into_pod(self) -> MeshPod {
        self.pod
    }

    /// The metadata the watch reads (name, namespace, resourceVersion).
    pub fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    /// [`Self::metadata`], to change.
    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }

    /// [`Self::into_pod`] of a shared pod: the pod moved out when this is the only holder (as
    /// when the watch hands it to the store), copied otherwise.
    pub fn shared_into_pod(this: Arc<Self>) -> Arc<MeshPod> {
        Arc::new(Arc::try_unwrap(this).map_or_else(|this| this.pod.clone(), Self::into_pod))
    }
}

/// What a [`MeshPod`] keeps of `spec`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MeshPodSpec {
    /// `spec.serviceAccountName`.
    pub service_account_name: Option<String>,
    /// `spec.nodeName`.
    pub node_name: Option<String>,
    /// `spec.hostNetwork`.
    pub host_network: Option<bool>,
}

/// What a [`MeshPod`] keeps of `status`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MeshPodStatus {
    /// `status.podIP`.
    #[serde(rename = "podIP")]
    pub pod_ip: Option<String>,
    /// `status.podIPs`.
    #[serde(rename = "podIPs")]
    pub pod_ips: Option<Vec<Address>>,
    /// `status.hostIP`.
    #[serde(rename = "hostIP")]
    pub host_ip: Option<String>,
    /// `status.hostIPs`.
    #[serde(rename = "hostIPs")]
    pub host_ips: Option<Vec<Address>>,
    /// `status.conditions`: the `Ready` one alone, once decoded.
    pub conditions: Option<Vec<Condition>>,
}

/// One entry of `status.podIPs` or `status.hostIPs`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Address {
    /// The address as written (empty when missing, as `k8s_openapi` reads it; it then does not
    /// parse as an address).
    #[serde(default)]
    pub ip: String,
}

/// One pod condition: its type and status.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Condition {
    /// `type` (empty when missing, as `k8s_openapi` reads it).
    #[serde(rename = "type", default)]
    pub type_: String,
    /// `status` (`True`, `False`, `Unknown`; empty when missing: not Ready).
    #[serde(default)]
    pub status: String,
}

impl MeshPod {
    /// The mesh annotation `key`, when the pod has it.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| self.annotations[i].1.as_str())
    }

    /// The node the pod is scheduled on.
    pub fn node_name(&self) -> Option<&str> {
        self.spec.as_ref().and_then(|s| s.node_name.as_deref())
    }

    /// Keep of `metadata` only what a conversion reads (module docs), the list held at its
    /// length. Labels are dropped unless `keep_labels`.
    fn trim(metadata: ObjectMeta, keep_labels: bool) -> (PodMeta, Box<[(String, String)]>) {
        // From a map: sorted, each key once.
        let annotations: Vec<(String, String)> = metadata
            .annotations
            .into_iter()
            .flatten()
            .filter(|(k, _)| is_mesh_annotation(k))
            .collect();
        let meta = PodMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            resource_version: metadata.resource_version,
            deleting: metadata.deletion_timestamp.is_some(),
            labels: metadata.labels.filter(|_| keep_labels),
        };
        (meta, annotations.into_boxed_slice())
    }
}

impl MeshPodStatus {
    fn trim(mut self) -> Self {
        fn fit<T>(v: Option<Vec<T>>) -> Option<Vec<T>> {
            v.map(|mut v| {
                v.shrink_to_fit();
                v
            })
        }
        self.pod_ips = fit(self.pod_ips);
        self.host_ips = fit(self.host_ips);
        self.conditions = fit(self
            .conditions
            .map(|c| c.into_iter().filter(|c| c.type_ == "Ready").collect()));
        self
    }
}

/// Whether an annotation key is one of the mesh's (`aether.io/…`, `endpoint.aether.io/…`,
/// `capture.aether.io/…`, `inbound.aether.io/…`): the only ones a pod conversion reads.
fn is_mesh_annotation(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(prefix, _)| prefix == "aether.io" || prefix.ends_with(".aether.io"))
}

impl<'de> Deserialize<'de> for ApiPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire {
            api_version: Option<String>,
            kind: Option<String>,
            #[serde(default)]
            metadata: ObjectMeta,
            spec: Option<MeshPodSpec>,
            status: Option<MeshPodStatus>,
        }
        let wire = Wire::deserialize(deserializer)?;
        if let Some(v) = wire.api_version.filter(|v| v != "v1") {
            return Err(de::Error::invalid_value(de::Unexpected::Str(&v), &"v1"));
        }
        if let Some(k) = wire.kind.filter(|k| k != "Pod") {
            return Err(de::Error::invalid_value(de::Unexpected::Str(&k), &"Pod"));
        }
        let watched = ObjectMeta {
            name: wire.metadata.name.clone(),
            namespace: wire.metadata.namespace.clone(),
            resource_version: wire.metadata.resource_version.clone(),
            ..ObjectMeta::default()
        };
        let (metadata, annotations) = MeshPod::trim(wire.metadata, false);
        Ok(Self {
            metadata: watched,
            pod: MeshPod {
                metadata,
                annotations,
                spec: wire.spec,
                status: wire.status.map(MeshPodStatus::trim),
                command: Vec::new(),
            },
        })
    }
}

impl<'de> Deserialize<'de> for MeshPod {
    /// As a watch decodes it ([`ApiPod`]).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ApiPod::deserialize(deserializer).map(ApiPod::into_pod)
    }
}

impl From<&K8sPod> for MeshPod {
    /// What the file registry converts: its manifest's pod, labels and command kept.
    fn from(pod: &K8sPod) -> Self {
        let (metadata, annotations) = Self::trim(pod.metadata.clone(), true);
        let spec = pod.spec.as_ref();
        let command = spec
            .and_then(|s| s.containers.first())
            .map(|c| {
                c.command
                    .iter()
                    .flatten()
                    .chain(c.args.iter().flatten())
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let status = pod.status.as_ref().map(|s| {
            MeshPodStatus {
                pod_ip: s.pod_ip.clone(),
                pod_ips: s
                    .pod_ips
                    .as_ref()
                    .map(|v| v.iter().map(|a| Address { ip: a.ip.clone() }).collect()),
                host_ip: s.host_ip.clone(),
                host_ips: s
                    .host_ips
                    .as_ref()
                    .map(|v| v.iter().map(|a| Address { ip: a.ip.clone() }).collect()),
                conditions: s.conditions.as_ref().map(|c| {
                    c.iter()
                        .map(|c| Condition {
                            type_: c.type_.clone(),
                            status: c.status.clone(),
                        })
                        .collect()
                }),
            }
            .trim()
        });
        Self {
            metadata,
            annotations,
            spec: spec.map(|s| MeshPodSpec {
                service_account_name: s.service_account_name.clone(),
                node_name: s.node_name.clone(),
                host_network: s.host_network,
            }),
            status,
            command,
        }
    }
}

#[cfg(test)]
mod tests;
