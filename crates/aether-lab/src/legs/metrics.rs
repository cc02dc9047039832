//! The metrics leg (issue #10 §1 acceptance): a known set of requests through real sockets,
//! and the daemons' `/metrics` read before and after. Each counter and histogram count named
//! below must move by exactly what those requests make, with the labels they must carry.
//!
//! The requests, from `mp-client` and `mp-client-nocapture` on node-a:
//! - 5 delivered GETs to mp-httponly-1 (node-b) by pod IP: outbound on node-a, inbound on node-b;
//! - 3 refusals with different reasons: `port-mismatch`, `port-not-declared`, `port-not-http`;
//! - 1 `ext_authz` denial (mp-multi-1, `401 authz-denied`);
//! - 1 passthrough (ext-http, outside the mesh);
//! - 1 raw-TCP stream to mp-mixed-1:9000 (node-b), with a known payload each way;
//! - 1 request to mp-mixed-1:8080 (node-b) that switches protocols (`101`), then a known
//!   payload each way on the switched connection: counted as a `1xx` request and as the byte
//!   stream it became, on both sides.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::{Check, Env, Leg, Need, addr, answer, echo, get, get_host, loopback, name, probe};
use crate::workload::echo::AUTHZ_DENY_HEADER;
use crate::workload::probe::{ReadUntil, Send};

/// The leg, run after the extra legs.
pub static METRICS: &[Leg] = &[leg!(
    "METRICS",
    "/metrics moves by exactly the requests sent: delivered, refused, denied, passed through, raw TCP",
    None,
    metrics
)];

const CLIENT: &str = "mp-client";
const NOCAP: &str = "mp-client-nocapture";
/// Delivered requests sent.
const DELIVERED: u64 = 5;
/// The raw-TCP payload.
const PAYLOAD: &[u8] = b"metrics-leg-payload\n";
/// The bytes sent on the switched connection.
const SWITCHED: &str = "metrics-leg-switched\n";

/// One sample of the text exposition: its name and labels.
type Key = (String, BTreeMap<String, String>);

/// Parse the OpenMetrics text exposition into samples (comments and `# EOF` skipped).
pub fn parse_exposition(text: &str) -> Result<BTreeMap<Key, f64>, String> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("no value: {line:?}"))?;
        let value: f64 = value.parse().map_err(|_| format!("bad value: {line:?}"))?;
        let (name, labels) = match series.split_once('{') {
            None => (series.to_owned(), BTreeMap::new()),
            Some((name, rest)) => {
                let rest = rest
                    .strip_suffix('}')
                    .ok_or_else(|| format!("unclosed labels: {line:?}"))?;
                (name.to_owned(), parse_labels(rest)?)
            }
        };
        out.insert((name, labels), value);
    }
    Ok(out)
}

fn parse_labels(mut rest: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once("=\"")
            .ok_or_else(|| format!("bad label in {rest:?}"))?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => {
                    if let Some((_, c)) = chars.next() {
                        value.push(match c {
                            'n' => '\n',
                            other => other,
                        });
                    }
                }
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => return Err(format!("unclosed label value in {rest:?}")),
            }
        };
        labels.insert(key.to_owned(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    Ok(labels)
}

/// The sum of every sample named `name` whose labels include all of `labels`.
pub fn sum(samples: &BTreeMap<Key, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|((n, l), _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, v)| v)
        .sum()
}

