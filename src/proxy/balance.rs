//! Endpoint choice (issue #38 part 3; docs/decisions.md, "Endpoint choice"): which pod of a
//! backend a request or connection goes to, and one more try on another pod when the first
//! cannot be reached.
//!
//! - **Power of two choices over in-flight work.** Two distinct endpoints are drawn at random
//!   among those in the choice, and the one with fewer requests or connections in flight (from
//!   this node) wins. A [`Load`] counts one unit in flight and gives it back when dropped: an
//!   HTTP delivery holds it until its response body ends ([`Loaded`]), a relayed byte stream or
//!   a UDP flow for as long as it lives.
//! - **Short ejection.** An endpoint that fails to connect (refused, timed out, unreachable, the
//!   hop's TLS handshake), or refuses a request unprocessed (its daemon sheds load, or its
//!   application refuses connections: the destination then refuses the stream), leaves the choice for [`Limits::ejection`], twice as long for each
//!   ejection in a row, at most [`Limits::ejection_max`]. It returns when the time passes (it is
//!   counted back when a choice next sees it) or when a connect to it succeeds. The last
//!   endpoint of a backend in the choice is never ejected, and a backend whose endpoints are all
//!   out (ejected through other backends) is chosen among as if none were.
//! - **One more try** ([`deliver_to`]): a try that did not reach its endpoint (a connect
//!   failure, or a stream the endpoint refused unprocessed) is made once more on another
//!   endpoint of the same backend, when what was to be sent can be sent again.
//!
//! The weighted choice of a backend (routes.md §4) happens before, in `resolve`: the weights
//! pick the backend, this module the pod within it. A pod-IP dial names one pod (addressing.md
//! §5.1): its backend has one endpoint, so there is nothing to choose, no second try and no
//! ejection (the last is never ejected).
//!
//! State is per node, keyed by endpoint address and pod port, at most [`Limits::max_states`]
//! entries (beyond it an endpoint is chosen without load or ejection, counted); an entry with
//! nothing in flight and no ejection is removed after [`IDLE`]. Time is tokio's clock (std's in
//! the daemon), so a test with a paused clock sees ejections end exactly; the core functions
//! take `now` as an argument.
//!
//! May import: `hop` (to classify its failures), the proxy's shared types, `resolve` types;
//! never `http`, `filters`, `mesh_call` or `outbound`, which import this module.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use dashmap::DashMap;
use http::Response;
use hyper::body::Incoming;
use tokio::time::Instant;

use super::hop::{HopError, SendError};
use super::{Body, Counter, Family, Inputs, PodCtx};
use crate::resolve::decision::Endpoint;

/// An entry with nothing in flight whose ejection (if any) ended this long ago, and that was
/// last chosen this long ago, is removed.
pub const IDLE: Duration = Duration::from_secs(60);

/// How often, at most, a full table is swept for idle entries before an endpoint is left
/// untracked: a table full of busy entries is not swept on every new endpoint.
const FULL_SWEEP_SPACING: Duration = Duration::from_secs(1);

/// The longest doubling of an ejection (2^16 times the base is far past any cap).
const MAX_DOUBLINGS: u32 = 16;

/// The limits of the choice, from the node's settings ([`super::ProxySettings`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// How long an endpoint that failed to connect is out of the choice, the first time
    /// (`endpoint_ejection_ms`, default 5 s).
    pub ejection: Duration,
    /// The longest ejection, however many in a row (`endpoint_ejection_max_ms`, default 30 s).
    pub ejection_max: Duration,
    /// The most endpoints whose load and ejection this node keeps (`endpoint_states_max`,
    /// default 65536).
    pub max_states: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            ejection: Duration::from_secs(5),
            ejection_max: Duration::from_secs(30),
            max_states: 65_536,
        }
    }
}

