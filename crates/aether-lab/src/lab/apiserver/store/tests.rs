//! The store's bookkeeping: resourceVersions, generations, preconditions, ClusterIPs, history
//! and directory reconciliation.

use serde_json::json;

use super::*;
use crate::lab::apiserver::resources::by_plural;

fn store() -> Store {
    Store::new(
        4,
        ClusterIps {
            given: [("mp/web".to_owned(), "10.96.7.7".parse().unwrap())].into(),
            cidr: "10.96.0.0/30".parse().unwrap(),
        },
    )
}

fn key(plural: &str, ns: &str, name: &str) -> Key {
    let resource = by_plural("", plural)
        .or_else(|| by_plural("coordination.k8s.io", plural))
        .unwrap();
    Key {
        resource,
        namespace: ns.into(),
        name: name.into(),
    }
}

#[test]
fn every_write_takes_the_next_resource_version_and_a_no_op_takes_none() {
    let mut s = store();
    let k = key("pods", "mp", "a");
    let o = s
        .create(
            &k,
            json!({"metadata": {"labels": {"x": "1"}}, "spec": {"n": 1}}),
        )
        .unwrap();
    assert_eq!(o["metadata"]["resourceVersion"], "1");
    assert_eq!(o["metadata"]["generation"], 1);
    assert!(o["metadata"]["uid"].as_str().is_some_and(|u| u.len() == 36));
    let uid = o["metadata"]["uid"].clone();
    let same = s.merge(&k, &json!({"spec": {"n": 1}}), Part::Main).unwrap();
    assert_eq!(same["metadata"]["resourceVersion"], "1", "nothing changed");
    let labelled = s
        .merge(&k, &json!({"metadata": {"labels": {"x": "2"}}}), Part::Main)
        .unwrap();
    assert_eq!(labelled["metadata"]["resourceVersion"], "2");
    assert_eq!(
        labelled["metadata"]["generation"], 1,
        "metadata is no new generation"
    );
    let respecced = s.merge(&k, &json!({"spec": {"n": 2}}), Part::Main).unwrap();
    assert_eq!(respecced["metadata"]["generation"], 2);
    assert_eq!(respecced["metadata"]["uid"], uid, "the uid is kept");
    assert_eq!(s.rv(), 3);
}

#[test]
fn a_stale_resource_version_is_a_conflict_and_a_missing_object_not_found() {
    let mut s = store();
    let k = key("leases", "aether-system", "aether-registrar");
    s.create(&k, json!({"spec": {"holderIdentity": "a"}}))
        .unwrap();
    s.replace(
        &k,
        json!({"metadata": {"resourceVersion": "1"}, "spec": {"holderIdentity": "b"}}),
        Part::Main,
    )
    .unwrap();
    let e = s
        .replace(
            &k,
            json!({"metadata": {"resourceVersion": "1"}, "spec": {"holderIdentity": "c"}}),
            Part::Main,
        )
        .unwrap_err();
    assert_eq!((e.code, e.reason), (409, "Conflict"));
    assert_eq!(s.get(&k).unwrap()["spec"]["holderIdentity"], "b");
    let e = s.get(&key("leases", "aether-system", "other")).unwrap_err();
    assert_eq!((e.code, e.reason), (404, "NotFound"));
    let e = s.create(&k, json!({})).unwrap_err();
    assert_eq!((e.code, e.reason), (409, "AlreadyExists"));
}

#[test]
fn main_writes_keep_the_status_and_status_writes_change_only_the_status() {
    let mut s = store();
    let k = key("pods", "mp", "a");
    s.reconcile(vec![(
        k.clone(),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "mp"},
               "spec": {"n": 1}, "status": {"podIP": "10.0.0.1"}}),
    )])
    .unwrap();
    let o = s
        .replace(
            &k,
            json!({"spec": {"n": 2}, "status": {"podIP": "6.6.6.6"}}),
            Part::Main,
        )
        .unwrap();
    assert_eq!(o["status"]["podIP"], "10.0.0.1");
    assert_eq!(o["spec"]["n"], 2);
    let o = s
        .replace(
            &k,
            json!({"spec": {"n": 9}, "status": {"podIP": "10.0.0.2"}}),
            Part::Status,
        )
        .unwrap();
    assert_eq!(o["status"]["podIP"], "10.0.0.2");
    assert_eq!(o["spec"]["n"], 2, "a status write leaves the spec");
}

