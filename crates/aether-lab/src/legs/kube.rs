//! Legs that only the Kubernetes source has (issue #9, "How it is verified"): the lab's API
//! server stops mid-watch, or forgets its history, and the daemons must keep the last model and
//! then recover with no stale object left; and a DaemonSet rollout (K-ROLLOUT, [`super::rollout`],
//! issue #35 item 4), whose CNI installers ask the API server for their DaemonSet. They run only when the daemons are on the lab's API
//! server ([`super::RegistryControl::apiserver`]); a file-registry run does not list them.
//!
//! The answer they watch is the `swap` overlay's: mp-multi:8080 through the loopback proxy port
//! carries `x-swap: 1` while the overlay's HTTPRoute is held, and none without it.
//!
//! K-FORBID takes the daemons' right to read HTTPRoutes away once they are synced (issue #35
//! item 2): the server refuses (403) their next watch, as it refuses a ClusterRole that lost
//! the kind. They must stay ready and serving (`degraded` on `/ready`), apply every other
//! kind's changes and serve CNI ADDs, and once the right is back, see the route made meanwhile
//! within the watcher's back-off bound, without a relist.

use std::time::Duration;

use crate::lab::plan::RELEASE_NAMESPACE;

use super::rollout::rollout;
use super::{
    Check, Env, Leg, apiserver_fingerprint, control_request, echo, fingerprints, get_host,
    loopback, probe,
};

/// The legs (see the module doc).
pub static KUBE: &[Leg] = &[
    leg!(
        "KWRITES",
        "the registrar (its Lease, the generated Services by server-side apply) and the route-status writer write through the API server, a route change once rather than once per node",
        None,
        writes
    ),
    leg!(
        "KSTOP",
        "the API server stops mid-watch: the last model is served; it starts: a later change is picked up",
        None,
        stopped
    ),
    leg!(
        "KDASH",
        "every metric the chart's Grafana dashboard queries is one each daemon exports on /metrics",
        None,
        dashboard
    ),
    leg!(
        "KEXPIRE",
        "the API server forgets its history (410 Gone): the daemons relist, and a deleted route is gone",
        None,
        expired
    ),
    leg!(
        "K-FORBID",
        "HTTPRoutes refused (403) on the watch after sync: the daemons stay ready (degraded), apply a MeshFilter and serve a CNI ADD, and do not see a route made meanwhile; allowed again: the route is served within the back-off bound, with no relist",
        None,
        forbidden
    ),
    leg!(
        "K-POLICY",
        "a MeshFilter the daemons cannot read: its Service refuses 403 authz-unavailable, a diagnostic names it, and its status says why (Accepted False, Invalid); a readable one is Accepted",
        None,
        policy
    ),
    leg!(
        "K-ROLLOUT",
        "a DaemonSet rollout of node-a (the new daemon beside the old, the installers stopped and started, a pod created meanwhile): no new connection fails, open ones run on, the pod waits or is captured, the conflist entry goes only on uninstall",
        None,
        rollout
    ),
];

/// The resource K-FORBID refuses, as the lab API server's control API names it.
const ROUTES: &str = "gateway.networking.k8s.io/httproutes";

/// The longest a refused watch waits for its next try: kube-runtime's watcher backs off to at
/// most 30 s, and its jitter adds up to as much again (docs/kubernetes.md, "Errors"). A lifted
/// refusal is seen at that try.
const RETRY_BOUND: Duration = Duration::from_secs(60);

/// How long the daemons get to see a refusal, or a change that does not wait for a retry.
const SEEN_BOUND: Duration = Duration::from_secs(30);

const CLIENT: &str = "mp-client-nocapture";

/// The registrar's Lease (in [`RELEASE_NAMESPACE`]).
const LEASE: &str = "aether-registrar";

/// The lab API server's control socket and the daemons' admin sockets.
fn sockets(env: &Env) -> Result<(&std::path::Path, &[std::path::PathBuf]), String> {
    let reg = env
        .registry
        .as_ref()
        .ok_or_else(|| env.not_here(super::Need::RegistryControl))?;
    let control = reg
        .apiserver
        .as_deref()
        .ok_or_else(|| env.not_here(super::Need::RegistryControl))?;
    Ok((control, &reg.admin_sockets))
}

