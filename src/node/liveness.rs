//! Delegated liveness (spec/model.md §14, §3.5): on the etcd source, the node that runs a pod
//! probes the pod's liveness port by that port's own class and writes the answer into the pod's
//! rows, so every node reads one answer.
//!
//! - An HTTP liveness port gets `GET /` over HTTP/1.1; any response below `500` is alive (the
//!   port answers HTTP and the application is not failing). A raw-TCP port gets a connect.
//!   A UDP or reserved liveness port is not probed: the pod counts as Ready.
//! - The probe leaves from inside the pod's network namespace with the daemon's mark, to the
//!   pod's own address: it is the application's answer, not the capture's.
//! - A pod is Ready from a success until `failure_threshold` failures in a row. A pod this run
//!   has not probed yet starts from the readiness its rows hold in the store (an earlier run's
//!   answer: a restarted daemon does not make its pods flap), not Ready when the store has none.
//!   Every probe has a deadline (`timeout`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::model::port::{PortProtocol, is_reserved};
use crate::model::snapshot::{ProtocolValue, Row};
use crate::proxy::socket::{SocketFactory, Source};

/// How probes are made.
#[derive(Clone, Copy, Debug)]
pub struct ProbeSettings {
    /// Between two rounds.
    pub interval: Duration,
    /// One probe's deadline.
    pub timeout: Duration,
    /// Failures in a row that make a Ready pod not Ready.
    pub failure_threshold: u32,
}

/// How a row's liveness port is probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// `GET /`, any response below 500.
    Http,
    /// A TCP connect.
    Tcp,
    /// None: the pod counts as Ready (a UDP or reserved liveness port).
    None,
}

