//! Legs that only the etcd source has (issue #12): the registry keys read directly (M6, X6,
//! spec/legs.md §4), values written by hand, and the store's faults (its leader lost, every
//! member stopped, its history compacted, a node's daemon killed). They run only when the
//! daemons are on the lab's etcd ([`super::RegistryControl::etcd`]), three members in the
//! underlay namespace, reached through [`EtcdControl`].
//!
//! A change made to the store is a row written by hand: a not-Ready pod of mp-nine at
//! [`EXTRA_IP`] declaring port [`EXTRA_PORT`]. While it is held, mp-nine has that port with no
//! Ready endpoint: a request to it is held and answered `503 no-endpoints`; without it the port
//! is not mp-nine's (`421 port-not-declared`). So a daemon that has seen the change answers
//! differently from one that has not.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcd_client::{CompactionOptions, GetOptions};
use tokio::io::AsyncWriteExt;

use super::traffic::{load_until, raw_stream, read_echo};
use super::{Check, Env, Leg, Need, admin_get, answer, echo, get_host, loopback, name, probe};
use crate::lab::etcd::EtcdControl;
use aether::registry::etcd::keys;
use aether_core::model::port::PortProtocol;
use aether_core::model::snapshot::{ProtocolValue, Row};

/// The legs (see the module doc).
pub static ETCD: &[Leg] = &[
    leg!(
        "M6",
        "mp-mixed's pods are registered under both /protocols/HTTP/ and /protocols/TCP/, each copy with port_protocols {8080: HTTP, 9000: TCP}",
        None,
        m6
    ),
    leg!("X6", "as M6, for mp-tcpfirst", None, x6),
    leg!(
        "U10",
        "delegated liveness: mp-httponly's probes fail, so its pods are not Ready: a request by name is held and answered 503 no-endpoints, a pod-IP dial is delivered; the probes pass again, it is served",
        None,
        u10
    ),
    leg!(
        "EBAD",
        "a malformed key, a malformed value and a RowProblem value written by hand: each refused and counted once, the rest served",
        None,
        bad
    ),
    leg!(
        "ELEADER",
        "etcd's leader is killed under load: the daemons follow the new leader with no relisting, and a later change is seen",
        None,
        leader
    ),
    leg!(
        "ESTOP",
        "every etcd member stopped 30 s under load: requests and an open stream keep working on the last model, nothing is forgotten, the watch resumes and a change made meanwhile is seen",
        None,
        stopped
    ),
    leg!(
        "ECOMPACT",
        "the store is compacted past the daemons' revision while they are cut off: they list again, a key deleted meanwhile is gone, every service answers throughout",
        None,
        compacted
    ),
    leg!(
        "EKILL",
        "node-a's daemon killed (SIGKILL): its rows leave with its lease, and a request for its pod is held and answered 503 no-endpoints, not hung",
        None,
        killed
    ),
];

/// The registry prefix the lab's daemons use (the default).
const PREFIX: &str = "/aether";

/// The address of the row written by hand.
const EXTRA_IP: [u8; 4] = [10, 244, 250, 9];

/// The port it declares, which no pod of mp-nine has.
const EXTRA_PORT: u16 = 9001;

/// The client the load and the checks come from (node-a).
const CLIENT: &str = "mp-client";

/// The lab's etcd and the daemons' admin sockets.
fn control(env: &Env) -> Result<(&Arc<EtcdControl>, &[PathBuf]), String> {
    let reg = env
        .registry
        .as_ref()
        .ok_or_else(|| env.not_here(Need::RegistryControl))?;
    let etcd = reg
        .etcd
        .as_ref()
        .ok_or_else(|| env.not_here(Need::RegistryControl))?;
    Ok((etcd, &reg.admin_sockets))
}

/// Every key under the endpoints prefix, with its value.
async fn endpoint_keys(etcd: &EtcdControl) -> Result<BTreeMap<String, String>, String> {
    let prefix = keys::endpoints_prefix(PREFIX);
    etcd.client(move |mut c| {
        let prefix = prefix.clone();
        async move {
            let got = c.get(prefix, Some(GetOptions::new().with_prefix())).await?;
            Ok(got
                .kvs()
                .iter()
                .map(|kv| {
                    (
                        String::from_utf8_lossy(kv.key()).into_owned(),
                        String::from_utf8_lossy(kv.value()).into_owned(),
                    )
                })
                .collect())
        }
    })
    .await
}

