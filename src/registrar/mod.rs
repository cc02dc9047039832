//! The registrar role on Kubernetes (spec/model.md §8; issue #9 §2): exactly one daemon at a
//! time, elected with the `coordination.k8s.io/v1` Lease `aether-registrar` in the release
//! namespace, writes the generated Services the rows call for.
//!
//! Layer 2 (IO). [`lease`] is the election as a pure state machine (client-go's algorithm, the
//! resourceVersion as the fence, the clock given); [`plan`] is the pure diff of desired against
//! held Services. [`run`] is the task that reads the Lease every retry period, takes or renews
//! it, and while it leads applies the plan:
//! - server-side apply under one field manager ([`FIELD_MANAGER`]), every Service labelled as
//!   aether's; deletes only Services carrying both labels, with uid and resourceVersion
//!   preconditions; never a Service it does not own;
//! - [`lease::Elector::is_leader`] is checked before every write, so a leader that lost the Lease
//!   (a `409` on renewal, or no renewal within the renew deadline) stops writing at once;
//! - when the daemon stops (the input's sender goes away) a leader gives the Lease up, fenced by
//!   the resourceVersion it last wrote, so the next leader takes it at once instead of after the
//!   lease duration (client-go's `ReleaseOnCancel`);
//! - a plan is carried out once per input: a write that changed nothing on the server brings no
//!   new input and is not repeated every tick; a failed write is retried on the next tick.

pub mod filter_status;
pub use aether_core::registrar::lease;
pub mod plan;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Service as K8sService;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::model::snapshot::Service;
pub use crate::registry::kube::generated::FIELD_MANAGER;
use lease::{Attempt, Elector, LeaseRecord, LeaseTiming};
use plan::ServiceWrite;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// The Lease's name.
pub const LEASE_NAME: &str = "aether-registrar";

/// Where and as whom the registrar runs.
#[derive(Clone, Debug)]
pub struct RegistrarSettings {
    /// The namespace of the Lease (the release namespace).
    pub namespace: String,
    /// The Lease's name ([`LEASE_NAME`]).
    pub lease_name: String,
    /// This claimant's identity: unique per daemon process (`<node>-<random>`), so that two
    /// daemons of one node during an upgrade are two claimants.
    pub identity: String,
    /// The Lease's timing.
    pub timing: LeaseTiming,
}

/// What the registrar works from, made with each published model: the generated Services the
/// rows call for and every Service the watch holds.
#[derive(Clone, Debug, Default)]
pub struct RegistrarInput {
    /// The desired generated Services ([`crate::model::registrar::generated_services_except`]).
    pub desired: Vec<Service>,
    /// Every Service the API server holds, as the watch has them.
    pub existing: Vec<Arc<K8sService>>,
    /// The `Accepted` condition of every MeshFilter ([`filter_status::wanted`]).
    pub filters: Vec<filter_status::Wanted>,
}

/// What the registrar task says of itself, for `/model` and the metrics.
#[derive(Debug, Default)]
pub struct RegistrarState {
    /// This daemon holds the Lease.
    pub leader: AtomicBool,
    /// Another daemon holds the Lease, as last read ([`Elector::follows`]): the route-status
    /// writer lets the holder write a changed status first.
    pub follows: AtomicBool,
    /// This daemon leads and has writes to make for its latest input.
    pub pending: AtomicBool,
    /// Why the Lease can be neither read nor written now (a missing release namespace: every
    /// create answered 404), for `/ready` and `aether debug`; `None` once an election works.
    pub lease_problem: parking_lot::Mutex<Option<LeaseProblem>>,
}

/// The registrar's Lease cannot be taken or followed: no registrar runs from this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseProblem {
    /// `<namespace>/<name>` of the Lease.
    pub lease: String,
    /// The API server's status code, when it answered.
    pub code: Option<u16>,
    /// The error, whole (the log and `aether debug`; `/ready` names the code only).
    pub error: String,
}

impl LeaseProblem {
    /// The line `/ready` shows (no server text: it is served on the node's network).
    pub fn report(&self) -> String {
        let code = self
            .code
            .map_or_else(|| "no answer".to_owned(), |c| format!("HTTP {c}"));
        let hint = if self.code == Some(404) {
            " (does its namespace exist?)"
        } else {
            ""
        };
        format!(
            "registrar: its Lease {} cannot be taken ({code}){hint}: no generated Services or statuses are written while it cannot",
            self.lease
        )
    }
}

