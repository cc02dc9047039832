//! Retained HTTP entries: grace versus replacement (spec/model.md §10).
//!
//! The retention state is an input of [`crate::model::compile()`], computed by [`advance`] from
//! the previous model's HTTP ports, the previous state, the new snapshot and the time. It is
//! never copied from an earlier compiled model.
//!
//! Layer 0 (pure).

use std::collections::{BTreeMap, BTreeSet};

use crate::model::port::{LEGACY_PORT, PROXY_PORT, PortProtocol};
use crate::model::rows::{row_problem, served_protocols};
use crate::model::snapshot::{RetainedPort, Snapshot};

/// The grace of a retained entry, in milliseconds.
pub const GRACE_MS: u64 = 90_000;

/// The next retention state.
///
/// `previous_http` is every (namespace, service, port) the previous model served as HTTP
/// (from [`crate::model::Model::http_ports`]); `previous` is the previous retention state.
pub fn advance(
    previous_http: &BTreeSet<(String, String, u16)>,
    previous: &[RetainedPort],
    snapshot: &Snapshot,
    now_ms: u64,
) -> Vec<RetainedPort> {
    // Evidence 1: the served rows of each service, under any protocol.
    let mut rows: BTreeMap<(&str, &str), BTreeMap<u16, BTreeSet<PortProtocol>>> = BTreeMap::new();
    for row in snapshot.rows.iter().filter(|r| row_problem(r).is_none()) {
        let entry = rows.entry((&row.namespace, &row.service)).or_default();
        for (p, proto) in served_protocols(row) {
            entry.entry(p).or_default().insert(proto);
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
    let candidates: BTreeSet<(&str, &str, u16)> = previous_http
        .iter()
        .map(|(n, s, p)| (n.as_str(), s.as_str(), *p))
        .chain(since.keys().copied())
        .collect();

    let mut out = Vec::new();
    for (ns, svc, port) in candidates {
        if rows.contains_key(&(ns, svc)) {
            // Rows exist: they are the truth (a normal entry, or a replacement).
            continue;
        }
        // Evidence 2: the generated Service's real ports.
        let generated = snapshot
            .services
            .iter()
            .find(|s| s.generated && s.namespace == ns && s.name == svc);
        let real_ports: Vec<_> = generated
            .map(|s| {
                s.ports
                    .iter()
                    .filter(|p| p.port != PROXY_PORT && p.port != LEGACY_PORT)
                    .collect()
            })
            .unwrap_or_default();
        if !real_ports.is_empty() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rows::{ANNOTATION_PORT, ANNOTATION_PROTOCOL, parse_declared_ports};

    fn http_set() -> BTreeSet<(String, String, u16)> {
        [("mp".to_owned(), "svc".to_owned(), 8080)]
            .into_iter()
            .collect()
    }

    #[test]
    fn a_loss_with_no_evidence_is_kept_for_90_seconds_then_removed() {
        let empty = Snapshot::default();
        let kept = advance(&http_set(), &[], &empty, 1_000);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].since_ms, 1_000);
        let later = advance(&BTreeSet::new(), &kept, &empty, 1_000 + GRACE_MS - 1);
        assert_eq!(later, kept);
        assert!(advance(&BTreeSet::new(), &kept, &empty, 1_000 + GRACE_MS).is_empty());
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
            rows: vec![row],
            ..Snapshot::default()
        };
        assert!(advance(&http_set(), &[], &snap, 5).is_empty());
    }
}
