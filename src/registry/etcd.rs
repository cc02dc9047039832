//! The etcd registry (docs/etcd.md): every node registers its own pods' rows under a lease it
//! keeps alive ([`Registration`]), and every node lists and watches everyone's ([`EtcdSource`]).
//!
//! Layer 2 (IO). [`keys`] is the key and value format (pure, both ways) and [`table`] what a
//! node has read (pure); this file holds the client, the watch and the writer.
//!
//! Invariants:
//! - The watch starts from the revision of the last full listing and resumes, after a lost
//!   connection, from the last revision it saw: nothing is read twice and nothing is missed. A
//!   watch told its revision was compacted lists the whole prefix again ([`Table::replace`]:
//!   nothing stale is left behind).
//! - While the store cannot be read, the last listing stays in force: the rows are never
//!   emptied by an error (spec/model.md §3.4, "a listing that fails").
//! - A row is written only when it passes the check of spec/model.md §3.3 (on write); a key
//!   that fails it when listed is left out, logged and counted once (on listing).
//! - Every call to etcd has a deadline ([`EtcdSettings::timeout`]); the watch stream is kept
//!   honest by HTTP/2 keep-alive pings, so a dead peer is noticed within the same bound.

pub mod keys;
pub mod table;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, TlsOptions, Txn, TxnOp, WatchOptions,
};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::model::snapshot::Row;

pub use table::{Refused, RowId, Table, TableChanges};

/// How a node reaches etcd.
#[derive(Clone, Debug)]
pub struct EtcdSettings {
    /// The members' client URLs (`http://host:2379`, or `https://` with [`EtcdSettings::tls`]).
    pub endpoints: Vec<String>,
    /// Every key starts with this (docs/etcd.md); `/aether` by default.
    pub prefix: String,
    /// The time to live of a node's lease: its rows outlive a dead node by at most this.
    pub lease_ttl: Duration,
    /// The deadline of every call, and of the keep-alive ping that watches a quiet stream.
    pub timeout: Duration,
    /// User name and password (etcd's own authentication).
    pub auth: Option<(String, String)>,
    /// TLS to the members.
    pub tls: Option<EtcdTls>,
}

/// TLS to the members: the CA that signed them, and a client certificate when they ask for one.
#[derive(Clone, Debug, Default)]
pub struct EtcdTls {
    /// The CA certificate (PEM) the members' certificates are checked against.
    pub ca: Option<PathBuf>,
    /// The client certificate (PEM), with `key`.
    pub cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    pub key: Option<PathBuf>,
}

/// Why the registry could not be reached or read.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// A file of the TLS or auth settings cannot be read.
    #[error("cannot read {path}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The client said no.
    #[error("etcd: {0}")]
    Client(#[from] etcd_client::Error),
    /// A call ran past its deadline.
    #[error("etcd did not answer {what} within {after:?}")]
    Timeout {
        /// The call.
        what: &'static str,
        /// The deadline.
        after: Duration,
    },
    /// The lease was gone when it was renewed (etcd unreachable for longer than its TTL).
    #[error("the lease {0:x} expired")]
    LeaseExpired(i64),
}

fn read_file(path: &Path) -> Result<Vec<u8>, EtcdError> {
    std::fs::read(path).map_err(|source| EtcdError::File {
        path: path.to_owned(),
        source,
    })
}

/// A client for `settings`. The connection itself is made lazily by the first call.
pub async fn connect(settings: &EtcdSettings) -> Result<Client, EtcdError> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(settings.timeout)
        .with_keep_alive(settings.timeout, settings.timeout)
        .with_keep_alive_while_idle(true);
    if let Some((user, password)) = &settings.auth {
        options = options.with_user(user.clone(), password.clone());
    }
    if let Some(tls) = &settings.tls {
        let mut config = TlsOptions::new();
        if let Some(ca) = &tls.ca {
            config = config.ca_certificate(Certificate::from_pem(read_file(ca)?));
        }
        if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
            config = config.identity(Identity::from_pem(read_file(cert)?, read_file(key)?));
        }
        options = options.with_tls(config);
    }
    let call = Client::connect(&settings.endpoints, Some(options));
    Ok(deadline(settings.timeout, "the connection", call).await??)
}

async fn deadline<T>(
    after: Duration,
    what: &'static str,
    call: impl Future<Output = T>,
) -> Result<T, EtcdError> {
    tokio::time::timeout(after, call)
        .await
        .map_err(|_| EtcdError::Timeout { what, after })
}

