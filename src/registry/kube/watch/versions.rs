//! Which version of a kind the API server is asked for (issue #36 item 2).
//!
//! The typed Gateway API kinds are compiled at one version each (ReferenceGrant and TLSRoute at
//! `v1`), and a server that served them only at `v1beta1` or `v1alpha2` answered `404`: the
//! daemon said "not installed" and silently ignored every grant and TLSRoute. Now, before each
//! list of such a kind, discovery says where the kind is served (`GET /apis/<group>` and
//! `/apis/<group>/<version>`): the compiled version when it is served, else the group's
//! preferred version, else any served version, among the versions whose schema this build reads
//! the same way ([`Versions::readable`]). A list or watch then goes to that version's path, and
//! its objects deserialize as the compiled type (their fields are the same; `apiVersion` is
//! not checked by the derived types).
//!
//! A kind served only at versions this build cannot read is a problem, not an absence: the
//! kind is not synced, so the node does not become ready (fail closed), and `/ready` says
//! which versions the server has. A server with no discovery answer for the group is asked
//! at the compiled version, as before.

use http::Uri;
use serde::Deserialize;

/// The versions one kind can be read at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Versions {
    /// Its API group.
    pub group: &'static str,
    /// Its plural (the path segment).
    pub plural: &'static str,
    /// The version its type is compiled at.
    pub compiled: &'static str,
    /// Every version whose objects deserialize as the compiled type, the compiled one first.
    pub readable: &'static [&'static str],
}

const GATEWAY: &str = "gateway.networking.k8s.io";

/// The versions of `kind`, for the kinds whose group serves several; `None` for the core and
/// discovery kinds and MeshFilter, which have one.
pub fn of(kind: &str) -> Option<Versions> {
    let v = |plural, compiled, readable| Versions {
        group: GATEWAY,
        plural,
        compiled,
        readable,
    };
    Some(match kind {
        "HTTPRoute" => v("httproutes", "v1", &["v1", "v1beta1"]),
        "GRPCRoute" => v("grpcroutes", "v1", &["v1", "v1alpha2"]),
        "TLSRoute" => v("tlsroutes", "v1", &["v1", "v1alpha3", "v1alpha2"]),
        "TCPRoute" => v("tcproutes", "v1alpha2", &["v1alpha2"]),
        "UDPRoute" => v("udproutes", "v1alpha2", &["v1alpha2"]),
        "ReferenceGrant" => v("referencegrants", "v1", &["v1", "v1beta1", "v1alpha2"]),
        _ => return None,
    })
}

/// Where the server serves a kind, as discovery says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Served {
    /// Ask at this version.
    At(String),
    /// Served, but only at versions this build cannot read (listed).
    Unreadable(Vec<String>),
    /// Not served at any version (or discovery did not answer): ask at the compiled version,
    /// whose `404` says the kind is absent.
    Nowhere,
}

/// `GET /apis/<group>`.
#[derive(Debug, Deserialize)]
pub struct ApiGroup {
    #[serde(default)]
    versions: Vec<GroupVersion>,
    #[serde(rename = "preferredVersion")]
    preferred: Option<GroupVersion>,
}

#[derive(Debug, Deserialize)]
struct GroupVersion {
    version: String,
}

/// `GET /apis/<group>/<version>`.
#[derive(Debug, Deserialize)]
pub struct ResourceList {
    #[serde(default)]
    resources: Vec<ApiResource>,
}

#[derive(Debug, Deserialize)]
struct ApiResource {
    name: String,
}

impl Versions {
    /// The versions of the group to look at, in the order of choice: the compiled one, the
    /// preferred one, then the rest as the server lists them.
    pub fn candidates(&self, group: &ApiGroup) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let listed: Vec<&str> = group.versions.iter().map(|v| v.version.as_str()).collect();
        let mut push = |v: &str| {
            if listed.contains(&v) && !out.iter().any(|o| o == v) {
                out.push(v.to_owned());
            }
        };
        push(self.compiled);
        if let Some(p) = &group.preferred {
            push(&p.version);
        }
        for v in &listed {
            push(v);
        }
        out
    }

    /// The choice among `served` (the versions, in [`Versions::candidates`] order, whose
    /// resource list names the kind).
    pub fn choose(&self, served: &[String]) -> Served {
        if let Some(v) = served.iter().find(|v| self.readable.contains(&v.as_str())) {
            return Served::At(v.clone());
        }
        if served.is_empty() {
            Served::Nowhere
        } else {
            Served::Unreadable(served.to_vec())
        }
    }

    /// Whether a version's resource list names the kind.
    pub fn listed_in(&self, list: &ResourceList) -> bool {
        list.resources.iter().any(|r| r.name == self.plural)
    }

    /// `uri` asked at `version` instead of the compiled one.
    pub fn rewrite(&self, uri: &Uri, version: &str) -> Option<Uri> {
        let from = format!("/apis/{}/{}/", self.group, self.compiled);
        let path = uri.path().strip_prefix(&from)?;
        let path_and_query = match uri.query() {
            Some(q) => format!("/apis/{}/{version}/{path}?{q}", self.group),
            None => format!("/apis/{}/{version}/{path}", self.group),
        };
        let mut parts = uri.clone().into_parts();
        parts.path_and_query = Some(path_and_query.parse().ok()?);
        Uri::from_parts(parts).ok()
    }

    /// What `/ready` says of a kind served only at versions this build cannot read.
    pub fn problem(&self, kind: &str, served: &[String]) -> String {
        format!(
            "{kind}: served at {} only, which this build cannot read (it reads {}): no pod is served until it is",
            served.join(", "),
            self.readable.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(versions: &[&str], preferred: &str) -> ApiGroup {
        serde_json::from_value(serde_json::json!({
            "versions": versions.iter().map(|v| serde_json::json!({"groupVersion": format!("{GATEWAY}/{v}"), "version": v})).collect::<Vec<_>>(),
            "preferredVersion": {"groupVersion": format!("{GATEWAY}/{preferred}"), "version": preferred},
        }))
        .unwrap()
    }

    #[test]
    fn the_compiled_version_first_then_the_preferred_then_any_readable() {
        let grants = of("ReferenceGrant").unwrap();
        let g = group(&["v1beta1", "v1alpha2"], "v1beta1");
        assert_eq!(grants.candidates(&g), ["v1beta1", "v1alpha2"]);
        assert_eq!(
            grants.choose(&["v1beta1".into(), "v1alpha2".into()]),
            Served::At("v1beta1".into())
        );
        let g = group(&["v1", "v1beta1"], "v1beta1");
        assert_eq!(grants.candidates(&g), ["v1", "v1beta1"]);
        let tls = of("TLSRoute").unwrap();
        assert_eq!(
            tls.choose(&["v9".into()]),
            Served::Unreadable(vec!["v9".into()])
        );
        assert_eq!(tls.choose(&[]), Served::Nowhere);
        assert!(of("Pod").is_none());
    }

    #[test]
    fn a_path_is_asked_at_the_chosen_version() {
        let grants = of("ReferenceGrant").unwrap();
        let uri: Uri = "https://k:6443/apis/gateway.networking.k8s.io/v1/referencegrants?limit=500"
            .parse()
            .unwrap();
        assert_eq!(
            grants.rewrite(&uri, "v1beta1").unwrap().to_string(),
            "https://k:6443/apis/gateway.networking.k8s.io/v1beta1/referencegrants?limit=500"
        );
        let other: Uri = "/api/v1/pods".parse().unwrap();
        assert_eq!(grants.rewrite(&other, "v1beta1"), None);
    }
}
