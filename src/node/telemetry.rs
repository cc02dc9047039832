//! The control side's metrics that are read when `/metrics` is scraped, not counted as they
//! happen (issue #10 §1): the Kubernetes source's watches, the process and the tokio runtime.
//!
//! Glue of the daemon (IO: it reads `/proc/self`). Nothing here is on the request path: each
//! value is read from the state that already exists (the watches' atomics, the runtime's own
//! counters, the kernel's view of the process) at scrape time, so keeping them costs nothing
//! between scrapes. Every label set is bounded: the watched kinds, the runtime's workers.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use crate::registry::kube::watch::KindState;

/// What the collector reads at each scrape.
#[derive(Debug, Default)]
pub struct ControlCollector {
    /// The Kubernetes source's watches (none on the file registry).
    pub kinds: Vec<Arc<KindState>>,
    /// The daemon's runtime, for its worker metrics (`None` outside one).
    pub runtime: Option<tokio::runtime::Handle>,
    /// The workload certificates this node has issued.
    pub identities: Option<Arc<crate::identity::Identities>>,
}

impl Collector for ControlCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        self.encode_watches(&mut encoder)?;
        if let Some(process) = Process::read() {
            process.encode(&mut encoder)?;
        }
        if let Some(runtime) = &self.runtime {
            encode_runtime(runtime, &mut encoder)?;
        }
        if let Some(identities) = &self.identities {
            encode_certificates(identities, &mut encoder)?;
        }
        Ok(())
    }
}

/// One metric per kind, `kind` its one label.
fn per_kind<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    kinds: &[Arc<KindState>],
    value: impl Fn(&KindState) -> M,
) -> Result<(), fmt::Error> {
    let Some(first) = kinds.first() else {
        return Ok(());
    };
    let mut family = encoder.encode_descriptor(name, help, unit, value(first).metric_type())?;
    for k in kinds {
        let labels = [("kind", k.kind)];
        value(k).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl ControlCollector {
    fn encode_watches(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let kinds = &self.kinds;
        per_kind(
            e,
            "aether_registry_watch_synced",
            "1 once the kind's watch has had its first complete list (its store stays in force after), else 0",
            None,
            kinds,
            |k| ConstGauge::new(i64::from(k.is_synced())),
        )?;
        per_kind(
            e,
            "aether_registry_watch_forbidden",
            "1 while the API server refuses to let the daemon list or watch the kind (403), until it answers one again",
            None,
            kinds,
            |k| ConstGauge::new(i64::from(k.is_forbidden())),
        )?;
        per_kind(
            e,
            "aether_registry_watch_recoveries",
            "Refusals (403) of the kind that ended by themselves: a list or watch of it was answered again",
            None,
            kinds,
            |k| ConstCounter::new(k.recoveries.load(Ordering::Relaxed)),
        )?;
        per_kind(
            e,
            "aether_registry_watch_errors",
            "Errors of the kind's watch (each retried; the last model stays)",
            None,
            kinds,
            |k| ConstCounter::new(k.errors.load(Ordering::Relaxed)),
        )?;
        per_kind(
            e,
            "aether_registry_watch_short",
            "Watches of the kind that ended at once with nothing in them; each makes the next wait longer",
            None,
            kinds,
            |k| ConstCounter::new(k.short_watches.load(Ordering::Relaxed)),
        )?;
        per_kind(
            e,
            "aether_registry_watch_streaming_fallbacks",
            "Streaming lists of the kind the API server refused (422), after which it is read with paged lists",
            None,
            kinds,
            |k| ConstCounter::new(k.streaming_fallbacks.load(Ordering::Relaxed)),
        )?;
        per_kind(
            e,
            "aether_registry_watch_relists",
            "Complete lists of the kind after its first (410 Gone, a broken watch)",
            None,
            kinds,
            |k| ConstCounter::new(k.relists.load(Ordering::Relaxed)),
        )?;
        per_kind(
            e,
            "aether_registry_watch_events",
            "Objects of the kind the watch applied or deleted (each a change the next publish takes)",
            None,
            kinds,
            |k| ConstCounter::new(k.events.load(Ordering::Relaxed)),
        )?;
        per_kind(
            e,
            "aether_registry_watch_last_event_timestamp",
            "When the kind's watch last brought a change or a list, Unix time (0: never)",
            Some(&Unit::Seconds),
            kinds,
            |k| ConstGauge::new(k.last_event_ms.load(Ordering::Relaxed) as f64 / 1000.0),
        )
    }
}

/// The process as the kernel sees it (`/proc/self`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Process {
    resident_bytes: u64,
    virtual_bytes: u64,
    threads: u64,
    open_fds: u64,
    max_fds: u64,
    cpu_seconds: f64,
    start_time_seconds: f64,
}

impl Process {
    /// Read it; `None` where `/proc` cannot be read (the metrics are then left out).
    fn read() -> Option<Self> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        let (max_fds, _) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok()?;
        let kib = |key: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(key))?;
            line[key.len()..].split_whitespace().next()?.parse().ok()
        };
        let ticks = rustix::param::clock_ticks_per_second() as f64;
        let (cpu_ticks, start_ticks) = stat_times(&stat)?;
        let btime: f64 = boot
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        Some(Self {
            resident_bytes: kib("VmRSS:")? * 1024,
            virtual_bytes: kib("VmSize:")? * 1024,
            threads: kib("Threads:")?,
            open_fds,
            max_fds,
            cpu_seconds: cpu_ticks as f64 / ticks,
            start_time_seconds: btime + start_ticks as f64 / ticks,
        })
    }

    fn encode(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let gauges: [(&str, &str, Option<&Unit>, f64); 6] = [
            (
                "process_resident_memory",
                "Resident memory of the daemon",
                Some(&Unit::Bytes),
                self.resident_bytes as f64,
            ),
            (
                "process_virtual_memory",
                "Virtual memory of the daemon",
                Some(&Unit::Bytes),
                self.virtual_bytes as f64,
            ),
            (
                "process_open_fds",
                "File descriptors open",
                None,
                self.open_fds as f64,
            ),
            (
                "process_max_fds",
                "The descriptor limit (RLIMIT_NOFILE, soft)",
                None,
                self.max_fds as f64,
            ),
            (
                "process_threads",
                "Threads of the daemon",
                None,
                self.threads as f64,
            ),
            (
                "process_start_time",
                "When the daemon started, Unix time",
                Some(&Unit::Seconds),
                self.start_time_seconds,
            ),
        ];
        for (name, help, unit, value) in gauges {
            let g = ConstGauge::new(value);
            g.encode(e.encode_descriptor(name, help, unit, MetricType::Gauge)?)?;
        }
        let cpu = ConstCounter::new(self.cpu_seconds);
        cpu.encode(e.encode_descriptor(
            "process_cpu",
            "CPU time of the daemon, user and system",
            Some(&Unit::Seconds),
            MetricType::Counter,
        )?)
    }
}

