//! Retention by the change (spec/model.md §10), for a source that gives what changed: the
//! retained ports of the services a load touched, and of the services that retain a port
//! (they expire by the clock), are worked out again; every other service's stand. What
//! [`crate::model::retention::advance`] gives for the whole snapshot, without a walk of it.

use std::collections::BTreeSet;

use crate::model::Model;
use crate::model::live::{Change, Kind, Object};
use crate::model::retention::advance_service;
use crate::model::snapshot::RetainedPort;

/// A (namespace, service) pair.
pub(super) type ServiceName = (Box<str>, Box<str>);

/// The retention state after a load, and the kept model's changes that make its retained
/// ports that state.
///
/// `touched`: the services whose rows or generated Service the load changed; `whole`: the
/// load read everything (every service the published model served as HTTP is asked, and
/// what the kept model holds is replaced, not changed). `evidence` says whether a service has
/// a row that serves or a generated Service with real ports, as the load leaves them.
/// `previous` is the published model and its retention state (none at the first load: nothing
/// is retained).
pub(super) fn by_change(
    mut touched: BTreeSet<ServiceName>,
    previous: Option<(&Model, &[RetainedPort])>,
    whole: bool,
    now_ms: u64,
    evidence: impl Fn(&str, &str) -> bool,
) -> (Vec<RetainedPort>, Vec<Change>) {
    let Some((model, before)) = previous else {
        return (Vec::new(), Vec::new());
    };
    if whole {
        touched.clear();
        for (ns, name, _) in model.http_ports() {
            touched.insert((ns.into(), name.into()));
        }
    }
    for r in before {
        touched.insert((r.namespace.as_str().into(), r.service.as_str().into()));
    }
    let is_touched = |r: &RetainedPort| {
        touched.contains(&(r.namespace.as_str().into(), r.service.as_str().into()))
    };
    let mut retained: Vec<RetainedPort> =
        before.iter().filter(|r| !is_touched(r)).cloned().collect();
    for (ns, name) in &touched {
        let http = model.http_ports_of(ns, name);
        retained.extend(advance_service(
            ns,
            name,
            &http,
            before,
            evidence(ns, name),
            now_ms,
        ));
    }
    retained.sort_by(|a, b| {
        (&a.namespace, &a.service, a.port).cmp(&(&b.namespace, &b.service, b.port))
    });
    // A port retained still is put again unchanged, which `Live::apply` leaves be; one gone is
    // deleted (a whole read deletes what it does not list).
    let mut changes = Vec::new();
    let kept_keys: BTreeSet<String> = retained
        .iter()
        .filter(|r| is_touched(r))
        .map(retained_key)
        .collect();
    if !whole {
        for r in before.iter().filter(|r| is_touched(r)) {
            let key = retained_key(r);
            if !kept_keys.contains(&key) {
                changes.push(Change::delete(Kind::Retained, key));
            }
        }
    }
    for r in retained.iter().filter(|r| is_touched(r)) {
        changes.push(Change::put(
            retained_key(r),
            Object::Retained(Box::new(r.clone())),
        ));
    }
    (retained, changes)
}

/// A retained port's key in the kept model (as `live::keyed` keys it).
fn retained_key(r: &RetainedPort) -> String {
    format!("{}/{}:{}", r.namespace, r.service, r.port)
}
