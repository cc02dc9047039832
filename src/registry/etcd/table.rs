//! What a node has read of the registry's keys: pure, fed by the watch ([`super::EtcdSource`]).
//!
//! Invariants:
//! - One entry per key, read once when it is put ([`decode`]); a refused key stays refused until
//!   it is put again or deleted, and is reported as newly refused once (spec/model.md §3.3: logged
//!   once, counted once), not at every relist.
//! - [`Table::rows`] holds each row once per (namespace, service, address) (spec/model.md §3.4:
//!   a consumer of several listings de-duplicates): of copies that differ, the one written last
//!   (highest `mod_revision`; then the lowest key) is the row.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::model::snapshot::Row;

use super::keys::{EndpointKey, Refusal, decode, endpoints_prefix};

/// A row's identity: (namespace, service, address), what its keys name.
pub type RowId = (String, String, IpAddr);

/// What changed since the last [`Table::take_changes`].
#[derive(Clone, Debug, Default)]
pub struct TableChanges {
    /// The table was listed again (or never taken from): everything is in `rows`.
    pub whole: bool,
    /// Each row whose identity a put or a delete named since, as the table serves it now
    /// (`None`: it serves none); when `whole`, every served row.
    pub rows: Vec<(RowId, Option<Arc<Row>>)>,
}

/// One key as read.
#[derive(Clone, Debug)]
struct Entry {
    mod_revision: i64,
    read: Result<Arc<Row>, Refusal>,
}

/// A key the store holds that is not served, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The key, as text (lossy when it is not UTF-8).
    pub key: String,
    /// Why.
    pub refusal: Refusal,
}

/// The keys under one prefix, as last listed and watched.
#[derive(Clone, Debug)]
pub struct Table {
    prefix: String,
    entries: BTreeMap<Vec<u8>, Entry>,
    /// The identities named by a put or a delete since the last [`Table::take_changes`].
    touched: HashSet<RowId>,
    /// Listed again since then (or never taken from).
    relisted: bool,
}