/// `utime + stime` and `starttime` of `/proc/self/stat`, in clock ticks. The fields are counted
/// after the command's closing parenthesis, which may itself hold spaces and parentheses.
fn stat_times(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After `)`: state is field 3; utime 14, stime 15, starttime 22 (proc(5)).
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some((field(14)? + field(15)?, field(22)?))
}

fn encode_runtime(
    runtime: &tokio::runtime::Handle,
    e: &mut DescriptorEncoder<'_>,
) -> Result<(), fmt::Error> {
    let m = runtime.metrics();
    let gauges = [
        (
            "aether_runtime_workers",
            "Worker threads of the daemon's tokio runtime",
            m.num_workers(),
        ),
        (
            "aether_runtime_alive_tasks",
            "Tasks alive in the runtime (connections, listeners, timers)",
            m.num_alive_tasks(),
        ),
        (
            "aether_runtime_global_queue_depth",
            "Tasks waiting in the runtime's global queue",
            m.global_queue_depth(),
        ),
    ];
    for (name, help, value) in gauges {
        let g = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
        g.encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
    }
    let mut busy = e.encode_descriptor(
        "aether_runtime_worker_busy",
        "Time each worker thread spent running tasks",
        Some(&Unit::Seconds),
        MetricType::Counter,
    )?;
    for worker in 0..m.num_workers() {
        let label = worker.to_string();
        let labels = [("worker", label.as_str())];
        let c = ConstCounter::new(m.worker_total_busy_duration(worker).as_secs_f64());
        c.encode(busy.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A time of a workload certificate.
type CertTime = fn(&crate::identity::WorkloadCert) -> std::time::SystemTime;

/// Each workload certificate's expiry and planned rotation, by identity (namespace and
/// ServiceAccount: bounded by the identities of this node's pods and their peers).
fn encode_certificates(
    identities: &crate::identity::Identities,
    e: &mut DescriptorEncoder<'_>,
) -> Result<(), fmt::Error> {
    let certs = identities.certificates();
    if certs.is_empty() {
        return Ok(());
    }
    let unix = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    let times: [(&str, &str, CertTime); 2] = [
        (
            "aether_workload_cert_expiry_timestamp",
            "When the workload certificate of an identity expires (notAfter), Unix time",
            |c| c.not_after,
        ),
        (
            "aether_workload_cert_rotation_timestamp",
            "When the workload certificate of an identity is re-issued (half its life), Unix time",
            crate::identity::WorkloadCert::rotate_at,
        ),
    ];
    for (name, help, time) in times {
        let mut family =
            e.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Gauge)?;
        for ((namespace, service_account), cert) in &certs {
            let labels = [
                ("namespace", namespace.as_str()),
                ("service_account", service_account.as_str()),
            ];
            ConstGauge::new(unix(time(cert))).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_line_is_read_after_the_last_parenthesis() {
        // A command name with a space and a parenthesis of its own.
        let line = "4242 (aeth) er) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 9 0 12345 \
                    1000000 2000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(stat_times(line), Some((300, 12345)));
        assert_eq!(stat_times("no parenthesis"), None);
        assert_eq!(stat_times("1 (x) S 1"), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scrape_has_the_process_the_runtime_and_each_watched_kind() {
        let pods = Arc::new(KindState::new("Pod"));
        pods.synced.store(true, Ordering::Release);
        pods.errors.store(3, Ordering::Relaxed);
        pods.last_event_ms
            .store(1_700_000_000_500, Ordering::Relaxed);
        // Listed, then refused (403) once, and now again: still listed, forbidden.
        pods.forbidden.store(true, Ordering::Release);
        pods.recoveries.store(1, Ordering::Relaxed);
        let routes = Arc::new(KindState::new("HTTPRoute"));
        let now = crate::time::wall();
        let ca = Arc::new(crate::identity::Ca::generate(now).unwrap());
        let identities = Arc::new(
            crate::identity::Identities::new(ca, crate::identity::IdentitySettings::default())
                .unwrap(),
        );
        let cert = identities.certificate("shop", "web", now).unwrap();
        let collector = ControlCollector {
            kinds: vec![pods, routes],
            runtime: Some(tokio::runtime::Handle::current()),
            identities: Some(identities),
        };
        // Some CPU time of this process's own, so its counter cannot read 0 (10 ms ticks).
        let spin = crate::time::now();
        while spin.elapsed() < std::time::Duration::from_millis(50) {
            std::hint::black_box(spin.elapsed());
        }
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(collector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "aether_registry_watch_synced{kind=\"Pod\"} 1",
            "aether_registry_watch_synced{kind=\"HTTPRoute\"} 0",
            "aether_registry_watch_forbidden{kind=\"Pod\"} 1",
            "aether_registry_watch_forbidden{kind=\"HTTPRoute\"} 0",
            "aether_registry_watch_recoveries_total{kind=\"Pod\"} 1",
            "aether_registry_watch_errors_total{kind=\"Pod\"} 3",
            "aether_registry_watch_relists_total{kind=\"HTTPRoute\"} 0",
            "aether_registry_watch_last_event_timestamp_seconds{kind=\"Pod\"} 1700000000.5",
            "aether_runtime_workers 2",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        let value = |name: &str| -> f64 {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in\n{text}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        // This test's own process: some memory, some descriptors, started before now.
        assert!(value("process_resident_memory_bytes") > 1e6);
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        assert!(value("process_threads") >= 3.0);
        let now = crate::time::wall_ms() as f64 / 1000.0;
        let started = value("process_start_time_seconds");
        assert!(
            started <= now + 1.0 && started > now - 86_400.0 * 30.0,
            "{started}"
        );
        assert!(value("process_cpu_seconds_total") > 0.0);
        assert!(
            text.lines()
                .any(|l| l.starts_with("aether_runtime_worker_busy_seconds_total{worker=\"1\"}")),
            "{text}"
        );
        let unix = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64()
        };
        let identity = "{namespace=\"shop\",service_account=\"web\"}";
        assert_eq!(
            value(&format!(
                "aether_workload_cert_expiry_timestamp_seconds{identity}"
            )),
            unix(cert.not_after)
        );
        assert_eq!(
            value(&format!(
                "aether_workload_cert_rotation_timestamp_seconds{identity}"
            )),
            unix(cert.rotate_at())
        );
    }
}