/// The probe of `row`'s liveness port, by that port's own class (never the pod-level protocol).
pub fn probe_for(row: &Row) -> Probe {
    if is_reserved(row.port) {
        return Probe::None;
    }
    match row.port_protocols.as_ref().and_then(|m| m.get(&row.port)) {
        Some(ProtocolValue::Known(PortProtocol::Http)) => Probe::Http,
        Some(ProtocolValue::Known(PortProtocol::Tcp)) => Probe::Tcp,
        _ => Probe::None,
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Probed {
    ready: bool,
    failures: u32,
}

/// The answers of the probes, by pod (namespace, name).
#[derive(Debug, Default)]
pub struct Liveness {
    pods: parking_lot::Mutex<BTreeMap<(String, String), Probed>>,
}

/// One pod to probe: its key, its liveness address and probe, and its sockets (`None`: the pod
/// is not served by this daemon yet, so it cannot be reached from its namespace: a failure).
#[derive(Debug)]
pub struct Target {
    /// (namespace, name).
    pub pod: (String, String),
    /// The pod IP and liveness port.
    pub addr: SocketAddr,
    /// How.
    pub probe: Probe,
    /// The pod's sockets.
    pub net: Option<SocketFactory>,
    /// The readiness the pod's rows hold in the store, where this run starts from: an earlier
    /// run's last answer (false when the store has no row of it).
    pub held: bool,
}

impl Liveness {
    /// Whether the row's pod is Ready by its probes: `Some(true)` for a pod whose liveness port
    /// is not probed, `None` for one not probed yet.
    pub fn answer(&self, row: &Row) -> Option<bool> {
        if probe_for(row) == Probe::None {
            return Some(true);
        }
        let pod = row.pod.as_ref()?;
        self.pods
            .lock()
            .get(&(row.namespace.clone(), pod.clone()))
            .map(|p| p.ready)
    }

    /// [`Liveness::answer`], not Ready when not probed yet.
    pub fn ready(&self, row: &Row) -> bool {
        self.answer(row).unwrap_or(false)
    }

    /// Whether every row of `rows` whose liveness port is probed has had a probe.
    pub fn all_probed(&self, rows: &[Row]) -> bool {
        let pods = self.pods.lock();
        rows.iter().all(|r| {
            probe_for(r) == Probe::None
                || r.pod
                    .as_ref()
                    .is_some_and(|p| pods.contains_key(&(r.namespace.clone(), p.clone())))
        })
    }

    /// Probes every target once, at once, and forgets pods that are not targets any more.
    /// Returns whether any pod's readiness changed.
    pub async fn round(&self, targets: Vec<Target>, settings: &ProbeSettings) -> bool {
        let probes = targets.into_iter().map(|t| async move {
            let ok = match (&t.net, t.probe) {
                (_, Probe::None) => true,
                (None, _) => false,
                (Some(net), probe) => {
                    tokio::time::timeout(settings.timeout, probe_once(net, t.addr, probe))
                        .await
                        .unwrap_or(false)
                }
            };
            (t.pod, t.held, ok)
        });
        let results = futures_util::future::join_all(probes).await;
        let mut pods = self.pods.lock();
        let mut changed = false;
        let mut next = BTreeMap::new();
        for (pod, held, ok) in results {
            // A pod's first answer is always registered: until then its rows held the store's.
            let (mut p, first) = match pods.remove(&pod) {
                Some(p) => (p, false),
                None => (
                    Probed {
                        ready: held,
                        failures: 0,
                    },
                    true,
                ),
            };
            changed |= first;
            let was = p.ready;
            if ok {
                p = Probed {
                    ready: true,
                    failures: 0,
                };
            } else {
                p.failures = p.failures.saturating_add(1);
                if p.failures >= settings.failure_threshold {
                    p.ready = false;
                }
            }
            if p.ready != was {
                tracing::info!(namespace = %pod.0, pod = %pod.1, ready = p.ready,
                    "delegated liveness: readiness changed");
                changed = true;
            }
            next.insert(pod, p);
        }
        changed |= pods.values().any(|p| p.ready);
        *pods = next;
        changed
    }
}

/// One probe: whether the application answered.
async fn probe_once(net: &SocketFactory, addr: SocketAddr, probe: Probe) -> bool {
    let Ok(stream) = net.connect(addr, Source::PodIp).await else {
        return false;
    };
    match probe {
        Probe::Tcp | Probe::None => true,
        // An HTTP port may speak HTTP/1.1 or only h2c (a gRPC server): HTTP/1.1 first, and
        // on a connection that gave no HTTP/1 answer, HTTP/2 with prior knowledge.
        Probe::Http => match http1_answer(stream, addr).await {
            Some(alive) => alive,
            None => match net.connect(addr, Source::PodIp).await {
                Ok(stream) => h2_answer(stream).await.unwrap_or(false),
                Err(_) => false,
            },
        },
    }
}

fn probe_request(addr: SocketAddr, http1: bool) -> Option<hyper::Request<Empty<Bytes>>> {
    let mut r = hyper::Request::get(format!("http://{addr}/"))
        .header(hyper::header::USER_AGENT, crate::marks::LIVENESS_USER_AGENT);
    if http1 {
        r = r
            .header(hyper::header::HOST, addr.to_string())
            .header(hyper::header::CONNECTION, "close");
    } else {
        r = r.version(hyper::Version::HTTP_2);
    }
    r.body(Empty::new()).ok()
}

/// Whether an HTTP/1.1 `GET /` was answered below 500; `None` when no HTTP/1 answer came.
async fn http1_answer(stream: tokio::net::TcpStream, addr: SocketAddr) -> Option<bool> {
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
            .await
            .ok()?;
    let request = probe_request(addr, true)?;
    Some(while_driven(conn, sender.send_request(request)).await? < 500)
}

/// The status `send` gets while `conn` (its connection) is driven in the same future, so that
/// a probe dropped at its deadline drops its connection too (nothing is left to a task); `None`
/// when the request failed. The head is all a probe reads.
async fn while_driven<C, S>(conn: C, send: S) -> Option<u16>
where
    C: Future,
    S: Future<Output = Result<hyper::Response<hyper::body::Incoming>, hyper::Error>>,
{
    let mut send = std::pin::pin!(send);
    let answer = tokio::select! {
        biased;
        answer = &mut send => answer,
        // A connection that ends (`Connection: close` after the head) has handed over any
        // answer it read: the request resolves at once, with it or with the error.
        _ = conn => send.await,
    };
    answer.ok().map(|r| r.status().as_u16())
}

/// The same over HTTP/2 with prior knowledge.
async fn h2_answer(stream: tokio::net::TcpStream) -> Option<bool> {
    let addr = stream.peer_addr().ok()?;
    let (mut sender, conn) = hyper::client::conn::http2::handshake::<_, _, Empty<Bytes>>(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .ok()?;
    let request = probe_request(addr, false)?;
    Some(while_driven(conn, sender.send_request(request)).await? < 500)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(port: u32, map: &[(u32, PortProtocol)]) -> Row {
        Row {
            namespace: "mp".into(),
            service: "s".into(),
            address: "127.0.0.1".parse().unwrap(),
            port,
            ports: map.iter().map(|p| p.0).collect(),
            port_protocols: Some(
                map.iter()
                    .map(|&(p, v)| (p, ProtocolValue::Known(v)))
                    .collect(),
            ),
            ready: true,
            pod: Some("s-0".into()),
            node: None,
        }
    }

    #[test]
    fn the_liveness_port_is_probed_by_its_own_class() {
        let mixed = [(8080, PortProtocol::Http), (9000, PortProtocol::Tcp)];
        assert_eq!(probe_for(&row(8080, &mixed)), Probe::Http);
        assert_eq!(probe_for(&row(9000, &mixed)), Probe::Tcp);
        assert_eq!(
            probe_for(&row(5353, &[(5353, PortProtocol::Udp)])),
            Probe::None
        );
        assert_eq!(
            probe_for(&row(18001, &[(18001, PortProtocol::Http)])),
            Probe::None
        );
    }

    async fn serve(answer: &'static str) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(answer.as_bytes()).await;
            }
        });
        addr
    }

    fn target(addr: SocketAddr, probe: Probe) -> Target {
        Target {
            pod: ("mp".into(), "s-0".into()),
            addr,
            probe,
            net: Some(SocketFactory::Loopback(
                crate::proxy::socket::LoopbackNet::new(std::net::Ipv4Addr::LOCALHOST),
            )),
            held: false,
        }
    }

    #[tokio::test]
    async fn a_probe_past_its_deadline_closes_its_connection() {
        use tokio::io::AsyncReadExt;
        let settings = ProbeSettings {
            interval: Duration::from_millis(10),
            timeout: Duration::from_millis(100),
            failure_threshold: 1,
        };
        // An application that reads the request and never answers.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let live = Liveness::default();
        let probed = live.round(vec![target(addr, Probe::Http)], &settings);
        let closed = async {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            // The request, then the end of the connection once the probe gave up.
            while s.read(&mut buf).await.unwrap_or(0) > 0 {}
        };
        let (_, ()) = tokio::join!(probed, async {
            tokio::time::timeout(Duration::from_secs(2), closed)
                .await
                .expect("the probe's connection is closed at its deadline");
        });
        assert!(!live.ready(&row(
            addr.port().into(),
            &[(addr.port().into(), PortProtocol::Http)]
        )));
    }

    #[tokio::test]
    async fn a_pod_not_probed_yet_starts_from_the_stores_readiness_and_its_first_answer_is_registered()
     {
        let settings = ProbeSettings {
            interval: Duration::from_millis(10),
            timeout: Duration::from_millis(500),
            failure_threshold: 2,
        };
        let r = row(8080, &[(8080, PortProtocol::Http)]);
        let failing = serve("HTTP/1.1 503 Unavailable\r\ncontent-length: 0\r\n\r\n").await;
        // Ready in the store (an earlier run's answer): one failure is under the threshold, and
        // the first answer is reported for registration all the same.
        let live = Liveness::default();
        let held = Target {
            held: true,
            ..target(failing, Probe::Http)
        };
        assert!(live.round(vec![held], &settings).await);
        assert!(
            live.ready(&r),
            "the store's Ready holds under the threshold"
        );
        assert!(
            live.round(vec![target(failing, Probe::Http)], &settings)
                .await
        );
        assert!(!live.ready(&r), "the threshold reached");
        // Not in the store: not Ready, and that first answer is reported too.
        let live = Liveness::default();
        assert!(
            live.round(vec![target(failing, Probe::Http)], &settings)
                .await
        );
        assert!(!live.ready(&r));
        assert!(
            !live
                .round(vec![target(failing, Probe::Http)], &settings)
                .await
        );
    }

    #[tokio::test]
    async fn http_alive_below_500_tcp_alive_on_connect_and_ready_until_the_threshold() {
        let settings = ProbeSettings {
            interval: Duration::from_millis(10),
            timeout: Duration::from_millis(500),
            failure_threshold: 2,
        };
        let live = Liveness::default();
        let r = row(8080, &[(8080, PortProtocol::Http)]);
        assert!(!live.ready(&r), "not Ready before a probe succeeded");
        let ok = serve("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n").await;
        assert!(live.round(vec![target(ok, Probe::Http)], &settings).await);
        assert!(live.ready(&r));
        let failing = serve("HTTP/1.1 503 Unavailable\r\ncontent-length: 0\r\n\r\n").await;
        assert!(
            !live
                .round(vec![target(failing, Probe::Http)], &settings)
                .await
        );
        assert!(live.ready(&r), "one failure is under the threshold");
        assert!(
            live.round(vec![target(failing, Probe::Http)], &settings)
                .await
        );
        assert!(!live.ready(&r));
        // An h2c-only server (a gRPC server's port) answers the HTTP/2 probe.
        let h2 = {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            tokio::spawn(async move {
                while let Ok((s, _)) = l.accept().await {
                    let service = hyper::service::service_fn(|_req| async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            Empty::<Bytes>::new(),
                        ))
                    });
                    tokio::spawn(
                        hyper::server::conn::http2::Builder::new(
                            hyper_util::rt::TokioExecutor::new(),
                        )
                        .serve_connection(TokioIo::new(s), service),
                    );
                }
            });
            addr
        };
        assert!(live.round(vec![target(h2, Probe::Http)], &settings).await);
        assert!(live.ready(&r));
        // Not HTTP at all.
        let garbage = serve("SSH-2.0-x\r\n").await;
        live.round(vec![target(garbage, Probe::Http)], &settings)
            .await;
        assert!(live.ready(&r));
        live.round(vec![target(garbage, Probe::Http)], &settings)
            .await;
        assert!(!live.ready(&r));
        // Raw TCP: a connect is enough; a closed port is a failure.
        assert!(
            live.round(vec![target(garbage, Probe::Tcp)], &settings)
                .await
        );
        assert!(live.ready(&r));
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        live.round(vec![target(closed, Probe::Tcp)], &settings)
            .await;
        live.round(vec![target(closed, Probe::Tcp)], &settings)
            .await;
        assert!(!live.ready(&r));
        // A pod this daemon does not serve cannot be reached: a failure, never a pass.
        let mut unserved = target(ok, Probe::Http);
        unserved.net = None;
        live.round(vec![unserved], &settings).await;
        assert!(!live.ready(&r));
    }
}
