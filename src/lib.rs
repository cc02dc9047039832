//! aether: a node-local service mesh data plane in which a mesh service is addressed by its
//! real ports, and nothing else.
//!
//! The crate is layered (STYLE.md §6.2): [`model`] and [`resolve`] are pure (no IO, no clock,
//! no tasks); [`registry`] turns the outside world into a [`model::Snapshot`]; the binary's
//! subcommands sit on top.

pub mod explain;
pub mod lab;
pub mod marks;
pub mod model;
pub mod netns;
pub mod proxy;
pub mod registry;
pub mod resolve;
#[cfg(any(test, feature = "testing"))]
pub mod test_util;
pub mod time;
