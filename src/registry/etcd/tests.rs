//! The etcd registry against a real etcd (Debian's `etcd-server`), started by each test on its
//! own ports and data directory. Without `etcd` a test says SKIPPED (and fails under
//! `AETHER_REQUIRE_NETNS=1`, as in CI, where scripts/test installs it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::GetOptions;
use tokio::sync::mpsc;

use super::keys;
use super::*;
use crate::model::port::PortProtocol;
use crate::model::snapshot::ProtocolValue;
use crate::test_util::needs_root::skip;
use aether_lab::lab::etcd::{EtcdServer, installed};

/// A running etcd, its settings, and a directory for its data and the nodes' lease files.
/// Fields drop in order: etcd is stopped before its directory is removed.
struct Fixture {
    server: EtcdServer,
    s: EtcdSettings,
    dir: TempDir,
}

/// Starts etcd for `test`, or says SKIPPED (`None`) when it is not installed.
fn fixture(test: &str) -> Option<Fixture> {
    if !installed() {
        skip(test, "`etcd` is not installed (Debian: etcd-server)");
        return None;
    }
    let dir = tempdir();
    let server = EtcdServer::start(dir.path(), 1, None).expect("etcd starts");
    let s = EtcdSettings {
        endpoints: server.endpoints(),
        prefix: "/aether".into(),
        lease_ttl: Duration::from_secs(2),
        timeout: Duration::from_secs(2),
        auth: None,
        tls: None,
    };
    Some(Fixture { server, s, dir })
}

impl Fixture {
    /// A reader of the registry.
    fn source(&self) -> Arc<EtcdSource> {
        let (tx, _rx) = mpsc::channel(1);
        EtcdSource::start(self.s.clone(), tx)
    }

    /// A node's registration, its lease recorded in `lease_file` under the directory.
    fn register(&self, lease_file: &str, source: &Arc<EtcdSource>) -> Registration {
        Registration::start(
            self.s.clone(),
            self.dir.path().join(lease_file),
            source.clone(),
        )
    }

    fn lease(&self, lease_file: &str) -> i64 {
        std::fs::read_to_string(self.dir.path().join(lease_file))
            .unwrap()
            .parse()
            .unwrap()
    }
}

fn row(service: &str, address: &str, ports: &[(u32, PortProtocol)]) -> Row {
    Row {
        namespace: "mp".into(),
        service: service.into(),
        address: address.parse().unwrap(),
        port: ports[0].0,
        ports: ports.iter().map(|p| p.0).collect(),
        port_protocols: Some(
            ports
                .iter()
                .map(|&(p, v)| (p, ProtocolValue::Known(v)))
                .collect(),
        ),
        ready: true,
        pod: Some(format!("{service}-0")),
        node: Some("node-a".into()),
    }
}

