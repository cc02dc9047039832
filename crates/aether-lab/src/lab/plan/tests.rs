//! The plan of the `mp` fixture (config/examples/mp), and the plan's refusals.

use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::lab::{DEFAULT_SERVICE_CIDR, PlannedDir, plan_dir};

fn fixture_dir() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("config/examples/mp")
}

fn opts() -> LabOptions {
    LabOptions {
        binary: PathBuf::from("/opt/aether/bin/aether"),
        ..LabOptions::default()
    }
}

fn mp() -> PlannedDir {
    plan_dir(
        &fixture_dir(),
        DEFAULT_SERVICE_CIDR.parse().unwrap(),
        &opts(),
    )
    .unwrap()
}

fn ep(s: &str) -> SocketAddrV4 {
    s.parse().unwrap()
}

#[test]
fn the_fixture_has_two_nodes_each_with_its_own_pod_subnet_and_routes_to_the_other() {
    let plan = mp().plan;
    let names: Vec<&str> = plan.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node-a", "node-b"]);
    let a = plan.node("node-a").unwrap();
    let b = plan.node("node-b").unwrap();
    assert_eq!(a.netns, "aen-node-a");
    assert_eq!(plan.underlay_netns, "aen-underlay");
    assert_eq!(a.pod_subnet, "10.244.1.0/24".parse::<Ipv4Net>().unwrap());
    assert_eq!(a.bridge_addr, Ipv4Addr::new(10, 244, 1, 1));
    assert_eq!(b.pod_subnet, "10.244.2.0/24".parse::<Ipv4Net>().unwrap());
    assert_eq!(a.underlay_addr, Ipv4Addr::new(192, 168, 244, 1));
    assert_eq!(b.underlay_addr, Ipv4Addr::new(192, 168, 244, 2));
    assert_eq!(a.routes, vec![(b.pod_subnet, b.underlay_addr)]);
    assert_eq!(b.routes, vec![(a.pod_subnet, a.underlay_addr)]);
}

#[test]
fn every_fixture_pod_gets_its_annotated_netns_a_short_unique_veth_and_its_gateway() {
    let plan = mp().plan;
    assert_eq!(plan.pods.len(), 26);
    assert!(plan.left_out.is_empty());
    let client = plan.pod("mp", "mp-client").unwrap();
    assert_eq!(client.netns, "mp-client");
    assert_eq!(client.ip, Ipv4Addr::new(10, 244, 1, 101));
    assert_eq!(client.gateway, Ipv4Addr::new(10, 244, 1, 1));
    let multi1 = plan.pod("mp", "mp-multi-1").unwrap();
    assert_eq!(
        (multi1.node.as_str(), multi1.gateway),
        ("node-b", Ipv4Addr::new(10, 244, 2, 1))
    );
    let mut seen = BTreeSet::new();
    for p in &plan.pods {
        assert!(p.host_if.len() <= IFNAME_MAX, "{}", p.host_if);
        assert!(
            seen.insert((p.node.clone(), p.host_if.clone())),
            "{}",
            p.host_if
        );
    }
    let ext = plan.pod("mp-ext", "ext-http-0").unwrap();
    assert!(!ext.managed);
}

#[test]
fn pod_commands_use_the_given_binary_and_env_resolves_field_refs() {
    let plan = mp().plan;
    let owned = plan.pod("mp", "mp-owned-1").unwrap();
    assert_eq!(
        owned.argv,
        [
            "/opt/aether/bin/aether",
            "echo",
            "--workload",
            "mp-owned",
            "--http",
            "8080"
        ]
    );
    assert_eq!(
        owned.env,
        [
            ("POD_NAME".to_owned(), "mp-owned-1".to_owned()),
            ("POD_NAMESPACE".to_owned(), "mp".to_owned()),
        ]
    );
    assert_eq!(owned.log_name, "mp-owned-1.log");
    assert_eq!(
        owned.resolv_conf,
        "nameserver 127.0.0.53\nsearch mp.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
    );
}

