//! aether: a node-local service mesh data plane in which a mesh service is addressed by its
//! real ports, and nothing else.
//!
//! The crate is layered (STYLE.md §6.2): [`model`] and [`resolve`] are pure (no IO, no clock,
//! no tasks); [`registry`] turns the outside world into a [`model::Snapshot`]; the binary's
//! subcommands sit on top.

pub mod accept;
pub mod capture;
pub mod cni;
pub mod debug;
pub mod dns;
pub mod explain;
pub mod identity;
pub mod log_filter;
pub mod netns;
pub mod node;
pub mod proxy;
pub mod registrar;
pub mod registry;
pub mod route_status;
pub mod state;
#[cfg(any(test, feature = "testing"))]
pub mod test_util;
pub mod time;
pub mod yaml;

pub use aether_core::{marks, model, resolve, wire};

/// Displays an error with its chain of sources: `a: b: c`.
#[derive(Debug)]
pub struct DisplayChain<'a>(pub &'a dyn std::error::Error);

impl std::fmt::Display for DisplayChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}
