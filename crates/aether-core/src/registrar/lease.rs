//! Leader election over a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection`
//! does it, as a pure state machine: the IO side (`run`) reads the Lease, asks
//! [`Elector::attempt`] what to write, writes it with the observed resourceVersion as the
//! precondition and reports the outcome.
//!
//! Pure: no clock, no IO. `now` is a monotonic instant given by the caller as the time since an
//! origin of its choosing; the wall-clock stamps written into the Lease (`acquireTime`,
//! `renewTime`) are opaque values of type `T` the caller makes.
//!
//! The rules (client-go's, which every Kubernetes controller follows):
//! - A Lease held by another identity is free once `leaseDurationSeconds` have passed since this
//!   elector *observed* the record change, by its own clock: the holder's `renewTime` is never
//!   compared with the local clock, so clock skew between nodes cannot hand the Lease over early.
//! - Taking and renewing are writes with the observed resourceVersion as the precondition: of two
//!   claimants that observed the same record, the API server lets exactly one write (the other
//!   gets `409 Conflict`). The resourceVersion is the fence.
//! - A leader stops leading at once on a conflict, and when no renewal succeeded within the renew
//!   deadline ([`Elector::is_leader`] is false from then on), before the Lease could expire for
//!   the others: `renew_deadline` < `lease_duration`.

use crate::prelude::*;

use std::time::Duration;

/// The Lease's timing, client-go's defaults (15 s, 10 s, 2 s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How long a holder's Lease stays valid for the others after they saw it change
    /// (`leaseDurationSeconds`).
    pub lease_duration: Duration,
    /// How long a leader goes on leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often every claimant reads the Lease, and the leader renews it.
    pub retry_period: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// The fields of a Lease's spec the election reads and writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord<T> {
    /// `holderIdentity`; `None` or empty: nobody holds it.
    pub holder: Option<String>,
    /// `leaseDurationSeconds`.
    pub lease_duration_secs: Option<i32>,
    /// `acquireTime`.
    pub acquire_time: Option<T>,
    /// `renewTime`.
    pub renew_time: Option<T>,
    /// `leaseTransitions`.
    pub transitions: Option<i32>,
}

/// What to do after reading the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt<T> {
    /// There is no Lease: create it holding it.
    Create(LeaseRecord<T>),
    /// Take or renew it: replace the spec with `record`, if the Lease is still at `version`.
    Update {
        /// The new spec.
        record: LeaseRecord<T>,
        /// The resourceVersion observed (the precondition of the write).
        version: String,
    },
    /// Another identity holds it and it has not expired: follow.
    Follow {
        /// The holder.
        holder: String,
    },
}

/// One claimant's view of the Lease.
///
/// Protocol, every [`LeaseTiming::retry_period`]:
/// 1. read the Lease (absent, or its record and resourceVersion);
/// 2. [`Elector::attempt`] says whether to create it, update it or follow;
/// 3. after a write, [`Elector::written`] on success, or [`Elector::failed`] with whether it was
///    a conflict;
/// 4. before every write the leader makes in its role, [`Elector::is_leader`].
#[derive(Clone, Debug)]
pub struct Elector<T> {
    identity: String,
    timing: LeaseTiming,
    /// The last record read, its resourceVersion, and when it was first seen so.
    observed: Option<(LeaseRecord<T>, String, Duration)>,
    /// When the last write that made or kept this claimant the holder succeeded.
    renewed_at: Option<Duration>,
}

impl<T: Clone + PartialEq> Elector<T> {
    /// A claimant named `identity` (unique per claimant: the node's name).
    pub fn new(identity: impl Into<String>, timing: LeaseTiming) -> Self {
        Self {
            identity: identity.into(),
            timing,
            observed: None,
            renewed_at: None,
        }
    }

    /// This claimant's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The timing.
    pub fn timing(&self) -> LeaseTiming {
        self.timing
    }