#[test]
fn mp_owned_is_translated_to_both_of_its_ready_pods() {
    let plan = mp().plan;
    let owned: Vec<&ServiceRule> = plan
        .services
        .iter()
        .filter(|s| s.name == "mp-owned")
        .collect();
    assert_eq!(owned.len(), 1);
    assert_eq!(owned[0].cluster_ip, Ipv4Addr::new(10, 96, 100, 10));
    assert_eq!(owned[0].port, 80);
    assert_eq!(owned[0].transport, Transport::Tcp);
    assert_eq!(
        owned[0].endpoints,
        [ep("10.244.1.22:8080"), ep("10.244.2.22:8080")]
    );
    let text = plan.render_kube_proxy();
    assert!(text.contains("ip daddr 10.96.100.10 tcp dport 80 goto svc-mp-mp-owned-tcp-80"));
    assert!(text.contains("numgen random mod 2 vmap"));
    assert!(text.contains("dnat to 10.244.2.22:8080"));
}

#[test]
fn ext_http_is_translated_to_its_unmanaged_pod() {
    let plan = mp().plan;
    let ext = plan
        .services
        .iter()
        .find(|s| s.namespace == "mp-ext" && s.name == "ext-http")
        .unwrap();
    assert_eq!(ext.cluster_ip, Ipv4Addr::new(10, 96, 200, 10));
    assert_eq!(
        (ext.port, ext.endpoints.as_slice()),
        (18081, &[ep("10.244.1.41:18081")][..])
    );
    assert!(
        plan.render_kube_proxy()
            .contains("ip daddr 10.96.200.10 tcp dport 18081 goto svc-mp-ext-ext-http-tcp-18081")
    );
}

#[test]
fn no_generated_service_gets_a_rule() {
    let planned = mp();
    let generated: Vec<_> = planned
        .snapshot
        .services
        .iter()
        .filter(|s| s.generated)
        .collect();
    assert!(
        generated.len() >= 10,
        "the registrar generated {}",
        generated.len()
    );
    assert_eq!(planned.plan.services.len(), 3);
    let text = planned.plan.render_kube_proxy();
    for svc in generated {
        assert!(svc.selector.is_none());
        for ip in &svc.cluster_ips {
            assert!(
                !text.contains(&format!("ip daddr {ip} ")),
                "{}/{} has a rule",
                svc.namespace,
                svc.name
            );
        }
    }
}

#[test]
fn the_kube_proxy_ruleset_of_the_fixture_matches_its_golden_file() {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lab/testdata/mp-kubeproxy.nft");
    let text = mp().plan.render_kube_proxy();
    if std::env::var_os("AETHER_BLESS").is_some() {
        std::fs::write(&golden, &text).unwrap();
    }
    let want = std::fs::read_to_string(&golden).unwrap();
    assert_eq!(
        text, want,
        "rerun with AETHER_BLESS=1 to accept the new ruleset"
    );
}

#[test]
fn a_pod_without_a_netns_annotation_is_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("aether-lab-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("pods.yaml"),
        r#"
apiVersion: v1
kind: Pod
metadata: {name: with-netns, namespace: shop, annotations: {aether.io/netns: with-netns}}
spec: {nodeName: n1, containers: [{name: app, image: x}]}
status: {podIP: 10.244.1.5}
---
apiVersion: v1
kind: Pod
metadata: {name: bare, namespace: shop}
spec: {nodeName: n1, containers: [{name: app, image: x}]}
status: {podIP: 10.244.1.6}
"#,
    )
    .unwrap();
    let err = plan_dir(&dir, DEFAULT_SERVICE_CIDR.parse().unwrap(), &opts()).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        err.to_string(),
        "pod shop/bare has no aether.io/netns annotation: the lab cannot know its network namespace"
    );
}

fn pod(name: &str, node: &str, ip: &str) -> Pod {
    Pod {
        namespace: "shop".to_owned(),
        name: name.to_owned(),
        service_account: "default".to_owned(),
        node: Some(node.to_owned()),
        ips: vec![ip.parse().unwrap()],
        labels: BTreeMap::new(),
        managed: true,
        redirect_all: None,
        exclude_outbound_ports: Vec::new(),
        exclude_outbound_ip_ranges: Vec::new(),
        ready: true,
        netns: Some(name.to_owned()),
        netns_from_cni: false,
        command: Vec::new(),
        inbound_mode: None,
        host_ips: Vec::new(),
    }
}