/// What this node knows of one endpoint.
#[derive(Debug, Default)]
struct State {
    /// Requests and connections to it in flight from this node.
    in_flight: AtomicUsize,
    /// When its ejection ends, in milliseconds after the balancer's epoch; 0: in the choice.
    ejected_until: AtomicU64,
    /// Ejections in a row, with no successful connect between.
    ejections: AtomicU32,
    /// When it was last chosen, in milliseconds after the epoch.
    last_chosen: AtomicU64,
}

/// One unit of an endpoint's load, given back when dropped. An endpoint the node does not track
/// (over [`Limits::max_states`]) gives a `Load` that counts nothing.
#[derive(Debug)]
pub struct Load(Option<Arc<State>>);

impl Load {
    fn new(state: Option<Arc<State>>) -> Self {
        if let Some(s) = &state {
            s.in_flight.fetch_add(1, Ordering::Relaxed);
        }
        Self(state)
    }
}

impl Load {
    /// A load that counts nothing (for a caller whose unit went into the response body).
    pub fn none() -> Self {
        Self(None)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            s.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// One endpoint chosen: its index in the backend's list, and its load while the work lasts.
#[derive(Debug)]
pub struct Chosen {
    /// The endpoint's index in the list it was chosen from.
    pub index: usize,
    /// Its unit of load.
    pub load: Load,
}

/// The choice's counters, on `/metrics` beside the data plane's ([`Counters::register`], called
/// by the admin endpoint).
#[derive(Debug, Default)]
pub struct Counters {
    /// Second tries on another endpoint, by outcome ([`RetryOutcome`]).
    pub retries: Family<[(&'static str, &'static str); 1], Counter>,
    /// Endpoints taken out of the choice after a failed connect.
    pub ejections: Counter,
    /// Ejected endpoints back in the choice (the time passed, or a connect succeeded).
    pub returns: Counter,
    /// Endpoints chosen without load or ejection: the table held `endpoint_states_max`.
    pub untracked: Counter,
}

/// How a second try ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryOutcome {
    /// The other endpoint took the request or connection.
    Ok,
    /// The other endpoint failed too; the client gets what it got before (a 503, a close).
    Failed,
    /// Not tried: the request had left with a body that cannot be sent again.
    NotReplayable,
}

impl RetryOutcome {
    /// Every outcome, for the series that exist from the start.
    pub const ALL: [Self; 3] = [Self::Ok, Self::Failed, Self::NotReplayable];

    /// The `outcome` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::NotReplayable => "not-replayable",
        }
    }
}

impl Counters {
    /// Register the counters (the retries' series exist from the start, so that a rate is
    /// defined before the first retry).
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        for o in RetryOutcome::ALL {
            let _ = self.retries.get_or_create(&[("outcome", o.label())]);
        }
        registry.register(
            "aether_endpoint_retries",
            "Second tries on another endpoint after the first could not be reached, by outcome",
            self.retries.clone(),
        );
        for (name, help, c) in [
            (
                "aether_endpoint_ejections",
                "Endpoints taken out of the choice after a failed connect",
                &self.ejections,
            ),
            (
                "aether_endpoint_returns",
                "Ejected endpoints back in the choice",
                &self.returns,
            ),
            (
                "aether_endpoint_states_over_limit",
                "Endpoints chosen without load or ejection: endpoint_states_max entries were kept",
                &self.untracked,
            ),
        ] {
            registry.register(name, help, c.clone());
        }
    }

    fn retried(&self, outcome: RetryOutcome) {
        self.retries
            .get_or_create(&[("outcome", outcome.label())])
            .inc();
    }
}

/// The node's endpoint choice: load and ejection per endpoint (address, pod port).
#[derive(Debug)]
pub struct Balancer {
    states: DashMap<SocketAddr, Arc<State>>,
    epoch: Instant,
    /// The latest end of any ejection (milliseconds after the epoch). Before it a choice looks
    /// at every endpoint of the backend; after it none is ejected and two lookups suffice.
    ejections_end: AtomicU64,
    /// The last sweep for idle entries (milliseconds after the epoch).
    last_sweep: AtomicU64,
    /// The counters.
    pub counters: Counters,
}

