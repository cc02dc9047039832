//! The resource types the fake API server serves, and how a request path names one.
//!
//! Objects are keyed by (API group, resource plural), never by version: a client may ask for any
//! version and gets the object with `apiVersion` rewritten to it (the fake converts nothing
//! else; the daemon's kinds read the same at every version it asks for).

use std::fmt;

/// One resource type: where it lives in the API and what its objects are called.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceType {
    /// The API group (`""` for the core group).
    pub group: &'static str,
    /// The resource's plural, as in paths (`pods`).
    pub plural: &'static str,
    /// The kind of its objects (`Pod`).
    pub kind: &'static str,
    /// Whether its objects live in a namespace.
    pub namespaced: bool,
}

impl ResourceType {
    /// `core` for the core group, else the group: how the control API names a group.
    pub fn group_name(&self) -> &'static str {
        if self.group.is_empty() {
            "core"
        } else {
            self.group
        }
    }

    /// The `apiVersion` of this type at `version`: `v1`, or `<group>/<version>`.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_owned()
        } else {
            format!("{}/{version}", self.group)
        }
    }
}

impl fmt::Display for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            f.write_str(self.plural)
        } else {
            write!(f, "{}.{}", self.plural, self.group)
        }
    }
}

const fn rt(
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> ResourceType {
    ResourceType {
        group,
        plural,
        kind,
        namespaced,
    }
}

const GATEWAY: &str = "gateway.networking.k8s.io";

/// Every type served: the eleven the daemon watches
/// ([`aether::registry::kube::objects::WATCHED_KINDS`]), ServiceAccounts (in the manifests),
/// Leases (the registrar's election) and DaemonSets (what the CNI installer asks for its own at
/// stop, [`aether::cni::owner`]).
pub const RESOURCES: &[ResourceType] = &[
    rt("", "pods", "Pod", true),
    rt("", "services", "Service", true),
    rt("discovery.k8s.io", "endpointslices", "EndpointSlice", true),
    rt("", "namespaces", "Namespace", false),
    rt(GATEWAY, "httproutes", "HTTPRoute", true),
    rt(GATEWAY, "grpcroutes", "GRPCRoute", true),
    rt(GATEWAY, "tlsroutes", "TLSRoute", true),
    rt(GATEWAY, "tcproutes", "TCPRoute", true),
    rt(GATEWAY, "udproutes", "UDPRoute", true),
    rt(GATEWAY, "referencegrants", "ReferenceGrant", true),
    rt("aether.io", "meshfilters", "MeshFilter", true),
    rt("", "serviceaccounts", "ServiceAccount", true),
    rt("coordination.k8s.io", "leases", "Lease", true),
    rt("apps", "daemonsets", "DaemonSet", true),
];

/// The type with this group and plural.
pub fn by_plural(group: &str, plural: &str) -> Option<ResourceType> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.plural == plural)
        .copied()
}

/// The type of a manifest's `apiVersion` and `kind` (any version of the group).
pub fn by_kind(api_version: &str, kind: &str) -> Option<ResourceType> {
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.kind == kind)
        .copied()
}

/// What a request path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiPath {
    /// The type.
    pub resource: ResourceType,
    /// The version the client asked for.
    pub version: String,
    /// The namespace, for a namespaced path (`None`: every namespace, or a cluster-scoped type).
    pub namespace: Option<String>,
    /// The object's name (`None`: the collection).
    pub name: Option<String>,
    /// The `/status` subresource.
    pub status: bool,
}

/// Why a path names no served resource.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPath {
    /// Not under `/api/v1` or `/apis/<group>/<version>`.
    #[error("not an API path")]
    NotApi,
    /// A group and plural the fake does not serve.
    #[error("the server could not find the requested resource {group}/{plural}")]
    UnknownResource {
        /// The group.
        group: String,
        /// The plural.
        plural: String,
    },
    /// A namespaced path of a cluster-scoped type, or a subresource other than `status`.
    #[error("the server could not find the requested resource")]
    Shape,
}