fn plan_of(pods: Vec<Pod>) -> Result<LabPlan, InvalidLab> {
    let snapshot = Snapshot {
        pods: pods.into_iter().map(Arc::new).collect(),
        ..Snapshot::default()
    };
    LabPlan::from_snapshot(&snapshot, &LabOptions::default())
}

#[test]
fn subnets_must_be_one_per_node_and_ipv4() {
    assert!(matches!(
        plan_of(vec![pod("a", "n1", "10.244.1.5"), pod("b", "n1", "10.244.3.5")]),
        Err(InvalidLab::NodeSpansSubnets { node, .. }) if node == "n1"
    ));
    assert!(matches!(
        plan_of(vec![
            pod("a", "n1", "10.244.1.5"),
            pod("b", "n2", "10.244.1.6")
        ]),
        Err(InvalidLab::SharedSubnet { .. })
    ));
    let err = plan_of(vec![pod("a", "n1", "fd00::5")]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pod shop/a has the IPv6 address fd00::5: the lab builds IPv4 pod networks only"
    );
    assert!(matches!(
        plan_of(vec![pod("a", "n1", "10.244.1.1")]),
        Err(InvalidLab::GatewayAddress { .. })
    ));
    let mut unplaced = pod("c", "n1", "10.244.1.7");
    unplaced.node = None;
    let plan = plan_of(vec![pod("a", "n1", "10.244.1.5"), unplaced]).unwrap();
    assert_eq!(plan.left_out, [("shop".to_owned(), "c".to_owned())]);
}

#[test]
fn an_unknown_field_ref_is_refused_and_a_literal_value_is_kept() {
    let snapshot = Snapshot {
        pods: vec![Arc::new(pod("a", "n1", "10.244.1.5"))],
        ..Snapshot::default()
    };
    let key = ("shop".to_owned(), "a".to_owned());
    let mut env = PodEnv::new();
    env.insert(
        key.clone(),
        vec![
            ("MODE".to_owned(), EnvValue::Literal("fast".to_owned())),
            (
                "IP".to_owned(),
                EnvValue::FieldRef("status.podIP".to_owned()),
            ),
        ],
    );
    let plan = LabPlan::from_snapshot_with_env(&snapshot, &env, &LabOptions::default()).unwrap();
    assert_eq!(
        plan.pods[0].env,
        [
            ("MODE".to_owned(), "fast".to_owned()),
            ("IP".to_owned(), "10.244.1.5".to_owned())
        ]
    );
    env.insert(
        key,
        vec![(
            "X".to_owned(),
            EnvValue::FieldRef("status.hostIP".to_owned()),
        )],
    );
    assert!(matches!(
        LabPlan::from_snapshot_with_env(&snapshot, &env, &LabOptions::default()),
        Err(InvalidLab::UnsupportedFieldRef { field_path, .. }) if field_path == "status.hostIP"
    ));
}

#[test]
fn a_netns_name_that_is_not_a_plain_file_name_is_refused() {
    let mut p = pod("a", "n1", "10.244.1.5");
    p.netns = Some("../etc".to_owned());
    assert!(matches!(plan_of(vec![p]), Err(InvalidLab::BadName { name, .. }) if name == "../etc"));
    let mut p = pod("a", "n1", "10.244.1.5");
    p.netns = Some("a b".to_owned());
    assert!(matches!(plan_of(vec![p]), Err(InvalidLab::BadName { .. })));
    assert!(valid_name("mp-client-nocapture") && valid_name("aen-node-a"));
}

const NAMED_AND_UDP: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: shop}
spec:
  clusterIP: 10.96.50.5
  selector: {app: dns}
  ports:
  - {name: web, port: 443, targetPort: web}
  - {name: dns, port: 53, targetPort: 5353, protocol: UDP}
---
apiVersion: v1
kind: Pod
metadata: {name: dns-0, namespace: shop, labels: {app: dns}, annotations: {aether.io/netns: dns-0}}
spec:
  nodeName: n1
  containers: [{name: app, image: x, ports: [{name: web, containerPort: 8443}]}]
status: {podIP: 10.244.1.5}
---
apiVersion: v1
kind: Pod
metadata: {name: dns-1, namespace: shop, labels: {app: dns}, annotations: {aether.io/netns: dns-1}}
spec:
  nodeName: n1
  containers: [{name: app, image: x, ports: [{name: web, containerPort: 9443}]}]
