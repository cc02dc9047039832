//! Mesh DNS inside each pod (model.md §11): A and AAAA records for mesh names (and, in file
//! mode, Kubernetes Service names), every other query forwarded upstream.
//!
//! - [`table`] (PURE) builds the names from a completed snapshot;
//! - [`resolv`] (PURE) writes a pod's resolv.conf and reads upstreams from the host's;
//! - [`server`] (IO) answers on sockets the daemon opened in the pod's network namespace.

pub use aether_core::dns::{resolv, table};

pub mod server;
#[cfg(test)]
mod table_tests;

pub use resolv::{parse_resolv_conf, resolv_conf};
pub use server::{DnsCounts, DnsServer, DnsStats, ForwardSocketFactory, TcpLimits};
pub use table::{DnsTable, Lookup, QueryKind};
