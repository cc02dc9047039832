//! The EXPLAIN leg (issue #10, acceptance): for a seeded random sample of HTTP requests through
//! the mesh (services, ports declared or not, name spellings, Host fields, paths), `aether debug
//! explain` on the caller's own daemon answers exactly what the data plane did: the status, the
//! `x-aether-error` reason, and for a delivery the echo's identity string (`<workload>:<port>`
//! of one of the pods it names).
//!
//! The seed is printed with the result and read from `AETHER_EXPLAIN_SEED`, so a failure can
//! be replayed; `AETHER_EXPLAIN_REQUESTS` sets the sample size (default 300).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use super::{Check, Env, Leg, Need, probe};
use crate::workload::probe::{Dial, Host, HttpRequest, Outcome, Send};
use aether::debug::ExplainRequest;
use aether_core::model::port::PortProtocol;
use aether_core::model::snapshot::ProtocolValue;

/// The legs.
pub const EXPLAIN: &[Leg] = &[
    leg!(
        "EXPLAIN",
        "aether debug explain answers what the data plane did (seeded random requests)",
        None,
        explain_matches
    ),
    leg!(
        "DUMP",
        "aether explain --config-dump replays each daemon's aether debug config-dump",
        None,
        dump_replays
    ),
];

/// The client pods the sample is sent from (both capture everything).
const CLIENTS: &[&str] = &["mp-client", "mp-client-other"];

/// Ports no mesh service of the fixture declares.
const UNDECLARED: &[u16] = &[80, 8081, 9999];

const PATHS: &[&str] = &["/", "/a/b", "/search?q=1&r=2", "/healthz", "/%7Euser/x"];

/// A mesh service of the sample: its HTTP ports, and the workload each of its pods runs.
struct Target {
    name: String,
    http_ports: Vec<u16>,
}

/// Which daemon's admin socket serves each client pod.
async fn sockets_of(sockets: &[PathBuf]) -> Result<BTreeMap<String, PathBuf>, String> {
    let mut out = BTreeMap::new();
    for s in sockets {
        let body = super::admin_get(s, "/debug/pods").await?;
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        for p in v["pods"].as_array().into_iter().flatten() {
            if let Some(name) = p["pod"].as_str() {
                out.insert(name.to_owned(), s.clone());
            }
        }
    }
    Ok(out)
}

/// The `--workload` of each pod's command: what its echo answers before `:<port>`.
fn workloads(env: &Env) -> BTreeMap<String, String> {
    env.snapshot
        .pods
        .iter()
        .filter_map(|p| {
            let i = p.command.iter().position(|a| a == "--workload")?;
            Some((p.name.clone(), p.command.get(i + 1)?.clone()))
        })
        .collect()
}

/// The HTTP/1 ports a pod's echo serves (`--http <port>`; a `--grpc` port speaks h2c only).
/// None for a pod only a CNI ADD serves (`aether.io/netns-from: cni`): the lab sends that ADD
/// in the CNI leg alone, and until then the pod's daemon does not serve it, which no model
/// can know.
fn echo_http_ports(env: &Env, pod: &str) -> BTreeSet<u16> {
    let Some(p) = env
        .snapshot
        .pods
        .iter()
        .find(|p| p.name == pod && !p.netns_from_cni)
    else {
        return BTreeSet::new();
    };
    p.command
        .windows(2)
        .filter(|w| w[0] == "--http")
        .filter_map(|w| w[1].parse().ok())
        .collect()
}

/// The mesh services of namespace `mp` whose pods run an echo, with the ports they declare
/// HTTP and the echo serves as HTTP/1.
fn targets(env: &Env) -> Vec<Target> {
    let mut ports: BTreeMap<&str, BTreeSet<u16>> = BTreeMap::new();
    for row in env.snapshot.rows.iter().filter(|r| r.namespace == "mp") {
        let served = row
            .pod
            .as_deref()
            .map(|p| echo_http_ports(env, p))
            .unwrap_or_default();
        for (port, p) in row.port_protocols.iter().flatten() {
            if *p == ProtocolValue::Known(PortProtocol::Http)
                && let Ok(port) = u16::try_from(*port)
                && served.contains(&port)
            {
                ports.entry(&row.service).or_default().insert(port);
            }
        }
    }
    ports
        .into_iter()
        .map(|(name, p)| Target {
            name: name.to_owned(),
            http_ports: p.into_iter().collect(),
        })
        .collect()
}

/// One random request: the dial as explain takes it, the probe's dial, the Host fields.
struct Sample {
    client: &'static str,
    dial: String,
    probe_dial: Dial,
    host: Option<String>,
    path: &'static str,
}

