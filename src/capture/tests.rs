//! Capture tests: golden rulesets and rule order of the pure plan.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use super::plan::{self, Mode, PodCapture};
use crate::marks::{SOCKET_MARK, TPROXY_MARK};

fn redirect_all_v4() -> PodCapture {
    PodCapture {
        namespace: "mp".into(),
        name: "mp-client".into(),
        ipv4: Some(Ipv4Addr::new(10, 244, 1, 7)),
        ipv6: None,
        mode: Mode::RedirectAll,
        exclude_ports: vec![],
        exclude_ranges: vec![],
        udp: false,
    }
}

fn scoped_dual_stack() -> PodCapture {
    PodCapture {
        namespace: "mp".into(),
        name: "mp-scoped".into(),
        ipv4: Some(Ipv4Addr::new(10, 244, 1, 8)),
        ipv6: Some("fd00:10:244:1::8".parse().unwrap()),
        mode: Mode::Scoped,
        // Duplicates and disorder are normalised away.
        exclude_ports: vec![9090, 5432, 9090],
        // 10.1.0.0/16 lies inside 10.0.0.0/8; 192.168.1.7/24 has host bits.
        exclude_ranges: vec![
            "10.0.0.0/8".parse().unwrap(),
            "10.1.0.0/16".parse().unwrap(),
            "192.168.1.7/24".parse().unwrap(),
            "fd00:abcd::/32".parse().unwrap(),
        ],
        udp: true,
    }
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/capture/golden")
}

/// Compare `actual` with the golden file `name`; rewrite it instead when `UPDATE_GOLDEN=1`.
fn golden(name: &str, actual: &str) {
    let path = golden_dir().join(name);
    if std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("read {}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    assert_eq!(
        actual,
        expected,
        "{} differs from the rendered text (run with UPDATE_GOLDEN=1 to accept)",
        path.display()
    );
}

fn routes_text(p: &plan::CapturePlan) -> String {
    let mut s = String::from("# apply\n");
    for c in p.route_commands() {
        s.push_str(&format!("{c}\n"));
    }
    s.push_str("# remove\n");
    for c in p.route_removals() {
        s.push_str(&format!("{c}\n"));
    }
    s
}

#[test]
fn golden_redirect_all_ipv4() {
    let p = plan::plan(&redirect_all_v4());
    golden("redirect_all_v4.nft", &p.ruleset());
    golden("redirect_all_v4.routes", &routes_text(&p));
}

#[test]
fn golden_scoped_dual_stack_with_exclusions_and_udp() {
    let p = plan::plan(&scoped_dual_stack());
    golden("scoped_dual_stack.nft", &p.ruleset());
    golden("scoped_dual_stack.routes", &routes_text(&p));
}

/// The rule lines of one chain of a rendered ruleset, comments and the `type` line left out.
fn chain_rules(ruleset: &str, chain: &str) -> Vec<String> {
    let mut lines = ruleset.lines().map(str::trim);
    let header = format!("chain {chain} {{");
    assert!(
        lines.any(|l| l == header),
        "no chain {chain} in:\n{ruleset}"
    );
    lines
        .take_while(|l| *l != "}")
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("type "))
        .map(str::to_owned)
        .collect()
}

fn every_pod_shape() -> Vec<PodCapture> {
    let mut out = Vec::new();
    for mode in [Mode::RedirectAll, Mode::Scoped] {
        for udp in [false, true] {
            for exclusions in [false, true] {
                for base in [redirect_all_v4(), scoped_dual_stack()] {
                    let mut p = base;
                    p.mode = mode;
                    p.udp = udp;
                    if !exclusions {
                        p.exclude_ports.clear();
                        p.exclude_ranges.clear();
                    }
                    out.push(p);
                }
            }
        }
    }
    out
}

#[test]
fn u14_the_daemons_socket_mark_is_accepted_before_every_other_output_rule() {
    let first = format!("meta mark {SOCKET_MARK:#010x} ct mark set {SOCKET_MARK:#010x} accept");
    for pod in every_pod_shape() {
        let text = plan::plan(&pod).ruleset();
        let rules = chain_rules(&text, "output");
        assert_eq!(rules[0], first, "{pod:?}:\n{text}");
        // And it is the only rule that mentions the socket mark as a packet mark.
        let socket_mark = format!("meta mark {SOCKET_MARK:#010x}");
        assert_eq!(
            rules.iter().filter(|r| r.contains(&socket_mark)).count(),
            1,
            "{text}"
        );
    }
}

