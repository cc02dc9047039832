//! `aether cni`: the CNI plugin kubelet's runtime runs for every pod sandbox, chained after the
//! cluster's primary CNI (docs/cni.md), and `aether cni install`, which puts the plugin on a
//! node and keeps it in the node's CNI configuration.
//!
//! - [`protocol`] (pure): the CNI environment and stdin in, what to print (or what to ask the
//!   daemon) out.
//! - [`plugin`] (IO): reads the environment and a bounded stdin, asks the daemon over its CNI
//!   socket ([`crate::capture::cni`]) with a timeout, and returns the output.
//! - [`conflist`] (pure): inserting the plugin into a conflist, and taking it out again.
//! - [`install`] (IO): the binary copy, the conflist edit on disk, and the watch.
//! - [`owner`]: whether the stopping installer takes the entry out (only when its DaemonSet is
//!   gone or being deleted: an uninstall), and the API read that tells.
//!
//! The plugin runs on the host, outside the image, so the binary is built statically (README.md,
//! "A static binary for the CNI plugin"); it resolves no names and loads no libraries.

pub mod conflist;
pub mod install;
pub mod owner;
pub mod plugin;
pub mod protocol;