/// Counters of the etcd source, for `/metrics` and `/model`.
#[derive(Debug, Default)]
pub struct EtcdStats {
    /// Keys refused when listed, by reason (each refused write counted once).
    pub refused: parking_lot::Mutex<BTreeMap<&'static str, u64>>,
    /// Rows this node did not write because they fail spec/model.md §3.3, by reason.
    pub refused_on_write: parking_lot::Mutex<BTreeMap<&'static str, u64>>,
    /// Full listings of the prefix (the first, and one after each compaction past the watch).
    pub listings: AtomicU64,
    /// Watch streams started (the first, and one after each lost connection).
    pub watches: AtomicU64,
    /// The last revision the watch saw.
    pub revision: AtomicI64,
    /// Whether the watch is connected now.
    pub connected: AtomicBool,
    /// Leases granted to this node's registrations.
    pub leases: AtomicU64,
}

fn count(map: &parking_lot::Mutex<BTreeMap<&'static str, u64>>, reason: &'static str) {
    *map.lock().entry(reason).or_default() += 1;
}

/// What every node reads: the rows of the whole registry, as last listed and watched. The
/// list/watch task ends when the source is dropped (it and the task share `Followed`, not the
/// source itself).
#[derive(Debug)]
pub struct EtcdSource {
    followed: Arc<Followed>,
    task: tokio::task::AbortHandle,
}

impl Drop for EtcdSource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EtcdSource {
    /// Starts listing and watching `settings.prefix`; `changed` is told of every change.
    pub fn start(settings: EtcdSettings, changed: mpsc::Sender<()>) -> Arc<Self> {
        let followed = Arc::new(Followed::default());
        let task = tokio::spawn(followed.clone().follow(settings, changed)).abort_handle();
        Arc::new(Self { followed, task })
    }

    /// The counters.
    pub fn stats(&self) -> &EtcdStats {
        &self.followed.stats
    }

    /// The served rows, or `None` before the first listing.
    pub fn rows(&self) -> Option<Vec<Arc<Row>>> {
        self.rows_at().map(|(rows, _)| rows)
    }

    /// The served rows and the store revision they are of, or `None` before the first listing.
    pub fn rows_at(&self) -> Option<(Vec<Arc<Row>>, i64)> {
        self.followed.rows_at()
    }

    /// The rows changed since the last call (every row after a listing, or when `all` is
    /// asked) and the store revision they are of; `None` before the first listing.
    pub fn take_changes(&self, all: bool) -> Option<(TableChanges, i64)> {
        self.followed
            .table
            .lock()
            .as_mut()
            .map(|(table, revision)| (table.take_changes(all), *revision))
    }

    /// The store revision the rows are at, `None` before the first listing.
    pub fn revision(&self) -> Option<i64> {
        self.followed.table.lock().as_ref().map(|(_, r)| *r)
    }

    /// Every key held that is not served.
    pub fn refused(&self) -> Vec<Refused> {
        self.followed
            .table
            .lock()
            .as_ref()
            .map(|(table, _)| table.refused())
            .unwrap_or_default()
    }

    /// The keys of `written` (each with the revision that wrote it) that the table, once it
    /// has caught up with that revision, does not hold as written: deleted, or put again by
    /// another writer.
    fn drifted(&self, written: &BTreeMap<String, (String, i64)>) -> Vec<String> {
        let held = self.followed.table.lock();
        let Some((table, at)) = held.as_ref() else {
            return Vec::new();
        };
        written
            .iter()
            .filter(|(key, (_, revision))| {
                *at >= *revision && table.mod_revision(key.as_bytes()) != Some(*revision)
            })
            .map(|(key, _)| key.clone())
            .collect()
    }
}

/// What a source shares with its list/watch task: the table and the counters.
#[derive(Debug, Default)]
struct Followed {
    /// The table and the revision it is at, `None` before the first listing.
    table: parking_lot::Mutex<Option<(Table, i64)>>,
    stats: EtcdStats,
}

impl Followed {
    fn rows_at(&self) -> Option<(Vec<Arc<Row>>, i64)> {
        self.table
            .lock()
            .as_ref()
            .map(|(table, revision)| (table.rows(), *revision))
    }

    fn refused_now(&self, refused: &[Refused]) {
        for r in refused {
            warn!(key = %r.key, reason = r.refusal.reason(), refusal = %r.refusal,
                "registry key refused; the rest of the registry is served");
            count(&self.stats.refused, r.refusal.reason());
        }
    }

