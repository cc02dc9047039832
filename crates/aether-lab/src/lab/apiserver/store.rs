//! The fake API server's objects, their resourceVersions and the history watches read.
//!
//! Synchronous and IO-free apart from the wall clock (`creationTimestamp`) and a random `uid`;
//! the HTTP side ([`super::http`]) holds it under a mutex and wakes watches after each write.
//!
//! Invariants:
//! - One resourceVersion counter for every type; each write that changes an object takes the
//!   next value, stamps it on the object and records one event. A write that changes nothing
//!   (the object as stored already) takes none and records nothing, as the real server skips a
//!   no-op update.
//! - The history keeps the last [`Store::history_cap`] events. A watch from a resourceVersion
//!   older than the oldest event kept (the floor) has missed events: it is answered `410 Gone`.
//! - `uid` and `creationTimestamp` are set once, at create; `generation` is 1 at create and
//!   grows by one when anything but `metadata` and `status` changes.
//! - A main-resource write keeps the stored `status`; a `/status` write changes only `status`.
//! - A Service keeps its ClusterIP: allocated at create when it has none (never for
//!   `clusterIP: None`), kept when an update omits it, and a change is refused (422).
//! - A deletion of an object with finalizers (or a foreground one, which adds
//!   `foregroundDeletion`) only marks it with `deletionTimestamp`; it goes when a write leaves
//!   it with none. No garbage collector or controller removes a finalizer.
//! - Objects read from the manifest directory are reconciled as `kubectl apply` would
//!   ([`Store::reconcile`]); objects created through the API are never touched by it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use serde_json::{Map, Value, json};

pub use super::api::{ApiError, Key};
use super::resources::ResourceType;
use super::select::Filter;

/// Who made an object: the manifest directory, or a client of the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Read from the manifest directory; reloads update and delete it.
    Dir,
    /// Created through the API; reloads never touch it.
    Api,
}

#[derive(Clone, Debug)]
struct Entry {
    object: Arc<Value>,
    origin: Origin,
}

/// The kind of a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Deleted (the object as it was, at the deletion's resourceVersion).
    Deleted,
}

impl EventType {
    /// The wire name (`ADDED`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One write, as watches see it.
#[derive(Clone, Debug)]
pub struct Event {
    /// Its resourceVersion.
    pub rv: u64,
    /// What happened.
    pub kind: EventType,
    /// To which object.
    pub key: Key,
    /// The object after the write (before it, for a deletion).
    pub object: Arc<Value>,
    /// The object before a modification (to tell a watch with a selector that an object left
    /// or entered its selection).
    pub previous: Option<Arc<Value>>,
}

impl Event {
    /// The event a watch with `filter` gets, if any: a modification that takes an object out
    /// of the selection is a deletion for it, one that brings it in an addition.
    pub fn seen_through(&self, filter: &Filter) -> Option<(EventType, &Value)> {
        if !filter.covers(&self.key) {
            return None;
        }
        let now = filter.matches(&self.object);
        match (self.kind, &self.previous) {
            (EventType::Modified, Some(prev)) => match (filter.matches(prev), now) {
                (true, true) => Some((EventType::Modified, &self.object)),
                (false, true) => Some((EventType::Added, &self.object)),
                (true, false) => Some((EventType::Deleted, &self.object)),
                (false, false) => None,
            },
            (kind, _) => now.then_some((kind, &self.object)),
        }
    }
}

impl ApiError {
    fn not_found(key: &Key) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", key.resource, key.name),
        )
    }

    fn conflict(key: &Key) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                key.resource, key.name
            ),
        )
    }

    /// The `Status` object the API server answers with.
    pub fn status(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }
}

/// What a write does to an object's `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The main resource: everything but `status`, which is kept as stored.
    Main,
    /// The `/status` subresource: `status` only.
    Status,
}

/// Counts of writes per (verb, resource, field manager), for tests that observe writers.
pub type Writes = BTreeMap<(String, String, String), u64>;

/// The objects, the counter, the history and the write counts.
#[derive(Debug)]
pub struct Store {
    rv: u64,
    objects: BTreeMap<Key, Entry>,
    history: VecDeque<Event>,
    history_cap: usize,
    floor: u64,
    last_applied: BTreeMap<Key, Value>,
    writes: Writes,
    cluster_ips: ClusterIps,
    /// [`super::Settings::namespaces_must_exist`].
    pub namespaces_must_exist: bool,
}