fn sample(rng: &mut fastrand::Rng, env: &Env, targets: &[Target]) -> Result<Sample, String> {
    let client = CLIENTS[rng.usize(..CLIENTS.len())];
    let t = &targets[rng.usize(..targets.len())];
    // Mostly declared HTTP ports; now and then one nobody declares.
    let port = if rng.u8(..4) == 0 {
        UNDECLARED[rng.usize(..UNDECLARED.len())]
    } else {
        t.http_ports[rng.usize(..t.http_ports.len())]
    };
    let mesh = env.mesh(&t.name);
    // A user Service that owns a mesh name (mp-owned) is not the mesh's: its ClusterIP on a
    // port it does not list is a passthrough to nowhere, which only shows as a timeout.
    let generated = env
        .snapshot
        .services
        .iter()
        .any(|x| x.namespace == "mp" && x.name == t.name && x.generated);
    let (name, probe_dial) = match rng.u8(..3) {
        0 if generated => {
            let ip = env.cluster_ip("mp", &t.name)?;
            (ip.to_string(), super::addr(ip, port))
        }
        1 => {
            let upper = mesh.to_ascii_uppercase();
            (upper.clone(), super::name(&upper, port))
        }
        _ => (mesh.clone(), super::name(&mesh, port)),
    };
    let other = t
        .http_ports
        .iter()
        .copied()
        .find(|p| *p != port)
        .unwrap_or(81);
    let host = match rng.u8(..6) {
        0 => Some(format!("{mesh}:{port}")),
        1 => Some(format!("{mesh}:{other}")),
        2 => Some(mesh.to_ascii_uppercase()),
        3 => Some(format!("{}:{port}", t.name)),
        _ => None,
    };
    Ok(Sample {
        client,
        dial: format!("{name}:{port}"),
        probe_dial,
        host,
        path: PATHS[rng.usize(..PATHS.len())],
    })
}

/// What the data plane did and what explain says, as comparable text; `None` when explain's
/// answer is not one a single HTTP exchange shows (a hold, a passthrough, no HTTP).
fn expected(v: &serde_json::Value, workloads: &BTreeMap<String, String>) -> Option<Vec<String>> {
    let step = &v["explanation"]["request"];
    match step["outcome"].as_str()? {
        "deliver" => {
            let port = step["pod_port"].as_u64()?;
            Some(
                step["pods"]
                    .as_array()?
                    .iter()
                    .filter_map(|p| workloads.get(p.as_str()?))
                    .map(|wl| format!("200 - {wl}:{port}"))
                    .collect(),
            )
        }
        // Passed through to the dialled address: whatever answers, it is not the mesh.
        "passthrough" => Some(vec![PASSED.to_owned()]),
        "refuse" | "answer" => Some(vec![format!(
            "{} {} {}",
            step["status"],
            step["reason"].as_str().unwrap_or("-"),
            step["reason"].as_str().unwrap_or("-")
        )]),
        _ => None,
    }
}

/// What a passthrough shows: no mesh answer (no `x-aether-error`), or, when nothing listens
/// at the dialled address, the mesh's `503 upstream-unreachable` for the failed connect (as
/// legs.md §1.5 allows for a passed-through HTTP request).
const PASSED: &str = "passed through";

fn seen(o: &Outcome, outcome: &str) -> String {
    let unreachable = o.status == Some(503) && o.reason() == Some("upstream-unreachable");
    if outcome == "passthrough" && (o.reason().is_none() || unreachable) {
        return PASSED.to_owned();
    }
    format!(
        "{} {} {}",
        o.status.map_or("-".to_owned(), |s| s.to_string()),
        o.reason().unwrap_or("-"),
        o.first_line()
    )
}

/// How many samples are in flight at once (the passthroughs to an address nothing serves wait
/// out the data plane's connect bound; in parallel they keep the leg short).
const IN_FLIGHT: usize = 16;

/// What one sample showed: explain's outcome, and whether it was compared.
struct Agreed {
    outcome: String,
    compared: bool,
    generation: Option<u64>,
}

