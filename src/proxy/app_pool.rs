//! Keep-alive connections from the daemon to HTTP upstreams outside the mesh hop: the
//! application a delivery is handed to, and the destination of an HTTP passthrough.
//!
//! A delivery that arrives over the mesh hop is handed to the application on a connection
//! opened inside the destination pod from the client pod's IP (model.md §12.4); a passthrough
//! leaves from the client pod's own IP. Opening one connection per request costs a handshake and
//! leaves a TIME_WAIT socket each; the data-plane benchmark showed throughput collapsing under
//! them. So connections are kept, per (purpose, source IP, destination, HTTP version): HTTP/2
//! connections are shared, an HTTP/1.1 connection goes back to the pool once its response body
//! has been read to the end.
//!
//! Each pod has a pool of its own ([`crate::proxy::PodCtx::apps`]): a kept connection lives in
//! the network namespace of the pod it was opened for, and goes when the pod goes. Within a
//! pod the addresses alone do not say what a connection is: a passthrough from a pod to a mesh
//! pod's address crosses the hop, while a delivery into that pod from the same client goes
//! straight to its application, with the same source and destination. When both pods were this
//! node's and the pools were one, a delivery took the passthrough's hop connection and sent the
//! request back over the hop, round and round (issue #35, item 6); the [`Purpose`] keeps them
//! apart.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use dashmap::DashMap;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::{Body, BoxError};

/// The upstream (the application, or a passthrough's destination) could not be connected to:
/// nothing of the request was sent. Also the mark, in a response's extensions, of the
/// `503 upstream-unreachable` answered for it: the inbound hop refuses such a stream
/// unprocessed instead, so that its source can try another endpoint (issue #38).
#[derive(Clone, Copy, Debug, thiserror::Error)]
#[error("the upstream refused the connection")]
pub struct Unreached;

/// The most idle HTTP/1.1 connections kept per key.
const MAX_IDLE: usize = 32;

/// What a kept connection is for: the same two addresses can name different connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Purpose {
    /// Into the pod's application, for a delivery that crossed the hop to it.
    Delivery,
    /// From the pod to the address it dialled, in plaintext (a passthrough).
    Passthrough,
    /// From the pod to a mesh pod behind the address it dialled, over an L4 hop.
    PassthroughHop,
}

type Key = (Purpose, IpAddr, SocketAddr);

/// Idle HTTP/1.1 senders and shared HTTP/2 senders, by key.
#[derive(Debug, Default, Clone)]
pub struct AppPool {
    h1: Arc<DashMap<Key, Vec<http1::SendRequest<Body>>>>,
    h2: Arc<DashMap<Key, http2::SendRequest<Body>>>,
}

impl AppPool {
    /// Send `req` to `app` for a client at `client`, reusing a kept connection of the same
    /// `purpose` when one is ready and opening one with `connect` otherwise.
    pub async fn send<F, Fut, S>(
        &self,
        purpose: Purpose,
        client: IpAddr,
        app: SocketAddr,
        h2: bool,
        req: Request<Body>,
        connect: F,
    ) -> Result<Response<Body>, BoxError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Option<S>>,
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let key = (purpose, client, app);
        if h2 {
            let kept = self
                .h2
                .get(&key)
                .map(|s| s.clone())
                .filter(|s| !s.is_closed());
            let mut sender = match kept {
                Some(s) => s,
                None => {
                    let stream = connect().await.ok_or(Unreached)?;
                    let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                        .timer(hyper_util::rt::TokioTimer::new())
                        .handshake(TokioIo::new(stream))
                        .await?;
                    tokio::spawn(conn);
                    self.h2.insert(key, sender.clone());
                    sender
                }
            };
            let resp = sender.send_request(req).await?;
            return Ok(resp.map(|b| b.map_err(BoxError::from).boxed()));
        }
        let mut sender = loop {
            let kept = self.h1.get_mut(&key).and_then(|mut idle| idle.pop());
            match kept {
                Some(mut s) => {
                    if s.ready().await.is_ok() {
                        break s;
                    }
                }
                None => {
                    let stream = connect().await.ok_or(Unreached)?;
                    let (s, conn) = http1::Builder::new()
                        .handshake(TokioIo::new(stream))
                        .await?;
                    tokio::spawn(conn);
                    break s;
                }
            }
        };
        let resp = sender.send_request(req).await?;
        let pool = self.clone();
        // One box: the body hyper gives, with what returns its connection.
        Ok(resp.map(|body| {
            Returning {
                inner: body,
                back: Some((pool, key, sender)),
            }
            .boxed()
        }))
    }

    fn put_back(&self, key: Key, sender: http1::SendRequest<Body>) {
        let mut idle = self.h1.entry(key).or_default();
        if idle.len() < MAX_IDLE {
            idle.push(sender);
        }
    }
}

