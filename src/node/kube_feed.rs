//! The Kubernetes source feeding the kept model by changes (issue #37).
//!
//! Each watch records the keys it applied or deleted ([`KubeSource::take_changes`]); a load
//! converts only those objects, as the stores hold them now, and gives the kept model their
//! changes: O(change) from the store to the published model. The objects are read whole (every
//! store converted, the result compared with what the kept model holds, only what differs
//! applied) at the first load, after a relist of any kind, and while MeshFilters may not be read
//! (each new service then gets an unreadable filter: `unseen`).
//!
//! Besides the objects, a load keeps what the node derives from them: the problem of each
//! object left out (logged when it appears or changes, counted in
//! `aether_registry_objects_skipped`), and the rows that serve each service, the evidence
//! retention asks for (spec/model.md §10): a change recomputes the retained ports of the services
//! it touched, and of the services that retain a port (they expire by the clock), only.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::warn;

use crate::model::live::{Applied, Change, Kind, Live, Object, ObjectKey};
use crate::model::port::PortProtocol;
use crate::model::retention::generated_has_real_ports;
use crate::model::rows::{row_problem, served_protocols};
use crate::model::snapshot::{FilterConfig, MeshFilter, RetainedPort, Row, Service, Unreadable};
use crate::model::vote::Tally;
use crate::model::{Model, NodeContext};
use crate::registry::kube::convert::keyed::Watched;
use crate::registry::kube::watch::{KubeSource, ObjectChanges};

use super::retain::ServiceName;

/// What the node keeps of the Kubernetes source between loads.
#[derive(Debug, Default)]
pub struct KubeFeed {
    /// The kept model holds the stores as of a load: a change may be applied alone.
    filled: bool,
    /// The line logged of each object left out or kept as unreadable, by kind and key.
    problems: HashMap<(Watched, String), String>,
    /// How many rows that serve (no row problem) each service has.
    serving: HashMap<ServiceName, u32>,
    /// The registrar's vote of each mesh service (spec/model.md §8): its registered rows and
    /// the tally of each port, from which its generated Service is made.
    votes: HashMap<ServiceName, Votes>,
    /// The services known when MeshFilters last became unreadable (`unseen`).
    baseline: Option<BTreeSet<(String, String)>>,
    /// Each object's part of the stores' fingerprint, and their sum: the fingerprint of what
    /// the kept model holds (`objects::fingerprint` of the same stores).
    prints: HashMap<(Watched, String), u64>,
    fingerprint: u64,
}

/// What one load did.
#[derive(Debug)]
pub struct Fed {
    /// What the kept model did.
    pub applied: Applied,
    /// The retention state it was compiled with.
    pub retained: Vec<RetainedPort>,
    /// Objects left out or kept as unreadable.
    pub skipped: usize,
    /// The objects were read whole.
    pub whole: bool,
    /// Every object the load took was a pod (of what the writers read, only the registrar's
    /// desired Services can then have changed: `desired_changed`).
    pub only_pods: bool,
    /// The fingerprint of the objects the kept model now holds.
    pub fingerprint: u64,
    /// The generated Services the rows call for (the registrar's desired Services) may have
    /// changed: always after a whole read; otherwise when a touched service's vote changed.
    pub desired_changed: bool,
}

/// One mesh service's registered rows and the tally of each port they declare.
#[derive(Debug, Default)]
struct Votes {
    rows: u32,
    tallies: BTreeMap<u16, Tally>,
}

/// What a generated Service is made of: whether there is one, and each port's winner.
type Shape = (bool, Vec<(u16, Option<PortProtocol>)>);

impl Votes {
    /// What the generated Service is made of.
    fn shape(&self) -> Shape {
        (
            self.rows > 0,
            self.tallies
                .iter()
                .filter(|(_, t)| !t.is_empty())
                .map(|(&p, t)| (p, t.winner()))
                .collect(),
        )
    }
}

