//! The Kubernetes registry source.
//!
//! [`convert`] turns Kubernetes objects into snapshot values (pure, shared with the file
//! registry); [`objects`] makes one snapshot of everything the watchers hold (pure);
//! [`generated`] renders the registrar's Services as objects (pure); [`mesh_filter`] defines
//! this project's own `MeshFilter` resource (group `aether.io`); [`watch`] keeps the stores
//! (kube-rs reflectors, IO).

pub mod client;
pub mod generated;
pub mod objects;
pub mod watch;

pub use aether_core::registry::kube::{convert, mesh_filter, pod};

/// The converters of aether-core fed with manifests as the daemon reads them (YAML fixtures).
#[cfg(test)]
mod convert_tests;