/// One expectation: on which daemon (`None`: both, summed), which series, by how much.
struct Want {
    node: Option<usize>,
    name: &'static str,
    labels: Vec<(&'static str, String)>,
    delta: f64,
}

impl Want {
    fn new(
        node: Option<usize>,
        name: &'static str,
        labels: &[(&'static str, &str)],
        delta: f64,
    ) -> Self {
        Self {
            node,
            name,
            labels: labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
            delta,
        }
    }

    fn value(&self, samples: &[BTreeMap<Key, f64>]) -> f64 {
        let labels: Vec<(&str, &str)> = self.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        match self.node {
            Some(i) => samples.get(i).map_or(0.0, |s| sum(s, self.name, &labels)),
            None => samples.iter().map(|s| sum(s, self.name, &labels)).sum(),
        }
    }
}

async fn scrape(sockets: &[PathBuf]) -> Result<Vec<BTreeMap<Key, f64>>, String> {
    let mut out = Vec::new();
    for s in sockets {
        out.push(parse_exposition(&super::admin_get(s, "/metrics").await?)?);
    }
    Ok(out)
}

/// A scrape taken when every relayed byte stream both daemons opened has closed (at most 5 s).
async fn quiet(sockets: &[PathBuf]) -> Result<Vec<BTreeMap<Key, f64>>, String> {
    let deadline = aether::time::now() + Duration::from_secs(5);
    loop {
        let now = scrape(sockets).await?;
        let open: f64 = now
            .iter()
            .map(|s| {
                sum(s, "aether_tcp_connections_opened_total", &[])
                    - sum(s, "aether_tcp_connections_closed_total", &[])
            })
            .sum();
        if open == 0.0 || aether::time::now() > deadline {
            return Ok(now);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The labels of a service port's series of requests and streams from `CLIENT` (mesh service
/// `mp/mp-client`), on either side of the hop.
fn dst<'a>(direction: &'a str, svc: &'a str, port: &'a str) -> Vec<(&'static str, &'a str)> {
    vec![
        ("direction", direction),
        ("namespace", "mp"),
        ("service", svc),
        ("port", port),
        ("source_namespace", "mp"),
        ("source_service", CLIENT),
    ]
}

#[allow(clippy::too_many_lines)] // One list of requests, then one list of what they must move.
async fn metrics(env: &Env) -> Check {
    let Some(reg) = &env.registry else {
        return Err(env.not_here(Need::DaemonSockets));
    };
    let sockets = &reg.admin_sockets;
    let mut nodes = Vec::new();
    for s in sockets {
        let model = super::admin_get(s, "/model").await?;
        let v: serde_json::Value = serde_json::from_str(&model).map_err(|e| e.to_string())?;
        nodes.push(v["node"].as_str().unwrap_or_default().to_owned());
    }
    let node = |n: &str| nodes.iter().position(|x| x == n);
    let (Some(a), Some(b)) = (node("node-a"), node("node-b")) else {
        return Err(env.not_here(Need::DaemonSockets));
    };
    let (a, b) = (Some(a), Some(b));
    // Streams earlier traffic left open (the demo's start, an earlier leg) would close inside
    // the window: start once every relay either daemon opened has closed.
    let before = quiet(sockets).await?;

    // The requests.
    let httponly = env.pod_ip("mp", "mp-httponly-1")?;
    for _ in 0..DELIVERED {
        super::http(env, CLIENT, addr(httponly, 8080), get("/"), |o| {
            echo(o, "mp-httponly", 8080)
        })
        .await?;
    }
    let multi = env.mesh("mp-multi");
    super::http(
        env,
        CLIENT,
        name(&multi, 8080),
        get_host("/", &format!("{multi}:9090")),
        |o| answer(o, 421, "port-mismatch", Some("8080/http 9090/http")),
    )
    .await?;
    super::http(env, CLIENT, name(&multi, 7777), get("/"), |o| {
        answer(o, 421, "port-not-declared", Some("8080/http 9090/http"))
    })
    .await?;
    super::http(
        env,
        NOCAP,
        loopback(),
        get_host("/", &format!("{}:9000", env.mesh("mp-mixed"))),
        |o| answer(o, 421, "port-not-http", Some("8080/http 9000/tcp")),
    )
    .await?;
    let multi_1 = env.pod_ip("mp", "mp-multi-1")?;
    super::http(
        env,
        CLIENT,
        addr(multi_1, 8080),
        super::with_headers("/", None, &[(AUTHZ_DENY_HEADER, "401")]),
        |o| {
            if o.status == Some(401) && o.reason() == Some("authz-denied") {
                Ok(String::new())
            } else {
                Err(format!("want 401 authz-denied, got {}", o.summary()))
            }
        },
    )
    .await?;
    super::http(
        env,
        CLIENT,
        name("ext-http.mp-ext.svc.cluster.local", 18081),
        get("/"),
        |o| echo(o, "ext-http", 18081),
    )
    .await?;
    let mixed = env.pod_ip("mp", "mp-mixed-1")?;
    let mut p = probe(addr(mixed, 9000), Send::Raw(PAYLOAD.to_vec()));
    p.until = ReadUntil::Text("metrics-leg-payload".into());
    let o = env.probe(CLIENT, &p).await?;
    if !o.body_text().contains("mp-mixed:9000") {
        return Err(format!("raw TCP to mp-mixed-1:9000: got {}", o.summary()));
    }
    let echoed = o.body.len() as f64;
    let switch = format!(
        "GET /switch HTTP/1.1\r\nHost: {mixed}:8080\r\nConnection: Upgrade\r\n\
         Upgrade: echo\r\n\r\n{SWITCHED}"
    );
    // The echo's switched connection: its workload line, then the bytes back.
    let switched_back = format!("mp-mixed:8080\n{SWITCHED}");
    let mut p = probe(addr(mixed, 8080), Send::Raw(switch.into_bytes()));
    p.until = ReadUntil::Text(switched_back.clone());
    let o = env.probe(CLIENT, &p).await?;
    let text = o.body_text();
    if !text.starts_with("HTTP/1.1 101 ") || !text.ends_with(&switched_back) {
        return Err(format!(
            "switch to mp-mixed-1:8080: want 101 then {switched_back:?}, got {}",
            o.summary()
        ));
    }

    // What they must move.
    let n = DELIVERED as f64;
    let sent = PAYLOAD.len() as f64;
    let mut want = Vec::new();
    for (node, direction) in [(a, "outbound"), (b, "inbound")] {
        let mut ok = dst(direction, "mp-httponly", "8080");
        ok.extend([("code", "2xx"), ("reason", "")]);
        want.push(Want::new(node, "aether_http_requests_total", &ok, n));
        want.push(Want::new(
            node,
            "aether_http_request_duration_seconds_count",
            &dst(direction, "mp-httponly", "8080"),
            n,
        ));
        let tcp = dst(direction, "mp-mixed", "9000");
        want.push(Want::new(
            node,
            "aether_tcp_connections_opened_total",
            &tcp,
            1.0,
        ));
        want.push(Want::new(
            node,
            "aether_tcp_connections_closed_total",
            &tcp,
            1.0,
        ));
        want.push(Want::new(node, "aether_tcp_sent_bytes_total", &tcp, sent));
        want.push(Want::new(
            node,
            "aether_tcp_received_bytes_total",
            &tcp,
            echoed,
        ));
        want.push(Want::new(
            node,
            "aether_tcp_connection_duration_seconds_count",
            &tcp,
            1.0,
        ));
        let mut switched = dst(direction, "mp-mixed", "8080");
        switched.extend([("code", "1xx"), ("reason", "")]);
        want.push(Want::new(
            node,
            "aether_http_requests_total",
            &switched,
            1.0,
        ));
        let spliced = dst(direction, "mp-mixed", "8080");
        for (name, delta) in [
            ("aether_tcp_connections_opened_total", 1.0),
            ("aether_tcp_connections_closed_total", 1.0),
            ("aether_tcp_sent_bytes_total", SWITCHED.len() as f64),
            (
                "aether_tcp_received_bytes_total",
                switched_back.len() as f64,
            ),
        ] {
            want.push(Want::new(node, name, &spliced, delta));
        }
    }
    want.push(Want::new(
        a,
        "aether_hop_request_duration_seconds_count",
        &[
            ("namespace", "mp"),
            ("service", "mp-httponly"),
            ("port", "8080"),
            ("source_service", CLIENT),
        ],
        n,
    ));
    for reason in ["port-mismatch", "port-not-declared", "port-not-http"] {
        want.push(Want::new(
            a,
            "aether_refusals_total",
            &[("reason", reason)],
            1.0,
        ));
        let from = if reason == "port-not-http" {
            NOCAP
        } else {
            CLIENT
        };
        want.push(Want::new(
            a,
            "aether_http_requests_total",
            &[
                ("direction", "outbound"),
                ("source_service", from),
                ("code", "4xx"),
                ("reason", reason),
            ],
            1.0,
        ));
    }
    // The denial is made once, by the daemon that ran the check, and relayed by the other.
    want.push(Want::new(
        None,
        "aether_refusals_total",
        &[("reason", "authz-denied")],
        1.0,
    ));
    want.push(Want::new(
        None,
        "aether_authz_checks_total",
        &[("kind", "ext_authz"), ("outcome", "deny")],
        1.0,
    ));
    want.push(Want::new(
        None,
        "aether_authz_check_duration_seconds_count",
        &[("kind", "ext_authz")],
        1.0,
    ));
    let mut denied = dst("outbound", "mp-multi", "8080");
    denied.extend([("code", "4xx"), ("reason", "authz-denied")]);
    want.push(Want::new(a, "aether_http_requests_total", &denied, 1.0));
    want.push(Want::new(a, "aether_passthroughs_total", &[], 1.0));
    want.push(Want::new(b, "aether_passthroughs_total", &[], 0.0));

    // A relay's close is counted when the daemon's relay ends, just after the client's.
    let deadline = aether::time::now() + Duration::from_secs(5);
    loop {
        let after = scrape(sockets).await?;
        let wrong: Vec<String> = want
            .iter()
            .filter_map(|w| {
                let moved = w.value(&after) - w.value(&before);
                (moved != w.delta).then(|| {
                    format!(
                        "{}{:?} on {}: moved {moved} (from {}), want {}",
                        w.name,
                        w.labels,
                        w.node.map_or("both".to_owned(), |i| format!("daemon {i}")),
                        w.value(&before),
                        w.delta
                    )
                })
            })
            .collect();
        if wrong.is_empty() {
            return Ok(format!(
                "{} series moved by exactly the {} requests, 1 stream and 1 switched connection sent",
                want.len(),
                DELIVERED + 6
            ));
        }
        if aether::time::now() > deadline {
            return Err(wrong.join("; "));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_parses_into_named_labelled_samples() {
        let text = "# HELP x_total a\n# TYPE x_total counter\nx_total{a=\"1\",b=\"q\\\"x\"} 3\nx_total{a=\"2\",b=\"\"} 4\ny 1.5\n# EOF\n";
        let s = parse_exposition(text).unwrap();
        assert_eq!(sum(&s, "x_total", &[]), 7.0);
        assert_eq!(sum(&s, "x_total", &[("a", "1")]), 3.0);
        assert_eq!(sum(&s, "x_total", &[("b", "q\"x")]), 3.0);
        assert_eq!(sum(&s, "x_total", &[("b", "")]), 4.0);
        assert_eq!(sum(&s, "y", &[]), 1.5);
        assert!(parse_exposition("x{a=\"1} 2").is_err());
    }
}
