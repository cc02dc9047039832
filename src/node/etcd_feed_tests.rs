//! The etcd feed against the whole read it stands for: after every step of random row changes
//! (pods added, moved between services, made Ready or not, given other ports or a port without
//! a protocol, removed), the model kept by changes equals the compile of the whole snapshot the
//! node's whole read makes of the same directory and rows (the registrar's Services, ClusterIPs
//! from a network small enough that addresses collide and run out, retention by the clock), and
//! so does the retention state.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use ipnet::IpNet;

use super::etcd_feed::EtcdFeed;
use crate::model::compile;
use crate::model::live::Live;
use crate::model::port::Transport;
use crate::model::registrar::complete_snapshot_except;
use crate::model::retention::advance;
use crate::model::rows::{ANNOTATION_PORTS, ANNOTATION_PROTOCOL, parse_declared_ports};
use crate::model::snapshot::{
    ProtocolValue, RetainedPort, Row, Service, ServicePort, Snapshot, TargetPort,
};
use crate::model::{Model, NodeContext};
use crate::registry::etcd::RowId;
use crate::test_util::{Mix, model_difference};

/// A number below `n`, from the seed's steps.
fn below(rng: &mut Mix, n: u64) -> u64 {
    rng.next() % n
}

const SERVICES: [&str; 6] = ["alpha", "beta", "gamma", "owned", "dirgen", "delta"];

fn service(ns: &str, name: &str, generated: bool, ips: &[[u8; 4]], ports: &[u16]) -> Service {
    Service {
        namespace: ns.into(),
        name: name.into(),
        cluster_ips: ips.iter().map(|&ip| IpAddr::from(ip)).collect(),
        headless: false,
        generated,
        selector: None,
        ports: ports
            .iter()
            .map(|&port| ServicePort {
                name: Some(format!("p{port}")),
                port,
                target: TargetPort::Number(port),
                transport: Transport::Tcp,
                app_protocol: Some("http".into()),
            })
            .collect(),
    }
}

/// The directory: a user Service that owns a mesh service's name, a generated Service the
/// directory writes itself, a user Service with no ClusterIP (allocated) and one with its own.
fn directory(variant: u64) -> Snapshot {
    let mut services = vec![
        service("mp", "owned", false, &[[10, 96, 0, 9]], &[8080]),
        service("mp", "dirgen", true, &[], &[7000]),
        service("mp", "plain", false, &[], &[80]),
        service("mp", "fixed", false, &[[10, 96, 0, 3]], &[80]),
    ];
    if variant % 2 == 1 {
        // The directory changed: now a user Service owns `alpha` too.
        services.push(service("mp", "alpha", false, &[], &[8080]));
    }
    Snapshot {
        services,
        ..Snapshot::default()
    }
}

fn context(now_ms: u64) -> NodeContext {
    NodeContext {
        ignored_namespaces: BTreeSet::from(["quiet".to_owned()]),
        now_ms,
        ..NodeContext::default()
    }
}

/// A /29: six addresses for up to eight Services, so that they collide and run out.
fn cidr() -> IpNet {
    "10.96.0.0/29".parse().unwrap()
}

fn random_row(rng: &mut Mix) -> Row {
    let ns = if below(rng, 6) == 0 { "quiet" } else { "mp" };
    let svc = SERVICES[below(rng, SERVICES.len() as u64) as usize];
    let address = IpAddr::V4(Ipv4Addr::new(10, 1, 0, below(rng, 12) as u8));
    let ports = match below(rng, 4) {
        0 => "8080",
        1 => "8080,9000",
        2 => "9000",
        _ => "7000",
    };
    let protocol = if below(rng, 3) == 0 { "tcp" } else { "http" };
    let annotations = BTreeMap::from([
        (ANNOTATION_PORTS.to_owned(), ports.to_owned()),
        (ANNOTATION_PROTOCOL.to_owned(), protocol.to_owned()),
    ]);
    let mut row =
        parse_declared_ports(&annotations)
            .unwrap()
            .to_row(ns, svc, address, below(rng, 3) != 0);
    if below(rng, 10) == 0 {
        // A port without a protocol: refused (spec/model.md §3.3), never served.
        if let Some(map) = row.port_protocols.as_mut()
            && let Some(v) = map.values_mut().next()
        {
            *v = ProtocolValue::Unspecified;
        }
    }
    row
}

