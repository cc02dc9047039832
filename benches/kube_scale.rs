//! Scale benchmark of the Kubernetes source (issue #9 §1): every node watches every pod, so what
//! does a node hold, and what does one reload cost, with 10,000 and 100,000 pods in the stores?
//!
//! The objects are synthetic but shaped as an API server sends them ([`cluster`]: Deployment
//! pods of a few KiB of JSON with managed fields, ten per ServiceAccount, mesh annotations mixing
//! HTTP and raw TCP, user Services with their EndpointSlices, HTTPRoutes, the registrar's
//! generated Services). A scripted API server (`tower-test`, as the watch tests use) lists them
//! in pages of 500 to the real watches ([`KubeSource`]). Measured, each beside a baseline run in
//! the same process:
//!
//! 1. **CPU per watch event** (one pod changed anywhere in the cluster reaches every node): the
//!    JSON of one `MODIFIED` event deserialized and stored, as kube-rs does it by default (`Pod`,
//!    stored whole) and as the source does it (`Stored<ApiPod>`: a guard as kube's `DeserializeGuard`, the
//!    pod decoded as the mesh reads it, stored as a `MeshPod` behind its own `Arc`); the
//!    baseline is parsing the same bytes into nothing (`serde::de::IgnoredAny`).
//! 2. **Memory held by the pod store** (jemalloc `stats.allocated` after an epoch advance, before
//!    and after the initial list): the source's store (`MeshPod`) against a kube-rs reflector on
//!    the same pods (`Pod`, whole), bytes per pod, beside the pod's JSON size on the wire.
//! 3. **One reload** on the whole cluster, as the node does it: the copy out of the stores
//!    (`KubeSource::objects`), `objects::snapshot`, `model::compile` (the model is published
//!    here), then `objects::fingerprint`, the DNS table, the registrar's input and freeing the
//!    copy; then the next event's conversion (one pod object replaced) taking the other pods
//!    from this reload's snapshot (`objects::snapshot_reusing`); the time to the published
//!    model, the whole reload and the next event, median of several runs, each against cloning
//!    the snapshot (the least any reload must touch), and the peak extra memory of the reload
//!    (jemalloc's `thread.peak` of the fresh thread that runs it, as `spawn_blocking` would).
//!    What the daemon then keeps: the compiled model, and the snapshot it publishes beside it
//!    (`aether debug config-dump`, offline replay).
//!
//! 4. **The kept model fed by changes** (`node::kube_feed`, issue #37): the first load (every
//!    object converted, the kept model built whole: what a start or a relist costs), then pods
//!    made Ready or not one at a time, each a `MODIFIED` event on the scripted server's pod watch:
//!    the time from the event in the store to the published model, and from its bytes on the
//!    wire. Checked at the end: the kept model serves as the compile of the stores.
//!
//! No timing is asserted; the bench prints tables. Run: `cargo bench --bench kube_scale`
//! (`AETHER_KUBE_SCALE_ONLY=fed`: figure 4 alone).
//! `AETHER_KUBE_SCALE_PODS` (default `10000,100000`) and `AETHER_KUBE_SCALE_RUNS` (default 5)
//! change the sizes and the runs per figure.
#![allow(clippy::print_stdout, missing_docs)] // A benchmark harness reports on stdout.

#[path = "kube_scale/cluster.rs"]
mod cluster;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::core::WatchEvent;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector::store::Writer};
use kube::{Api, Client};
use tikv_jemalloc_ctl::{epoch, stats};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use aether::dns::DnsTable;
use aether::model::live::Live;
use aether::model::registrar::generated_services_except;
use aether::model::{NodeContext, compile};
use aether::node::kube_feed::KubeFeed;
use aether::registry::kube::objects::{fingerprint, snapshot, snapshot_reusing};
use aether::registry::kube::pod::{ApiPod, MeshPod};
use aether::registry::kube::watch::kept::Keeper;
use aether::registry::kube::watch::{KubeSource, Stored, WatchSettings};
use aether::time::now;

use cluster::{Cluster, Server};

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Pods whose events are replayed for the per-event figures.
const EVENT_SAMPLE: usize = 2_000;