impl KubeFeed {
    /// Gives `kept` what changed in the stores since the last load, compiled with `ctx`.
    /// `previous` is the published model and its retention state (none at the first load).
    pub fn load(
        &mut self,
        kube: &KubeSource,
        kept: &mut Live,
        ctx: &NodeContext,
        previous: Option<(&Model, &[RetainedPort])>,
    ) -> Fed {
        let taken = kube.take_changes();
        let refused = kube
            .kinds()
            .iter()
            .any(|k| k.kind == "MeshFilter" && k.forbidden.load(Ordering::Acquire));
        let whole = !self.filled || taken.resync || refused || self.baseline.is_some();
        let only_pods = !whole && taken.keys.iter().all(|(kind, _, _)| *kind == Watched::Pod);
        let objects = if whole {
            kube.all_changes()
        } else {
            kube.changes_of(&taken.keys)
        };
        self.note_problems(&objects, whole);
        self.note_prints(&objects, whole);
        let mut changes: Vec<Change> = objects.into_iter().flat_map(|o| o.changes).collect();
        if whole {
            let unseen = self.unseen(refused, previous.map(|(m, _)| m), &changes);
            changes.extend(unseen);
        }

        // The rows that serve each service, and the services this change touched.
        let mut touched: BTreeSet<ServiceName> = BTreeSet::new();
        if whole {
            self.serving.clear();
            self.votes.clear();
        }
        // The generated Service's shape of each service whose vote this load changes, before.
        let mut shapes: HashMap<ServiceName, Shape> = HashMap::new();
        let mut services: HashMap<ServiceName, Option<&Service>> = HashMap::new();
        for c in &changes {
            match c.key.kind {
                Kind::Row => {
                    if !whole && let Some(Object::Row(old)) = kept.get(&c.key) {
                        touched.insert(count(&mut self.serving, old, false));
                        self.vote(old, false, ctx, &mut shapes);
                    }
                    if let Some(Object::Row(new)) = &c.object {
                        touched.insert(count(&mut self.serving, new, true));
                        self.vote(new, true, ctx, &mut shapes);
                    }
                }
                Kind::Service => {
                    if let Some((ns, name)) = c.key.name.split_once('/') {
                        let now = match &c.object {
                            Some(Object::Service(s)) => Some(&**s),
                            _ => None,
                        };
                        services.insert((ns.into(), name.into()), now);
                        touched.insert((ns.into(), name.into()));
                    }
                }
                _ => {}
            }
        }

        // Retention (spec/model.md §10), for the services it may have changed.
        let (retained, retained_changes) =
            super::retain::by_change(touched, previous, whole, ctx.now_ms, |ns, name| {
                let key: ServiceName = (ns.into(), name.into());
                let service = match services.get(&key) {
                    Some(now) => *now,
                    None if whole => None,
                    None => match kept.get(&ObjectKey {
                        kind: Kind::Service,
                        name: format!("{ns}/{name}").into(),
                    }) {
                        Some(Object::Service(s)) => Some(&**s),
                        _ => None,
                    },
                };
                self.serving.get(&key).is_some_and(|&n| n > 0)
                    || service.is_some_and(generated_has_real_ports)
            });
        drop(services);
        changes.extend(retained_changes);

        let desired_changed = whole
            || shapes.iter().any(|(name, before)| {
                self.votes
                    .get(name)
                    .map_or((false, Vec::new()), Votes::shape)
                    != *before
            });
        let first = kept.is_empty();
        let settings = kept.set_context(ctx.clone());
        let changes = if whole {
            kept.changes_against(changes)
        } else {
            changes
        };
        let applied = settings.and(kept.apply(changes));
        self.filled = true;
        Fed {
            applied: Applied {
                full: applied.full || first,
                ..applied
            },
            retained,
            skipped: self.problems.len(),
            whole,
            only_pods,
            fingerprint: self.fingerprint,
            desired_changed,
        }
    }

    /// Counts `row`'s vote in or out of its service's (the registrar's input: a row of an
    /// ignored namespace, or refused, makes no Service); notes the service's shape before its
    /// first change in this load.
    fn vote(
        &mut self,
        row: &Row,
        add: bool,
        ctx: &NodeContext,
        shapes: &mut HashMap<ServiceName, Shape>,
    ) {
        if ctx.ignored_namespaces.contains(&row.namespace) || row_problem(row).is_some() {
            return;
        }
        let name: ServiceName = (row.namespace.as_str().into(), row.service.as_str().into());
        let votes = self.votes.entry(name.clone()).or_default();
        shapes.entry(name.clone()).or_insert_with(|| votes.shape());
        for (&port, &p) in &served_protocols(row) {
            let t = votes.tallies.entry(port).or_default();
            if add {
                t.add(p);
            } else {
                t.remove(p);
            }
        }
        if add {
            votes.rows += 1;
        } else {
            votes.rows = votes.rows.saturating_sub(1);
            votes.tallies.retain(|_, t| !t.is_empty());
            if votes.rows == 0 {
                self.votes.remove(&name);
            }
        }
    }