/// A response body that returns its HTTP/1.1 connection to the pool once read to the end (a
/// body dropped before its end takes the connection with it).
struct Returning {
    inner: hyper::body::Incoming,
    back: Option<(AppPool, Key, http1::SendRequest<Body>)>,
}

impl Returning {
    fn finish(&mut self) {
        if let Some((pool, key, sender)) = self.back.take() {
            pool.put_back(key, sender);
        }
    }
}

impl HttpBody for Returning {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.finish(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.finish(),
            Poll::Ready(Some(Err(_))) => self.back = None,
            _ => {}
        }
        polled.map_err(BoxError::from)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::respond;

    /// An HTTP/1.1 server that answers every request with the number of its connection.
    async fn server() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = conns.clone();
        tokio::spawn(async move {
            loop {
                let (s, _) = listener.accept().await.unwrap();
                let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |_req| async move {
                        Ok::<_, std::convert::Infallible>(Response::new(respond::full(format!(
                            "conn {n}"
                        ))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        (addr, conns)
    }

    fn get() -> Request<Body> {
        Request::builder()
            .uri("/")
            .header("host", "x")
            .body(respond::empty())
            .unwrap()
    }

    async fn text(resp: Response<Body>) -> String {
        String::from_utf8(
            resp.into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .to_vec(),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_read_response_returns_its_connection_and_a_busy_one_is_not_shared() {
        let (addr, conns) = server().await;
        let pool = AppPool::default();
        let client: IpAddr = "10.0.0.1".parse().unwrap();
        let connect = || async move { tokio::net::TcpStream::connect(addr).await.ok() };
        for _ in 0..5 {
            let r = pool
                .send(Purpose::Delivery, client, addr, false, get(), connect)
                .await
                .unwrap();
            assert_eq!(text(r).await, "conn 0");
        }
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Two responses held unread at once need two connections.
        let a = pool
            .send(Purpose::Delivery, client, addr, false, get(), connect)
            .await
            .unwrap();
        let b = pool
            .send(Purpose::Delivery, client, addr, false, get(), connect)
            .await
            .unwrap();
        assert_ne!(text(a).await, text(b).await);
        // Another client IP never shares a connection (its source address differs).
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let r = pool
            .send(Purpose::Delivery, other, addr, false, get(), connect)
            .await
            .unwrap();
        assert_eq!(text(r).await, "conn 2");
    }

    #[tokio::test]
    async fn a_kept_connection_serves_only_its_own_purpose() {
        let (addr, conns) = server().await;
        let pool = AppPool::default();
        let client: IpAddr = "10.0.0.1".parse().unwrap();
        let connect = || async move { tokio::net::TcpStream::connect(addr).await.ok() };
        // The same client and destination, for three purposes: three connections, each kept
        // and reused by its own purpose only (issue #35 item 6: a delivery into a pod took the
        // L4 hop its own client had opened to that pod, and sent the request round again).
        let mut seen = Vec::new();
        for purpose in [
            Purpose::PassthroughHop,
            Purpose::Delivery,
            Purpose::Passthrough,
        ] {
            for _ in 0..2 {
                let r = pool
                    .send(purpose, client, addr, false, get(), connect)
                    .await
                    .unwrap();
                seen.push(text(r).await);
            }
        }
        assert_eq!(
            seen,
            ["conn 0", "conn 0", "conn 1", "conn 1", "conn 2", "conn 2"]
        );
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}
