//! Route status as aether writes it (spec/routes.md §6), as pure functions: the entries a node
//! wants for one route, how they merge with the entries the route holds, and when a rewrite over
//! another writer may happen.
//!
//! Pure: no IO, no clock (`now` and the wall-clock stamp are arguments). The IO side
//! ([`super`]) reads the route, keeps every other controller's entry byte for byte, and writes
//! what [`merge`] returns.
//!
//! Invariants:
//! - Nodes with the same facts produce equal entries: the entries are sorted by parentRef, the
//!   conditions keep the model's fixed order, and the only per-node value, a condition's
//!   `lastTransitionTime`, changes only when that condition's status changes.
//! - "Nothing changed" ignores `lastTransitionTime`: a write is made only for a difference in
//!   parents, types, statuses, reasons, messages or observed generations.
//! - The recorded PodPortsJudged verdict (routes.md §6.3): where this node could judge nothing
//!   (`Unknown`/`NotChecked`) and the route holds a `True` or `False` verdict for the same
//!   generation, that verdict is kept as a fact, not overwritten.
//! - Rewriting over another writer is bounded (routes.md §6.5, [`Backoff`]); a changed verdict
//!   is never held back by it. A node that follows the registrar's Lease leaves a changed status
//!   to the holder for [`FOLLOWER_GRACE`], so that nodes agreeing on it do not all write it.

use crate::prelude::*;

use std::time::Duration;

use crate::model::attach::RouteStatus;
use crate::model::snapshot::ParentRef;

/// The type of the recorded verdict's condition.
pub const POD_PORTS_JUDGED: &str = "gateway.aether.io/PodPortsJudged";

/// One condition of one of aether's parent entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cond {
    /// `type`.
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// `reason`.
    pub reason: String,
    /// `message`.
    pub message: String,
    /// `observedGeneration`.
    pub observed_generation: i64,
    /// `lastTransitionTime` (RFC 3339), as read or as stamped.
    pub last_transition: String,
}

impl Cond {
    fn same_facts(&self, other: &Self) -> bool {
        self.type_ == other.type_
            && self.status == other.status
            && self.reason == other.reason
            && self.message == other.message
            && self.observed_generation == other.observed_generation
    }
}

/// One of aether's `RouteParentStatus` entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `parentRef`.
    pub parent: ParentRef,
    /// `conditions`.
    pub conditions: Vec<Cond>,
}

impl Entry {
    fn same_facts(&self, other: &Self) -> bool {
        self.parent == other.parent
            && self.conditions.len() == other.conditions.len()
            && self
                .conditions
                .iter()
                .zip(&other.conditions)
                .all(|(a, b)| a.same_facts(b))
    }
}

/// Whether two entry lists say the same, `lastTransitionTime` aside.
pub fn same_facts(a: &[Entry], b: &[Entry]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same_facts(y))
}

