//! `aether probe --legs` names the mesh's services under the mesh domain it is given
//! (`--mesh-domain`, which e2e/run passes from the chart's `mesh.domain`), not under the default.
//!
//! The probe runs in a network namespace of the test's own with only loopback: no mesh DNS
//! answers there, so leg A1 fails at its first name, and its line in the table says which name
//! it dialled. Needs root, `unshare` and `ip` (`src/test_util/needs_root.rs` otherwise).
#![allow(clippy::unwrap_used)] // Tests unwrap: a panic is the failure report (STYLE.md §6.4).

use std::process::Command;

use aether::test_util::needs_root;

/// The leg table of `aether probe --legs --leg A1` from mp-client, with `extra` flags, run in a
/// new network namespace.
fn a1_in_an_empty_namespace(extra: &[&str]) -> String {
    let out = Command::new("unshare")
        .args([
            "--net",
            "--",
            "sh",
            "-c",
            r#"ip link set lo up && exec "$@""#,
            "sh",
        ])
        .arg(env!("CARGO_BIN_EXE_aether"))
        .args(["probe", "--legs", "--pod", "mp-client", "--leg", "A1"])
        .args(["--registry", "config/examples/mp"])
        .args(extra)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env_remove("AETHER_MESH_DOMAIN")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "A1 cannot pass without a mesh: {table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    table
}

#[test]
fn probe_legs_dials_the_services_under_the_mesh_domain_it_is_given() {
    const TEST: &str = "probe_legs_dials_the_services_under_the_mesh_domain_it_is_given";
    if needs_root::cannot_run(TEST, &["unshare", "ip"]) {
        return;
    }
    // Written as an operator might; compared as a name.
    let given = a1_in_an_empty_namespace(&["--mesh-domain", "Mesh.Example."]);
    assert!(
        given.contains("A1 ") && given.contains("mp-client → mp-httponly.mp.mesh.example:8080"),
        "{given}"
    );
    assert!(!given.contains("aether.internal"), "{given}");

    let default = a1_in_an_empty_namespace(&[]);
    assert!(
        default.contains("mp-client → mp-httponly.mp.aether.internal:8080"),
        "{default}"
    );
}
