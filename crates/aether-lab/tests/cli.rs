//! `aether explain` as a user runs it: the binary, the example registry, the acceptance examples
//! of issue #2, and clear errors for bad input.
#![allow(clippy::unwrap_used)] // Tests unwrap: a panic is the failure report (STYLE.md §6.4).

use std::process::{Command, Output};

fn explain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aether"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .arg("explain")
        .args(args)
        .output()
        .unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = explain(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_host_naming_another_port_is_421_port_mismatch_with_the_ports() {
    let v = json(&[
        "--from",
        "mp/mp-client",
        "--dial",
        "mp-multi.mp.aether.internal:8080",
        "--host",
        "mp-multi.mp.aether.internal:9090",
    ]);
    assert_eq!(v["request"]["status"], 421);
    assert_eq!(v["request"]["reason"], "port-mismatch");
    assert_eq!(
        v["request"]["body"],
        "port-mismatch\nservice: mp-multi.mp.aether.internal\nports: 8080/http 9090/http\n"
    );
}

#[test]
fn a_port_less_host_on_the_proxy_port_is_port_80_and_not_declared() {
    let v = json(&[
        "--from",
        "mp/mp-client-nocapture",
        "--dial",
        "127.0.0.1:18081",
        "--host",
        "mp-httponly.mp.aether.internal",
    ]);
    assert_eq!(v["request"]["status"], 421);
    assert_eq!(v["request"]["reason"], "port-not-declared");
    assert!(
        v["request"]["body"]
            .as_str()
            .unwrap()
            .ends_with("ports: 8080/http\n")
    );
}

#[test]
fn a_declared_raw_tcp_port_is_decided_at_accept() {
    let v = json(&[
        "--from",
        "mp/mp-client",
        "--dial",
        "mp-mixed.mp.aether.internal:9000",
        "--bytes",
        "none",
    ]);
    assert_eq!(v["connection"]["outcome"], "tcp");
    assert!(
        v["request"].is_null(),
        "no byte is read, so no request exists"
    );
    let to = v["connection"]["target"][0].as_str().unwrap();
    assert!(
        to.contains("mp/mp-mixed port 9000 -> pod port 9000"),
        "{to}"
    );
}

#[test]
fn the_table_output_shows_the_answer_and_the_rule() {
    let out = explain(&[
        "--from",
        "mp/mp-client",
        "--dial",
        "mp-multi.mp.aether.internal:7777",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("refuse 421  x-aether-error: port-not-declared"),
        "{text}"
    );
    assert!(text.contains("addressing.md §5 C3"), "{text}");
}

#[test]
fn bad_questions_and_registries_get_clear_errors_and_exit_2() {
    for (args, says) in [
        (
            vec!["--from", "mp/nobody", "--dial", "mp-multi:8080"],
            "no such pod",
        ),
        (
            vec!["--from", "mp/mp-client", "--dial", "mp-multi"],
            "expected <name-or-ip>:<port>",
        ),
        (
            vec!["--from", "mp/mp-client", "--dial", "nosuch.example:80"],
            "resolves to no address",
        ),
        (
            vec!["--from", "mp-ext/ext-http-0", "--dial", "mp-multi:8080"],
            "not managed",
        ),
        (
            vec![
                "--from",
                "mp/mp-client",
                "--dial",
                "mp-multi:8080",
                "--bytes",
                "smtp",
            ],
            "--bytes",
        ),
        (
            vec![
                "--registry",
                "/nonexistent/registry",
                "--from",
                "mp/mp-client",
                "--dial",
                "mp-multi:8080",
            ],
            "/nonexistent/registry",
        ),
    ] {
        let out = explain(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn a_bad_manifest_is_reported_with_file_document_and_field_and_the_rest_is_used() {
    let dir = std::env::temp_dir().join(format!("aether-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fixture = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .join("config/examples/mp");
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    std::fs::write(
        dir.join("99-bad.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: broken\n  namespace: mp\nspec:\n  ports:\n  - port: 70000\n",
    )
    .unwrap();
    let out = explain(&[
        "--registry",
        dir.to_str().unwrap(),
        "--from",
        "mp/mp-client",
        "--dial",
        "mp-multi.mp.aether.internal:8080",
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("99-bad.yaml"), "{err}");
    assert!(err.contains("document 1"), "{err}");
    assert!(err.contains("ports"), "names the field: {err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("deliver"));
}

#[test]
fn a_raw_tcp_connection_shows_the_destinations_connection_level_authorization() {
    // model.md §12.5 item 2, with the variant deny-rbac-tcp (only mp-other/mp-client-other may
    // reach mp-mixed).
    let dir = std::env::temp_dir().join(format!("aether-cli-rbac-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let root =
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("config/examples");
    for from in [root.join("mp"), root.join("variants/deny-rbac-tcp")] {
        for entry in std::fs::read_dir(&from).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
            }
        }
    }
    let ask = |from: &str| {
        json(&[
            "--registry",
            dir.to_str().unwrap(),
            "--from",
            from,
            "--dial",
            "mp-mixed.mp.aether.internal:9000",
            "--bytes",
            "raw",
        ])
    };
    let denied = ask("mp/mp-client");
    let allowed = ask("mp-other/mp-client-other");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(denied["connection"]["outcome"], "tcp");
    let line = denied["connection"]["filters"][0].as_str().unwrap();
    assert!(
        line.contains("rbac mp/mp-mixed-rbac of mp/mp-mixed denies the caller")
            && line.contains("closed before a byte reaches the application"),
        "{line}"
    );
    let line = allowed["connection"]["filters"][0].as_str().unwrap();
    assert!(
        line.contains("lets mp-other/mp-client-other through"),
        "{line}"
    );
}