    /// Keeps each object's part of the fingerprint, and their sum.
    fn note_prints(&mut self, objects: &[ObjectChanges], whole: bool) {
        if whole {
            self.prints.clear();
            self.fingerprint = 0;
        }
        for o in objects {
            let key = (o.kind, o.key.clone());
            if let Some(old) = self.prints.remove(&key) {
                self.fingerprint = self.fingerprint.wrapping_sub(old);
            }
            if let Some(new) = o.fingerprint {
                self.fingerprint = self.fingerprint.wrapping_add(new);
                self.prints.insert(key, new);
            }
        }
    }

    /// Keeps each object's problem; logs one that is new or changed.
    fn note_problems(&mut self, objects: &[ObjectChanges], whole: bool) {
        let before = if whole {
            std::mem::take(&mut self.problems)
        } else {
            HashMap::new()
        };
        for o in objects {
            let key = (o.kind, o.key.clone());
            let Some(line) = &o.problem else {
                self.problems.remove(&key);
                continue;
            };
            let was = if whole {
                before.get(&key)
            } else {
                self.problems.get(&key)
            };
            if was != Some(line) {
                warn!(problem = %line, "registry object left out, or kept as unreadable (logged again only if it changes)");
            }
            self.problems.insert(key, line.clone());
        }
    }

    /// While MeshFilters may not be read (a `403` after the first list, docs/kubernetes.md), a
    /// MeshFilter written since for a service is not seen: a service that appeared since then
    /// would be served without the authorization its owner may have written for it. So each
    /// service (mesh service or Service) that the model of the refusal's start did not hold gets
    /// an unreadable filter (issue #35 item 1): it refuses `403 authz-unavailable` until
    /// MeshFilters are read again. The baseline holds the services known when the refusal was
    /// first seen.
    fn unseen(&mut self, refused: bool, previous: Option<&Model>, all: &[Change]) -> Vec<Change> {
        if !refused {
            self.baseline = None;
            return Vec::new();
        }
        let known = self.baseline.get_or_insert_with(|| {
            previous
                .map(|m| {
                    m.service_ports()
                        .into_iter()
                        .map(|(k, _)| (k.namespace.to_string(), k.name.to_string()))
                        .collect()
                })
                .unwrap_or_default()
        });
        let mut new: BTreeSet<(String, String)> = BTreeSet::new();
        for c in all {
            let name = match &c.object {
                Some(Object::Row(r)) => (r.namespace.clone(), r.service.clone()),
                Some(Object::Service(s)) => (s.namespace.clone(), s.name.clone()),
                _ => continue,
            };
            if !known.contains(&name) {
                new.insert(name);
            }
        }
        new.into_iter()
            .map(|(namespace, name)| {
                Change::put(
                    format!("unseen:{namespace}/{name}"),
                    Object::MeshFilter(Box::new(MeshFilter {
                        name: format!("unseen-while-meshfilters-refused.{name}"),
                        target_refs: vec![name],
                        namespace,
                        config: FilterConfig::Unreadable(Unreadable {
                            why: "MeshFilters may not be read (403) and this service appeared since: a MeshFilter written for it would not be seen".into(),
                            whole_namespace: false,
                        }),
                    })),
                )
            })
            .collect()
    }
}

/// Counts `row` in or out of its service's serving rows; its service.
fn count(serving: &mut HashMap<ServiceName, u32>, row: &Arc<Row>, add: bool) -> ServiceName {
    let name: ServiceName = (row.namespace.as_str().into(), row.service.as_str().into());
    if row_problem(row).is_none() {
        let n = serving.entry(name.clone()).or_insert(0);
        if add {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                serving.remove(&name);
            }
        }
    }
    name
}