#[test]
fn output_rules_follow_the_order_of_model_12_1() {
    let text = plan::plan(&scoped_dual_stack()).ruleset();
    let rules = chain_rules(&text, "output");
    let position = |needle: &str| {
        rules
            .iter()
            .position(|r| r.contains(needle))
            .unwrap_or_else(|| panic!("no rule with {needle:?} in:\n{text}"))
    };
    let order = [
        position("ct mark set"),
        position(&format!("ct mark {SOCKET_MARK:#010x} meta mark set")),
        position("ip daddr 127.0.0.0/8 accept"),
        position("ip6 daddr ::1 accept"),
        position("ip daddr { 10.0.0.0/8, 192.168.1.0/24 } accept"),
        position("ip6 daddr fd00:abcd::/32 accept"),
        position("th dport { 5432, 9090 } accept"),
        position("udp dport 18082 meta mark set"),
        position("tcp dport { 18081, 18082 } meta mark set"),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}\n{text}");
}

#[test]
fn scoped_mode_never_marks_tcp_to_other_ports() {
    let set_mark = format!("meta mark set {TPROXY_MARK:#010x}");
    for pod in every_pod_shape() {
        let text = plan::plan(&pod).ruleset();
        let marking: Vec<String> = chain_rules(&text, "output")
            .into_iter()
            .filter(|r| r.contains(&set_mark))
            .collect();
        let unconditional_tcp = format!("meta l4proto tcp {set_mark} accept");
        match pod.mode {
            Mode::Scoped => assert_eq!(
                marking,
                vec![
                    // Replies on the daemon's own connections (rule 2), not new captures.
                    format!("ct mark {SOCKET_MARK:#010x} {set_mark} accept"),
                    format!("udp dport 18082 {set_mark} accept"),
                    format!("tcp dport {{ 18081, 18082 }} {set_mark} accept"),
                ],
                "{text}"
            ),
            Mode::RedirectAll => assert_eq!(
                marking.last(),
                Some(&unconditional_tcp),
                "redirect-all ends by marking every other TCP:\n{text}"
            ),
        }
    }
}

#[test]
fn marked_udp_is_dropped_without_the_udp_listener() {
    let mut pod = redirect_all_v4();
    let text = plan::plan(&pod).ruleset();
    let pre = chain_rules(&text, "prerouting");
    assert!(
        pre.iter().any(|r| r.ends_with("meta l4proto udp drop")),
        "{text}"
    );
    assert!(!pre.iter().any(|r| r.contains("udp tproxy")), "{text}");
    pod.udp = true;
    let text = plan::plan(&pod).ruleset();
    let pre = chain_rules(&text, "prerouting");
    assert!(!pre.iter().any(|r| r.contains("drop")), "{text}");
    assert!(
        pre.iter().any(|r| r.contains("udp tproxy ip to :18082")),
        "{text}"
    );
    assert!(
        pre.iter().any(|r| r.contains("udp tproxy ip6 to :18082")),
        "{text}"
    );
}

#[test]
fn the_ruleset_replaces_an_earlier_table_and_routing_follows_the_families() {
    let v4 = plan::plan(&redirect_all_v4());
    let text = v4.ruleset();
    let create = text.find("table inet aether {}").unwrap();
    let delete = text.find("delete table inet aether").unwrap();
    let define = text.find("table inet aether {\n").unwrap();
    assert!(create < delete && delete < define, "{text}");
    let cmds: Vec<String> = v4
        .route_commands()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        cmds,
        vec![
            format!("ip -4 rule add fwmark {TPROXY_MARK:#010x} lookup 18001 priority 18001"),
            "ip -4 route add local 0.0.0.0/0 dev lo table 18001".to_owned(),
        ]
    );
    let dual = plan::plan(&scoped_dual_stack());
    let cmds: Vec<String> = dual
        .route_removals()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        cmds,
        vec![
            format!("ip -4 rule del fwmark {TPROXY_MARK:#010x} lookup 18001 priority 18001"),
            "ip -4 route del local 0.0.0.0/0 dev lo table 18001".to_owned(),
            format!("ip -6 rule del fwmark {TPROXY_MARK:#010x} lookup 18001 priority 18001"),
            "ip -6 route del local ::/0 dev lo table 18001".to_owned(),
        ]
    );
}