fn main() -> Result<()> {
    let sizes: Vec<usize> = std::env::var("AETHER_KUBE_SCALE_PODS")
        .unwrap_or_else(|_| "10000,100000".into())
        .split(',')
        .map(|v| v.trim().parse().context("AETHER_KUBE_SCALE_PODS"))
        .collect::<Result<_>>()?;
    let runs: usize = match std::env::var("AETHER_KUBE_SCALE_RUNS") {
        Ok(v) => v.parse().context("AETHER_KUBE_SCALE_RUNS")?,
        Err(_) => 5,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the runtime")?;
    println!("load average at start: {}", loadavg());
    // `AETHER_KUBE_SCALE_ONLY=fed` runs figure 4 alone.
    let only_fed = std::env::var("AETHER_KUBE_SCALE_ONLY").is_ok_and(|v| v == "fed");
    for n in sizes {
        let c = Cluster { pods: n };
        println!("\n## {n} pods: {}", c.describe());
        if !only_fed {
            per_event(&c, runs);
            pod_store(&rt, &c)?;
            reload(&rt, &c, runs)?;
        }
        fed(&rt, &c)?;
    }
    println!("\nload average at end: {}", loadavg());
    Ok(())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Heap bytes allocated now, over the process (jemalloc's statistics, refreshed).
fn allocated() -> u64 {
    let _ = epoch::advance();
    stats::allocated::read().map_or(0, |v| v as u64)
}

/// The most heap this thread held at once since it started, net of what it freed (jemalloc's
/// `thread.peak`, accurate to about 100 KiB).
#[allow(unsafe_code)]
fn thread_peak() -> u64 {
    // SAFETY: `thread.peak.read` is a read-only mallctl of type `uint64_t` (jemalloc 5.3), read
    // here as a u64.
    unsafe { tikv_jemalloc_ctl::raw::read::<u64>(b"thread.peak.read\0") }.unwrap_or(0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Figure 1: the CPU a node spends on one pod's watch event.
fn per_event(c: &Cluster, runs: usize) {
    let sample = c.pods.min(EVENT_SAMPLE);
    let events: Vec<Vec<u8>> = (0..sample)
        .map(|p| {
            let e = serde_json::json!({"type": "MODIFIED", "object": c.pod(p * (c.pods / sample))});
            serde_json::to_vec(&e).expect("an event serializes")
        })
        .collect();
    let wire = events.iter().map(Vec::len).sum::<usize>() / sample;
    let per_pod = |f: &mut dyn FnMut(&[u8])| {
        let t = now();
        for e in &events {
            f(e);
        }
        t.elapsed().as_secs_f64() * 1e6 / sample as f64
    };
    let mut rows: [Vec<f64>; 5] = Default::default();
    for _ in 0..runs {
        rows[0].push(per_pod(&mut |e| {
            let _: serde::de::IgnoredAny = serde_json::from_slice(e).expect("json");
        }));
        rows[1].push(per_pod(&mut |e| {
            let _: WatchEvent<Pod> = serde_json::from_slice(e).expect("a pod event");
        }));
        rows[2].push(per_pod(&mut |e| {
            let _: WatchEvent<Stored<ApiPod>> = serde_json::from_slice(e).expect("a pod event");
        }));
        let mut plain: Writer<Pod> = Writer::default();
        rows[3].push(per_pod(&mut |e| {
            if let WatchEvent::Modified(pod) = serde_json::from_slice(e).expect("a pod event") {
                plain.apply_watcher_event(&Event::Apply(pod));
            }
        }));
        drop(plain);
        let (kept, mut keeper) = Keeper::keeping(ApiPod::shared_into_pod);
        rows[4].push(per_pod(&mut |e| {
            if let WatchEvent::Modified(guard) =
                serde_json::from_slice::<WatchEvent<Stored<ApiPod>>>(e).expect("a pod event")
            {
                keeper.apply(Event::Apply(guard));
            }
        }));
        assert_eq!(kept.len(), sample, "every event stored");
    }
    let base = median(rows[0].clone());
    println!(
        "\n### CPU per pod watch event ({sample} distinct pods, median of {runs} runs)\n\n\
         One `MODIFIED` event is {wire} bytes of JSON; a `Pod` value is {} bytes before any of \
         its heap fields, a `MeshPod` {}.\n",
        size_of::<Pod>(),
        size_of::<MeshPod>()
    );
    println!("| step | µs per event | ratio to parsing only |");
    println!("|---|---|---|");
    let names = [
        "baseline: parse the JSON into nothing (`IgnoredAny`)",
        "into `WatchEvent<Pod>` (kube-rs default)",
        "into `WatchEvent<Stored<ApiPod>>` (the source: a guard as kube's `DeserializeGuard`, buffered, then typed)",
        "kube-rs default: `Pod`, stored whole",
        "the source: `Stored<ApiPod>`, stored as a `MeshPod` (`Keeper`)",
    ];
    for (name, r) in names.iter().zip(rows) {
        let m = median(r);
        println!("| {name} | {m:.1} | {:.2} |", m / base);
    }
}

async fn until(mut ready: impl FnMut() -> bool) {
    while !ready() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What one initial list of the pods cost, and what the store then holds.
struct Listed {
    held: u64,
    secs: f64,
    server_secs: f64,
    wire: u64,
}

impl Listed {
    fn row(&self, name: &str, pods: usize, base: Option<u64>) {
        let per_pod = self.held as f64 / pods as f64;
        let client = self.secs - self.server_secs;
        println!(
            "| {name} | {:.1} | {per_pod:.0} | {} | {:.2} | {:.1} |",
            mib(self.held),
            base.map_or("1".into(), |b| format!(
                "{:.3}",
                self.held as f64 / b as f64
            )),
            per_pod / (self.wire as f64 / pods as f64),
            client * 1e6 / pods as f64,
        );
    }
}

/// Start the source's watches on `server`'s client and wait until every kind has listed.
fn start_source(rt: &Runtime, client: &Client) -> KubeSource {
    let (tx, _rx) = mpsc::channel(1);
    rt.block_on(async {
        let source = KubeSource::start(client, &WatchSettings::default(), &tx);
        until(|| source.synced()).await;
        source
    })
}

/// Figure 2: the pod store, as the source holds it (`MeshPod`) and as a kube-rs reflector does.
fn pod_store(rt: &Runtime, c: &Cluster) -> Result<()> {
    let before = allocated();
    let t = now();
    let (server, client) = rt.block_on(async { Server::start(c.collections(false)) });
    let source = start_source(rt, &client);
    let trimmed = Listed {
        held: allocated().saturating_sub(before),
        secs: t.elapsed().as_secs_f64(),
        server_secs: server.generating_secs(),
        wire: server.sent.load(std::sync::atomic::Ordering::Relaxed),
    };
    drop((source, client, server));

    let before = allocated();
    let t = now();
    let (server, client) = rt.block_on(async { Server::start(c.collections(false)) });
    let store: Store<Pod> = rt.block_on(async {
        let (reader, writer) = reflector::store();
        let api = Api::<Pod>::all(client.clone());
        let stream = kube::runtime::watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer);
        tokio::spawn(stream.for_each(|_| std::future::ready(())));
        reader.wait_until_ready().await.context("the store")?;
        anyhow::Ok(reader)
    })?;
    let whole = Listed {
        held: allocated().saturating_sub(before),
        secs: t.elapsed().as_secs_f64(),
        server_secs: server.generating_secs(),
        wire: server.sent.load(std::sync::atomic::Ordering::Relaxed),
    };
    anyhow::ensure!(
        store.len() == c.pods,
        "listed {} of {}",
        store.len(),
        c.pods
    );
    drop((store, client, server));

    println!(
        "\n### Pod store after the initial list ({} pods, pages of 500)\n",
        c.pods
    );
    println!(
        "| store | MiB held | bytes per pod | ratio to untrimmed | bytes held per byte of JSON | client µs per pod listed |"
    );
    println!("|---|---|---|---|---|---|");
    whole.row("kube-rs default (`Pod`, untrimmed)", c.pods, None);
    trimmed.row("the source (`MeshPod`, `Kept`)", c.pods, Some(whole.held));
    println!(
        "(list bodies: {:.1} MiB on the wire; \"client µs\" is the list's wall time less the scripted server's)",
        mib(whole.wire)
    );
    Ok(())
}

/// One reload's step times (seconds) and its peak extra memory.
struct Reload {
    steps: [f64; 7],
    /// The conversion of the next event (one pod object replaced, as a `MODIFIED` event
    /// replaces it in the store) taking the other pods from this reload's snapshot.
    reusing: f64,
    /// The kept model (issue #37) brought to this reload's snapshot from nothing, and the
    /// next event's snapshot (one row's readiness flipped) applied to it: the objects compared
    /// (`Live::changes_to`) and the touched components compiled.
    kept_full: f64,
    kept_next: f64,
    /// What the kept model holds beyond the snapshot: its objects' copies (rows and pods
    /// shared), components and model.
    kept_bytes: u64,
    baseline: f64,
    peak: u64,
}

/// The reload's steps in the node's order: the first [`TO_PUBLISH`] stand between the watch's
/// state and the published model; the node makes the others after the publish
/// (`node::follow`, on a blocking thread).
const STEPS: [&str; 7] = [
    "copy out of the stores (`KubeSource::objects`)",
    "`objects::snapshot` (convert every object)",
    "`model::compile`",
    "`objects::fingerprint`",
    "DNS table (`DnsTable::build`)",
    "the registrar's input (`generated_services_except`)",
    "free the copy",
];

/// How many of [`STEPS`] come before the publish.
const TO_PUBLISH: usize = 3;

/// Figure 3: one reload of the whole cluster, as `node::load` does it.
fn reload(rt: &Runtime, c: &Cluster, runs: usize) -> Result<()> {
    let collections = c.collections(true);
    let before = allocated();
    let t = now();
    let (server, client) = rt.block_on(async { Server::start(collections) });
    let source = start_source(rt, &client);
    let sync_secs = t.elapsed().as_secs_f64();
    let held = allocated().saturating_sub(before);
    let ctx = NodeContext {
        node: Some("node-0".into()),
        ignored_namespaces: BTreeSet::from(["kube-system".to_owned()]),
        now_ms: 1_000_000,
        ..NodeContext::default()
    };

    let mut reloads = Vec::new();
    let mut model_bytes = 0;
    let mut published_bytes = 0;
    let mut facts = String::new();
    for run in 0..runs {
        let before = allocated();
        let (r, model) = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let mut steps = [0.0; 7];
                    let mut step = |i: usize, t: std::time::Instant| {
                        steps[i] = t.elapsed().as_secs_f64();
                    };
                    let t = now();
                    let (objects, invalid) = source.objects();
                    step(0, t);
                    let t = now();
                    let (snap, problems, places) = snapshot_reusing(&objects, None);
                    step(1, t);
                    let t = now();
                    let model = compile(&snap, &ctx);
                    step(2, t);
                    let t = now();
                    let fp = fingerprint(&objects);
                    step(3, t);
                    let t = now();
                    let dns = DnsTable::build(&snap, &ctx.domains, true);
                    step(4, t);
                    let t = now();
                    let (desired, _) = generated_services_except(&snap, &ctx.ignored_namespaces);
                    step(5, t);
                    drop(desired);
                    // The next event's objects: one pod object replaced (another in each run),
                    // as a `MODIFIED` event replaces it in the store.
                    let mut next = objects.clone();
                    let k = (run * 7919) % next.pods.len().max(1);
                    if let Some(p) = next.pods.get_mut(k) {
                        *p = std::sync::Arc::new((**p).clone());
                    }
                    let t = now();
                    drop(objects);
                    step(6, t);
                    let peak = thread_peak();
                    // Its conversion, the other pods taken from this snapshot
                    // (`objects::snapshot_reusing`); after the peak is read, which is this
                    // reload's.
                    let t = now();
                    let (mut again, _, _) = snapshot_reusing(&next, Some((&places, &snap)));
                    let reusing = t.elapsed().as_secs_f64();
                    assert_eq!(again.rows.len(), snap.rows.len(), "the same pods");
                    // The kept model: built from this snapshot, then given the next one with
                    // one row's readiness flipped.
                    let held = allocated();
                    let t = now();
                    let mut live = Live::new(ctx.clone());
                    live.update_to(&snap, &ctx);
                    let kept_full = t.elapsed().as_secs_f64();
                    let kept_bytes = allocated().saturating_sub(held);
                    if let Some(row) = again.rows.get_mut(k % snap.rows.len().max(1)) {
                        let row = std::sync::Arc::make_mut(row);
                        row.ready = !row.ready;
                    }
                    let t = now();
                    let applied = live.update_to(&again, &ctx);
                    let kept_next = t.elapsed().as_secs_f64();
                    assert!(applied.compiled >= 1 && !applied.full, "{applied:?}");
                    assert!(
                        live.model().serves_like(&compile(&again, &ctx)),
                        "the kept model is the compile of the next snapshot"
                    );
                    drop((again, next, places, live));
                    let t = now();
                    let copy = snap.clone();
                    let baseline = t.elapsed().as_secs_f64();
                    drop(copy);
                    let facts = format!(
                        "{} rows, {} Services, {} EndpointSlices, {} HTTPRoutes in the snapshot; \
                         {} objects left out, {} not deserialized; fingerprint {fp:016x}",
                        snap.rows.len(),
                        snap.services.len(),
                        snap.endpoint_slices.len(),
                        snap.http_routes.len(),
                        problems.len(),
                        invalid.objects.len()
                    );
                    drop(dns);
                    (
                        Reload {
                            steps,
                            reusing,
                            kept_full,
                            kept_next,
                            kept_bytes,
                            baseline,
                            peak,
                        },
                        (model, facts, snap),
                    )
                })
                .join()
                .expect("the reload thread")
        });
        // The daemon publishes the snapshot with the model (`ModelHandle::publish_with_source`,
        // for `aether debug config-dump` and offline replay): what it keeps is both.
        published_bytes = allocated().saturating_sub(before);
        drop(model.2);
        model_bytes = allocated().saturating_sub(before);
        facts = model.1;
        drop(model.0);
        reloads.push(r);
    }
    drop((source, client, server));

    let base = median(reloads.iter().map(|r| r.baseline).collect());
    println!(
        "\n### One reload of the whole cluster (median of {runs} runs)\n\n\
         {facts}. The stores of every kind hold {:.1} MiB after the initial lists ({sync_secs:.1} s \
         for all of them, the scripted server's page building included); the compiled model keeps \
         {:.1} MiB, and the snapshot published beside it (for `aether debug`) {:.1} MiB more \
         ({:.2} × the model).\n",
        mib(held),
        mib(model_bytes),
        mib(published_bytes.saturating_sub(model_bytes)),
        published_bytes.saturating_sub(model_bytes) as f64 / model_bytes.max(1) as f64
    );
    println!("| step | ms | ratio to cloning the snapshot |");
    println!("|---|---|---|");
    let mut total = Vec::new();
    for (i, name) in STEPS.iter().enumerate() {
        let m = median(reloads.iter().map(|r| r.steps[i]).collect());
        println!("| {name} | {:.1} | {:.2} |", m * 1e3, m / base);
    }
    for r in &reloads {
        total.push(r.steps.iter().sum::<f64>());
    }
    let total = median(total);
    let published = median(
        reloads
            .iter()
            .map(|r| r.steps[..TO_PUBLISH].iter().sum::<f64>())
            .collect(),
    );
    println!(
        "| **to the published model** (the first {TO_PUBLISH} steps) | {:.1} | {:.2} |",
        published * 1e3,
        published / base
    );
    println!(
        "| **the whole reload** | {:.1} | {:.2} |",
        total * 1e3,
        total / base
    );
    let reusing = median(reloads.iter().map(|r| r.reusing).collect());
    let next = median(
        reloads
            .iter()
            .map(|r| r.steps[0] + r.reusing + r.steps[2])
            .collect(),
    );
    println!(
        "| the next event's conversion, one pod changed (`objects::snapshot_reusing`) | {:.1} | {:.2} |",
        reusing * 1e3,
        reusing / base
    );
    println!(
        "| **the next event to the published model** (the copy, that conversion, the compile) | {:.1} | {:.2} |",
        next * 1e3,
        next / base
    );
    let kept_full = median(reloads.iter().map(|r| r.kept_full).collect());
    let kept_next = median(reloads.iter().map(|r| r.kept_next).collect());
    let kept_published = median(
        reloads
            .iter()
            .map(|r| r.steps[0] + r.reusing + r.kept_next)
            .collect(),
    );
    println!(
        "| the kept model built from the snapshot (`Live::update_to` from nothing: the first load) | {:.1} | {:.2} |",
        kept_full * 1e3,
        kept_full / base
    );
    println!(
        "| the kept model given the next snapshot, one row's readiness flipped (`Live::update_to`: every object compared, one component compiled) | {:.1} | {:.2} |",
        kept_next * 1e3,
        kept_next / base
    );
    println!(
        "| **the next event to the published model, kept model** (the copy, the conversion, `Live::update_to`) | {:.1} | {:.2} |",
        kept_published * 1e3,
        kept_published / base
    );
    println!("| baseline: clone the snapshot | {:.1} | 1 |", base * 1e3);
    println!(
        "\nThe kept model holds {:.1} MiB beyond the snapshot (its objects' copies, rows and pods shared; components; model).",
        mib(median(reloads.iter().map(|r| r.kept_bytes as f64).collect()) as u64)
    );
    let peak = median(reloads.iter().map(|r| r.peak as f64).collect()) as u64;
    println!(
        "\nPeak extra memory of one reload: {:.1} MiB ({:.2} × the stores' {:.1} MiB); the runs' \
         totals in ms: {:?}",
        mib(peak),
        peak as f64 / held as f64,
        mib(held),
        reloads
            .iter()
            .map(|r| (r.steps.iter().sum::<f64>() * 1e3).round())
            .collect::<Vec<_>>()
    );
    Ok(())
}

/// Pod events sent one by one through the watch for [`fed`].
const FED_EVENTS: usize = 20;

/// Figure 4: the kept model fed by changes, as the node's Kubernetes source does it
/// (`node::kube_feed`, issue #37): the first load (every object converted, the kept model built
/// whole), then [`FED_EVENTS`] pods made Ready or not one at a time, each a `MODIFIED` event on
/// the pods' watch: the time from the event in the store to the published model (the load takes
/// the key the watch recorded, converts that pod alone, compiles its component), and from the
/// event's bytes on the wire to the published model.
fn fed(rt: &Runtime, c: &Cluster) -> Result<()> {
    let collections = c.collections(true);
    let pods = collections
        .iter()
        .find(|c| c.path == "/api/v1/pods")
        .cloned()
        .context("the pods' collection")?;
    let (server, client) = rt.block_on(async { Server::start(collections) });
    let source = start_source(rt, &client);
    let pod_kind = source
        .kinds()
        .iter()
        .find(|k| k.kind == "Pod")
        .cloned()
        .context("the pods' watch")?;
    let ctx = NodeContext {
        node: Some("node-0".into()),
        ignored_namespaces: BTreeSet::from(["kube-system".to_owned()]),
        now_ms: 1_000_000,
        ..NodeContext::default()
    };
    let before = allocated();
    let mut feed = KubeFeed::default();
    let mut live = Live::new(ctx.clone());
    let t = now();
    // On a fresh thread, as `spawn_blocking` would run it, for its peak.
    // Named, so that a profile can be cut to it (`perf report --comm first-load`).
    let (first, first_peak) = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("first-load".into())
            .spawn_scoped(scope, || {
                (feed.load(&source, &mut live, &ctx, None), thread_peak())
            })
            .expect("a thread")
            .join()
            .expect("the load thread")
    });
    let first_secs = t.elapsed().as_secs_f64();
    let kept_bytes = allocated().saturating_sub(before);
    anyhow::ensure!(first.whole, "the first load reads everything");
    let mut previous = (live.model().clone(), first.retained);

    let mut in_store = Vec::new();
    let mut on_wire = Vec::new();
    let mut peaks = Vec::new();
    for run in 0..FED_EVENTS {
        let k = (run * 7919 + 13) % c.pods.max(1);
        let mut pod = (pods.item)(k);
        if let Some(conditions) = pod["status"]["conditions"].as_array_mut() {
            for cond in conditions.iter_mut().filter(|c| c["type"] == "Ready") {
                let now_ready = cond["status"] != "True";
                cond["status"] = if now_ready { "True" } else { "False" }.into();
            }
        }
        pod["metadata"]["resourceVersion"] = format!("{}", 3_000_000 + run).into();
        let t0 = now();
        server.event(
            "/api/v1/pods",
            &serde_json::json!({"type": "MODIFIED", "object": pod}),
        );
        // The watch takes it, the store holds it, its key is recorded.
        rt.block_on(async {
            while pod_kind.pending.lock().keys.is_empty() {
                tokio::task::yield_now().await;
            }
        });
        let t1 = now();
        let (fed, model, peak) = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let fed = feed.load(&source, &mut live, &ctx, Some((&previous.0, &previous.1)));
                    let model = live.model().clone();
                    (fed, model, thread_peak())
                })
                .join()
                .expect("the load thread")
        });
        let t2 = now();
        anyhow::ensure!(
            !fed.whole && fed.applied.changes >= 1 && fed.applied.compiled >= 1,
            "one pod's change, applied alone: {:?}",
            fed.applied
        );
        in_store.push((t2 - t1).as_secs_f64());
        on_wire.push((t2 - t0).as_secs_f64());
        peaks.push(peak as f64);
        previous = (model, fed.retained);
    }
    // What the node makes after the publish, still from every object of a few kinds (issue
    // #37 item 2): the Services, rows and MeshFilters of the kept model (the DNS table's and
    // the writers' inputs), the copy out of the stores (the writers' inputs); and, only when
    // `aether debug` asks, the whole snapshot.
    let t = now();
    let followed = live.snapshot_of(&[
        aether::model::live::Kind::Service,
        aether::model::live::Kind::Row,
        aether::model::live::Kind::MeshFilter,
    ]);
    let follow_secs = t.elapsed().as_secs_f64();
    // What the node makes of them: the mesh DNS table, the registrar's desired Services.
    let t = now();
    let dns = DnsTable::build(&followed, &ctx.domains, true);
    let dns_secs = t.elapsed().as_secs_f64();
    let t = now();
    let desired = generated_services_except(&followed, &ctx.ignored_namespaces);
    let desired_secs = t.elapsed().as_secs_f64();
    drop((followed, dns, desired));
    let t = now();
    let made = live.snapshot();
    let snapshot_secs = t.elapsed().as_secs_f64();
    let t = now();
    let (objects, _) = source.objects();
    let objects_secs = t.elapsed().as_secs_f64();
    drop(made);
    // What it kept is the compile of the stores.
    let reference = compile(&snapshot(&objects).0, &ctx);
    anyhow::ensure!(
        live.model().serves_like(&reference),
        "the kept model is the compile of the stores"
    );
    drop((objects, reference));

    let ms = |v: Vec<f64>| median(v) * 1e3;
    println!(
        "\n### The kept model fed by changes (`node::kube_feed`; median of {FED_EVENTS} pod events)\n"
    );
    println!("| step | ms |");
    println!("|---|---|");
    println!(
        "| the first load: every object converted, the kept model built whole (start, relist) | {:.1} |",
        first_secs * 1e3
    );
    println!(
        "| (the first load's peak above what it keeps: {:.1} MiB) | |",
        mib(first_peak.saturating_sub(kept_bytes))
    );
    println!(
        "| **one pod made Ready or not: its event in the store to the published model** (its key taken, that pod converted, its component compiled) | {:.3} |",
        ms(in_store.clone())
    );
    println!(
        "| **the same from the event's bytes on the wire** (deserialized, stored, then as above) | {:.3} |",
        ms(on_wire.clone())
    );
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max) * 1e3;
    println!(
        "\nSlowest of the {FED_EVENTS}: {:.3} ms in the store to published, {:.3} ms from the wire. \
         The kept model and the feed hold {:.1} MiB (objects, components, model, problems, \
         fingerprints); one event's load peaks {:.2} MiB above that. After the publish the node \
         still takes the Services, rows and MeshFilters from the kept model ({:.1} ms) and \
         copies the stores out for the writers ({:.1} ms), then makes the DNS table ({:.1} ms) \
         and the registrar's desired Services ({:.1} ms) from them; `aether debug` has the \
         whole snapshot made when it asks ({:.1} ms).",
        max(&in_store),
        max(&on_wire),
        mib(kept_bytes),
        mib(median(peaks) as u64),
        follow_secs * 1e3,
        objects_secs * 1e3,
        dns_secs * 1e3,
        desired_secs * 1e3,
        snapshot_secs * 1e3
    );
    let kept = Kept {
        source: &source,
        feed: &mut feed,
        live: &mut live,
        ctx: &ctx,
        previous,
    };
    churn(rt, c, &server, &pods, &pod_kind, kept)?;
    // What each part holds: the heap each drop gives back, the model last (the kept model
    // shares it).
    let model = live.model().clone();
    let freed = |f: &mut dyn FnMut()| {
        let before = allocated();
        f();
        mib(before.saturating_sub(allocated()))
    };
    let mut feed = Some(feed);
    let feed_mib = freed(&mut || drop(feed.take()));
    let mut live = Some(live);
    let live_mib = freed(&mut || drop(live.take()));
    let mut model = Some(model);
    let model_mib = freed(&mut || drop(model.take()));
    println!(
        "\nWhat is held at the end, by the heap each part gives back when dropped: the feed \
         {feed_mib:.1} MiB, the kept model's own bookkeeping {live_mib:.1} MiB (its objects by \
         key, the converted pods and rows, components, what each gave), the model \
         {model_mib:.1} MiB (the stores: figure 2; their watch tasks hold them past a drop here)."
    );
    drop((source, server, client));
    Ok(())
}

