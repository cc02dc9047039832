//! Freeing what a reload replaced, off the data plane's thread.
//!
//! Dropping a compiled model frees every table it holds: about a quarter of the time it took to
//! compile it (docs/performance.md, "Compile speed"), so some milliseconds at 2,000 services and
//! around a hundred at 20,000.
//! The daemon runs on one thread by default (`worker_threads`), so a drop on the runtime's
//! thread stalls every proxied connection of the node for that long. The model a reload replaces
//! is dropped by whoever lets go of it last: the publisher, or a connection that loaded it
//! ("established connections keep the model they loaded"). [`model`] keeps one reference back
//! and frees the model on a blocking thread once that reference is the last.

use std::sync::Arc;
use std::time::Duration;

use crate::state::Published;

/// How often a retired model is checked for other holders.
const POLL: Duration = Duration::from_millis(250);

/// Frees `value` on one of the runtime's blocking threads.
pub(crate) fn drop_off_runtime<T: Send + 'static>(value: T) {
    drop(tokio::task::spawn_blocking(move || drop(value)));
}

/// Frees a replaced model (and the snapshot published with it) on a blocking thread once nothing
/// else holds it: a connection that loaded it keeps it as long as it needs, and never frees it
/// on the runtime's thread.
pub(crate) fn model(retired: Arc<Published>) {
    tokio::spawn(async move {
        // Nobody can take a new reference to a retired model: the handle no longer holds it, so
        // a count of one is this task's alone and stays so.
        while !sole_owner(&retired) {
            tokio::time::sleep(POLL).await;
        }
        drop_off_runtime(retired);
    });
}

fn sole_owner(p: &Arc<Published>) -> bool {
    Arc::strong_count(p) == 1
        && Arc::strong_count(&p.model) == 1
        && p.kept_source().is_none_or(|s| Arc::strong_count(s) == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Model, NodeContext, Snapshot, compile};
    use crate::state::ModelHandle;

    fn empty() -> Model {
        compile(&Snapshot::default(), &NodeContext::default())
    }

    #[tokio::test(start_paused = true)]
    async fn a_retired_model_is_freed_only_after_its_last_connection_lets_go() {
        let handle = ModelHandle::new(empty());
        // A connection that loaded generation 1 and is still open.
        let held = handle.load();
        let weak = Arc::downgrade(&held);
        let (generation, old) = handle.replace(empty(), None);
        assert_eq!(generation, 2);
        model(old);
        tokio::time::sleep(POLL * 4).await;
        assert!(
            weak.upgrade().is_some(),
            "the model was freed while a connection held it"
        );
        // The connection closes: its reference is not the last, so its drop frees nothing.
        drop(held);
        assert!(
            weak.upgrade().is_some(),
            "the connection's drop freed the model"
        );
        // The retiring task sees it is the last holder and frees it on a blocking thread.
        for _ in 0..100 {
            if weak.upgrade().is_none() {
                return;
            }
            tokio::time::sleep(POLL).await;
        }
        panic!("the retired model was never freed");
    }
}
