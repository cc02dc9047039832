//! The CNI protocol as a table of invocations: environment and stdin in, plan and output out.

use super::*;

/// A bridge + host-local result as the primary plugin prints it (1.0.0 shape): the host-side
/// interfaces come first, the sandbox's `eth0` last; odd spacing and key order on purpose, so
/// that a re-serialisation would show.
const PREV_1_0: &str = r#"{"cniVersion":"1.0.0","interfaces":[{"name":"cni0","mac":"aa:bb:cc:00:00:01"},{"name":"veth1","mac":"aa:bb:cc:00:00:02"},{"name":"eth0","mac":"aa:bb:cc:00:00:03","sandbox":"/var/run/netns/p"}],"ips":[{"interface":2,"address":"10.1.0.5/24","gateway":"10.1.0.1"},{"interface":0,"address":"10.1.0.1/24"}],  "routes":[{"dst":"0.0.0.0/0"}],"dns":{}}"#;

/// The same in the 0.3.x shape (`version` in each ip).
const PREV_0_3: &str = r#"{"cniVersion":"0.3.1","interfaces":[{"name":"eth0","sandbox":"/proc/42/ns/net"}],"ips":[{"version":"4","interface":0,"address":"10.1.0.6/24"},{"version":"6","interface":0,"address":"fd00::6/64"}],"dns":{}}"#;

fn env(command: &str) -> CniEnv {
    CniEnv {
        command: Some(command.to_owned()),
        container_id: Some("c0ffee".to_owned()),
        netns: Some("/var/run/netns/p".to_owned()),
        ifname: Some("eth0".to_owned()),
        args: Some("IgnoreUnknown=1;K8S_POD_NAMESPACE=mp;K8S_POD_NAME=mp-client-0;K8S_POD_INFRA_CONTAINER_ID=c0ffee".to_owned()),
        path: Some("/opt/cni/bin".to_owned()),
    }
}

