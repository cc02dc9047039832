//! One kind's store: the objects its watch holds, by (namespace, name).
//!
//! What kube-rs's reflector store does, for what this source needs of it, in less memory: its
//! key (`ObjectRef`) copies each object's name, namespace, uid and resourceVersion, and it holds
//! each object behind one more `Arc` than the object's own: by its sizes about 250 bytes a pod
//! at 100,000 pods (the pod store went from 3,997 to 1,287 bytes a pod with this store and
//! `MeshPod` together; issue #37, not measured apart). Here the key is the
//! namespace and name alone, and the entry is the object's [`Stored`] itself, in the form the
//! source keeps (a pod as a [`crate::registry::kube::pod::MeshPod`], without the metadata the
//! watch decoded it under).
//!
//! Semantics are the reflector's (`kube_runtime::reflector::store::Writer::apply_watcher_event`):
//! an `Apply` replaces the object, a `Delete` removes it; a list (`Init`, `InitApply`…,
//! `InitDone`) is gathered aside and replaces the store whole when it completes, so that no
//! deleted object is left behind and the store stays as it was while a list is under way.

use std::collections::HashMap;
use std::sync::Arc;

use kube::Resource;
use kube::runtime::watcher::Event;
use parking_lot::RwLock;

use super::Stored;

/// `(namespace, name)`; the namespace empty when the kind is cluster-scoped.
pub type Key = (Box<str>, Box<str>);

/// One kind's objects, shared between its watch (the only writer) and the readers.
pub struct Kept<K> {
    objects: Arc<RwLock<HashMap<Key, Stored<K>>>>,
}

impl<K> Clone for Kept<K> {
    fn clone(&self) -> Self {
        Self {
            objects: Arc::clone(&self.objects),
        }
    }
}

impl<K> Default for Kept<K> {
    fn default() -> Self {
        Self {
            objects: Arc::default(),
        }
    }
}

impl<K> std::fmt::Debug for Kept<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept")
            .field("objects", &self.objects.read().len())
            .finish()
    }
}

impl<K> Kept<K> {
    /// Every object held now.
    pub fn state(&self) -> Vec<Stored<K>> {
        self.objects.read().values().cloned().collect()
    }

    /// The object `namespace/name` (`namespace` empty for a cluster-scoped kind).
    pub fn get(&self, namespace: &str, name: &str) -> Option<Stored<K>> {
        // A tuple of boxes has no borrowed form to look up by: the key is built for the lookup.
        let key: Key = (namespace.into(), name.into());
        self.objects.read().get(&key).cloned()
    }

    /// The key of every object held now.
    pub fn keys(&self) -> Vec<(String, String)> {
        self.objects
            .read()
            .keys()
            .map(|(namespace, name)| (namespace.to_string(), name.to_string()))
            .collect()
    }

    /// How many objects it holds.
    pub fn len(&self) -> usize {
        self.objects.read().len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The watch's side of a [`Kept`] store: it takes the objects as the watch decoded them (`W`)
/// and keeps each in the source's form (`K`).
pub struct Keeper<W, K> {
    kept: Kept<K>,
    /// The list under way, gathered until it completes.
    listing: Option<HashMap<Key, Stored<K>>>,
    /// The form kept of a decoded object.
    keep: fn(Arc<W>) -> Arc<K>,
}

impl<W, K> std::fmt::Debug for Keeper<W, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper").field("kept", &self.kept).finish()
    }
}

impl<K> Keeper<K, K>
where
    Stored<K>: Resource,
{
    /// A store of the objects as decoded, and its writer.
    pub fn new() -> (Kept<K>, Self) {
        Self::keeping(std::convert::identity)
    }
}

impl<W, K> Keeper<W, K>
where
    Stored<W>: Resource,
{
    /// A store keeping `keep` of each object, and its writer.
    pub fn keeping(keep: fn(Arc<W>) -> Arc<K>) -> (Kept<K>, Self) {
        let kept = Kept::default();
        (
            kept.clone(),
            Self {
                kept,
                listing: None,
                keep,
            },
        )
    }

    fn kept(&self, o: Stored<W>) -> Stored<K> {
        Stored(o.0.map(self.keep))
    }

    /// Apply one watch event.
    pub fn apply(&mut self, event: Event<Stored<W>>) {
        match event {
            Event::Apply(o) => {
                let key = key_of(&o);
                let o = self.kept(o);
                self.kept.objects.write().insert(key, o);
            }
            Event::Delete(o) => {
                self.kept.objects.write().remove(&key_of(&o));
            }
            Event::Init => self.listing = Some(HashMap::new()),
            Event::InitApply(o) => {
                let key = key_of(&o);
                let o = self.kept(o);
                self.listing.get_or_insert_with(HashMap::new).insert(key, o);
            }
            Event::InitDone => {
                let mut listed = self.listing.take().unwrap_or_default();
                listed.shrink_to_fit();
                // The old objects are freed after the lock is let go.
                let old = std::mem::replace(&mut *self.kept.objects.write(), listed);
                drop(old);
            }
        }
    }
}

/// The key of an object as the watch decoded it.
pub fn key_of<K>(o: &Stored<K>) -> Key
where
    Stored<K>: Resource,
{
    let meta = o.meta();
    (
        meta.namespace.as_deref().unwrap_or("").into(),
        meta.name.as_deref().unwrap_or("").into(),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::runtime::watcher::Event;

    use super::{Keeper, Stored};

    fn object(namespace: &str, name: &str, version: &str) -> Stored<ConfigMap> {
        Stored(Ok(Arc::new(ConfigMap {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        })))
    }

    fn version(o: Option<Stored<ConfigMap>>) -> Option<String> {
        o.and_then(|o| o.0.ok()?.metadata.resource_version.clone())
    }

    #[test]
    fn events_replace_and_delete_and_a_list_replaces_the_store_only_when_it_completes() {
        let (kept, mut keeper) = Keeper::new();
        keeper.apply(Event::Init);
        keeper.apply(Event::InitApply(object("a", "x", "1")));
        keeper.apply(Event::InitApply(object("b", "x", "1")));
        assert!(
            kept.is_empty(),
            "nothing is served before the list completes"
        );
        keeper.apply(Event::InitDone);
        assert_eq!(kept.len(), 2);
        keeper.apply(Event::Apply(object("a", "x", "2")));
        assert_eq!(version(kept.get("a", "x")).as_deref(), Some("2"));
        assert_eq!(version(kept.get("b", "x")).as_deref(), Some("1"));
        keeper.apply(Event::Delete(object("b", "x", "3")));
        assert!(kept.get("b", "x").is_none());
        assert!(
            kept.get("", "x").is_none(),
            "the namespace is part of the key"
        );

        // A relist: the store stays as it was while the list is under way, then is the list.
        keeper.apply(Event::Apply(object("c", "y", "4")));
        keeper.apply(Event::Init);
        keeper.apply(Event::InitApply(object("d", "z", "5")));
        assert_eq!(kept.len(), 2);
        assert!(kept.get("c", "y").is_some());
        keeper.apply(Event::InitDone);
        assert_eq!(kept.len(), 1, "what the list dropped is gone");
        assert!(kept.get("a", "x").is_none());
        assert_eq!(version(kept.get("d", "z")).as_deref(), Some("5"));
        assert_eq!(kept.state().len(), 1);
    }
}
