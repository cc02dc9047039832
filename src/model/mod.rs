//! The compiled per-port model and its compiler.
//!
//! Purity contract: nothing in this module performs IO, reads a clock, spawns a task or touches
//! a global; time arrives as an argument. `compile(&Snapshot, &NodeContext) -> Model` is a
//! deterministic, order-independent function of its inputs, and the resulting [`Model`] is
//! immutable: the daemon swaps a whole new one in.
#![warn(missing_docs)]

pub mod filters;
pub mod port;
pub mod route_match;
pub mod rows;
pub mod snapshot;

pub use snapshot::Snapshot;