impl Default for Balancer {
    fn default() -> Self {
        Self {
            states: DashMap::new(),
            epoch: Instant::now(),
            ejections_end: AtomicU64::new(0),
            last_sweep: AtomicU64::new(0),
            counters: Counters::default(),
        }
    }
}

/// Milliseconds as a u64 (saturating).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Balancer {
    /// `now` in milliseconds after the epoch, never 0 (0 means "not ejected").
    fn ms(&self, now: Instant) -> u64 {
        millis(now.saturating_duration_since(self.epoch)).saturating_add(1)
    }

    /// Endpoints tracked now.
    pub fn tracked(&self) -> usize {
        self.states.len()
    }

    /// Whether the endpoint at `key` is out of the choice at `now_ms`; an ejection that has
    /// ended is cleared here and counted as a return.
    fn ejected(&self, key: SocketAddr, now_ms: u64) -> bool {
        let Some(state) = self.states.get(&key).map(|s| s.clone()) else {
            return false;
        };
        self.still_ejected(&state, now_ms)
    }

    fn still_ejected(&self, state: &State, now_ms: u64) -> bool {
        let until = state.ejected_until.load(Ordering::SeqCst);
        if until == 0 {
            return false;
        }
        if until > now_ms {
            return true;
        }
        if state
            .ejected_until
            .compare_exchange(until, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.counters.returns.inc();
        }
        false
    }

    /// The state of `key`, made when missing; `None` when the table is full of entries in use.
    /// The caller has chosen it: an ejection still running means every endpoint was out.
    fn state(&self, key: SocketAddr, limits: &Limits, now_ms: u64) -> Option<Arc<State>> {
        if let Some(s) = self.states.get(&key).map(|s| s.clone()) {
            s.last_chosen.store(now_ms, Ordering::Relaxed);
            // An ejection that has ended is cleared (and counted) when a choice sees it.
            self.still_ejected(&s, now_ms);
            return Some(s);
        }
        let last = self.last_sweep.load(Ordering::Relaxed);
        let full = self.states.len() >= limits.max_states;
        let due = if full { FULL_SWEEP_SPACING } else { IDLE };
        if now_ms.saturating_sub(last) >= millis(due)
            && self
                .last_sweep
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.sweep(now_ms);
        }
        if self.states.len() >= limits.max_states {
            self.counters.untracked.inc();
            return None;
        }
        let state = self.states.entry(key).or_default().clone();
        state.last_chosen.store(now_ms, Ordering::Relaxed);
        Some(state)
    }

    /// Remove the entries with nothing in flight, no ejection running, not chosen for [`IDLE`].
    /// O(entries); at most once per [`IDLE`], or per [`FULL_SWEEP_SPACING`] when full.
    fn sweep(&self, now_ms: u64) {
        let idle = millis(IDLE);
        self.states.retain(|_, s| {
            s.in_flight.load(Ordering::Relaxed) > 0
                || s.ejected_until.load(Ordering::SeqCst) > now_ms
                || now_ms.saturating_sub(s.last_chosen.load(Ordering::Relaxed)) < idle
        });
    }

    /// Choose one of `n` endpoints (`key(i)` is the i-th's address and pod port), never
    /// `avoid`: two distinct ones at random among those in the choice, the one with less in
    /// flight. `None` only when nothing is left to choose.
    pub fn choose(
        &self,
        n: usize,
        key: impl Fn(usize) -> SocketAddr,
        avoid: Option<usize>,
        limits: &Limits,
        now: Instant,
    ) -> Option<Chosen> {
        let now_ms = self.ms(now);
        let allowed = |i: usize| Some(i) != avoid;
        let open = (0..n).filter(|i| allowed(*i)).count();
        let (a, b) = if now_ms >= self.ejections_end.load(Ordering::SeqCst) {
            // No ejection runs: draw among every endpoint but `avoid` without looking.
            let at = |r: usize| match avoid {
                Some(v) if r >= v && v < n => r + 1,
                _ => r,
            };
            match open {
                0 => return None,
                1 => (at(0), None),
                _ => {
                    let (i, j) = two_distinct(open);
                    (at(i), Some(at(j)))
                }
            }
        } else {
            let mut candidates: Vec<usize> = (0..n)
                .filter(|i| allowed(*i) && !self.ejected(key(*i), now_ms))
                .collect();
            if candidates.is_empty() {
                // Every one is out (through other backends, or at once): choose as if none were.
                candidates = (0..n).filter(|i| allowed(*i)).collect();
            }
            match candidates.len() {
                0 => return None,
                1 => (candidates[0], None),
                len => {
                    let (i, j) = two_distinct(len);
                    (candidates[i], Some(candidates[j]))
                }
            }
        };
        let first = self.state(key(a), limits, now_ms);
        let Some(b) = b else {
            return Some(Chosen {
                index: a,
                load: Load::new(first),
            });
        };
        let second = self.state(key(b), limits, now_ms);
        let load = |s: &Option<Arc<State>>| {
            s.as_ref()
                .map_or(0, |s| s.in_flight.load(Ordering::Relaxed))
        };
        // Ties go to the first draw, itself random.
        Some(if load(&second) < load(&first) {
            Chosen {
                index: b,
                load: Load::new(second),
            }
        } else {
            Chosen {
                index: a,
                load: Load::new(first),
            }
        })
    }

    /// A connect to the chosen endpoint succeeded: it is in the choice again (counted as a
    /// return if it was out), and its next ejection is the shortest.
    pub fn connected(&self, chosen: &Chosen) {
        if let Some(s) = &chosen.load.0 {
            s.ejections.store(0, Ordering::Relaxed);
            if s.ejected_until.swap(0, Ordering::SeqCst) != 0 {
                self.counters.returns.inc();
            }
        }
    }

    /// A connect to the chosen endpoint (of `n`, `key` as in [`Balancer::choose`]) failed: it
    /// leaves the choice, unless it is the last of the backend in it. Whether it was ejected.
    pub fn failed(
        &self,
        chosen: &Chosen,
        n: usize,
        key: impl Fn(usize) -> SocketAddr,
        limits: &Limits,
        now: Instant,
    ) -> bool {
        let Some(state) = &chosen.load.0 else {
            return false;
        };
        let now_ms = self.ms(now);
        let others_in = |b: &Self| {
            (0..n)
                .filter(|i| *i != chosen.index)
                .any(|i| !b.ejected(key(i), now_ms))
        };
        if !others_in(self) {
            return false;
        }
        let doublings = state.ejections.load(Ordering::Relaxed).min(MAX_DOUBLINGS);
        let lasts = limits
            .ejection
            .saturating_mul(1 << doublings)
            .min(limits.ejection_max);
        let until = now_ms.saturating_add(millis(lasts));
        let before = state.ejected_until.swap(until, Ordering::SeqCst);
        self.ejections_end.fetch_max(until, Ordering::SeqCst);
        // Two endpoints of a backend failing at once must not both leave: checked again once
        // this one is out, and put back if it turned out to be the last.
        if !others_in(self) {
            let _ = state.ejected_until.compare_exchange(
                until,
                before,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            return false;
        }
        if before <= now_ms {
            state.ejections.fetch_add(1, Ordering::Relaxed);
            self.counters.ejections.inc();
        }
        true
    }
}