/// What figure 4 built, for figure 5 to go on with.
struct Kept<'a> {
    source: &'a KubeSource,
    feed: &'a mut KubeFeed,
    live: &'a mut Live,
    ctx: &'a NodeContext,
    previous: (
        aether::model::Model,
        Vec<aether::model::snapshot::RetainedPort>,
    ),
}

/// Pod events a second in figure 5 (the churn goal).
const CHURN_RATE: u64 = 200;

/// The node's coalescing window (`publish_coalesce_ms`'s default).
const CHURN_WINDOW: Duration = Duration::from_millis(20);

/// Figure 5: churn. [`CHURN_RATE`] pod events a second for `AETHER_KUBE_SCALE_CHURN_SECS`
/// (default 60; 0 skips it) through the pods' watch, each a pod made Ready or not, while one
/// thread publishes as the node's publisher does: at once after a quiet spell, then at most one
/// publish per [`CHURN_WINDOW`], each load taking every change the watch has recorded, then what
/// follows the model (the Services, rows and MeshFilters from the kept model, the DNS table,
/// the registrar's desired Services, the copy out of the stores for the writers). Measured: each
/// event's time from being sent to its model in place, the publishing thread's CPU, the heap
/// before and after.
fn churn(
    rt: &Runtime,
    c: &Cluster,
    server: &Server,
    pods: &cluster::Collection,
    pod_kind: &aether::registry::kube::watch::KindState,
    kept: Kept<'_>,
) -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let secs: u64 = std::env::var("AETHER_KUBE_SCALE_CHURN_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    if secs == 0 {
        return Ok(());
    }
    let Kept {
        source,
        feed,
        live,
        ctx,
        mut previous,
    } = kept;
    let events = CHURN_RATE * secs;
    // `AETHER_KUBE_SCALE_CHURN=rollout`: pods created and deleted (a rolling restart) rather
    // than made Ready or not.
    let rollout = std::env::var("AETHER_KUBE_SCALE_CHURN").is_ok_and(|v| v == "rollout");
    let sent = parking_lot::Mutex::new(Vec::with_capacity(events as usize));
    let base = pod_kind.events.load(Ordering::Acquire);
    let done = AtomicBool::new(false);
    let heap_before = allocated();
    let mut delays = Vec::with_capacity(events as usize);
    let mut publishes = 0u64;
    let mut follow_secs = 0.0;
    let mut cpu_secs = 0.0;
    let mut wall_secs = 0.0;
    let mut failed = None;
    // The data plane's metric series, made again for each model that serves differently.
    let series = aether::proxy::metrics::DataPlane::default();
    series.rebuild(&previous.0);
    // Publishes whose DNS table, writers' inputs, metric series were made again.
    let mut rebuilt = (0u64, 0u64, 0u64);
    std::thread::scope(|scope| {
        // The watch and the scripted server run on the runtime: driven here meanwhile.
        scope.spawn(|| {
            rt.block_on(async {
                while !done.load(Ordering::Acquire) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            });
        });
        scope.spawn(|| {
            let t0 = now();
            for i in 0..events {
                let due = t0 + Duration::from_micros(i * 1_000_000 / CHURN_RATE);
                std::thread::sleep(due.saturating_duration_since(now()));
                let (kind, pod) = if rollout {
                    // A rolling restart: a new pod of a service, then one of its old pods
                    // deleted.
                    let n = i / 2;
                    let k = ((n as usize) * 104_729 + 17) % c.pods.max(1);
                    let mut pod = (pods.item)(k);
                    if i % 2 == 0 {
                        let name =
                            format!("{}-r{n}", pod["metadata"]["name"].as_str().unwrap_or("pod"));
                        let ip = format!("10.250.{}.{}", n / 250, n % 250 + 1);
                        pod["metadata"]["name"] = name.into();
                        pod["metadata"]["uid"] = format!("00000000-0000-4000-8000-{n:012}").into();
                        pod["status"]["podIP"] = ip.clone().into();
                        pod["status"]["podIPs"] = serde_json::json!([{"ip": ip}]);
                        ("ADDED", pod)
                    } else {
                        ("DELETED", pod)
                    }
                } else {
                    let k = ((i as usize) * 104_729 + 17) % c.pods.max(1);
                    let mut pod = (pods.item)(k);
                    if let Some(conditions) = pod["status"]["conditions"].as_array_mut() {
                        for cond in conditions.iter_mut().filter(|c| c["type"] == "Ready") {
                            let flip = if i % 2 == 0 { "False" } else { "True" };
                            cond["status"] = flip.into();
                        }
                    }
                    ("MODIFIED", pod)
                };
                let mut pod = pod;
                pod["metadata"]["resourceVersion"] = format!("{}", 5_000_000 + i).into();
                sent.lock().push(now());
                server.event(
                    "/api/v1/pods",
                    &serde_json::json!({"type": kind, "object": pod}),
                );
            }
        });
        // The publisher.
        let cpu0 = thread_cpu_secs();
        let t0 = now();
        let deadline = t0 + Duration::from_secs(secs * 4 + 60);
        let mut last_start: Option<std::time::Instant> = None;
        let mut covered = 0u64;
        while covered < events {
            // A notice: a change the last publish did not take.
            while pod_kind.events.load(Ordering::Acquire) - base <= covered {
                if now() > deadline {
                    failed = Some(format!(
                        "{covered} of {events} events published by the deadline"
                    ));
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            if failed.is_some() {
                break;
            }
            if let Some(last) = last_start {
                std::thread::sleep((last + CHURN_WINDOW).saturating_duration_since(now()));
            }
            last_start = Some(now());
            // Every event counted here is pending: the load takes at least these.
            let upto = pod_kind.events.load(Ordering::Acquire) - base;
            let fed = feed.load(source, live, ctx, Some((&previous.0, &previous.1)));
            let model = live.model().clone();
            let published = now();
            {
                let sent = sent.lock();
                delays
                    .extend((covered..upto).map(|i| (published - sent[i as usize]).as_secs_f64()));
            }
            covered = upto;
            publishes += 1;
            // What follows, as the node's publisher decides it (`node::publish`): the metric
            // series when a service port or a source came or went; the DNS table when a
            // Service changed; the writers' inputs unless only pods changed, the registrar's
            // desired Services as they were, and the route statuses stand.
            let t = now();
            let unchanged = model.serves_like(&previous.0);
            let same_statuses = previous.0.route_statuses().eq(model.route_statuses());
            let a = &fed.applied;
            if !unchanged && (a.full || a.series_changed) {
                series.rebuild(&model);
                rebuilt.2 += 1;
            }
            let dns = a.touched(aether::model::live::Kind::Service);
            let writers = !fed.only_pods || a.full || fed.desired_changed || !same_statuses;
            if dns || writers {
                let followed = live.snapshot_of(&[
                    aether::model::live::Kind::Service,
                    aether::model::live::Kind::Row,
                    aether::model::live::Kind::MeshFilter,
                ]);
                if dns {
                    drop(DnsTable::build(&followed, &ctx.domains, true));
                    rebuilt.0 += 1;
                }
                if writers {
                    let desired = generated_services_except(&followed, &ctx.ignored_namespaces);
                    let (objects, _) = source.objects();
                    drop((desired, objects));
                    rebuilt.1 += 1;
                }
            }
            follow_secs += t.elapsed().as_secs_f64();
            previous = (model, fed.retained);
        }
        cpu_secs = thread_cpu_secs() - cpu0;
        wall_secs = t0.elapsed().as_secs_f64();
        done.store(true, Ordering::Release);
    });
    if let Some(why) = failed {
        anyhow::bail!("churn: {why}");
    }
    let heap_after = allocated();
    let reference = compile(&snapshot(&source.objects().0).0, ctx);
    anyhow::ensure!(
        live.model().serves_like(&reference),
        "after the churn the kept model is the compile of the stores"
    );
    let mut sorted = delays;
    sorted.sort_by(f64::total_cmp);
    let pct = |p: f64| sorted[((sorted.len() as f64 - 1.0) * p).round() as usize] * 1e3;
    println!(
        "\n### Churn: {CHURN_RATE} pod events a second for {secs} s (`AETHER_KUBE_SCALE_CHURN_SECS`), \
         {}, published as the node does ({} ms window)\n",
        if rollout {
            "pods created and deleted (`AETHER_KUBE_SCALE_CHURN=rollout`)"
        } else {
            "pods made Ready or not"
        },
        CHURN_WINDOW.as_millis()
    );
    println!("| figure | value |");
    println!("|---|---|");
    println!("| events sent, all published | {events} |");
    println!(
        "| publishes (events per publish) | {publishes} ({:.1}) |",
        events as f64 / publishes.max(1) as f64
    );
    println!(
        "| **event sent → its model in place**: p50 / p99 / max | {:.1} / {:.1} / {:.1} ms |",
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    println!(
        "| **the publishing thread's CPU** (loads and what follows them), share of one core | {:.1} % |",
        cpu_secs / wall_secs * 100.0
    );
    println!(
        "| of which what follows the model (the metric series; the DNS table, the writers' inputs where what they read changed) | {:.1} % |",
        follow_secs / wall_secs * 100.0
    );
    println!(
        "| publishes that made the DNS table, the writers' inputs, the metric series again | {}, {}, {} |",
        rebuilt.0, rebuilt.1, rebuilt.2
    );
    println!(
        "| heap before → after (the kept model, the stores, the feed) | {:.1} → {:.1} MiB |",
        mib(heap_before),
        mib(heap_after)
    );
    println!(
        "\nThe watch's own work per event (deserialize, store) is figure 1's, on the \
         runtime's thread, not in the publishing thread's CPU above."
    );
    Ok(())
}

/// The CPU time (user and system) the calling thread has spent, in seconds.
fn thread_cpu_secs() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_THREAD).map_or(0.0, |u| {
        let t = u.user_time() + u.system_time();
        t.tv_sec() as f64 + t.tv_usec() as f64 * 1e-6
    })
}
