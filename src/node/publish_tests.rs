//! The publisher in-process, on a paused clock (issue #37 item 4): coalescing, a resync, a
//! change during a publish, an object the compiler refuses and a load that fails. The feed is
//! scripted: the sources' own feeds are proven against their stores elsewhere
//! (`kube_feed_tests`, `model::proptests`); here the question is what the publisher makes of
//! what a feed gives, and when.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::mpsc;

use super::pace::Edge;
use super::publish::{Feed, Outcome, Outputs, Publication, Publisher};
use super::{Loaded, NodeConfig, NodeError, Read, context};
use crate::dns::table::{DnsTable, Lookup, QueryKind};
use crate::model::live::{Change, Kind, Live, Object, keyed};
use crate::model::snapshot::{RetainedPort, Row, Service};
use crate::model::{Model, Snapshot};
use crate::node::stats::NodeStats;
use crate::state::ModelHandle;

/// What the scripted source holds for its next load.
#[derive(Default)]
struct Script {
    /// Changes since the last load.
    pending: Vec<Change>,
    /// Everything, at the next load (a relist).
    resync: Option<Vec<Change>>,
    /// The next load fails so.
    fail: bool,
    /// Loads so far.
    loads: u64,
}

/// A source whose changes the test writes; a load can be held at a gate, after it took its
/// changes and before it compiles them (a publish under way).
struct Scripted {
    script: parking_lot::Mutex<Script>,
    /// Whether a load gives the snapshot it read (the file and etcd sources), or none (the
    /// Kubernetes feed: the publish's snapshot is made from the kept model when asked).
    whole: bool,
    /// Set: the next load says so on `entered` and waits for the gate to open.
    /// (A blocking wait in the test would hold the paused clock still: `entered` is awaited.)
    gate: parking_lot::Mutex<
        Option<(
            tokio::sync::oneshot::Sender<()>,
            std::sync::mpsc::Receiver<()>,
        )>,
    >,
}

impl Feed for Scripted {
    fn load(
        &self,
        config: &NodeConfig,
        kept: &parking_lot::Mutex<Live>,
        stats: &NodeStats,
        _previous: Option<(&Model, &[RetainedPort])>,
    ) -> Result<Loaded, NodeError> {
        let (changes, resync, fail, loads) = {
            let mut s = self.script.lock();
            s.loads += 1;
            (
                std::mem::take(&mut s.pending),
                s.resync.take(),
                std::mem::take(&mut s.fail),
                s.loads,
            )
        };
        if let Some((entered, gate)) = self.gate.lock().take() {
            let _ = entered.send(());
            let _ = gate.recv();
        }
        if fail {
            return Err(NodeError::Registry {
                path: "/scripted".into(),
                source: crate::registry::file::FileError::ReadDir {
                    path: "/scripted".into(),
                    source: std::io::Error::other("the scripted source fails this load"),
                },
            });
        }
        let mut kept = kept.lock();
        kept.set_context(context(config));
        let applied = match resync {
            Some(all) => kept.resync(all),
            None => kept.apply(changes),
        };
        let model = kept.model().clone();
        stats.record_compile(kept.count(Kind::Row), &model, &applied, Duration::ZERO);
        Ok(Loaded {
            model,
            applied,
            version: kept.version(),
            retained: Vec::new(),
            snapshot: self.whole.then(|| kept.snapshot()),
            read: Read::File { fingerprint: loads },
            etcd_revision: None,
            writers_read_changed: true,
        })
    }

    fn edge(&self) -> Edge {
        Edge::Leading
    }
}

const WINDOW: Duration = Duration::from_millis(20);

/// A publisher of a scripted source over the `mp` example registry, published once.
struct Bench {
    feed: Arc<Scripted>,
    publisher: Publisher<Scripted>,
    handle: Arc<ModelHandle>,
    dns: Arc<ArcSwap<DnsTable>>,
    stats: Arc<NodeStats>,
    notices: mpsc::Sender<()>,
    changed: mpsc::Receiver<()>,
    kept: Arc<parking_lot::Mutex<Live>>,
}

