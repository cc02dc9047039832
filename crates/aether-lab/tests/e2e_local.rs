//! The local e2e suite (issue #3): the fixture of spec/legs.md as network namespaces on two
//! node bridges, two `aether node` daemons, every pod running its manifest's command, and every
//! leg of the catalogue through real sockets. It runs `aether demo --check`, which prints the
//! leg table and exits non-zero when a leg fails.
//!
//! It needs root, `ip`, `nft` and `nsenter`. Without them it prints SKIPPED, except under
//! `AETHER_REQUIRE_NETNS=1` (set by `.ci/run`), where it fails: the suite must never pass without
//! running (`src/test_util/needs_root.rs`).

use aether::test_util::needs_root;

mod e2e_common;

#[test]
fn every_leg_through_real_sockets() {
    if needs_root::cannot_run("every_leg_through_real_sockets", &["ip", "nft", "nsenter"]) {
        return;
    }
    e2e_common::demo_check(
        "aether-e2e",
        &["--prefix", "aee", "--netns-prefix", "e2e-"],
        56,
        &[
            "A1",
            "A13",
            "N19",
            "N23",
            "N28",
            "SWAP",
            "RET",
            "RESTART",
            "CNI",
            "BADSNI",
            "BADPEER",
            "BADHTTP",
            "METRICS",
            "EXPLAIN",
            "DUMP",
            "BINDING",
            "DUP-ADDR",
            "OVERLOAD",
            "SAME-MODEL",
            "H2C-SAME",
            "GRPC-SAME",
            "POLICY",
            "EP-KILL",
            "EP-APPKILL",
            "EP-REFUSE",
            "EP-BLACKHOLE",
        ],
    );
}
