//! The local topology ("lab"): a manifest directory built as pods and nodes on one machine.
//!
//! Every Pod becomes a network namespace on its node's bridge, every node a namespace of its
//! own linked to the others through one underlay bridge, and the cluster's Service routing is
//! stood in for the way kube-proxy's nftables mode does it: a user Service's ClusterIP is
//! translated in each node namespace to the Ready pods it selects, while a generated Service
//! (selectorless, no endpoints) gets no rule, so a passthrough to it reaches nothing, exactly as
//! in a cluster.
//!
//! - [`plan`] is pure: [`LabPlan::from_snapshot`] says what to create.
//! - [`run`] creates it ([`Lab::up`]), starts the daemons and the pods' commands, and removes
//!   exactly what it made ([`Lab::down`], also on drop, and [`Lab::cleanup_stale`] after a
//!   crash).
//! - [`plan_dir`] is the whole path from a directory: load, complete (the registrar's generated
//!   Services and ClusterIPs), read the pods' environment, plan.

pub mod apiserver;
pub mod etcd;
pub mod manifest;
pub mod plan;
pub mod run;

use std::path::Path;

use ipnet::IpNet;

pub use plan::{EnvValue, InvalidLab, LabOptions, LabPlan, NodePlan, PodEnv, PodPlan, ServiceRule};
pub use run::{Exited, Lab, LabError, UpOptions};

use aether::registry::file::{ManifestProblem, load_dir};
use aether_core::model::Snapshot;
use aether_core::model::registrar::complete_snapshot;

/// The default range of generated Services' ClusterIPs (ARCHITECTURE.md defaults).
pub const DEFAULT_SERVICE_CIDR: &str = "10.96.0.0/16";

/// A directory read and planned.
#[derive(Clone, Debug)]
pub struct PlannedDir {
    /// The completed snapshot (generated Services with their ClusterIPs included).
    pub snapshot: Snapshot,
    /// The plan.
    pub plan: LabPlan,
    /// Documents the registry skipped, to show the user.
    pub problems: Vec<ManifestProblem>,
}

/// Loads `dir` as the file registry does, completes it with `service_cidr`, and plans the lab.
pub fn plan_dir(
    dir: &Path,
    service_cidr: IpNet,
    opts: &LabOptions,
) -> Result<PlannedDir, LabError> {
    let load = load_dir(dir)?;
    let mut snapshot = load.snapshot;
    complete_snapshot(&mut snapshot, service_cidr);
    let env = read_pod_env(dir)?;
    let plan = LabPlan::from_snapshot_with_env(&snapshot, &env, opts)?;
    Ok(PlannedDir {
        snapshot,
        plan,
        problems: load.problems,
    })
}

/// The first container's environment of every Pod manifest under `dir` (see [`manifest`]).
pub fn read_pod_env(dir: &Path) -> Result<PodEnv, LabError> {
    let texts = aether::registry::file::read_manifests(dir)?;
    Ok(manifest::parse_pod_env(
        texts.iter().map(|(_, t)| t.as_str()),
    ))
}
