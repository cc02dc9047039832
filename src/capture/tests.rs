//! Capture tests: golden rulesets and rule order of the pure plan, and a root-only functional
//! test that applies plans in real network namespaces and watches which listener a connection
//! reaches.

use std::net::{Ipv4Addr, Ipv6Addr};
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
        inbound_refused_ports: vec![],
        inbound_trusted: vec![],
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
        inbound_refused_ports: vec![],
        inbound_trusted: vec![],
    }
}

/// A strict pod: plaintext from outside to its declared ports is refused, except from the node.
fn strict_inbound() -> PodCapture {
    PodCapture {
        inbound_refused_ports: vec![9000, 8080, 8080],
        inbound_trusted: vec![
            "10.244.1.1/32".parse().unwrap(),
            "192.168.0.10/32".parse().unwrap(),
            "fd00::1/128".parse().unwrap(),
        ],
        ..redirect_all_v4()
    }
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/capture/golden")
}

fn golden(name: &str, actual: &str) {
    crate::test_util::golden::assert_golden(&golden_dir().join(name), actual);
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

/// A name is data in the ruleset's opening comment, never a rule: a line end in a pod's name
/// (the file registry takes names as written) stays in the comment. Found by the `annotations`
/// fuzz target (tests/fuzz/corpus/annotations/name-with-line-end).
#[test]
fn a_name_with_a_line_end_stays_in_the_comment() {
    let p = plan::plan(&PodCapture {
        namespace: "mp\r".into(),
        name: "web-0\nflush ruleset\n#".into(),
        ..redirect_all_v4()
    });
    let ruleset = p.ruleset();
    let mut lines = ruleset.lines();
    assert_eq!(
        lines.next(),
        Some(
            r"# aether capture for pod mp\r/web-0\nflush ruleset\n# (redirect-all mode), spec/model.md §12.1"
        )
    );
    assert!(
        lines.all(|l| l.trim() != "flush ruleset"),
        "the name became a rule:\n{ruleset}"
    );
}

#[test]
fn golden_scoped_dual_stack_with_exclusions_and_udp() {
    let p = plan::plan(&scoped_dual_stack());
    golden("scoped_dual_stack.nft", &p.ruleset());
    golden("scoped_dual_stack.routes", &routes_text(&p));
}

#[test]
fn golden_strict_inbound_refuses_plaintext_to_declared_ports_except_from_the_node() {
    let p = plan::plan(&strict_inbound());
    let ruleset = p.ruleset();
    golden("strict_inbound.nft", &ruleset);
    // Loopback first, then the trusted sources, then the refusal, which names each port once.
    let input = chain_rules(&ruleset, "input");
    assert_eq!(input[0], "iifname \"lo\" accept");
    assert!(input[1].starts_with("ip saddr { 10.244.1.1/32, 192.168.0.10/32 }"));
    assert!(input[2].starts_with("ip6 saddr fd00::1/128"));
    assert_eq!(
        input[3],
        "tcp dport { 8080, 9000 } ct state new counter name plaintext_refused reject with tcp reset"
    );
    // A permissive pod with nothing to refuse has no input chain at all.
    assert!(
        !plan::plan(&redirect_all_v4())
            .ruleset()
            .contains("chain input")
    );
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
                    format!("meta l4proto tcp ct mark {SOCKET_MARK:#010x} {set_mark} accept"),
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

/// The functional test: real namespaces, real nftables, real sockets.
mod functional {
    use std::io;
    use std::net::{IpAddr, SocketAddr};
    use std::path::Path;
    use std::process::Command;
    use std::sync::Arc;
    use std::time::Duration;

    use socket2::{Domain, Protocol, Socket, Type};
    use tokio::net::{TcpListener, TcpSocket, TcpStream};
    use tokio::time::timeout;

    use super::*;
    use crate::capture::nft;
    use crate::netns::Netns;
    use crate::proxy::socket::{PodNet, Source};

    fn sh(args: &[&str]) {
        let out = Command::new("ip").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The two namespaces of the test; deleted (with their veths) on drop, pass or fail.
    struct Lab {
        pod: String,
        gw: String,
    }

    impl Drop for Lab {
        fn drop(&mut self) {
            for ns in [&self.pod, &self.gw] {
                let _ = Command::new("ip").args(["netns", "del", ns]).status();
            }
        }
    }

    fn lab() -> Lab {
        let prefix = format!("aecap{}", std::process::id() % 100_000);
        let lab = Lab {
            pod: format!("{prefix}-pod"),
            gw: format!("{prefix}-gw"),
        };
        let (p, g) = (lab.pod.as_str(), lab.gw.as_str());
        sh(&["netns", "add", p]);
        sh(&["netns", "add", g]);
        sh(&[
            "-n", p, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", g,
        ]);
        for ns in [p, g] {
            sh(&["-n", ns, "link", "set", "lo", "up"]);
            sh(&["-n", ns, "link", "set", "eth0", "up"]);
        }
        sh(&["-n", p, "addr", "add", "10.99.0.2/24", "dev", "eth0"]);
        sh(&[
            "-n",
            p,
            "-6",
            "addr",
            "add",
            "fd99::2/64",
            "dev",
            "eth0",
            "nodad",
        ]);
        sh(&["-n", p, "route", "add", "default", "via", "10.99.0.1"]);
        sh(&["-n", p, "-6", "route", "add", "default", "via", "fd99::1"]);
        sh(&["-n", g, "addr", "add", "10.99.0.1/24", "dev", "eth0"]);
        sh(&[
            "-n",
            g,
            "-6",
            "addr",
            "add",
            "fd99::1/64",
            "dev",
            "eth0",
            "nodad",
        ]);
        // Servers "out there", behind the gateway.
        sh(&["-n", g, "addr", "add", "10.1.2.3/32", "dev", "lo"]);
        sh(&["-n", g, "addr", "add", "10.1.2.5/32", "dev", "lo"]);
        sh(&["-n", g, "-6", "addr", "add", "fd01::3/128", "dev", "lo"]);
        lab
    }

    /// A connection from an application in the pod: a socket created inside the namespace
    /// WITHOUT the daemon's mark.
    async fn app_connect(pod: &PodNet, dst: SocketAddr) -> TcpStream {
        let socket = pod
            .netns
            .run(&pod.home, || -> io::Result<TcpSocket> {
                let s = Socket::new(Domain::for_address(dst), Type::STREAM, Some(Protocol::TCP))?;
                s.set_nonblocking(true)?;
                Ok(TcpSocket::from_std_stream(s.into()))
            })
            .unwrap()
            .unwrap();
        timeout(Duration::from_secs(5), socket.connect(dst))
            .await
            .unwrap_or_else(|_| panic!("connect to {dst} timed out"))
            .unwrap_or_else(|e| panic!("connect to {dst}: {e}"))
    }

    /// The connection `client` reached `listener`: it was accepted there (and nowhere else
    /// among `others`). Returns the accepted socket's local address.
    async fn accepted_by(
        client: &TcpStream,
        listener: &TcpListener,
        others: &[&TcpListener],
    ) -> SocketAddr {
        let (conn, peer) = timeout(Duration::from_secs(2), listener.accept())
            .await
            .expect("the expected listener accepted nothing")
            .unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        for other in others {
            assert!(
                timeout(Duration::from_millis(200), other.accept())
                    .await
                    .is_err(),
                "another listener accepted too"
            );
        }
        conn.local_addr().unwrap()
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn ip_rules(ns: &str, family: &str) -> String {
        let out = Command::new("ip")
            .args(["-n", ns, family, "rule", "show"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[tokio::test]
    async fn capture_in_a_real_pod_namespace() {
        if crate::test_util::needs_root::cannot_run(
            "capture::tests::functional::capture_in_a_real_pod_namespace",
            &["nft", "ip", "nsenter"],
        ) {
            return;
        }
        let lab = lab();
        let netns_path = Path::new(crate::netns::NETNS_DIR).join(&lab.pod);
        let home = Arc::new(Netns::current().unwrap());
        let pod = PodNet {
            netns: Arc::new(Netns::named(&lab.pod).unwrap()),
            home: home.clone(),
            ipv4: Some(Ipv4Addr::new(10, 99, 0, 2)),
            ipv6: Some("fd99::2".parse::<Ipv6Addr>().unwrap()),
        };
        let gw = PodNet {
            netns: Arc::new(Netns::named(&lab.gw).unwrap()),
            home,
            ipv4: Some(Ipv4Addr::new(10, 99, 0, 1)),
            ipv6: Some("fd99::1".parse::<Ipv6Addr>().unwrap()),
        };

        // The pod's listeners: capture (v4 and v6, transparent) and an application on loopback.
        let capture = pod.tcp_listener(sa("0.0.0.0:18001"), true).unwrap();
        let capture6 = pod.tcp_listener(sa("[::]:18001"), true).unwrap();
        let local_app = pod.tcp_listener(sa("127.0.0.1:7000"), false).unwrap();
        // Servers behind the gateway.
        let gw80 = gw.tcp_listener(sa("0.0.0.0:80"), false).unwrap();
        let gw18081 = gw.tcp_listener(sa("0.0.0.0:18081"), false).unwrap();
        let gw18081v6 = gw.tcp_listener(sa("[::]:18081"), false).unwrap();

        assert!(!nft::is_applied(&netns_path).await.unwrap());

        // Redirect-all, IPv4; applying twice is the same as once.
        let mut spec = PodCapture {
            namespace: "test".into(),
            name: lab.pod.clone(),
            ipv4: pod.ipv4,
            ipv6: None,
            mode: Mode::RedirectAll,
            exclude_ports: vec![],
            exclude_ranges: vec![],
            udp: false,
            inbound_refused_ports: vec![],
            inbound_trusted: vec![],
        };
        let p = plan::plan(&spec);
        nft::apply(&netns_path, &p).await.unwrap();
        nft::apply(&netns_path, &p).await.unwrap();
        assert!(nft::is_applied(&netns_path).await.unwrap());
        assert_eq!(
            ip_rules(&lab.pod, "-4").matches("lookup 18001").count(),
            1,
            "{}",
            ip_rules(&lab.pod, "-4")
        );

        // An application's connection to anywhere reaches the capture listener, which sees
        // the original destination as its local address.
        let c = app_connect(&pod, sa("10.1.2.3:80")).await;
        assert_eq!(c.peer_addr().unwrap(), sa("10.1.2.3:80"));
        assert_eq!(accepted_by(&c, &capture, &[&gw80]).await, sa("10.1.2.3:80"));

        // The daemon's own (marked) socket is not captured: it reaches the real server.
        let c = pod.connect(sa("10.1.2.3:80"), Source::PodIp).await.unwrap();
        assert_eq!(c.local_addr().unwrap().ip(), IpAddr::from([10, 99, 0, 2]));
        assert_eq!(accepted_by(&c, &gw80, &[&capture]).await, sa("10.1.2.3:80"));

        // Loopback is not captured.
        let c = app_connect(&pod, sa("127.0.0.1:7000")).await;
        assert_eq!(
            accepted_by(&c, &local_app, &[&capture]).await,
            sa("127.0.0.1:7000")
        );

        // Scoped, dual-stack, with exclusions and UDP: the same namespace, re-applied.
        spec.mode = Mode::Scoped;
        spec.ipv6 = pod.ipv6;
        spec.udp = true;
        spec.exclude_ranges = vec!["10.1.2.5/32".parse().unwrap()];
        spec.exclude_ports = vec![5432];
        let p = plan::plan(&spec);
        nft::apply(&netns_path, &p).await.unwrap();

        let c = app_connect(&pod, sa("10.1.2.3:80")).await;
        assert_eq!(accepted_by(&c, &gw80, &[&capture]).await, sa("10.1.2.3:80"));

        let c = app_connect(&pod, sa("10.1.2.3:18081")).await;
        assert_eq!(
            accepted_by(&c, &capture, &[&gw18081]).await,
            sa("10.1.2.3:18081")
        );

        let c = app_connect(&pod, sa("[fd01::3]:18081")).await;
        assert_eq!(
            accepted_by(&c, &capture6, &[&gw18081v6]).await,
            sa("[fd01::3]:18081")
        );

        // An excluded destination is not captured, even on a captured port.
        let c = app_connect(&pod, sa("10.1.2.5:18081")).await;
        assert_eq!(
            accepted_by(&c, &gw18081, &[&capture]).await,
            sa("10.1.2.5:18081")
        );

        // Removal: the table and the routing go; traffic flows uncaptured; removing twice is fine.
        nft::remove(&netns_path).await.unwrap();
        nft::remove(&netns_path).await.unwrap();
        assert!(!nft::is_applied(&netns_path).await.unwrap());
        for family in ["-4", "-6"] {
            let rules = ip_rules(&lab.pod, family);
            assert!(!rules.contains("lookup 18001"), "{rules}");
        }
        let c = app_connect(&pod, sa("10.1.2.3:18081")).await;
        assert_eq!(
            accepted_by(&c, &gw18081, &[&capture]).await,
            sa("10.1.2.3:18081")
        );

        // A namespace that does not exist is an error that names it, not "already removed".
        let gone = Path::new(crate::netns::NETNS_DIR).join(format!("{}-missing", lab.pod));
        let err = nft::remove(&gone).await.unwrap_err();
        assert_eq!(err.netns(), gone.as_path());
        assert!(nft::is_applied(&gone).await.is_err());
        drop(lab);
    }
}
