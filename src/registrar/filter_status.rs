//! The status of each MeshFilter (issue #35 item 1): the registrar, the holder of the Lease,
//! writes one condition, `Accepted`: `True` (reason `Accepted`) when the daemon reads the filter,
//! `False` (reason `Invalid`, the converter's words as the message) when it cannot, in which case
//! every Service the filter names refuses until it is fixed (docs/mesh-filter.md, "Status").
//!
//! Pure: [`wanted`] reads the watch's objects and the snapshot made of them; [`Wanted::written`]
//! says whether the object already holds it; [`Wanted::patch`] is the body of the write (a JSON
//! merge patch of `status`, sent by [`super::run`]). One writer (the Lease holder) keeps the nodes
//! from racing each other for one condition, which every node would compute alike.

use serde_json::{Value, json};

use crate::model::snapshot::{FilterConfig, Snapshot};
use crate::registry::kube::mesh_filter::MeshFilterStatus;
use crate::registry::kube::objects::Objects;

/// The condition's type.
pub const ACCEPTED: &str = "Accepted";

/// The longest message written (the CRD's bound on `message`).
const MESSAGE_MAX: usize = 32 * 1024;

/// The `Accepted` condition an object holds now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Its reason.
    pub reason: String,
    /// Its message.
    pub message: String,
    /// The generation it was written for.
    pub observed_generation: Option<i64>,
    /// When its status last changed, as written.
    pub last_transition_time: Option<String>,
}

/// The `Accepted` condition aether wants on one MeshFilter, and what it holds now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// The filter's namespace.
    pub namespace: String,
    /// The filter's name.
    pub name: String,
    /// `metadata.generation`: the condition's `observedGeneration`.
    pub generation: Option<i64>,
    /// The daemon reads it.
    pub accepted: bool,
    /// Why not, when it does not.
    pub message: String,
    /// The object's own condition: `None` when the object did not decode (its status is not
    /// known); `Some(None)` when it has none.
    pub held: Option<Option<Held>>,
}

impl Wanted {
    fn status(&self) -> &'static str {
        if self.accepted { "True" } else { "False" }
    }

    fn reason(&self) -> &'static str {
        if self.accepted { "Accepted" } else { "Invalid" }
    }

    /// Whether the object holds this condition already (`lastTransitionTime` aside); `None`
    /// when that is not known (the object did not decode).
    pub fn written(&self) -> Option<bool> {
        let held = self.held.as_ref()?;
        Some(held.as_ref().is_some_and(|h| {
            h.status == self.status()
                && h.reason == self.reason()
                && h.message == self.message
                && h.observed_generation == self.generation
        }))
    }

    /// The merge patch that writes it, `now` (RFC 3339) its transition time unless the held
    /// condition had the same status.
    pub fn patch(&self, now: &str) -> Value {
        let since = self
            .held
            .as_ref()
            .and_then(Option::as_ref)
            .filter(|h| h.status == self.status())
            .and_then(|h| h.last_transition_time.clone())
            .unwrap_or_else(|| now.to_owned());
        let mut condition = json!({
            "type": ACCEPTED,
            "status": self.status(),
            "reason": self.reason(),
            "message": self.message,
            "lastTransitionTime": since,
        });
        if let Some(g) = self.generation {
            condition["observedGeneration"] = json!(g);
        }
        json!({ "status": { "conditions": [condition] } })
    }
}

/// The `Accepted` condition in a status as the object holds it.
fn held_of(status: Option<&MeshFilterStatus>) -> Option<Held> {
    let c = status?.conditions.iter().find(|c| c.kind == ACCEPTED)?;
    Some(Held {
        status: c.status.clone(),
        reason: c.reason.clone(),
        message: c.message.clone(),
        observed_generation: c.observed_generation,
        last_transition_time: c.last_transition_time.clone(),
    })
}