fn conf(version: &str, prev: Option<&str>, extra: &str) -> String {
    let prev = prev
        .map(|p| format!(r#","prevResult":{p}"#))
        .unwrap_or_default();
    format!(r#"{{"cniVersion":"{version}","name":"k8s","type":"aether-cni"{extra}{prev}}}"#)
}

fn done(plan: Plan) -> Output {
    match plan {
        Plan::Done(o) => o,
        Plan::Ask(a) => panic!("expected an answer without the daemon, got {a:?}"),
    }
}

fn asked(plan: Plan) -> Ask {
    match plan {
        Plan::Ask(a) => a,
        Plan::Done(o) => panic!("expected a question for the daemon, got {o:?}"),
    }
}

fn error(out: &Output) -> serde_json::Value {
    assert_eq!(out.exit, 1, "{out:?}");
    serde_json::from_str(&out.stdout).unwrap()
}

#[test]
fn version_answers_every_supported_version_whatever_stdin_holds() {
    let expected =
        r#"{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}"#;
    for stdin in [&b"{\"cniVersion\":\"0.3.1\"}"[..], b"", b"\xff not json"] {
        let out = done(plan(&env("VERSION"), stdin));
        assert_eq!(out.exit, 0);
        assert_eq!(out.stdout.trim_end(), expected);
    }
}

#[test]
fn add_asks_the_daemon_with_the_sandbox_addresses_and_prints_prev_result_byte_for_byte() {
    let stdin = conf(
        "1.0.0",
        Some(PREV_1_0),
        r#","socket":"/run/a/cni.sock","timeoutSecs":5"#,
    );
    let ask = asked(plan(&env("ADD"), stdin.as_bytes()));
    assert_eq!(ask.socket, PathBuf::from("/run/a/cni.sock"));
    assert_eq!(ask.timeout, Duration::from_secs(5));
    assert_eq!(
        ask.command,
        Some(CniCommand::Add {
            namespace: "mp".into(),
            pod: "mp-client-0".into(),
            netns: "/var/run/netns/p".into(),
            // 10.1.0.1 is on the host's bridge, not in the sandbox.
            ips: vec!["10.1.0.5".parse().unwrap()],
        })
    );
    let out = finish(&ask, Ok(()));
    assert_eq!(out.exit, 0);
    assert_eq!(out.stdout, format!("{PREV_1_0}\n"));
}

#[test]
fn add_passes_prev_result_through_unchanged_in_every_supported_version() {
    for version in SUPPORTED_VERSIONS {
        let prev = if version.starts_with("0.3") {
            PREV_0_3
        } else {
            PREV_1_0
        };
        let ask = asked(plan(&env("ADD"), conf(version, Some(prev), "").as_bytes()));
        assert_eq!(ask.version, *version);
        assert_eq!(ask.socket, PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(ask.timeout, DEFAULT_TIMEOUT);
        assert_eq!(
            finish(&ask, Ok(())).stdout,
            format!("{prev}\n"),
            "{version}"
        );
    }
    let ask = asked(plan(
        &env("ADD"),
        conf("0.3.1", Some(PREV_0_3), "").as_bytes(),
    ));
    let Some(CniCommand::Add { ips, .. }) = ask.command else {
        panic!("{ask:?}")
    };
    assert_eq!(
        ips,
        [
            "10.1.0.6".parse::<IpAddr>().unwrap(),
            "fd00::6".parse().unwrap()
        ]
    );
}

#[test]
fn add_without_prev_result_is_an_error_even_in_an_ignored_namespace() {
    for args in [
        "K8S_POD_NAMESPACE=mp;K8S_POD_NAME=p",
        "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=p",
        "",
    ] {
        let mut e = env("ADD");
        e.args = Some(args.to_owned());
        for prev in [None, Some("null")] {
            let out = done(plan(&e, conf("1.1.0", prev, "").as_bytes()));
            let err = error(&out);
            assert_eq!(err["code"], code::INVALID_CONFIG);
            assert_eq!(err["cniVersion"], "1.1.0");
            assert!(err["msg"].as_str().unwrap().contains("chained"), "{err}");
        }
    }
}

#[test]
fn ignored_namespaces_and_pods_without_kubernetes_args_pass_through_without_the_daemon() {
    let mut e = env("ADD");
    e.args = Some("K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-0".to_owned());
    let out = done(plan(&e, conf("1.0.0", Some(PREV_1_0), "").as_bytes()));
    assert_eq!(
        (out.exit, out.stdout.as_str()),
        (0, format!("{PREV_1_0}\n").as_str())
    );
    // The configuration's list replaces the default.
    let listed = conf("1.0.0", Some(PREV_1_0), r#","ignoredNamespaces":["mp"]"#);
    let out = done(plan(&env("ADD"), listed.as_bytes()));
    assert_eq!(out.stdout, format!("{PREV_1_0}\n"));
    let not_listed = conf("1.0.0", Some(PREV_1_0), r#","ignoredNamespaces":[]"#);
    assert!(matches!(plan(&e, not_listed.as_bytes()), Plan::Ask(_)));
    for args in [
        None,
        Some(""),
        Some("K8S_POD_NAMESPACE=mp"),
        Some("K8S_POD_NAMESPACE=mp;K8S_POD_NAME="),
    ] {
        let mut e = env("ADD");
        e.args = args.map(str::to_owned);
        let out = done(plan(&e, conf("1.0.0", Some(PREV_1_0), "").as_bytes()));
        assert_eq!(out.stdout, format!("{PREV_1_0}\n"), "{args:?}");
        for verb in ["DEL", "CHECK"] {
            e.command = Some(verb.to_owned());
            let out = done(plan(&e, conf("1.0.0", Some(PREV_1_0), "").as_bytes()));
            assert_eq!((out.exit, out.stdout.as_str()), (0, ""), "{verb} {args:?}");
        }
    }
}

#[test]
fn a_daemon_that_is_not_ready_refuses_or_times_out_fails_add_with_a_cni_error() {
    let ask = asked(plan(
        &env("ADD"),
        conf("0.3.1", Some(PREV_0_3), "").as_bytes(),
    ));
    for (outcome, code) in [
        (
            AskError::NotReady("No such file or directory".into()),
            code::TRY_AGAIN,
        ),
        (AskError::Timeout(Duration::from_secs(20)), code::TRY_AGAIN),
        (
            AskError::TryAgain("pod mp/p is not in the node's registry yet".into()),
            code::TRY_AGAIN,
        ),
        (
            AskError::Refused("pod mp/p is not served: bind 18081".into()),
            code::DAEMON_REFUSED,
        ),
        (
            AskError::Io("the daemon closed the connection".into()),
            code::IO,
        ),
    ] {
        let out = finish(&ask, Err(outcome.clone()));
        let err = error(&out);
        assert_eq!(err["code"], code, "{outcome:?}");
        assert_eq!(err["cniVersion"], "0.3.1");
        assert!(!err["msg"].as_str().unwrap().is_empty());
        assert!(out.note.is_some());
        if let AskError::Refused(reason) | AskError::TryAgain(reason) = &outcome {
            assert_eq!(err["details"], reason.as_str());
        }
        assert_eq!(out.error_code(), Some(code));
    }
}

#[test]
fn del_tells_the_daemon_and_succeeds_when_the_daemon_is_gone() {
    let mut e = env("DEL");
    // The runtime may have no namespace any more at DEL.
    e.netns = None;
    let ask = asked(plan(&e, conf("1.1.0", Some(PREV_1_0), "").as_bytes()));
    assert_eq!(
        ask.command,
        Some(CniCommand::Del {
            namespace: "mp".into(),
            pod: "mp-client-0".into(),
            netns: None
        })
    );
    assert_eq!(finish(&ask, Ok(())), Output::ok(String::new()));
    for outcome in [
        AskError::NotReady("gone".into()),
        AskError::Timeout(Duration::from_secs(1)),
        AskError::Refused("no".into()),
        AskError::TryAgain("not yet".into()),
        AskError::Io("broken".into()),
    ] {
        let out = finish(&ask, Err(outcome));
        assert_eq!((out.exit, out.stdout.as_str()), (0, ""));
        assert!(out.note.unwrap().contains("DEL not told"));
    }
}

#[test]
fn check_asks_the_daemon_from_0_4_0_and_is_refused_before() {
    let ask = asked(plan(
        &env("CHECK"),
        conf("1.0.0", Some(PREV_1_0), "").as_bytes(),
    ));
    assert!(matches!(ask.command, Some(CniCommand::Check { ref pod, .. }) if pod == "mp-client-0"));
    assert_eq!(finish(&ask, Ok(())).stdout, "");
    let err = error(&finish(
        &ask,
        Err(AskError::Refused("pod mp/p is not served".into())),
    ));
    assert_eq!(err["code"], code::DAEMON_REFUSED);
    for v in ["0.3.0", "0.3.1"] {
        let err = error(&done(plan(
            &env("CHECK"),
            conf(v, Some(PREV_0_3), "").as_bytes(),
        )));
        assert_eq!(err["code"], code::INCOMPATIBLE_VERSION, "{v}");
    }
}

#[test]
fn gc_and_status_are_1_1_0_commands_and_status_reports_a_missing_daemon() {
    let out = done(plan(
        &env("GC"),
        conf("1.1.0", None, r#","cni.dev/valid-attachments":[]"#).as_bytes(),
    ));
    assert_eq!((out.exit, out.stdout.as_str()), (0, ""));
    let ask = asked(plan(
        &CniEnv {
            command: Some("STATUS".into()),
            ..CniEnv::default()
        },
        conf("1.1.0", None, "").as_bytes(),
    ));
    assert_eq!(ask.command, None);
    assert_eq!(finish(&ask, Ok(())).exit, 0);
    let err = error(&finish(
        &ask,
        Err(AskError::NotReady("connection refused".into())),
    ));
    assert_eq!(err["code"], code::NOT_AVAILABLE);
    for verb in ["GC", "STATUS"] {
        let err = error(&done(plan(&env(verb), conf("1.0.0", None, "").as_bytes())));
        assert_eq!(err["code"], code::INCOMPATIBLE_VERSION, "{verb}");
    }
}

#[test]
fn unsupported_versions_are_error_code_1() {
    for stdin in [
        conf("0.2.0", Some(PREV_0_3), ""),
        conf("2.0.0", Some(PREV_1_0), ""),
        r#"{"name":"k8s","type":"aether-cni"}"#.to_owned(),
    ] {
        let err = error(&done(plan(&env("ADD"), stdin.as_bytes())));
        assert_eq!(err["code"], code::INCOMPATIBLE_VERSION, "{stdin}");
        assert_eq!(err["cniVersion"], LATEST);
        assert!(
            err["details"]
                .as_str()
                .unwrap()
                .contains("0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0")
        );
    }
}

#[test]
fn hostile_input_is_a_clear_cni_error() {
    let huge = vec![b' '; MAX_STDIN + 1];
    let cases: Vec<(&str, Vec<u8>, u32)> = vec![
        ("not json", b"{cniVersion".to_vec(), code::DECODE),
        (
            "not utf-8",
            b"{\"cniVersion\":\"1.0.0\xff\"}".to_vec(),
            code::DECODE,
        ),
        ("too large", huge, code::DECODE),
        ("empty", Vec::new(), code::DECODE),
        ("wrong types", br#"{"cniVersion":5}"#.to_vec(), code::DECODE),
        (
            "wrong list",
            br#"{"cniVersion":"1.0.0","ignoredNamespaces":"kube-system"}"#.to_vec(),
            code::DECODE,
        ),
        (
            "bad address",
            conf("1.0.0", Some(r#"{"ips":[{"address":"ten/24"}]}"#), "").into_bytes(),
            code::DECODE,
        ),
        (
            "zero timeout",
            conf("1.0.0", Some(PREV_1_0), r#","timeoutSecs":0"#).into_bytes(),
            code::INVALID_CONFIG,
        ),
    ];
    for (what, stdin, code) in cases {
        let out = done(plan(&env("ADD"), &stdin));
        assert_eq!(error(&out)["code"], code, "{what}");
    }
    let mut e = env("ADD");
    e.args = Some("K8S_POD_NAMESPACE".into());
    assert_eq!(
        error(&done(plan(
            &e,
            conf("1.0.0", Some(PREV_1_0), "").as_bytes()
        )))["code"],
        code::INVALID_ENV
    );
    for (var, e) in [
        (
            "CNI_COMMAND",
            CniEnv {
                command: None,
                ..env("ADD")
            },
        ),
        (
            "unknown",
            CniEnv {
                command: Some("FROB".into()),
                ..env("ADD")
            },
        ),
        (
            "CNI_NETNS",
            CniEnv {
                netns: None,
                ..env("ADD")
            },
        ),
        (
            "CNI_CONTAINERID",
            CniEnv {
                container_id: Some(String::new()),
                ..env("CHECK")
            },
        ),
        (
            "CNI_IFNAME",
            CniEnv {
                ifname: None,
                ..env("DEL")
            },
        ),
    ] {
        let err = error(&done(plan(
            &e,
            conf("1.0.0", Some(PREV_1_0), "").as_bytes(),
        )));
        assert_eq!(err["code"], code::INVALID_ENV, "{var}");
    }
}

proptest::proptest! {
    /// Whatever the runtime writes, the plugin answers: a plan, never a panic; and an error is
    /// a JSON object with a code.
    #[test]
    fn any_stdin_gives_an_answer(stdin in proptest::collection::vec(proptest::num::u8::ANY, 0..300), verb in 0usize..6) {
        let verbs = ["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"];
        let out = match plan(&env(verbs[verb]), &stdin) {
            Plan::Done(o) => o,
            Plan::Ask(a) => finish(&a, Err(AskError::NotReady("test".into()))),
        };
        if out.exit != 0 {
            proptest::prop_assert!(out.error_code().is_some(), "{:?}", out);
        }
    }
}