/// The node's whole read: the directory with etcd's rows, completed by the registrar,
/// retention advanced from the published model.
fn whole(
    dir: &Snapshot,
    rows: &BTreeMap<RowId, Arc<Row>>,
    ctx: &NodeContext,
    previous: Option<(&Model, &[RetainedPort])>,
) -> Snapshot {
    let mut s = dir.clone();
    s.rows = rows.values().cloned().collect();
    complete_snapshot_except(&mut s, cidr(), &ctx.ignored_namespaces);
    if let Some((model, retained)) = previous {
        s.retained = advance(&model.http_ports(), retained, &s, ctx.now_ms);
    }
    s
}

fn id(row: &Row) -> RowId {
    (row.namespace.clone(), row.service.clone(), row.address)
}

#[test]
fn the_model_kept_by_etcds_changes_is_the_compile_of_a_whole_read_after_every_step() {
    for seed in 0..40u64 {
        let mut rng = Mix(seed);
        let mut now = 1_000_000;
        let mut variant = 0;
        let mut dir = directory(variant);
        let mut rows: BTreeMap<RowId, Arc<Row>> = BTreeMap::new();
        for _ in 0..below(&mut rng, 8) {
            let r = random_row(&mut rng);
            rows.insert(id(&r), Arc::new(r));
        }
        // The first load: a whole read, kept by the feed.
        let ctx = context(now);
        let first = whole(&dir, &rows, &ctx, None);
        let mut live = Live::new(ctx.clone());
        live.update_to(&first, &ctx);
        let mut feed = EtcdFeed::default();
        feed.fill(&dir.services, &first, 1);
        let mut retained: Vec<RetainedPort> = Vec::new();
        for step in 0..60 {
            now += below(&mut rng, 40_000);
            let ctx = context(now);
            let published = live.model().clone();
            // A batch of changes, as one load takes them.
            let mut batch: BTreeMap<RowId, Option<Arc<Row>>> = BTreeMap::new();
            for _ in 0..=below(&mut rng, 4) {
                let held: Vec<RowId> = rows.keys().cloned().collect();
                match below(&mut rng, 4) {
                    0 if !held.is_empty() => {
                        let gone = held[below(&mut rng, held.len() as u64) as usize].clone();
                        rows.remove(&gone);
                        batch.insert(gone, None);
                    }
                    1 if !held.is_empty() => {
                        // The same pod, its readiness flipped.
                        let key = held[below(&mut rng, held.len() as u64) as usize].clone();
                        let mut r = (*rows[&key]).clone();
                        r.ready = !r.ready;
                        let r = Arc::new(r);
                        rows.insert(key.clone(), r.clone());
                        batch.insert(key, Some(r));
                    }
                    _ => {
                        let r = Arc::new(random_row(&mut rng));
                        rows.insert(id(&r), r.clone());
                        batch.insert(id(&r), Some(r));
                    }
                }
            }
            let refill = below(&mut rng, 15) == 0;
            let expected = whole(&dir, &rows, &ctx, Some((&published, &retained)));
            if refill {
                // The directory changed: read whole, as the node does.
                variant += 1;
                dir = directory(variant);
                let read = whole(&dir, &rows, &ctx, Some((&published, &retained)));
                live.update_to(&read, &ctx);
                feed.fill(&dir.services, &read, variant);
                retained = read.retained.clone();
                let want = compile(&read, &ctx);
                if let Some(d) = model_difference(live.model(), &want) {
                    panic!("seed {seed}, step {step}, the directory read again: {d}");
                }
                continue;
            }
            let fed = feed.changes(
                batch.into_iter().collect(),
                &ctx,
                cidr(),
                Some((&published, &retained)),
            );
            assert_eq!(
                fed.retained, expected.retained,
                "seed {seed}, step {step}: the retention state"
            );
            live.set_context(ctx.clone());
            live.apply(fed.changes);
            retained = fed.retained;
            let want = compile(&expected, &ctx);
            if let Some(d) = model_difference(live.model(), &want) {
                panic!("seed {seed}, step {step}: {d}");
            }
            // The feed's Services are the registrar's.
            let mut held = live
                .snapshot_of(&[crate::model::live::Kind::Service])
                .services;
            let mut completed = expected.services.clone();
            let order =
                |a: &Service, b: &Service| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name));
            held.sort_by(order);
            completed.sort_by(order);
            assert_eq!(held, completed, "seed {seed}, step {step}: the Services");
        }
    }
}
