//! Model benchmarks: compile at 200, 2,000 and 20,000 services shaped like spec/scale.md §2,
//! resolve on the hot paths, and the model's heap per service. Each figure has a baseline run
//! side by side, so `docs/performance.md` can state ratios that hold from machine to machine:
//! - compile against cloning the snapshot (the least any compiler of that input must touch);
//! - resolve against one `HashMap<String, _>` lookup of the same authority string.
//!
//! - a registry event (one pod's readiness flips) to a request served on the new model: the
//!   snapshot changed, the generated Services the rows call for (the registrar's
//!   `generated_services_except`, as the node's reload on Kubernetes), the retention state
//!   (`retention::advance`), `compile`, the DNS table, the swap of the published model
//!   (`ArcSwap`, as the node holds it) and one request resolved on what a reader then loads,
//!   against a full compile alone. The node's own steps around it (the Kubernetes source's copy out of its
//!   stores and `objects::snapshot`, `watch_debounce_ms`) are not in it: `benches/kube_scale.rs`
//!   measures the source's part.
//!
//! Run: `cargo bench --bench model`. The heap figures print once, before the timings.
//!
//! On a shared machine wall time swings with the neighbours' load; `AETHER_MODEL_CPU_RUNS=<n>`
//! instead prints, for each size, the median over `n` runs of the compiling thread's own CPU time
//! (`/proc/thread-self/schedstat`) and wall time for the compile, the clone baseline, the event
//! path and the file registry's completion (`registrar::complete_snapshot` on a copy of the
//! snapshot without its generated Services, the copy included) and `Model::serves_like` of two
//! models compiled apart from one snapshot (what a reload that changed nothing served adds),
//! and skips the criterion groups.
//! `AETHER_MODEL_SIZES=<n>,<n>` measures those numbers of services instead of 200, 2,000, 20,000.
#![allow(clippy::print_stdout, missing_docs)] // A benchmark harness reports on stdout.

use std::collections::HashMap;
use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

use aether::dns::DnsTable;
use aether::model::live::{Change, Live, Object, ObjectKey, keyed};
use aether::model::names::{AuthorityInput, HttpVersion};
use aether::model::registrar::{self, complete_snapshot};
use aether::model::retention;
use aether::model::snapshot::Service;
use aether::model::split::Compiled;
use aether::model::{NodeContext, compile, synth};
use aether::resolve::decision::{Caller, CaptureMode, HttpEntry, RequestDecision, RequestFacts};
use aether::resolve::{classify_connection, resolve_request};

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;

/// Counts live heap bytes, to measure what a compiled model keeps, around the allocator the daemon
/// binary runs on (jemalloc), so the timings are of the compile the node does.
#[global_allocator]
static ALLOC: counting_alloc::Counting<tikv_jemallocator::Jemalloc> =
    counting_alloc::Counting(tikv_jemallocator::Jemalloc);

/// The sizes measured: `AETHER_MODEL_SIZES=<n>,<n>...` (services), else 200, 2,000 and 20,000.
fn sizes() -> Vec<u32> {
    match std::env::var("AETHER_MODEL_SIZES") {
        Ok(v) => v
            .split(',')
            .map(|n| {
                n.trim()
                    .parse()
                    .expect("AETHER_MODEL_SIZES: numbers of services")
            })
            .collect(),
        Err(_) => vec![200, 2_000, 20_000],
    }
}

fn heap_per_service() {
    let ctx = NodeContext::default();
    for n in sizes() {
        let snapshot = synth::scaled(n);
        let before = counting_alloc::live();
        let model = compile(&snapshot, &ctx);
        let after = counting_alloc::live();
        let snap_before = counting_alloc::live();
        let copy = snapshot.clone();
        let snap_bytes = counting_alloc::live() - snap_before;
        println!(
            "heap: {n} services: model {} KiB ({} B/service); snapshot {} KiB ({} B/service); ratio {:.2}",
            (after - before) / 1024,
            (after - before) / n as isize,
            snap_bytes / 1024,
            snap_bytes / n as isize,
            (after - before) as f64 / snap_bytes as f64,
        );
        drop((model, copy));
        // The incremental compile holds each component's objects and model besides the merged
        // model (whose entries it shares).
        let before = counting_alloc::live();
        let mut kept = Compiled::default();
        let (merged, _) = kept.update(&snapshot, &ctx);
        let both = counting_alloc::live() - before;
        println!(
            "heap: {n} services: by components, kept parts and merged model {} KiB ({} B/service)",
            both / 1024,
            both / n as isize,
        );
        drop((merged, kept));
    }
}