impl RegistrarState {
    /// An election failed: remembered, logged when the problem is new or changed (its repeats
    /// are counted, not logged), counted by code.
    fn lease_failed(&self, e: &RegistrarError, lease: String, stats: &RegistrarStats) {
        let RegistrarError::Api { source, .. } = e;
        let code = match source {
            kube::Error::Api(s) => Some(s.code),
            _ => None,
        };
        let problem = LeaseProblem {
            lease,
            code,
            error: crate::DisplayChain(e).to_string(),
        };
        let label = code.map_or_else(|| "none".to_owned(), |c| c.to_string());
        stats.lease_errors.get_or_create(&[("code", label)]).inc();
        let mut held = self.lease_problem.lock();
        if held.as_ref().map(|p| (p.code, &p.error)) != Some((problem.code, &problem.error)) {
            warn!(lease = %problem.lease, error = %problem.error, "the registrar's Lease cannot be taken: no generated Services or statuses are written from this node until it can (aether_registrar_lease_errors_total counts the retries)");
            *held = Some(problem);
        }
    }

    /// An election worked: a problem in course has ended.
    fn lease_worked(&self) {
        if let Some(p) = self.lease_problem.lock().take() {
            info!(lease = %p.lease, "the registrar's Lease can be taken again");
        }
    }
}

/// A Lease or Service request failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistrarError {
    /// The API server refused or failed the request.
    #[error("{verb} {what}")]
    Api {
        /// `read lease`, `apply service`, ...
        verb: &'static str,
        /// `<namespace>/<name>`.
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
}

impl RegistrarError {
    fn is_conflict(&self) -> bool {
        let Self::Api { source, .. } = self;
        matches!(source, kube::Error::Api(s) if s.code == 409)
    }
}

/// Run the registrar until the input's sender goes away; then give the Lease up if this daemon
/// holds it.
pub async fn run(
    client: Client,
    settings: RegistrarSettings,
    mut input: watch::Receiver<Arc<RegistrarInput>>,
    state: Arc<RegistrarState>,
    stats: Arc<RegistrarStats>,
) {
    // tokio's clock: the one a test pauses and advances (no waiting for a lease to lapse).
    let origin = tokio::time::Instant::now();
    let elapsed = move || tokio::time::Instant::now().saturating_duration_since(origin);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    let mut elector: Elector<MicroTime> = Elector::new(settings.identity.clone(), settings.timing);
    let mut tick = tokio::time::interval(settings.timing.retry_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The input whose plan was carried out whole while leading.
    let mut done: Option<Arc<RegistrarInput>> = None;
    let mut was_leader = false;
    // The MeshFilter conditions this leader wrote, for filters whose own status the watch cannot
    // read (they did not decode): each is written once per (generation, condition).
    let mut filters_written: HashMap<(String, String), (Option<i64>, bool, String)> =
        HashMap::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = input.changed() => if changed.is_err() {
                state.leader.store(false, Ordering::Release);
                state.follows.store(false, Ordering::Release);
                state.pending.store(false, Ordering::Release);
                stats.leader.set(0);
                release(&leases, &settings, &mut elector).await;
                return;
            },
        }
        match elect(&leases, &settings, &mut elector, elapsed()).await {
            // Another daemon wrote it first: the contention of an election, not a problem.
            Err(e) if e.is_conflict() => {
                elector.failed(true);
                debug!(error = %crate::DisplayChain(&e), "registrar lease");
            }
            Err(e) => {
                elector.failed(false);
                let lease = format!("{}/{}", settings.namespace, settings.lease_name);
                state.lease_failed(&e, lease, &stats);
            }
            Ok(()) => state.lease_worked(),
        }
        let leader = elector.is_leader(elapsed());
        if leader != was_leader {
            info!(identity = %settings.identity, leader, "registrar lease");
            was_leader = leader;
            done = None;
            filters_written.clear();
        }
        state.leader.store(leader, Ordering::Release);
        state
            .follows
            .store(elector.follows(elapsed()), Ordering::Release);
        stats.leader.set(i64::from(leader));
        let current = input.borrow_and_update().clone();
        if !leader || done.as_ref().is_some_and(|d| Arc::ptr_eq(d, &current)) {
            state.pending.store(false, Ordering::Release);
            continue;
        }
        let writes = plan::plan(&current.desired, &current.existing);
        let filter_writes: Vec<&filter_status::Wanted> = current
            .filters
            .iter()
            .filter(|w| match w.written() {
                Some(held) => !held,
                None => {
                    filters_written.get(&(w.namespace.clone(), w.name.clone()))
                        != Some(&(w.generation, w.accepted, w.message.clone()))
                }
            })
            .collect();
        state.pending.store(
            !writes.is_empty() || !filter_writes.is_empty(),
            Ordering::Release,
        );
        let mut whole = true;
        for w in writes {
            // Fenced: a leader that lost the Lease since the last renewal writes nothing more.
            if !elector.is_leader(elapsed()) {
                warn!("registrar lease lost: remaining writes left to the next leader");
                whole = false;
                break;
            }
            let subject = w.subject();
            match write(&client, w).await {
                Ok(op) => {
                    stats.writes.inc();
                    info!(service = %subject, op, "generated service written");
                }
                Err(e) => {
                    stats.write_errors.inc();
                    warn!(service = %subject, error = %crate::DisplayChain(&e), "generated service write failed; retried");
                    whole = false;
                }
            }
        }
        for w in filter_writes {
            if !elector.is_leader(elapsed()) {
                whole = false;
                break;
            }
            let subject = format!("{}/{}", w.namespace, w.name);
            match write_filter_status(&client, w).await {
                Ok(()) => {
                    stats.writes.inc();
                    filters_written.insert(
                        (w.namespace.clone(), w.name.clone()),
                        (w.generation, w.accepted, w.message.clone()),
                    );
                    info!(filter = %subject, accepted = w.accepted, "meshfilter status written");
                }
                Err(e) => {
                    stats.write_errors.inc();
                    warn!(filter = %subject, error = %crate::DisplayChain(&e), "meshfilter status write failed; retried");
                    whole = false;
                }
            }
        }
        if whole {
            done = Some(current);
        }
    }
}

