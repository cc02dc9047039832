//! Root-only: the kube-proxy stand-in answers hairpin traffic. `tests/fixtures/lab-hairpin` is
//! built as a lab without daemons (both pods are unmanaged, so nothing captures their traffic);
//! hp-echo-0 runs `aether echo --http 8080` and dials its own Service's ClusterIP from inside
//! its own namespace, and is answered by itself, masqueraded to the node's bridge address, as
//! kube-proxy does it. Another pod of the node dialling the same ClusterIP keeps its own address.
//!
//! Without root, `ip`, `nft` or `sysctl` it prints SKIPPED, or fails under
//! `AETHER_REQUIRE_NETNS=1` (`src/test_util/needs_root.rs`).

#![allow(clippy::unwrap_used)] // Tests unwrap: a panic is the failure report (STYLE.md §6.4).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aether_lab::lab::{DEFAULT_SERVICE_CIDR, Lab, LabOptions, UpOptions, plan_dir};

use aether::test_util::needs_root;

/// The fixture's Service hp/hp-echo.
const CLUSTER_IP: &str = "10.96.90.10:80";

/// What the echo said to one `aether probe` from inside `netns`: (status, body, x-echo-peer).
fn probe_from(netns: &str) -> (Option<u64>, String, Option<String>) {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            netns,
            env!("CARGO_BIN_EXE_aether"),
            "probe",
        ])
        .args(["--dial", CLUSTER_IP, "--timeout", "2", "-o", "json"])
        .output()
        .expect("run aether probe");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("probe from {netns}: {e}: {text:?} {:?}", out.stderr));
    let peer = json["headers"].as_array().and_then(|hs| {
        hs.iter()
            .find(|h| h[0] == "x-echo-peer")
            .and_then(|h| h[1].as_str().map(str::to_owned))
    });
    let status = json["status"].as_u64();
    let body = json["body"].as_str().unwrap_or_default().to_owned();
    assert!(status.is_some(), "probe from {netns} got no answer: {line}");
    (status, body, peer)
}

#[test]
fn a_pod_dialling_its_own_service_is_answered_by_itself_through_the_cluster_ip() {
    if needs_root::cannot_run(
        "a_pod_dialling_its_own_service_is_answered_by_itself_through_the_cluster_ip",
        &["ip", "nft", "sysctl"],
    ) {
        return;
    }
    let fixture =
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("tests/fixtures/lab-hairpin");
    let run_dir: PathBuf = std::env::temp_dir().join("aether-lab-hairpin-test");
    Lab::cleanup_stale(&run_dir, Duration::from_secs(1)).unwrap();
    let opts = LabOptions {
        prefix: "labhp".to_owned(),
        pod_netns_prefix: "labhp-".to_owned(),
        binary: PathBuf::from(env!("CARGO_BIN_EXE_aether")),
        ..LabOptions::default()
    };
    let planned = plan_dir(&fixture, DEFAULT_SERVICE_CIDR.parse().unwrap(), &opts).unwrap();
    let names: Vec<String> = std::iter::once(planned.plan.underlay_netns.clone())
        .chain(planned.plan.nodes.iter().map(|n| n.netns.clone()))
        .chain(planned.plan.pods.iter().map(|p| p.netns.clone()))
        .collect();
    let bridge = planned.plan.node("node-h").unwrap().bridge_addr;
    assert_eq!(bridge, Ipv4Addr::new(10, 244, 9, 1));

    let mut lab = Lab::up(planned.plan, UpOptions::new(&run_dir)).unwrap();
    assert_eq!(lab.start_pods().unwrap(), 1, "only hp-echo-0 has a command");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(lab.wait_tcp("hp", "hp-echo-0", 8080, Duration::from_secs(10)))
        .unwrap();

    // Hairpin: hp-echo-0 -> its Service -> hp-echo-0, answered from the ClusterIP. The echo
    // sees the node's bridge address: the connection was masqueraded.
    let (status, body, peer) = probe_from("labhp-hp-echo-0");
    assert_eq!(status, Some(200));
    assert_eq!(body, "hp-echo:8080\n");
    assert_eq!(
        peer.as_deref(),
        Some("10.244.9.1"),
        "hairpin is masqueraded"
    );

    // Any other pod keeps its source address (kube-proxy masquerades hairpin traffic only).
    let (status, body, peer) = probe_from("labhp-hp-client");
    assert_eq!((status, body.as_str()), (Some(200), "hp-echo:8080\n"));
    assert_eq!(peer.as_deref(), Some("10.244.9.20"), "not masqueraded");

    lab.down().unwrap();
    for name in &names {
        assert!(
            !Path::new(aether::netns::NETNS_DIR).join(name).exists(),
            "{name} is left behind"
        );
    }
    std::fs::remove_dir_all(&run_dir).unwrap();
}
