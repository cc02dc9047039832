//! Registry sources: turn the outside world into a [`crate::model::Snapshot`].
//!
//! Layer 2 (IO at the edges). [`kube::convert`] is pure: it turns Kubernetes objects into
//! snapshot values and is shared by every source that reads Kubernetes shapes. [`mod@file`] reads a
//! directory of manifests (the file registry) and converts them with the same functions.
//! [`mod@etcd`] writes this node's rows to etcd and reads everyone's (the shared registry).

pub mod etcd;
pub mod file;
pub mod kube;