impl Table {
    /// An empty table for the keys under `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            entries: BTreeMap::new(),
            touched: HashSet::new(),
            relisted: true,
        }
    }

    /// How many keys it holds, served or not.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Replaces everything with a full listing of `(key, value, mod_revision)`: a key the listing
    /// lacks is gone. Returns the keys refused now that were not refused at the same revision
    /// before.
    pub fn replace<'a>(
        &mut self,
        listing: impl IntoIterator<Item = (&'a [u8], &'a [u8], i64)>,
    ) -> Vec<Refused> {
        let mut old = std::mem::take(&mut self.entries);
        let mut refused = Vec::new();
        self.relisted = true;
        self.touched.clear();
        for (key, value, mod_revision) in listing {
            let kept = old
                .remove(key)
                .filter(|e| e.mod_revision == mod_revision && mod_revision != 0);
            let entry = match kept {
                Some(e) => e,
                None => {
                    let e = self.read(key, value, mod_revision);
                    if let Err(r) = &e.read {
                        refused.push(refused_key(key, r));
                    }
                    e
                }
            };
            self.entries.insert(key.to_vec(), entry);
        }
        refused
    }

    /// A key put at `mod_revision`: returns its refusal when it is not served.
    pub fn put(&mut self, key: &[u8], value: &[u8], mod_revision: i64) -> Option<Refused> {
        let entry = self.read(key, value, mod_revision);
        let refused = entry.read.as_ref().err().map(|r| refused_key(key, r));
        self.touch(key);
        self.entries.insert(key.to_vec(), entry);
        refused
    }

    /// Notes the identity `key` names (a key that does not parse names none, and never
    /// served).
    fn touch(&mut self, key: &[u8]) {
        if self.relisted {
            return;
        }
        if let Ok(k) = EndpointKey::parse(&self.prefix, key) {
            self.touched.insert((k.namespace, k.service, k.address));
        }
    }

    /// What changed since the last call: the rows of the identities touched, as served now,
    /// or every row after a listing or when `all` is asked. O(rows touched × the keys of their
    /// services).
    pub fn take_changes(&mut self, all: bool) -> TableChanges {
        if std::mem::take(&mut self.relisted) || all {
            self.touched.clear();
            let rows = self
                .rows()
                .into_iter()
                .map(|r| ((r.namespace.clone(), r.service.clone(), r.address), Some(r)))
                .collect();
            return TableChanges { whole: true, rows };
        }
        let touched = std::mem::take(&mut self.touched);
        let rows = touched
            .into_iter()
            .map(|id| {
                let row = self.row_of(&id);
                (id, row)
            })
            .collect();
        TableChanges { whole: false, rows }
    }

    /// The row served for `id`, as [`Table::rows`] picks it among its keys (the one written
    /// last; then the lowest key): its service's keys are one range.
    fn row_of(&self, (namespace, service, address): &RowId) -> Option<Arc<Row>> {
        let from = format!("{}{namespace}/{service}/", endpoints_prefix(&self.prefix)).into_bytes();
        let mut best: Option<(i64, &Arc<Row>)> = None;
        for (_, entry) in self
            .entries
            .range(from.clone()..)
            .take_while(|(k, _)| k.starts_with(&from))
        {
            let Ok(row) = &entry.read else { continue };
            if row.address != *address {
                continue;
            }
            if best.is_none_or(|(rev, _)| entry.mod_revision > rev) {
                best = Some((entry.mod_revision, row));
            }
        }
        best.map(|(_, row)| Arc::clone(row))
    }

    /// The revision that last put `key`, if it is held (served or refused).
    pub fn mod_revision(&self, key: &[u8]) -> Option<i64> {
        self.entries.get(key).map(|e| e.mod_revision)
    }

    /// A key deleted (or expired with its lease).
    pub fn delete(&mut self, key: &[u8]) {
        self.touch(key);
        self.entries.remove(key);
    }

    fn read(&self, key: &[u8], value: &[u8], mod_revision: i64) -> Entry {
        Entry {
            mod_revision,
            read: decode(&self.prefix, key, value).map(|(_, row)| Arc::new(row)),
        }
    }

    /// The served rows, one per (namespace, service, address), in that order.
    pub fn rows(&self) -> Vec<Arc<Row>> {
        let mut best: BTreeMap<(&str, &str, IpAddr), (i64, &Arc<Row>)> = BTreeMap::new();
        // Keys are visited in order, so on equal revisions the first (lowest) key stays.
        for entry in self.entries.values() {
            let Ok(row) = &entry.read else { continue };
            let id = (row.namespace.as_str(), row.service.as_str(), row.address);
            match best.get(&id) {
                Some((rev, _)) if *rev >= entry.mod_revision => {}
                _ => {
                    best.insert(id, (entry.mod_revision, row));
                }
            }
        }
        best.into_values().map(|(_, row)| Arc::clone(row)).collect()
    }

    /// Every key held that is not served, in key order.
    pub fn refused(&self) -> Vec<Refused> {
        self.entries
            .iter()
            .filter_map(|(k, e)| e.read.as_ref().err().map(|r| refused_key(k, r)))
            .collect()
    }

    /// The keys held that name `row`'s (namespace, service, address), whatever their listing.
    pub fn keys_of(&self, namespace: &str, service: &str, address: IpAddr) -> Vec<EndpointKey> {
        self.entries
            .keys()
            .filter_map(|k| EndpointKey::parse(&self.prefix, k).ok())
            .filter(|k| k.namespace == namespace && k.service == service && k.address == address)
            .collect()
    }
}

fn refused_key(key: &[u8], refusal: &Refusal) -> Refused {
    Refused {
        key: String::from_utf8_lossy(key).into_owned(),
        refusal: refusal.clone(),
    }
}
