//! `MeshFilter` resources to [`MeshFilter`] values (routes.md §5).
//!
//! Pure. Serde has already refused unknown fields; this adds the checks a schema cannot make
//! alone: exactly one configuration, targets that are Services, `host:port` and durations.

use crate::prelude::*;

use super::{ConvertError, duration_ms, namespaced_key, ns};
use crate::model::snapshot::{
    ExtAuthz, FilterConfig, HeaderModifier, HeaderMutation, MeshFilter, Principal, QueryMutation,
    Rbac, RbacAction, Unreadable,
};
use crate::registry::kube::mesh_filter::{HeaderChanges, MeshFilterResource, RbacActionSpec};

/// The timeout of one external authorization check when `extAuthz.timeout` is absent.
pub const DEFAULT_EXT_AUTHZ_TIMEOUT_MS: u64 = 200;

fn header_modifier(changes: &HeaderChanges) -> HeaderModifier {
    HeaderModifier {
        set: changes
            .set
            .iter()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect(),
        add: changes
            .add
            .iter()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect(),
        remove: changes.remove.clone(),
    }
}

/// Whether `server` is `<host>:<port>` with a non-empty host and a port in 1–65535.
fn is_host_port(server: &str) -> bool {
    let Some((host, port)) = server.rsplit_once(':') else {
        return false;
    };
    let host_ok =
        !host.is_empty() && (!host.contains(':') || (host.starts_with('[') && host.ends_with(']')));
    let port_ok = !port.is_empty()
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u16>().is_ok_and(|p| p != 0);
    host_ok && port_ok
}

/// What the model keeps of a `MeshFilter` that [`convert_mesh_filter`] refused (issue #35 item
/// 1): a filter that could be an authorization the node would skip, so wherever it applies it
/// refuses, and its namespace and name still resolve an `ExtensionRef` to it. Its targets are
/// the Services it names when every `targetRef` reads as one; otherwise it may guard any Service
/// of its namespace, and guards them all. `None` when it has no namespace or name: nothing can
/// name it, and the source reports it as a bad object.
pub fn unreadable_mesh_filter(
    filter: &MeshFilterResource,
    error: &ConvertError,
) -> Option<MeshFilter> {
    let key = namespaced_key("MeshFilter", &filter.metadata).ok()?;
    let refs = &filter.spec.target_refs;
    let readable = refs
        .iter()
        .all(|t| t.group.is_empty() && t.kind == "Service" && !t.name.is_empty());
    Some(MeshFilter {
        namespace: ns(&key),
        name: key.name,
        target_refs: if readable {
            refs.iter().map(|t| t.name.clone()).collect()
        } else {
            Vec::new()
        },
        config: FilterConfig::Unreadable(Unreadable {
            why: error.to_string(),
            whole_namespace: !readable,
        }),
    })
}

/// What the model keeps of a `MeshFilter` that did not even decode (a document its wire type
/// refuses): only its namespace and name are known, so it guards every Service of its namespace
/// ([`unreadable_mesh_filter`]).
pub fn undecodable_mesh_filter(namespace: &str, name: &str, why: &str) -> MeshFilter {
    MeshFilter {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        target_refs: Vec::new(),
        config: FilterConfig::Unreadable(Unreadable {
            why: format!("MeshFilter {namespace}/{name} does not decode: {why}"),
            whole_namespace: true,
        }),
    }
}

/// Converts a `MeshFilter` resource: exactly one of `headerMutation`, `rbac` and `extAuthz`.
pub fn convert_mesh_filter(filter: &MeshFilterResource) -> Result<MeshFilter, ConvertError> {
    let key = namespaced_key("MeshFilter", &filter.metadata)?;
    let spec = &filter.spec;
    let mut target_refs = Vec::new();
    for (i, t) in spec.target_refs.iter().enumerate() {
        let bad = |field: &str, value: &str, expected: &'static str| ConvertError::InvalidValue {
            object: key.boxed(),
            field: format!("spec.targetRefs[{i}].{field}"),
            value: value.to_owned(),
            expected,
        };
        if !t.group.is_empty() {
            return Err(bad("group", &t.group, "\"\" (the core group)"));
        }
        if t.kind != "Service" {
            return Err(bad("kind", &t.kind, "Service"));
        }
        if t.name.is_empty() {
            return Err(ConvertError::MissingField {
                object: Box::new(key),
                field: format!("spec.targetRefs[{i}].name"),
            });
        }
        target_refs.push(t.name.clone());
    }
    let count = usize::from(spec.header_mutation.is_some())
        + usize::from(spec.rbac.is_some())
        + usize::from(spec.ext_authz.is_some());
    let config = match (&spec.header_mutation, &spec.rbac, &spec.ext_authz) {
        (Some(h), None, None) => {
            let mut query = Vec::new();
            for (i, q) in h.query.iter().enumerate() {
                query.push(match (&q.set, &q.add, &q.remove) {
                    (Some(nv), None, None) => QueryMutation::Set(nv.name.clone(), nv.value.clone()),
                    (None, Some(nv), None) => QueryMutation::Add(nv.name.clone(), nv.value.clone()),
                    (None, None, Some(name)) => QueryMutation::Remove(name.clone()),
                    _ => {
                        let given: Vec<&str> = [
                            q.set.as_ref().map(|_| "set"),
                            q.add.as_ref().map(|_| "add"),
                            q.remove.as_ref().map(|_| "remove"),
                        ]
                        .into_iter()
                        .flatten()
                        .collect();
                        return Err(ConvertError::InvalidValue {
                            object: Box::new(key),
                            field: format!("spec.headerMutation.query[{i}]"),
                            value: given.join(", "),
                            expected: "exactly one of set, add, remove",
                        });
                    }
                });
            }
            FilterConfig::HeaderMutation(HeaderMutation {
                request: header_modifier(&h.request),
                query,
                response: header_modifier(&h.response),
            })
        }
        (None, Some(r), None) => FilterConfig::Rbac(Rbac {
            action: match r.action {
                RbacActionSpec::Allow => RbacAction::Allow,
                RbacActionSpec::Deny => RbacAction::Deny,
            },
            principals: r
                .principals
                .iter()
                .map(|p| Principal {
                    namespace: p.namespace.clone(),
                    service_account: p.service_account.clone(),
                })
                .collect(),
        }),
        (None, None, Some(e)) => {
            if let Some(server) = e.server.as_deref().filter(|s| !is_host_port(s)) {
                return Err(ConvertError::InvalidValue {
                    object: Box::new(key),
                    field: "spec.extAuthz.server".into(),
                    value: server.to_owned(),
                    expected: "<host>:<port> with a port in 1-65535",
                });
            }
            let timeout_ms = match e.timeout.as_deref() {
                Some(t) => duration_ms(&key, "spec.extAuthz.timeout", t)?,
                None => DEFAULT_EXT_AUTHZ_TIMEOUT_MS,
            };
            FilterConfig::ExtAuthz(ExtAuthz {
                server: e.server.clone(),
                timeout_ms,
            })
        }
        _ => {
            return Err(ConvertError::FilterConfigCount {
                object: Box::new(key),
                count,
            });
        }
    };
    Ok(MeshFilter {
        namespace: ns(&key),
        name: key.name.clone(),
        target_refs,
        config,
    })
}
