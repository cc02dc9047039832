//! The published model: one `ArcSwap<Model>` read per connection or request, written whole by
//! one publisher (STYLE.md §6.3, spec/model.md §13).

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::model::{Model, Snapshot};

/// One published model with what it was compiled from, swapped whole: the debug endpoints
/// (`aether debug explain`, `/config_dump`) read the snapshot beside the very model the data
/// plane serves, so the two cannot disagree. `compile(source, &model.context)` gives `model`
/// again (the snapshot carries the retained entries, the context the compile time).
#[derive(Debug)]
pub struct Published {
    /// Its generation (1 for the first model, one more per publish).
    pub generation: u64,
    /// The model the data plane serves.
    pub model: Arc<Model>,
    /// The snapshot it was compiled from, read with [`Published::source`].
    source: Source,
}

/// Makes the snapshot a model was compiled from when it is asked for (the Kubernetes source:
/// from the kept model, rather than keeping a copy of the registry beside every model).
pub trait MakeSource: Send + Sync + std::fmt::Debug {
    /// The snapshot of the registry as it was at `version`; `None` once it has changed since.
    fn make(&self, version: u64) -> Option<Snapshot>;
}

/// Where a published model's snapshot comes from.
#[derive(Clone, Debug, Default)]
pub enum Source {
    /// None is kept (tests, `debug_keep_snapshot: false`).
    #[default]
    None,
    /// Given with the model.
    Kept(Arc<Snapshot>),
    /// Made when asked, from the registry at this version.
    Made(Arc<dyn MakeSource>, u64),
}

impl From<Option<Arc<Snapshot>>> for Source {
    fn from(s: Option<Arc<Snapshot>>) -> Self {
        s.map_or(Self::None, Self::Kept)
    }
}

impl Published {
    fn new(generation: u64, model: Arc<Model>, source: Source) -> Self {
        Self {
            generation,
            model,
            source,
        }
    }

    /// The snapshot the model was compiled from: the one kept, or made now; `None` when none
    /// is kept, or when the registry it would be made from has changed since this publish (a
    /// newer model is on its way).
    pub fn source(&self) -> Option<Arc<Snapshot>> {
        match &self.source {
            Source::None => None,
            Source::Kept(s) => Some(s.clone()),
            Source::Made(maker, version) => maker.make(*version).map(Arc::new),
        }
    }

    /// Whether its snapshot is made when asked ([`Source::Made`]).
    pub fn made_on_demand(&self) -> bool {
        matches!(self.source, Source::Made(..))
    }

    /// The snapshot kept beside the model, if one is.
    pub fn kept_source(&self) -> Option<&Arc<Snapshot>> {
        match &self.source {
            Source::Kept(s) => Some(s),
            Source::None | Source::Made(..) => None,
        }
    }
}

/// The handle every proxy task reads the model through.
#[derive(Debug)]
pub struct ModelHandle {
    current: ArcSwap<Published>,
    generation: watch::Sender<u64>,
}

impl ModelHandle {
    /// A handle holding a first model (generation 1), with no source kept.
    pub fn new(model: Model) -> Self {
        Self::with_source(model, None)
    }

    /// A handle holding a first model (generation 1) and the snapshot it was compiled from.
    pub fn with_source(model: Model, source: Option<Snapshot>) -> Self {
        Self {
            current: ArcSwap::from_pointee(Published::new(
                1,
                Arc::new(model),
                source.map(Arc::new).into(),
            )),
            generation: watch::Sender::new(1),
        }
    }

    /// The current model; keep the `Arc` for the whole decision.
    pub fn load(&self) -> Arc<Model> {
        // One guard, one reference count: the same cost as loading the model itself.
        self.current.load().model.clone()
    }

    /// The current model with its generation and source, as one value.
    pub fn published(&self) -> Arc<Published> {
        self.current.load_full()
    }

    /// The current generation (starts at 1, one more per publish).
    pub fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Swap in a new model. Established connections keep the model they loaded.
    pub fn publish(&self, model: Model) -> u64 {
        self.publish_with_source(model, None)
    }

    /// Swap in a new model and the snapshot it was compiled from, whole. One publisher writes
    /// (STYLE.md §6.3), so the generation read here is the one this publish follows.
    pub fn publish_with_source(&self, model: Model, source: Option<Snapshot>) -> u64 {
        self.replace_shared(model, source.map(Arc::new)).0
    }

    /// [`Self::publish_with_source`], handing back what it replaced: the caller chooses where
    /// it is freed (the node frees it off the runtime's thread, `node::retire`).
    pub fn replace(&self, model: Model, source: Option<Snapshot>) -> (u64, Arc<Published>) {
        self.replace_shared(model, source.map(Arc::new))
    }

    /// [`Self::replace`] with a snapshot the caller still reads after the publish.
    pub fn replace_shared(&self, model: Model, source: impl Into<Source>) -> (u64, Arc<Published>) {
        let next = *self.generation.borrow() + 1;
        let old = self.current.swap(Arc::new(Published::new(
            next,
            Arc::new(model),
            source.into(),
        )));
        self.generation.send_replace(next);
        (next, old)
    }

    /// Swap in a model that serves like the published one ([`Model::serves_like`]: it differs
    /// in the compile clock only) with the snapshot it was compiled from, under the same
    /// generation: nothing waiting for a new model is woken, and the snapshot beside the model
    /// stays the one it was compiled from. Hands back what it replaced, as [`Self::replace`].
    pub fn refresh(&self, model: Model, source: impl Into<Source>) -> Arc<Published> {
        // One publisher writes (STYLE.md §6.3): the generation read here is the one kept.
        let generation = *self.generation.borrow();
        self.current.swap(Arc::new(Published::new(
            generation,
            Arc::new(model),
            source.into(),
        )))
    }

    /// Wait until a model newer than `seen` is published, at most `bound`. Returns whether one
    /// was.
    pub async fn newer_than(&self, seen: u64, bound: Duration) -> bool {
        tokio::time::timeout(bound, self.published_after(seen))
            .await
            .is_ok()
    }

    /// Wait, without a bound, until a model newer than `seen` is published (at once when one
    /// already is). Read `seen` with [`ModelHandle::generation`] before what it guards, so no
    /// publish between the two is missed.
    pub async fn published_after(&self, seen: u64) {
        let mut rx = self.generation.subscribe();
        // The sender lives in `self`, so the channel cannot close while this borrows it.
        let _ = rx.wait_for(|g| *g > seen).await;
    }
}
