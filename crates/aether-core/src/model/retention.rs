//! Retained HTTP entries: grace versus replacement (spec/model.md §10).
//!
//! The retention state is an input of [`crate::model::compile()`], computed by [`advance`] from
//! the previous model's HTTP ports, the previous state, the new snapshot and the time. It is
//! never copied from an earlier compiled model.
//!
//! Layer 0 (pure).

use crate::prelude::*;

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::model::port::{LEGACY_PORT, PROXY_PORT};
use crate::model::rows::row_problem;
use crate::model::snapshot::{RetainedPort, Snapshot};

/// The grace of a retained entry, in milliseconds.
pub const GRACE_MS: u64 = 90_000;

/// The next retention state.
///
/// `previous_http` is every (namespace, service, port) the previous model served as HTTP
/// (from [`crate::model::Model::http_ports`], in any order); `previous` is the previous
/// retention state. The result is sorted by (namespace, service, port).
///
/// Cost: one pass over the rows and, only when some service has lost every row, one over the
/// Services. (It ran on every reload and built sorted maps of every row's ports that it only
/// asked for their keys: 17.9 M instructions a reload at 2,000 services, a quarter of the
/// compile's; docs/performance.md.)
pub fn advance(
    previous_http: &[(&str, &str, u16)],
    previous: &[RetainedPort],
    snapshot: &Snapshot,
    now_ms: u64,
) -> Vec<RetainedPort> {
    // Evidence 1: a service with served rows, under any protocol: its rows are the truth (a
    // normal entry, or a replacement).
    // A source lists one service's rows together, so a row of the service found just before
    // needs no hash (4.80 M -> 3.65 M instructions a call at 2,000 services with the filter
    // below; docs/performance.md).
    let mut with_rows: HashSet<(&str, &str)> = HashSet::with_capacity(snapshot.rows.len());
    let mut last = None;
    for row in &snapshot.rows {
        let k = (row.namespace.as_str(), row.service.as_str());
        if last != Some(k) && !with_rows.contains(&k) && row_problem(row).is_none() {
            with_rows.insert(k);
            last = Some(k);
        }
    }
    let since: BTreeMap<(&str, &str, u16), u64> = previous
        .iter()
        .map(|r| {
            (
                (r.namespace.as_str(), r.service.as_str(), r.port),
                r.since_ms,
            )
        })
        .collect();
    let mut last_asked: Option<((&str, &str), bool)> = None;
    let mut candidates: Vec<(&str, &str, u16)> = previous_http
        .iter()
        .copied()
        .chain(since.keys().copied())
        .filter(|&(ns, svc, _)| {
            // The ports of one service come together: ask once for each run of them.
            let k = (ns, svc);
            if last_asked.is_none_or(|(asked, _)| asked != k) {
                last_asked = Some((k, !with_rows.contains(&k)));
            }
            last_asked.is_some_and(|(_, without)| without)
        })
        .collect();
    if candidates.is_empty() {
        return Vec::new();
    }
    candidates.sort_unstable();
    candidates.dedup();

    // Evidence 2: the generated Service's real ports (the first Service of the name, as listed).
    let mut generated: HashMap<(&str, &str), &crate::model::snapshot::Service> = HashMap::new();
    for s in snapshot.services.iter().filter(|s| s.generated) {
        generated
            .entry((s.namespace.as_str(), s.name.as_str()))
            .or_insert(s);
    }
    let mut out = Vec::new();
    for (ns, svc, port) in candidates {
        let real_ports = generated
            .get(&(ns, svc))
            .is_some_and(|s| generated_has_real_ports(s));
        if real_ports {
            // Evidence of the current shape: either it still says HTTP (a cold port, served
            // from the Service) or it proves the port is gone.
            continue;
        }
        let first = since.get(&(ns, svc, port)).copied().unwrap_or(now_ms);
        if now_ms.saturating_sub(first) < GRACE_MS {
            out.push(RetainedPort {
                namespace: ns.to_owned(),
                service: svc.to_owned(),
                port,
                since_ms: first,
            });
        }
    }
    out
}

