use std::collections::BTreeMap;
use std::net::IpAddr;

use proptest::prelude::*;

use super::*;
use crate::registry::etcd::table::Table;

const PREFIX: &str = "/aether";

fn mixed_row() -> Row {
    Row {
        namespace: "mp".into(),
        service: "mp-mixed".into(),
        address: "10.244.1.5".parse().unwrap(),
        port: 8080,
        ports: vec![8080, 9000],
        port_protocols: Some(BTreeMap::from([
            (8080, ProtocolValue::Known(PortProtocol::Http)),
            (9000, ProtocolValue::Known(PortProtocol::Tcp)),
        ])),
        ready: true,
        pod: Some("mp-mixed-0".into()),
        node: Some("node-a".into()),
    }
}

#[test]
fn a_pod_with_two_protocols_is_written_under_both_segments_each_with_the_whole_map() {
    let kvs = encode(PREFIX, &mixed_row()).unwrap();
    let keys: Vec<&str> = kvs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "/aether/v1/endpoints/mp/mp-mixed/protocols/HTTP/10.244.1.5",
            "/aether/v1/endpoints/mp/mp-mixed/protocols/TCP/10.244.1.5",
        ]
    );
    for (key, value) in &kvs {
        let json: serde_json::Value = serde_json::from_str(value).unwrap();
        assert_eq!(json["schema"], 1);
        assert_eq!(
            json["port_protocols"],
            serde_json::json!({"8080": "HTTP", "9000": "TCP"})
        );
        let (k, row) = decode(PREFIX, key.as_bytes(), value.as_bytes()).unwrap();
        assert_eq!(row, mixed_row());
        assert_eq!(k.render(PREFIX), *key);
    }
}

#[test]
fn an_ipv6_pod_gets_its_canonical_address_in_the_key() {
    let mut row = mixed_row();
    row.address = "fd00:0:0::5".parse().unwrap();
    let kvs = encode(PREFIX, &row).unwrap();
    assert!(
        kvs[0].0.ends_with("/protocols/HTTP/fd00::5"),
        "{}",
        kvs[0].0
    );
    assert_eq!(
        decode(PREFIX, kvs[0].0.as_bytes(), kvs[0].1.as_bytes())
            .unwrap()
            .1,
        row
    );
    // Another spelling of the same address would be a second key for the row.
    let other = kvs[0].0.replace("fd00::5", "fd00:0::5");
    assert!(matches!(
        decode(PREFIX, other.as_bytes(), kvs[0].1.as_bytes()),
        Err(Refusal::KeyMalformed(_))
    ));
}

#[test]
fn a_row_problem_is_refused_on_write_and_nothing_is_written() {
    let mut missing = mixed_row();
    missing.port_protocols = None;
    assert_eq!(
        encode(PREFIX, &missing),
        Err(Refusal::Row(RowProblem::PortProtocolsMissing))
    );
    let mut unlisted = mixed_row();
    unlisted
        .port_protocols
        .as_mut()
        .unwrap()
        .insert(7000, ProtocolValue::Known(PortProtocol::Udp));
    assert_eq!(
        encode(PREFIX, &unlisted),
        Err(Refusal::Row(RowProblem::ProtocolForUnlistedPort))
    );
    let mut bad_name = mixed_row();
    bad_name.service = "a/b".into();
    assert!(matches!(
        encode(PREFIX, &bad_name),
        Err(Refusal::KeyMalformed(_))
    ));
}

fn value(json: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(json).unwrap()
}

const KEY: &[u8] = b"/aether/v1/endpoints/mp/mp-mixed/protocols/HTTP/10.244.1.5";

#[test]
fn values_a_bad_writer_stores_are_refused_with_their_reason() {
    let cases = [
        (
            serde_json::json!({"schema": 1, "port": 8080, "ports": [8080], "ready": true}),
            "port-protocols-missing",
        ),
        (
            serde_json::json!({"schema": 1, "port": 8080, "ports": [8080, 9000],
                "port_protocols": {"8080": "HTTP"}, "ready": true}),
            "port-without-protocol",
        ),
        (
            serde_json::json!({"schema": 1, "port": 8080, "ports": [8080],
                "port_protocols": {"8080": "UNSPECIFIED"}, "ready": true}),
            "port-without-protocol",
        ),
        (
            serde_json::json!({"schema": 1, "port": 8080, "ports": [8080],
                "port_protocols": {"8080": "SCTP"}, "ready": true}),
            "port-without-protocol",
        ),
        (
            serde_json::json!({"schema": 1, "port": 8080, "ports": [8080],
                "port_protocols": {"8080": "HTTP", "9000": "TCP"}, "ready": true}),
            "protocol-for-unlisted-port",
        ),
        (
            serde_json::json!({"schema": 1, "port": 70000, "ports": [70000],
                "port_protocols": {"70000": "HTTP"}, "ready": true}),
            "invalid-port",
        ),
        (
            serde_json::json!({"schema": 2, "port": 8080}),
            "schema-unsupported",
        ),
        (
            serde_json::json!({"port": 8080, "ports": [8080], "ready": true}),
            "value-malformed",
        ),
        (
            serde_json::json!({"schema": 1, "port": 8080, "ports": [8080],
                "port_protocols": {"8080": "HTTP"}, "ready": true, "weight": 3}),
            "value-malformed",
        ),
        (
            serde_json::json!({"schema": 1, "port": 8080, "ports": [8080],
                "port_protocols": {"http": "HTTP"}, "ready": true}),
            "value-malformed",
        ),
    ];
    for (json, reason) in cases {
        let got = decode(PREFIX, KEY, &value(&json));
        assert_eq!(
            got.as_ref().map_err(Refusal::reason).err(),
            Some(reason),
            "{json}: {got:?}"
        );
    }
    assert_eq!(
        decode(PREFIX, KEY, b"{not json").map_err(|r| r.reason()),
        Err("value-malformed")
    );
}