status:
  podIP: 10.244.1.6
  conditions: [{type: Ready, status: "False"}]
---
apiVersion: v1
kind: Pod
metadata: {name: dns-2, namespace: shop, labels: {app: dns}, annotations: {aether.io/netns: dns-2}}
spec:
  nodeName: n2
  containers: [{name: app, image: x, ports: [{name: web, containerPort: 7443}]}]
status: {podIP: 10.244.2.5}
"#;

#[test]
fn named_target_ports_resolve_per_pod_udp_ports_get_rules_and_unready_pods_are_left_out() {
    let dir = std::env::temp_dir().join(format!("aether-lab-named-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("dns.yaml"), NAMED_AND_UDP).unwrap();
    let planned = plan_dir(&dir, DEFAULT_SERVICE_CIDR.parse().unwrap(), &opts());
    std::fs::remove_dir_all(&dir).unwrap();
    let plan = planned.unwrap().plan;
    let rule = |t: Transport| plan.services.iter().find(|s| s.transport == t).unwrap();
    assert_eq!(
        (
            rule(Transport::Tcp).port,
            rule(Transport::Tcp).endpoints.as_slice()
        ),
        (443, &[ep("10.244.1.5:8443"), ep("10.244.2.5:7443")][..])
    );
    assert_eq!(
        (
            rule(Transport::Udp).port,
            rule(Transport::Udp).endpoints.as_slice()
        ),
        (53, &[ep("10.244.1.5:5353"), ep("10.244.2.5:5353")][..])
    );
    let text = plan.render_kube_proxy();
    assert!(text.contains("ip daddr 10.96.50.5 udp dport 53 goto svc-shop-dns-udp-53"));
    assert!(text.contains("meta l4proto udp dnat to 10.244.2.5:5353"));
    assert!(!text.contains("10.244.1.6"));
}

#[test]
fn a_pod_reaching_its_own_service_is_marked_before_the_dnat_and_masqueraded_after_it() {
    // tests/fixtures/lab-hairpin: hp-echo's only endpoint is hp-echo-0, which also dials it.
    let dir =
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("tests/fixtures/lab-hairpin");
    let opts = LabOptions {
        prefix: "hp".to_owned(),
        ..opts()
    };
    let plan = plan_dir(&dir, DEFAULT_SERVICE_CIDR.parse().unwrap(), &opts)
        .unwrap()
        .plan;
    let want = "\
# kube-proxy stand-in of the aether lab (user Services only).
table ip hp-kubeproxy
delete table ip hp-kubeproxy
table ip hp-kubeproxy {
\tchain svc-hp-hp-echo-tcp-80 {
\t\tgoto ep-10-244-9-10-8080-tcp
\t}
\tchain ep-10-244-9-10-8080-tcp {
\t\tip saddr 10.244.9.10 jump mark-for-masquerade
\t\tmeta l4proto tcp dnat to 10.244.9.10:8080
\t}
\tchain mark-for-masquerade {
\t\tmeta mark set meta mark | 0x00004000
\t}
\tchain masquerading {
\t\ttype nat hook postrouting priority 100; policy accept;
\t\tmeta mark & 0x00004000 == 0 return
\t\tmeta mark set meta mark ^ 0x00004000
\t\tmasquerade
\t}
\tchain services {
\t\tip daddr 10.96.90.10 tcp dport 80 goto svc-hp-hp-echo-tcp-80
\t}
\tchain prerouting {
\t\ttype nat hook prerouting priority -100; policy accept;
\t\tjump services
\t}
\tchain output {
\t\ttype nat hook output priority -100; policy accept;
\t\tjump services
\t}
}
";
    assert_eq!(plan.render_kube_proxy(), want);
}

#[test]
fn the_masquerade_bit_is_none_of_the_daemons_marks() {
    for mark in [
        aether_core::marks::SOCKET_MARK,
        aether_core::marks::TPROXY_MARK,
    ] {
        assert_eq!(mark & MASQUERADE_MARK, 0, "{mark:#010x}");
    }
    assert_eq!(MASQUERADE_MARK.count_ones(), 1);
}
