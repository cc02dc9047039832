//! The pods' container environment, read from the manifest texts.
//!
//! The registry's [`aether_core::model::snapshot::Pod`] carries a pod's command but not its `env`, so
//! the lab reads the first container's `env` of every Pod document itself. Pure: it parses texts
//! that [`crate::lab::read_pod_env`] has read. Documents that are not Pods, or that the registry
//! would reject, are passed over here: the registry's load reports them.

use serde_json::Value;

use crate::lab::plan::{EnvValue, PodEnv};

fn text<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(value, |v, k| v.get(k))?.as_str()
}

/// The environment of every Pod in `texts` (each a whole manifest file).
pub fn parse_pod_env<'a>(texts: impl IntoIterator<Item = &'a str>) -> PodEnv {
    let mut out = PodEnv::new();
    for file in texts {
        // Up to a document that does not read: the registry's load reports it.
        for doc in aether::yaml::documents_of(file).0 {
            if text(&doc, &["kind"]) != Some("Pod") || text(&doc, &["apiVersion"]) != Some("v1") {
                continue;
            }
            let Some(name) = text(&doc, &["metadata", "name"]) else {
                continue;
            };
            let namespace = text(&doc, &["metadata", "namespace"]).unwrap_or("default");
            let vars = doc
                .get("spec")
                .and_then(|s| s.get("containers"))
                .and_then(|c| c.get(0))
                .and_then(|c| c.get("env"))
                .and_then(Value::as_array)
                .map(|seq| seq.iter().filter_map(env_var).collect())
                .unwrap_or_default();
            out.insert((namespace.to_owned(), name.to_owned()), vars);
        }
    }
    out
}

fn env_var(v: &Value) -> Option<(String, EnvValue)> {
    let name = text(v, &["name"])?.to_owned();
    if let Some(path) = text(v, &["valueFrom", "fieldRef", "fieldPath"]) {
        return Some((name, EnvValue::FieldRef(path.to_owned())));
    }
    let value = match v.get("value") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(_) => return None,
    };
    Some((name, EnvValue::Literal(value)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_refs_and_plain_values_are_read_from_the_first_container() {
        let text = r#"
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: shop}
spec:
  containers:
  - name: app
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: MODE
      value: fast
    - name: EMPTY
---
apiVersion: v1
kind: Service
metadata: {name: a, namespace: shop}
---
apiVersion: v1
kind: Pod
metadata: {name: b}
spec: {containers: [{name: app}]}
"#;
        let env = parse_pod_env([text]);
        assert_eq!(
            env.get(&("shop".to_owned(), "a".to_owned())).unwrap(),
            &vec![
                (
                    "POD_NAME".to_owned(),
                    EnvValue::FieldRef("metadata.name".to_owned())
                ),
                ("MODE".to_owned(), EnvValue::Literal("fast".to_owned())),
                ("EMPTY".to_owned(), EnvValue::Literal(String::new())),
            ]
        );
        assert_eq!(
            env.get(&("default".to_owned(), "b".to_owned())),
            Some(&Vec::new())
        );
        assert_eq!(env.len(), 2);
    }
}