/// A message within the CRD's bound, cut at a character.
fn bounded(mut message: String) -> String {
    if message.len() > MESSAGE_MAX {
        let mut end = MESSAGE_MAX;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

/// The condition of every MeshFilter the watch holds, decoded or not, in (namespace, name)
/// order: refused when the snapshot made of them keeps it as unreadable.
pub fn wanted(objects: &Objects, snapshot: &Snapshot) -> Vec<Wanted> {
    let why = |ns: &str, name: &str| {
        snapshot
            .mesh_filters
            .iter()
            .find(|f| f.namespace == ns && f.name == name)
            .and_then(|f| match &f.config {
                FilterConfig::Unreadable(u) => Some(u.why.clone()),
                _ => None,
            })
    };
    let mut out: Vec<Wanted> = Vec::new();
    for f in &objects.mesh_filters {
        let (Some(ns), Some(name)) = (&f.metadata.namespace, &f.metadata.name) else {
            continue;
        };
        let refused = why(ns, name);
        out.push(Wanted {
            namespace: ns.clone(),
            name: name.clone(),
            generation: f.metadata.generation,
            accepted: refused.is_none(),
            message: bounded(refused.unwrap_or_default()),
            held: Some(held_of(f.status.as_ref())),
        });
    }
    for u in &objects.undecodable_mesh_filters {
        out.push(Wanted {
            namespace: u.namespace.clone(),
            name: u.name.clone(),
            generation: u.generation,
            accepted: false,
            message: bounded(
                why(&u.namespace, &u.name).unwrap_or_else(|| format!("does not decode: {}", u.why)),
            ),
            held: None,
        });
    }
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::registry::kube::mesh_filter::MeshFilterResource;
    use crate::registry::kube::objects::{Undecodable, snapshot};

    fn filter(name: &str, server: &str, status: Option<Value>) -> Arc<MeshFilterResource> {
        let mut doc: Value = serde_json::from_value(json!({
            "apiVersion": "aether.io/v1alpha1",
            "kind": "MeshFilter",
            "metadata": {"name": name, "namespace": "mp", "generation": 2},
            "spec": {
                "targetRefs": [{"group": "", "kind": "Service", "name": "mp-nine"}],
                "extAuthz": {"server": server},
            },
        }))
        .unwrap();
        if let Some(s) = status {
            doc["status"] = s;
        }
        Arc::new(serde_json::from_value(doc).unwrap())
    }

    fn objects(filters: Vec<Arc<MeshFilterResource>>, undecodable: Vec<Undecodable>) -> Objects {
        Objects {
            mesh_filters: filters,
            undecodable_mesh_filters: undecodable,
            ..Objects::default()
        }
    }

    #[test]
    fn a_filter_the_daemon_cannot_read_is_not_accepted_and_says_why() {
        let o = objects(
            vec![
                filter("good", "mp-authz.mp.aether.internal:9191", None),
                filter("no-port", "mp-authz.mp.aether.internal", None),
            ],
            vec![Undecodable {
                namespace: "mp".into(),
                name: "garbled".into(),
                generation: Some(4),
                why: "unknown field `sever`".into(),
            }],
        );
        let (s, _) = snapshot(&o);
        let w = wanted(&o, &s);
        let by = |n: &str| w.iter().find(|x| x.name == n).unwrap();
        assert!(by("good").accepted);
        assert_eq!(by("good").written(), Some(false));
        let no_port = by("no-port");
        assert!(!no_port.accepted);
        assert!(
            no_port.message.contains("extAuthz.server"),
            "{}",
            no_port.message
        );
        let p = no_port.patch("2026-12-06T00:00:00Z");
        let c = &p["status"]["conditions"][0];
        assert_eq!(
            (
                c["type"].as_str(),
                c["status"].as_str(),
                c["reason"].as_str()
            ),
            (Some("Accepted"), Some("False"), Some("Invalid"))
        );
        assert_eq!(c["observedGeneration"], 2);
        let garbled = by("garbled");
        assert!(!garbled.accepted);
        assert!(garbled.message.contains("sever"), "{}", garbled.message);
        // Its status is not known: the writer decides from what it wrote itself.
        assert_eq!(garbled.written(), None);
    }

    #[test]
    fn a_condition_held_already_is_not_written_again_and_keeps_its_transition_time() {
        let held = json!({"conditions": [{
            "type": "Accepted", "status": "False", "reason": "Invalid",
            "message": "PLACEHOLDER", "observedGeneration": 2,
            "lastTransitionTime": "2026-12-01T00:00:00Z",
        }]});
        let first = objects(vec![filter("no-port", "mp-authz", None)], vec![]);
        let (s, _) = snapshot(&first);
        let message = wanted(&first, &s)[0].message.clone();
        let text = serde_json::to_string(&held)
            .unwrap()
            .replace("PLACEHOLDER", &message.replace('"', "\\\""));
        let o = objects(
            vec![filter(
                "no-port",
                "mp-authz",
                Some(serde_json::from_str(&text).unwrap()),
            )],
            vec![],
        );
        let (s, _) = snapshot(&o);
        let w = &wanted(&o, &s)[0];
        assert_eq!(w.written(), Some(true));
        // Were it written again, the status did not change: the transition time stays.
        assert_eq!(
            w.patch("2026-12-06T00:00:00Z")["status"]["conditions"][0]["lastTransitionTime"],
            "2026-12-01T00:00:00Z"
        );
        // Fixed: accepted, a new transition time.
        let fixed = objects(
            vec![filter(
                "no-port",
                "mp-authz:9191",
                Some(serde_json::from_str(&text).unwrap()),
            )],
            vec![],
        );
        let (s, _) = snapshot(&fixed);
        let w = &wanted(&fixed, &s)[0];
        assert_eq!(w.written(), Some(false));
        let c = &w.patch("2026-12-06T00:00:00Z")["status"]["conditions"][0];
        assert_eq!(
            (c["status"].as_str(), c["lastTransitionTime"].as_str()),
            (Some("True"), Some("2026-12-06T00:00:00Z"))
        );
    }
}