/// Two distinct indices below `len` (at least 2), at random.
fn two_distinct(len: usize) -> (usize, usize) {
    let i = fastrand::usize(..len);
    let mut j = fastrand::usize(..len - 1);
    if j >= i {
        j += 1;
    }
    (i, j)
}

/// Choose one endpoint of a backend (reached on `pod_port`) with nothing to retry: a UDP flow,
/// which has no connect to fail, holds the [`Chosen::load`] for as long as it lives.
pub fn choose(inputs: &Inputs, endpoints: &[Endpoint], pod_port: u16) -> Option<Chosen> {
    choose_among(inputs, endpoints.len(), |i| {
        SocketAddr::new(endpoints[i].address, pod_port)
    })
}

/// [`choose`] among `n` endpoints known by their address and port (`key(i)`).
pub fn choose_among(
    inputs: &Inputs,
    n: usize,
    key: impl Fn(usize) -> SocketAddr,
) -> Option<Chosen> {
    inputs
        .balance
        .choose(n, key, None, &inputs.settings.balance, Instant::now())
}

/// What one try on an endpoint came to ([`deliver_to`]).
#[derive(Debug)]
pub enum Tried<T, E, R> {
    /// The endpoint took it.
    Done(T),
    /// The connection to the endpoint failed (refused, timed out, unreachable, the hop's TLS
    /// handshake): the endpoint may be ejected. What can go to another endpoint, if anything.
    NotConnected(E, Option<R>),
    /// The endpoint refused it unprocessed (HTTP/2 `REFUSED_STREAM`, or GOAWAY below its
    /// stream) even on a new connection ([`super::hop::Pool::send`]): its daemon sheds load, or
    /// its application refuses connections. It is ejected as for a connect failure. What can go
    /// to another endpoint.
    Refused(E, Option<R>),
    /// It failed after it reached the endpoint: never sent again.
    Failed(E),
}

