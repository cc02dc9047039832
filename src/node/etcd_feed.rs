//! The etcd source feeding the kept model by changes (issue #37).
//!
//! The rows are etcd's: the table notes the identity (namespace, service, address) that each put
//! or delete names ([`crate::registry::etcd::Table::take_changes`]), and a load gives the kept
//! model those rows alone. The registrar's part (spec/model.md §8: the generated Service of each
//! mesh service, deterministic ClusterIPs) is worked out again for the services those rows are
//! of; the ClusterIPs of every Service only when a generated Service came or went (an address is
//! the first free one from a slot its name gives, so one Service more may move another's). The
//! manifest directory (Services, routes, filters; this node's pods) is read whole: at the first
//! load, after it changed, and after etcd was listed again (a compaction, a new connection that
//! lost its revision), which is a resync.
//!
//! The feed keeps what the registrar reads between loads: the directory's Services as read,
//! the Services as completed, and the rows by service. The property the tests hold it to: after
//! any sequence of changes, the kept model equals the one a whole read of the same directory and
//! rows compiles (`etcd_feed_tests.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::retain::{ServiceName, by_change};
use crate::model::live::{Change, Kind, Object};
use crate::model::registrar::{allocate_cluster_ips, generated_services_except};
use crate::model::retention::generated_has_real_ports;
use crate::model::rows::row_problem;
use crate::model::snapshot::{RetainedPort, Row, Service, ServicePort, Snapshot};
use crate::model::{Model, NodeContext};
use crate::registry::etcd::RowId;

/// What the node keeps of the etcd source between loads.
#[derive(Debug, Default)]
pub struct EtcdFeed {
    /// Filled by a whole read: a change may be applied alone.
    filled: bool,
    /// The directory's fingerprint at its last read.
    fingerprint: u64,
    /// The directory's Services as completed (its generated ones with the ports the rows give
    /// them), each with its key in the kept model and whether its addresses were allocated.
    dir: Vec<DirService>,
    /// The first of the directory's Services of each name.
    first: HashMap<ServiceName, usize>,
    /// The first of the directory's generated Services of each name (retention's evidence).
    first_generated: HashMap<ServiceName, usize>,
    /// Names a user Service of the directory owns: the registrar makes nothing for them.
    user_owned: HashSet<ServiceName>,
    /// The generated Services the registrar added (no directory Service has their name).
    added: BTreeMap<ServiceName, Service>,
    /// The rows, by mesh service.
    rows: HashMap<ServiceName, BTreeMap<IpAddr, Arc<Row>>>,
}

/// One of the directory's Services.
#[derive(Debug)]
struct DirService {
    /// Its key in the kept model (`namespace/name`; `#n` for the n-th of one name).
    key: Arc<str>,
    /// As completed.
    service: Service,
    /// Its own ports, as the directory gives them (a generated Service the rows no longer
    /// call for keeps them).
    ports: Vec<ServicePort>,
    /// It had no ClusterIP and is not headless: its address is allocated.
    allocated: bool,
}

/// What a load by changes gives the kept model.
#[derive(Debug)]
pub struct Fed {
    /// The changes: rows, Services, retained ports.
    pub changes: Vec<Change>,
    /// The retention state the model is compiled with.
    pub retained: Vec<RetainedPort>,
}

impl EtcdFeed {
    /// Whether a whole read filled it.
    pub fn filled(&self) -> bool {
        self.filled
    }