fn config() -> NodeConfig {
    NodeConfig {
        node_name: "node-a".into(),
        publish_coalesce_ms: u64::try_from(WINDOW.as_millis()).unwrap_or(u64::MAX),
        ..NodeConfig::default()
    }
}

fn fixture() -> Snapshot {
    crate::test_util::mp_fixture()
}

impl Bench {
    async fn new() -> Self {
        Self::reading(true).await
    }

    /// A bench whose loads give their snapshot (`whole`) or not.
    async fn reading(whole: bool) -> Self {
        let config = config();
        let first = fixture();
        let feed = Arc::new(Scripted {
            script: parking_lot::Mutex::new(Script {
                resync: Some(keyed(&first)),
                ..Script::default()
            }),
            whole,
            gate: parking_lot::Mutex::new(None),
        });
        let kept = Arc::new(parking_lot::Mutex::new(Live::new(context(&config))));
        let handle = Arc::new(ModelHandle::new(crate::model::compile(
            &Snapshot::default(),
            &context(&config),
        )));
        let dns = Arc::new(ArcSwap::from_pointee(DnsTable::default()));
        let stats = Arc::new(NodeStats::default());
        let publisher = Publisher::new(
            feed.clone(),
            config,
            kept.clone(),
            stats.clone(),
            Outputs {
                handle: handle.clone(),
                metrics: Arc::default(),
                dns: dns.clone(),
                writers: None,
                kube_writes: Arc::default(),
            },
            Vec::new(),
        );
        let (notices, changed) = mpsc::channel(1);
        let mut bench = Self {
            feed,
            publisher,
            handle,
            dns,
            stats,
            notices,
            changed,
            kept,
        };
        let first = bench.change(Vec::new()).await;
        assert!(first.applied.full, "the first load is a resync");
        bench
    }

    /// `changes` given to the source, with its notice; then the next publish.
    async fn change(&mut self, changes: Vec<Change>) -> Publication {
        self.give(changes);
        self.next().await
    }

    /// `changes` given to the source, and its notice sent (a source's notices never queue:
    /// one pending is enough).
    fn give(&self, changes: Vec<Change>) {
        self.feed.script.lock().pending.extend(changes);
        let _ = self.notices.try_send(());
    }

    /// The next publish, a notice taken.
    async fn next(&mut self) -> Publication {
        tokio::time::timeout(Duration::from_secs(60), self.changed.recv())
            .await
            .expect("a notice is pending")
            .expect("the bench holds a sender");
        match self.publisher.publish(&mut self.changed).await {
            Outcome::Published(p) => p,
            other => panic!("expected a publish, got {other:?}"),
        }
    }

    fn model(&self) -> Arc<Model> {
        self.handle.load()
    }

    fn resolves(&self, name: &str) -> Option<Vec<IpAddr>> {
        match self.dns.load().lookup(name, QueryKind::A) {
            Lookup::Records(ips) => Some(ips),
            _ => None,
        }
    }

    fn exposition(&self) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        self.stats.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)
            .expect("the node's metrics encode");
        text
    }

    fn publishes(&self, outcome: &'static str) -> u64 {
        self.stats
            .model_publishes
            .get_or_create(&[("outcome", outcome)])
            .get()
    }
}

