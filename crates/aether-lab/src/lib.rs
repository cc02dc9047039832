//! aether's lab: what runs a whole mesh on one machine and judges it through real sockets. The
//! demo (`aether demo`), the lab topology (pods as network namespaces on node bridges) with its
//! stand-in API server and etcd, the leg catalogue of spec/legs.md, and the echo and probe
//! workloads. It sits on top of the daemon (`aether`) and the pure core (`aether-core`); the
//! `aether` binary lives here, so every subcommand stays in one binary.

pub mod demo;
pub mod lab;
pub mod legs;
pub mod workload;