    /// The directory's fingerprint at its last read.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Keeps what a whole read gave: `read` is the directory's Services before the registrar
    /// completed them, `completed` the snapshot as compiled (the same Services first, the
    /// generated ones added after them, then ClusterIPs allocated; etcd's rows).
    pub fn fill(&mut self, read: &[Service], completed: &Snapshot, fingerprint: u64) {
        let name =
            |s: &Service| -> ServiceName { (s.namespace.as_str().into(), s.name.as_str().into()) };
        self.first.clear();
        self.first_generated.clear();
        self.user_owned.clear();
        self.dir.clear();
        let mut seen: HashMap<ServiceName, usize> = HashMap::new();
        for (i, (before, after)) in read.iter().zip(&completed.services).enumerate() {
            let n = name(before);
            let count = seen.entry(n.clone()).or_insert(0);
            *count += 1;
            // As `live::keyed` keys them: the n-th Service of one name is `name#n`.
            let key: Arc<str> = if *count == 1 {
                format!("{}/{}", before.namespace, before.name).into()
            } else {
                format!("{}/{}#{}", before.namespace, before.name, count).into()
            };
            if before.generated {
                self.first_generated.entry(n.clone()).or_insert(i);
            } else {
                self.user_owned.insert(n.clone());
            }
            self.first.entry(n).or_insert(i);
            self.dir.push(DirService {
                key,
                service: after.clone(),
                ports: before.ports.clone(),
                allocated: before.cluster_ips.is_empty() && !before.headless,
            });
        }
        self.added = completed.services[read.len().min(completed.services.len())..]
            .iter()
            .map(|s| (name(s), s.clone()))
            .collect();
        self.rows.clear();
        for row in &completed.rows {
            self.rows
                .entry((row.namespace.as_str().into(), row.service.as_str().into()))
                .or_default()
                .insert(row.address, row.clone());
        }
        self.fingerprint = fingerprint;
        self.filled = true;
    }

    /// The kept model's changes for `rows` (each row's identity and the row served now, or
    /// none), the Services the registrar makes of them, and the retained ports (spec/model.md
    /// §10) of the services they touched. `previous` is the published model and its retention
    /// state.
    pub fn changes(
        &mut self,
        rows: Vec<(RowId, Option<Arc<Row>>)>,
        ctx: &NodeContext,
        cidr: IpNet,
        previous: Option<(&Model, &[RetainedPort])>,
    ) -> Fed {
        let mut changes = Vec::new();
        let mut touched: BTreeSet<ServiceName> = BTreeSet::new();
        for ((namespace, service, address), row) in rows {
            let name: ServiceName = (namespace.as_str().into(), service.as_str().into());
            let held = self.rows.entry(name.clone()).or_default();
            let key = format!("{namespace}/{service}@{address}");
            match row {
                Some(row) => {
                    if held.get(&address).is_some_and(|h| **h == *row) {
                        continue;
                    }
                    held.insert(address, row.clone());
                    changes.push(Change::put(key, Object::Row(row)));
                }
                None => {
                    if held.remove(&address).is_none() {
                        continue;
                    }
                    if held.is_empty() {
                        self.rows.remove(&name);
                    }
                    changes.push(Change::delete(Kind::Row, key));
                }
            }
            touched.insert(name);
        }
        changes.extend(self.services_of(&touched, ctx, cidr));
        let (retained, retained_changes) =
            by_change(touched, previous, false, ctx.now_ms, |ns, name| {
                self.evidence(ns, name)
            });
        changes.extend(retained_changes);
        Fed { changes, retained }
    }

