//! The daemon's client of the API server: kube's, from the in-cluster or kubeconfig settings,
//! with a `User-Agent` that names aether, its version and the node on every request, so that
//! the server's audit log and API Priority and Fairness can tell aether's requests apart
//! (issue #36 item 3). kube's client sends none of its own.

use http::HeaderValue;
use http::header::USER_AGENT;

/// `aether/<version> (<node>)`; `aether/<version>` when the node's name cannot be a header
/// value (a node name is a DNS subdomain, so it always can).
pub fn user_agent(node: &str) -> HeaderValue {
    let version = env!("CARGO_PKG_VERSION");
    HeaderValue::from_str(&format!("aether/{version} ({node})"))
        .unwrap_or_else(|_| HeaderValue::from_static(concat!("aether/", env!("CARGO_PKG_VERSION"))))
}

/// A client of `config` whose every request carries [`user_agent`] of `node`.
pub fn client_of(mut config: kube::Config, node: &str) -> Result<kube::Client, kube::Error> {
    config.headers.retain(|(name, _)| name != USER_AGENT);
    config.headers.push((USER_AGENT, user_agent(node)));
    kube::Client::try_from(config)
}

/// The client of the API server this process runs against (in-cluster, or the kubeconfig),
/// speaking as `node`'s aether.
pub async fn client(node: &str) -> Result<kube::Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    client_of(config, node)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;

    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use parking_lot::Mutex;
    use tokio::sync::mpsc;

    use super::*;
    use crate::registry::kube::watch::{KubeSource, WatchSettings};

    /// A request the server saw: its URI and its `User-Agent`.
    type Seen = (String, Option<String>);

    #[test]
    fn the_user_agent_names_aether_its_version_and_the_node() {
        assert_eq!(
            user_agent("node-a"),
            format!("aether/{} (node-a)", env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(
            user_agent("bad\nname"),
            format!("aether/{}", env!("CARGO_PKG_VERSION"))
        );
    }

    /// Every list and watch the source sends carries it: a loopback server records each
    /// request's `User-Agent` (and answers 404, a kind not served).
    #[tokio::test]
    async fn every_request_of_the_kubernetes_source_carries_the_user_agent() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("an address");
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let agent = req
                            .headers()
                            .get(USER_AGENT)
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned);
                        log.lock().push((req.uri().to_string(), agent));
                        async {
                            Ok::<_, Infallible>(
                                http::Response::builder()
                                    .status(404)
                                    .header("content-type", "application/json")
                                    .body(Full::new(bytes::Bytes::from_static(
                                        br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#,
                                    )))
                                    .expect("a response"),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        let config = kube::Config::new(format!("http://{addr}").parse().expect("a URL"));
        let client = client_of(config, "node-a").expect("a client");
        let (tx, _rx) = mpsc::channel(1);
        let settings = WatchSettings {
            node: Some("node-a".into()),
            ..WatchSettings::default()
        };
        let source = KubeSource::start(&client, &settings, &tx);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while !source.synced() {
            assert!(tokio::time::Instant::now() < deadline, "never synced");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let seen = seen.lock().clone();
        // Every kind, the node's own pods included, was asked for.
        assert!(seen.len() >= source.kinds().len(), "{seen:?}");
        let want = format!("aether/{} (node-a)", env!("CARGO_PKG_VERSION"));
        for (uri, agent) in &seen {
            assert_eq!(agent.as_deref(), Some(want.as_str()), "{uri}");
        }
    }
}