/// A mesh service `mp/<name>` of one ready pod at `pod_ip`, port 8080 HTTP, with its generated
/// Service at `vip`: the `mp-httponly` example's, renamed.
fn service(name: &str, pod_ip: &str, vip: &str) -> Vec<Change> {
    let base = fixture();
    let row = base
        .rows
        .iter()
        .find(|r| r.namespace == "mp" && r.service == "mp-httponly")
        .expect("the mp example has mp-httponly's rows");
    let svc = base
        .services
        .iter()
        .find(|s| s.namespace == "mp" && s.name == "mp-httponly" && s.generated)
        .expect("the mp example has mp-httponly's generated Service");
    let address: IpAddr = pod_ip.parse().expect("a test address");
    let row = Row {
        service: name.to_owned(),
        address,
        pod: Some(format!("{name}-0")),
        ..(**row).clone()
    };
    let svc = Service {
        name: name.to_owned(),
        cluster_ips: vec![vip.parse().expect("a test address")],
        ..svc.clone()
    };
    vec![
        Change::put(format!("mp/{name}@{address}"), Object::Row(Arc::new(row))),
        Change::put(format!("mp/{name}"), Object::Service(Box::new(svc))),
    ]
}

fn fqdn(name: &str) -> String {
    format!("{name}.mp.aether.internal")
}