    /// Lists, then watches, forever: a lost connection is retried with backoff and the watch
    /// resumes from the last revision seen; a compaction past it lists again.
    async fn follow(self: Arc<Self>, settings: EtcdSettings, changed: mpsc::Sender<()>) {
        let prefix = keys::endpoints_prefix(&settings.prefix);
        let mut backoff = Backoff::default();
        // The revision the table is at; `None`: list first.
        let mut at: Option<i64> = None;
        loop {
            let mut client = match connect(&settings).await {
                Ok(c) => c,
                Err(e) => {
                    warn!(error = %crate::DisplayChain(&e), "etcd: cannot connect; the last listing stays in force");
                    backoff.wait().await;
                    continue;
                }
            };
            let revision = match at {
                Some(r) => r,
                None => match self.list(&mut client, &prefix, &settings).await {
                    Ok(r) => {
                        let _ = changed.try_send(());
                        r
                    }
                    Err(e) => {
                        self.stats.connected.store(false, Ordering::Release);
                        warn!(error = %crate::DisplayChain(&e), "etcd: cannot list the registry; the last listing stays in force");
                        backoff.wait().await;
                        continue;
                    }
                },
            };
            match self
                .watch(
                    &mut client,
                    &prefix,
                    &settings,
                    revision,
                    &changed,
                    &mut backoff,
                )
                .await
            {
                Ok(Next::Resume(r)) => {
                    // Canceled by the server (a permission taken away, say): not at once again.
                    at = Some(r);
                    backoff.wait().await;
                }
                Ok(Next::Relist) => at = None,
                Err((r, e)) => {
                    at = Some(r);
                    self.stats.connected.store(false, Ordering::Release);
                    warn!(error = %crate::DisplayChain(&e), revision = r,
                        "etcd: the watch was lost; the last listing stays in force and the watch resumes from its revision");
                    backoff.wait().await;
                }
            }
        }
    }

    /// Lists the whole prefix, in pages of [`LIST_PAGE`] keys all read at the first page's
    /// revision (one consistent listing; a response of every key at once would pass the gRPC
    /// message limit, 4 MiB, at about 18,000 keys): the table becomes the listing. Returns its
    /// revision.
    async fn list(
        &self,
        client: &mut Client,
        prefix: &str,
        settings: &EtcdSettings,
    ) -> Result<i64, EtcdError> {
        let end = range_end(prefix.as_bytes());
        let mut from = prefix.as_bytes().to_vec();
        let mut revision = 0;
        let mut kvs: Vec<(Vec<u8>, Vec<u8>, i64)> = Vec::new();
        loop {
            let mut options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(LIST_PAGE);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let page = deadline(
                settings.timeout,
                "the listing",
                client.get(from.clone(), Some(options)),
            )
            .await??;
            if revision == 0 {
                revision = page.header().map_or(0, |h| h.revision());
            }
            kvs.extend(
                page.kvs()
                    .iter()
                    .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision())),
            );
            match page.kvs().last() {
                Some(last) if page.more() => {
                    // The next page starts just after the last key.
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => break,
            }
        }
        let listing = kvs;
        let refused = {
            let mut held = self.table.lock();
            let (table, at) = held.get_or_insert_with(|| (Table::new(&settings.prefix), 0));
            *at = revision;
            table.replace(
                listing
                    .iter()
                    .map(|(k, v, r)| (k.as_slice(), v.as_slice(), *r)),
            )
        };
        self.refused_now(&refused);
        self.stats.listings.fetch_add(1, Ordering::Relaxed);
        self.stats.revision.store(revision, Ordering::Release);
        self.stats.connected.store(true, Ordering::Release);
        info!(revision, keys = listing.len(), "etcd: registry listed");
        Ok(revision)
    }

    /// Watches from `revision + 1` until the stream ends.
    async fn watch(
        &self,
        client: &mut Client,
        prefix: &str,
        settings: &EtcdSettings,
        revision: i64,
        changed: &mpsc::Sender<()>,
        backoff: &mut Backoff,
    ) -> Result<Next, (i64, EtcdError)> {
        let mut at = revision;
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(at + 1)
            .with_progress_notify();
        let mut stream = deadline(
            settings.timeout,
            "the watch",
            client
                .watch_client()
                .max_decoding_message_size(WATCH_MESSAGE_MAX)
                .watch(prefix, Some(options)),
        )
        .await
        .and_then(|r| r.map_err(EtcdError::from))
        .map_err(|e| (at, e))?;
        self.stats.watches.fetch_add(1, Ordering::Relaxed);
        self.stats.connected.store(true, Ordering::Release);
        loop {
            let response = match stream.message().await {
                Ok(Some(r)) => r,
                Ok(None) => {
                    return Err((
                        at,
                        EtcdError::Client(etcd_client::Error::WatchError(
                            "the watch stream ended".into(),
                        )),
                    ));
                }
                Err(e) => return Err((at, e.into())),
            };
            backoff.reset();
            if response.compact_revision() > 0 {
                warn!(
                    revision = at,
                    compacted = response.compact_revision(),
                    "etcd: the watch's revision was compacted; listing the registry again"
                );
                return Ok(Next::Relist);
            }
            if response.canceled() {
                warn!(
                    reason = response.cancel_reason(),
                    revision = at,
                    "etcd: the server canceled the watch; it resumes from its revision"
                );
                return Ok(Next::Resume(at));
            }
            let events = response.events();
            if events.is_empty() {
                // A progress notice: every change up to its revision has been sent.
                if !response.created()
                    && let Some(h) = response.header()
                {
                    at = at.max(h.revision());
                    if let Some((_, held)) = self.table.lock().as_mut() {
                        *held = at;
                    }
                    self.stats.revision.store(at, Ordering::Release);
                }
                continue;
            }
            let mut refused = Vec::new();
            {
                let mut held = self.table.lock();
                let (table, held_at) =
                    held.get_or_insert_with(|| (Table::new(&settings.prefix), 0));
                for event in events {
                    let Some(kv) = event.kv() else { continue };
                    match event.event_type() {
                        EventType::Put => {
                            refused.extend(table.put(kv.key(), kv.value(), kv.mod_revision()));
                        }
                        EventType::Delete => table.delete(kv.key()),
                    }
                    at = at.max(kv.mod_revision());
                }
                *held_at = at;
            }
            self.refused_now(&refused);
            self.stats.revision.store(at, Ordering::Release);
            let _ = changed.try_send(());
        }
    }
}