/// Write one MeshFilter's `Accepted` condition: a merge patch of its `status` subresource
/// (the whole `conditions` list is aether's), through the dynamic API so that an object the
/// typed watch could not decode is written all the same.
async fn write_filter_status(
    client: &Client,
    w: &filter_status::Wanted,
) -> Result<(), RegistrarError> {
    let resource = kube::api::ApiResource {
        group: crate::registry::kube::mesh_filter::MESH_FILTER_GROUP.into(),
        version: "v1alpha1".into(),
        api_version: crate::registry::kube::mesh_filter::MESH_FILTER_API_VERSION.into(),
        kind: crate::registry::kube::mesh_filter::MESH_FILTER_KIND.into(),
        plural: "meshfilters".into(),
    };
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), &w.namespace, &resource);
    api.patch_status(
        &w.name,
        &PatchParams::default(),
        &Patch::Merge(w.patch(&crate::time::rfc3339_seconds())),
    )
    .await
    .map(drop)
    .map_err(|source| RegistrarError::Api {
        verb: "write meshfilter status",
        what: format!("{}/{}", w.namespace, w.name),
        source,
    })
}

/// Read the Lease and take, renew or follow it.
async fn elect(
    leases: &Api<Lease>,
    settings: &RegistrarSettings,
    elector: &mut Elector<MicroTime>,
    now: Duration,
) -> Result<(), RegistrarError> {
    let what = || format!("{}/{}", settings.namespace, settings.lease_name);
    let err = |verb| {
        move |source| RegistrarError::Api {
            verb,
            what: what(),
            source,
        }
    };
    let current = leases
        .get_opt(&settings.lease_name)
        .await
        .map_err(err("read lease"))?;
    let current = current.map(|l| {
        (
            record_of(l.spec.unwrap_or_default()),
            l.metadata.resource_version.unwrap_or_default(),
        )
    });
    let stamp = MicroTime(now_timestamp());
    match elector.attempt(now, stamp, current) {
        Attempt::Follow { holder } => {
            debug!(%holder, "registrar lease held by another daemon");
            Ok(())
        }
        Attempt::Create(record) => {
            let lease = lease_object(settings, &record, None);
            let made = leases
                .create(&PostParams::default(), &lease)
                .await
                .map_err(err("create lease"))?;
            elector.written(
                now,
                record,
                made.metadata.resource_version.unwrap_or_default(),
            );
            Ok(())
        }
        Attempt::Update { record, version } => {
            let lease = lease_object(settings, &record, Some(version));
            let made = leases
                .replace(&settings.lease_name, &PostParams::default(), &lease)
                .await
                .map_err(err("update lease"))?;
            elector.written(
                now,
                record,
                made.metadata.resource_version.unwrap_or_default(),
            );
            Ok(())
        }
    }
}

