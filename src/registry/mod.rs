//! Registry sources: turn the outside world into a [`crate::model::Snapshot`].