/// Puts `key`; the store's revision after it.
async fn put(etcd: &EtcdControl, key: String, value: String) -> Result<i64, String> {
    etcd.client(move |mut c| {
        let (key, value) = (key.clone(), value.clone());
        async move {
            let r = c.put(key, value, None).await?;
            Ok(r.header().map_or(0, |h| h.revision()))
        }
    })
    .await
}

/// Deletes `key`; the store's revision after it.
async fn delete(etcd: &EtcdControl, key: String) -> Result<i64, String> {
    etcd.client(move |mut c| {
        let key = key.clone();
        async move {
            let r = c.delete(key, None).await?;
            Ok(r.header().map_or(0, |h| h.revision()))
        }
    })
    .await
}

/// On the etcd source, write `row` by hand (its keys, one per protocol) and return the keys;
/// `None` on another source, whose rows are not etcd's.
pub(super) async fn put_row(env: &Env, row: &Row) -> Result<Option<Vec<String>>, String> {
    let Some(etcd) = env.registry.as_ref().and_then(|r| r.etcd.as_ref()) else {
        return Ok(None);
    };
    let kvs = keys::encode(PREFIX, row).map_err(|e| e.to_string())?;
    let mut written = Vec::new();
    for (k, v) in kvs {
        put(etcd, k.clone(), v).await?;
        written.push(k);
    }
    Ok(Some(written))
}

/// Delete keys [`put_row`] wrote.
pub(super) async fn delete_keys(env: &Env, written: Vec<String>) -> Result<(), String> {
    let (etcd, _) = control(env)?;
    for k in written {
        delete(etcd, k).await?;
    }
    Ok(())
}

/// The row written by hand, its key and value (one key: it declares HTTP only).
fn extra_row() -> Result<(String, String), String> {
    let row = Row {
        namespace: "mp".into(),
        service: "mp-nine".into(),
        address: IpAddr::from(EXTRA_IP),
        port: u32::from(EXTRA_PORT),
        ports: vec![u32::from(EXTRA_PORT)],
        port_protocols: Some(BTreeMap::from([(
            u32::from(EXTRA_PORT),
            ProtocolValue::Known(PortProtocol::Http),
        )])),
        ready: false,
        pod: Some("mp-nine-by-hand".into()),
        node: Some("elsewhere".into()),
    };
    let mut kvs = keys::encode(PREFIX, &row).map_err(|e| e.to_string())?;
    match (kvs.pop(), kvs.is_empty()) {
        (Some(kv), true) => Ok(kv),
        _ => Err("the row by hand is not one key".into()),
    }
}

/// Each daemon's `/model` `etcd` object.
async fn reports(admin: &[PathBuf]) -> Result<Vec<serde_json::Value>, String> {
    let mut out = Vec::new();
    for s in admin {
        let body = admin_get(s, "/model").await?;
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        out.push(v["etcd"].clone());
    }
    Ok(out)
}

/// Each daemon's count of `field` (listings, watches, ...).
async fn counts(admin: &[PathBuf], field: &str) -> Result<Vec<u64>, String> {
    Ok(reports(admin)
        .await?
        .iter()
        .map(|r| r[field].as_u64().unwrap_or(0))
        .collect())
}