/// mp-multi:8080 through the loopback proxy port: an echo, and its `x-swap` header.
async fn x_swap(env: &Env) -> Result<Option<String>, String> {
    let host = format!("{}:8080", env.mesh("mp-multi"));
    let o = env
        .probe(CLIENT, &probe(loopback(), get_host("/", &host)))
        .await?;
    echo(&o, "mp-multi", 8080)?;
    Ok(o.header("x-swap").map(str::to_owned))
}

/// Runs `steps`, then the control request `POST undo` (`/lab/start`, `/lab/allow?…`) and the
/// overlay's removal, whatever `steps` returned: a failed leg never leaves the next one a
/// stopped server or a refused resource.
async fn restoring(
    env: &Env,
    control: &std::path::Path,
    undo: &str,
    steps: impl Future<Output = Check>,
) -> Check {
    let out = steps.await;
    let undone = control_request(control, "POST", undo).await;
    let reset = env.overlay(None).await;
    let out = out?;
    undone?;
    reset.map_err(|e| format!("removing the overlay: {e}"))?;
    Ok(out)
}

async fn stopped(env: &Env) -> Check {
    let (control, admin) = sockets(env)?;
    env.overlay(None).await?;
    if let Some(v) = x_swap(env).await? {
        return Err(format!("before the change: x-swap {v:?}, want none"));
    }
    let held = fingerprints(admin).await?;
    control_request(control, "POST", "/lab/stop").await?;
    restoring(env, control, "/lab/start", async {
        // The change is made while no watch is open: the server holds it, no daemon sees it.
        env.swap_overlay_files(Some("swap"))?;
        control_request(control, "POST", "/lab/reload").await?;
        let server = apiserver_fingerprint(control).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = fingerprints(admin).await?;
        if now != held || now.contains(&server) {
            return Err(format!(
                "while the server was stopped the daemons' models changed: {held:?} → {now:?}"
            ));
        }
        if let Some(v) = x_swap(env).await.map_err(|e| format!("while stopped: {e}"))? {
            return Err(format!("while stopped: x-swap {v:?}, want the last model's none"));
        }
        control_request(control, "POST", "/lab/start").await?;
        env.settle().await.map_err(|e| format!("after the start: {e}"))?;
        match x_swap(env).await? {
            Some(v) if v == "1" => Ok(
                "stopped: the last model served (echo, no x-swap); started: the change served (x-swap: 1)"
                    .into(),
            ),
            other => Err(format!("after the start: x-swap {other:?}, want \"1\"")),
        }
    })
    .await
}

async fn expired(env: &Env) -> Check {
    let (control, _) = sockets(env)?;
    env.overlay(Some("swap")).await?;
    if x_swap(env).await?.as_deref() != Some("1") {
        return Err("with the swap overlay: no x-swap: 1".into());
    }
    control_request(control, "POST", "/lab/stop").await?;
    restoring(env, control, "/lab/start", async {
        // The routes are deleted while no watch is open, then the history that holds their
        // deletion is dropped: a watch that resumes gets 410 Gone, and only a relist can show
        // that they are gone.
        env.swap_overlay_files(None)?;
        control_request(control, "POST", "/lab/reload").await?;
        control_request(control, "POST", "/lab/expire").await?;
        control_request(control, "POST", "/lab/start").await?;
        env.settle()
            .await
            .map_err(|e| format!("after the relist: {e}"))?;
        match x_swap(env).await? {
            None => Ok("relisted: the deleted route is gone (echo, no x-swap)".into()),
            Some(v) => Err(format!(
                "after the relist: x-swap {v:?}: a deleted route is still held"
            )),
        }
    })
    .await
}

/// The HTTPRoute watch's series of a daemon's `/metrics`: (forbidden, relists, recoveries).
async fn route_watch(socket: &std::path::Path) -> Result<(f64, f64, f64), String> {
    let text = super::admin_get(socket, "/metrics").await?;
    let samples = super::parse_exposition(&text)?;
    let kind = [("kind", "HTTPRoute")];
    let get = |name: &str| super::sum_samples(&samples, name, &kind);
    Ok((
        get("aether_registry_watch_forbidden"),
        get("aether_registry_watch_relists_total"),
        get("aether_registry_watch_recoveries_total"),
    ))
}