    /// The Service changes the registrar makes for the `touched` services' rows.
    fn services_of(
        &mut self,
        touched: &BTreeSet<ServiceName>,
        ctx: &NodeContext,
        cidr: IpNet,
    ) -> Vec<Change> {
        let mut changed: BTreeSet<ServiceName> = BTreeSet::new();
        let mut came_or_went = false;
        for name in touched {
            if self.user_owned.contains(name) {
                continue;
            }
            let generated = self.generated(name, ctx);
            if let Some(&i) = self.first.get(name) {
                // A generated Service of the directory: the rows give its ports, or it keeps
                // its own.
                let d = &mut self.dir[i];
                let ports = generated.map_or_else(|| d.ports.clone(), |g| g.ports);
                if d.service.ports != ports {
                    d.service.ports = ports;
                    changed.insert(name.clone());
                }
                continue;
            }
            match (self.added.get_mut(name), generated) {
                (Some(held), Some(g)) => {
                    if held.ports != g.ports {
                        held.ports = g.ports;
                        changed.insert(name.clone());
                    }
                }
                (Some(_), None) => {
                    self.added.remove(name);
                    changed.insert(name.clone());
                    came_or_went = true;
                }
                (None, Some(g)) => {
                    self.added.insert(name.clone(), g);
                    changed.insert(name.clone());
                    came_or_went = true;
                }
                (None, None) => {}
            }
        }
        let mut out = Vec::new();
        let mut dir_changed: BTreeSet<usize> = changed
            .iter()
            .filter_map(|n| self.first.get(n).copied())
            .collect();
        if came_or_went {
            self.allocate(cidr, &mut changed, &mut dir_changed);
        }
        for i in dir_changed {
            let d = &self.dir[i];
            out.push(Change::put(
                d.key.clone(),
                Object::Service(Box::new(d.service.clone())),
            ));
        }
        for name in changed.iter().filter(|n| !self.first.contains_key(*n)) {
            let key = format!("{}/{}", name.0, name.1);
            out.push(match self.added.get(name) {
                Some(s) => Change::put(key, Object::Service(Box::new(s.clone()))),
                None => Change::delete(Kind::Service, key),
            });
        }
        out
    }

    /// The generated Service `name`'s rows call for, without addresses.
    fn generated(&self, name: &ServiceName, ctx: &NodeContext) -> Option<Service> {
        let rows = self.rows.get(name)?;
        let one = Snapshot {
            rows: rows.values().cloned().collect(),
            ..Snapshot::default()
        };
        generated_services_except(&one, &ctx.ignored_namespaces)
            .0
            .pop()
    }

    /// Every Service's allocated address worked out again (a generated Service came or went);
    /// the Services whose addresses moved are added to `changed` (added ones) and
    /// `dir_changed` (the directory's).
    fn allocate(
        &mut self,
        cidr: IpNet,
        changed: &mut BTreeSet<ServiceName>,
        dir_changed: &mut BTreeSet<usize>,
    ) {
        // Only what the allocation reads: names, addresses, headless.
        let bare = |s: &Service, allocated: bool| Service {
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            cluster_ips: if allocated {
                Vec::new()
            } else {
                s.cluster_ips.clone()
            },
            headless: s.headless,
            generated: s.generated,
            selector: None,
            ports: Vec::new(),
        };
        let mut all: Vec<Service> = self
            .dir
            .iter()
            .map(|d| bare(&d.service, d.allocated))
            .chain(self.added.values().map(|s| bare(s, true)))
            .collect();
        allocate_cluster_ips(&mut all, cidr);
        let (dir, added) = all.split_at(self.dir.len());
        for (i, (d, now)) in self.dir.iter_mut().zip(dir).enumerate() {
            if d.service.cluster_ips != now.cluster_ips {
                d.service.cluster_ips.clone_from(&now.cluster_ips);
                dir_changed.insert(i);
            }
        }
        for ((name, s), now) in self.added.iter_mut().zip(added) {
            if s.cluster_ips != now.cluster_ips {
                s.cluster_ips.clone_from(&now.cluster_ips);
                changed.insert(name.clone());
            }
        }
    }

    /// Whether `namespace/service` has a row that serves, or a generated Service (the first
    /// generated one of its name) with real ports: retention's evidence (spec/model.md §10).
    fn evidence(&self, namespace: &str, service: &str) -> bool {
        let name: ServiceName = (namespace.into(), service.into());
        let serves = self
            .rows
            .get(&name)
            .is_some_and(|rows| rows.values().any(|r| row_problem(r).is_none()));
        let first = match self.first_generated.get(&name) {
            Some(&i) => Some(&self.dir[i].service),
            None => self.added.get(&name),
        };
        serves || first.is_some_and(generated_has_real_ports)
    }
}
