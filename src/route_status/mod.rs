//! The route-status writer (spec/routes.md §6; issue #9 §3): every node writes aether's
//! `RouteParentStatus` entries of every route its model holds.
//!
//! Layer 2 (IO). [`merge`] is the pure part (the entries, the merge, the back-off). [`run`] is
//! the task: with each published model it compares, route by route, what the model wants with
//! what the watch holds, and writes where they differ:
//! - `status.parents` is an atomic list: the route is read fresh, every entry of another
//!   controller is kept byte for byte and in its place, only aether's entries are replaced;
//! - the write is a `PUT …/status` with the resourceVersion read as its precondition; on `409`
//!   the route is read again and merged again (at most [`CONFLICT_RETRIES`] times, then the next
//!   reconcile tries again);
//! - nothing is written when nothing changed, `lastTransitionTime` aside;
//! - rewriting over another writer is bounded by [`merge::Backoff`] (routes.md §6.5);
//! - a node that follows the registrar's Lease leaves a changed status to the holder for
//!   [`merge::FOLLOWER_GRACE`] and writes it only if the route does not hold it by then: nodes
//!   with the same facts write the same entries, so a change costs one write, not one per node
//!   (a `200` and the rest `409`).

pub use aether_core::route_status::merge;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gateway_api::experimental::grpcroutes::GrpcRoute;
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::experimental::tcproutes::TcpRoute;
use gateway_api::experimental::tlsroutes::TlsRoute;
use gateway_api::experimental::udproutes::UdpRoute;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::model::attach::RouteStatus;
use crate::model::snapshot::{ObjectRef, ParentRef};
use merge::{Backoff, Cond, Entry, Turn};
use prometheus_client::metrics::counter::Counter;

/// aether's controller name in `RouteParentStatus.controllerName`.
pub const CONTROLLER_NAME: &str = "gateway.aether.io/mesh-controller";

/// How often a write that met a `409` is read, merged and tried again before it is left to the
/// next reconcile.
pub const CONFLICT_RETRIES: usize = 3;

/// A route: its kind, namespace and name.
pub type RouteKey = (String, String, String);

/// What one route holds now, as the watch has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldRoute {
    /// aether's entries in its `status.parents`.
    pub ours: Vec<Entry>,
}

/// What the writer works from, made with each published model.
#[derive(Clone, Debug, Default)]
pub struct StatusInput {
    /// The model's status entries ([`crate::model::Model::route_statuses`]).
    pub statuses: Vec<RouteStatus>,
    /// Every route the watch holds, by (kind, namespace, name).
    pub held: BTreeMap<RouteKey, HeldRoute>,
}