/// The entries the model wants for one route (its [`RouteStatus`] values, one per parentRef),
/// sorted by parentRef, with `stamp` as every condition's transition time.
pub fn wanted<'a>(statuses: impl IntoIterator<Item = &'a RouteStatus>, stamp: &str) -> Vec<Entry> {
    let mut out: Vec<Entry> = statuses
        .into_iter()
        .filter_map(|s| {
            let parent = s.parent_ref.clone()?;
            Some(Entry {
                parent,
                conditions: s
                    .conditions
                    .iter()
                    .map(|c| Cond {
                        type_: c.type_.clone(),
                        status: c.status.clone(),
                        reason: c.reason.clone(),
                        message: c.message.clone(),
                        observed_generation: s.generation,
                        last_transition: stamp.to_owned(),
                    })
                    .collect(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.parent.cmp(&b.parent));
    out.dedup_by(|a, b| a.parent == b.parent);
    out
}

/// aether's entries after this node's reconcile: `wanted` with the transition times and the
/// recorded verdicts that `current` (aether's entries the route holds now) keeps.
pub fn merge(current: &[Entry], wanted: Vec<Entry>) -> Vec<Entry> {
    wanted
        .into_iter()
        .map(|mut entry| {
            let Some(held) = current.iter().find(|c| c.parent == entry.parent) else {
                return entry;
            };
            for cond in &mut entry.conditions {
                let Some(old) = held.conditions.iter().find(|c| c.type_ == cond.type_) else {
                    continue;
                };
                let recorded = cond.type_ == POD_PORTS_JUDGED
                    && cond.status == "Unknown"
                    && (old.status == "True" || old.status == "False")
                    && old.observed_generation == cond.observed_generation;
                if recorded {
                    *cond = old.clone();
                } else if old.status == cond.status {
                    cond.last_transition.clone_from(&old.last_transition);
                }
            }
            entry
        })
        .collect()
}

/// The first rewrite over another writer is made at once; then no sooner than this after the
/// previous write, doubling each time (routes.md §6.5).
pub const BACKOFF_FIRST: Duration = Duration::from_secs(5);
/// The longest wait between rewrites over another writer.
pub const BACKOFF_CAP: Duration = Duration::from_secs(300);

/// How long a node that follows the registrar's Lease leaves a changed status to the holder
/// before writing it itself (issue #36 item 3). Nodes with the same facts write the same
/// entries (routes.md §6.1), so after the holder's write every follower's watch shows the route
/// settled and nothing more is written: one write per change where every node wrote (one `200`
/// and the rest `409`). A follower whose entries differ from the holder's writes them this much
/// later, and writes at once when no holder is known.
pub const FOLLOWER_GRACE: Duration = Duration::from_secs(2);

/// What to do with one route now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// The route holds what this node wants: nothing to write.
    Settled,
    /// Write now.
    Write,
    /// Another writer replaced this node's unchanged entries: write again no sooner than this.
    Wait(Duration),
    /// A changed status left to the Lease holder: write it no sooner than this
    /// ([`FOLLOWER_GRACE`]), if the route does not hold it by then.
    Defer(Duration),
}

/// One node's rewrites of one route (routes.md §6.5), counted per route.
#[derive(Clone, Debug, Default)]
pub struct Backoff {
    /// What this node last wrote, and when.
    last: Option<(Vec<Entry>, Duration)>,
    /// Rewrites of an unchanged verdict made since it last changed.
    restores: u32,
    /// A changed status this node, following, left to the holder, and since when.
    deferred: Option<(Vec<Entry>, Duration)>,
}

impl Backoff {
    /// Decide at `now` whether to write `want`, given what the route holds (`held`) and whether
    /// another node holds the registrar's Lease (`follows`).
    pub fn turn(&mut self, now: Duration, want: &[Entry], held: &[Entry], follows: bool) -> Turn {
        if same_facts(want, held) {
            self.deferred = None;
            return Turn::Settled;
        }
        let changed = self
            .last
            .as_ref()
            .is_none_or(|(last, _)| !same_facts(last, want));
        if changed {
            // A changed verdict is never held back by the rewrite back-off; a follower leaves
            // it to the holder for FOLLOWER_GRACE.
            if !follows {
                return Turn::Write;
            }
            let since = match &self.deferred {
                Some((deferred, since)) if same_facts(deferred, want) => *since,
                _ => {
                    self.deferred = Some((want.to_vec(), now));
                    now
                }
            };
            let due = since + FOLLOWER_GRACE;
            return if now >= due {
                Turn::Write
            } else {
                Turn::Defer(due)
            };
        }
        let Some((_, at)) = &self.last else {
            return Turn::Write;
        };
        if self.restores == 0 {
            return Turn::Write;
        }
        let wait = BACKOFF_FIRST
            .saturating_mul(1 << (self.restores - 1).min(16))
            .min(BACKOFF_CAP);
        let due = *at + wait;
        if now >= due {
            Turn::Write
        } else {
            Turn::Wait(due)
        }
    }

    /// `written` was written at `now`.
    pub fn wrote(&mut self, now: Duration, written: Vec<Entry>) {
        let unchanged = self
            .last
            .as_ref()
            .is_some_and(|(last, _)| same_facts(last, &written));
        self.restores = if unchanged { self.restores + 1 } else { 0 };
        self.last = Some((written, now));
        self.deferred = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::snapshot::ObjectRef;

    fn parent(name: &str, port: Option<u16>) -> ParentRef {
        ParentRef {
            target: ObjectRef {
                group: String::new(),
                kind: "Service".into(),
                namespace: None,
                name: name.into(),
            },
            port,
            section_name: None,
        }
    }

    fn cond(type_: &str, status: &str, reason: &str, generation: i64, at: &str) -> Cond {
        Cond {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: generation,
            last_transition: at.into(),
        }
    }

    fn entry(conds: Vec<Cond>) -> Entry {
        Entry {
            parent: parent("shop", Some(8080)),
            conditions: conds,
        }
    }

    #[test]
    fn an_unchanged_status_keeps_its_transition_time_and_is_the_same_facts() {
        let held = vec![entry(vec![cond("Accepted", "True", "Accepted", 2, "T1")])];
        let want = vec![entry(vec![cond("Accepted", "True", "Accepted", 2, "T9")])];
        let merged = merge(&held, want);
        assert_eq!(merged[0].conditions[0].last_transition, "T1");
        assert!(same_facts(&merged, &held));
        assert_eq!(merged, held, "byte-identical to what the route holds");
    }

    #[test]
    fn a_changed_status_takes_the_new_transition_time() {
        let held = vec![entry(vec![cond(
            "ResolvedRefs",
            "True",
            "ResolvedRefs",
            2,
            "T1",
        )])];
        let want = vec![entry(vec![cond(
            "ResolvedRefs",
            "False",
            "BackendNotFound",
            2,
            "T9",
        )])];
        let merged = merge(&held, want);
        assert_eq!(merged[0].conditions[0].last_transition, "T9");
        assert!(!same_facts(&merged, &held));
    }

    #[test]
    fn a_new_reason_with_the_same_status_is_a_change_but_keeps_the_time() {
        let held = vec![entry(vec![cond(
            "Accepted",
            "False",
            "NoMatchingParent",
            2,
            "T1",
        )])];
        let want = vec![entry(vec![cond(
            "Accepted",
            "False",
            "NotAllowedByListeners",
            2,
            "T9",
        )])];
        let merged = merge(&held, want);
        assert_eq!(merged[0].conditions[0].last_transition, "T1");
        assert!(!same_facts(&merged, &held));
    }

    #[test]
    fn a_recorded_verdict_is_kept_where_this_node_judged_nothing() {
        let recorded = cond(POD_PORTS_JUDGED, "False", "PodPortNotHTTP", 3, "T1");
        let held = vec![entry(vec![recorded.clone()])];
        let want = vec![entry(vec![cond(
            POD_PORTS_JUDGED,
            "Unknown",
            "NotChecked",
            3,
            "T9",
        )])];
        assert_eq!(merge(&held, want)[0].conditions[0], recorded);
        // Not for another generation of the route.
        let want = vec![entry(vec![cond(
            POD_PORTS_JUDGED,
            "Unknown",
            "NotChecked",
            4,
            "T9",
        )])];
        assert_eq!(merge(&held, want)[0].conditions[0].status, "Unknown");
    }

    #[test]
    fn a_node_with_the_facts_prevails_over_a_recorded_verdict() {
        let held = vec![entry(vec![cond(
            POD_PORTS_JUDGED,
            "False",
            "PodPortNotHTTP",
            3,
            "T1",
        )])];
        let want = vec![entry(vec![cond(
            POD_PORTS_JUDGED,
            "True",
            "PodPortsHTTP",
            3,
            "T9",
        )])];
        assert_eq!(merge(&held, want)[0].conditions[0].status, "True");
    }

    #[test]
    fn an_entry_for_a_parent_no_longer_wanted_is_dropped() {
        let mut other = entry(vec![cond("Accepted", "True", "Accepted", 1, "T1")]);
        other.parent = parent("gone", None);
        let keep = entry(vec![cond("Accepted", "True", "Accepted", 1, "T1")]);
        let merged = merge(&[other, keep.clone()], vec![keep.clone()]);
        assert_eq!(merged, vec![keep]);
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_settled_route_is_not_written() {
        let want = vec![entry(vec![cond("Accepted", "True", "Accepted", 1, "T1")])];
        assert_eq!(
            Backoff::default().turn(S(0), &want, &want, false),
            Turn::Settled
        );
    }

    #[test]
    fn an_overwritten_entry_is_restored_once_at_once_then_after_5_10_20_s_up_to_5_min() {
        let want = vec![entry(vec![cond("Accepted", "True", "Accepted", 1, "T1")])];
        let theirs = vec![entry(vec![cond("Accepted", "False", "Other", 1, "T2")])];
        let mut b = Backoff::default();
        // The first write.
        assert_eq!(b.turn(S(0), &want, &[], false), Turn::Write);
        b.wrote(S(0), want.clone());
        // Overwritten at t=1: restored at once.
        assert_eq!(b.turn(S(1), &want, &theirs, false), Turn::Write);
        b.wrote(S(1), want.clone());
        // Overwritten again: no sooner than 5 s after the previous write.
        assert_eq!(b.turn(S(2), &want, &theirs, false), Turn::Wait(S(6)));
        assert_eq!(b.turn(S(6), &want, &theirs, false), Turn::Write);
        b.wrote(S(6), want.clone());
        assert_eq!(b.turn(S(7), &want, &theirs, false), Turn::Wait(S(16)));
        b.wrote(S(16), want.clone());
        assert_eq!(b.turn(S(17), &want, &theirs, false), Turn::Wait(S(36)));
        // Writes in the first minute: 0, 1, 6, 16, 36 — five, as routes.md §6.5 bounds.
        b.wrote(S(36), want.clone());
        let mut at = S(36);
        for _ in 0..10 {
            let Turn::Wait(due) = b.turn(at, &want, &theirs, false) else {
                panic!("expected a wait");
            };
            assert!(due - at <= BACKOFF_CAP);
            at = due;
            b.wrote(at, want.clone());
        }
        assert_eq!(
            b.turn(at, &want, &theirs, false),
            Turn::Wait(at + BACKOFF_CAP)
        );
    }

    #[test]
    fn a_follower_leaves_a_changed_status_to_the_holder_and_writes_it_after_the_grace() {
        let old = vec![entry(vec![cond("Accepted", "True", "Accepted", 1, "T1")])];
        let want = vec![entry(vec![cond("Accepted", "True", "Accepted", 2, "T1")])];
        let mut b = Backoff::default();
        let due = S(10) + FOLLOWER_GRACE;
        assert_eq!(b.turn(S(10), &want, &old, true), Turn::Defer(due));
        // Counted from when it was first seen, not restarted by each look.
        assert_eq!(b.turn(S(11), &want, &old, true), Turn::Defer(due));
        // The holder wrote the same entries: settled, nothing written.
        assert_eq!(b.turn(S(11), &want, &want, true), Turn::Settled);
        // Another change the holder does not write: written once the grace is over.
        let next = vec![entry(vec![cond("Accepted", "True", "Accepted", 3, "T1")])];
        let due = S(20) + FOLLOWER_GRACE;
        assert_eq!(b.turn(S(20), &next, &want, true), Turn::Defer(due));
        assert_eq!(b.turn(due, &next, &want, true), Turn::Write);
        b.wrote(due, next.clone());
        // With no holder known, a changed status is written at once.
        let last = vec![entry(vec![cond("Accepted", "True", "Accepted", 4, "T1")])];
        assert_eq!(b.turn(S(30), &last, &next, false), Turn::Write);
        // A follower's rewrite over another writer keeps routes.md §6.5's rule: once at once.
        let theirs = vec![entry(vec![cond("Accepted", "False", "Other", 3, "T2")])];
        assert_eq!(b.turn(S(31), &next, &theirs, true), Turn::Write);
    }

    #[test]
    fn a_changed_verdict_is_never_delayed() {
        let want = vec![entry(vec![cond("Accepted", "True", "Accepted", 1, "T1")])];
        let theirs = vec![entry(vec![cond("Accepted", "False", "Other", 1, "T2")])];
        let mut b = Backoff::default();
        b.wrote(S(0), want.clone());
        b.wrote(S(1), want.clone());
        b.wrote(S(6), want);
        let changed = vec![entry(vec![cond(
            "Accepted",
            "False",
            "NoMatchingParent",
            2,
            "T3",
        )])];
        assert_eq!(b.turn(S(7), &changed, &theirs, false), Turn::Write);
        b.wrote(S(7), changed.clone());
        // And the back-off starts over for it.
        assert_eq!(b.turn(S(8), &changed, &theirs, false), Turn::Write);
    }
}