/// `AETHER_MODEL_CPU_RUNS`, when set: the CPU-time table instead of the criterion groups.
fn cpu_runs() -> Option<usize> {
    std::env::var("AETHER_MODEL_CPU_RUNS").ok()?.parse().ok()
}

/// This thread's CPU time so far: the first field of `/proc/thread-self/schedstat`, nanoseconds
/// on a CPU (exact, where `getrusage` counts in scheduler ticks).
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("/proc/thread-self/schedstat (Linux)");
    let ns = stat
        .split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .expect("schedstat starts with the CPU time in ns");
    Duration::from_nanos(ns)
}

/// Median (CPU, wall) milliseconds per call of `f`, over `runs` runs of `reps` calls each (the
/// kernel brings a running thread's CPU time up to date at each scheduler tick, so one run
/// should last many ticks). What `f` returns is dropped after the clock stops: the node frees a
/// replaced model on another thread (`src/node/retire.rs`), so its drop is not the compile's.
fn measure<T>(runs: usize, reps: u32, mut f: impl FnMut() -> T) -> (f64, f64) {
    let (mut cpu, mut wall) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let mut out = Vec::with_capacity(reps as usize);
        let (c0, w0) = (thread_cpu(), aether::time::now());
        for _ in 0..reps {
            out.push(black_box(f()));
        }
        cpu.push((thread_cpu() - c0).as_secs_f64() * 1e3 / f64::from(reps));
        wall.push(w0.elapsed().as_secs_f64() * 1e3 / f64::from(reps));
        drop(out);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(cpu), median(wall))
}

fn cpu_table(runs: usize) {
    let ctx = NodeContext::default();
    println!("median of {runs} runs, ms of this thread's CPU [wall]");
    println!(
        "| services | compile | baseline (clone) | ratio | event to served request | the whole reload (DNS table and registrar input after the publish) | event to served, by components | file registry: complete_snapshot | serves_like of two compiles | kept model: one change to served request | kept model: built whole | kept model: a Service's ports changed, to served request | kept model: an HTTPRoute changed, to served request |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for n in sizes() {
        let snapshot = synth::scaled(n);
        let reps = (20_000 / n).max(1);
        let (cc, cw) = measure(runs, reps, || compile(&snapshot, &ctx));
        let (bc, bw) = measure(runs, reps * 4, || snapshot.clone());
        let mut event = Event::new(n);
        let (ec, ew) = measure(runs, reps, || event.run());
        let (wc, ww) = measure(runs, reps, || event.reload());
        let mut split = Event::incremental(n);
        let (sc, sw) = measure(runs, reps, || split.run());
        let mut bare = snapshot.clone();
        bare.services.retain(|s| !s.generated);
        let cidr = "10.96.0.0/12".parse().expect("a literal CIDR parses");
        let (rc, rw) = measure(runs, reps, || {
            let mut s = bare.clone();
            complete_snapshot(&mut s, cidr);
            s
        });
        // A reload that changed nothing served (issue #36 item 6): two models of one snapshot,
        // compiled apart (no table shared), compared whole.
        let (one, other) = (compile(&snapshot, &ctx), compile(&snapshot, &ctx));
        let (lc, lw) = measure(runs, reps, || assert!(one.serves_like(&other)));
        // The model kept by changes (issue #37): one row's change applied, published and a
        // request served on it; and the whole registry built from nothing (a start, a relist).
        let mut kept = Kept::new(n);
        let (kc, kw) = measure(runs, reps * 20, || kept.run());
        let objects = keyed(&snapshot);
        let (fc, fw) = measure(runs, reps, || {
            let mut live = Live::new(ctx.clone());
            live.resync(objects.iter().cloned());
            live
        });
        // A Service's and a route's change the same way (issue #37: ≤ 5 ms to the published
        // model at 20,000 services).
        let mut service = KeptChange::new(
            n,
            |o| matches!(o, Object::Service(v) if v.name == "svc-5"),
            |o| match o {
                Object::Service(v) => {
                    let mut v = v.clone();
                    if let Some(first) = v.ports.first() {
                        let mut extra = first.clone();
                        extra.name = Some("extra".into());
                        extra.port = 65000;
                        v.ports.push(extra);
                    }
                    Object::Service(v)
                }
                other => other.clone(),
            },
        );
        let (vc, vw) = measure(runs, reps * 20, || service.run());
        let mut route = KeptChange::new(
            n,
            |o| matches!(o, Object::HttpRoute(r) if r.name == "svc-5-route"),
            |o| match o {
                Object::HttpRoute(r) => {
                    let mut r = r.clone();
                    r.generation += 1;
                    r.rules.reverse();
                    Object::HttpRoute(r)
                }
                other => other.clone(),
            },
        );
        let (hc, hw) = measure(runs, reps * 20, || route.run());
        println!(
            "| {n} | {cc:.2} [{cw:.2}] | {bc:.2} [{bw:.2}] | {:.1}× | {ec:.2} [{ew:.2}] | {wc:.2} [{ww:.2}] | {sc:.2} [{sw:.2}] | {rc:.2} [{rw:.2}] | {lc:.2} [{lw:.2}] | {kc:.3} [{kw:.3}] | {fc:.2} [{fw:.2}] | {vc:.3} [{vw:.3}] | {hc:.3} [{hw:.3}] |",
            cc / bc
        );
    }
}

