//! The Kubernetes registry source.
//!
//! Only the pure conversions exist so far ([`convert`]); the watchers that feed them come later.
//! [`mesh_filter`] defines this project's own `MeshFilter` resource (group `aether.io`).

pub mod convert;
pub mod mesh_filter;