/// Where [`deliver_to`] got.
#[derive(Debug)]
pub enum Outcome<T, E> {
    /// The endpoint at `index` took it; `load` counts it in flight until dropped.
    Reached {
        /// What the try gave.
        value: T,
        /// The endpoint's index in the backend's list.
        index: usize,
        /// Its unit of load.
        load: Load,
    },
    /// It failed, after one more try on another endpoint where that was possible.
    Failed(E),
    /// The backend has no endpoint.
    NoEndpoint,
}

/// Send `what` to one endpoint of a backend (`endpoints`, reached on `pod_port`) through
/// `attempt` (given the chosen endpoint's index), chosen by [`Balancer::choose`]; a try that did
/// not reach its endpoint is made once more on another endpoint when `attempt` gives back
/// something to send again. Connect failures eject ([`Balancer::failed`]); a successful try
/// brings its endpoint back.
///
/// `attempt` is a closure returning a future, not an async closure: the futures of the proxy
/// must be `Send`, which an async closure's borrowed arguments cannot yet promise.
pub async fn deliver_to<R, T, E, F>(
    inputs: &Inputs,
    endpoints: &[Endpoint],
    pod_port: u16,
    what: R,
    attempt: impl FnMut(usize, R) -> F,
) -> Outcome<T, E>
where
    F: Future<Output = Tried<T, E, R>>,
{
    let key = |i: usize| SocketAddr::new(endpoints[i].address, pod_port);
    deliver_among(inputs, endpoints.len(), key, what, attempt).await
}

/// [`deliver_to`] over `n` endpoints known by their address and port (`key(i)`).
pub async fn deliver_among<R, T, E, F>(
    inputs: &Inputs,
    n: usize,
    key: impl Fn(usize) -> SocketAddr + Copy,
    what: R,
    mut attempt: impl FnMut(usize, R) -> F,
) -> Outcome<T, E>
where
    F: Future<Output = Tried<T, E, R>>,
{
    let b = &inputs.balance;
    let limits = inputs.settings.balance;
    let Some(first) = b.choose(n, key, None, &limits, Instant::now()) else {
        return Outcome::NoEndpoint;
    };
    let (error, again) = match attempt(first.index, what).await {
        Tried::Done(value) => return reached(b, first, value),
        Tried::Failed(e) => return Outcome::Failed(e),
        Tried::NotConnected(e, again) | Tried::Refused(e, again) => {
            b.failed(&first, n, key, &limits, Instant::now());
            (e, again)
        }
    };
    // A pod-IP dial, or a backend of one pod: nothing else to try.
    if n < 2 {
        return Outcome::Failed(error);
    }
    let Some(again) = again else {
        b.counters.retried(RetryOutcome::NotReplayable);
        return Outcome::Failed(error);
    };
    let Some(second) = b.choose(n, key, Some(first.index), &limits, Instant::now()) else {
        return Outcome::Failed(error);
    };
    drop(first);
    match attempt(second.index, again).await {
        Tried::Done(value) => {
            b.counters.retried(RetryOutcome::Ok);
            reached(b, second, value)
        }
        Tried::NotConnected(e, _) | Tried::Refused(e, _) => {
            b.failed(&second, n, key, &limits, Instant::now());
            b.counters.retried(RetryOutcome::Failed);
            Outcome::Failed(e)
        }
        Tried::Failed(e) => {
            b.counters.retried(RetryOutcome::Failed);
            Outcome::Failed(e)
        }
    }
}