fn bench_compile(c: &mut Criterion) {
    if let Some(runs) = cpu_runs() {
        counting_alloc::stop();
        cpu_table(runs);
        return;
    }
    heap_per_service();
    counting_alloc::stop();
    let ctx = NodeContext::default();
    let mut g = c.benchmark_group("compile");
    g.sample_size(10);
    for n in sizes() {
        let snapshot = synth::scaled(n);
        g.bench_with_input(BenchmarkId::new("compile", n), &snapshot, |b, s| {
            b.iter_with_large_drop(|| compile(black_box(s), &ctx));
        });
        g.bench_with_input(
            BenchmarkId::new("baseline-clone-snapshot", n),
            &snapshot,
            |b, s| {
                b.iter_with_large_drop(|| black_box(s).clone());
            },
        );
    }
    g.finish();
}

/// The header map of a request with no other field than its `Host` (which the facts carry).
static NO_HEADERS: std::sync::LazyLock<http::HeaderMap> =
    std::sync::LazyLock::new(http::HeaderMap::new);

/// An HTTP/1.1 `GET /` whose `Host` is each of `hosts`, as the data plane asks (unexplained).
fn get<'a>(entry: HttpEntry, hosts: &'a [&'a str]) -> RequestFacts<'a> {
    RequestFacts {
        entry,
        authority: AuthorityInput {
            version: HttpVersion::Http11,
            absolute: None,
            h2_authority: None,
            hosts,
        },
        method: "GET",
        path_and_query: Some("/"),
        headers: &NO_HEADERS,
        hold_expired: false,
        entropy: 7,
        explain: false,
    }
}

fn bench_resolve(c: &mut Criterion) {
    if cpu_runs().is_some() {
        return;
    }
    let ctx = NodeContext::default();
    let n = 20_000;
    let snapshot = synth::scaled(n);
    let model = compile(&snapshot, &ctx);
    let caller = Caller {
        namespace: Some("ns-0".into()),
        pod: None,
        service_account: None,
        capture: CaptureMode::RedirectAll,
    };
    // svc-1 is in ns-1 with HTTP on 8080 and 9090; svc-0 has raw TCP on 9000.
    let vip1 = model.mesh_vips("ns-1", "svc-1")[0];
    let vip0 = model.mesh_vips("ns-0", "svc-0")[0];
    let deliver_host = ["svc-1.ns-1.aether.internal:8080"];
    let mismatch_host = ["svc-1.ns-1.aether.internal:9090"];
    let facts = |entry, hosts: &'static [&'static str]| get(entry, hosts);
    let captured = HttpEntry::Captured {
        dialled: SocketAddr::new(vip1, 8080),
    };
    let deliver_host: &'static [&'static str] = Box::leak(Box::new(deliver_host));
    let mismatch_host: &'static [&'static str] = Box::leak(Box::new(mismatch_host));
    let mut g = c.benchmark_group("resolve-20000");
    g.bench_function("captured-deliver", |b| {
        b.iter(|| resolve_request(&model, &caller, black_box(&facts(captured, deliver_host))));
    });
    g.bench_function("captured-port-mismatch", |b| {
        b.iter(|| resolve_request(&model, &caller, black_box(&facts(captured, mismatch_host))));
    });
    g.bench_function("loopback-deliver", |b| {
        b.iter(|| {
            resolve_request(
                &model,
                &caller,
                black_box(&facts(HttpEntry::Loopback, deliver_host)),
            )
        });
    });
    g.bench_function("classify-raw-tcp", |b| {
        b.iter(|| classify_connection(&model, &caller, black_box(SocketAddr::new(vip0, 9000))));
    });
    let table: HashMap<String, u32> = (0..n)
        .map(|i| (format!("svc-{i}.ns-{}.aether.internal:8080", i % 20), i))
        .collect();
    g.bench_function("baseline-hashmap-lookup", |b| {
        b.iter(|| table.get(black_box(deliver_host[0])));
    });
    g.finish();
}

