//! Scale benchmark of the etcd source (issue #12): registration and watch fan-out with 2,000
//! services and 20,000 pod rows on a real etcd (Debian's `etcd-server`, one member on
//! 127.0.0.1, its data under a temporary directory), each figure beside a baseline run in the
//! same process with the plain etcd client (`etcd-client`, as the source uses it):
//!
//! 1. **Registration**: 20 nodes register 1,000 pods each ([`Registration`]: their leases,
//!    the per-protocol copies, transactions of 64 puts), until every node's rows are written;
//!    against the same keys and values put in transactions of 64 by one plain client, without
//!    leases.
//! 2. **A new node's full model**: a new [`EtcdSource`] lists the whole prefix into its table
//!    (every key decoded and checked), then the node's reload: the generated Services completed
//!    and the model compiled; against plain `get`s of the same pages (1,000 keys each, at one
//!    revision). And the memory the table
//!    holds (jemalloc `stats.allocated`), beside the bytes of the keys and values on the wire.
//! 3. **Watch events a node absorbs**: 5,000 changes (a readiness flipped, every copy of the
//!    pod) are written while the source watches; the source's lag behind the last write when
//!    the writes end. Then the same events replayed from their first revision: to a plain watch
//!    that only counts them (the baseline), and the same events applied to a [`Table`] (what
//!    the source adds to each event).
//!
//! 4. **One row's change to the node's model**: a pod's readiness flipped, taken by the node's
//!    whole read (every row from the table, the registrar's Services, the kept model brought
//!    to the snapshot object by object: what every load did before issue #37) and by the etcd
//!    feed (the row, its service's generated Service, the kept model given the change). The
//!    two models are checked equal at every step.
//!
//! No timing is asserted; the bench prints tables. Run: `cargo bench --bench etcd_scale`.
//! `AETHER_ETCD_SCALE_PODS` (default 20000; services are a tenth) changes the size.
#![allow(clippy::print_stdout, missing_docs)] // A benchmark harness reports on stdout.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use etcd_client::{Client, GetOptions, Txn, TxnOp, WatchOptions};
use tikv_jemalloc_ctl::{epoch, stats};
use tokio::sync::mpsc;

use aether::model::live::Live;
use aether::model::port::PortProtocol;
use aether::model::registrar::complete_snapshot_except;
use aether::model::snapshot::{ProtocolValue, Row, Snapshot};
use aether::model::{NodeContext, compile};
use aether::node::etcd_feed::EtcdFeed;
use aether::registry::etcd::{EtcdSettings, EtcdSource, Registration, Table, keys};
use aether::time::now;
use aether_lab::lab::etcd::{EtcdServer, installed};

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const PREFIX: &str = "/aether";
const NODES: usize = 20;
const CHANGES: usize = 5_000;
const TXN: usize = 64;

fn allocated() -> u64 {
    let _ = epoch::advance();
    stats::allocated::read().map_or(0, |v| v as u64)
}

/// `pods` rows over a tenth as many services (10 pods each), in 20 namespaces, on [`NODES`]
/// nodes; every third service declares HTTP 8080 and raw TCP 9000 (two keys a pod), the others
/// HTTP 8080 alone.
fn rows(pods: usize) -> Vec<Row> {
    let services = (pods / 10).max(1);
    (0..pods)
        .map(|i| {
            let s = i % services;
            let ports: &[(u32, PortProtocol)] = if s.is_multiple_of(3) {
                &[(8080, PortProtocol::Http), (9000, PortProtocol::Tcp)]
            } else {
                &[(8080, PortProtocol::Http)]
            };
            let service = format!("svc-{s:05}");
            Row {
                namespace: format!("ns-{:02}", s % 20),
                pod: Some(format!("{service}-{}", i / services)),
                service,
                address: IpAddr::V4(Ipv4Addr::from(
                    0x0af4_0000_u32 + u32::try_from(i).expect("fewer than 2^32 pods") + 1,
                )),
                port: 8080,
                ports: ports.iter().map(|p| p.0).collect(),
                port_protocols: Some(
                    ports
                        .iter()
                        .map(|&(p, v)| (p, ProtocolValue::Known(v)))
                        .collect(),
                ),
                ready: true,
                node: Some(format!("node-{}", i % NODES)),
            }
        })
        .collect()
}

fn settings(endpoints: Vec<String>) -> EtcdSettings {
    EtcdSettings {
        endpoints,
        prefix: PREFIX.into(),
        lease_ttl: Duration::from_secs(60),
        timeout: Duration::from_secs(10),
        auth: None,
        tls: None,
    }
}

