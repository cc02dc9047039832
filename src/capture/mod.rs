//! Traffic capture in pod network namespaces (ARCHITECTURE.md "capture"; spec/model.md §12).
//!
//! - [`plan`] (PURE): a pod's capture settings -> the nftables ruleset and policy routing.
//! - [`nft`]: applies and removes a plan inside a namespace, through `nsenter`.
//! - [`cni`]: the unix-socket API between the `aether cni` entry point and the daemon.
//!
//! Which pods are local and when to apply is the daemon wiring's business; this module only
//! offers the steps. It never imports `proxy` (STYLE.md §6.2).

pub mod cni;
pub mod nft;
pub mod plan;

#[cfg(test)]
mod tests;