#[test]
fn keys_outside_the_format_are_refused() {
    let good = encode(PREFIX, &mixed_row()).unwrap().remove(0).1;
    for key in [
        "/aether/v1/endpoints/mp/mp-mixed/HTTP/10.244.1.5",
        "/aether/v1/endpoints/mp/mp-mixed/protocols/http/10.244.1.5",
        "/aether/v1/endpoints/mp/mp-mixed/protocols/SCTP/10.244.1.5",
        "/aether/v1/endpoints/mp/mp-mixed/protocols/HTTP/pod-a",
        "/aether/v1/endpoints/mp/mp-mixed/protocols/HTTP/10.244.1.5/x",
        "/aether/v1/endpoints/MP/mp-mixed/protocols/HTTP/10.244.1.5",
        "/aether/v1/endpoints//mp-mixed/protocols/HTTP/10.244.1.5",
        "/other/v1/endpoints/mp/mp-mixed/protocols/HTTP/10.244.1.5",
    ] {
        assert!(
            matches!(
                decode(PREFIX, key.as_bytes(), good.as_bytes()),
                Err(Refusal::KeyMalformed(_))
            ),
            "{key}"
        );
    }
    assert!(matches!(
        decode(
            PREFIX,
            b"/aether/v1/endpoints/\xff/s/protocols/HTTP/10.0.0.1",
            good.as_bytes()
        ),
        Err(Refusal::KeyMalformed(_))
    ));
}

