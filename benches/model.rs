//! Model benchmarks: compile at 200, 2,000 and 20,000 services shaped like spec/scale.md §2,
//! resolve on the hot paths, and the model's heap per service. Each figure has a baseline run
//! side by side, so `docs/performance.md` can state ratios that hold from machine to machine:
//! - compile against cloning the snapshot (the least any compiler of that input must touch);
//! - resolve against one `HashMap<String, _>` lookup of the same authority string.
//!
//! Run: `cargo bench --bench model`. The heap figures print once, before the timings.
#![allow(clippy::print_stdout, missing_docs)] // A benchmark harness reports on stdout.

use std::collections::HashMap;
use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

use aether::model::names::{AuthorityInput, HttpVersion};
use aether::model::{NodeContext, compile, synth};
use aether::resolve::decision::{Caller, CaptureMode, HttpEntry, RequestFacts};
use aether::resolve::{classify_connection, resolve_request};

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;

/// Counts live heap bytes, to measure what a compiled model keeps.
#[global_allocator]
static ALLOC: counting_alloc::Counting = counting_alloc::Counting;

const SIZES: [u32; 3] = [200, 2_000, 20_000];

fn heap_per_service() {
    let ctx = NodeContext::default();
    for n in SIZES {
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
    }
}

fn bench_compile(c: &mut Criterion) {
    heap_per_service();
    let ctx = NodeContext::default();
    let mut g = c.benchmark_group("compile");
    g.sample_size(10);
    for n in SIZES {
        let snapshot = synth::scaled(n);
        g.bench_with_input(BenchmarkId::new("compile", n), &snapshot, |b, s| {
            b.iter(|| compile(black_box(s), &ctx));
        });
        g.bench_with_input(
            BenchmarkId::new("baseline-clone-snapshot", n),
            &snapshot,
            |b, s| {
                b.iter(|| black_box(s).clone());
            },
        );
    }
    g.finish();
}

fn bench_resolve(c: &mut Criterion) {
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
    let facts = |entry, hosts: &'static [&'static str]| RequestFacts {
        entry,
        authority: AuthorityInput {
            version: HttpVersion::Http11,
            absolute: None,
            h2_authority: None,
            hosts,
        },
        method: "GET",
        path_and_query: Some("/"),
        headers: &[],
        hold_expired: false,
        entropy: 7,
    };
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

criterion_group!(benches, bench_compile, bench_resolve);
criterion_main!(benches);