/// The largest watch response read. A watch that catches up (after a lost connection) gets
/// up to 1,000 revisions' events in one response, which passes gRPC's default 4 MiB with large
/// transactions; a response over the limit would fail the watch at the same revision for good.
const WATCH_MESSAGE_MAX: usize = 64 << 20;

/// Keys per page of a listing: about 200 KiB of rows, well under the gRPC message limit.
const LIST_PAGE: i64 = 1_000;

/// The end of the range of every key that starts with `prefix` (etcd's prefix range: the
/// prefix with its last byte below 0xff incremented, and what follows it dropped).
fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff (or no prefix): to the end of the key space.
    vec![0]
}

enum Next {
    /// Watch again from this revision.
    Resume(i64),
    /// List again.
    Relist,
}

/// Doubling waits between attempts, 100 ms to 5 s.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: Duration::from_millis(100),
        }
    }
}

impl Backoff {
    async fn wait(&mut self) {
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(Duration::from_secs(5));
    }

    fn reset(&mut self) {
        *self = Self::default();
    }
}

/// What this node registers: its own pods' rows, written under one lease it keeps alive.
#[derive(Debug)]
pub struct Registration {
    desired: watch::Sender<Arc<Desired>>,
    /// Keys this node holds in the store now, and which of its [`Registration::set`] calls is
    /// written (for `/model` and the lab's settling).
    pub state: Arc<RegistrationState>,
    task: tokio::task::JoinHandle<()>,
}

/// Rows to register, numbered by [`Registration::set`].
#[derive(Debug, Default)]
struct Desired {
    generation: u64,
    rows: Vec<Row>,
}

/// How far the registration is.
#[derive(Debug, Default)]
pub struct RegistrationState {
    /// Keys this node holds in the store.
    pub keys: AtomicU64,
    /// The last [`Registration::set`] call's number.
    pub asked: AtomicU64,
    /// The number of the last call whose rows are all written.
    pub written: AtomicU64,
    /// A later run of this node (an upgrade's successor) holds the registration: this run
    /// writes nothing more.
    pub handed_over: AtomicBool,
}