/// Whether every daemon's HTTPRoute watch reads `forbidden` (1: refused, 0: read).
async fn routes_forbidden_everywhere(
    admin: &[std::path::PathBuf],
    forbidden: f64,
) -> Result<bool, String> {
    for socket in admin {
        if route_watch(socket).await?.0 != forbidden {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Polls `check` until it holds (`Ok(true)`), at most `bound`; `what` names it in the error.
async fn until<F: Future<Output = Result<bool, String>>>(
    what: &str,
    bound: Duration,
    check: impl Fn() -> F,
) -> Result<Duration, String> {
    let started = aether::time::now();
    loop {
        let last = check().await;
        if let Ok(true) = last {
            return Ok(started.elapsed());
        }
        if started.elapsed() > bound {
            return Err(match last {
                Err(e) => format!("{what}: not within {bound:?}: {e}"),
                Ok(_) => format!("{what}: not within {bound:?}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// mp-httponly's rbac (the `deny-rbac` overlay's MeshFilter) as each node's daemon applies it:
/// from mp-client to each replica's IP (replica 0 on node-a, 1 on node-b), so that each answer
/// is its own node's.
async fn httponly_denied_on_every_node(env: &Env) -> Result<bool, String> {
    for replica in ["mp-httponly-0", "mp-httponly-1"] {
        let ip = env.pod_ip("mp", replica)?;
        let o = env
            .probe("mp-client", &probe(super::addr(ip, 8080), super::get("/")))
            .await?;
        if super::answer(&o, 403, "authz-denied", None).is_err() {
            return Ok(false);
        }
    }
    Ok(true)
}

async fn forbidden(env: &Env) -> Check {
    let (control, admin) = sockets(env)?;
    env.overlay(None).await?;
    if let Some(v) = x_swap(env).await? {
        return Err(format!("before: x-swap {v:?}, want none"));
    }
    if httponly_denied_on_every_node(env).await? {
        return Err("before: mp-httponly already denies mp-client".into());
    }
    let mut before = Vec::new();
    for socket in admin {
        before.push(route_watch(socket).await?);
    }
    let query = format!("?resource={ROUTES}");
    control_request(control, "POST", &format!("/lab/forbid{query}")).await?;
    restoring(env, control, &format!("/lab/allow{query}"), async {
        // As a watch's timeout ends it: the next one is refused.
        control_request(control, "POST", &format!("/lab/end-watches{query}")).await?;
        until("every daemon sees HTTPRoute refused", SEEN_BOUND, || {
            routes_forbidden_everywhere(admin, 1.0)
        })
        .await?;
        for socket in admin {
            let ready = super::admin_get(socket, "/ready")
                .await
                .map_err(|e| format!("refused: {} not ready: {e}", socket.display()))?;
            if !ready.lines().any(|l| l.starts_with("degraded: HTTPRoute: may not be read (403)")) {
                return Err(format!(
                    "refused: {} /ready says {ready:?}, want a degraded: HTTPRoute line",
                    socket.display()
                ));
            }
        }
        // A MeshFilter (another kind) and a route (the refused kind) are made together.
        env.swap_overlays_files(&["swap", "deny-rbac"])?;
        control_request(control, "POST", "/lab/reload").await?;
        until(
            "every node applies the MeshFilter made while HTTPRoutes are refused",
            SEEN_BOUND,
            || httponly_denied_on_every_node(env),
        )
        .await?;
        if let Some(v) = x_swap(env).await? {
            return Err(format!(
                "refused: x-swap {v:?}: a route made while HTTPRoutes may not be read is served"
            ));
        }
        super::extra::cni(env)
            .await
            .map_err(|e| format!("CNI while refused: {e}"))?;
        control_request(control, "POST", &format!("/lab/allow{query}")).await?;
        let ended = until(
            "every daemon reads HTTPRoutes again",
            RETRY_BOUND + SEEN_BOUND / 2,
            || routes_forbidden_everywhere(admin, 0.0),
        )
        .await?;
        env.settle()
            .await
            .map_err(|e| format!("allowed again: {e}"))?;
        if x_swap(env).await?.as_deref() != Some("1") {
            return Err("allowed again: no x-swap: 1".into());
        }
        for (socket, (_, relists, recoveries)) in admin.iter().zip(&before) {
            let (forbidden, relists_now, recoveries_now) = route_watch(socket).await?;
            if relists_now != *relists {
                return Err(format!(
                    "{}: HTTPRoute relisted ({relists} → {relists_now}); the watch should have resumed",
                    socket.display()
                ));
            }
            if recoveries_now <= *recoveries || forbidden != 0.0 {
                return Err(format!(
                    "{}: HTTPRoute forbidden {forbidden}, recoveries {recoveries} → {recoveries_now}",
                    socket.display()
                ));
            }
            let ready = super::admin_get(socket, "/ready").await?;
            if ready.contains("degraded") {
                return Err(format!("allowed again: {} /ready {ready:?}", socket.display()));
            }
        }
        Ok(format!(
            "refused: ready (degraded), MeshFilter applied on both nodes, CNI ADD served, new route not seen; allowed: read again after {:.1}s (bound {RETRY_BOUND:?}), route served, no relist",
            ended.as_secs_f64()
        ))
    })
    .await
}

async fn writes(env: &Env) -> Check {
    use aether::registry::kube::generated::FIELD_MANAGER;
    let (control, _) = sockets(env)?;
    env.settle().await?;
    let json = |body: String| -> Result<serde_json::Value, String> {
        serde_json::from_str(&body).map_err(|e| e.to_string())
    };
    let leases = json(
        control_request(
            control,
            "GET",
            &format!(
                "/lab/objects/coordination.k8s.io/leases?namespace={}",
                RELEASE_NAMESPACE
            ),
        )
        .await?,
    )?;
    let holder = leases
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| l["metadata"]["name"] == LEASE)
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
        .ok_or_else(|| format!("no Lease {LEASE} with a holder in {}", RELEASE_NAMESPACE))?;
    let writes = json(control_request(control, "GET", "/lab/writes").await?)?;
    let rows = writes.as_array().cloned().unwrap_or_default();
    let count = |f: &dyn Fn(&serde_json::Value) -> bool| -> u64 {
        rows.iter()
            .filter(|r| f(r))
            .filter_map(|r| r["count"].as_u64())
            .sum()
    };
    let applies = count(&|r| {
        r["verb"] == "apply" && r["resource"] == "services" && r["field_manager"] == FIELD_MANAGER
    });
    if applies == 0 {
        return Err(format!(
            "no server-side apply of a Service by {FIELD_MANAGER}; writes: {writes}"
        ));
    }
    let route_status = |r: &serde_json::Value| {
        r["resource"]
            .as_str()
            .is_some_and(|res| res.ends_with("/status") && res.contains("routes"))
    };
    let statuses = count(&|r| route_status(r) && r["verb"] != "update-conflict");
    if statuses == 0 {
        return Err(format!("no route status written; writes: {writes}"));
    }
    // issue #36 item 3: the Lease holder writes a change first and the other node finds it
    // written, so a change costs no 409. Both nodes wrote every change before (measured: 20
    // writes and 15 answered 409); a few may still meet at start, before a Lease is read.
    let conflicts = count(&|r| route_status(r) && r["verb"] == "update-conflict");
    if conflicts * 2 >= statuses {
        return Err(format!(
            "{conflicts} route status PUTs answered 409 for {statuses} written: both nodes write each change; writes: {writes}"
        ));
    }
    Ok(format!(
        "Lease held by {holder}; {applies} Service applies by {FIELD_MANAGER}; {statuses} route status writes, {conflicts} answered 409"
    ))
}

/// The chart's Grafana dashboard (issue #10 §4).
const DASHBOARD: &str = include_str!("../../../../charts/aether/dashboards/aether.json");

/// The leg: every metric the dashboard's queries name is exported by every daemon. On the
/// Kubernetes source, so that the watches' metrics are there too.
async fn dashboard(env: &Env) -> Check {
    let (_, admins) = sockets(env)?;
    let (queries, wanted) = dashboard_metrics(DASHBOARD)?;
    for socket in admins {
        let text = super::admin_get(socket, "/metrics").await?;
        let have = exported(&text);
        let missing: Vec<&String> = wanted.iter().filter(|m| !have.contains(*m)).collect();
        if !missing.is_empty() {
            return Err(format!(
                "the dashboard queries {missing:?}, which the daemon of {} does not export",
                socket.display()
            ));
        }
    }
    Ok(format!(
        "{} metrics in {queries} queries, each exported by all {} daemons",
        wanted.len(),
        admins.len()
    ))
}

/// The number of queries in a Grafana dashboard (panel targets and template variables), and
/// every metric they name (`aether_…` and `process_…` identifiers).
pub(crate) fn dashboard_metrics(
    json: &str,
) -> Result<(usize, std::collections::BTreeSet<String>), String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "query", serde_json::Value::String(q)) => out.push(q.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let doc: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("the dashboard is not JSON: {e}"))?;
    let mut queries = Vec::new();
    walk(&doc, &mut queries);
    let mut metrics = std::collections::BTreeSet::new();
    for q in &queries {
        let words = q.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'));
        metrics.extend(
            words
                .filter(|w| w.starts_with("aether_") || w.starts_with("process_"))
                .map(str::to_owned),
        );
    }
    Ok((queries.len(), metrics))
}

/// Every series name a `/metrics` text can hold: its samples', and for each `# TYPE` line the
/// names that family's samples take (`_total` of a counter; `_bucket`, `_sum`, `_count` of a
/// histogram), so that a family with no series yet counts as exported.
pub(crate) fn exported(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            if !name.is_empty() {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// The `Accepted` condition (status, reason, message) of a MeshFilter as the lab API server holds
/// it, if any.
async fn filter_accepted(
    control: &std::path::Path,
    namespace: &str,
    name: &str,
) -> Result<Option<(String, String, String)>, String> {
    let body = control_request(
        control,
        "GET",
        &format!("/lab/objects/aether.io/meshfilters?namespace={namespace}"),
    )
    .await?;
    let all: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    let found = all
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["metadata"]["name"] == name)
        .and_then(|f| f["status"]["conditions"].as_array().cloned())
        .and_then(|cs| cs.into_iter().find(|c| c["type"] == "Accepted"));
    Ok(found.map(|c| {
        let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
        (text("status"), text("reason"), text("message"))
    }))
}

/// issue #35 item 1 on the Kubernetes source: the POLICY leg's checks (mp-nine refuses on every
/// path, plaintext too, the diagnostic on every daemon), and the registrar writes the filter's
/// status: `Accepted` `False`, reason `Invalid`, with the converter's words; a filter the daemons
/// read (mp-multi's ext_authz) is `Accepted` `True`.
async fn policy(env: &Env) -> Check {
    let (control, _) = sockets(env)?;
    let checked = async {
        let refused = super::hostile::policy_refuses(env).await?;
        let (ns, name) = super::hostile::UNREADABLE_FILTER
            .split_once('/')
            .ok_or("the filter's name")?;
        let started = aether::time::now();
        let message = loop {
            let seen = filter_accepted(control, ns, name).await?;
            match seen {
                Some((status, reason, message)) if status == "False" && reason == "Invalid" => {
                    break message;
                }
                other if started.elapsed() > SEEN_BOUND => {
                    return Err(format!(
                        "{ns}/{name}: no Accepted False Invalid within {SEEN_BOUND:?}, last {other:?}"
                    ));
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        if !message.contains("extAuthz.server") {
            return Err(format!("the status does not say why: {message:?}"));
        }
        let good = filter_accepted(control, "mp", "mp-multi-ext-authz").await?;
        if !good
            .as_ref()
            .is_some_and(|(status, reason, _)| status == "True" && reason == "Accepted")
        {
            return Err(format!("mp/mp-multi-ext-authz: want Accepted True, got {good:?}"));
        }
        Ok(format!(
            "{refused}; status of {}: Accepted False Invalid ({message}); mp/mp-multi-ext-authz Accepted True",
            super::hostile::UNREADABLE_FILTER
        ))
    }
    .await;
    env.overlay(None).await?;
    checked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dashboards_metrics_are_read_from_its_queries_and_a_family_with_no_series_counts() {
        let (queries, metrics) = dashboard_metrics(DASHBOARD).unwrap();
        assert!(queries >= 30, "{queries}");
        for m in [
            "aether_http_requests_total",
            "aether_http_request_duration_seconds_bucket",
            "aether_refusals_total",
            "aether_registry_watch_errors_total",
            "aether_workload_cert_expiry_timestamp_seconds",
            "process_resident_memory_bytes",
        ] {
            assert!(metrics.contains(m), "{m} not in {metrics:?}");
        }
        // No PromQL function or label is taken for a metric.
        assert!(metrics.iter().all(|m| !m.contains("rate")), "{metrics:?}");
        let text = "# HELP a_x X.\n# TYPE a_x counter\n# TYPE a_h_seconds histogram\n\
                    a_h_seconds_bucket{le=\"0.1\"} 1\n# TYPE a_g gauge\na_g{kind=\"Pod\"} 1\n";
        let have = exported(text);
        for n in [
            "a_x_total",
            "a_h_seconds_bucket",
            "a_h_seconds_count",
            "a_g",
        ] {
            assert!(have.contains(n), "{n} not in {have:?}");
        }
        assert!(!have.contains("a_x"));
        assert!(dashboard_metrics("{not json").is_err());
    }
}