/// Give the Lease up if the last record this daemon saw is its own (see [`run`]).
async fn release(
    leases: &Api<Lease>,
    settings: &RegistrarSettings,
    elector: &mut Elector<MicroTime>,
) {
    let Some((record, version)) = elector.release(MicroTime(now_timestamp())) else {
        return;
    };
    let lease = lease_object(settings, &record, Some(version));
    match leases
        .replace(&settings.lease_name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => info!(identity = %settings.identity, "registrar lease released"),
        // A 409: another daemon took it since (nothing to give up); anything else: it lapses.
        Err(e) => {
            warn!(error = %crate::DisplayChain(&e), "registrar lease not released; it lapses by itself")
        }
    }
}

fn now_timestamp() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::try_from(crate::time::wall())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

fn record_of(spec: LeaseSpec) -> LeaseRecord<MicroTime> {
    LeaseRecord {
        holder: spec.holder_identity,
        lease_duration_secs: spec.lease_duration_seconds,
        acquire_time: spec.acquire_time,
        renew_time: spec.renew_time,
        transitions: spec.lease_transitions,
    }
}

fn lease_object(
    settings: &RegistrarSettings,
    record: &LeaseRecord<MicroTime>,
    version: Option<String>,
) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(settings.lease_name.clone()),
            namespace: Some(settings.namespace.clone()),
            resource_version: version,
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: record.holder.clone(),
            lease_duration_seconds: record.lease_duration_secs,
            acquire_time: record.acquire_time.clone(),
            renew_time: record.renew_time.clone(),
            lease_transitions: record.transitions,
            ..LeaseSpec::default()
        }),
    }
}

/// Carry out one write; the operation's name.
async fn write(client: &Client, w: ServiceWrite) -> Result<&'static str, RegistrarError> {
    let subject = w.subject();
    match w {
        ServiceWrite::Apply(service) => {
            let ns = service.metadata.namespace.clone().unwrap_or_default();
            let name = service.metadata.name.clone().unwrap_or_default();
            let api: Api<K8sService> = Api::namespaced(client.clone(), &ns);
            api.patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&*service),
            )
            .await
            .map_err(|source| RegistrarError::Api {
                verb: "apply service",
                what: subject,
                source,
            })?;
            Ok("apply")
        }
        ServiceWrite::Delete {
            namespace,
            name,
            uid,
            resource_version,
        } => {
            let api: Api<K8sService> = Api::namespaced(client.clone(), &namespace);
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid,
                    resource_version,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => Ok("delete"),
                // Gone already: what the delete wanted.
                Err(kube::Error::Api(s)) if s.code == 404 => Ok("delete"),
                Err(source) => Err(RegistrarError::Api {
                    verb: "delete service",
                    what: subject,
                    source,
                }),
            }
        }
    }
}

/// The registrar's counters, exported on the node's `/metrics`.
#[derive(Debug, Default)]
pub struct RegistrarStats {
    /// 1 while this daemon holds the registrar Lease, else 0 (`aether_registrar_leader`).
    pub leader: Gauge,
    /// Elections that failed other than by contention (a 409), by the API server's status code
    /// (`none`: no answer); a missing release namespace is `404`
    /// (`aether_registrar_lease_errors_total{code}`).
    pub lease_errors: Family<[(&'static str, String); 1], Counter>,
    /// Generated Services applied or deleted by this daemon as the registrar
    /// (`aether_registrar_writes_total`).
    pub writes: Counter,
    /// Registrar writes the API server refused or failed; each is retried
    /// (`aether_registrar_write_errors_total`).
    pub write_errors: Counter,
}

impl RegistrarStats {
    /// Registers the counters under their metric names.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "aether_registrar_lease_errors",
            "Registrar Lease elections that failed other than by contention, by the API server's status code (none: no answer)",
            self.lease_errors.clone(),
        );
        registry.register(
            "aether_registrar_leader",
            "1 while this daemon holds the registrar Lease and writes the generated Services",
            self.leader.clone(),
        );
        registry.register(
            "aether_registrar_writes",
            "Generated Services applied or deleted by this daemon as the registrar",
            self.writes.clone(),
        );
        registry.register(
            "aether_registrar_write_errors",
            "Registrar writes the API server refused or failed (retried)",
            self.write_errors.clone(),
        );
    }
}

#[cfg(test)]
mod tests;