#[test]
fn prefixes_are_checked() {
    assert!(check_prefix("/aether").is_ok());
    assert!(check_prefix("/a/b").is_ok());
    for bad in ["aether", "/aether/", "/", "/a//b", ""] {
        assert!(check_prefix(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_table_serves_one_row_per_pod_and_the_copy_written_last() {
    let mut table = Table::new(PREFIX);
    let kvs = encode(PREFIX, &mixed_row()).unwrap();
    let listing: Vec<(&[u8], &[u8], i64)> = kvs
        .iter()
        .map(|(k, v)| (k.as_bytes(), v.as_bytes(), 5))
        .collect();
    assert!(table.replace(listing).is_empty());
    assert_eq!(table.rows().len(), 1);
    assert_eq!(*table.rows()[0], mixed_row());
    // A later copy under TCP that says not ready wins over the HTTP copy.
    let mut unready = mixed_row();
    unready.ready = false;
    let later = encode(PREFIX, &unready).unwrap();
    assert!(
        table
            .put(later[1].0.as_bytes(), later[1].1.as_bytes(), 9)
            .is_none()
    );
    assert_eq!(table.rows().len(), 1);
    assert!(!table.rows()[0].ready);
    table.delete(later[1].0.as_bytes());
    assert!(table.rows()[0].ready);
    table.delete(kvs[0].0.as_bytes());
    assert!(table.rows().is_empty());
}

#[test]
fn a_refused_key_is_reported_once_and_the_rest_served() {
    let mut table = Table::new(PREFIX);
    let good = encode(PREFIX, &mixed_row()).unwrap();
    let bad =
        value(&serde_json::json!({"schema": 1, "port": 8080, "ports": [8080], "ready": true}));
    let bad_key = b"/aether/v1/endpoints/mp/hand/protocols/HTTP/10.0.0.9";
    let listing = |rev_bad: i64| -> Vec<(Vec<u8>, Vec<u8>, i64)> {
        vec![
            (
                good[0].0.clone().into_bytes(),
                good[0].1.clone().into_bytes(),
                3,
            ),
            (bad_key.to_vec(), bad.clone(), rev_bad),
        ]
    };
    let first = listing(4);
    let refused = table.replace(first.iter().map(|(k, v, r)| (&k[..], &v[..], *r)));
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].refusal.reason(), "port-protocols-missing");
    assert_eq!(table.rows().len(), 1);
    // A relist (after a compaction) of the same revisions reports nothing again.
    let again = table.replace(first.iter().map(|(k, v, r)| (&k[..], &v[..], *r)));
    assert!(again.is_empty());
    assert_eq!(table.refused().len(), 1);
    // Written again: reported again.
    let rewritten = listing(8);
    assert_eq!(
        table
            .replace(rewritten.iter().map(|(k, v, r)| (&k[..], &v[..], *r)))
            .len(),
        1
    );
    // Gone from the listing: gone.
    assert!(table.replace(Vec::new()).is_empty());
    assert!(table.is_empty());
}

proptest! {
    /// Whatever row is written, it reads back the same from every key it is written under, and
    /// it is written under exactly the distinct protocols of its map.
    #[test]
    fn every_written_row_reads_back_from_each_of_its_keys(
        ports in proptest::collection::btree_map(1u32..=65535, 0usize..3, 1..5),
        ready in any::<bool>(),
        v6 in any::<bool>(),
        octet in any::<u8>(),
    ) {
        let listed: Vec<u32> = ports.keys().copied().collect();
        let address: IpAddr = if v6 {
            format!("fd00::{octet:x}").parse().unwrap()
        } else {
            format!("10.0.0.{octet}").parse().unwrap()
        };
        let row = Row {
            namespace: "ns-1".into(),
            service: "svc.a".into(),
            address,
            port: listed[0],
            ports: listed.clone(),
            port_protocols: Some(ports.iter().map(|(&p, &i)| (p, ProtocolValue::Known(PortProtocol::ALL[i]))).collect()),
            ready,
            pod: None,
            node: None,
        };
        let kvs = encode(PREFIX, &row).unwrap();
        let mut want: Vec<&str> = ports.values().map(|&i| protocol_name(PortProtocol::ALL[i])).collect();
        want.sort();
        want.dedup();
        let mut got: Vec<&str> = kvs.iter().map(|(k, _)| k.split('/').nth(7).unwrap()).collect();
        got.sort();
        prop_assert_eq!(got, want);
        for (k, v) in &kvs {
            prop_assert!(k.contains("/protocols/"));
            let (_, back) = decode(PREFIX, k.as_bytes(), v.as_bytes()).unwrap();
            prop_assert_eq!(&back, &row);
        }
    }
}

proptest! {
    /// The rows a table gives by its changes, applied to what it gave before, are the rows it
    /// serves: after random puts (several copies of one row under its protocols, written at
    /// any revision, some of them refused) and deletes, and after a listing.
    #[test]
    fn the_rows_given_by_changes_are_the_rows_served(
        steps in prop::collection::vec(
            prop::collection::vec((0u8..3, 0u8..2, 0u8..3, 0u8..4, 1i64..6, any::<bool>()), 1..6),
            1..12,
        ),
    ) {
        let mut table = Table::new(PREFIX);
        let mut given: BTreeMap<crate::registry::etcd::RowId, std::sync::Arc<Row>> = BTreeMap::new();
        let apply = |table: &mut Table, given: &mut BTreeMap<_, _>| {
            let changes = table.take_changes(false);
            if changes.whole {
                given.clear();
            }
            for (id, row) in changes.rows {
                match row {
                    Some(r) => given.insert(id, r),
                    None => given.remove(&id),
                };
            }
        };
        let mut revision = 0;
        let mut store: BTreeMap<String, (Vec<u8>, i64)> = BTreeMap::new();
        for (n, batch) in steps.iter().enumerate() {
            for &(service, address, protocol, what, back, ready) in batch {
                revision += 1;
                let mut row = mixed_row();
                row.service = format!("s{service}");
                row.address = IpAddr::from([10, 0, 0, address]);
                row.ready = ready;
                let kvs = encode(PREFIX, &row).unwrap();
                let (key, value) = &kvs[usize::from(protocol) % kvs.len()];
                let (value, at) = match what {
                    0 => {
                        table.delete(key.as_bytes());
                        store.remove(key);
                        continue;
                    }
                    // A copy written at an earlier revision than others (a mirror replaying).
                    1 => (value.as_bytes().to_vec(), revision - back.min(revision - 1)),
                    2 => (b"{\"schema\": 1}".to_vec(), revision),
                    _ => (value.as_bytes().to_vec(), revision),
                };
                table.put(key.as_bytes(), &value, at);
                store.insert(key.clone(), (value, at));
            }
            if n % 5 == 4 {
                // Listed again (a compaction, say): everything given again.
                table.replace(store.iter().map(|(k, (v, r))| (k.as_bytes(), v.as_slice(), *r)));
            }
            apply(&mut table, &mut given);
            let served: BTreeMap<_, _> = table
                .rows()
                .into_iter()
                .map(|r| ((r.namespace.clone(), r.service.clone(), r.address), r))
                .collect();
            prop_assert_eq!(&given, &served);
        }
        let all = table.take_changes(true);
        prop_assert!(all.whole);
        prop_assert_eq!(all.rows.len(), given.len());
    }
}