/// One registry event to a request served on the new model: pod `svc-1-0` (the first pod of
/// `svc-1` in `ns-1`) flips between Ready and not Ready, so `svc-1`'s endpoints change and every
/// run publishes a model that differs from the one before.
struct Event {
    ctx: NodeContext,
    snapshot: aether::model::Snapshot,
    row: usize,
    published: ArcSwap<aether::model::Model>,
    caller: Caller,
    /// The kept parts, when the event compiles incrementally (`model::split::Compiled`).
    kept: Option<Compiled>,
    /// The generated Services of the registry (one per mesh service).
    generated: usize,
}

impl Event {
    fn new(n: u32) -> Self {
        Self::with(n, false)
    }

    /// The event compiled by [`Compiled::update`] instead of `compile`: only the component of
    /// the changed pod is compiled, the other parts are reused and merged.
    fn incremental(n: u32) -> Self {
        Self::with(n, true)
    }

    fn with(n: u32, incremental: bool) -> Self {
        let ctx = NodeContext::default();
        let snapshot = synth::scaled(n);
        let row = snapshot
            .rows
            .iter()
            .position(|r| r.pod.as_deref() == Some("svc-1-0"))
            .expect("the scaled registry has svc-1-0");
        let mut kept = incremental.then(Compiled::default);
        let first = match &mut kept {
            Some(k) => k.update(&snapshot, &ctx).0,
            None => compile(&snapshot, &ctx),
        };
        let published = ArcSwap::from_pointee(first);
        let caller = Caller {
            namespace: Some("ns-0".into()),
            pod: None,
            service_account: None,
            capture: CaptureMode::RedirectAll,
        };
        let generated = snapshot.services.iter().filter(|s| s.generated).count();
        Self {
            ctx,
            snapshot,
            row,
            published,
            caller,
            kept,
            generated,
        }
    }

    /// The event, the new model published, and one request to `svc-1` resolved on it: two
    /// endpoints when the pod is Ready, one when it is not. As the node's reload: the retention
    /// state from the published model, the compile, the publish; what the node makes after the
    /// publish (the DNS table, the registrar's input) is [`Event::follow`]. Returns the replaced
    /// model, for the caller to drop outside the timing (the node frees it on another thread).
    fn run(&mut self) -> Arc<aether::model::Model> {
        let r = Arc::make_mut(&mut self.snapshot.rows[self.row]);
        r.ready = !r.ready;
        let ready = r.ready;
        let retained = retention::advance(
            &self.published.load().http_ports(),
            &self.snapshot.retained,
            &self.snapshot,
            self.ctx.now_ms,
        );
        assert!(retained.is_empty(), "no service vanished");
        let model = match &mut self.kept {
            Some(k) => {
                let (model, stats) = k.update(&self.snapshot, &self.ctx);
                assert_eq!(stats.compiled, 1, "one component changed");
                model
            }
            None => compile(&self.snapshot, &self.ctx),
        };
        let replaced = self.published.swap(Arc::new(model));
        served(&self.published, &self.caller, ready);
        replaced
    }

    /// What the node makes once the new model serves (`node::follow`): the DNS table, and on
    /// Kubernetes the generated Services the rows call for, which the elected registrar writes.
    /// Returned for the caller to drop outside the timing.
    fn follow(&self) -> (DnsTable, Vec<Service>) {
        let (desired, _) =
            registrar::generated_services_except(&self.snapshot, &self.ctx.ignored_namespaces);
        assert_eq!(desired.len(), self.generated, "one per mesh service");
        let dns = DnsTable::build(&self.snapshot, &self.ctx.domains, true);
        (dns, desired)
    }

    /// The whole reload: the event to a served request, then what follows it.
    fn reload(&mut self) -> (Arc<aether::model::Model>, DnsTable, Vec<Service>) {
        let replaced = self.run();
        let (dns, desired) = self.follow();
        (replaced, dns, desired)
    }
}

/// The kept model of `objects`, its model published, and the caller of the requests served on
/// it.
fn kept_and_published(objects: Vec<Change>) -> (Live, ArcSwap<aether::model::Model>, Caller) {
    let mut live = Live::new(NodeContext::default());
    live.resync(objects);
    let published = ArcSwap::from_pointee(live.model().clone());
    let caller = Caller {
        namespace: Some("ns-0".into()),
        pod: None,
        service_account: None,
        capture: CaptureMode::RedirectAll,
    };
    (live, published, caller)
}

