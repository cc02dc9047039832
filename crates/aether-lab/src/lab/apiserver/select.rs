//! Which objects a list or a watch covers: the type, the namespace of the path, and the
//! `labelSelector` (equality and existence) and `fieldSelector` (`metadata.name`,
//! `metadata.namespace`, `spec.nodeName`) of the query.

use serde_json::Value;

use super::api::{ApiError, Key};
use super::resources::ResourceType;

/// One requirement on a label or a field.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    /// Equal to the value (`a=b`, `a==b`).
    Equals(String, String),
    /// Absent or different (`a!=b`).
    Differs(String, String),
    /// Present (`a`).
    Exists(String),
    /// Absent (`!a`).
    Absent(String),
}

/// The fields a field selector may name, as the real server allows them for Pods (the only
/// kind the daemon selects by field).
const FIELDS: &[&str] = &["metadata.name", "metadata.namespace", "spec.nodeName"];

/// What a list or watch request covers.
#[derive(Clone, Debug)]
pub struct Filter {
    resource: ResourceType,
    namespace: Option<String>,
    labels: Vec<Requirement>,
    fields: Vec<Requirement>,
}

fn bad(message: String) -> ApiError {
    ApiError::new(400, "BadRequest", message)
}

fn parse(selector: &str, exists_allowed: bool) -> Result<Vec<Requirement>, ApiError> {
    let mut out = Vec::new();
    for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let req = if let Some((k, v)) = term.split_once("!=") {
            Requirement::Differs(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = term.split_once("==") {
            Requirement::Equals(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = term.split_once('=') {
            Requirement::Equals(k.trim().to_owned(), v.trim().to_owned())
        } else if term.contains(' ') || term.contains('(') {
            return Err(bad(format!(
                "unable to parse requirement {term:?}: only equality-based selectors are served by the lab's API server"
            )));
        } else if !exists_allowed {
            return Err(bad(format!("invalid field selector {term:?}")));
        } else if let Some(k) = term.strip_prefix('!') {
            Requirement::Absent(k.to_owned())
        } else {
            Requirement::Exists(term.to_owned())
        };
        out.push(req);
    }
    Ok(out)
}

fn holds(req: &Requirement, get: impl Fn(&str) -> Option<String>) -> bool {
    match req {
        Requirement::Equals(k, v) => get(k).as_deref() == Some(v.as_str()),
        Requirement::Differs(k, v) => get(k).as_deref() != Some(v.as_str()),
        Requirement::Exists(k) => get(k).is_some(),
        Requirement::Absent(k) => get(k).is_none(),
    }
}

fn key_of(req: &Requirement) -> &str {
    match req {
        Requirement::Equals(k, _)
        | Requirement::Differs(k, _)
        | Requirement::Exists(k)
        | Requirement::Absent(k) => k,
    }
}

impl Filter {
    /// Every object of `resource` in `namespace` (all namespaces for `None`).
    pub fn new(resource: ResourceType, namespace: Option<String>) -> Self {
        Self {
            resource,
            namespace,
            labels: Vec::new(),
            fields: Vec::new(),
        }
    }

    /// With the query's `labelSelector` and `fieldSelector`; a selector the fake cannot read is
    /// a `400 BadRequest`, never ignored.
    pub fn with_selectors(
        mut self,
        labels: Option<&str>,
        fields: Option<&str>,
    ) -> Result<Self, ApiError> {
        if let Some(l) = labels {
            self.labels = parse(l, true)?;
        }
        if let Some(f) = fields {
            self.fields = parse(f, false)?;
            if let Some(r) = self.fields.iter().find(|r| !FIELDS.contains(&key_of(r))) {
                return Err(bad(format!("field label not supported: {}", key_of(r))));
            }
        }
        Ok(self)
    }

    /// Whether an object under `key` is of this filter's type and namespace.
    pub fn covers(&self, key: &Key) -> bool {
        key.resource == self.resource
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| ns == key.namespace)
    }

    /// Whether the object's labels and fields satisfy the selectors.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let label = |k: &str| labels[k].as_str().map(str::to_owned);
        let field = |k: &str| {
            let v = match k {
                "metadata.name" => &object["metadata"]["name"],
                "metadata.namespace" => &object["metadata"]["namespace"],
                "spec.nodeName" => &object["spec"]["nodeName"],
                _ => &Value::Null,
            };
            // An absent field reads as the empty string, as on the real server.
            Some(v.as_str().unwrap_or("").to_owned())
        };
        self.labels.iter().all(|r| holds(r, label)) && self.fields.iter().all(|r| holds(r, field))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::lab::apiserver::resources::by_plural;

    fn pods() -> ResourceType {
        by_plural("", "pods").unwrap()
    }

    #[test]
    fn label_and_field_selectors_select_by_equality_inequality_and_existence() {
        let pod = json!({"metadata": {"name": "web-0", "namespace": "shop", "labels": {"app": "web"}},
                         "spec": {"nodeName": "node-a"}});
        let f = |l: Option<&str>, fs: Option<&str>| {
            Filter::new(pods(), None)
                .with_selectors(l, fs)
                .unwrap()
                .matches(&pod)
        };
        assert!(f(Some("app=web"), None));
        assert!(f(Some("app==web,!tier"), None));
        assert!(!f(Some("app!=web"), None));
        assert!(!f(Some("tier"), None));
        assert!(f(None, Some("spec.nodeName=node-a")));
        assert!(!f(None, Some("spec.nodeName=node-b")));
        assert!(f(
            None,
            Some("metadata.namespace=shop,metadata.name!=web-1")
        ));
    }

    #[test]
    fn a_selector_the_fake_cannot_read_is_refused_not_ignored() {
        let e = Filter::new(pods(), None)
            .with_selectors(Some("app in (web)"), None)
            .unwrap_err();
        assert_eq!(e.code, 400);
        let e = Filter::new(pods(), None)
            .with_selectors(None, Some("status.phase=Running"))
            .unwrap_err();
        assert_eq!((e.code, e.reason), (400, "BadRequest"));
    }
}