impl RegistrationState {
    /// Whether the rows last set are all written.
    pub fn settled(&self) -> bool {
        self.written.load(Ordering::Acquire) == self.asked.load(Ordering::Acquire)
    }
}

impl Drop for Registration {
    /// Stops renewing the lease: this node's rows leave the store when it expires, as if the
    /// node had died (a successor revokes it at once, [`Registration::start`]).
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Registration {
    /// Starts registering. The lease of an earlier run, recorded in `lease_file`, is revoked once
    /// this run's rows are written (its keys that this run did not write again go with it).
    pub fn start(settings: EtcdSettings, lease_file: PathBuf, stats: Arc<EtcdSource>) -> Self {
        let (desired, rx) = watch::channel(Arc::new(Desired::default()));
        let state = Arc::new(RegistrationState::default());
        let task = tokio::spawn(register(settings, lease_file, rx, stats, state.clone()));
        Self {
            desired,
            state,
            task,
        }
    }

    /// This node's rows now: written when they differ from what is held.
    pub fn set(&self, rows: Vec<Row>) {
        let generation = self.state.asked.fetch_add(1, Ordering::AcqRel) + 1;
        self.desired
            .send_replace(Arc::new(Desired { generation, rows }));
    }
}

/// The most operations in one transaction (etcd's `--max-txn-ops` is 128 by default).
const TXN_OPS: usize = 64;

async fn register(
    settings: EtcdSettings,
    lease_file: PathBuf,
    mut desired: watch::Receiver<Arc<Desired>>,
    source: Arc<EtcdSource>,
    state: Arc<RegistrationState>,
) {
    let mut earlier = std::fs::read_to_string(&lease_file)
        .ok()
        .and_then(|t| t.trim().parse::<i64>().ok());
    let mut backoff = Backoff::default();
    // The lease this run last recorded in `lease_file`.
    let mut ours: Option<i64> = None;
    // (pod, reason) refused on write already logged and counted.
    let mut told: BTreeMap<(String, String, std::net::IpAddr), &'static str> = BTreeMap::new();
    loop {
        let result: Result<(), EtcdError> = async {
            let mut client = connect(&settings).await?;
            let ttl = i64::try_from(settings.lease_ttl.as_secs().max(1)).unwrap_or(i64::MAX);
            let lease = deadline(settings.timeout, "the lease grant", client.lease_grant(ttl, None))
                .await??
                .id();
            source.stats().leases.fetch_add(1, Ordering::Relaxed);
            ours = Some(lease);
            if let Err(e) = std::fs::write(&lease_file, lease.to_string()) {
                warn!(file = %lease_file.display(), error = %e, "etcd: cannot record the lease; a restart will leave its keys to expire");
            }
            info!(lease = format_args!("{lease:x}"), ttl, "etcd: lease granted");
            let (mut keeper, mut renewals) =
                deadline(settings.timeout, "the lease keep-alive", client.lease_keep_alive(lease))
                    .await??;
            // What this lease holds: each key's value and the revision that wrote it.
            let mut written: BTreeMap<String, (String, i64)> = BTreeMap::new();
            let mut tick = tokio::time::interval(settings.lease_ttl / 3);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            desired.mark_changed();
            loop {
                tokio::select! {
                    r = desired.changed() => {
                        if r.is_err() {
                            return Ok(());
                        }
                        let asked = desired.borrow_and_update().clone();
                        if asked.generation == 0 {
                            // Nothing asked yet: an empty write would revoke the earlier run's
                            // rows before this run knows its pods.
                            continue;
                        }
                        if successor_holds(&lease_file, ours) {
                            // The successor wrote its lease before its first key, and revokes
                            // this one once its rows are written: a key it overwrote is not
                            // taken back (it would go with this lease's revoke).
                            return Ok(());
                        }
                        let want = desired_keys(&settings.prefix, &asked.rows, &mut told, &source);
                        // A key of this lease deleted or overwritten by another writer is
                        // written again: the node's rows are its own to keep.
                        for key in source.drifted(&written) {
                            warn!(%key, "etcd: this node's key was deleted or overwritten by another writer; writing it again");
                            written.remove(&key);
                        }
                        sync(&mut client, &settings, lease, &mut written, want).await?;
                        state.keys.store(written.len() as u64, Ordering::Release);
                        state.written.store(asked.generation, Ordering::Release);
                        backoff.reset();
                        if let Some(old) = earlier.take().filter(|&old| old != lease) {
                            // Keys of the old lease this run wrote again are this lease's now.
                            match deadline(settings.timeout, "the revoke", client.lease_revoke(old)).await {
                                Ok(Ok(_)) => info!(lease = format_args!("{old:x}"), "etcd: the previous run's lease revoked"),
                                Ok(Err(e)) => debug!(lease = format_args!("{old:x}"), error = %e, "etcd: the previous run's lease is gone already"),
                                Err(e) => warn!(error = %e, "etcd: the previous run's lease was not revoked; its keys expire with it"),
                            }
                        }
                    }
                    _ = tick.tick() => {
                        deadline(settings.timeout, "the lease renewal", keeper.keep_alive()).await??;
                        let renewed = deadline(settings.timeout, "the lease renewal", renewals.message()).await??;
                        if renewed.is_none_or(|r| r.ttl() <= 0) {
                            return Err(EtcdError::LeaseExpired(lease));
                        }
                    }
                }
            }
        }
        .await;
        if successor_holds(&lease_file, ours) {
            info!(
                "etcd: a later run of this node holds its registration; this run stops registering"
            );
            state.handed_over.store(true, Ordering::Release);
            return;
        }
        match result {
            Ok(()) => return,
            Err(e) => {
                warn!(error = %crate::DisplayChain(&e), "etcd: registration interrupted; this node's rows are written again under a new lease");
                backoff.wait().await;
                desired.mark_changed();
            }
        }
    }
}

/// Whether `lease_file` records a lease other than `ours`, the last this run recorded: a later
/// run of this node (an upgrade's successor) has taken the registration over, and revoked this
/// run's lease once its own rows were written. Granting another lease would take the keys back
/// from the successor, and they would expire when this run exits.
fn successor_holds(lease_file: &Path, ours: Option<i64>) -> bool {
    let Some(ours) = ours else {
        return false;
    };
    std::fs::read_to_string(lease_file)
        .ok()
        .and_then(|t| t.trim().parse::<i64>().ok())
        .is_some_and(|recorded| recorded != ours)
}

/// The keys and values of `rows`; a row refused on write is logged and counted once.
fn desired_keys(
    prefix: &str,
    rows: &[Row],
    told: &mut BTreeMap<(String, String, std::net::IpAddr), &'static str>,
    source: &EtcdSource,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut still = BTreeMap::new();
    for row in rows {
        let id = (row.namespace.clone(), row.service.clone(), row.address);
        match keys::encode(prefix, row) {
            Ok(kvs) => out.extend(kvs),
            Err(refusal) => {
                let reason = refusal.reason();
                if told.get(&id) != Some(&reason) {
                    warn!(namespace = %row.namespace, service = %row.service, address = %row.address,
                        pod = row.pod.as_deref().unwrap_or(""), %refusal,
                        "etcd: row not registered");
                    count(&source.stats().refused_on_write, reason);
                }
                still.insert(id, reason);
            }
        }
    }
    *told = still;
    out
}

/// Makes the store hold `want` under `lease`: puts what differs, deletes what is no longer
/// wanted (only while it is still this lease's: a pod address another node took is left alone).
async fn sync(
    client: &mut Client,
    settings: &EtcdSettings,
    lease: i64,
    written: &mut BTreeMap<String, (String, i64)>,
    want: BTreeMap<String, String>,
) -> Result<(), EtcdError> {
    let puts: Vec<(&String, &String)> = want
        .iter()
        .filter(|(k, v)| written.get(*k).is_none_or(|(held, _)| held != *v))
        .collect();
    for chunk in puts.chunks(TXN_OPS) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|(k, v)| {
                TxnOp::put(
                    k.as_str(),
                    v.as_str(),
                    Some(PutOptions::new().with_lease(lease)),
                )
            })
            .collect();
        let done = deadline(
            settings.timeout,
            "a registration write",
            client.txn(Txn::new().and_then(ops)),
        )
        .await??;
        let revision = done.header().map_or(0, |h| h.revision());
        for (k, v) in chunk {
            written.insert((*k).clone(), ((*v).clone(), revision));
        }
    }
    let gone: Vec<String> = written
        .keys()
        .filter(|k| !want.contains_key(*k))
        .cloned()
        .collect();
    for key in gone {
        let txn = Txn::new()
            .when([Compare::lease(key.as_str(), CompareOp::Equal, lease)])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        deadline(settings.timeout, "a registration delete", client.txn(txn)).await??;
        written.remove(&key);
    }
    Ok(())
}