/// A status write failed.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The route's kind is not one aether writes status for.
    #[error("no status is written for kind {0}")]
    UnknownKind(String),
    /// The API server refused or failed the request.
    #[error("{verb} {kind} {namespace}/{name}")]
    Api {
        /// `read` or `write status`.
        verb: &'static str,
        /// The route's kind.
        kind: String,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Every try met a `409`.
    #[error(
        "{kind} {namespace}/{name}: the route changed under every one of {CONFLICT_RETRIES} writes"
    )]
    Conflicts {
        /// The route's kind.
        kind: String,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

/// The API resource of a route kind aether writes status for.
pub fn api_resource(kind: &str) -> Option<ApiResource> {
    Some(match kind {
        "HTTPRoute" => ApiResource::erase::<HttpRoute>(&()),
        "GRPCRoute" => ApiResource::erase::<GrpcRoute>(&()),
        "TLSRoute" => ApiResource::erase::<TlsRoute>(&()),
        "TCPRoute" => ApiResource::erase::<TcpRoute>(&()),
        "UDPRoute" => ApiResource::erase::<UdpRoute>(&()),
        _ => return None,
    })
}

/// Every route the stores hold, with aether's entries of its status.
pub fn held_routes(
    objects: &crate::registry::kube::objects::Objects,
) -> BTreeMap<RouteKey, HeldRoute> {
    fn add<R: serde::Serialize>(
        out: &mut BTreeMap<RouteKey, HeldRoute>,
        kind: &str,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        status: Option<&R>,
    ) {
        let status = status.and_then(|s| serde_json::to_value(s).ok());
        out.insert(
            (
                kind.to_owned(),
                meta.namespace.clone().unwrap_or_default(),
                meta.name.clone().unwrap_or_default(),
            ),
            HeldRoute {
                ours: ours_of(status.as_ref()),
            },
        );
    }
    let mut out = BTreeMap::new();
    for r in &objects.http_routes {
        add(&mut out, "HTTPRoute", &r.metadata, r.status.as_ref());
    }
    for r in &objects.grpc_routes {
        add(&mut out, "GRPCRoute", &r.metadata, r.status.as_ref());
    }
    for r in &objects.tls_routes {
        add(&mut out, "TLSRoute", &r.metadata, r.status.as_ref());
    }
    for r in &objects.tcp_routes {
        add(&mut out, "TCPRoute", &r.metadata, r.status.as_ref());
    }
    for r in &objects.udp_routes {
        add(&mut out, "UDPRoute", &r.metadata, r.status.as_ref());
    }
    out
}

/// aether's entries of a route's `status` (as JSON), in the order they stand.
pub fn ours_of(status: Option<&Value>) -> Vec<Entry> {
    parents(status)
        .iter()
        .filter(|p| is_ours(p))
        .filter_map(parse_entry)
        .collect()
}

fn parents(status: Option<&Value>) -> Vec<Value> {
    status
        .and_then(|s| s.get("parents"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn is_ours(parent: &Value) -> bool {
    parent.get("controllerName").and_then(Value::as_str) == Some(CONTROLLER_NAME)
}

fn parse_entry(v: &Value) -> Option<Entry> {
    let p = v.get("parentRef")?;
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let parent = ParentRef {
        target: ObjectRef {
            group: s(p, "group").unwrap_or_default(),
            kind: s(p, "kind").unwrap_or_default(),
            namespace: s(p, "namespace"),
            name: s(p, "name")?,
        },
        port: p
            .get("port")
            .and_then(Value::as_u64)
            .and_then(|n| u16::try_from(n).ok()),
        section_name: s(p, "sectionName"),
    };
    let conditions = v
        .get("conditions")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .map(|c| Cond {
                    type_: s(c, "type").unwrap_or_default(),
                    status: s(c, "status").unwrap_or_default(),
                    reason: s(c, "reason").unwrap_or_default(),
                    message: s(c, "message").unwrap_or_default(),
                    observed_generation: c
                        .get("observedGeneration")
                        .and_then(Value::as_i64)
                        .unwrap_or(0),
                    last_transition: s(c, "lastTransitionTime").unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Entry { parent, conditions })
}

/// An entry as JSON, the parentRef as the route wrote it.
pub fn render_entry(e: &Entry) -> Value {
    let mut parent = json!({
        "group": e.parent.target.group,
        "kind": e.parent.target.kind,
        "name": e.parent.target.name,
    });
    if let Some(ns) = &e.parent.target.namespace {
        parent["namespace"] = json!(ns);
    }
    if let Some(port) = e.parent.port {
        parent["port"] = json!(port);
    }
    if let Some(section) = &e.parent.section_name {
        parent["sectionName"] = json!(section);
    }
    json!({
        "parentRef": parent,
        "controllerName": CONTROLLER_NAME,
        "conditions": e.conditions.iter().map(|c| json!({
            "type": c.type_,
            "status": c.status,
            "reason": c.reason,
            "message": c.message,
            "observedGeneration": c.observed_generation,
            "lastTransitionTime": c.last_transition,
        })).collect::<Vec<_>>(),
    })
}

/// `status.parents` with aether's entries replaced by `ours`: every other controller's entry
/// kept where it stands, aether's first entry's place taken by `ours` (or the end).
pub fn replace_ours(current: &[Value], ours: &[Entry]) -> Vec<Value> {
    let mut out = Vec::with_capacity(current.len() + ours.len());
    let mut placed = false;
    for p in current {
        if is_ours(p) {
            if !placed {
                out.extend(ours.iter().map(render_entry));
                placed = true;
            }
        } else {
            out.push(p.clone());
        }
    }
    if !placed {
        out.extend(ours.iter().map(render_entry));
    }
    out
}

/// The wall clock as RFC 3339 in whole seconds (`metav1.Time`).
fn stamp() -> String {
    crate::time::rfc3339_seconds()
}

/// Run the writer until the input's sender goes away; `pending` says whether a write for the
/// latest input is still to be made (for `/model`); `follows` whether another daemon holds the
/// registrar's Lease now ([`crate::registrar::RegistrarState::follows`]).
pub async fn run(
    client: Client,
    mut input: watch::Receiver<Arc<StatusInput>>,
    pending: Arc<AtomicBool>,
    follows: impl Fn() -> bool,
    stats: Arc<RouteStatusStats>,
) {
    // tokio's clock: the one a test pauses and advances (no waiting for a lease to lapse).
    let origin = tokio::time::Instant::now();
    let elapsed = move || tokio::time::Instant::now().saturating_duration_since(origin);
    let mut backoffs: BTreeMap<RouteKey, Backoff> = BTreeMap::new();
    // The input each route was last written for: not written again before the watch brings
    // the write back (a new input).
    let mut written_for: BTreeMap<RouteKey, Arc<StatusInput>> = BTreeMap::new();
    let mut waiting: BTreeSet<RouteKey> = BTreeSet::new();
    // Routes whose changed status is left to the Lease holder (counted once each time).
    let mut deferred: BTreeSet<RouteKey> = BTreeSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = input.changed() => if changed.is_err() { return },
        }
        let current = input.borrow_and_update().clone();
        let mut wanted: BTreeMap<RouteKey, Vec<&RouteStatus>> = BTreeMap::new();
        for s in &current.statuses {
            wanted
                .entry((s.kind.clone(), s.namespace.clone(), s.name.clone()))
                .or_default()
                .push(s);
        }
        // Routes the model holds, and routes that still carry an entry of aether's.
        let keys: BTreeSet<RouteKey> = wanted
            .keys()
            .cloned()
            .chain(
                current
                    .held
                    .iter()
                    .filter(|(_, h)| !h.ours.is_empty())
                    .map(|(k, _)| k.clone()),
            )
            .collect();
        let now_stamp = stamp();
        let follows = follows();
        let mut left = false;
        for key in keys {
            // Only routes the watch holds: a route deleted since is not written.
            let Some(held) = current.held.get(&key) else {
                continue;
            };
            if written_for
                .get(&key)
                .is_some_and(|w| Arc::ptr_eq(w, &current))
            {
                left = true;
                continue;
            }
            let statuses = wanted.get(&key).map(Vec::as_slice).unwrap_or_default();
            let want = merge::merge(
                &held.ours,
                merge::wanted(statuses.iter().copied(), &now_stamp),
            );
            let backoff = backoffs.entry(key.clone()).or_default();
            match backoff.turn(elapsed(), &want, &held.ours, follows) {
                Turn::Settled => {
                    waiting.remove(&key);
                    deferred.remove(&key);
                }
                Turn::Defer(_) => {
                    left = true;
                    if deferred.insert(key.clone()) {
                        stats.deferred.inc();
                        debug!(kind = %key.0, namespace = %key.1, name = %key.2, "route status change left to the registrar's lease holder");
                    }
                }
                Turn::Wait(_) => {
                    if waiting.insert(key.clone()) {
                        stats.backoffs.inc();
                        debug!(kind = %key.0, namespace = %key.1, name = %key.2, "route status overwritten by another writer; rewrite backed off");
                    }
                }
                Turn::Write => {
                    waiting.remove(&key);
                    deferred.remove(&key);
                    match write(&client, &key, statuses, &now_stamp, &stats.conflicts).await {
                        Ok(Some(written)) => {
                            stats.writes.inc();
                            backoff.wrote(elapsed(), written);
                            written_for.insert(key.clone(), current.clone());
                            left = true;
                            info!(kind = %key.0, namespace = %key.1, name = %key.2, "route status written");
                        }
                        Ok(None) => {
                            written_for.insert(key.clone(), current.clone());
                        }
                        Err(e) => {
                            stats.write_errors.inc();
                            left = true;
                            warn!(error = %crate::DisplayChain(&e), "route status write failed; retried");
                        }
                    }
                }
            }
        }
        backoffs.retain(|k, _| current.held.contains_key(k));
        written_for.retain(|k, _| current.held.contains_key(k));
        deferred.retain(|k| current.held.contains_key(k));
        pending.store(left, Ordering::Release);
    }
}

/// Read the route fresh, merge aether's entries into it and write its status, retrying on a
/// conflict. The entries written, or `None` when the route already held them.
async fn write(
    client: &Client,
    key: &RouteKey,
    statuses: &[&RouteStatus],
    now_stamp: &str,
    conflicts: &crate::proxy::Counter,
) -> Result<Option<Vec<Entry>>, StatusError> {
    let (kind, namespace, name) = key;
    let ar = api_resource(kind).ok_or_else(|| StatusError::UnknownKind(kind.clone()))?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
    let api_err = |verb| {
        move |source| StatusError::Api {
            verb,
            kind: kind.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        }
    };
    for _ in 0..CONFLICT_RETRIES {
        let mut route = api.get(name).await.map_err(api_err("read"))?;
        let status = route.data.get("status");
        let held = ours_of(status);
        let want = merge::merge(&held, merge::wanted(statuses.iter().copied(), now_stamp));
        if merge::same_facts(&want, &held) {
            return Ok(None);
        }
        let parents = replace_ours(&parents(status), &want);
        match route.data.get_mut("status") {
            Some(Value::Object(s)) => {
                s.insert("parents".into(), Value::Array(parents));
            }
            _ => route.data["status"] = json!({ "parents": parents }),
        }
        match api
            .replace_status(name, &PostParams::default(), &route)
            .await
        {
            Ok(_) => return Ok(Some(want)),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                conflicts.inc();
                debug!(%kind, %namespace, %name, "route status write conflicted; reading again");
            }
            Err(e) => return Err(api_err("write status")(e)),
        }
    }
    Err(StatusError::Conflicts {
        kind: kind.clone(),
        namespace: namespace.clone(),
        name: name.clone(),
    })
}

/// The route status writer's counters, exported on the node's `/metrics`.
#[derive(Debug, Default)]
pub struct RouteStatusStats {
    /// Route status writes made (`aether_route_status_writes_total`).
    pub writes: Counter,
    /// Route status writes that failed (after [`crate::route_status::CONFLICT_RETRIES`]
    /// conflicts, or any other error); each is retried
    /// (`aether_route_status_write_errors_total`).
    pub write_errors: Counter,
    /// Route status writes held back because another writer keeps overwriting aether's entry
    /// (spec/routes.md §6.5) (`aether_route_status_backoffs_total`).
    pub backoffs: Counter,
    /// Route status PUTs the API server answered `409` (another writer changed the route since
    /// it was read); each is read again and retried (`aether_route_status_conflicts_total`).
    pub conflicts: Counter,
    /// Changed route statuses this daemon, following the registrar's Lease, left to the holder
    /// first (issue #36 item 3) (`aether_route_status_deferred_total`).
    pub deferred: Counter,
}

impl RouteStatusStats {
    /// Registers the counters under their metric names.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "aether_route_status_writes",
            "Route status writes this daemon made",
            self.writes.clone(),
        );
        registry.register(
            "aether_route_status_write_errors",
            "Route status writes that failed (retried)",
            self.write_errors.clone(),
        );
        registry.register(
            "aether_route_status_backoffs",
            "Route status rewrites held back: another writer keeps overwriting aether's entry",
            self.backoffs.clone(),
        );
        registry.register(
            "aether_route_status_conflicts",
            "Route status PUTs answered 409 (read again and retried)",
            self.conflicts.clone(),
        );
        registry.register(
            "aether_route_status_deferred",
            "Changed route statuses left to the registrar's lease holder first",
            self.deferred.clone(),
        );
    }
}

#[cfg(test)]
mod tests;
