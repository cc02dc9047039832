//! Test helpers of the daemon: root checks, golden files, descriptor counts, the acceptance
//! fixture as the daemon loads it, and (re-exported from aether-core's `testing` feature) the
//! reference evaluator with its comparable verdicts (spec/model.md §13 item 5).
//!
//! Compiled only for tests and under the `testing` feature. Nothing here is used by the
//! daemon.

pub mod fds;
pub mod golden;
// tower-test is a dev-dependency: only the library's own unit tests have it.
#[cfg(test)]
pub mod kube_mock;
pub mod needs_root;

/// The reference evaluator and the comparable verdicts live in aether-core (its `testing`
/// feature), beside the model they read.
pub use aether_core::reference::evaluator as reference;
pub use aether_core::reference::*;

/// A mesh hop TLS for tests that open no hop: no server configuration, no peer.
#[derive(Debug)]
pub struct NoTls;

impl crate::proxy::HopTls for NoTls {
    fn client(&self, _: &str, _: &str, _: &[u8]) -> std::sync::Arc<rustls::ClientConfig> {
        unreachable!("this test opens no mesh hop")
    }
    fn server(&self, _: &str, _: &str) -> Option<std::sync::Arc<rustls::ServerConfig>> {
        None
    }
    fn peer(&self, _: &[rustls::pki_types::CertificateDer<'_>]) -> Option<crate::proxy::Peer> {
        None
    }
}

/// The acceptance fixture (`config/examples/mp`) as the daemon holds it: read by the file
/// registry, the registrar's generated Services added (service CIDR `10.96.0.0/16`).
///
/// # Panics
/// When the fixture does not load (a test helper).
#[allow(clippy::unwrap_used)]
pub fn mp_fixture() -> crate::model::Snapshot {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut snapshot = crate::registry::file::load_dir(&root.join("config/examples/mp"))
        .unwrap()
        .snapshot;
    crate::model::registrar::complete_snapshot(&mut snapshot, "10.96.0.0/16".parse().unwrap());
    snapshot
}

/// The CPU time the calling thread has spent, in microseconds: a bound on work that must be
/// cheap (a refusal), unmoved by other threads' load.
pub fn thread_cpu_micros() -> i64 {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD)
        .expect("getrusage");
    let (user, system) = (usage.user_time(), usage.system_time());
    (user.tv_sec() + system.tv_sec()) * 1_000_000 + user.tv_usec() + system.tv_usec()
}