/// Parses `/api/v1/...` and `/apis/<group>/<version>/...`:
/// `<plural>`, `namespaces/<ns>/<plural>[/<name>[/status]]` and, for cluster-scoped types,
/// `<plural>/<name>[/status]`.
pub fn parse_path(path: &str) -> Result<ApiPath, InvalidPath> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(InvalidPath::NotApi),
    };
    if rest.is_empty() || rest.iter().any(|p| p.is_empty()) {
        return Err(InvalidPath::NotApi);
    }
    let lookup = |plural: &str| {
        by_plural(group, plural).ok_or_else(|| InvalidPath::UnknownResource {
            group: group.to_owned(),
            plural: plural.to_owned(),
        })
    };
    // `namespaces/<ns>/<plural>...` names a namespaced type; `namespaces[/<name>[/status]]`
    // the Namespaces themselves.
    if let (true, ["namespaces", name, "status"]) = (group.is_empty(), rest) {
        return Ok(ApiPath {
            resource: lookup("namespaces")?,
            version: version.to_owned(),
            namespace: None,
            name: Some((*name).to_owned()),
            status: true,
        });
    }
    let (resource, namespace, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..] => {
            let r = lookup(plural)?;
            if !r.namespaced {
                return Err(InvalidPath::Shape);
            }
            (r, Some((*ns).to_owned()), tail)
        }
        [plural, tail @ ..] => (lookup(plural)?, None, tail),
        [] => return Err(InvalidPath::NotApi),
    };
    let (name, status) = match tail {
        [] => (None, false),
        [name] => (Some((*name).to_owned()), false),
        [name, "status"] => (Some((*name).to_owned()), true),
        _ => return Err(InvalidPath::Shape),
    };
    // A namespaced object is addressed in its namespace; only collections span all of them.
    if resource.namespaced && namespace.is_none() && name.is_some() {
        return Err(InvalidPath::Shape);
    }
    Ok(ApiPath {
        resource,
        version: version.to_owned(),
        namespace,
        name,
        status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_collections_objects_and_status_in_any_version() {
        let p = parse_path("/api/v1/pods").unwrap();
        assert_eq!((p.resource.kind, p.namespace, p.name), ("Pod", None, None));
        let p =
            parse_path("/apis/gateway.networking.k8s.io/v1beta1/namespaces/mp/httproutes/r/status")
                .unwrap();
        assert_eq!(p.resource.kind, "HTTPRoute");
        assert_eq!(p.version, "v1beta1");
        assert_eq!(p.namespace.as_deref(), Some("mp"));
        assert_eq!(p.name.as_deref(), Some("r"));
        assert!(p.status);
        let p = parse_path("/api/v1/namespaces/mp").unwrap();
        assert_eq!(
            (p.resource.kind, p.name.as_deref()),
            ("Namespace", Some("mp"))
        );
        let p = parse_path("/api/v1/namespaces/mp/status").unwrap();
        assert_eq!(
            (p.resource.kind, p.name.as_deref(), p.status),
            ("Namespace", Some("mp"), true)
        );
        let p = parse_path("/api/v1/namespaces").unwrap();
        assert_eq!((p.resource.kind, p.name), ("Namespace", None));
        assert_eq!(
            p.resource.api_version("v1"),
            "v1",
            "the core group has no group part"
        );
    }

    #[test]
    fn unknown_resources_and_wrong_shapes_are_not_served() {
        assert!(matches!(
            parse_path("/api/v1/secrets"),
            Err(InvalidPath::UnknownResource { .. })
        ));
        assert_eq!(parse_path("/healthz"), Err(InvalidPath::NotApi));
        assert_eq!(
            parse_path("/api/v1/pods/web-0"),
            Err(InvalidPath::Shape),
            "a namespaced object needs its namespace"
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/mp/pods/web-0/exec"),
            Err(InvalidPath::Shape)
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/mp/namespaces"),
            Err(InvalidPath::Shape)
        );
    }

    #[test]
    fn a_manifest_kind_is_found_by_its_group_whatever_the_version() {
        assert_eq!(
            by_kind("gateway.networking.k8s.io/v1alpha2", "TCPRoute").map(|r| r.plural),
            Some("tcproutes")
        );
        assert_eq!(by_kind("v1", "Pod").map(|r| r.plural), Some("pods"));
        assert_eq!(by_kind("apps/v1", "Deployment"), None);
    }
}