/// How Services get their ClusterIPs.
#[derive(Clone, Debug)]
pub struct ClusterIps {
    /// Given addresses, by `namespace/name` (the lab's planned ClusterIPs).
    pub given: BTreeMap<String, IpAddr>,
    /// The range the others are allocated from, lowest free address first.
    pub cidr: IpNet,
}

/// The finalizer a foreground deletion puts on its object.
pub const FOREGROUND: &str = "foregroundDeletion";

fn meta(o: &Value) -> &Value {
    &o["metadata"]
}

fn meta_mut(o: &mut Value) -> &mut Map<String, Value> {
    if !o["metadata"].is_object() {
        o["metadata"] = Value::Object(Map::new());
    }
    match &mut o["metadata"] {
        Value::Object(m) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// The object as stored, less what the server maintains itself: what decides whether a write
/// changed anything.
fn content(o: &Value) -> Value {
    let mut o = o.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "generation",
            "managedFields",
        ] {
            m.remove(k);
        }
    }
    if let Some(m) = o.as_object_mut() {
        m.remove("apiVersion");
    }
    o
}

/// The part of an object whose change counts as a new generation.
fn spec_part(o: &Value) -> Value {
    let mut o = o.clone();
    if let Some(m) = o.as_object_mut() {
        for k in ["metadata", "status", "apiVersion", "kind"] {
            m.remove(k);
        }
    }
    o
}

/// RFC 7386 JSON merge patch of `patch` onto `target`.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

fn rv_of(o: &Value) -> Option<&str> {
    meta(o)["resourceVersion"]
        .as_str()
        .filter(|s| !s.is_empty())
}

fn uid() -> String {
    let r = || fastrand::u32(..);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:04x}{:08x}",
        r(),
        r() & 0xffff,
        r() & 0xfff,
        (r() & 0x3fff) | 0x8000,
        r() & 0xffff,
        r()
    )
}

fn timestamp() -> Value {
    let ms = i64::try_from(aether::time::wall_ms()).unwrap_or(i64::MAX);
    let ts = k8s_openapi::jiff::Timestamp::from_millisecond(ms)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    Value::String(format!("{:.0}", ts))
}

impl Store {
    /// An empty store keeping the last `history_cap` events.
    pub fn new(history_cap: usize, cluster_ips: ClusterIps) -> Self {
        Self {
            rv: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_cap: history_cap.max(1),
            floor: 0,
            last_applied: BTreeMap::new(),
            writes: Writes::new(),
            cluster_ips,
            namespaces_must_exist: false,
        }
    }

    /// The current resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// How many events the history keeps.
    pub fn history_cap(&self) -> usize {
        self.history_cap
    }

    /// The writes counted so far.
    pub fn writes(&self) -> &Writes {
        &self.writes
    }

    /// Counts one write.
    pub fn count_write(&mut self, verb: &str, resource: &str, manager: &str) {
        *self
            .writes
            .entry((verb.to_owned(), resource.to_owned(), manager.to_owned()))
            .or_default() += 1;
    }

    /// One object.
    pub fn get(&self, key: &Key) -> Result<Arc<Value>, ApiError> {
        self.objects
            .get(key)
            .map(|e| e.object.clone())
            .ok_or_else(|| ApiError::not_found(key))
    }

    /// The objects `filter` selects, in (namespace, name) order.
    pub fn list(&self, filter: &Filter) -> Vec<Arc<Value>> {
        self.objects
            .iter()
            .filter(|(k, e)| filter.covers(k) && filter.matches(&e.object))
            .map(|(_, e)| e.object.clone())
            .collect()
    }

    /// Every object of `resource` with its key, in key order.
    pub fn objects_of(&self, resource: ResourceType) -> impl Iterator<Item = (&Key, &Value)> {
        self.objects
            .iter()
            .filter(move |(k, _)| k.resource == resource)
            .map(|(k, e)| (k, e.object.as_ref()))
    }

    /// Every object with its key.
    pub fn all(&self) -> impl Iterator<Item = (&Key, &Value)> {
        self.objects.iter().map(|(k, e)| (k, e.object.as_ref()))
    }

    /// The events after `rv`, or `None` when the history no longer reaches back to it.
    pub fn events_since(&self, rv: u64) -> Option<Vec<Event>> {
        if rv < self.floor {
            return None;
        }
        Some(
            self.history
                .iter()
                .skip_while(|e| e.rv <= rv)
                .cloned()
                .collect(),
        )
    }