#[test]
fn services_get_their_given_or_next_free_cluster_ip_and_keep_it() {
    let mut s = store();
    let web = key("services", "mp", "web");
    let o = s.create(&web, json!({"spec": {"ports": []}})).unwrap();
    assert_eq!(o["spec"]["clusterIP"], "10.96.7.7");
    assert_eq!(o["spec"]["clusterIPs"], json!(["10.96.7.7"]));
    let a = s
        .create(&key("services", "mp", "a"), json!({"spec": {}}))
        .unwrap();
    assert_eq!(a["spec"]["clusterIP"], "10.96.0.1");
    let b = s
        .create(&key("services", "mp", "b"), json!({"spec": {}}))
        .unwrap();
    assert_eq!(b["spec"]["clusterIP"], "10.96.0.2");
    let headless = s
        .create(
            &key("services", "mp", "h"),
            json!({"spec": {"clusterIP": "None"}}),
        )
        .unwrap();
    assert_eq!(headless["spec"]["clusterIP"], "None");
    let e = s
        .create(&key("services", "mp", "c"), json!({"spec": {}}))
        .unwrap_err();
    assert_eq!(e.code, 500, "the /30 is full: {e}");
    // An update that omits the address keeps it; one that changes it is refused.
    let kept = s
        .replace(&web, json!({"spec": {"ports": [{"port": 80}]}}), Part::Main)
        .unwrap();
    assert_eq!(kept["spec"]["clusterIP"], "10.96.7.7");
    let e = s
        .replace(
            &web,
            json!({"spec": {"clusterIP": "10.96.0.3"}}),
            Part::Main,
        )
        .unwrap_err();
    assert_eq!((e.code, e.reason), (422, "Invalid"));
}

#[test]
fn the_history_is_bounded_and_a_watch_from_before_it_is_gone() {
    let mut s = store();
    for i in 0..6 {
        s.create(&key("pods", "mp", &format!("p{i}")), json!({}))
            .unwrap();
    }
    // Four events kept: 3..=6. From 2 on nothing was missed; from 1, event 2 was.
    assert_eq!(s.events_since(2).map(|e| e.len()), Some(4));
    assert!(s.events_since(1).is_none());
    s.expire();
    assert!(
        s.events_since(5).is_none(),
        "expired: every older watch relists"
    );
    assert_eq!(s.events_since(6).map(|e| e.len()), Some(0));
}

#[test]
fn a_reload_creates_updates_and_deletes_directory_objects_and_leaves_api_objects() {
    let mut s = store();
    let route = key("pods", "mp", "r");
    let gone = key("pods", "mp", "gone");
    let doc = |n: u64| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "r", "namespace": "mp"}, "spec": {"n": n}});
    s.reconcile(vec![
        (route.clone(), doc(1)),
        (gone.clone(), json!({"metadata": {"name": "gone"}})),
    ])
    .unwrap();
    let api = key("services", "mp", "generated");
    s.create(&api, json!({"spec": {}})).unwrap();
    // A daemon writes the status; an unchanged document does not touch the object.
    s.replace(&route, json!({"status": {"parents": [1]}}), Part::Status)
        .unwrap();
    let rv = s.rv();
    assert_eq!(
        s.reconcile(vec![
            (route.clone(), doc(1)),
            (gone.clone(), json!({"metadata": {"name": "gone"}}))
        ])
        .unwrap(),
        0
    );
    assert_eq!(s.rv(), rv);
    // A changed document updates the object and keeps the status it does not give; a removed
    // one deletes its object; the API's object stays.
    assert_eq!(s.reconcile(vec![(route.clone(), doc(2))]).unwrap(), 2);
    let r = s.get(&route).unwrap();
    assert_eq!(r["spec"]["n"], 2);
    assert_eq!(r["status"]["parents"], json!([1]));
    assert!(s.get(&gone).is_err());
    assert!(
        s.get(&api).is_ok(),
        "objects made through the API are never reloaded away"
    );
}

#[test]
fn a_watch_with_a_selector_sees_objects_enter_and_leave_it() {
    let mut s = store();
    let k = key("pods", "mp", "a");
    s.create(&k, json!({"spec": {"nodeName": "node-a"}}))
        .unwrap();
    s.merge(&k, &json!({"spec": {"nodeName": "node-b"}}), Part::Main)
        .unwrap();
    let on_a = Filter::new(k.resource, None)
        .with_selectors(None, Some("spec.nodeName=node-a"))
        .unwrap();
    let seen: Vec<EventType> = s
        .events_since(0)
        .unwrap()
        .iter()
        .filter_map(|e| e.seen_through(&on_a).map(|(t, _)| t))
        .collect();
    assert_eq!(seen, [EventType::Added, EventType::Deleted]);
}