#[tokio::test(start_paused = true)]
async fn a_change_after_a_quiet_spell_is_published_at_once_and_changes_in_the_window_together() {
    let mut bench = Bench::new().await;
    let generation = bench.handle.generation();
    // Quiet since the first load, a window ago and more.
    tokio::time::sleep(WINDOW * 2).await;
    let a = bench
        .change(service("svc-a", "10.9.0.1", "10.96.9.1"))
        .await;
    assert_eq!(a.delay, Duration::ZERO, "after a quiet spell: at once");
    assert_eq!(a.generation, generation + 1);
    assert_eq!(a.applied.changes, 2);
    assert!(!a.applied.full, "one service's change is compiled alone");
    assert!(
        bench.model().classes("mp", "svc-a").is_some(),
        "svc-a is served"
    );
    assert_eq!(
        bench.resolves(&fqdn("svc-a")),
        Some(vec!["10.96.9.1".parse().unwrap()])
    );

    // Two more, one right after the other: the second notice finds the first pending, and one
    // publish takes both, a window after the last began.
    bench.give(service("svc-b", "10.9.0.2", "10.96.9.2"));
    bench.give(service("svc-c", "10.9.0.3", "10.96.9.3"));
    let loads = bench.feed.script.lock().loads;
    let bc = bench.next().await;
    assert_eq!(bc.delay, WINDOW, "coalesced for the window, no longer");
    assert_eq!(
        bc.applied.changes, 4,
        "both services' changes in one publish"
    );
    assert_eq!(bc.generation, generation + 2);
    assert_eq!(bench.feed.script.lock().loads, loads + 1, "one load");
    for name in ["svc-b", "svc-c"] {
        assert!(
            bench.model().classes("mp", name).is_some(),
            "{name} is served"
        );
        assert!(bench.resolves(&fqdn(name)).is_some(), "{name} resolves");
    }
    assert_eq!(bench.publishes("published"), 3);
    // As `/metrics` (and `aether debug stats aether_model_publish`) shows them.
    let exposition = bench.exposition();
    for line in [
        "aether_model_publishes_total{outcome=\"published\"} 3",
        "aether_model_publish_changes_count 3",
        "aether_model_publish_delay_seconds_count 3",
    ] {
        assert!(exposition.contains(line), "{line} in:\n{exposition}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_resync_replaces_everything_and_what_it_lacks_is_gone() {
    let mut bench = Bench::new().await;
    bench
        .change(service("svc-a", "10.9.0.1", "10.96.9.1"))
        .await;
    assert!(bench.model().classes("mp", "svc-a").is_some());
    // A relist: the store as it is now, without svc-a and without mp-httponly.
    let mut now = fixture();
    now.rows.retain(|r| r.service != "mp-httponly");
    now.services.retain(|s| s.name != "mp-httponly");
    bench.feed.script.lock().resync = Some(keyed(&now));
    let p = bench.next_after_notice().await;
    assert!(p.applied.full, "a resync compiles everything");
    let model = bench.model();
    assert!(model.classes("mp", "svc-a").is_none(), "svc-a is gone");
    assert!(
        model.classes("mp", "mp-httponly").is_none(),
        "mp-httponly is gone"
    );
    assert!(bench.resolves(&fqdn("svc-a")).is_none());
    assert!(
        model.serves_like(&crate::model::compile(&now, &context(&config()))),
        "the published model is the compile of what the relist gave"
    );
}

impl Bench {
    /// A notice alone (the source's changes are set otherwise), then the next publish.
    async fn next_after_notice(&mut self) -> Publication {
        let _ = self.notices.try_send(());
        self.next().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_change_during_a_publish_is_published_by_the_next_one() {
    let Bench {
        feed,
        mut publisher,
        handle,
        notices,
        mut changed,
        ..
    } = Bench::new().await;
    let (entered_tx, entered) = tokio::sync::oneshot::channel();
    let (open, gate) = std::sync::mpsc::channel();
    *feed.gate.lock() = Some((entered_tx, gate));
    let (done_tx, mut done) = mpsc::unbounded_channel();
    let publishing = tokio::spawn(async move {
        while changed.recv().await.is_some() {
            let outcome = publisher.publish(&mut changed).await;
            if done_tx.send(outcome).is_err() {
                break;
            }
        }
    });
    feed.script
        .lock()
        .pending
        .extend(service("svc-a", "10.9.0.1", "10.96.9.1"));
    notices.try_send(()).expect("nothing pending");
    // The load has taken svc-a and waits at the gate: svc-b arrives now.
    entered.await.expect("the load reached the gate");
    feed.script
        .lock()
        .pending
        .extend(service("svc-b", "10.9.0.2", "10.96.9.2"));
    notices.try_send(()).expect("the first notice was taken");
    open.send(()).expect("the load waits");
    // Bounded (on the paused clock, at once when nothing else can run): a lost change fails
    // here rather than hanging.
    let mut outcome = async || {
        tokio::time::timeout(Duration::from_secs(60), done.recv())
            .await
            .ok()
            .flatten()
    };
    let Some(Outcome::Published(first)) = outcome().await else {
        panic!("the first publish")
    };
    assert_eq!(
        first.applied.changes, 2,
        "svc-a alone: svc-b came after the load took"
    );
    let Some(Outcome::Published(second)) = outcome().await else {
        panic!("svc-b is published by the next publish, not lost")
    };
    assert_eq!(second.applied.changes, 2);
    assert_eq!(second.generation, first.generation + 1);
    let model = handle.load();
    for name in ["svc-a", "svc-b"] {
        assert!(model.classes("mp", name).is_some(), "{name} is served");
    }
    drop(notices);
    publishing.await.expect("the publishing task");
}

#[tokio::test(start_paused = true)]
async fn an_object_the_compiler_refuses_is_left_out_and_the_rest_is_published() {
    let mut bench = Bench::new().await;
    let mut changes = service("svc-good", "10.9.0.1", "10.96.9.1");
    // A row whose ports name no protocol: refused (spec/model.md §3.3), counted, logged.
    let mut bad = service("svc-bad", "10.9.0.2", "10.96.9.2");
    if let Some(Object::Row(row)) = &mut bad[0].object {
        Arc::make_mut(row).port_protocols = None;
    }
    changes.append(&mut bad);
    bench.change(changes).await;
    let model = bench.model();
    assert!(
        model.classes("mp", "svc-good").is_some(),
        "the good service is served"
    );
    assert!(
        model.classes("mp", "svc-bad").is_none_or(|c| c.is_empty()),
        "the refused row serves nothing"
    );
    assert!(
        model
            .diagnostics
            .iter()
            .any(|d| d.detail == "port-protocols-missing"),
        "the refusal is reported: {:?}",
        model.diagnostics
    );
    assert_eq!(
        bench
            .stats
            .model_rows_refused
            .get_or_create(&[("reason", "port-protocols-missing")])
            .get(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_load_that_fails_keeps_the_published_model_and_the_next_change_is_published() {
    let mut bench = Bench::new().await;
    let before = bench.model();
    let generation = bench.handle.generation();
    bench.feed.script.lock().fail = true;
    bench.give(service("svc-a", "10.9.0.1", "10.96.9.1"));
    bench.changed.recv().await.expect("a notice");
    let outcome = bench.publisher.publish(&mut bench.changed).await;
    assert!(matches!(outcome, Outcome::Failed), "{outcome:?}");
    assert!(
        Arc::ptr_eq(&before, &bench.model()),
        "the published model stays"
    );
    assert_eq!(bench.handle.generation(), generation);
    assert_eq!(bench.publishes("failed"), 1);
    // The failed load took svc-a's changes with it: a source gives them again (the file and
    // etcd sources read everything again; the Kubernetes feed takes its keys only in a load
    // that cannot fail). Here the script gives them again.
    let p = bench
        .change(service("svc-a", "10.9.0.1", "10.96.9.1"))
        .await;
    assert_eq!(p.generation, generation + 1);
    assert!(bench.model().classes("mp", "svc-a").is_some());
}

#[tokio::test(start_paused = true)]
async fn a_change_the_model_does_not_show_keeps_the_generation() {
    let mut bench = Bench::new().await;
    let generation = bench.handle.generation();
    // A namespace no service is in: held, and the model serves as before.
    let p = bench
        .change(vec![Change::put(
            "quiet",
            Object::Namespace("quiet".into()),
        )])
        .await;
    assert!(p.unchanged, "the model serves as the published one");
    assert_eq!(
        p.generation, generation,
        "nothing waiting for a new model is woken"
    );
    assert_eq!(bench.publishes("unchanged"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_source_that_reads_no_snapshot_has_it_made_when_asked_at_the_published_version() {
    let mut bench = Bench::reading(false).await;
    bench
        .change(service("svc-a", "10.9.0.1", "10.96.9.1"))
        .await;
    // The followers read the kinds they need from the kept model.
    assert_eq!(
        bench.resolves(&fqdn("svc-a")),
        Some(vec!["10.96.9.1".parse().unwrap()])
    );
    let published = bench.handle.published();
    assert!(
        published.made_on_demand(),
        "no snapshot is kept beside the model"
    );
    let source = published.source().expect("made when asked");
    assert!(
        source.rows.iter().any(|r| r.service == "svc-a"),
        "it holds the change"
    );
    assert!(
        crate::model::compile(&source, &published.model.context).serves_like(&published.model),
        "it is what the published model was compiled from"
    );
    // A load under way has changed the kept model: the published model's snapshot can no
    // longer be made (a debug view waits for the next publish), and is not made wrong.
    bench
        .kept
        .lock()
        .apply(service("svc-b", "10.9.0.2", "10.96.9.2"));
    assert!(published.source().is_none(), "the registry has moved on");
}

#[tokio::test(start_paused = true)]
async fn the_dns_table_is_made_again_only_when_a_service_changed() {
    let mut bench = Bench::new().await;
    let changes = service("svc-a", "10.9.0.1", "10.96.9.1");
    bench.change(changes.clone()).await;
    let before = bench.dns.load_full();
    // svc-a's pod made not Ready: its row changes, no Service does.
    let mut row = changes[0].clone();
    if let Some(Object::Row(r)) = &mut row.object {
        Arc::make_mut(r).ready = false;
    }
    let p = bench.change(vec![row]).await;
    assert!(!p.unchanged, "the model serves the readiness");
    assert!(
        Arc::ptr_eq(&before, &bench.dns.load_full()),
        "the DNS table stands"
    );
    // A Service's address moved: made again.
    let mut moved = service("svc-a", "10.9.0.1", "10.96.9.7");
    moved.remove(0);
    bench.change(moved).await;
    assert!(!Arc::ptr_eq(&before, &bench.dns.load_full()));
    assert_eq!(
        bench.resolves(&fqdn("svc-a")),
        Some(vec!["10.96.9.7".parse().unwrap()])
    );
}