    /// Drops the history: every watch from an earlier resourceVersion now gets `410 Gone`.
    pub fn expire(&mut self) {
        self.history.clear();
        self.floor = self.rv;
    }

    /// Creates an object (`POST`). The body's `status` is dropped, as the real server drops it
    /// for the kinds served here.
    pub fn create(&mut self, key: &Key, mut body: Value) -> Result<Arc<Value>, ApiError> {
        if self.objects.contains_key(key) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{}\" already exists", key.resource, key.name),
            ));
        }
        if self.namespaces_must_exist && key.resource.namespaced {
            let namespace = super::resources::by_plural("", "namespaces").map(|resource| Key {
                resource,
                namespace: String::new(),
                name: key.namespace.clone(),
            });
            if !namespace.is_some_and(|ns| self.objects.contains_key(&ns)) {
                return Err(ApiError::new(
                    404,
                    "NotFound",
                    format!("namespaces \"{}\" not found", key.namespace),
                ));
            }
        }
        if let Some(m) = body.as_object_mut() {
            m.remove("status");
        }
        self.put(key, body, Origin::Api)
    }

    /// Replaces an object (`PUT`); the body's resourceVersion, when given, must be the stored one.
    pub fn replace(&mut self, key: &Key, body: Value, part: Part) -> Result<Arc<Value>, ApiError> {
        let stored = self.get(key)?;
        self.precondition(key, &stored, &body)?;
        let new = Self::combine(&stored, body, part);
        let origin = self.objects.get(key).map_or(Origin::Api, |e| e.origin);
        self.put(key, new, origin)
    }

    /// Applies a JSON merge patch (`PATCH application/merge-patch+json`); a resourceVersion in
    /// the patch is a precondition.
    pub fn merge(&mut self, key: &Key, patch: &Value, part: Part) -> Result<Arc<Value>, ApiError> {
        let stored = self.get(key)?;
        self.precondition(key, &stored, patch)?;
        let mut patched = stored.as_ref().clone();
        merge_patch(&mut patched, patch);
        let new = Self::combine(&stored, patched, part);
        let origin = self.objects.get(key).map_or(Origin::Api, |e| e.origin);
        self.put(key, new, origin)
    }

    /// Server-side apply without field ownership: creates the object when it is absent,
    /// otherwise merges the applied fields into it (a list given replaces the stored one).
    pub fn apply(
        &mut self,
        key: &Key,
        applied: &Value,
        part: Part,
    ) -> Result<Arc<Value>, ApiError> {
        match self.objects.get(key).map(|e| (e.object.clone(), e.origin)) {
            None if part == Part::Status => Err(ApiError::not_found(key)),
            None if rv_of(applied).is_some() => Err(ApiError::conflict(key)),
            None => {
                let mut body = applied.clone();
                if let Some(m) = body.as_object_mut() {
                    m.remove("status");
                }
                self.put(key, body, Origin::Api)
            }
            Some((stored, origin)) => {
                self.precondition(key, &stored, applied)?;
                let mut merged = stored.as_ref().clone();
                merge_patch(&mut merged, applied);
                let new = Self::combine(&stored, merged, part);
                self.put(key, new, origin)
            }
        }
    }

    /// Deletes an object (`DELETE`); the object as it was is returned. `foreground` is the
    /// request's `propagationPolicy: Foreground`, which puts the finalizer `foregroundDeletion`
    /// on it. An object that then has finalizers is only marked, as the real server marks it:
    /// `deletionTimestamp` is set (a `MODIFIED` event), and it goes once a write leaves it with
    /// none. Nothing here removes a finalizer (no garbage collector runs): a client must.
    pub fn delete(&mut self, key: &Key, foreground: bool) -> Result<Arc<Value>, ApiError> {
        let stored = self.get(key)?;
        let mut finalizers = meta(&stored)["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if foreground && !finalizers.iter().any(|f| f == FOREGROUND) {
            finalizers.push(FOREGROUND.into());
        }
        if finalizers.is_empty() {
            return self.remove(key);
        }
        let mut marked = stored.as_ref().clone();
        let m = meta_mut(&mut marked);
        m.insert("finalizers".into(), Value::Array(finalizers));
        if !m.contains_key("deletionTimestamp") {
            m.insert("deletionTimestamp".into(), timestamp());
        }
        let origin = self.objects.get(key).map_or(Origin::Api, |e| e.origin);
        self.put(key, marked, origin)
    }

    /// Removes an object now; the object as it was is returned.
    fn remove(&mut self, key: &Key) -> Result<Arc<Value>, ApiError> {
        let entry = self
            .objects
            .remove(key)
            .ok_or_else(|| ApiError::not_found(key))?;
        self.rv += 1;
        let mut gone = entry.object.as_ref().clone();
        meta_mut(&mut gone).insert("resourceVersion".into(), self.rv.to_string().into());
        let gone = Arc::new(gone);
        self.record(Event {
            rv: self.rv,
            kind: EventType::Deleted,
            key: key.clone(),
            object: gone.clone(),
            previous: None,
        });
        Ok(gone)
    }

    /// Makes the objects read from the manifest directory what `desired` says, as `kubectl
    /// apply` would: a document that is new is created, one that changed since it was last
    /// applied updates its object (keeping the stored `status` unless the document gives one),
    /// one that is gone deletes its object. Objects created through the API are left alone.
    /// Returns how many objects changed.
    pub fn reconcile(&mut self, desired: Vec<(Key, Value)>) -> Result<usize, ApiError> {
        let mut changed = 0;
        let keep: BTreeSet<Key> = desired.iter().map(|(k, _)| k.clone()).collect();
        let gone: Vec<Key> = self
            .last_applied
            .keys()
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.last_applied.remove(&key);
            if self
                .objects
                .get(&key)
                .is_some_and(|e| e.origin == Origin::Dir)
            {
                self.delete(&key, false)?;
                changed += 1;
            }
        }
        for (key, doc) in desired {
            if self.last_applied.get(&key) == Some(&doc) && self.objects.contains_key(&key) {
                continue;
            }
            let mut new = doc.clone();
            if let Some(stored) = self.objects.get(&key)
                && doc.get("status").is_none()
                && let Some(status) = stored.object.get("status")
            {
                new["status"] = status.clone();
            }
            let before = self.rv;
            self.put(&key, new, Origin::Dir)?;
            changed += usize::from(self.rv != before);
            self.last_applied.insert(key, doc);
        }
        Ok(changed)
    }

    fn precondition(&self, key: &Key, stored: &Value, body: &Value) -> Result<(), ApiError> {
        match rv_of(body) {
            Some(rv) if Some(rv) != rv_of(stored) => Err(ApiError::conflict(key)),
            _ => Ok(()),
        }
    }

    /// `new` as a write of `part` leaves it: a main write keeps the stored status, a status
    /// write keeps everything but the status.
    fn combine(stored: &Value, new: Value, part: Part) -> Value {
        match part {
            Part::Main => {
                let mut out = new;
                if let Some(m) = out.as_object_mut() {
                    match stored.get("status") {
                        Some(s) => {
                            m.insert("status".into(), s.clone());
                        }
                        None => {
                            m.remove("status");
                        }
                    }
                }
                out
            }
            Part::Status => {
                let mut out = stored.clone();
                if let Some(m) = out.as_object_mut() {
                    match new.get("status") {
                        Some(s) => {
                            m.insert("status".into(), s.clone());
                        }
                        None => {
                            m.remove("status");
                        }
                    }
                }
                out
            }
        }
    }

    /// Stores `new` under `key`: server-maintained metadata, the Service ClusterIP rules, a new
    /// resourceVersion and an event, unless nothing changed.
    fn put(&mut self, key: &Key, mut new: Value, origin: Origin) -> Result<Arc<Value>, ApiError> {
        if !new.is_object() {
            return Err(ApiError::new(
                400,
                "BadRequest",
                "the body is not an object",
            ));
        }
        let stored = self.objects.get(key).map(|e| e.object.clone());
        // A marked object that a write leaves with no finalizer is deleted, as the real server
        // deletes it once its last finalizer is removed.
        if let Some(s) = &stored
            && meta(s).get("deletionTimestamp").is_some()
            && meta(&new)["finalizers"]
                .as_array()
                .is_none_or(|f| f.is_empty())
        {
            return self.remove(key);
        }
        {
            let m = meta_mut(&mut new);
            m.insert("name".into(), key.name.clone().into());
            if key.resource.namespaced {
                m.insert("namespace".into(), key.namespace.clone().into());
            } else {
                m.remove("namespace");
            }
        }
        new["kind"] = key.resource.kind.into();
        if key.resource.kind == "Service" && key.resource.group.is_empty() {
            self.service_ips(key, stored.as_deref(), &mut new)?;
        }
        let generation = match &stored {
            Some(s) => {
                if content(s) == content(&new) {
                    return Ok(s.clone());
                }
                let g = meta(s)["generation"].as_u64().unwrap_or(1);
                let m = meta_mut(&mut new);
                m.insert("uid".into(), meta(s)["uid"].clone());
                m.insert(
                    "creationTimestamp".into(),
                    meta(s)["creationTimestamp"].clone(),
                );
                if spec_part(s) == spec_part(&new) {
                    g
                } else {
                    g + 1
                }
            }
            None => {
                let m = meta_mut(&mut new);
                m.insert("uid".into(), uid().into());
                m.insert("creationTimestamp".into(), timestamp());
                1
            }
        };
        self.rv += 1;
        let m = meta_mut(&mut new);
        m.insert("generation".into(), generation.into());
        m.insert("resourceVersion".into(), self.rv.to_string().into());
        m.remove("managedFields");
        let object = Arc::new(new);
        self.objects.insert(
            key.clone(),
            Entry {
                object: object.clone(),
                origin,
            },
        );
        self.record(Event {
            rv: self.rv,
            kind: if stored.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            },
            key: key.clone(),
            object: object.clone(),
            previous: stored,
        });
        Ok(object)
    }

    fn record(&mut self, event: Event) {
        self.history.push_back(event);
        while self.history.len() > self.history_cap {
            if let Some(dropped) = self.history.pop_front() {
                self.floor = dropped.rv;
            }
        }
    }

    /// The ClusterIP rules of a Service write (see the module doc).
    fn service_ips(
        &self,
        key: &Key,
        stored: Option<&Value>,
        new: &mut Value,
    ) -> Result<(), ApiError> {
        if new["spec"]["type"].as_str() == Some("ExternalName") {
            return Ok(());
        }
        let invalid = |what: String| ApiError::new(422, "Invalid", what);
        let old_ip = stored
            .and_then(|s| s["spec"]["clusterIP"].as_str())
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        let asked = new["spec"]["clusterIP"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        let ip = match (asked, old_ip) {
            (Some(a), Some(o)) if a != o => {
                return Err(invalid(format!(
                    "Service \"{}\" is invalid: spec.clusterIP: Invalid value: \"{a}\": field is immutable",
                    key.name
                )));
            }
            (Some(a), _) => a,
            (None, Some(o)) => o,
            (None, None) => self.allocate(key)?.to_string(),
        };
        let ips = match new["spec"]["clusterIPs"].as_array() {
            Some(list) if !list.is_empty() => {
                if list[0].as_str() != Some(ip.as_str()) {
                    return Err(invalid(format!(
                        "Service \"{}\" is invalid: spec.clusterIPs[0]: must match spec.clusterIP {ip}",
                        key.name
                    )));
                }
                Value::Array(list.clone())
            }
            _ => json!([ip]),
        };
        if !new["spec"].is_object() {
            new["spec"] = json!({});
        }
        new["spec"]["clusterIP"] = ip.into();
        new["spec"]["clusterIPs"] = ips;
        Ok(())
    }

    /// The given ClusterIP of `key`, else the lowest address of the range that no Service
    /// holds and no other Service is given.
    fn allocate(&self, key: &Key) -> Result<IpAddr, ApiError> {
        let ips = &self.cluster_ips;
        if let Some(ip) = ips.given.get(&format!("{}/{}", key.namespace, key.name)) {
            return Ok(*ip);
        }
        let used: BTreeSet<IpAddr> = self
            .objects
            .iter()
            .filter(|(k, _)| k.resource.kind == "Service")
            .filter_map(|(_, e)| e.object["spec"]["clusterIP"].as_str()?.parse().ok())
            .chain(ips.given.values().copied())
            .collect();
        ips.cidr
            .hosts()
            .find(|ip| !used.contains(ip))
            .ok_or_else(|| {
                ApiError::new(
                    500,
                    "InternalError",
                    format!("no free ClusterIP left in {}", ips.cidr),
                )
            })
    }
}

#[cfg(test)]
mod tests;