fn reached<T, E>(b: &Balancer, chosen: Chosen, value: T) -> Outcome<T, E> {
    b.connected(&chosen);
    Outcome::Reached {
        value,
        index: chosen.index,
        load: chosen.load,
    }
}

/// How a failed hop connect ([`super::hop::connect`]) counts for the choice: a connect
/// failure, after which `again` goes to another endpoint, or a failure never tried again (an
/// invalid server name).
pub fn hop_not_reached<T, E: From<HopError>, R>(e: HopError, again: R) -> Tried<T, E, R> {
    if e.not_connected() {
        Tried::NotConnected(E::from(e), Some(again))
    } else {
        Tried::Failed(E::from(e))
    }
}

/// How a pooled HTTP/2 hop send ([`super::hop::Pool::send`]) counts for the choice: a connect
/// failure, a stream refused unprocessed, or a failure after the request left.
pub fn tried_send(
    sent: Result<Response<Incoming>, SendError>,
) -> Tried<Response<Incoming>, HopError, http::Request<Body>> {
    match sent {
        Ok(resp) => Tried::Done(resp),
        Err(SendError { error, unsent }) if error.not_connected() => {
            Tried::NotConnected(error, unsent)
        }
        Err(SendError {
            error,
            unsent: Some(req),
        }) => Tried::Refused(error, Some(req)),
        Err(SendError {
            error,
            unsent: None,
        }) if error.unprocessed() => Tried::Refused(error, None),
        Err(SendError { error, .. }) => Tried::Failed(error),
    }
}

/// Send an HTTP request over the pooled hop to one endpoint of a backend, with one more try on
/// another when the first is not reached and the request can be sent again ([`deliver_to`]):
/// a request that never left (a connect failure) always can; one refused unprocessed only
/// when it has no body (its head is kept for that, [`super::hop::Pool::send`]). The endpoint's
/// load lasts until the response body ends.
pub async fn send(
    inputs: &Inputs,
    pod: &PodCtx,
    endpoints: &[Endpoint],
    pod_port: u16,
    req: http::Request<Body>,
) -> Outcome<Response<Loaded<Incoming>>, HopError> {
    let outcome = deliver_to(inputs, endpoints, pod_port, req, |i, req| async move {
        tried_send(
            inputs
                .pool
                .send(inputs, pod, &endpoints[i], pod_port, req)
                .await,
        )
    })
    .await;
    match outcome {
        Outcome::Reached { value, index, load } => Outcome::Reached {
            value: value.map(|body| Loaded { body, _load: load }),
            index,
            load: Load::none(),
        },
        Outcome::Failed(e) => Outcome::Failed(e),
        Outcome::NoEndpoint => Outcome::NoEndpoint,
    }
}

/// A response body that keeps its endpoint's load until it ends (or is dropped).
#[derive(Debug)]
pub struct Loaded<B> {
    body: B,
    _load: Load,
}

impl<B: http_body::Body + Unpin> http_body::Body for Loaded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests;