async fn put_all(client: &mut Client, kvs: &[(String, String)]) -> Result<i64> {
    let mut revision = 0;
    for chunk in kvs.chunks(TXN) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|(k, v)| TxnOp::put(k.as_str(), v.as_str(), None))
            .collect();
        let r = client.txn(Txn::new().and_then(ops)).await?;
        revision = r.header().map_or(revision, |h| h.revision());
    }
    Ok(revision)
}

/// Every key under `prefix`, read in pages of 1,000 at one revision; how many.
async fn paged_get(client: &mut Client, prefix: &str) -> Result<usize> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    let mut from = prefix.as_bytes().to_vec();
    let (mut revision, mut n) = (0, 0);
    loop {
        let mut options = GetOptions::new().with_range(end.clone()).with_limit(1_000);
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let page = client.get(from.clone(), Some(options)).await?;
        if revision == 0 {
            revision = page.header().map_or(0, |h| h.revision());
        }
        n += page.kvs().len();
        match page.kvs().last() {
            Some(last) if page.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok(n),
        }
    }
}

async fn wait_until(what: &str, bound: Duration, mut ok: impl FnMut() -> bool) -> Result<()> {
    let started = now();
    while !ok() {
        if started.elapsed() > bound {
            bail!("{what}: not within {bound:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

fn main() -> Result<()> {
    if !installed() {
        bail!("`etcd` is not installed (Debian: apt-get install etcd-server)");
    }
    let pods: usize = match std::env::var("AETHER_ETCD_SCALE_PODS") {
        Ok(v) => v.parse().context("AETHER_ETCD_SCALE_PODS")?,
        Err(_) => 20_000,
    };
    let dir: PathBuf =
        std::env::temp_dir().join(format!("aether-etcd-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let server = EtcdServer::start(&dir.join("etcd"), 1, None)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let out = rt.block_on(run(pods, &server, &dir));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    out
}

async fn run(pods: usize, server: &EtcdServer, dir: &std::path::Path) -> Result<()> {
    let s = settings(server.endpoints());
    let all = rows(pods);
    let kvs: Vec<(String, String)> = all
        .iter()
        .flat_map(|r| keys::encode(PREFIX, r).expect("a valid row"))
        .collect();
    let wire: usize = kvs.iter().map(|(k, v)| k.len() + v.len()).sum();
    println!(
        "{pods} rows of {} services on {NODES} nodes: {} keys, {:.1} MiB of keys and values",
        pods / 10,
        kvs.len(),
        wire as f64 / 1048576.0
    );
    let mut client = Client::connect(server.endpoints(), None).await?;

    // 1. Registration.
    let baseline: Vec<(String, String)> = kvs
        .iter()
        .map(|(k, v)| (k.replacen(PREFIX, "/baseline", 1), v.clone()))
        .collect();
    let t = now();
    put_all(&mut client, &baseline).await?;
    let raw_put = t.elapsed();
    client
        .delete(
            "/baseline/",
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await?;
    let (tx, _rx) = mpsc::channel(1);
    let writer_view = EtcdSource::start(s.clone(), tx);
    let mut by_node: BTreeMap<String, Vec<Row>> = BTreeMap::new();
    for r in &all {
        by_node
            .entry(r.node.clone().unwrap_or_default())
            .or_default()
            .push(r.clone());
    }
    let t = now();
    let registrations: Vec<Registration> = by_node
        .into_iter()
        .map(|(node, rows)| {
            let reg = Registration::start(
                s.clone(),
                dir.join(format!("lease-{node}")),
                writer_view.clone(),
            );
            reg.set(rows);
            reg
        })
        .collect();
    wait_until("registration", Duration::from_secs(600), || {
        registrations.iter().all(|r| {
            r.state.settled() && r.state.keys.load(std::sync::atomic::Ordering::Acquire) > 0
        })
    })
    .await?;
    let registered = t.elapsed();
    println!();
    println!(
        "| registration of {} keys | seconds | keys/s | ratio |",
        kvs.len()
    );
    println!("|---|---|---|---|");
    let rate = |d: Duration| kvs.len() as f64 / d.as_secs_f64();
    println!(
        "| plain client, one writer, transactions of {TXN} (baseline) | {:.2} | {:.0} | 1.00 |",
        raw_put.as_secs_f64(),
        rate(raw_put)
    );
    println!(
        "| {NODES} nodes' registrations (leases, copies, transactions of {TXN}) | {:.2} | {:.0} | {:.2} |",
        registered.as_secs_f64(),
        rate(registered),
        registered.as_secs_f64() / raw_put.as_secs_f64()
    );
    drop(writer_view);

    // 2. A new node's full model.
    // The baseline reads the same pages as the source (1,000 keys at the first page's
    // revision: one response of every key passes gRPC's 4 MiB limit at about 18,000 keys).
    let t = now();
    let raw_count = paged_get(&mut client, &keys::endpoints_prefix(PREFIX)).await?;
    let raw_get = t.elapsed();
    let before = allocated();
    let (tx, mut changed) = mpsc::channel(1);
    let t = now();
    let source = EtcdSource::start(s.clone(), tx);
    let (rows_now, _) = loop {
        if let Some(held) = source.rows_at() {
            break held;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let list = t.elapsed();
    let held = allocated().saturating_sub(before);
    if rows_now.len() != pods {
        bail!("the new node holds {} rows, want {pods}", rows_now.len());
    }
    let ctx = NodeContext {
        node: Some("node-new".into()),
        ignored_namespaces: BTreeSet::from(["kube-system".to_owned()]),
        now_ms: 1_000_000,
        ..NodeContext::default()
    };
    let mut snapshot = Snapshot {
        rows: rows_now,
        ..Snapshot::default()
    };
    complete_snapshot_except(
        &mut snapshot,
        "10.96.0.0/16".parse()?,
        &ctx.ignored_namespaces,
    );
    let model = compile(&snapshot, &ctx);
    let full = t.elapsed();
    // The table, the snapshot (its rows shared with the table) and the model, as a node holds
    // them once its first model is published.
    let with_model = allocated().saturating_sub(before);
    println!();
    println!("| a new node, {raw_count} keys | ms | ratio |");
    println!("|---|---|---|");
    println!(
        "| plain `get`s of the prefix, pages of 1,000 (baseline) | {:.1} | 1.00 |",
        raw_get.as_secs_f64() * 1000.0
    );
    println!(
        "| the source's listing: every key decoded and checked, the table held | {:.1} | {:.2} |",
        list.as_secs_f64() * 1000.0,
        list.as_secs_f64() / raw_get.as_secs_f64()
    );
    println!(
        "| to the compiled model (listing, generated Services, compile; {} services) | {:.1} | {:.2} |",
        model.mesh_service_count(),
        full.as_secs_f64() * 1000.0,
        full.as_secs_f64() / raw_get.as_secs_f64()
    );
    println!();
    println!(
        "The table holds {:.1} MiB ({:.0} bytes a row, {:.0} a key), for {:.1} MiB of keys and values on the wire ({:.2}x).",
        held as f64 / 1048576.0,
        held as f64 / pods as f64,
        held as f64 / kvs.len() as f64,
        wire as f64 / 1048576.0,
        held as f64 / wire as f64
    );
    println!(
        "With the snapshot and the compiled model beside it: {:.1} MiB ({:.0} bytes a row).",
        with_model as f64 / 1048576.0,
        with_model as f64 / pods as f64
    );
    drop(model);
    one_row_changed(&source, &snapshot, &ctx)?;
    drop(snapshot);

    // 3. Watch events: written while the source watches.
    while changed.try_recv().is_ok() {}
    let start_revision = source
        .stats()
        .revision
        .load(std::sync::atomic::Ordering::Acquire);
    let flips: Vec<(String, String)> = all
        .iter()
        .take(CHANGES.min(pods))
        .flat_map(|r| {
            let mut r = r.clone();
            r.ready = false;
            keys::encode(PREFIX, &r).expect("a valid row")
        })
        .collect();
    let t = now();
    let last = put_all(&mut client, &flips).await?;
    let written = t.elapsed();
    let written_at = now();
    wait_until("the source's watch", Duration::from_secs(120), || {
        source
            .stats()
            .revision
            .load(std::sync::atomic::Ordering::Acquire)
            >= last
    })
    .await?;
    let lag = written_at.elapsed();
    // Replayed from the first revision: a plain watch that counts.
    let t = now();
    let mut stream = client
        .watch(
            keys::endpoints_prefix(PREFIX),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(start_revision + 1),
            ),
        )
        .await?;
    let mut events = Vec::with_capacity(flips.len());
    'watch: while let Some(r) = stream.message().await? {
        for e in r.events() {
            if let Some(kv) = e.kv() {
                events.push((kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision()));
                if kv.mod_revision() >= last && events.len() >= flips.len() {
                    break 'watch;
                }
            }
        }
    }
    let replay = t.elapsed();
    // The same events applied to a table holding the prefix (what the source adds to each).
    let mut table = Table::new(PREFIX);
    let listing: Vec<(Vec<u8>, Vec<u8>, i64)> = kvs
        .iter()
        .map(|(k, v)| (k.clone().into_bytes(), v.clone().into_bytes(), 1))
        .collect();
    table.replace(
        listing
            .iter()
            .map(|(k, v, r)| (k.as_slice(), v.as_slice(), *r)),
    );
    let t = now();
    for (k, v, r) in &events {
        let _ = table.put(k, v, *r);
    }
    let applied = t.elapsed();
    let n = events.len() as f64;
    println!();
    println!(
        "| {} watch events ({} pods flipped, every copy) | ms | events/s | ratio |",
        events.len(),
        CHANGES.min(pods)
    );
    println!("|---|---|---|---|");
    println!(
        "| written by a plain client, transactions of {TXN} (etcd's pace) | {:.1} | {:.0} | |",
        written.as_secs_f64() * 1000.0,
        n / written.as_secs_f64()
    );
    println!(
        "| the source's lag behind the last write, watching meanwhile | {:.1} | | |",
        lag.as_secs_f64() * 1000.0
    );
    println!(
        "| replayed to a plain watch that counts (baseline) | {:.1} | {:.0} | 1.00 |",
        replay.as_secs_f64() * 1000.0,
        n / replay.as_secs_f64()
    );
    let both = replay + applied;
    println!(
        "| replayed, and applied to the table (decode, check, store) | {:.1} | {:.0} | {:.2} |",
        both.as_secs_f64() * 1000.0,
        n / both.as_secs_f64(),
        both.as_secs_f64() / replay.as_secs_f64()
    );
    drop(registrations);
    drop(source);
    Ok(())
}

/// Figure 4: one row's change to the node's model, the whole read against the feed.
fn one_row_changed(source: &EtcdSource, snapshot: &Snapshot, ctx: &NodeContext) -> Result<()> {
    const FLIPS: usize = 20;
    let cidr: ipnet::IpNet = "10.96.0.0/16".parse()?;
    let mut whole = Live::new(ctx.clone());
    whole.update_to(snapshot, ctx);
    let mut fed = Live::new(ctx.clone());
    fed.update_to(snapshot, ctx);
    let mut feed = EtcdFeed::default();
    feed.fill(&[], snapshot, 0);
    let mut rows = snapshot.rows.clone();
    let (mut by_whole, mut by_change) = (Vec::new(), Vec::new());
    for i in 0..FLIPS {
        let k = (i * 7919) % rows.len();
        let mut row = (*rows[k]).clone();
        row.ready = !row.ready;
        let row = std::sync::Arc::new(row);
        rows[k] = row.clone();
        // The whole read: the table's rows (here with the flip put in), the registrar, the
        // kept model compared object by object.
        let t = now();
        let (_, _) = source.rows_at().context("listed")?;
        let mut s = Snapshot {
            rows: rows.clone(),
            ..Snapshot::default()
        };
        complete_snapshot_except(&mut s, cidr, &ctx.ignored_namespaces);
        whole.update_to(&s, ctx);
        let _published = whole.model().clone();
        by_whole.push(t.elapsed());
        drop(s);
        // The feed: the row's change alone.
        let t = now();
        let id = (row.namespace.clone(), row.service.clone(), row.address);
        let f = feed.changes(vec![(id, Some(row))], ctx, cidr, None);
        fed.apply(f.changes);
        let _published = fed.model().clone();
        by_change.push(t.elapsed());
        if !fed.model().serves_like(whole.model()) {
            bail!("flip {i}: the model kept by changes differs from the whole read's");
        }
    }
    let ms = |v: &mut Vec<Duration>| {
        v.sort();
        (
            v[v.len() / 2].as_secs_f64() * 1000.0,
            v[v.len() - 1].as_secs_f64() * 1000.0,
        )
    };
    let (w50, wmax) = ms(&mut by_whole);
    let (c50, cmax) = ms(&mut by_change);
    println!();
    println!(
        "| one row's readiness flipped, to the node's model ({} rows, median / slowest of {FLIPS}) | ms | ratio |",
        rows.len()
    );
    println!("|---|---|---|");
    println!(
        "| the whole read (baseline): every row, the registrar, the kept model compared whole | {w50:.3} / {wmax:.3} | 1 |"
    );
    println!(
        "| the etcd feed: the row, its service's generated Service, the change applied | {c50:.3} / {cmax:.3} | {:.4} |",
        c50 / w50
    );
    Ok(())
}
