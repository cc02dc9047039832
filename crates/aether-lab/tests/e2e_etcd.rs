//! The local e2e suite on the etcd source (issue #12): the same fixture, pods and legs as
//! `tests/e2e_local.rs`, but the daemons read every node's rows from a real etcd (Debian's
//! `etcd-server`, started by the demo in the underlay namespace with its data under the run
//! directory) and register their own pods there under a lease, with delegated liveness as the
//! rows' readiness. Every leg must pass. It runs `aether demo --check --registry-source etcd`.
//!
//! Root, `ip`, `nft`, `nsenter` and `etcd` are needed; without them it prints SKIPPED, and fails
//! under `AETHER_REQUIRE_NETNS=1` (`src/test_util/needs_root.rs`).

use aether::test_util::needs_root;

mod e2e_common;

#[test]
fn every_leg_on_the_etcd_source() {
    if needs_root::cannot_run(
        "every_leg_on_the_etcd_source",
        &["ip", "nft", "nsenter", "etcd"],
    ) {
        return;
    }
    e2e_common::demo_check(
        "aether-e2e-etcd",
        &[
            "--registry-source",
            "etcd",
            "--prefix",
            "aet",
            "--netns-prefix",
            "e2t-",
        ],
        56,
        &[
            "A1",
            "A13",
            "N23",
            "SWAP",
            "RET",
            "RESTART",
            "UPGRADE",
            "CNI",
            "DUMP",
            "BINDING",
            "DUP-ADDR",
            "OVERLOAD",
            "SAME-MODEL",
            "H2C-SAME",
            "GRPC-SAME",
            "POLICY",
        ],
    );
}