/// One row's readiness flipped through the model kept by changes ([`Live`]), the model
/// published and a request served on it: what a source that sends changes costs the node.
struct Kept {
    live: Live,
    key: ObjectKey,
    row: Arc<aether::model::snapshot::Row>,
    published: ArcSwap<aether::model::Model>,
    caller: Caller,
}

impl Kept {
    fn new(n: u32) -> Self {
        let snapshot = synth::scaled(n);
        let objects = keyed(&snapshot);
        let (key, row) = objects
            .iter()
            .find_map(|c| match &c.object {
                Some(Object::Row(r)) if r.pod.as_deref() == Some("svc-1-0") => {
                    Some((c.key.clone(), r.clone()))
                }
                _ => None,
            })
            .expect("the scaled registry has svc-1-0");
        let (live, published, caller) = kept_and_published(objects);
        Self {
            live,
            key,
            row,
            published,
            caller,
        }
    }

    fn run(&mut self) -> Arc<aether::model::Model> {
        let r = Arc::make_mut(&mut self.row);
        r.ready = !r.ready;
        let ready = r.ready;
        let applied = self.live.apply([Change {
            key: self.key.clone(),
            object: Some(Object::Row(self.row.clone())),
        }]);
        assert_eq!(applied.compiled, 1, "one component changed");
        let replaced = self.published.swap(Arc::new(self.live.model().clone()));
        served(&self.published, &self.caller, ready);
        replaced
    }
}

/// One object other than a row changed through the model kept by changes ([`Live`]) and back
/// again, one step a run: the model published and a request served on it.
struct KeptChange {
    live: Live,
    key: ObjectKey,
    /// The object as the registry has it, and changed.
    both: [Object; 2],
    changed: bool,
    published: ArcSwap<aether::model::Model>,
    caller: Caller,
}

impl KeptChange {
    /// The first object of the scaled registry of `n` services that `pick` takes, changed by
    /// `change`.
    fn new(n: u32, pick: impl Fn(&Object) -> bool, change: impl Fn(&Object) -> Object) -> Self {
        let objects = keyed(&synth::scaled(n));
        let (key, object) = objects
            .iter()
            .find_map(|c| {
                let o = c.object.as_ref()?;
                pick(o).then(|| (c.key.clone(), o.clone()))
            })
            .expect("the scaled registry holds the object picked");
        let changed = change(&object);
        assert_ne!(changed, object, "the change changes it");
        let (live, published, caller) = kept_and_published(objects);
        Self {
            live,
            key,
            both: [object, changed],
            changed: false,
            published,
            caller,
        }
    }

    fn run(&mut self) -> Arc<aether::model::Model> {
        self.changed = !self.changed;
        let object = self.both[usize::from(self.changed)].clone();
        let applied = self.live.apply([Change {
            key: self.key.clone(),
            object: Some(object),
        }]);
        assert!(applied.compiled >= 1, "its component compiled again");
        let replaced = self.published.swap(Arc::new(self.live.model().clone()));
        served(&self.published, &self.caller, true);
        replaced
    }
}

/// One request to `svc-1` resolved on the published model: two endpoints when its pod is
/// Ready, one when it is not.
fn served(published: &ArcSwap<aether::model::Model>, caller: &Caller, ready: bool) {
    let model = published.load();
    let facts = get(HttpEntry::Loopback, &["svc-1.ns-1.aether.internal:8080"]);
    match resolve_request(&model, caller, black_box(&facts)) {
        RequestDecision::Deliver(d) => {
            assert_eq!(d.backend.endpoints.len(), if ready { 2 } else { 1 });
        }
        other => panic!("svc-1:8080 is not delivered: {other:?}"),
    }
}

fn bench_event(c: &mut Criterion) {
    if cpu_runs().is_some() {
        return;
    }
    let mut g = c.benchmark_group("event");
    g.sample_size(10);
    for n in [2_000, 20_000] {
        let mut event = Event::new(n);
        g.bench_function(BenchmarkId::new("pod-ready-to-served-request", n), |b| {
            b.iter_with_large_drop(|| event.run());
        });
        g.bench_function(BenchmarkId::new("pod-ready-whole-reload", n), |b| {
            b.iter_with_large_drop(|| event.reload());
        });
        let mut split = Event::incremental(n);
        g.bench_function(
            BenchmarkId::new("pod-ready-to-served-request-by-components", n),
            |b| {
                b.iter_with_large_drop(|| split.run());
            },
        );
        let mut kept = Kept::new(n);
        g.bench_function(
            BenchmarkId::new("pod-ready-to-served-request-kept-model", n),
            |b| {
                b.iter_with_large_drop(|| kept.run());
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench_compile, bench_resolve, bench_event);
criterion_main!(benches);
