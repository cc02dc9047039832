//! The mesh DNS table (aether-core) over the example registry as the daemon loads it.

use std::path::Path;

use crate::dns::table::*;
use crate::model::Snapshot;
use crate::model::names::Domains;
use crate::model::registrar;
use crate::model::snapshot::Service;

fn domains() -> Domains {
    Domains {
        mesh: "aether.internal".to_owned(),
        cluster: "cluster.local".to_owned(),
    }
}

fn snapshot() -> Snapshot {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/mp");
    let load = crate::registry::file::load_dir(&dir).expect("the example registry loads");
    assert!(load.problems.is_empty(), "{:?}", load.problems);
    let mut snapshot = load.snapshot;
    registrar::complete_snapshot(&mut snapshot, "10.96.0.0/16".parse().unwrap());
    snapshot
}

fn service<'a>(s: &'a Snapshot, ns: &str, name: &str) -> &'a Service {
    s.services
        .iter()
        .find(|x| x.namespace == ns && x.name == name)
        .unwrap()
}

#[test]
fn a_mesh_name_resolves_to_its_generated_services_cluster_ip() {
    let s = snapshot();
    let table = DnsTable::build(&s, &domains(), false);
    let multi = service(&s, "mp", "mp-multi");
    assert!(multi.generated);
    assert_eq!(
        table.lookup("mp-multi.mp.aether.internal", QueryKind::A),
        Lookup::Records(multi.cluster_ips.clone())
    );
}

#[test]
fn lookups_ignore_case_and_a_trailing_dot() {
    let s = snapshot();
    let table = DnsTable::build(&s, &domains(), false);
    let want = table.lookup("mp-multi.mp.aether.internal", QueryKind::A);
    assert!(matches!(want, Lookup::Records(_)));
    assert_eq!(
        table.lookup("MP-Multi.mp.Aether.Internal.", QueryKind::A),
        want
    );
}

#[test]
fn a_mesh_name_has_no_aaaa_record_on_an_ipv4_cluster() {
    let table = DnsTable::build(&snapshot(), &domains(), false);
    assert_eq!(
        table.lookup("mp-multi.mp.aether.internal", QueryKind::Aaaa),
        Lookup::NoData
    );
    assert_eq!(
        table.lookup("mp-multi.mp.aether.internal", QueryKind::Other),
        Lookup::NoData
    );
}

#[test]
fn a_mesh_service_whose_name_a_user_service_owns_has_no_mesh_record() {
    let s = snapshot();
    assert!(!service(&s, "mp", "mp-owned").generated);
    let table = DnsTable::build(&s, &domains(), true);
    assert_eq!(
        table.lookup("mp-owned.mp.aether.internal", QueryKind::A),
        Lookup::NxDomain
    );
    // Its Kubernetes name is the user Service's (file mode).
    assert_eq!(
        table.lookup("mp-owned.mp.svc.cluster.local", QueryKind::A),
        Lookup::Records(vec!["10.96.100.10".parse().unwrap()])
    );
}

#[test]
fn kubernetes_names_are_answered_only_in_file_mode() {
    let s = snapshot();
    let without = DnsTable::build(&s, &domains(), false);
    let with = DnsTable::build(&s, &domains(), true);
    let name = "mp-multi.mp.svc.cluster.local";
    assert_eq!(without.lookup(name, QueryKind::A), Lookup::NotOurs);
    assert_eq!(
        with.lookup(name, QueryKind::A),
        Lookup::Records(service(&s, "mp", "mp-multi").cluster_ips.clone())
    );
    // A user Service that fronts no mesh service.
    assert_eq!(
        with.lookup("ext-http.mp-ext.svc.cluster.local", QueryKind::A),
        Lookup::Records(vec!["10.96.200.10".parse().unwrap()])
    );
    // A user Service never gets a mesh name.
    assert_eq!(
        with.lookup("ext-http.mp-ext.aether.internal", QueryKind::A),
        Lookup::NxDomain
    );
}

#[test]
fn other_names_are_not_ours() {
    let table = DnsTable::build(&snapshot(), &domains(), true);
    for name in [
        "example.com",
        "mp-multi.mp",
        "mp-multi.mp.svc",
        "mp-multi",
        "aether.internal",
    ] {
        assert_eq!(table.lookup(name, QueryKind::A), Lookup::NotOurs, "{name}");
    }
}

#[test]
fn unknown_names_in_our_zones_are_nxdomain() {
    // A search-list walk must move on: `x.mp.aether.internal.mp.svc.cluster.local` is
    // NXDOMAIN, and so is an unknown mesh name.
    let with = DnsTable::build(&snapshot(), &domains(), true);
    for name in [
        "nope.mp.aether.internal",
        "mp-multi.mp.aether.internal.mp.svc.cluster.local",
        "nope.mp.svc.cluster.local.",
        "mp-multi.mp.aether.internal.cluster.local",
    ] {
        assert_eq!(with.lookup(name, QueryKind::A), Lookup::NxDomain, "{name}");
    }
    let without = DnsTable::build(&snapshot(), &domains(), false);
    assert_eq!(
        without.lookup("nope.mp.svc.cluster.local", QueryKind::A),
        Lookup::NotOurs
    );
}

#[test]
fn a_headless_service_has_no_record_and_dual_stack_splits_by_family() {
    let mut s = Snapshot::default();
    let base = Service {
        namespace: "ns".to_owned(),
        name: "dual".to_owned(),
        cluster_ips: vec!["10.96.0.9".parse().unwrap(), "fd00::9".parse().unwrap()],
        headless: false,
        generated: true,
        selector: None,
        ports: Vec::new(),
    };
    s.services.push(base.clone());
    s.services.push(Service {
        name: "headless".to_owned(),
        cluster_ips: Vec::new(),
        headless: true,
        generated: false,
        ..base
    });
    let table = DnsTable::build(&s, &domains(), true);
    assert_eq!(
        table.lookup("dual.ns.aether.internal", QueryKind::Aaaa),
        Lookup::Records(vec!["fd00::9".parse().unwrap()])
    );
    assert_eq!(
        table.lookup("dual.ns.svc.cluster.local", QueryKind::A),
        Lookup::Records(vec!["10.96.0.9".parse().unwrap()])
    );
    assert_eq!(
        table.lookup("headless.ns.svc.cluster.local", QueryKind::A),
        Lookup::NxDomain
    );
    assert_eq!(table.len(), 2);
}

#[test]
fn a_name_two_services_spell_has_both_addresses_in_the_services_order() {
    // Kubernetes names are lowered: `Echo` and `echo` of one namespace spell one name.
    let svc = |name: &str, ip: &str| Service {
        namespace: "ns".to_owned(),
        name: name.to_owned(),
        cluster_ips: vec![ip.parse().unwrap()],
        headless: false,
        generated: false,
        selector: None,
        ports: Vec::new(),
    };
    let mut s = Snapshot::default();
    s.services.push(svc("echo", "10.96.0.2"));
    s.services.push(svc("other", "10.96.0.3"));
    s.services.push(svc("Echo", "10.96.0.1"));
    s.services.push(svc("ECHO", "10.96.0.2"));
    let table = DnsTable::build(&s, &domains(), true);
    assert_eq!(
        table.lookup("echo.ns.svc.cluster.local", QueryKind::A),
        Lookup::Records(vec![
            "10.96.0.2".parse().unwrap(),
            "10.96.0.1".parse().unwrap()
        ])
    );
    assert_eq!(table.len(), 2);
}