    /// Decide what to write, given the Lease as read at `now` (`None`: it does not exist), its
    /// record and resourceVersion. `stamp` is the wall-clock time to write as `renewTime` (and
    /// `acquireTime` when taking it).
    pub fn attempt(
        &mut self,
        now: Duration,
        stamp: T,
        current: Option<(LeaseRecord<T>, String)>,
    ) -> Attempt<T> {
        let secs = i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some((record, version)) = current else {
            self.observed = None;
            return Attempt::Create(LeaseRecord {
                holder: Some(self.identity.clone()),
                lease_duration_secs: Some(secs),
                acquire_time: Some(stamp.clone()),
                renew_time: Some(stamp),
                transitions: Some(0),
            });
        };
        let seen_at = match &self.observed {
            Some((r, v, at)) if *r == record && *v == version => *at,
            _ => now,
        };
        self.observed = Some((record.clone(), version.clone(), seen_at));
        let holder = record.holder.clone().filter(|h| !h.is_empty());
        if let Some(holder) = holder.as_ref().filter(|h| **h != self.identity)
            && now < self.lapses_at(&record, seen_at)
        {
            self.renewed_at = None;
            return Attempt::Follow {
                holder: holder.clone(),
            };
        }
        let ours = holder.as_deref() == Some(self.identity.as_str());
        let mut next = record;
        if !ours {
            next.acquire_time = Some(stamp.clone());
            next.transitions = Some(next.transitions.unwrap_or(0).saturating_add(1));
        }
        next.holder = Some(self.identity.clone());
        next.lease_duration_secs = Some(secs);
        next.renew_time = Some(stamp);
        Attempt::Update {
            record: next,
            version,
        }
    }

    /// The write [`Elector::attempt`] asked for succeeded at `now` (started then or before):
    /// this claimant holds the Lease, written as `record` at `version`.
    pub fn written(&mut self, now: Duration, record: LeaseRecord<T>, version: String) {
        self.observed = Some((record, version, now));
        self.renewed_at = Some(now);
    }

    /// The write failed. A conflict (`409`: another claimant wrote first) ends leadership at
    /// once; any other failure leaves it to the renew deadline.
    pub fn failed(&mut self, conflict: bool) {
        if conflict {
            self.renewed_at = None;
            self.observed = None;
        }
    }

    /// Give the Lease up (client-go's `ReleaseOnCancel`), when the daemon stops: the record to
    /// write at the resourceVersion this claimant last wrote (the fence: if another took the
    /// Lease since, the write conflicts and changes nothing), or `None` when the last record
    /// seen is not this claimant's. The record names no holder, so the next claimant takes it at
    /// its next read instead of waiting out the lease duration; the transitions are kept.
    /// Leadership ends here, whether the write succeeds or not.
    pub fn release(&mut self, stamp: T) -> Option<(LeaseRecord<T>, String)> {
        self.renewed_at = None;
        let (record, version, _) = self.observed.take()?;
        if record.holder.as_deref() != Some(self.identity.as_str()) {
            return None;
        }
        let released = LeaseRecord {
            holder: None,
            lease_duration_secs: Some(1),
            acquire_time: Some(stamp.clone()),
            renew_time: Some(stamp),
            transitions: record.transitions,
        };
        Some((released, version))
    }

    /// Whether another claimant holds the Lease at `now`, as last read: its record names another
    /// holder and has not lapsed by this claimant's clock (the rule [`Elector::attempt`] follows
    /// by). False when nothing was read, or the last read found no holder.
    pub fn follows(&self, now: Duration) -> bool {
        let Some((record, _, seen_at)) = &self.observed else {
            return false;
        };
        let Some(holder) = record.holder.as_deref().filter(|h| !h.is_empty()) else {
            return false;
        };
        holder != self.identity && now < self.lapses_at(record, *seen_at)
    }