/// Waits (up to 10 s) until the source's rows satisfy `ok`.
async fn rows_until(
    source: &EtcdSource,
    what: &str,
    ok: impl Fn(&[Arc<Row>]) -> bool,
) -> Vec<Arc<Row>> {
    for _ in 0..200 {
        if let Some(rows) = source.rows()
            && ok(&rows)
        {
            return rows;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: the rows are {:#?}", source.rows());
}

fn services(rows: &[Arc<Row>]) -> Vec<String> {
    rows.iter()
        .map(|r| format!("{}@{}", r.service, r.address))
        .collect()
}

async fn keys_under(client: &mut Client, prefix: &str) -> BTreeMap<String, (String, i64)> {
    let got = client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    got.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_owned(),
                (kv.value_str().unwrap().to_owned(), kv.lease()),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_pod_is_written_once_per_protocol_and_every_node_reads_one_row() {
    let test = "a_registered_pod_is_written_once_per_protocol_and_every_node_reads_one_row";
    let Some(f) = fixture(test) else {
        return;
    };
    let s = f.s.clone();
    let source = f.source();
    let registration = f.register("lease", &source);
    let mixed = row(
        "mp-mixed",
        "10.244.1.5",
        &[(8080, PortProtocol::Http), (9000, PortProtocol::Tcp)],
    );
    let udp = row("mp-udp", "10.244.1.6", &[(5353, PortProtocol::Udp)]);
    registration.set(vec![mixed.clone(), udp.clone()]);
    let rows = rows_until(&source, "both rows", |r| r.len() == 2).await;
    assert_eq!(*rows[0], mixed);
    assert_eq!(*rows[1], udp);

    // M6 read directly: both segments, each copy with the whole map, on this node's lease.
    let mut client = connect(&s).await.unwrap();
    let held = keys_under(&mut client, "/aether/").await;
    let names: Vec<&str> = held.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "/aether/v1/endpoints/mp/mp-mixed/protocols/HTTP/10.244.1.5",
            "/aether/v1/endpoints/mp/mp-mixed/protocols/TCP/10.244.1.5",
            "/aether/v1/endpoints/mp/mp-udp/protocols/UDP/10.244.1.6",
        ]
    );
    let lease = f.lease("lease");
    for (key, (value, on)) in &held {
        assert_eq!(*on, lease, "{key} hangs on the node's lease");
        let json: serde_json::Value = serde_json::from_str(value).unwrap();
        if key.contains("mp-mixed") {
            assert_eq!(
                json["port_protocols"],
                serde_json::json!({"8080": "HTTP", "9000": "TCP"})
            );
        }
    }

    // A change and a removal reach the reader through the watch.
    let mut unready = mixed.clone();
    unready.ready = false;
    registration.set(vec![unready]);
    let rows = rows_until(&source, "mp-mixed unready, mp-udp gone", |r| {
        r.len() == 1 && !r[0].ready
    })
    .await;
    assert_eq!(services(&rows), ["mp-mixed@10.244.1.5"]);
    assert_eq!(source.stats().listings.load(Ordering::Relaxed), 1);
    assert_eq!(source.stats().watches.load(Ordering::Relaxed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_key_written_by_hand_is_refused_counted_once_and_the_rest_served() {
    let test = "a_bad_key_written_by_hand_is_refused_counted_once_and_the_rest_served";
    let Some(f) = fixture(test) else {
        return;
    };
    let s = f.s.clone();
    let mut client = connect(&s).await.unwrap();
    let good = keys::encode(
        "/aether",
        &row("mp-httponly", "10.244.2.7", &[(8080, PortProtocol::Http)]),
    )
    .unwrap();
    client
        .put(good[0].0.as_str(), good[0].1.as_str(), None)
        .await
        .unwrap();
    // Listed: a row without its map.
    client
        .put(
            "/aether/v1/endpoints/mp/hand/protocols/HTTP/10.244.9.1",
            r#"{"schema":1,"port":8080,"ports":[8080],"ready":true}"#,
            None,
        )
        .await
        .unwrap();
    let source = f.source();
    let rows = rows_until(&source, "the good row", |r| r.len() == 1).await;
    assert_eq!(services(&rows), ["mp-httponly@10.244.2.7"]);
    // Watched: a value that is not JSON, and a key outside the format.
    client
        .put(
            "/aether/v1/endpoints/mp/hand/protocols/TCP/10.244.9.2",
            "not json",
            None,
        )
        .await
        .unwrap();
    client
        .put("/aether/v1/endpoints/mp/hand/10.244.9.3", "{}", None)
        .await
        .unwrap();
    for _ in 0..200 {
        if source.refused().len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reasons: Vec<&str> = source
        .refused()
        .iter()
        .map(|r| r.refusal.reason())
        .collect();
    assert_eq!(
        reasons,
        ["key-malformed", "port-protocols-missing", "value-malformed"]
    );
    let counted = source.stats().refused.lock().clone();
    assert_eq!(
        counted,
        BTreeMap::from([
            ("key-malformed", 1),
            ("port-protocols-missing", 1),
            ("value-malformed", 1)
        ])
    );
    assert_eq!(
        services(&source.rows().unwrap()),
        ["mp-httponly@10.244.2.7"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_problem_is_not_written_and_is_counted_once() {
    let test = "a_row_problem_is_not_written_and_is_counted_once";
    let Some(f) = fixture(test) else {
        return;
    };
    let s = f.s.clone();
    let source = f.source();
    let registration = f.register("lease", &source);
    let good = row("mp-httponly", "10.244.2.7", &[(8080, PortProtocol::Http)]);
    let mut bad = row("mp-bad", "10.244.2.8", &[(8080, PortProtocol::Http)]);
    bad.ports.push(9000); // 9000 is listed with no protocol
    registration.set(vec![good.clone(), bad.clone()]);
    rows_until(&source, "the good row", |r| r.len() == 1).await;
    // Set again (a reload): not counted again.
    registration.set(vec![bad, good]);
    for _ in 0..200 {
        if registration.state.settled() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(registration.state.settled());
    assert_eq!(registration.state.keys.load(Ordering::Acquire), 1);
    let mut client = connect(&s).await.unwrap();
    let held = keys_under(&mut client, "/aether/").await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        source.stats().refused_on_write.lock().clone(),
        BTreeMap::from([("port-without-protocol", 1)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_nodes_rows_expire_with_its_lease_and_a_restarted_node_revokes_its_old_lease() {
    let test = "a_dead_nodes_rows_expire_with_its_lease_and_a_restarted_node_revokes_its_old_lease";
    let Some(f) = fixture(test) else {
        return;
    };
    let source = f.source();
    let a = row("mp-a", "10.244.1.1", &[(8080, PortProtocol::Http)]);
    let b = row("mp-b", "10.244.1.2", &[(9000, PortProtocol::Tcp)]);

    // Killed (the registration dropped, no revoke): gone after the TTL, not before.
    let dead = f.register("dead-lease", &source);
    dead.set(vec![a.clone()]);
    rows_until(&source, "the dead node's row", |r| r.len() == 1).await;
    drop(dead);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(source.rows().unwrap().len(), 1, "still held within the TTL");
    rows_until(&source, "the row expired with its lease", |r| r.is_empty()).await;

    // Restarted: the old lease is revoked once the new one holds this run's rows.
    let first = f.register("lease", &source);
    first.set(vec![a.clone(), b.clone()]);
    rows_until(&source, "both rows", |r| r.len() == 2).await;
    let old = f.lease("lease");
    drop(first);
    let second = f.register("lease", &source);
    second.set(vec![a.clone()]);
    // mp-b was the old lease's alone: it goes with the revoke, well before the TTL.
    let rows = rows_until(&source, "mp-b revoked", |r| r.len() == 1).await;
    assert_eq!(services(&rows), ["mp-a@10.244.1.1"]);
    let new = f.lease("lease");
    assert_ne!(old, new);
    let mut client = connect(&f.s).await.unwrap();
    let held = keys_under(&mut client, "/aether/").await;
    assert!(held.values().all(|(_, lease)| *lease == new), "{held:?}");
    // Past the old TTL, mp-a is still there: it is the new lease's.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(services(&source.rows().unwrap()), ["mp-a@10.244.1.1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_key_deleted_or_overwritten_by_another_writer_is_written_again_at_its_next_set() {
    let test =
        "a_nodes_key_deleted_or_overwritten_by_another_writer_is_written_again_at_its_next_set";
    let Some(f) = fixture(test) else {
        return;
    };
    let source = f.source();
    let mixed = row(
        "mp-mixed",
        "10.244.1.3",
        &[(8080, PortProtocol::Http), (9000, PortProtocol::Tcp)],
    );
    let node = f.register("lease", &source);
    node.set(vec![mixed.clone()]);
    rows_until(&source, "the row", |r| r.len() == 1).await;
    let mut client = connect(&f.s).await.unwrap();
    let held = keys_under(&mut client, "/aether/").await;
    assert_eq!(held.len(), 2, "{held:?}");
    let lease = f.lease("lease");
    // By hand: one copy deleted, the other overwritten (not Ready, no lease).
    let mut copies = held.iter();
    let (deleted, _) = copies.next().unwrap();
    let (overwritten, (value, _)) = copies.next().unwrap();
    client.delete(deleted.as_str(), None).await.unwrap();
    let forged = value.replace("\"ready\":true", "\"ready\":false");
    assert_ne!(&forged, value);
    client
        .put(overwritten.as_str(), forged, None)
        .await
        .unwrap();
    rows_until(&source, "the forged copy read", |r| {
        r.len() == 1 && !r[0].ready
    })
    .await;
    // The node's next set (a reload follows every change it reads) writes both again.
    node.set(vec![mixed.clone()]);
    for _ in 0..200 {
        if keys_under(&mut client, "/aether/").await == held {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let now = keys_under(&mut client, "/aether/").await;
    assert_eq!(
        now, held,
        "both copies as the node wrote them, under its lease {lease:x}"
    );
    rows_until(&source, "Ready again", |r| r.len() == 1 && r[0].ready).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_longer_than_a_page_is_read_whole_at_one_revision() {
    let test = "a_listing_longer_than_a_page_is_read_whole_at_one_revision";
    let Some(f) = fixture(test) else {
        return;
    };
    let mut client = connect(&f.s).await.unwrap();
    let n = usize::try_from(LIST_PAGE).unwrap() * 2 + 500;
    let kvs: Vec<(String, String)> = (0..n)
        .flat_map(|i| {
            let address = format!("10.244.{}.{}", i / 250, i % 250 + 1);
            keys::encode(
                "/aether",
                &row("mp-a", &address, &[(8080, PortProtocol::Http)]),
            )
            .unwrap()
        })
        .collect();
    for chunk in kvs.chunks(64) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|(k, v)| TxnOp::put(k.as_str(), v.as_str(), None))
            .collect();
        client.txn(Txn::new().and_then(ops)).await.unwrap();
    }
    // A key just past the prefix's range is not read.
    client
        .put("/aether/v1/endpoints0", "not a row", None)
        .await
        .unwrap();
    let source = f.source();
    let rows = rows_until(&source, "every page", |r| !r.is_empty()).await;
    assert_eq!(rows.len(), n);
    assert!(source.refused().is_empty(), "{:?}", source.refused());
    assert_eq!(source.stats().listings.load(Ordering::Relaxed), 1);
    assert_eq!(
        range_end(b"/aether/v1/endpoints/"),
        b"/aether/v1/endpoints0"
    );
    assert_eq!(range_end(b"a\xff"), b"b");
    assert_eq!(range_end(b"\xff"), [0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcds_authentication_a_node_reads_and_registers_as_its_user_and_nobody_else_does() {
    let test =
        "with_etcds_authentication_a_node_reads_and_registers_as_its_user_and_nobody_else_does";
    let Some(f) = fixture(test) else {
        return;
    };
    // docs/etcd.md: a role with readwrite on the rows' range, a user with that role, auth on.
    let mut admin = connect(&f.s).await.unwrap();
    admin.user_add("root", "root-password", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.role_add("aether").await.unwrap();
    admin
        .role_grant_permission(
            "aether",
            etcd_client::Permission::read_write("/aether/v1/endpoints/").with_prefix(),
        )
        .await
        .unwrap();
    admin
        .user_add("aether", "node-password", None)
        .await
        .unwrap();
    admin.user_grant_role("aether", "aether").await.unwrap();
    admin.auth_enable().await.unwrap();

    let as_user = EtcdSettings {
        auth: Some(("aether".into(), "node-password".into())),
        ..f.s.clone()
    };
    let (tx, _rx) = mpsc::channel(1);
    let source = EtcdSource::start(as_user.clone(), tx);
    let node = Registration::start(as_user, f.dir.path().join("lease"), source.clone());
    node.set(vec![row(
        "mp-a",
        "10.244.1.1",
        &[(8080, PortProtocol::Http)],
    )]);
    let rows = rows_until(&source, "the row, read and written as the user", |r| {
        r.len() == 1
    })
    .await;
    assert_eq!(services(&rows), ["mp-a@10.244.1.1"]);

    // Without credentials, and with a wrong password, nothing is ever listed.
    let (tx, _rx) = mpsc::channel(1);
    let anonymous = EtcdSource::start(f.s.clone(), tx);
    let (tx, _rx) = mpsc::channel(1);
    let wrong = EtcdSource::start(
        EtcdSettings {
            auth: Some(("aether".into(), "not-the-password".into())),
            ..f.s.clone()
        },
        tx,
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(anonymous.rows().is_none(), "listed without credentials");
    assert!(wrong.rows().is_none(), "listed with a wrong password");
    assert_eq!(source.stats().listings.load(Ordering::Relaxed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_stopped_keeps_the_last_rows_and_the_watch_resumes_after_its_restart() {
    let test = "etcd_stopped_keeps_the_last_rows_and_the_watch_resumes_after_its_restart";
    let Some(mut f) = fixture(test) else {
        return;
    };
    // Longer than the outage: the rows outlive it in the store too.
    f.s.lease_ttl = Duration::from_secs(30);
    let source = f.source();
    let registration = f.register("lease", &source);
    let a = row("mp-a", "10.244.1.1", &[(8080, PortProtocol::Http)]);
    registration.set(vec![a.clone()]);
    rows_until(&source, "the row", |r| r.len() == 1).await;

    f.server.stop(0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        services(&source.rows().unwrap()),
        ["mp-a@10.244.1.1"],
        "the last listing stays in force while etcd is down"
    );
    assert!(!source.stats().connected.load(Ordering::Acquire));
    // A change made while etcd is down is written once it is back.
    let b = row("mp-b", "10.244.1.2", &[(9000, PortProtocol::Tcp)]);
    registration.set(vec![a.clone(), b.clone()]);

    f.server.restart(0).unwrap();
    let rows = rows_until(&source, "the change made meanwhile", |r| r.len() == 2).await;
    assert_eq!(services(&rows), ["mp-a@10.244.1.1", "mp-b@10.244.1.2"]);
    // Resumed from its revision, not listed again.
    assert_eq!(source.stats().listings.load(Ordering::Relaxed), 1);
    assert!(source.stats().watches.load(Ordering::Relaxed) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_behind_a_compaction_lists_again_and_keeps_nothing_stale() {
    let test = "a_watch_behind_a_compaction_lists_again_and_keeps_nothing_stale";
    let Some(f) = fixture(test) else {
        return;
    };
    let s = f.s.clone();
    let mut client = connect(&s).await.unwrap();
    let put = |r: &Row| keys::encode("/aether", r).unwrap();
    let a = put(&row("mp-a", "10.244.1.1", &[(8080, PortProtocol::Http)]));
    let b = put(&row("mp-b", "10.244.1.2", &[(8080, PortProtocol::Http)]));
    client
        .put(a[0].0.as_str(), a[0].1.as_str(), None)
        .await
        .unwrap();
    let (tx, _rx) = mpsc::channel(1);
    // The source's state without its task: this test lists and watches by hand.
    let source = Followed::default();
    let prefix = keys::endpoints_prefix("/aether");
    let listed = source.list(&mut client, &prefix, &s).await.unwrap();
    // While this reader is away: b added, a deleted, history compacted past `listed`.
    client
        .put(b[0].0.as_str(), b[0].1.as_str(), None)
        .await
        .unwrap();
    let deleted = client.delete(a[0].0.as_str(), None).await.unwrap();
    let now = deleted.header().unwrap().revision();
    client.compact(now, None).await.unwrap();
    let mut backoff = Backoff::default();
    let next = source
        .watch(&mut client, &prefix, &s, listed, &tx, &mut backoff)
        .await
        .unwrap_or_else(|(_, e)| panic!("{e}"));
    assert!(matches!(next, Next::Relist));
    source.list(&mut client, &prefix, &s).await.unwrap();
    assert_eq!(
        services(&source.rows_at().unwrap().0),
        ["mp-b@10.244.1.2"],
        "a's delete, lost with the history, is not left behind"
    );
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> TempDir {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "aether-etcd-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// A source that is dropped ends its list/watch task: the state the task shared is released and
/// its watch is closed, so the reader is gone from etcd at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_source_ends_its_watch() {
    let test = "a_dropped_source_ends_its_watch";
    let Some(f) = fixture(test) else {
        return;
    };
    let source = f.source();
    rows_until(&source, "the first listing", |_| true).await;
    // Until the watch is up (a generous bound: a loaded machine takes its time), so the drop
    // below ends a running watch, not a listing.
    let watching = || {
        source.stats().connected.load(Ordering::Acquire)
            && source.stats().watches.load(Ordering::Relaxed) >= 1
    };
    for _ in 0..1200 {
        if watching() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(watching(), "the source's watch did not start within 60 s");
    let followed = Arc::downgrade(&source.followed);
    drop(source);
    for _ in 0..100 {
        if followed.upgrade().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the source was dropped and its task still holds its state after 5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_successor_holds_the_registration_takes_no_key_back() {
    let test = "a_run_whose_successor_holds_the_registration_takes_no_key_back";
    let Some(f) = fixture(test) else {
        return;
    };
    let source = f.source();
    let a = row("mp-a", "10.244.1.1", &[(8080, PortProtocol::Http)]);
    let first = f.register("lease", &source);
    first.set(vec![a.clone()]);
    rows_until(&source, "the row", |r| r.len() == 1).await;
    let old = f.lease("lease");
    // The upgrade's successor starts beside it: its lease recorded, nothing set yet.
    let second = f.register("lease", &source);
    for _ in 0..400 {
        if f.lease("lease") != old {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_ne!(f.lease("lease"), old, "the successor recorded its lease");
    // Another writer (here, by hand) overwrites the row: not Ready.
    let mut client = connect(&f.s).await.unwrap();
    let held = keys_under(&mut client, "/aether/").await;
    let (key, (value, _)) = held.iter().next().unwrap();
    let forged = value.replace("\"ready\":true", "\"ready\":false");
    client
        .put(key.as_str(), forged.clone(), None)
        .await
        .unwrap();
    rows_until(&source, "the forged row read", |r| {
        r.len() == 1 && !r[0].ready
    })
    .await;
    // The old run's next set (its probes) writes nothing: it stops, the key as forged.
    first.set(vec![a.clone()]);
    for _ in 0..400 {
        if first
            .state
            .handed_over
            .load(std::sync::atomic::Ordering::Acquire)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        first
            .state
            .handed_over
            .load(std::sync::atomic::Ordering::Acquire),
        "the old run stopped registering"
    );
    let now = keys_under(&mut client, "/aether/").await;
    assert_eq!(
        now.get(key).map(|(v, _)| v),
        Some(&forged),
        "no key taken back"
    );
    drop(second);
}
