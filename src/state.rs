//! The published model: one `ArcSwap<Model>` read per connection or request, written whole by
//! one publisher (STYLE.md §6.3, spec/model.md §13).

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::model::Model;

/// The handle every proxy task reads the model through.
#[derive(Debug)]
pub struct ModelHandle {
    current: ArcSwap<Model>,
    generation: watch::Sender<u64>,
}

impl ModelHandle {
    /// A handle holding a first model (generation 1).
    pub fn new(model: Model) -> Self {
        Self {
            current: ArcSwap::from_pointee(model),
            generation: watch::Sender::new(1),
        }
    }

    /// The current model; keep the `Arc` for the whole decision.
    pub fn load(&self) -> Arc<Model> {
        self.current.load_full()
    }

    /// The current generation (starts at 1, one more per publish).
    pub fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Swap in a new model. Established connections keep the model they loaded.
    pub fn publish(&self, model: Model) -> u64 {
        self.current.store(Arc::new(model));
        let mut next = 0;
        self.generation.send_modify(|g| {
            *g += 1;
            next = *g;
        });
        next
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