    /// When a Lease whose record was first seen at `seen_at` lapses for this claimant: the
    /// holder's own duration decides, ours if it wrote none.
    fn lapses_at(&self, record: &LeaseRecord<T>, seen_at: Duration) -> Duration {
        let duration = record
            .lease_duration_secs
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.timing.lease_duration, Duration::from_secs);
        seen_at + duration
    }

    /// Whether this claimant may act as the leader at `now`: its last renewal succeeded less
    /// than the renew deadline ago.
    pub fn is_leader(&self, now: Duration) -> bool {
        self.renewed_at
            .is_some_and(|at| now < at + self.timing.renew_deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn held_by(who: &str, stamp: u64) -> LeaseRecord<u64> {
        LeaseRecord {
            holder: Some(who.into()),
            lease_duration_secs: Some(15),
            acquire_time: Some(stamp),
            renew_time: Some(stamp),
            transitions: Some(0),
        }
    }

    #[test]
    fn a_missing_lease_is_created_holding_it() {
        let mut a = Elector::new("node-a", LeaseTiming::default());
        let Attempt::Create(r) = a.attempt(S(0), 100, None) else {
            panic!("expected a create");
        };
        assert_eq!(r.holder.as_deref(), Some("node-a"));
        assert_eq!(r.lease_duration_secs, Some(15));
        assert_eq!((r.acquire_time, r.renew_time), (Some(100), Some(100)));
        assert!(
            !a.is_leader(S(0)),
            "not the leader before the write succeeds"
        );
        a.written(S(0), r, "1".into());
        assert!(a.is_leader(S(1)));
    }

    #[test]
    fn a_lease_held_by_another_is_followed_until_it_lapses_by_the_observers_clock() {
        let mut b = Elector::new("node-b", LeaseTiming::default());
        // First seen at t=100 s: the holder's renewTime (a stamp from another clock) is ignored.
        let lease = Some((held_by("node-a", 0), "7".to_owned()));
        assert_eq!(
            b.attempt(S(100), 999, lease.clone()),
            Attempt::Follow {
                holder: "node-a".into()
            }
        );
        // Unchanged at t=114 s: still valid (15 s from when it was seen).
        assert!(matches!(
            b.attempt(S(114), 999, lease.clone()),
            Attempt::Follow { .. }
        ));
        // At t=115 s it has lapsed: take it, fenced by the version seen.
        let Attempt::Update { record, version } = b.attempt(S(115), 999, lease) else {
            panic!("expected a takeover");
        };
        assert_eq!(version, "7");
        assert_eq!(record.holder.as_deref(), Some("node-b"));
        assert_eq!(record.acquire_time, Some(999));
        assert_eq!(record.transitions, Some(1));
    }

    #[test]
    fn a_claimant_follows_another_holder_until_its_lease_lapses_and_never_itself() {
        let mut b = Elector::new("node-b", LeaseTiming::default());
        assert!(!b.follows(S(0)), "nothing read yet");
        b.attempt(S(100), 999, Some((held_by("node-a", 0), "7".to_owned())));
        assert!(b.follows(S(100)));
        assert!(b.follows(S(114)));
        assert!(!b.follows(S(115)), "lapsed by the observer's clock");
        let mut a = Elector::new("node-a", LeaseTiming::default());
        let Attempt::Create(r) = a.attempt(S(0), 1, None) else {
            panic!("expected a create");
        };
        a.written(S(0), r, "1".into());
        assert!(!a.follows(S(1)), "the holder follows nobody");
        let mut c = Elector::new("node-c", LeaseTiming::default());
        let mut free = held_by("node-a", 0);
        free.holder = None;
        c.attempt(S(0), 1, Some((free, "9".to_owned())));
        assert!(!c.follows(S(0)), "a Lease with no holder");
    }

    #[test]
    fn a_renewed_lease_restarts_the_followers_count() {
        let mut b = Elector::new("node-b", LeaseTiming::default());
        b.attempt(S(0), 1, Some((held_by("node-a", 0), "7".to_owned())));
        // Renewed (a new version) at t=10 s: valid until t=25 s.
        let renewed = Some((held_by("node-a", 10), "8".to_owned()));
        assert!(matches!(
            b.attempt(S(10), 1, renewed.clone()),
            Attempt::Follow { .. }
        ));
        assert!(matches!(
            b.attempt(S(24), 1, renewed.clone()),
            Attempt::Follow { .. }
        ));
        assert!(matches!(
            b.attempt(S(25), 1, renewed),
            Attempt::Update { .. }
        ));
    }

    #[test]
    fn the_holder_renews_keeping_its_acquire_time_and_transitions() {
        let mut a = Elector::new("node-a", LeaseTiming::default());
        let mut mine = held_by("node-a", 5);
        mine.transitions = Some(3);
        let Attempt::Update { record, version } = a.attempt(S(0), 50, Some((mine, "9".into())))
        else {
            panic!("expected a renewal");
        };
        assert_eq!(version, "9");
        assert_eq!(record.acquire_time, Some(5));
        assert_eq!(record.renew_time, Some(50));
        assert_eq!(record.transitions, Some(3));
    }

    #[test]
    fn an_empty_holder_is_free_at_once() {
        let mut b = Elector::new("node-b", LeaseTiming::default());
        let mut released = held_by("", 0);
        released.holder = Some(String::new());
        assert!(matches!(
            b.attempt(S(0), 1, Some((released, "3".into()))),
            Attempt::Update { .. }
        ));
    }

    #[test]
    fn a_release_gives_a_held_lease_up_at_the_version_last_written_and_frees_it_for_the_next() {
        let mut a = Elector::new("node-a", LeaseTiming::default());
        let Attempt::Create(r) = a.attempt(S(1), 1, None) else {
            panic!("not a create")
        };
        a.written(S(1), r, "7".into());
        let (released, version) = a.release(2).expect("the holder releases");
        assert!(!a.is_leader(S(2)));
        assert_eq!(version, "7");
        assert_eq!(released.holder, None);
        assert_eq!(released.lease_duration_secs, Some(1));
        assert_eq!(released.transitions, Some(0));
        // Another claimant that reads the released Lease takes it at once.
        let mut b = Elector::new("node-b", LeaseTiming::default());
        let attempt = b.attempt(S(2), 3, Some((released, "8".into())));
        let Attempt::Update { record, version } = attempt else {
            panic!("{attempt:?}")
        };
        assert_eq!(record.holder.as_deref(), Some("node-b"));
        assert_eq!(record.transitions, Some(1));
        assert_eq!(version, "8");
        // A claimant that only follows has nothing to release.
        let mut c = Elector::new("node-c", LeaseTiming::default());
        let _ = c.attempt(S(2), 3, Some((held_by("node-b", 3), "9".into())));
        assert_eq!(c.release(4), None);
    }

    #[test]
    fn a_conflict_ends_leadership_at_once() {
        let mut a = Elector::new("node-a", LeaseTiming::default());
        a.written(S(0), held_by("node-a", 0), "1".into());
        assert!(a.is_leader(S(2)));
        a.failed(true);
        assert!(!a.is_leader(S(2)));
    }

    #[test]
    fn a_leader_that_cannot_renew_stops_at_the_renew_deadline_before_the_lease_lapses() {
        let t = LeaseTiming::default();
        let mut a = Elector::new("node-a", t);
        a.written(S(0), held_by("node-a", 0), "1".into());
        // Renewals fail without a conflict (the API server is unreachable).
        a.failed(false);
        assert!(a.is_leader(S(9)));
        assert!(!a.is_leader(t.renew_deadline));
        assert!(t.renew_deadline < t.lease_duration);
    }

    #[test]
    fn a_leader_that_sees_another_holder_stops_leading() {
        let mut a = Elector::new("node-a", LeaseTiming::default());
        a.written(S(0), held_by("node-a", 0), "1".into());
        let taken = Some((held_by("node-b", 1), "2".to_owned()));
        assert!(matches!(a.attempt(S(1), 1, taken), Attempt::Follow { .. }));
        assert!(!a.is_leader(S(1)));
    }

    #[test]
    fn two_claimants_that_saw_the_same_free_lease_both_try_with_the_same_fence() {
        // Exactly one write can win: both carry version "4" as the precondition, and the API
        // server accepts only the first (the wire test in `super::tests` checks the 409 path).
        let free = Some((held_by("gone", 0), "4".to_owned()));
        let mut a = Elector::new("node-a", LeaseTiming::default());
        let mut b = Elector::new("node-b", LeaseTiming::default());
        a.attempt(S(0), 0, free.clone());
        b.attempt(S(0), 0, free.clone());
        let va = a.attempt(S(20), 0, free.clone());
        let vb = b.attempt(S(20), 0, free);
        match (va, vb) {
            (Attempt::Update { version: x, .. }, Attempt::Update { version: y, .. }) => {
                assert_eq!((x.as_str(), y.as_str()), ("4", "4"));
            }
            other => panic!("expected two fenced takeovers, got {other:?}"),
        }
    }
}