/// [`advance`] for one service, for a change that touched it (its rows, its generated Service,
/// or the clock of a port it retains): `http_ports` are the ports the previous model served it
/// as HTTP, `previous` its retained ports (others are ignored), and `evidence` whether it has a
/// row that serves or its generated Service has real ports. Sorted by port. What [`advance`]
/// gives for this service, without a walk of the snapshot.
pub fn advance_service(
    namespace: &str,
    service: &str,
    http_ports: &[u16],
    previous: &[RetainedPort],
    evidence: bool,
    now_ms: u64,
) -> Vec<RetainedPort> {
    if evidence {
        return Vec::new();
    }
    let mine = |r: &&RetainedPort| r.namespace == namespace && r.service == service;
    let mut ports: Vec<u16> = http_ports
        .iter()
        .copied()
        .chain(previous.iter().filter(mine).map(|r| r.port))
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
        .into_iter()
        .filter_map(|port| {
            let first = previous
                .iter()
                .filter(mine)
                .find(|r| r.port == port)
                .map_or(now_ms, |r| r.since_ms);
            (now_ms.saturating_sub(first) < GRACE_MS).then(|| RetainedPort {
                namespace: namespace.to_owned(),
                service: service.to_owned(),
                port,
                since_ms: first,
            })
        })
        .collect()
}

/// Whether `service` in `snapshot`'s generated Services has a real port: evidence of its shape
/// for [`advance_service`] (the first generated Service of the name, as [`advance`] takes it).
pub fn generated_has_real_ports(service: &crate::model::snapshot::Service) -> bool {
    service.generated
        && service
            .ports
            .iter()
            .any(|p| p.port != PROXY_PORT && p.port != LEGACY_PORT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rows::{ANNOTATION_PORT, ANNOTATION_PROTOCOL, parse_declared_ports};
    use std::sync::Arc;

    fn http_set() -> Vec<(&'static str, &'static str, u16)> {
        vec![("mp", "svc", 8080)]
    }

    #[test]
    fn a_loss_with_no_evidence_is_kept_for_90_seconds_then_removed() {
        let empty = Snapshot::default();
        let kept = advance(&http_set(), &[], &empty, 1_000);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].since_ms, 1_000);
        let later = advance(&[], &kept, &empty, 1_000 + GRACE_MS - 1);
        assert_eq!(later, kept);
        assert!(advance(&[], &kept, &empty, 1_000 + GRACE_MS).is_empty());
    }

    #[test]
    fn rows_under_another_protocol_remove_the_entry_in_the_same_refresh() {
        let ann = [
            (ANNOTATION_PORT.to_owned(), "9000".to_owned()),
            (ANNOTATION_PROTOCOL.to_owned(), "tcp".to_owned()),
        ]
        .into_iter()
        .collect();
        let row = parse_declared_ports(&ann).unwrap().to_row(
            "mp",
            "svc",
            "10.0.0.1".parse().unwrap(),
            true,
        );
        let snap = Snapshot {
            rows: vec![Arc::new(row)],
            ..Snapshot::default()
        };
        assert!(advance(&http_set(), &[], &snap, 5).is_empty());
    }

    /// The lookups skipped for a run of one service's rows or ports give the answer of the
    /// set whatever the order: services apart in the lists, a refused row after a served one,
    /// a service whose only row is refused.
    #[test]
    fn services_apart_in_the_lists_are_judged_as_when_together() {
        let ann = [(ANNOTATION_PORT.to_owned(), "8080".to_owned())]
            .into_iter()
            .collect();
        let declared = parse_declared_ports(&ann).unwrap();
        let row = |svc: &str, last: u8| {
            declared.to_row("mp", svc, format!("10.0.0.{last}").parse().unwrap(), true)
        };
        let mut refused = row("c", 4);
        refused.port_protocols = None;
        let mut refused_after_a = row("a", 5);
        refused_after_a.port_protocols = None;
        let snap = Snapshot {
            rows: [
                row("a", 1),
                refused_after_a,
                row("b", 2),
                row("a", 3),
                refused,
            ]
            .map(Arc::new)
            .to_vec(),
            ..Snapshot::default()
        };
        let previous = [
            ("mp", "a", 8080),
            ("mp", "c", 8080),
            ("mp", "a", 9090),
            ("mp", "b", 8080),
            ("mp", "c", 9090),
            ("mp", "a", 7070),
        ];
        let kept = advance(&previous, &[], &snap, 7);
        let kept: Vec<_> = kept.iter().map(|r| (r.service.as_str(), r.port)).collect();
        assert_eq!(kept, [("c", 8080), ("c", 9090)], "only c has no served row");
    }
}