/// Ask the caller's daemon to explain one sample, send it, and compare.
async fn check_one(
    env: &Env,
    socket: &std::path::Path,
    workloads: &BTreeMap<String, String>,
    i: usize,
    s: Sample,
) -> Result<Agreed, String> {
    let namespace = env
        .snapshot
        .pods
        .iter()
        .find(|p| p.name == s.client)
        .map_or("mp", |p| p.namespace.as_str());
    let request = ExplainRequest {
        from: format!("{namespace}/{}", s.client),
        dial: s.dial.clone(),
        host: s.host.iter().cloned().collect(),
        path: Some(s.path.to_owned()),
        ..ExplainRequest::default()
    };
    let body = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
    let (status, answer) =
        aether::debug::client::call(socket, "POST", "/debug/explain", Some(body))
            .await
            .map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_slice(&answer)
        .map_err(|e| format!("request {i}: explain answered {status}: {e}"))?;
    let send = Send::Http(HttpRequest {
        host: s
            .host
            .clone()
            .map_or(Host::Default, |h| Host::Values(vec![h])),
        ..HttpRequest::get(s.path)
    });
    let mut p = probe(s.probe_dial, send);
    p.timeout = Duration::from_secs(2);
    let sent = env.probe(s.client, &p).await;
    let what = format!(
        "request {i}: {} dials {} (Host {:?}, path {})",
        s.client, s.dial, s.host, s.path
    );
    // A name with no DNS record (a mesh name a user Service owns, model.md §11): explain
    // refuses the question, and the client's resolver finds no address either.
    let unresolved = v["error"]
        .as_str()
        .is_some_and(|e| e.contains("resolves to no address"));
    if status == 400 && unresolved {
        if let Ok(o) = &sent
            && o.connected
        {
            return Err(format!(
                "{what}: explain finds no address, the client connected: {}",
                o.summary()
            ));
        }
        return Ok(Agreed {
            outcome: "no-address".into(),
            compared: true,
            generation: None,
        });
    }
    if status != 200 {
        return Err(format!("{what}: explain answered {status}: {v}"));
    }
    let o = sent?;
    let outcome = v["explanation"]["request"]["outcome"]
        .as_str()
        .unwrap_or("none")
        .to_owned();
    let generation = v["generation"].as_u64();
    let Some(want) = expected(&v, workloads) else {
        return Ok(Agreed {
            outcome,
            compared: false,
            generation,
        });
    };
    let got = seen(&o, &outcome);
    if !want.contains(&got) {
        return Err(format!(
            "{what}: the data plane answered {got:?}, explain says {want:?} ({})",
            v["explanation"]["request"]["rule"]
        ));
    }
    Ok(Agreed {
        outcome,
        compared: true,
        generation,
    })
}

