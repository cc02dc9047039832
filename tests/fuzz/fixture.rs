//! The registries the targets decide against, loaded once per test binary: the acceptance
//! fixture `config/examples/mp`, the HTTPRoutes of its variants, and the fuzz target's own
//! routes (`tests/fuzz/routes/`), compiled as the daemon compiles them.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::OnceLock;

use aether::dns::DnsTable;
use aether::model::route_match::{RouteInput, RouteTable};
use aether::model::snapshot::{HttpRoute, Snapshot};
use aether::model::{Model, NodeContext, compile, registrar};
use aether::resolve::decision::{Caller, CaptureMode};

/// Everything loaded once.
pub(crate) struct Fixture {
    /// The base registry with the fuzz target's own routes, completed by the registrar and
    /// compiled.
    pub(crate) model: Model,
    /// The mesh DNS table of the base registry, with Kubernetes names (file mode).
    pub(crate) dns: DnsTable,
    /// Route tables by parent Service (`namespace/name`), built from every HTTPRoute (and
    /// GRPCRoute) of the variants and of `tests/fuzz/routes/`.
    pub(crate) tables: Vec<(String, RouteTable)>,
    /// Callers: a scoped pod of `mp`, a redirect-all pod of `mp-other`, and a caller whose
    /// namespace is unknown.
    pub(crate) callers: Vec<Caller>,
    /// Addresses a client may dial, as `(address, what it is)`.
    pub(crate) dials: Vec<SocketAddr>,
}

fn load(dir: &Path) -> Snapshot {
    let load =
        aether::registry::file::load_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    assert!(
        load.problems.is_empty(),
        "{}: {:?}",
        dir.display(),
        load.problems
    );
    load.snapshot
}

/// The fixture (built on first use).
pub(crate) fn get() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(build)
}

fn build() -> Fixture {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let base = load(&root.join("config/examples/mp"));

    let mut routes = Vec::new();
    let variants = root.join("config/examples/variants");
    let mut dirs: Vec<_> = std::fs::read_dir(&variants)
        .unwrap_or_else(|e| panic!("{}: {e}", variants.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        // Its one document is a MeshFilter the daemon refuses on purpose (legs POLICY and
        // K-POLICY); it holds no route.
        .filter(|p| !p.ends_with("policy-unreadable"))
        .collect();
    dirs.sort();
    for dir in dirs {
        routes.extend(load(&dir).http_routes);
    }
    let own = load(&root.join("tests/fuzz/routes")).http_routes;
    assert!(!own.is_empty(), "tests/fuzz/routes holds no HTTPRoute");

    // The compiled world: the base with the fuzz target's own routes (the variants' routes
    // replace each other, so they are matched through the tables below only).
    let mut snapshot = base;
    snapshot.http_routes.extend(own.iter().cloned());
    registrar::complete_snapshot(&mut snapshot, "10.96.0.0/16".parse().expect("a cidr"));
    let ctx = NodeContext::default();
    let model = compile(&snapshot, &ctx);
    let dns = DnsTable::build(&snapshot, &ctx.domains, true);
    routes.extend(own);

    let mut by_parent: BTreeMap<String, Vec<&HttpRoute>> = BTreeMap::new();
    for route in &routes {
        for parent in &route.parents {
            let ns = parent
                .target
                .namespace
                .as_deref()
                .unwrap_or(&route.namespace);
            by_parent
                .entry(format!("{ns}/{}", parent.target.name))
                .or_default()
                .push(route);
        }
    }
    let tables = by_parent
        .into_iter()
        .map(|(parent, list)| {
            let parent_ns = parent.split_once('/').map_or("", |(ns, _)| ns).to_owned();
            let inputs: Vec<RouteInput<'_>> = list
                .iter()
                .map(|r| RouteInput {
                    namespace: &r.namespace,
                    name: &r.name,
                    created: r.created.as_deref(),
                    kind: r.kind,
                    parent_namespace: &parent_ns,
                    rules: &r.rules,
                })
                .collect();
            let (table, _problems) = RouteTable::build(&inputs);
            (parent, table)
        })
        .collect();

    let caller = |ns: &str, pod: &str, capture| {
        let facts = model
            .pod(ns, pod)
            .unwrap_or_else(|| panic!("the fixture has no pod {ns}/{pod}"));
        Caller {
            namespace: Some(facts.namespace.clone()),
            pod: Some(facts.name.clone()),
            service_account: Some(facts.service_account.clone()),
            capture,
        }
    };
    let callers = vec![
        caller("mp", "mp-client", CaptureMode::Scoped),
        caller("mp-other", "mp-client-other", CaptureMode::RedirectAll),
        Caller {
            namespace: None,
            pod: None,
            service_account: None,
            capture: CaptureMode::RedirectAll,
        },
    ];

    let mut dials: Vec<SocketAddr> = Vec::new();
    for (svc, ports) in [
        ("mp-multi", &[8080u16, 9090, 18081, 7777][..]),
        ("mp-httponly", &[8080, 18081]),
        ("mp-mixed", &[8080, 9000]),
        ("mp-eighty", &[80]),
    ] {
        for ip in model.mesh_vips("mp", svc) {
            dials.extend(ports.iter().map(|&p| SocketAddr::new(ip, p)));
        }
    }
    for pod in ["mp-multi-0", "mp-httponly-0"] {
        if let Some(ip) = model.pod("mp", pod).and_then(|p| p.ips.first()) {
            dials.push(SocketAddr::new(*ip, 8080));
        }
    }
    // A user Service's ClusterIP, and an address outside the mesh.
    if let Some(ip) = snapshot
        .services
        .iter()
        .find(|s| !s.generated && !s.cluster_ips.is_empty())
        .map(|s| s.cluster_ips[0])
    {
        dials.push(SocketAddr::new(ip, 80));
    }
    dials.push(SocketAddr::new(IpAddr::from([192, 0, 2, 1]), 80));
    assert!(dials.len() > 8, "the fixture's dials: {dials:?}");

    Fixture {
        model,
        dns,
        tables,
        callers,
        dials,
    }
}
