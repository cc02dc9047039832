//! The local e2e suite on the Kubernetes source (issue #9): the same fixture, pods and legs as
//! `tests/e2e_local.rs`, but the daemons watch the lab's API server (`aether lab-apiserver`,
//! loaded from the manifest directory and started in the underlay namespace) instead of the
//! directory. Every leg must pass, the Kubernetes source's own fault legs (KSTOP, KEXPIRE,
//! K-FORBID) included, the registrar and the route-status writer must be seen writing through
//! the server, and a DaemonSet rollout of a node (K-ROLLOUT: the daemons and the CNI installers
//! changing places) must lose nothing and start no pod uncaptured. It runs `aether demo --check
//! --registry-source kube`.
//!
//! Root, `ip`, `nft` and `nsenter` are needed, as for the file-registry run; without them it
//! prints SKIPPED, and fails under `AETHER_REQUIRE_NETNS=1` (`src/test_util/needs_root.rs`).

use aether::test_util::needs_root;

mod e2e_common;

#[test]
fn every_leg_on_the_kubernetes_source() {
    if needs_root::cannot_run(
        "every_leg_on_the_kubernetes_source",
        &["ip", "nft", "nsenter"],
    ) {
        return;
    }
    e2e_common::demo_check(
        "aether-e2e-kube",
        &[
            "--registry-source",
            "kube",
            "--prefix",
            "aek",
            "--netns-prefix",
            "e2k-",
        ],
        61,
        &[
            "A1",
            "A13",
            "N23",
            "SWAP",
            "RET",
            "RESTART",
            "UPGRADE",
            "KWRITES",
            "KSTOP",
            "KEXPIRE",
            "KDASH",
            "K-FORBID",
            "BINDING",
            "DUP-ADDR",
            "OVERLOAD",
            "SAME-MODEL",
            "H2C-SAME",
            "GRPC-SAME",
            "K-ROLLOUT",
            "K-POLICY",
            "POLICY",
        ],
    );
}