/// The seed of the random sample: `AETHER_EXPLAIN_SEED` to replay a run, else a fresh one (each
/// leg prints the seed it used).
fn seed() -> u64 {
    std::env::var("AETHER_EXPLAIN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..))
}

async fn explain_matches(env: &Env) -> Check {
    use futures_util::StreamExt;
    let Some(reg) = &env.registry else {
        return Err(env.not_here(Need::DaemonSockets));
    };
    let seed = seed();
    let count: usize = std::env::var("AETHER_EXPLAIN_REQUESTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let fail = |e: String| format!("seed {seed}: {e}");
    let sockets = sockets_of(&reg.admin_sockets).await.map_err(fail)?;
    let workloads = workloads(env);
    let targets = targets(env);
    if targets.is_empty() {
        return Err(fail(
            "no mesh service with an HTTP port in namespace mp".into(),
        ));
    }
    // Drawn first, in order: the seed alone fixes the sample, whatever order answers come in.
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut samples = Vec::with_capacity(count);
    for i in 0..count {
        let s = sample(&mut rng, env, &targets).map_err(fail)?;
        let socket = sockets
            .get(s.client)
            .ok_or_else(|| fail(format!("no daemon serves {}", s.client)))?;
        samples.push((i, socket.clone(), s));
    }
    let mut results: Vec<(usize, Result<Agreed, String>)> = futures_util::stream::iter(samples)
        .map(|(i, socket, s)| {
            let workloads = &workloads;
            async move { (i, check_one(env, &socket, workloads, i, s).await) }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    results.sort_by_key(|(i, _)| *i);
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut generations = BTreeSet::new();
    let mut compared = 0;
    for (_, r) in results {
        let a = r.map_err(fail)?;
        *outcomes.entry(a.outcome).or_default() += 1;
        compared += usize::from(a.compared);
        generations.extend(a.generation);
    }
    if generations.len() != 1 {
        return Err(fail(format!(
            "the model changed during the sample: generations {generations:?}"
        )));
    }
    // Most of the sample must be compared, or the leg would prove little.
    if compared * 10 < count * 9 {
        return Err(fail(format!(
            "only {compared} of {count} answers were comparable: {outcomes:?}"
        )));
    }
    Ok(format!(
        "seed {seed}: {compared}/{count} requests agree ({}), generation {}",
        outcomes
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        generations.first().copied().unwrap_or(0)
    ))
}

/// Run this binary (`aether`) with `args`; its stdout, or what went wrong.
async fn aether(args: Vec<std::ffi::OsString>) -> Result<Vec<u8>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("find the aether binary: {e}"))?;
    let shown = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let out = tokio::process::Command::new(exe)
        .args(&args)
        .output()
        .await
        .map_err(|e| format!("aether {shown}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "aether {shown}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out.stdout)
}

/// The DUMP leg (issue #10, acceptance): for each daemon, `aether debug config-dump` is one
/// JSON document, and `aether explain --config-dump FILE` answers a set of questions (fixed
/// ones and a seeded random sample) exactly as `aether debug explain` does on that daemon.
async fn dump_replays(env: &Env) -> Check {
    let Some(reg) = &env.registry else {
        return Err(env.not_here(Need::DaemonSockets));
    };
    let seed = seed();
    let fail = |e: String| format!("seed {seed}: {e}");
    let targets = targets(env);
    if targets.is_empty() {
        return Err(fail(
            "no mesh service with an HTTP port in namespace mp".into(),
        ));
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut asked = 0;
    let mut sizes = Vec::new();
    for socket in &reg.admin_sockets {
        let state_dir = socket
            .parent()
            .ok_or_else(|| fail(format!("{} has no directory", socket.display())))?;
        let dump = aether(vec![
            "debug".into(),
            "config-dump".into(),
            "--state-dir".into(),
            state_dir.into(),
        ])
        .await
        .map_err(fail)?;
        let doc: serde_json::Value = serde_json::from_slice(&dump).map_err(|e| {
            fail(format!(
                "the config dump of {} is not JSON: {e}",
                socket.display()
            ))
        })?;
        let generation = doc["generation"].as_u64();
        sizes.push(dump.len());
        let file = state_dir.join("leg-config-dump.json");
        std::fs::write(&file, &dump).map_err(|e| fail(format!("{}: {e}", file.display())))?;
        let mut questions: Vec<Vec<String>> = vec![
            vec!["--dial".into(), env.mesh("mp-multi") + ":8080"],
            vec![
                "--dial".into(),
                env.mesh("mp-multi") + ":8080",
                "--host".into(),
                env.mesh("mp-multi") + ":9090",
            ],
            vec!["--dial".into(), env.mesh("mp-httponly") + ":9999"],
            vec![
                "--dial".into(),
                env.mesh("mp-udp") + ":18082",
                "--bytes".into(),
                "udp".into(),
            ],
            vec![
                "--dial".into(),
                env.mesh("mp-tcpfirst") + ":5432",
                "--bytes".into(),
                "raw".into(),
            ],
            vec![
                "--dial".into(),
                "127.0.0.1:18081".into(),
                "--host".into(),
                env.mesh("mp-nine") + ":9000",
            ],
        ];
        for _ in 0..10 {
            let s = sample(&mut rng, env, &targets).map_err(fail)?;
            let mut q = vec!["--dial".into(), s.dial, "--path".into(), s.path.into()];
            if let Some(h) = s.host {
                q.extend(["--host".into(), h]);
            }
            questions.push(q);
        }
        for q in questions {
            let mut live_args: Vec<std::ffi::OsString> = vec![
                "debug".into(),
                "explain".into(),
                "--state-dir".into(),
                state_dir.into(),
                "-o".into(),
                "json".into(),
                "--from".into(),
                "mp/mp-client".into(),
            ];
            live_args.extend(q.iter().map(Into::into));
            let live = aether(live_args).await;
            let mut offline_args: Vec<std::ffi::OsString> = vec![
                "explain".into(),
                "--config-dump".into(),
                file.clone().into(),
                "-o".into(),
                "json".into(),
                "--from".into(),
                "mp/mp-client".into(),
            ];
            offline_args.extend(q.iter().map(Into::into));
            let offline = aether(offline_args).await;
            let (live, offline) = match (live, offline) {
                // The same refusal of the question (a name with no address) on both sides.
                (Err(a), Err(b)) if a.contains("no address") && b.contains("no address") => {
                    asked += 1;
                    continue;
                }
                (Ok(a), Ok(b)) => (a, b),
                (a, b) => {
                    return Err(fail(format!(
                        "{q:?} on {}: live {a:?}, offline {b:?}",
                        socket.display()
                    )));
                }
            };
            let live: serde_json::Value =
                serde_json::from_slice(&live).map_err(|e| fail(e.to_string()))?;
            let offline: serde_json::Value =
                serde_json::from_slice(&offline).map_err(|e| fail(e.to_string()))?;
            if live["generation"].as_u64() != generation {
                return Err(fail(format!(
                    "the model of {} changed during the leg",
                    socket.display()
                )));
            }
            if live["explanation"] != offline {
                return Err(fail(format!(
                    "{q:?} on {}: live {} offline {offline}",
                    socket.display(),
                    live["explanation"]
                )));
            }
            asked += 1;
        }
        let _ = std::fs::remove_file(&file);
    }
    Ok(format!(
        "seed {seed}: {asked} questions answered alike live and from the dumps ({} bytes)",
        sizes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    ))
}