/// Waits until every daemon's published model holds the store at `revision` or later.
async fn compiled(admin: &[PathBuf], revision: i64, bound: Duration) -> Result<Duration, String> {
    let started = aether::time::now();
    loop {
        let r = reports(admin).await?;
        if r.iter()
            .all(|r| r["revision_compiled"].as_i64().unwrap_or(0) >= revision)
        {
            return Ok(aether::time::now() - started);
        }
        if aether::time::now() - started > bound {
            return Err(format!(
                "the daemons did not compile revision {revision} within {bound:?}: {r:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// mp-nine's extra port, asked on the loopback proxy port: `Ok(true)` for the held
/// `503 no-endpoints` (the row by hand is in the model), `Ok(false)` for `421
/// port-not-declared` (it is not).
async fn extra_port_served(env: &Env) -> Result<bool, String> {
    let host = format!("{}:{EXTRA_PORT}", env.mesh("mp-nine"));
    let o = env
        .probe(
            "mp-client-nocapture",
            &probe(loopback(), get_host("/", &host)),
        )
        .await?;
    if answer(&o, 503, "no-endpoints", None).is_ok() {
        Ok(true)
    } else if answer(&o, 421, "port-not-declared", None).is_ok() {
        Ok(false)
    } else {
        Err(format!(
            "mp-nine:{EXTRA_PORT}: want 503 no-endpoints or 421 port-not-declared, got {}",
            o.summary()
        ))
    }
}

/// Blocks (or unblocks) the nodes' connections to etcd's client ports, in the underlay: a
/// rejected packet gets a reset, so the daemons cannot reconnect until unblocked.
async fn cut_off(etcd: &EtcdControl, cut: bool) -> Result<(), String> {
    let ports: Vec<String> = etcd
        .endpoints()
        .iter()
        .filter_map(|u| u.rsplit_once(':').map(|(_, p)| p.to_owned()))
        .collect();
    let script = if cut {
        format!(
            "table inet aether_lab_etcd {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    iifname != \"lo\" tcp dport {{ {} }} reject with tcp reset\n  }}\n}}\n",
            ports.join(", ")
        )
    } else {
        "delete table inet aether_lab_etcd\n".to_owned()
    };
    etcd.with(move |_, _| nft(std::process::Command::new("nft"), &script))
        .await?
}

/// Runs `command` (`nft`, or a wrapper that enters a namespace and runs it) with `-f -` and
/// `script` on its standard input.
pub(super) fn nft(mut command: std::process::Command, script: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = command
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("nft: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `during` while requests (new connections, captured and loopback) are sent without a
/// pause, and goes on sending until `least` were answered; fails if any of them failed.
async fn under_load<T>(
    env: &Env,
    least: u32,
    during: impl Future<Output = Result<T, String>>,
) -> Result<(T, u32), String> {
    let stop = AtomicBool::new(false);
    let load = load_until(env, &stop, Duration::from_millis(20), least);
    let work = async {
        let out = during.await;
        stop.store(true, Ordering::Relaxed);
        out
    };
    let ((ok, failed), out) = tokio::join!(load, work);
    let out = out?;
    if let Some(first) = failed.first() {
        return Err(format!(
            "{} of {} requests failed; first: {first}",
            failed.len(),
            ok as usize + failed.len()
        ));
    }
    if ok < least {
        return Err(format!("only {ok} requests answered"));
    }
    Ok((out, ok))
}

/// The keys of `node`'s pods.
fn keys_of(all: &BTreeMap<String, String>, node: &str) -> Vec<String> {
    all.iter()
        .filter(|(_, v)| {
            serde_json::from_str::<serde_json::Value>(v)
                .is_ok_and(|v| v["node"].as_str() == Some(node))
        })
        .map(|(k, _)| k.clone())
        .collect()
}

async fn m6(env: &Env) -> Check {
    copies(env, "mp-mixed").await
}

async fn x6(env: &Env) -> Check {
    copies(env, "mp-tcpfirst").await
}

/// Each pod of `wl` is registered once under HTTP and once under TCP, and nowhere else; each
/// copy carries `port_protocols {8080: HTTP, 9000: TCP}` (spec/model.md §3.4).
async fn copies(env: &Env, wl: &str) -> Check {
    let (etcd, _) = control(env)?;
    let all = endpoint_keys(etcd).await?;
    let service = format!("{}mp/{wl}/", keys::endpoints_prefix(PREFIX));
    let want_map = serde_json::json!({"8080": "HTTP", "9000": "TCP"});
    let mut n = 0;
    for pod in [format!("{wl}-0"), format!("{wl}-1")] {
        let ip = env.pod_ip("mp", &pod)?;
        let mine: Vec<(&String, &String)> = all
            .iter()
            .filter(|(k, _)| k.starts_with(&service) && k.ends_with(&format!("/{ip}")))
            .collect();
        let segments: Vec<String> = mine
            .iter()
            .map(|(k, _)| k[service.len()..].to_owned())
            .collect();
        let want = [
            format!("protocols/HTTP/{ip}"),
            format!("protocols/TCP/{ip}"),
        ];
        if segments != want {
            return Err(format!(
                "{pod}: keys {segments:?} under {service}, want {want:?}"
            ));
        }
        for (k, v) in mine {
            let v: serde_json::Value = serde_json::from_str(v).map_err(|e| format!("{k}: {e}"))?;
            if v["port_protocols"] != want_map || v["schema"] != 1 {
                return Err(format!(
                    "{k}: value {v}, want schema 1 and port_protocols {want_map}"
                ));
            }
            if v["pod"].as_str() != Some(pod.as_str()) {
                return Err(format!("{k}: pod {}, want {pod}", v["pod"]));
            }
            n += 1;
        }
    }
    Ok(format!(
        "{n} keys: each pod of {wl} under /protocols/HTTP/ and /protocols/TCP/, each with port_protocols {want_map}"
    ))
}

async fn bad(env: &Env) -> Check {
    let (etcd, admin) = control(env)?;
    let endpoints = keys::endpoints_prefix(PREFIX);
    let before: Vec<serde_json::Value> = reports(admin).await?;
    let refused = |r: &serde_json::Value, reason: &str| r["refused"][reason].as_u64().unwrap_or(0);
    // A key that is not an address, a value that is not JSON, and a row whose map names a port
    // it does not list (protocol-for-unlisted-port).
    let cases = [
        (
            format!("{endpoints}mp/mp-nine/protocols/HTTP/not-an-address"),
            r#"{"schema":1,"port":9000,"ports":[9000],"port_protocols":{"9000":"HTTP"},"ready":true}"#.to_owned(),
            "key-malformed",
        ),
        (
            format!("{endpoints}mp/mp-nine/protocols/HTTP/10.244.250.10"),
            "{not json".to_owned(),
            "value-malformed",
        ),
        (
            format!("{endpoints}mp/mp-nine/protocols/HTTP/10.244.250.11"),
            r#"{"schema":1,"port":9000,"ports":[9000],"port_protocols":{"9000":"HTTP","9002":"TCP"},"ready":true}"#.to_owned(),
            "protocol-for-unlisted-port",
        ),
    ];
    let out = async {
        let mut revision = 0;
        for (k, v, _) in &cases {
            revision = put(etcd, k.clone(), v.clone()).await?;
        }
        compiled(admin, revision, Duration::from_secs(10)).await?;
        // An unrelated change after them: they are not counted again.
        let (extra_key, extra_value) = extra_row()?;
        put(etcd, extra_key.clone(), extra_value).await?;
        let revision = delete(etcd, extra_key).await?;
        compiled(admin, revision, Duration::from_secs(10)).await?;
        let after = reports(admin).await?;
        for (b, a) in before.iter().zip(&after) {
            for (_, _, reason) in &cases {
                let (was, now) = (refused(b, reason), refused(a, reason));
                if now != was + 1 {
                    return Err(format!("refused {reason}: {was} → {now}, want +1 (once)"));
                }
            }
        }
        // The rest is served.
        for (wl, port) in [("mp-nine", 9000), ("mp-multi", 8080)] {
            let o = env
                .probe(CLIENT, &probe(name(&env.mesh(wl), port), super::get("/")))
                .await?;
            echo(&o, wl, port)?;
        }
        Ok(())
    }
    .await;
    for (k, _, _) in &cases {
        delete(etcd, k.clone()).await?;
    }
    out?;
    env.settle().await?;
    Ok("key-malformed, value-malformed, protocol-for-unlisted-port: each counted once on each daemon; mp-nine and mp-multi served".into())
}

async fn leader(env: &Env) -> Check {
    let (etcd, admin) = control(env)?;
    let listings = counts(admin, "listings").await?;
    let leases = counts(admin, "leases").await?;
    let ((killed, revision, took), requests) = under_load(env, 10, async {
        let killed = etcd
            .with(|server, _| {
                let i = server.leader()?;
                server.kill(i);
                Some(i)
            })
            .await?
            .ok_or("no member leads")?;
        // A change after the loss: written through the new leader, seen by every daemon.
        let elected = aether::time::now();
        let (key, value) = extra_row()?;
        let revision = loop {
            match put(etcd, key.clone(), value.clone()).await {
                Ok(r) => break r,
                Err(e) if aether::time::now() - elected > Duration::from_secs(10) => {
                    return Err(format!("no write within 10 s of the leader's loss: {e}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        compiled(admin, revision, Duration::from_secs(15)).await?;
        let took = aether::time::now() - elected;
        if !extra_port_served(env).await? {
            return Err("after the leader's loss: the change is not served".into());
        }
        Ok((killed, revision, took))
    })
    .await?;
    let leases_after = counts(admin, "leases").await?;
    let relisted = counts(admin, "listings").await?;
    let (key, _) = extra_row()?;
    delete(etcd, key).await?;
    etcd.with(move |server, _| server.start_stopped().map_err(|e| e.to_string()))
        .await??;
    if relisted != listings {
        return Err(format!(
            "the daemons listed again: listings {listings:?} → {relisted:?}"
        ));
    }
    env.settle().await?;
    Ok(format!(
        "member m{killed} (the leader) killed; {requests} requests answered; the change at revision {revision} compiled by both daemons {:.1} s after the kill; listings {listings:?} unchanged; leases {leases:?} → {leases_after:?}",
        took.as_secs_f64()
    ))
}

/// How long every member stays stopped (issue #12).
const STOP: Duration = Duration::from_secs(30);

async fn stopped(env: &Env) -> Check {
    let (etcd, admin) = control(env)?;
    let (key, value) = extra_row()?;
    // Whatever an earlier leg left, the change starts absent.
    delete(etcd, key.clone()).await?;
    env.settle().await?;
    let all_before = endpoint_keys(etcd).await?;
    let listings = counts(admin, "listings").await?;
    let held = super::fingerprints(admin).await?;
    let mut raw = raw_stream(env).await?;
    let out = under_load(env, 100, async {
        cut_off(etcd, true).await?;
        etcd.with(|server, _| server.stop_all()).await?;
        tokio::time::sleep(STOP).await;
        // Started again, still cut off from the daemons: the change is made meanwhile.
        etcd.with(|server, _| server.start_stopped().map_err(|e| e.to_string()))
            .await??;
        let revision = put(etcd, key.clone(), value.clone()).await?;
        if extra_port_served(env).await? {
            return Err("the change was served before the daemons could see it".into());
        }
        if super::fingerprints(admin).await? != held {
            return Err("a daemon's model changed while etcd was away".into());
        }
        cut_off(etcd, false).await?;
        let took = compiled(admin, revision, Duration::from_secs(20)).await?;
        raw.write_all(b"after\n").await.map_err(|e| e.to_string())?;
        read_echo(&mut raw, "after").await?;
        Ok((revision, took))
    })
    .await;
    let _ = cut_off(etcd, false).await;
    let _ = etcd
        .with(|server, _| server.start_stopped().map_err(|e| e.to_string()))
        .await;
    let served = extra_port_served(env).await;
    delete(etcd, key.clone()).await?;
    let ((revision, took), requests) = out?;
    if !served? {
        return Err("after the restart: the change made meanwhile is not served".into());
    }
    let relisted = counts(admin, "listings").await?;
    if relisted != listings {
        return Err(format!(
            "the watch did not resume: listings {listings:?} → {relisted:?}"
        ));
    }
    env.settle().await?;
    // Nothing forgotten: every node's rows are back, the same keys.
    let mut all_after = endpoint_keys(etcd).await?;
    all_after.remove(&key);
    let before: Vec<&String> = all_before.keys().collect();
    let after: Vec<&String> = all_after.keys().collect();
    if before != after {
        return Err(format!(
            "the store's rows changed: {} keys before, {} after",
            before.len(),
            after.len()
        ));
    }
    Ok(format!(
        "{requests} requests answered and the raw stream echoed across {STOP:?} without etcd; the change made meanwhile (revision {revision}) served {:.1} s after the daemons could reach etcd; watch resumed (listings {listings:?}); {} keys as before",
        took.as_secs_f64(),
        after.len()
    ))
}

async fn compacted(env: &Env) -> Check {
    let (etcd, admin) = control(env)?;
    let (key, value) = extra_row()?;
    let revision = put(etcd, key.clone(), value).await?;
    compiled(admin, revision, Duration::from_secs(10)).await?;
    if !extra_port_served(env).await? {
        return Err("the row by hand is not served".into());
    }
    let listings = counts(admin, "listings").await?;
    let out = under_load(env, 20, async {
        // Cut off, every connection closed (a restart); then the row deleted and the history
        // that holds the deletion compacted away: only a new listing can show it gone.
        cut_off(etcd, true).await?;
        etcd.with(|server, _| {
            server.stop_all();
            server.start_stopped().map_err(|e| e.to_string())
        })
        .await??;
        let revision = delete(etcd, key.clone()).await?;
        // One write more, outside the rows, so that the compaction takes the deletion too.
        let after = put(
            etcd,
            format!("{PREFIX}-lab/compacted"),
            revision.to_string(),
        )
        .await?;
        etcd.client(move |mut c| async move {
            c.compact(after, Some(CompactionOptions::new().with_physical()))
                .await
                .map(|_| ())
        })
        .await?;
        cut_off(etcd, false).await?;
        compiled(admin, revision, Duration::from_secs(20)).await
    })
    .await;
    let _ = cut_off(etcd, false).await;
    let (took, requests) = out?;
    let relisted = counts(admin, "listings").await?;
    if relisted.iter().zip(&listings).any(|(a, b)| *a != b + 1) {
        return Err(format!(
            "want one listing more on each daemon: {listings:?} → {relisted:?}"
        ));
    }
    if extra_port_served(env).await? {
        return Err("after the relisting: the deleted row is still served".into());
    }
    env.settle().await?;
    Ok(format!(
        "{requests} requests answered; each daemon listed once more ({listings:?} → {relisted:?}) {:.1} s after it could reach etcd; the row deleted meanwhile is gone",
        took.as_secs_f64()
    ))
}

async fn killed(env: &Env) -> Check {
    let (etcd, admin) = control(env)?;
    let (Some(kill), Some(restart)) = (&env.kill, &env.restart) else {
        return Err(env.not_here(Need::DaemonProcesses));
    };
    // mp-authz has one pod, on node-a; it is asked from mp-multi-1, on node-b.
    const FROM: &str = "mp-multi-1";
    // On the pod's loopback proxy port, by Host: the answer is the model's, whatever mesh DNS
    // says of a service with no rows.
    let host = format!("{}:9191", env.mesh("mp-authz"));
    let ask = || async {
        env.probe(FROM, &probe(loopback(), get_host("/count", &host)))
            .await
    };
    let o = ask().await?;
    if o.status != Some(200) || o.reason().is_some() {
        return Err(format!("before: mp-authz from {FROM}: {}", o.summary()));
    }
    let node_a = keys_of(&endpoint_keys(etcd).await?, "node-a");
    if node_a.is_empty() {
        return Err("node-a has no keys".into());
    }
    let out = async {
        (kill.0)("node-a".to_owned()).await?;
        let killed_at = aether::time::now();
        let ttl = Duration::from_secs(crate::lab::etcd::LAB_LEASE_TTL_SECS);
        let gone = loop {
            let left = keys_of(&endpoint_keys(etcd).await?, "node-a");
            if left.is_empty() {
                break aether::time::now() - killed_at;
            }
            if aether::time::now() - killed_at > ttl + Duration::from_secs(5) {
                return Err(format!(
                    "{} keys of node-a still held {:?} after the kill",
                    left.len(),
                    ttl + Duration::from_secs(5)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let revision = etcd
            .client(|mut c| async move {
                let r = c.get("/", None).await?;
                Ok(r.header().map_or(0, |h| h.revision()))
            })
            .await?;
        compiled(&admin[1..], revision, Duration::from_secs(10)).await?;
        let o = ask().await?;
        answer(&o, 503, "no-endpoints", None).map_err(|e| format!("after the rows left: {e}"))?;
        let took = o.timings.first_byte.unwrap_or_default();
        if took > Duration::from_secs(10) {
            return Err(format!("503 no-endpoints after {took:?}: a hang"));
        }
        Ok((gone, took))
    }
    .await;
    let restarted = (restart.0)("node-a".to_owned()).await;
    let (gone, took) = out?;
    restarted?;
    env.settle().await?;
    let o = ask().await?;
    if o.status != Some(200) || o.reason().is_some() {
        return Err(format!(
            "after the restart: mp-authz from {FROM}: {}",
            o.summary()
        ));
    }
    Ok(format!(
        "node-a's {} keys gone {:.1} s after the kill (lease TTL {} s); mp-authz from node-b: 503 no-endpoints after {:.1} s; restarted, served again",
        node_a.len(),
        gone.as_secs_f64(),
        crate::lab::etcd::LAB_LEASE_TTL_SECS,
        took.as_secs_f64()
    ))
}

/// Makes the delegated probes of `pod` (mp-httponly's, HTTP 8080) fail, or pass again: inside
/// the pod's namespace, a connection from the pod's address to itself on 8080 (only the
/// node's probe makes one: deliveries come from the client's address) is reset.
async fn fail_probes(env: &Env, pod: &str, fail: bool) -> Result<(), String> {
    let netns = env.client_netns(pod)?.path().to_owned();
    let ip = env.pod_ip("mp", pod)?;
    let script = if fail {
        format!(
            "table inet aether_lab_probe {{\n  chain output {{\n    type filter hook output priority -300; policy accept;\n    ip saddr {ip} ip daddr {ip} tcp dport 8080 reject with tcp reset\n  }}\n}}\n"
        )
    } else {
        "delete table inet aether_lab_probe\n".to_owned()
    };
    tokio::task::spawn_blocking(move || {
        let mut enter = std::process::Command::new("nsenter");
        enter.arg(format!("--net={}", netns.display())).arg("nft");
        nft(enter, &script)
    })
    .await
    .map_err(|e| e.to_string())?
}

/// spec/legs.md U10 on the etcd source: a failing delegated probe makes a pod not Ready.
async fn u10(env: &Env) -> Check {
    let pods = ["mp-httponly-0", "mp-httponly-1"];
    let by_name = || async {
        env.probe(
            CLIENT,
            &probe(name(&env.mesh("mp-httponly"), 8080), super::get("/")),
        )
        .await
    };
    echo(&by_name().await?, "mp-httponly", 8080).map_err(|e| format!("before: {e}"))?;
    let started = aether::time::now();
    let out = async {
        for pod in pods {
            fail_probes(env, pod, true).await?;
        }
        // Not Ready after probe_failure_threshold failures (3 × 2 s by default).
        let held = loop {
            let o = by_name().await?;
            if answer(&o, 503, "no-endpoints", None).is_ok() {
                break o;
            }
            echo(&o, "mp-httponly", 8080).map_err(|e| format!("while going unready: {e}"))?;
            if started.elapsed() > Duration::from_secs(20) {
                return Err(
                    "mp-httponly still served by name 20 s after its probes failed".to_owned(),
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let unready = started.elapsed();
        let hold = held.timings.first_byte.unwrap_or_default();
        // A pod-IP dial still reaches the pod.
        let ip = env.pod_ip("mp", pods[0])?;
        let o = env
            .probe(CLIENT, &probe(super::addr(ip, 8080), super::get("/")))
            .await?;
        echo(&o, "mp-httponly", 8080).map_err(|e| format!("pod-IP dial to {ip}: {e}"))?;
        Ok::<_, String>((unready, hold))
    }
    .await;
    let mut restored = Ok(());
    for pod in pods {
        if let Err(e) = fail_probes(env, pod, false).await {
            restored = Err(e);
        }
    }
    let (unready, hold) = out?;
    restored?;
    let again = aether::time::now();
    loop {
        let o = by_name().await?;
        if echo(&o, "mp-httponly", 8080).is_ok() {
            break;
        }
        if again.elapsed() > Duration::from_secs(15) {
            return Err(format!(
                "mp-httponly not served again 15 s after its probes passed: {}",
                o.summary()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    env.settle().await?;
    Ok(format!(
        "both pods not Ready {:.1} s after their probes began to fail: by name held {:.1} s, then 503 no-endpoints; a pod-IP dial delivered; Ready and served again {:.1} s after the probes passed",
        unready.as_secs_f64(),
        hold.as_secs_f64(),
        again.elapsed().as_secs_f64()
    ))
}
